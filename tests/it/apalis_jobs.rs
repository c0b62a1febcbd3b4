//! Issue 46, item 2: apalis jobs (`idem_runtime::apalis::IdemLayer`) on apalis's SQLite storage.
//!
//! - In process: an invoice job pushed twice sends one invoice, and both jobs end `Done` with its
//!   result; the control without the layer sends two.
//! - Across a crash (`tests/bin/apalis_worker.rs`, SIGKILLed after the mail went out, before the
//!   job was acknowledged; apalis re-enqueues the job of a worker that missed its heartbeat and a
//!   new worker process runs it again): without idem, a second invoice; under `takeover`, the job
//!   runs again under the same forwarded key, which the mail server dedupes (one invoice); under
//!   `hold`, the repeat finds the dead worker's operation, is told its outcome is unknown, and the
//!   job ends `Killed` without sending anything.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use apalis::prelude::*;
use apalis_sqlite::{Config, SqlitePool, SqliteStorage};
use idem_runtime::apalis::IdemLayer;
use idem_runtime::{Caller, MemoryLedger, Recipe};
use sea_orm::sqlx;
use serde::{Deserialize, Serialize};
use tower_layer::Layer;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Invoice {
    invoice_id: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sent {
    number: usize,
}

static SEND_INVOICE: Recipe = Recipe::new("send_invoice", &["invoice_id"]);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-apalis-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn queue(path: &Path) -> SqlitePool {
    let pool = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display())).await.expect("open the queue");
    SqliteStorage::setup(&pool).await.expect("set up the queue");
    pool
}

fn config() -> Config {
    let mut config = Config::default().queue("invoices");
    config.heartbeat_interval = Duration::from_secs(1);
    config.missed_heartbeats = 1;
    config
}

/// Every job's status and last result, in the order they were pushed.
async fn jobs(pool: &SqlitePool) -> Vec<(String, Option<String>)> {
    sqlx::query_as::<_, (String, Option<String>)>("SELECT status, last_result FROM Jobs ORDER BY rowid")
        .fetch_all(pool)
        .await
        .expect("read the jobs")
}

/// Waits until every job has ended (`Done` or `Killed`), or fails naming where they stand.
async fn until_ended(pool: &SqlitePool, expected: usize) -> Vec<(String, Option<String>)> {
    let deadline = tokio::time::Instant::now() + idem_tests::WAIT;
    loop {
        let jobs = jobs(pool).await;
        if jobs.len() == expected && jobs.iter().all(|(status, _)| status == "Done" || status == "Killed") {
            return jobs;
        }
        assert!(tokio::time::Instant::now() < deadline, "the jobs did not end within {:?}: {jobs:?}", idem_tests::WAIT);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where the worker in process has idem.
#[derive(Clone, Copy, Debug)]
enum Guard {
    /// Nowhere: the control.
    None,
    /// Around the handler, inside apalis's lifecycle layer (as the guide says).
    Handler,
    /// As a worker layer (`WorkerBuilder::layer`), outside apalis's lifecycle layer.
    Worker,
}

/// Pushes the same invoice twice and runs an in-process worker until both jobs end; how many
/// invoices were sent, and the jobs.
async fn pushed_twice(guard: Guard) -> (usize, Vec<(String, Option<String>)>) {
    let dir = scratch(&format!("twice-{guard:?}"));
    let pool = queue(&dir.join("queue.sqlite3")).await;
    let mut storage = SqliteStorage::<Invoice>::new(&pool).with_config(config());
    let invoice = Invoice { invoice_id: "inv-1".to_owned(), amount_cents: 12_500 };
    storage.push(invoice.clone()).await.expect("push");
    storage.push(invoice).await.expect("push again");

    let sent = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    let send = move |_: Invoice| {
        let counter = Arc::clone(&counter);
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, BoxDynError>(Sent { number: counter.fetch_add(1, Ordering::SeqCst) + 1 })
        }
    };
    let worker = WorkerBuilder::new("invoice-worker").backend(storage);
    let layer = IdemLayer::new(idem_tests::idem(MemoryLedger::new()), &SEND_INVOICE, Caller::new("billing", "w"));
    let running = match guard {
        Guard::None => tokio::spawn(worker.build(task_fn(send)).run()),
        Guard::Handler => tokio::spawn(worker.build(layer.layer(task_fn(send))).run()),
        Guard::Worker => tokio::spawn(worker.layer(layer).build(task_fn(send)).run()),
    };
    let jobs = until_ended(&pool, 2).await;
    running.abort();
    let _ = std::fs::remove_dir_all(&dir);
    (sent.load(Ordering::SeqCst), jobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_job_pushed_twice_sends_one_invoice() {
    let (sent, jobs) = pushed_twice(Guard::None).await;
    assert_eq!(sent, 2, "the control: without idem both jobs send an invoice ({jobs:?})");

    // Around the handler, and as a worker layer (where the layer itself sets the status apalis
    // acknowledges for the jobs it answers).
    for guard in [Guard::Handler, Guard::Worker] {
        let (sent, jobs) = pushed_twice(guard).await;
        assert_eq!(sent, 1, "{guard:?}: one invoice for the two jobs: {jobs:?}");
        assert!(jobs.iter().all(|(status, _)| status == "Done"), "{guard:?}: both jobs are done: {jobs:?}");
        assert_eq!(jobs[0].1, jobs[1].1, "{guard:?}: the repeat is acknowledged with the first run's result: {jobs:?}");
    }
}

/// A worker process, killed when dropped (a failed assertion leaves none running).
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The worker process, started on the queue and ledger in `dir`.
fn worker(dir: &Path, mode: &str, stop: &str) -> Worker {
    let child = Command::new(env!("CARGO_BIN_EXE_apalis_worker"))
        .arg(dir.join("queue.sqlite3"))
        .arg(dir.join("ledger.sqlite3"))
        .arg(dir.join("mail"))
        .arg(mode)
        .arg(stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the worker");
    Worker(child)
}

/// Waits for the worker to print `AT effect` (the mail is out, the job not acknowledged).
fn at_effect(worker: &mut Worker) {
    let (said, heard) = std::sync::mpsc::channel();
    let out = BufReader::new(worker.0.stdout.take().expect("the worker's stdout"));
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    loop {
        let line = heard.recv_timeout(idem_tests::WAIT).expect("the worker reaches the effect (or says why not)");
        assert!(!line.starts_with("ERROR"), "the worker failed: {line}");
        if line == "AT effect" {
            return;
        }
    }
}

/// One crash: push an invoice, SIGKILL the worker after the mail went out, start another; what
/// the mail server received (invoices, handler starts) and how the job ended.
async fn crash(mode: &str) -> (usize, usize, (String, Option<String>)) {
    let dir = scratch(&format!("crash-{mode}"));
    std::fs::create_dir_all(dir.join("mail")).unwrap();
    let pool = queue(&dir.join("queue.sqlite3")).await;
    let mut storage = SqliteStorage::<Invoice>::new(&pool).with_config(config());
    storage.push(Invoice { invoice_id: "inv-7".to_owned(), amount_cents: 4_200 }).await.expect("push");

    let mut first = worker(&dir, mode, "stop-at-effect");
    at_effect(&mut first);
    first.0.kill().expect("SIGKILL the worker");
    drop(first);
    // The dead worker misses its heartbeat (1 s) and its lease (1 s) lapses.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let second = worker(&dir, mode, "run");
    let jobs = until_ended(&pool, 1).await;
    drop(second);

    let mail: Vec<String> = std::fs::read_dir(dir.join("mail"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "starts" && name != "stopped")
        .collect();
    let starts = std::fs::read_to_string(dir.join("mail").join("starts")).unwrap_or_default().lines().count();
    let _ = std::fs::remove_dir_all(&dir);
    (mail.len(), starts, jobs.into_iter().next().expect("one job"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_was_killed_mid_run_sends_once() {
    let (invoices, starts, job) = crash("plain").await;
    assert_eq!((invoices, starts), (2, 2), "the control: without idem the rerun sends a second invoice ({job:?})");

    let (invoices, starts, job) = crash("takeover").await;
    assert_eq!(starts, 2, "under takeover the job runs again: {job:?}");
    assert_eq!(invoices, 1, "under the same forwarded key, which the mail server dedupes: {job:?}");
    assert_eq!(job.0, "Done", "{job:?}");

    let (invoices, starts, job) = crash("hold").await;
    assert_eq!((invoices, starts), (1, 1), "under hold the job does not run again: {job:?}");
    assert_eq!(job.0, "Killed", "{job:?}");
    assert!(job.1.as_deref().unwrap_or_default().contains("outcome unknown"), "and says why: {job:?}");
}
