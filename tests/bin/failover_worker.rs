//! One of the idem processes `reliability_failover` runs through the PostgreSQL cluster's proxy
//! (or against the Redis Cluster) while it kills a primary: a storm of identical and distinct charges, each through its own
//! pool, against a downstream (a directory every process shares) that dedupes on the forwarded
//! key. Runs its own sweeper, and its tool waits for an operation in flight, so waiting repeats
//! and the sweep live through the failover too.
//!
//! ```text
//! failover_worker <ledger-url> <downstream-dir> <run> <seconds> <lease-ms>
//! ```
//!
//! Prints one line per answered call, `R <started-ms> <ended-ms> <order> <answer> <value>`
//! (Unix milliseconds; `answer` is `ran`, `replayed` or idem's code), and `END` when done. Orders
//! are `<run>-<slice>-<n>`, the slice being the 200 ms of wall time the call picked it in: the
//! workers charge the same few orders at once, and repeat older ones.

#[allow(dead_code)] // the counting half is the parent's
#[path = "../reliability/support/downstream.rs"]
mod downstream;

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, Recipe, Rejection, StalePolicy, current_operation};
use serde::{Deserialize, Serialize};

/// The tool the parent verifies with too: one declaration, so the same key.
static CHARGE: Recipe =
    Recipe::new("failover_charge", &["order_id"]).stale(StalePolicy::Takeover).wait(Duration::from_secs(2));
/// Callers at once in each process.
const CALLERS: usize = 6;
/// Orders charged in each 200 ms slice.
const PER_SLICE: u64 = 3;

#[derive(Debug, Serialize, Deserialize)]
enum WorkerError {
    Downstream(String),
    #[serde(skip)]
    Idem(String),
}

impl IdempotentError for WorkerError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.code().to_owned())
    }
}

fn unix_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(0)
}

/// A small generator per caller (xorshift): which order to charge next.
struct Pick(u64);

impl Pick {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, dir, run, seconds, lease_ms] = args.as_slice() else {
        println!("ERROR usage: failover_worker <url> <dir> <run> <seconds> <lease-ms>");
        std::process::exit(2);
    };
    let (Ok(seconds), Ok(lease_ms)) = (seconds.parse::<u64>(), lease_ms.parse::<u64>()) else {
        println!("ERROR seconds and lease-ms are numbers");
        std::process::exit(2);
    };
    // `IDEM_FAILOVER_LOG=<dir>`: each worker writes idem's debug log to `<dir>/<run>-<pid>.log`
    // (every ledger step of the Redis ledger, every handler run with its reference).
    if let Ok(logs) = std::env::var("IDEM_FAILOVER_LOG") {
        let path = std::path::Path::new(&logs).join(format!("{run}-{}.log", std::process::id()));
        let Ok(file) = std::fs::File::create(&path) else {
            println!("ERROR cannot write {}", path.display());
            std::process::exit(2);
        };
        let file = std::sync::Arc::new(file);
        tracing_subscriber::fmt()
            .with_writer(move || file.clone())
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("idem_runtime=debug,failover_worker=debug"))
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let Ok(runtime) = runtime else {
        println!("ERROR no runtime");
        std::process::exit(2);
    };
    if let Err(why) = runtime.block_on(storm(url, dir, run, Duration::from_secs(seconds), lease_ms)) {
        println!("ERROR {why}");
        std::process::exit(2);
    }
    println!("END");
}

async fn storm(url: &str, dir: &str, run: &str, length: Duration, lease_ms: u64) -> Result<(), String> {
    let downstream = downstream::FileDownstream::open(dir).map_err(|e| format!("downstream: {e}"))?;
    let ledger = idem_runtime::ledger::connect(url).await.map_err(|e| format!("ledger: {e}"))?;
    let idem = idem_tests::builder(ledger).lease(Duration::from_millis(lease_ms)).build().map_err(|e| e.to_string())?;
    let _sweeper = idem.admin().spawn_sweeper(Duration::from_secs(1), 200);
    let (lines, mut printed) = tokio::sync::mpsc::unbounded_channel::<String>();
    let deadline = tokio::time::Instant::now() + length;
    let callers = (0..CALLERS).map(|caller| {
        let (idem, downstream, lines, run) = (idem.clone(), downstream.clone(), lines.clone(), run.to_owned());
        let seed = u64::from(std::process::id()) << 8 | caller as u64 | 1;
        tokio::spawn(async move {
            let mut pick = Pick(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            while tokio::time::Instant::now() < deadline {
                let started = unix_ms();
                let slice = started / 200;
                // Half the calls charge this slice's orders (the other processes charge them
                // too, at once); half repeat one of the last ten seconds'.
                let back = if pick.next().is_multiple_of(2) { 0 } else { pick.next() % 50 };
                let order = format!("{run}-{}-{}", slice - back, pick.next() % PER_SLICE);
                let answer = charge(&idem, &downstream, &run, &order).await;
                tracing::debug!(order, answer = ?answer.as_ref().map(|served| (served.replayed, &served.value)), "answered");
                let (answer, value) = match answer {
                    Ok(served) if served.replayed => ("replayed".to_owned(), served.value),
                    Ok(served) => ("ran".to_owned(), served.value),
                    Err(WorkerError::Idem(code)) => (code, "-".to_owned()),
                    Err(WorkerError::Downstream(why)) => ("downstream".to_owned(), why.replace(' ', "_")),
                };
                let _ = lines.send(format!("R {started} {} {order} {answer} {value}", unix_ms()));
                if answer != "ran" && answer != "replayed" {
                    // A client that was refused waits a little before it asks again.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    });
    let callers: Vec<_> = callers.collect();
    drop(lines);
    let mut out = std::io::stdout().lock();
    while let Some(line) = printed.recv().await {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
    for caller in callers {
        caller.await.map_err(|e| format!("a caller panicked: {e}"))?;
    }
    // Let results whose recording was cut finish recording (the background retries).
    idem.drain(Duration::from_secs(5)).await;
    Ok(())
}

async fn charge(
    idem: &Idem,
    downstream: &downstream::FileDownstream,
    run: &str,
    order: &str,
) -> Result<idem_runtime::Served<String>, WorkerError> {
    // Each run is a tenant of its own: what it leaves in the ledger is its own to count.
    let caller = Caller::new(run, "storm");
    idem.call(&CHARGE, Some(&caller), &serde_json::json!({ "order_id": order, "amount_cents": 1250 }), || async {
        let operation = current_operation().ok_or_else(|| WorkerError::Downstream("no operation".into()))?;
        tracing::debug!(order, reference = %operation.reference(), key = %operation.idempotency_key(), "handler runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let receipt = downstream
            .charge(&operation.idempotency_key(), order)
            .map_err(|e| WorkerError::Downstream(e.to_string()))?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, WorkerError>(receipt)
    })
    .await
}
