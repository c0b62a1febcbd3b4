//! The background sweeper (`Idem::spawn_sweeper`), with real concurrency on real databases:
//! three sweepers on three handles (as three replicas) over one ledger delete every expired
//! record exactly once in total and never a live one, with no error; a stopped sweeper deletes
//! nothing more; a sweeper keeps going after a ledger error; a sweeper stops when its handle is
//! gone; and on PostgreSQL a sweep skips rows another transaction holds instead of waiting.
//!
//! The durable backends get a database of their own per test (`idem_tests::own_database`, on the
//! server the other suites use, `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_MYSQL_URL`), since a sweeper
//! deletes every expired record in its table — other suites' too. Without a server, a test is skipped by name
//! (a failure under `CI=true`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::{ClaimRequest, Outcome, Token};
use idem_runtime::{
    Idem, Key, MemoryLedger, StalePolicy, ledger::Ledger, ledger::LedgerError, scope::SubjectTag, scope::TenantTag,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";
const HOUR: u64 = 3_600_000;

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("ms fit")
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    for chunk in bytes.chunks_mut(8) {
        let token = Token::random().get().to_le_bytes();
        chunk.copy_from_slice(&token[..chunk.len()]);
    }
    bytes
}

/// A fresh operation claimed at `now` with the given window end, expiry and lease.
fn request(now: u64, window_end: u64, expires_at: u64, lease_until: u64) -> ClaimRequest {
    ClaimRequest {
        key: Key::from_bytes(random_bytes()),
        tenant: TenantTag::from_bytes(random_bytes()),
        subject: SubjectTag::from_bytes(random_bytes()),
        fingerprint: [7; 32],
        arg_tags: vec![[1, 1, 2, 2]],
        token: Token::random(),
        now,
        window_end,
        expires_at,
        lease_until,
        stale: StalePolicy::Hold,
        clock_trusted: true,
        label: None,
    }
}

/// `expired` records the sweep may delete now (every other one completed, the rest in progress
/// under a lease long run out, hours past their window and expiry), and `live` ones it must
/// not: in progress under a live lease although past their window and expiry, and completed
/// ones whose record has not expired. Returns the live ones.
async fn seed(ledger: &Arc<dyn Ledger>, expired: usize, live: usize) -> Vec<ClaimRequest> {
    let now = now_ms();
    let ledger = Arc::clone(ledger);
    let mut jobs = tokio::task::JoinSet::new();
    let next = Arc::new(AtomicUsize::new(0));
    for _ in 0..16 {
        let (ledger, next) = (Arc::clone(&ledger), Arc::clone(&next));
        jobs.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= expired {
                    break;
                }
                let r = request(now - 3 * HOUR, now - 2 * HOUR, now - HOUR, now - 2 * HOUR);
                assert!(ledger.claim(&r).await.expect("claim").won().is_some(), "fresh");
                if i % 2 == 0 {
                    let outcome = Outcome::Completed(b"old".to_vec());
                    ledger.complete(&r.key, r.token, outcome, now - HOUR).await.expect("complete");
                }
            }
        });
    }
    jobs.join_all().await;
    let mut kept = Vec::new();
    for i in 0..live {
        if i % 2 == 0 {
            // A long handler: past its window and its record's expiry, but its holder is alive.
            let r = request(now - 3 * HOUR, now - 2 * HOUR, now - HOUR, now + 10 * HOUR);
            assert!(ledger.claim(&r).await.expect("claim").won().is_some());
            kept.push(r);
        } else {
            let r = request(now, now + HOUR, now + 2 * HOUR, now + HOUR);
            assert!(ledger.claim(&r).await.expect("claim").won().is_some());
            ledger.complete(&r.key, r.token, Outcome::Completed(b"new".to_vec()), now + HOUR).await.unwrap();
            kept.push(r);
        }
    }
    kept
}

/// Every live record is still there, as it was.
async fn assert_kept(ledger: &dyn Ledger, live: &[ClaimRequest]) {
    let now = now_ms();
    for r in live {
        let report = ledger.lookup(&r.key, now).await.expect("lookup").expect("a live record is never swept");
        assert!(
            report.state == idem_runtime::ledger::State::InProgress
                || report.state == idem_runtime::ledger::State::Completed
        );
    }
}

/// Polls until `done`, failing (with `what`) if it is not within a minute: a liveness guard,
/// not a speed bound.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: still not the case after a minute");
}

/// `n` ledgers on one store, each with connections of its own (as replicas have), and the
/// store's URL on a server (PostgreSQL, MariaDB); or `None` (skipped).
async fn replicas(backend: &str, test: &str, n: usize) -> Option<(Vec<Arc<dyn Ledger>>, Option<String>)> {
    let name = format!("sweeper::{backend}::{test}");
    let url = match backend {
        "memory" => {
            let shared: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
            return Some((vec![shared; n], None));
        }
        "sqlite" => {
            let dir = std::env::temp_dir().join(format!("idem-sweeper-{}", Token::random().get()));
            std::fs::create_dir_all(&dir).unwrap();
            format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display())
        }
        "postgres" => {
            idem_tests::own_database(&name, "IDEM_TEST_POSTGRES_URL", POSTGRES_URL, &format!("sweeper_{test}")).await?
        }
        _ => idem_tests::own_database(&name, "IDEM_TEST_MYSQL_URL", MYSQL_URL, &format!("sweeper_{test}")).await?,
    };
    let mut ledgers: Vec<Arc<dyn Ledger>> = Vec::new();
    for _ in 0..n {
        let ledger = SeaOrmLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        ledgers.push(Arc::new(ledger));
    }
    let server = matches!(backend, "postgres" | "mysql").then_some(url);
    Some((ledgers, server))
}

/// Counts the times a session of the database at `url` is seen waiting on a lock, until
/// `watching` turns false.
async fn watch_lock_waits(url: String, waits: Arc<AtomicUsize>, watching: Arc<std::sync::atomic::AtomicBool>) {
    let (_, name) = url.rsplit_once('/').unwrap();
    let db = sea_orm::Database::connect(SeaOrmLedger::connect_options(&url)).await.expect("connect");
    let backend = db.get_database_backend();
    let query = if backend == DbBackend::Postgres {
        format!("SELECT count(*)::bigint FROM pg_stat_activity WHERE datname = '{name}' AND wait_event_type = 'Lock'")
    } else {
        format!(
            "SELECT CAST(count(*) AS SIGNED) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' \
             AND trx_mysql_thread_id IN (SELECT id FROM information_schema.PROCESSLIST WHERE db = '{name}')"
        )
    };
    while watching.load(Ordering::SeqCst) {
        let row = db.query_one_raw(Statement::from_string(backend, query.clone())).await.unwrap().unwrap();
        let waiting: i64 = row.try_get_by_index(0).unwrap();
        if waiting > 0 {
            waits.fetch_add(1, Ordering::SeqCst);
        }
        // MariaDB refreshes INNODB_TRX only once nobody has read it for 100 ms: polled faster, it
        // would never change (and would keep it stale for any other test reading it).
        let pause = if backend == DbBackend::Postgres { 1 } else { 150 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_backend!(three_replicas_delete_every_expired_record_once_and_no_live_one);

/// Three sweepers on three handles (as three replicas started together) over 5,000 expired
/// records and some live ones: the deletions they report add up to exactly 5,000, nothing is
/// left to sweep, every live record is kept, and no sweep failed.
async fn three_replicas_delete_every_expired_record_once_and_no_live_one(backend: &str) {
    const EXPIRED: usize = 5_000;
    let Some((ledgers, url)) = replicas(backend, "three_replicas", 3).await else { return };
    let live = seed(&ledgers[0], EXPIRED, 40).await;
    let handles: Vec<Idem> = ledgers.iter().map(|ledger| idem_tests::idem_shared(Arc::clone(ledger))).collect();
    // On the servers, watch for a sweep waiting on another's row locks (a lock storm in the
    // small): never on PostgreSQL, whose sweep skips locked rows.
    let lock_waits = Arc::new(AtomicUsize::new(0));
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = url.map(|url| tokio::spawn(watch_lock_waits(url, Arc::clone(&lock_waits), Arc::clone(&watching))));
    // A short period and small batches, so the three overlap on many batches.
    let sweepers: Vec<_> =
        handles.iter().map(|idem| idem.admin().spawn_sweeper(Duration::from_millis(5), 50)).collect();
    let total = || sweepers.iter().map(|s| s.stats().swept).sum::<u64>();
    until("the sweepers delete every expired record", || {
        total() >= EXPIRED as u64 || sweepers.iter().any(|s| s.stats().errors > 0)
    })
    .await;
    // A few more sweeps each, over a table with nothing expired left: they must find nothing.
    let sweeps: Vec<u64> = sweepers.iter().map(|s| s.stats().sweeps).collect();
    until("every sweeper sweeps again", || {
        sweepers.iter().zip(&sweeps).all(|(s, before)| s.stats().sweeps >= before + 3)
    })
    .await;
    let mut stats = Vec::new();
    let mut last_errors = Vec::new();
    for sweeper in sweepers {
        last_errors.extend(sweeper.last_error());
        stats.push(sweeper.stop().await);
    }
    watching.store(false, Ordering::SeqCst);
    if let Some(watcher) = watcher {
        watcher.await.unwrap();
    }
    let lock_waits = lock_waits.load(Ordering::SeqCst);
    if backend == "postgres" {
        assert_eq!(lock_waits, 0, "no sweep waited on another's row locks");
    } else if backend == "mysql" {
        // MariaDB's `DELETE … ORDER BY … LIMIT` cannot skip locked rows: a wait is possible
        // there (though short, and never a double delete). Reported, not asserted.
        eprintln!("mysql: sessions seen waiting on a lock: {lock_waits}");
    }
    let swept: u64 = stats.iter().map(|s| s.swept).sum();
    let errors: u64 = stats.iter().map(|s| s.errors).sum();
    eprintln!("{backend}: per sweeper {stats:?}");
    assert_eq!(errors, 0, "no sweep fails: {stats:?}, the last errors: {last_errors:?}");
    assert_eq!(swept, EXPIRED as u64, "each expired record is deleted exactly once in total: {stats:?}");
    assert_eq!(ledgers[0].sweep(now_ms(), 100_000).await.unwrap(), 0, "nothing expired is left");
    assert_kept(&*ledgers[0], &live).await;
    // Through a database each batch is a statement, and the sweepers interleave. The memory
    // ledger answers a batch under one lock in microseconds: on a loaded machine one sweeper can
    // finish all 5,000 before the others first wake (seen once in a full parallel run), which
    // says nothing about sharing — so there only the exact total above is asserted. A SQLite
    // file takes one writer at a time, its batches take milliseconds, and the same was seen there
    // once in a full parallel run on a loaded machine (one sweeper swept all 5,000): the servers
    // are where sharing is asserted.
    if backend != "memory" && backend != "sqlite" {
        assert!(stats.iter().filter(|s| s.swept > 0).count() >= 2, "the work is shared, not one replica's: {stats:?}");
    }
}

/// A stopped sweeper deletes nothing more: records that expire after its stop stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_sweeper_deletes_nothing_more() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let idem = idem_tests::idem_shared(Arc::clone(&ledger));
    seed(&ledger, 100, 0).await;
    let sweeper = idem.admin().spawn_sweeper(Duration::from_millis(1), 10);
    until("the sweeper deletes the first records", || sweeper.stats().swept == 100).await;
    let stats = sweeper.stop().await;
    assert_eq!((stats.swept, stats.errors), (100, 0));
    seed(&ledger, 100, 0).await;
    // Hundreds of its periods later, they are all still there.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ledger.sweep(now_ms(), 1_000).await.unwrap(), 100, "the stopped sweeper left them");
    // Dropping the guard stops it too.
    let sweeper = idem.admin().spawn_sweeper(Duration::from_millis(1), 10);
    until("the sweeper sweeps", || sweeper.stats().sweeps > 0).await;
    drop(sweeper);
    tokio::time::sleep(Duration::from_millis(50)).await;
    seed(&ledger, 100, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ledger.sweep(now_ms(), 1_000).await.unwrap(), 100, "the dropped sweeper left them");
}

/// A sweeper holds its handle weakly: once every clone of the handle is gone, it stops (and the
/// ledger is let go).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweeper_stops_with_its_handle() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let idem = idem_tests::idem_shared(Arc::clone(&ledger));
    let sweeper = idem.admin().spawn_sweeper(Duration::from_millis(1), 10);
    until("the sweeper sweeps", || sweeper.stats().sweeps > 0).await;
    assert!(!sweeper.is_finished());
    drop(idem);
    until("the sweeper stops once its handle is gone", || sweeper.is_finished()).await;
    assert_eq!(Arc::strong_count(&ledger), 1, "nothing keeps the ledger");
    assert_eq!(sweeper.stop().await.errors, 0);
}

/// Sweeps fail while `failures` is above zero (a [`Tapped`] ledger).
struct Failing {
    failures: AtomicUsize,
}

impl Tap for Failing {
    fn before(&self, call: Call) -> Pass {
        let failing = call == Call::Sweep
            && self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if failing { Pass::Fail(LedgerError::unavailable("the ledger is down")) } else { Pass::Through }
    }
}

/// A sweeper whose ledger fails keeps going, and sweeps everything once the ledger is back; each
/// failure is counted (and logged) once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweeper_survives_a_ledger_error() {
    let memory: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    seed(&memory, 100, 4).await;
    let ledger = Tapped::new(Arc::clone(&memory), Failing { failures: AtomicUsize::new(3) });
    let idem = idem_tests::idem_shared(ledger.clone());
    let sweeper = idem.admin().spawn_sweeper(Duration::from_millis(1), 10);
    until("the sweeper deletes every expired record after the outage", || sweeper.stats().swept == 100).await;
    let stats = sweeper.stop().await;
    assert_eq!((stats.errors, stats.swept), (3, 100), "three failed sweeps, then all of it: {stats:?}");
    assert_eq!(ledger.failures.load(Ordering::SeqCst), 0);
}

/// On PostgreSQL, a sweep skips rows another transaction has locked (a claim or renewal under
/// way, another replica's sweep) instead of queueing behind them: it deletes the rest, without
/// ever waiting on a lock, and the locked ones are deleted by a later sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_sweep_skips_locked_rows_instead_of_waiting() {
    let test = "sweeper::postgres_sweep_skips_locked_rows_instead_of_waiting";
    let Some(url) = idem_tests::own_database(test, "IDEM_TEST_POSTGRES_URL", POSTGRES_URL, "sweeper_skip_locked").await
    else {
        return;
    };
    let (_, name) = url.rsplit_once('/').unwrap();
    let ledger: Arc<dyn Ledger> = Arc::new(SeaOrmLedger::connect(&url).await.expect("connect"));
    seed(&ledger, 200, 0).await;
    let db = sea_orm::Database::connect(SeaOrmLedger::connect_options(&url)).await.expect("connect");
    // Another transaction holds the ten rows a sweep would pick first.
    let holder = db.begin().await.unwrap();
    let locked = holder
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT key FROM idem_records ORDER BY window_end LIMIT 10 FOR UPDATE",
        ))
        .await
        .unwrap();
    assert_eq!(locked.len(), 10);
    let sweep = tokio::spawn({
        let ledger = Arc::clone(&ledger);
        async move { ledger.sweep(now_ms(), 1_000).await }
    });
    let waiting =
        format!("SELECT count(*)::bigint FROM pg_stat_activity WHERE datname = '{name}' AND wait_event_type = 'Lock'");
    while !sweep.is_finished() {
        let row =
            db.query_one_raw(Statement::from_string(DbBackend::Postgres, waiting.clone())).await.unwrap().unwrap();
        let waiters: i64 = row.try_get_by_index(0).unwrap();
        if waiters > 0 {
            holder.rollback().await.unwrap();
            let swept = sweep.await.unwrap();
            panic!("the sweep waited on a row another transaction holds (then swept {swept:?})");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(sweep.await.unwrap().unwrap(), 190, "all but the locked rows");
    holder.rollback().await.unwrap();
    assert_eq!(ledger.sweep(now_ms(), 1_000).await.unwrap(), 10, "the locked rows, once let go");
}

/// A record claimed at `now` under `key`, its window ended at `window_end`: in progress under a
/// lease long run out and past its expiry (`sweepable`), or live for hours.
async fn claim_at(ledger: &Arc<dyn Ledger>, first: u8, window_end: u64, sweepable: bool) -> ClaimRequest {
    let now = now_ms();
    let mut r = if sweepable {
        request(now - 5 * HOUR, window_end, now - HOUR, now - HOUR)
    } else {
        request(now, window_end, now + 2 * HOUR, now + HOUR)
    };
    let mut key = random_bytes::<32>();
    key[0] = first;
    r.key = Key::from_bytes(key);
    assert!(ledger.claim(&r).await.expect("claim").won().is_some(), "fresh");
    r
}

/// On MariaDB, whose `DELETE … ORDER BY … LIMIT` cannot skip locked rows, a sweep that InnoDB
/// picks as a deadlock's victim runs again instead of failing. A transaction heavier than the
/// sweep (it has changed twenty rows) holds the second expired record; the sweep deletes the
/// first and waits on the second; the transaction then asks for the first: a deadlock, and the
/// sweep (the lighter) is rolled back. Once the transaction commits, the same call to `sweep`
/// deletes both. Before, it returned the deadlock as the sweep's error (a sweeper counted a
/// failed sweep, which once failed the three-replica test above in a full run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_sweep_chosen_as_a_deadlock_victim_runs_again() {
    let test = "sweeper::mysql_sweep_chosen_as_a_deadlock_victim_runs_again";
    let Some(url) = idem_tests::own_database(test, "IDEM_TEST_MYSQL_URL", MYSQL_URL, "sweeper_deadlock").await else {
        return;
    };
    let (_, name) = url.rsplit_once('/').unwrap();
    let ledger: Arc<dyn Ledger> = Arc::new(SeaOrmLedger::connect(&url).await.expect("connect"));
    let now = now_ms();
    // The sweep walks the window-end index: the first record before the second.
    let first = claim_at(&ledger, 0x10, now - 4 * HOUR, true).await;
    let second = claim_at(&ledger, 0x20, now - 3 * HOUR, true).await;
    for _ in 0..20 {
        claim_at(&ledger, 0xf0, now + 3 * HOUR, false).await;
    }
    let db = sea_orm::Database::connect(SeaOrmLedger::connect_options(&url)).await.expect("connect");
    let run = |sql: String| Statement::from_string(DbBackend::MySql, sql);
    let key_of = |r: &ClaimRequest| format!("X'{}'", r.key);
    let holder = db.begin().await.unwrap();
    // By primary key, so that the holder locks the ballast and the second record, and nothing else.
    let ballast = holder
        .execute_raw(run(String::from("UPDATE idem_records SET created_at = created_at + 1 WHERE `key` >= X'f0'")))
        .await
        .unwrap();
    assert_eq!(ballast.rows_affected(), 20);
    let held = holder
        .execute_raw(run(format!(
            "UPDATE idem_records SET created_at = created_at + 1 WHERE `key` = {}",
            key_of(&second)
        )))
        .await
        .unwrap();
    assert_eq!(held.rows_affected(), 1);
    let sweep = tokio::spawn({
        let ledger = Arc::clone(&ledger);
        async move { ledger.sweep(now_ms(), 1_000).await }
    });
    // The sweep's statement still running after a second over 22 rows is waiting on the holder's
    // lock. (Not INNODB_TRX: MariaDB refreshes that table only once nobody has read it for
    // 100 ms, so another test polling it — the three-replica test's watcher — keeps it stale.
    // `time`, in seconds, is in MySQL's PROCESSLIST too; MariaDB's `time_ms` is not.)
    let waiting = format!(
        "SELECT CAST(count(*) AS SIGNED) FROM information_schema.PROCESSLIST WHERE db = '{name}' \
         AND info LIKE 'DELETE FROM idem_records%' AND time >= 1"
    );
    let mut polls = 0;
    loop {
        let row = db.query_one_raw(run(waiting.clone())).await.unwrap().unwrap();
        if row.try_get_by_index::<i64>(0).unwrap() > 0 {
            break;
        }
        assert!(!sweep.is_finished(), "the sweep finished without waiting on the held record: {:?}", sweep.await);
        polls += 1;
        if polls == 3_000 {
            // What the server says its sessions on this database are doing, for the reason.
            let sessions = format!(
                "SELECT CAST(CONCAT_WS(' | ', id, command, state, time, info) AS CHAR) \
                 FROM information_schema.PROCESSLIST WHERE db = '{name}'"
            );
            let rows = db.query_all_raw(run(sessions)).await.unwrap();
            let seen: Vec<String> = rows.iter().map(|row| row.try_get_by_index(0).unwrap_or_default()).collect();
            panic!("the sweep was never seen waiting on the held record's lock; the sessions: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The holder asks for the record the waiting sweep has deleted: a cycle, and InnoDB rolls back
    // the lighter of the two — the sweep.
    holder
        .execute_raw(run(format!(
            "UPDATE idem_records SET created_at = created_at + 1 WHERE `key` = {}",
            key_of(&first)
        )))
        .await
        .expect("InnoDB picks the sweep (one row changed), not the holder (twenty-one), as the victim");
    holder.commit().await.unwrap();
    let swept = tokio::time::timeout(Duration::from_secs(60), sweep)
        .await
        .expect("the sweep ends once the holder commits")
        .unwrap();
    assert_eq!(swept.expect("a deadlock's victim runs again, not a failed sweep"), 2, "both expired records");
    assert!(ledger.lookup(&first.key, now_ms()).await.unwrap().is_none());
    assert!(ledger.lookup(&second.key, now_ms()).await.unwrap().is_none());
}

/// `Idem::sweep_with` reports the running total after every batch (what `idem sweep` shows on
/// a terminal), and deletes what `Idem::sweep` deletes: 25 expired records in batches of 10.
#[tokio::test]
async fn a_sweep_reports_its_progress_batch_by_batch() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let live = seed(&ledger, 25, 2).await;
    let idem = Idem::new(Arc::clone(&ledger));
    let mut seen = Vec::new();
    let swept = idem.admin().sweep_with(10, |total| seen.push(total)).await.expect("sweep");
    assert_eq!(swept, 25);
    assert_eq!(seen, [10, 20, 25], "one report per batch, the running total");
    assert_kept(&*ledger, &live).await;
    let mut again = Vec::new();
    assert_eq!(idem.admin().sweep_with(10, |total| again.push(total)).await.expect("sweep"), 0);
    assert_eq!(again, [0], "a sweep with nothing to delete reports once");
}
