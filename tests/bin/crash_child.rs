//! The process `reliability_crash` kills: one idempotent call on a durable ledger, paused at a
//! chosen point so the parent can SIGKILL it there.
//!
//! ```text
//! crash_child <ledger-url> <downstream-dir> <tenant> <order-id> <claim|effect|record|none> <lease-ms>
//! ```
//!
//! It prints `AT <point> <detail>` on stdout when it reaches the point and then blocks forever
//! (its lease keeps being renewed, as a live process's would) until it is killed:
//! - `claim`: inside the handler, after the claim, before the downstream effect;
//! - `effect`: inside the handler, after the downstream applied the effect, before idem records
//!   the result;
//! - `record`: after `Idem::call` returned, so the result is recorded.
//!
//! With `none` it completes and prints `DONE <receipt>`. On any error it prints `ERROR <why>`
//! and exits with status 2.

#[allow(dead_code)] // the counting half is the parent's
#[path = "../reliability/support/downstream.rs"]
mod downstream;

use std::io::{Read, Write};
use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, ErrorClass, IdempotentError, Recipe, Rejection, current_operation};
use serde::{Deserialize, Serialize};

/// The recipe the parent uses too (its stale policy is the parent's to choose: it only matters
/// when a claim finds a stale lease, which the child never does).
static CHARGE: Recipe = Recipe::new("rel_crash_charge", &["order_id"]);

#[derive(Debug, Serialize, Deserialize)]
enum ChildError {
    Downstream(String),
    Rejected(String),
}

impl IdempotentError for ChildError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected(rejection.to_string())
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, dir, tenant, order, point, lease_ms] = args.as_slice() else {
        say("ERROR usage: crash_child <url> <dir> <tenant> <order> <claim|effect|record|none> <lease-ms>");
        std::process::exit(2);
    };
    if point != "none" {
        // The parent holds our stdin open; if it dies without killing us, stdin closes and we
        // go too, rather than blocking forever at the crash point.
        std::thread::spawn(|| {
            let mut byte = [0u8; 1];
            let _ = std::io::stdin().read(&mut byte);
            std::process::exit(3);
        });
    }
    let lease = Duration::from_millis(lease_ms.parse().unwrap_or(200));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let Ok(runtime) = runtime else {
        say("ERROR no runtime");
        std::process::exit(2);
    };
    let outcome = runtime.block_on(run(url, dir, tenant, order, point, lease));
    match outcome {
        Ok(receipt) => say(&format!("DONE {receipt}")),
        Err(why) => {
            say(&format!("ERROR {why}"));
            std::process::exit(2);
        }
    }
}

async fn run(url: &str, dir: &str, tenant: &str, order: &str, point: &str, lease: Duration) -> Result<String, String> {
    let downstream = downstream::FileDownstream::open(dir).map_err(|e| format!("downstream: {e}"))?;
    let ledger = SeaOrmLedger::connect(url).await.map_err(|e| format!("ledger: {e}"))?;
    let idem = idem_tests::builder(ledger).lease(lease).build().unwrap();
    let caller = Caller::new(tenant, "crash-child");
    let arguments = serde_json::json!({ "order_id": order, "amount_cents": 1250 });
    let served = idem
        .call(&CHARGE, Some(&caller), &arguments, || async {
            let operation = current_operation().ok_or_else(|| ChildError::Downstream("no operation".into()))?;
            let reference = operation.idempotency_key();
            if point == "claim" {
                say(&format!("AT claim {reference}"));
                std::future::pending::<()>().await;
            }
            let receipt = downstream.charge(&reference, order).map_err(|e| ChildError::Downstream(e.to_string()))?;
            if point == "effect" {
                say(&format!("AT effect {receipt}"));
                std::future::pending::<()>().await;
            }
            Ok::<_, ChildError>(receipt)
        })
        .await
        .map_err(|e| format!("call: {e:?}"))?;
    if point == "record" {
        say(&format!("AT record {}", served.value));
        std::future::pending::<()>().await;
    }
    Ok(served.value)
}
