//! Secrets across replicas and rotations: a replica whose secret differs from the others' for
//! one version cannot serve; a secret or a clock that could not be read is tried again, never
//! cached as a failure; every answer of a rotation names the operation that gave it; and a
//! rotation leaves no record that looks like an outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::{Ledger, LedgerError, State, Token};
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Ref, Rejection, clock::ManualClock,
    secret::Secret, secret::SecretError,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use serde_json::json;

/// What a call answered instead of running: the rejection itself, so a test reads its ref.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Error {
    Declined(String),
    #[serde(skip)]
    Idem(Rejection),
}

impl IdempotentError for Error {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection)
    }
}

impl Error {
    fn code(&self) -> &str {
        match self {
            Self::Declined(why) => why,
            Self::Idem(rejection) => rejection.code(),
        }
    }
}

static PAY: Recipe = Recipe::new("pay", &["order_id"]);

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// Two secret versions no other test (or earlier run) on a shared database has used.
fn fresh_versions() -> (u32, u32) {
    let base = u32::try_from(Token::random().get() % 1_000_000_000).unwrap() + 1_000;
    (base, base + 1)
}

fn secret(version: u32, byte: u8) -> Secret {
    Secret::new(version, &[byte; 32]).unwrap()
}

/// Pays on `idem`, counting runs; the handler waits for `release` if one is given.
async fn pay(
    idem: &Idem,
    args: &serde_json::Value,
    runs: &AtomicUsize,
    release: Option<&tokio::sync::Notify>,
) -> Result<idem_runtime::Served<String>, Error> {
    pay_on(&PAY, idem, args, runs, release).await
}

/// [`pay`] under `recipe`.
async fn pay_on(
    recipe: &Recipe,
    idem: &Idem,
    args: &serde_json::Value,
    runs: &AtomicUsize,
    release: Option<&tokio::sync::Notify>,
) -> Result<idem_runtime::Served<String>, Error> {
    idem.call(recipe, Some(&alice()), args, || async {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(release) = release {
            release.notified().await;
        }
        Ok::<_, Error>(format!("paid #{n}"))
    })
    .await
}

fn order() -> String {
    format!("o-{}", Token::random().get())
}

/// A replica started with other bytes under a version the ledger has seen refuses to serve,
/// and says which version differs; the first replica keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_other_bytes_for_a_version_cannot_serve() {
    for (backend, ledger) in own_ledgers("a_replica_with_other_bytes", "rotation_other_bytes", false).await {
        let (version, _) = fresh_versions();
        let first = Idem::builder(Arc::clone(&ledger)).secret(secret(version, 0x11)).build().unwrap();
        let third = Idem::builder(Arc::clone(&ledger)).secret(secret(version, 0x33)).build().unwrap();
        let runs = AtomicUsize::new(0);
        let args = json!({ "order_id": order(), "amount": 5 });
        first.admin().check_secret().await.unwrap_or_else(|error| panic!("{backend}: the first replica: {error}"));
        let served = pay(&first, &args, &runs, None).await.unwrap();
        assert_eq!(served.value, "paid #1", "{backend}");

        let refused = third.admin().check_secret().await.expect_err("a replica with other bytes starts");
        assert!(matches!(refused, SecretError::Mismatch { version: v, .. } if v == version), "{backend}: {refused:?}");
        let words = refused.to_string();
        assert!(words.contains(&format!("version {version}")) && words.contains("IDEM_SECRET"), "{backend}: {words}");
        let repeat = pay(&third, &args, &runs, None).await.expect_err("the mismatched replica served");
        assert_eq!(repeat.code(), "ledger_unavailable", "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: charged a second time on the mismatched replica");
        // The operator's view refuses too, and keeps nothing for a version it reads.
        let inspect = third.admin().inspect("acme", &served.reference.to_string()).await.expect_err("inspect");
        assert!(inspect.to_string().contains(&format!("version {version}")), "{backend}: {inspect}");

        // The right replica is unaffected, and replays.
        let again = pay(&first, &args, &runs, None).await.unwrap();
        assert!(again.replayed, "{backend}");
        // A reader (the operator's paths) keeps no check value for a version nobody used.
        let (unused, _) = fresh_versions();
        let reader = Idem::builder(Arc::clone(&ledger)).secret(secret(unused, 0x44)).build().unwrap();
        let _ = reader.admin().inspect("acme", &served.reference.to_string()).await;
        assert_eq!(ledger.secret_check(unused, None).await.unwrap(), None, "{backend}: a reader kept a check value");
    }
}

/// The SQLite default's secret file could not be read once (here: a directory stands in its
/// place): the next calls try again, and once it can be made, they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_file_that_could_not_be_read_is_tried_again() {
    let dir = std::env::temp_dir().join(format!("idem-secret-retry-{}", Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ledger.sqlite3");
    let ledger = SeaOrmLedger::connect(&format!("sqlite://{}?mode=rwc", file.display())).await.unwrap();
    let secret_file = dir.join("ledger.sqlite3.secret");
    std::fs::create_dir_all(&secret_file).unwrap();
    let idem = Idem::new(ledger);
    let runs = AtomicUsize::new(0);
    let args = json!({ "order_id": order(), "amount": 5 });
    let refused = pay(&idem, &args, &runs, None).await.expect_err("ran without a secret");
    assert_eq!(refused.code(), "ledger_unavailable");
    std::fs::remove_dir(&secret_file).unwrap();
    let mut answer = Err(refused);
    for _ in 0..100 {
        answer = pay(&idem, &args, &runs, None).await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = answer.expect("still refused after the secret file could be made: the failure was kept");
    assert_eq!((served.value.as_str(), runs.load(Ordering::SeqCst)), ("paid #1", 1));
    assert!(secret_file.is_file());
}

/// Fails the ledger's clock read `n` times.
struct ClockFails(AtomicUsize);

impl Tap for ClockFails {
    fn before(&self, call: Call) -> Pass {
        let failing =
            call == Call::Now && self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if failing { Pass::Fail(LedgerError::unavailable("connection refused")) } else { Pass::Through }
    }
}

/// A cold handle's first clock read failed: the next call reads it again — also on a clock
/// that has not moved since (a test's, or a coarse one).
#[tokio::test]
async fn a_clock_read_that_failed_is_tried_again() {
    const T0: u64 = 1_900_000_000_000;
    let ledger = Tapped::new(Arc::new(MemoryLedger::with_clock(ManualClock::new(T0))), ClockFails(AtomicUsize::new(1)));
    let idem = idem_tests::builder(ledger.clone() as Arc<dyn Ledger>).clock(ManualClock::new(T0)).build().unwrap();
    let runs = AtomicUsize::new(0);
    let args = json!({ "order_id": order(), "amount": 5 });
    let refused = pay(&idem, &args, &runs, None).await.expect_err("ran on an unread clock");
    assert_eq!(refused.code(), "ledger_unavailable");
    let served = pay(&idem, &args, &runs, None).await.expect("the clock's first failure was kept");
    assert_eq!(served.value, "paid #1");
}

/// Hangs every clock read, counting them.
struct ClockHangs(AtomicUsize);

impl Tap for ClockHangs {
    fn before(&self, call: Call) -> Pass {
        if call == Call::Now {
            self.0.fetch_add(1, Ordering::SeqCst);
            return Pass::Hang;
        }
        Pass::Through
    }
}

/// A cold handle's first burst while the ledger's clock does not answer: one call reads it, and
/// the calls that queued behind that read take its failure — one read, not one per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_shares_one_failed_clock_read() {
    let ledger = Tapped::new(
        Arc::new(MemoryLedger::with_clock(ManualClock::new(1_900_000_000_000))),
        ClockHangs(AtomicUsize::new(0)),
    );
    let idem = idem_tests::builder(ledger.clone() as Arc<dyn Ledger>)
        .lease(Duration::from_secs(1))
        .ledger_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    let calls = (0..20).map(|n| {
        let (idem, runs) = (&idem, &runs);
        async move { pay(idem, &json!({ "order_id": format!("burst-{n}"), "amount": 1 }), runs, None).await }
    });
    for answer in futures_join_all(calls).await {
        assert_eq!(answer.expect_err("ran on an unread clock").code(), "ledger_unavailable");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(ledger.0.load(Ordering::SeqCst), 1, "the burst read the clock more than once");
}

/// Each repeat of a pre-rotation operation through a replica keyed with the new secret is
/// answered from that operation — and leaves no record under the new key that an operator or
/// a status reader would take for an outcome ("failed, nothing ran").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_leaves_no_false_records() {
    for (backend, ledger) in own_ledgers("a_rotation_leaves_no_false_records", "rotation_no_false_records", false).await
    {
        let (v1, v2) = fresh_versions();
        let before = Idem::builder(Arc::clone(&ledger)).secret(secret(v1, 0x11)).build().unwrap();
        let after = Idem::builder(Arc::clone(&ledger))
            .secret(secret(v2, 0x22))
            .previous_secret(secret(v1, 0x11))
            .build()
            .unwrap();
        let runs = AtomicUsize::new(0);
        let args = json!({ "order_id": order(), "amount": 5 });
        let first = pay(&before, &args, &runs, None).await.unwrap();
        for _ in 0..4 {
            let again = pay(&after, &args, &runs, None).await.unwrap();
            assert_eq!((again.value.as_str(), again.replayed, again.reference), ("paid #1", true, first.reference));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}");
        let new_key = after.admin().key_of(&PAY, &alice(), &args).unwrap().reference().to_string();
        let status = after.status(&alice(), &new_key).await.unwrap();
        assert_eq!(status, None, "{backend}: a yielded claim left a record under the new key");
        if backend == "memory" || backend == "sqlite" {
            let stats = after.admin().stats().await.unwrap();
            assert_eq!((stats.failed, stats.completed), (0, 1), "{backend}: {stats:?}");
        }
    }
}

/// Slows every record lookup: the first of identical calls, finding the operation under the
/// previous secret, is still looking while the others join its claim.
struct SlowLookups;

impl Tap for SlowLookups {
    fn before(&self, call: Call) -> Pass {
        if call == Call::Lookup { Pass::After(Duration::from_millis(300)) } else { Pass::Through }
    }
}

/// During a rotation, identical calls coalesced in one process share the first one's answer —
/// and that answer names the operation that gave it (the one under the previous secret), never
/// the key the first call gave back: "in flight" with its ref, and a conflict that names only
/// the argument that differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_answer_names_the_operation_that_answered() {
    for (backend, ledger) in own_ledgers("a_shared_answer_names_the_operation", "rotation_shared_answer", false).await {
        if backend == "memory" {
            continue; // A local ledger is not coalesced.
        }
        let (v1, v2) = fresh_versions();
        let before = Idem::builder(Arc::clone(&ledger)).secret(secret(v1, 0x11)).build().unwrap();
        let slow = Tapped::new(Arc::clone(&ledger), SlowLookups);
        let after = Idem::builder(slow as Arc<dyn Ledger>)
            .secret(secret(v2, 0x22))
            .previous_secret(secret(v1, 0x11))
            .build()
            .unwrap();
        let runs = AtomicUsize::new(0);

        // In flight under the previous secret.
        let release = tokio::sync::Notify::new();
        let args = json!({ "order_id": order(), "amount": 5 });
        let old_ref: Ref = before.admin().key_of(&PAY, &alice(), &args).unwrap().reference();
        let holder = pay(&before, &args, &runs, Some(&release));
        let repeats = async {
            idem_tests::wait_until("the holder's handler to start", || runs.load(Ordering::SeqCst) > 0).await;
            let answers = futures_join_all((0..8).map(|_| pay(&after, &args, &runs, None))).await;
            let status = after.status(&alice(), &old_ref.to_string()).await.unwrap().expect("the operation");
            release.notify_one();
            (answers, status)
        };
        let (held, (answers, status)) = tokio::join!(holder, repeats);
        assert_eq!(held.unwrap().value, "paid #1", "{backend}");
        assert_eq!(status.state, State::InProgress, "{backend}");
        for answer in answers {
            match answer {
                Err(Error::Idem(Rejection::InFlight { reference, .. })) => {
                    assert_eq!(reference, old_ref, "{backend}: \"in flight\" named another operation");
                }
                other => panic!("{backend}: a repeat of an operation in flight got {other:?}"),
            }
        }

        // A conflict with it names the argument that differs, and only that one.
        let conflicting = json!({ "order_id": args["order_id"], "amount": 6 });
        let new_ref = after.admin().key_of(&PAY, &alice(), &conflicting).unwrap().reference();
        let answers = futures_join_all((0..8).map(|_| pay(&after, &conflicting, &runs, None))).await;
        for answer in answers {
            match answer {
                Err(Error::Idem(Rejection::Conflict { reference, differing, .. })) => {
                    assert_eq!(reference, old_ref, "{backend}");
                    assert_eq!(differing, vec!["amount".to_owned()], "{backend}: the conflict named {differing:?}");
                }
                other => panic!(
                    "{backend}: a conflicting repeat got {other:?} (the operation: {old_ref}, the new key: {})",
                    new_ref
                ),
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}");
    }
}

/// Waits 600 ms for an operation in flight.
static PAY_WAITING: Recipe = Recipe::new("pay_waiting", &["order_id"]).wait(Duration::from_millis(600));

/// Counts the statements a handle sends about its calls (claims, lookups, releases…), not
/// its clock reads or its secret's check.
struct Statements(AtomicUsize);

impl Tap for Statements {
    fn before(&self, call: Call) -> Pass {
        if !matches!(call, Call::Now | Call::SecretCheck | Call::SecretVersions) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Pass::Through
    }
}

/// During a rotation, repeats that wait for an operation in flight under the previous secret
/// wait on that operation — one poller, its reads spaced out (10 ms doubling to 250 ms) — and
/// are answered "in flight" with its ref at their deadline: they do not poll the key the first
/// of them gave back every 10 ms, each claiming it again to find the operation anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_repeat_during_a_rotation_does_not_spin() {
    for (backend, ledger) in own_ledgers("a_waiting_repeat_during_a_rotation", "rotation_waiting_repeat", false).await {
        if backend == "memory" {
            continue; // A local ledger is not coalesced.
        }
        let (v1, v2) = fresh_versions();
        let before = Idem::builder(Arc::clone(&ledger)).secret(secret(v1, 0x11)).build().unwrap();
        let counted = Tapped::new(Arc::clone(&ledger), Statements(AtomicUsize::new(0)));
        let after = Idem::builder(Arc::clone(&counted) as Arc<dyn Ledger>)
            .secret(secret(v2, 0x22))
            .previous_secret(secret(v1, 0x11))
            .build()
            .unwrap();
        let runs = AtomicUsize::new(0);
        let release = tokio::sync::Notify::new();
        let args = json!({ "order_id": order(), "amount": 5 });
        let old_ref = before.admin().key_of(&PAY_WAITING, &alice(), &args).unwrap().reference();
        let holder = pay_on(&PAY_WAITING, &before, &args, &runs, Some(&release));
        let repeats = async {
            idem_tests::wait_until("the holder's handler to start", || runs.load(Ordering::SeqCst) > 0).await;
            let answers = futures_join_all((0..8).map(|_| pay_on(&PAY_WAITING, &after, &args, &runs, None))).await;
            release.notify_one();
            answers
        };
        let (held, answers) = tokio::join!(holder, repeats);
        assert_eq!(held.unwrap().value, "paid #1", "{backend}");
        for answer in answers {
            match answer {
                Err(Error::Idem(Rejection::InFlight { reference, .. })) => assert_eq!(reference, old_ref, "{backend}"),
                other => panic!("{backend}: a waiting repeat got {other:?}"),
            }
        }
        // One claim and one look under the previous secret for the first of them, then one
        // poller's reads (10 ms doubling to 250 ms: 7 in 600 ms), and one settling claim.
        let statements = counted.0.load(Ordering::SeqCst);
        eprintln!("{backend}: eight waiters during a rotation cost {statements} statements in 600 ms");
        assert!(statements <= 20, "{backend}: eight waiters cost {statements} statements in 600 ms");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}");
    }
}

/// Every ledger, each of this test's own and holding no secret version yet: memory, a SQLite
/// file, the PostgreSQL and MariaDB databases `idem_<name>` (its secrets forgotten), and — with
/// `redis` — Redis under a prefix of its own. A handle keying with a version other than [`idem_tests::test_secret`]'s
/// marks that version's operations live in its ledger, and a handle on the shared test databases
/// that does not honour that version would be refused while they live: such tests keep to
/// ledgers of their own.
pub(crate) async fn own_ledgers(test: &str, name: &str, redis: bool) -> Vec<(&'static str, Arc<dyn Ledger>)> {
    let mut ledgers: Vec<(&'static str, Arc<dyn Ledger>)> = vec![("memory", Arc::new(MemoryLedger::new()))];
    for (backend, ledger) in own_sql_ledgers(test, name).await {
        ledgers.push((backend, Arc::new(ledger)));
    }
    if redis && let Some(redis) = crate::ledger_redis::redis("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379").await {
        let prefix = format!("idem-test-{}", Token::random().get());
        ledgers.push(("redis", Arc::new(redis.with_prefix(&prefix))));
    }
    ledgers
}

/// The SQL ledgers of [`own_ledgers`]: a SQLite file, and the PostgreSQL and MariaDB databases
/// `idem_<name>` with no secret version kept.
async fn own_sql_ledgers(test: &str, name: &str) -> Vec<(&'static str, SeaOrmLedger)> {
    use sea_orm::ConnectionTrait;
    let dir = std::env::temp_dir().join(format!("idem-{name}-{}", Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let sqlite = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let mut ledgers = vec![("sqlite", SeaOrmLedger::connect(&sqlite).await.expect("open a SQLite file"))];
    for (backend, (env, default)) in [("postgres", idem_tests::POSTGRES), ("mysql", idem_tests::MYSQL)] {
        let Some(url) = idem_tests::own_database(&format!("{test}::{backend}"), env, default, name).await else {
            continue;
        };
        let ledger = SeaOrmLedger::connect(&url).await.expect("connect to the test's own database");
        ledger.connection().execute_unprepared("DELETE FROM idem_secrets").await.expect("forget the secrets");
        ledgers.push((backend, ledger));
    }
    ledgers
}

/// Issue 41, item 2: a handle configured with a new secret version and no previous one — on a
/// ledger whose live operations were keyed under another version — would re-key them, and a
/// repeat of a completed payment would run again (a second charge). It refuses to serve instead,
/// naming both versions and the ways out; a call on it runs nothing. With the old secret kept as
/// a previous one the repeat is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_secret_without_the_old_one_refuses_while_the_old_ones_operations_live() {
    let test = "a_new_secret_without_the_old_one_refuses";
    for (backend, ledger) in own_ledgers(test, "rotation_rekey", true).await {
        let (old, new) = (secret(1, 0x11), secret(3, 0x33));
        let before = Idem::builder(Arc::clone(&ledger)).secret(old.clone()).build().unwrap();
        before.admin().check_secret().await.expect("the first secret serves");
        let runs = AtomicUsize::new(0);
        let args = json!({ "order_id": order(), "amount": 5 });
        let first = pay(&before, &args, &runs, None).await.unwrap();
        assert_eq!(first.value, "paid #1", "{backend}");

        // Version 3 alone: refused at startup, and at a call, which runs nothing.
        let forgot = Idem::builder(Arc::clone(&ledger)).secret(new.clone()).build().unwrap();
        let repeat = pay(&forgot, &args, &runs, None).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the repeat ran again under the new secret: {repeat:?}");
        let refused = repeat.expect_err("served with the old version's operations live");
        assert_eq!(refused.code(), "ledger_unavailable", "{backend}: {refused:?}");
        let error =
            forgot.admin().check_secret().await.expect_err("a new secret without the old one served").to_string();
        for words in ["version 1", "version 3", "IDEM_SECRET_PREVIOUS", "IDEM_SECRET_RETIRED=1"] {
            assert!(error.contains(words), "{backend}: the refusal does not say {words:?}: {error}");
        }

        match forgot.admin().check_secret().await {
            Err(SecretError::Rekeying { current: 3, live }) => {
                assert_eq!(live.iter().map(|(version, _)| *version).collect::<Vec<_>>(), [1], "{backend}");
            }
            other => panic!("{backend}: {other:?}"),
        }

        // Version 3 with version 1 kept as previous: the repeat is replayed.
        let rotated =
            Idem::builder(Arc::clone(&ledger)).secret(new.clone()).previous_secret(old.clone()).build().unwrap();
        rotated.admin().check_secret().await.expect("a rotation that keeps the old secret serves");
        let again = pay(&rotated, &args, &runs, None).await.unwrap();
        assert_eq!((again.value.as_str(), again.replayed), ("paid #1", true), "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}");

        // Going back to version 1 alone is refused too: version 3 now has operations of its own.
        let back = Idem::builder(Arc::clone(&ledger)).secret(old.clone()).build().unwrap();
        match back.admin().check_secret().await {
            Err(SecretError::Rekeying { current: 1, live }) => {
                assert_eq!(live.iter().map(|(version, _)| *version).collect::<Vec<_>>(), [3], "{backend}");
            }
            other => panic!("{backend}: going back to version 1 alone: {other:?}"),
        }

        // Version 1 given up: re-keying accepted, the handle serves (and the repeat runs again,
        // as its operator said it may). Giving up a version still in use is refused.
        let retired = Idem::builder(Arc::clone(&ledger)).secret(new.clone()).retired_secret_version(1).build().unwrap();
        retired.admin().check_secret().await.expect("a retired version's operations do not stop the handle");
        let rekeyed = pay(&retired, &args, &runs, None).await.unwrap();
        assert_eq!((rekeyed.value.as_str(), rekeyed.replayed), ("paid #2", false), "{backend}");
        let contradictory =
            Idem::builder(Arc::clone(&ledger)).secret(new.clone()).retired_secret_version(3).build().unwrap();
        assert_eq!(
            contradictory.admin().check_secret().await,
            Err(SecretError::RetiredInUse { version: 3 }),
            "{backend}"
        );
    }
}

/// A version's operations stop counting once every record made under it could no longer
/// answer a repeat: a handle configured with another secret alone then serves, with no flag.
#[tokio::test]
async fn a_versions_time_passes_and_then_nothing_is_refused() {
    const T0: u64 = 1_900_000_000_000;
    let clock = ManualClock::new(T0);
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::with_clock(clock.clone()));
    let short = |version: u32, byte: u8| {
        Idem::builder(Arc::clone(&ledger))
            .clock(clock.clone())
            .secret(secret(version, byte))
            .retention(Duration::from_secs(60))
            .unsettled_retention(Duration::from_secs(60))
            .verdict_retention(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let runs = AtomicUsize::new(0);
    let args = json!({ "order_id": order(), "amount": 5 });
    pay(&short(1, 0x11), &args, &runs, None).await.unwrap();
    let error = short(3, 0x33).admin().check_secret().await.expect_err("version 1's operations live");
    assert!(matches!(error, SecretError::Rekeying { current: 3, .. }), "{error}");
    // Past the records' life (three minutes and a lease) and the handle's refresh interval (an
    // hour).
    clock.advance(Duration::from_secs(2 * 3600));
    let later = short(3, 0x33);
    later.admin().check_secret().await.expect("version 1's time has passed");
    assert_eq!(pay(&later, &args, &runs, None).await.unwrap().value, "paid #2");
}

/// Waits 30 days: longer than the retention a handle counts on when it resolves its secret.
static PAY_MONTHLY: Recipe = Recipe::new("pay_monthly", &["order_id"]).window(Duration::from_secs(30 * 24 * 3600));

/// A call under a recipe whose window reaches past the time the ledger keeps for the handle's
/// version keeps it further first: an operation of that window is never re-keyed before it ends.
/// And the handle keeps it ahead while it serves, one write per half hour at most, not per call.
#[tokio::test]
async fn a_long_window_keeps_its_version_live_as_long() {
    const T0: u64 = 1_900_000_000_000;
    const DAY: u64 = 24 * 3600 * 1000;
    let clock = ManualClock::new(T0);
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::with_clock(clock.clone()));
    let counted = Tapped::new(Arc::clone(&ledger), Statements(AtomicUsize::new(0)));
    let idem = Idem::builder(Arc::clone(&counted) as Arc<dyn Ledger>)
        .clock(clock.clone())
        .secret(secret(1, 0x11))
        .build()
        .unwrap();
    let until = || async { ledger.secret_versions(None).await.unwrap() };
    idem.admin().check_secret().await.unwrap();
    let [(1, first)] = until().await[..] else { panic!("{:?}", until().await) };
    assert!((T0 + 9 * DAY..T0 + 10 * DAY).contains(&first), "the default life: {first}");
    let runs = AtomicUsize::new(0);
    pay_on(&PAY_MONTHLY, &idem, &json!({ "order_id": order(), "amount": 5 }), &runs, None).await.unwrap();
    let [(1, monthly)] = until().await[..] else { panic!("{:?}", until().await) };
    assert!(monthly >= T0 + 38 * DAY, "a 30-day window kept live only until {monthly}");
    // Calls under the default window change nothing while the time kept covers them.
    for _ in 0..20 {
        pay(&idem, &json!({ "order_id": order(), "amount": 5 }), &runs, None).await.unwrap();
    }
    assert_eq!(until().await, [(1, monthly)]);
}

/// A ledger made before secret versions kept their time (no `idem_secrets.live_until`) is
/// upgraded in place by the migration: the column is added, and — the ledger knowing exactly one
/// version, which keyed every record in it — that version counts live until its last record
/// expires, so a handle with another secret alone is refused at once, not only after a replica
/// served again with the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_made_before_the_times_is_upgraded_in_place() {
    use sea_orm::ConnectionTrait;
    for (backend, sql) in own_sql_ledgers("a_ledger_made_before_the_times", "rotation_upgrade").await {
        let ledger: Arc<dyn Ledger> = Arc::new(sql.clone());
        let before = Idem::builder(Arc::clone(&ledger)).secret(secret(1, 0x11)).build().unwrap();
        let runs = AtomicUsize::new(0);
        let args = json!({ "order_id": order(), "amount": 5 });
        pay(&before, &args, &runs, None).await.unwrap();
        // As an earlier version left it: no column, so no time.
        sql.connection().execute_unprepared("ALTER TABLE idem_secrets DROP COLUMN live_until").await.unwrap();
        sql.migrate().await.expect("the upgrade");
        sql.migrate().await.expect("run again: nothing to do");
        let error =
            Idem::builder(Arc::clone(&ledger)).secret(secret(3, 0x33)).build().unwrap().admin().check_secret().await;
        assert!(matches!(error, Err(SecretError::Rekeying { current: 3, .. })), "{backend}: {error:?}");
        let again = pay(&before, &args, &runs, None).await.unwrap();
        assert!(again.replayed, "{backend}");
    }
}

/// Runs the futures together, in one task (they share the handle's coalescing as calls on one
/// replica do), and returns their outputs in order.
async fn futures_join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in futures.iter_mut().zip(&mut outputs) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future finished")).collect()
}
