//! One idem process of the fleet benchmark (`cargo bench -p idem-tests --bench fleet`): `tasks`
//! callers charging distinct orders (a claim and a completion each) through one handle on the
//! ledger at `url`, for `millis` once told to start.
//!
//! ```text
//! fleet_worker <ledger-url> <tasks> <millis> <run> [raw]
//! ```
//!
//! With `raw` (a SQL ledger's URL only), each call is idem's own claim and completion statements
//! sent through sqlx on a pool like the ledger's, without idem: the baseline for the CPU a call
//! costs the process.
//!
//! Prints `READY` once connected and warm, waits for a line on stdin, then prints
//! `DONE <calls> <errors> <cpu-ms>` (its own CPU time over the run) and one line `L <µs> <µs> …`
//! with every call's latency; then waits for a second line (or the end of stdin) before it
//! closes its connections.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::sea::statements::Statements;
use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, Recipe, Rejection};
use serde::{Deserialize, Serialize};

static CHARGE: Recipe = Recipe::new("fleet_charge", &["order_id"]);

#[derive(Debug, Serialize, Deserialize)]
struct Refused(String);

impl IdempotentError for Refused {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.code().to_owned())
    }
}

/// This process's CPU time (user + system), in milliseconds, from `/proc/self/stat`.
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum());
    ticks * 10
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, tasks, millis, run, raw) = match args.as_slice() {
        [_, url, tasks, millis, run] => (url, tasks, millis, run, false),
        [_, url, tasks, millis, run, raw] if raw == "raw" => (url, tasks, millis, run, true),
        _ => {
            println!("ERROR usage: fleet_worker <url> <tasks> <millis> <run> [raw]");
            std::process::exit(2);
        }
    };
    let (Ok(tasks), Ok(millis)) = (tasks.parse::<usize>(), millis.parse::<u64>()) else {
        println!("ERROR tasks and millis are numbers");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let Ok(runtime) = runtime else {
        println!("ERROR no runtime");
        std::process::exit(2);
    };
    if let Err(why) = runtime.block_on(fleet(url, tasks, Duration::from_millis(millis), run, raw)) {
        println!("ERROR {why}");
        std::process::exit(2);
    }
}

/// What a call goes through: idem, or idem's statements alone.
#[derive(Clone)]
enum Door {
    Idem(Idem, Caller),
    Raw(sea_orm::DatabaseConnection),
}

impl Door {
    async fn open(url: &str, run: &str, raw: bool) -> Result<Self, String> {
        if raw {
            // The ledger's own connect makes the tables; the pool is one like the ledger's.
            let ledger = SeaOrmLedger::connect(url).await.map_err(|e| format!("ledger: {e}"))?;
            drop(ledger);
            let db = sea_orm::Database::connect(SeaOrmLedger::connect_options(url)).await.map_err(|e| e.to_string())?;
            return Ok(Self::Raw(db));
        }
        let ledger = idem_runtime::ledger::connect(url).await.map_err(|e| format!("ledger: {e}"))?;
        let idem = idem_tests::builder(ledger).build().map_err(|e| e.to_string())?;
        Ok(Self::Idem(idem, Caller::new(run, "fleet")))
    }

    async fn charge(&self, order: String, n: u64) -> Result<(), Refused> {
        match self {
            Self::Idem(idem, caller) => charge(idem, caller, order).await.map(drop),
            Self::Raw(db) => {
                let statements = Statements::of(sea_orm::ConnectionTrait::get_database_backend(db));
                idem_tests::raw::pair(db, statements, n).await;
                Ok(())
            }
        }
    }
}

async fn fleet(url: &str, tasks: usize, length: Duration, run: &str, raw: bool) -> Result<(), String> {
    let door = Door::open(url, run, raw).await?;
    let pid = std::process::id();
    for n in 0..20 {
        door.charge(format!("{run}-{pid}-warm-{n}"), n).await.map_err(|e| format!("warm-up: {e:?}"))?;
    }
    println!("READY");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let cpu = cpu_ms();
    let deadline = Instant::now() + length;
    let callers: Vec<_> = (0..tasks)
        .map(|task| {
            let (door, run) = (door.clone(), run.to_owned());
            tokio::spawn(async move {
                let (mut latencies, mut errors) = (Vec::new(), 0u64);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let answer = door.charge(format!("{run}-{pid}-{task}-{n}"), n).await;
                    n += 1;
                    match answer {
                        Ok(_) => latencies.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)),
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for caller in callers {
        let (mine, failed) = caller.await.map_err(|e| e.to_string())?;
        latencies.extend(mine);
        errors += failed;
    }
    let cpu = cpu_ms() - cpu;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "DONE {} {errors} {cpu}", latencies.len());
    let listed: Vec<String> = latencies.iter().map(u64::to_string).collect();
    let _ = writeln!(out, "L {}", listed.join(" "));
    let _ = out.flush();
    drop(out);
    // Connections stay open until the parent has read the servers' CPU: a server process that
    // ends with its connection takes its CPU time with it.
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    drop(door);
    Ok(())
}

async fn charge(idem: &Idem, caller: &Caller, order: String) -> Result<String, Refused> {
    let arguments = serde_json::json!({ "order_id": order, "amount_cents": 1250 });
    idem.call(&CHARGE, Some(caller), &arguments, || async { Ok::<_, Refused>("charged".to_owned()) })
        .await
        .map(|served| served.value)
}
