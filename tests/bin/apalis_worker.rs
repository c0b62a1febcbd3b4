//! The apalis worker `it::apalis_jobs` SIGKILLs mid-job: it sends invoices from an apalis
//! SQLite queue, each job guarded by `idem_runtime::apalis::IdemLayer` on a SQLite ledger (or not,
//! for the control).
//!
//! ```text
//! apalis_worker <queue.sqlite3> <ledger.sqlite3> <mail-dir> <plain|hold|takeover> <stop-at-effect|run>
//! ```
//!
//! The fake mail server (`<mail-dir>`) writes one file per invoice it is given, named by the
//! reference the worker forwards (the operation's idempotency key under idem, a fresh one per run
//! for the plain worker): it dedupes by what users forward. Every start of the handler appends a
//! line to `<mail-dir>/starts`. With `stop-at-effect`, the first handler to send an invoice prints
//! `AT effect` after the mail is sent and then blocks until it is killed; a later run (a restart)
//! finds `<mail-dir>/stopped` and does not stop again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apalis::prelude::*;
use apalis_sqlite::{Config, SqlitePool, SqliteStorage};
use idem_runtime::apalis::IdemLayer;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, Recipe, StalePolicy, current_operation};
use serde::{Deserialize, Serialize};
use tower_layer::Layer;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Invoice {
    invoice_id: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sent {
    reference: String,
}

static HOLD: Recipe = Recipe::new("send_invoice", &["invoice_id"]).stale(StalePolicy::Hold);
static TAKEOVER: Recipe = Recipe::new("send_invoice", &["invoice_id"]).stale(StalePolicy::Takeover);

/// The queue's configuration: heartbeats every second, a worker missing one is dead.
fn config() -> Config {
    let mut config = Config::default().queue("invoices");
    config.heartbeat_interval = Duration::from_secs(1);
    config.missed_heartbeats = 1;
    config
}

fn append(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the log");
    writeln!(file, "{line}").expect("write the log");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, queue, ledger, mail, mode, stop] = args.as_slice() else {
        eprintln!("usage: apalis_worker <queue> <ledger> <mail-dir> <plain|hold|takeover> <stop-at-effect|run>");
        std::process::exit(2);
    };
    let mail = PathBuf::from(mail);
    let stop_at_effect = stop == "stop-at-effect";

    let pool = SqlitePool::connect(&format!("sqlite://{queue}?mode=rwc")).await.expect("open the queue");
    SqliteStorage::setup(&pool).await.expect("set up the queue");
    let storage = SqliteStorage::<Invoice>::new(&pool).with_config(config());

    let send = move |invoice: Invoice| {
        let mail = mail.clone();
        async move {
            append(&mail.join("starts"), &invoice.invoice_id);
            let reference = current_operation().map_or_else(
                || {
                    format!(
                        "plain-{}-{}",
                        std::process::id(),
                        std::fs::read_to_string(mail.join("starts")).unwrap_or_default().lines().count()
                    )
                },
                |operation| operation.idempotency_key(),
            );
            std::fs::write(mail.join(&reference), &invoice.invoice_id).expect("send the mail");
            if stop_at_effect && !mail.join("stopped").exists() {
                std::fs::write(mail.join("stopped"), "").expect("mark the stop");
                println!("AT effect");
                std::future::pending::<()>().await;
            }
            Ok::<_, BoxDynError>(Sent { reference })
        }
    };

    let worker = WorkerBuilder::new("invoice-worker").backend(storage);
    let result = match mode.as_str() {
        "plain" => worker.build(task_fn(send)).run().await,
        guarded => {
            let recipe = if guarded == "hold" { &HOLD } else { &TAKEOVER };
            let ledger = SeaOrmLedger::connect(&format!("sqlite://{ledger}?mode=rwc")).await.expect("open the ledger");
            let idem = idem_runtime::Idem::builder(ledger)
                .secret(idem_runtime::secret::Secret::new(1, &[0x5e; 32]).expect("32 bytes"))
                .lease(Duration::from_secs(1))
                .build()
                .expect("the handle");
            let layer = IdemLayer::new(idem, recipe, Caller::new("billing", "invoice-worker"));
            worker.build(layer.layer(task_fn(send))).run().await
        }
    };
    if let Err(error) = result {
        println!("ERROR {error}");
        std::process::exit(2);
    }
}
