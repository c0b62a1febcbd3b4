//! `wait`: a repeat that finds its operation in flight waits for it, and is answered by how it
//! settles — with real concurrency, on the memory ledger, SQLite (a file), PostgreSQL and
//! MariaDB (skipped by name without a server; a failure under `CI=true`).
//!
//! The "first call" runs on one handle and the repeats on another, as on two replicas (they
//! share nothing but the ledger), except where a holder in the same process is the point. The
//! downstream counts effects by the key users forward, `idempotency_key()`; ledger statements
//! are counted by a wrapper around the ledger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::ledger::Token;
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection, StalePolicy, current_operation,
    ledger::Ledger, ledger::LedgerError,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
enum Error {
    /// The downstream refused before doing anything.
    Refused,
    Idem(String),
}

impl IdempotentError for Error {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.code().to_owned())
    }
}

/// Waits long enough for every first call below to finish.
static DEPLOY: Recipe = Recipe::new("deploy", &["service"]).wait(Duration::from_secs(30));
/// Does not wait.
static DEPLOY_NOW: Recipe = Recipe::new("deploy_now", &["service"]);
/// Waits less than the first call takes.
static DEPLOY_BRIEFLY: Recipe = Recipe::new("deploy_briefly", &["service"]).wait(Duration::from_millis(300));
/// Waits a second, and takes over a dead holder's lease — never a late one's during a wait.
static DEPLOY_TAKEOVER: Recipe =
    Recipe::new("deploy_takeover", &["service"]).wait(Duration::from_secs(1)).stale(StalePolicy::Takeover);

fn alice() -> &'static Caller {
    static ALICE: std::sync::LazyLock<Caller> = std::sync::LazyLock::new(|| Caller::new("acme", "alice"));
    &ALICE
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Token::random().get())
}

/// The far side: applies each forwarded key once, and counts every attempt.
#[derive(Default)]
struct Downstream {
    applied: Mutex<HashMap<String, String>>,
    attempts: AtomicUsize,
}

impl Downstream {
    fn deploy(&self, service: &str) -> String {
        let key = current_operation().expect("inside the handler").idempotency_key();
        let n = self.attempts.fetch_add(1, Ordering::SeqCst);
        self.applied.lock().unwrap().entry(key).or_insert_with(|| format!("{service} deployed, attempt {n}")).clone()
    }

    fn effects(&self) -> usize {
        self.applied.lock().unwrap().len()
    }
}

/// What a waiting test counts of the statements a handle sends (a [`Tapped`] ledger); it can
/// also stop passing on lease renewals (a holder alive but cut off from the ledger) or fail
/// lookups.
struct Counting {
    claims: AtomicUsize,
    /// Claims the ledger has answered.
    answered: AtomicUsize,
    lookups: AtomicUsize,
    others: AtomicUsize,
    drop_renewals: AtomicBool,
    fail_lookups: AtomicBool,
}

impl Counting {
    fn new(inner: Arc<dyn Ledger>) -> Arc<Tapped<Self>> {
        let counting = Self {
            claims: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
            others: AtomicUsize::new(0),
            drop_renewals: AtomicBool::new(false),
            fail_lookups: AtomicBool::new(false),
        };
        Tapped::new(inner, counting)
    }

    fn statements(&self) -> usize {
        self.claims.load(Ordering::SeqCst) + self.lookups.load(Ordering::SeqCst) + self.others.load(Ordering::SeqCst)
    }

    fn reset(&self) {
        for counter in [&self.claims, &self.answered, &self.lookups, &self.others] {
            counter.store(0, Ordering::SeqCst);
        }
    }

    /// Until `n` claims have been answered (the repeats found the operation in flight).
    async fn answered(&self, n: usize) {
        let what = format!("{n} repeats to reach the ledger");
        idem_tests::wait_until(&what, || self.answered.load(Ordering::SeqCst) >= n).await;
    }

    fn other(&self) {
        self.others.fetch_add(1, Ordering::SeqCst);
    }
}

impl Tap for Counting {
    fn before(&self, call: Call) -> Pass {
        match call {
            Call::Claim => {
                self.claims.fetch_add(1, Ordering::SeqCst);
            }
            Call::Lookup => {
                self.lookups.fetch_add(1, Ordering::SeqCst);
                if self.fail_lookups.load(Ordering::SeqCst) {
                    return Pass::Fail(LedgerError::unavailable("the ledger is down"));
                }
            }
            Call::Renew => {
                self.other();
                if self.drop_renewals.load(Ordering::SeqCst) {
                    return Pass::Fail(LedgerError::unavailable("renewals are cut off"));
                }
            }
            _ => self.other(),
        }
        Pass::Through
    }

    fn after(&self, call: Call) {
        if call == Call::Claim {
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The ledger of `backend`, or `None` (reported skipped; a failure under CI).
async fn ledger(backend: &str, test: &str) -> Option<Arc<dyn Ledger>> {
    let test = format!("waiting::{backend}::{test}");
    match backend {
        "memory" => Some(Arc::new(MemoryLedger::new())),
        "sqlite" => {
            let dir = std::env::temp_dir().join(unique("idem-waiting"));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
            let ledger = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("open a SQLite file");
            Some(Arc::new(ledger))
        }
        "postgres" => {
            idem_tests::durable(&test, "IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test").await
        }
        _ => idem_tests::durable(&test, "IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test").await,
    }
}

/// Two handles on one ledger, as two replicas: the first call's and the repeats', each with
/// its statements counted.
struct Replicas {
    first: Idem,
    repeats: Idem,
    repeats_ledger: Arc<Tapped<Counting>>,
}

async fn replicas(backend: &str, test: &str) -> Option<Replicas> {
    let shared = ledger(backend, test).await?;
    let (first_ledger, repeats_ledger) = (Counting::new(Arc::clone(&shared)), Counting::new(shared));
    let first = idem_tests::idem_shared(first_ledger.clone());
    let repeats = idem_tests::idem_shared(repeats_ledger.clone());
    // Each handle measures its clock against the ledger's on its first call: done here, so the
    // counts below are the wait's.
    for idem in [&first, &repeats] {
        let args = json!({ "service": unique("warm-up") });
        idem.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(String::new()) }).await.unwrap();
    }
    first_ledger.reset();
    repeats_ledger.reset();
    Some(Replicas { first, repeats, repeats_ledger })
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_backend!(
    a_repeat_gets_the_first_calls_result_as_a_replay,
    a_holder_slower_than_the_wait_is_answered_in_flight,
    a_lapsed_holder_is_taken_over_as_a_plain_repeat_would,
    a_lapsed_holder_in_this_process_is_waited_for,
    a_first_call_no_longer_polled_does_not_wedge_the_calls_that_joined_it,
    a_repeat_runs_the_handler_when_the_first_call_did_nothing,
    a_local_holder_wakes_its_waiters_without_polling,
    a_thousand_waiters_cost_a_bounded_number_of_statements,
    a_read_that_fails_ends_the_wait_in_flight,
);

/// A repeat arriving while a slow first call runs (on another replica) is answered with its
/// result, as a replay — the bytes every later repeat gets too — and the downstream saw one
/// effect.
async fn a_repeat_gets_the_first_calls_result_as_a_replay(backend: &str) {
    let Some(r) = replicas(backend, "a_repeat_gets_the_first_calls_result_as_a_replay").await else { return };
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = r.first.call(&DEPLOY, Some(alice()), &args, || async {
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let repeat = async {
        // The repeat starts once the first call runs, and waits.
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let repeat =
            r.repeats.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
        let release = async {
            r.repeats_ledger.answered(1).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.notify_one();
        };
        tokio::join!(repeat, release).0
    };
    let (first, repeat) = tokio::join!(first, repeat);
    let (first, repeat) = (first.unwrap(), repeat.unwrap());
    assert!(!first.replayed && repeat.replayed, "the repeat is a replay of the first call");
    assert_eq!(repeat.value, first.value);
    let later = r.repeats.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
    let later = later.await.unwrap();
    assert_eq!((later.value, later.replayed), (repeat.value, true), "a replay after a wait is every repeat's");
    assert_eq!((downstream.effects(), downstream.attempts.load(Ordering::SeqCst)), (1, 1));
}

/// A first call slower than the wait: the repeat is told "in flight" once the wait is over,
/// and the first call still records its result (nothing took it over).
async fn a_holder_slower_than_the_wait_is_answered_in_flight(backend: &str) {
    let Some(r) = replicas(backend, "a_holder_slower_than_the_wait_is_answered_in_flight").await else { return };
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = r.first.call(&DEPLOY_BRIEFLY, Some(alice()), &args, || async {
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let repeat = async {
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let repeat = r
            .repeats
            .call(&DEPLOY_BRIEFLY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) })
            .await;
        // Only once the repeat has its answer does the first call finish.
        release.notify_one();
        repeat
    };
    let (first, repeat) = tokio::join!(first, repeat);
    assert!(matches!(repeat, Err(Error::Idem(ref code)) if code == "in_flight"), "{repeat:?}");
    assert!(!first.unwrap().replayed);
    assert_eq!((downstream.effects(), downstream.attempts.load(Ordering::SeqCst)), (1, 1));
}

/// A holder cut off from the ledger (its renewals fail, its lease lapses) under a `takeover`
/// recipe: a waiting repeat is answered as a plain repeat arriving then would be — nobody holds
/// the operation, so it takes over at once (under the same forwarded key, which the downstream
/// applies once) instead of sitting out its wait to answer "in flight". The late holder's
/// completion is fenced, and it is answered with the recorded result.
async fn a_lapsed_holder_is_taken_over_as_a_plain_repeat_would(backend: &str) {
    let Some(shared) = ledger(backend, "a_lapsed_holder_is_taken_over_as_a_plain_repeat_would").await else { return };
    let holder_ledger = Counting::new(Arc::clone(&shared));
    // A short lease, so it lapses during the one-second wait.
    let holder = idem_tests::builder(holder_ledger.clone()).lease(Duration::from_millis(150)).build().unwrap();
    let repeats = idem_tests::idem_shared(shared);
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = holder.call(&DEPLOY_TAKEOVER, Some(alice()), &args, || async {
        holder_ledger.drop_renewals.store(true, Ordering::SeqCst);
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let repeat = async {
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let repeat = repeats
            .call(&DEPLOY_TAKEOVER, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) })
            .await;
        holder_ledger.drop_renewals.store(false, Ordering::SeqCst);
        release.notify_one();
        repeat
    };
    let (first, repeat) = tokio::join!(first, repeat);
    let repeat = repeat.expect("the waiting repeat took the lapsed lease over");
    assert!(!repeat.replayed, "{backend}: a takeover runs: {repeat:?}");
    assert_eq!(downstream.attempts.load(Ordering::SeqCst), 2, "{backend}: the waiter took over");
    assert_eq!(downstream.effects(), 1, "{backend}: under the same forwarded key, applied once");
    let first = first.unwrap();
    assert_eq!((first.value.as_str(), first.replayed), (repeat.value.as_str(), true), "{backend}: the recorded result");
    let again = repeats.call(&DEPLOY_TAKEOVER, Some(alice()), &args, || async { Ok::<_, Error>(String::new()) });
    assert_eq!(again.await.unwrap().value, repeat.value, "{backend}: recorded and replayed");
}

/// The same holder in this process: alive (it runs here) whatever its lease reads, so the
/// repeats that wait on it here never take it over — they wait, and get its result.
async fn a_lapsed_holder_in_this_process_is_waited_for(backend: &str) {
    let Some(shared) = ledger(backend, "a_lapsed_holder_in_this_process_is_waited_for").await else { return };
    let counted = Counting::new(shared);
    let idem = idem_tests::builder(counted.clone()).lease(Duration::from_millis(150)).build().unwrap();
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = idem.call(&DEPLOY_TAKEOVER, Some(alice()), &args, || async {
        counted.drop_renewals.store(true, Ordering::SeqCst);
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let repeat = async {
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let repeat =
            idem.call(&DEPLOY_TAKEOVER, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
        let release = async {
            // Well past the lapsed lease (150 ms), inside the one-second wait.
            tokio::time::sleep(Duration::from_millis(600)).await;
            counted.drop_renewals.store(false, Ordering::SeqCst);
            release.notify_one();
        };
        tokio::join!(repeat, release).0
    };
    let (first, repeat) = tokio::join!(first, repeat);
    assert_eq!(downstream.attempts.load(Ordering::SeqCst), 1, "{backend}: a waiter took over a holder in its process");
    let first = first.unwrap();
    let repeat = repeat.expect("the waiter gets the holder's result");
    assert_eq!((repeat.value, repeat.replayed), (first.value, true), "{backend}");
}

/// The first of identical calls is kept alive but never polled again after it sent its claim
/// (a client that stopped reading, a task starved): the calls that joined its claim do not wait
/// for it forever — after the ledger timeout they claim on their own.
async fn a_first_call_no_longer_polled_does_not_wedge_the_calls_that_joined_it(backend: &str) {
    let test = "a_first_call_no_longer_polled_does_not_wedge_the_calls_that_joined_it";
    if backend == "memory" {
        return; // A local ledger answers in one poll and is never coalesced: nobody joins a claim.
    }
    let Some(shared) = ledger(backend, test).await else { return };
    let idem = idem_tests::builder(shared).ledger_timeout(Duration::from_millis(100)).build().unwrap();
    let warm = json!({ "service": unique("warm-up") });
    idem.call(&DEPLOY, Some(alice()), &warm, || async { Ok::<_, Error>(String::new()) }).await.unwrap();
    let args = json!({ "service": unique("api") });
    let mut stuck =
        Box::pin(idem.call(&DEPLOY_NOW, Some(alice()), &args, || async { Ok::<_, Error>("stuck".to_owned()) }));
    // One poll: the call joins nothing, starts its claim, and is never polled again.
    std::future::poll_fn(|cx| {
        assert!(stuck.as_mut().poll(cx).is_pending(), "the first call finished in one poll");
        std::task::Poll::Ready(())
    })
    .await;
    let joined = idem.call(&DEPLOY_NOW, Some(alice()), &args, || async { Ok::<_, Error>("ran".to_owned()) });
    let answer = tokio::time::timeout(Duration::from_secs(5), joined).await;
    assert!(
        answer.is_ok(),
        "{backend}: a call that joined a first call never polled again was still waiting after 5 s"
    );
    drop(stuck);
}

/// The first call fails having done nothing while a repeat waits: the repeat claims again and
/// runs the handler itself, and the downstream sees exactly one effect.
async fn a_repeat_runs_the_handler_when_the_first_call_did_nothing(backend: &str) {
    let test = "a_repeat_runs_the_handler_when_the_first_call_did_nothing";
    let Some(r) = replicas(backend, test).await else { return };
    let (downstream, release, started) = (Downstream::default(), Notify::new(), AtomicBool::new(false));
    let args = json!({ "service": unique("api") });
    let first = r.first.call(&DEPLOY, Some(alice()), &args, || async {
        started.store(true, Ordering::SeqCst);
        release.notified().await;
        Err::<String, _>(Error::Refused)
    });
    let repeat = async {
        idem_tests::wait_until("the first call's handler to start", || started.load(Ordering::SeqCst)).await;
        let repeat =
            r.repeats.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
        let release = async {
            r.repeats_ledger.answered(1).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.notify_one();
        };
        tokio::join!(repeat, release).0
    };
    let (first, repeat) = tokio::join!(first, repeat);
    assert!(matches!(first, Err(Error::Refused)), "{first:?}");
    let repeat = repeat.unwrap();
    assert!(!repeat.replayed, "the repeat ran the handler itself");
    assert_eq!((downstream.effects(), downstream.attempts.load(Ordering::SeqCst)), (1, 1));
}

/// A holder in the same process wakes its waiters when it records its outcome: they are
/// answered after one read of the record, not after reads every poll interval while it ran.
async fn a_local_holder_wakes_its_waiters_without_polling(backend: &str) {
    let Some(r) = replicas(backend, "a_local_holder_wakes_its_waiters_without_polling").await else { return };
    let (idem, counted) = (&r.repeats, &r.repeats_ledger);
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = idem.call(&DEPLOY, Some(alice()), &args, || async {
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let waiters = async {
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let call = || idem.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
        let release = async {
            // The holder's claim; its waiters in this process are answered "in flight" by the
            // process itself (the claim is held here), with no statement, and then wait.
            counted.answered(1).await;
            // Long enough for a poller to read the record half a dozen times (10 ms doubling).
            tokio::time::sleep(Duration::from_millis(600)).await;
            release.notify_one();
        };
        let calls: Vec<_> = (0..10).map(|_| call()).collect();
        tokio::join!(futures_join_all(calls), release).0
    };
    let (first, waiters) = tokio::join!(first, waiters);
    let first = first.unwrap();
    for waiter in waiters {
        let waiter = waiter.unwrap();
        assert_eq!((waiter.value, waiter.replayed), (first.value.clone(), true));
    }
    let lookups = counted.lookups.load(Ordering::SeqCst);
    assert!(lookups <= 2, "{lookups} reads of the record for waiters of a holder in this process (expected 1)");
    assert_eq!(downstream.effects(), 1);
}

/// 1,000 repeats wait on one operation held by another replica: they cost the ledger a few
/// claims (identical claims in one process share one) and a few reads, however many they are.
async fn a_thousand_waiters_cost_a_bounded_number_of_statements(backend: &str) {
    let test = "a_thousand_waiters_cost_a_bounded_number_of_statements";
    let Some(r) = replicas(backend, test).await else { return };
    let downstream = Arc::new(Downstream::default());
    let release = Arc::new(Notify::new());
    let args = json!({ "service": unique("api") });
    let first = {
        let (idem, downstream, release, args) = (r.first.clone(), downstream.clone(), release.clone(), args.clone());
        tokio::spawn(async move {
            idem.call(&DEPLOY, Some(alice()), &args, || async {
                let receipt = downstream.deploy("api");
                release.notified().await;
                Ok::<_, Error>(receipt)
            })
            .await
        })
    };
    idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
        .await;
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let (idem, downstream, args) = (r.repeats.clone(), downstream.clone(), args.clone());
            tokio::spawn(async move {
                idem.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) }).await
            })
        })
        .collect();
    // The first repeat's claim reaches the ledger; the 999 identical ones share its answer.
    r.repeats_ledger.answered(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.notify_one();
    let first = first.await.unwrap().unwrap();
    for waiter in waiters {
        let waiter = waiter.await.unwrap().unwrap();
        assert_eq!((waiter.value.as_str(), waiter.replayed), (first.value.as_str(), true));
    }
    let counted = &r.repeats_ledger;
    let (claims, sent) = (counted.claims.load(Ordering::SeqCst), counted.statements());
    eprintln!(
        "waiting::{backend}: 1000 waiters sent {sent} statements ({} reads, {claims} claims)",
        counted.lookups.load(Ordering::SeqCst),
    );
    // Each repeat's claim used to be its own; over a round trip, identical claims in one process
    // now share one (a few, as the repeats arrive), and the whole wait costs a few statements.
    // The memory ledger is not coalesced (its claims cost no round trip): 1,000 of their own.
    let own = if backend == "memory" { 1000 } else { 0 };
    assert!(sent - own <= 50, "1000 waiters cost {sent} statements");
    assert_eq!((downstream.effects(), downstream.attempts.load(Ordering::SeqCst)), (1, 1));
}

/// The ledger fails a waiter's read (it went down): the wait ends "in flight" — long before
/// its thirty seconds, though no time is asserted — and nothing runs the handler again.
async fn a_read_that_fails_ends_the_wait_in_flight(backend: &str) {
    let Some(r) = replicas(backend, "a_read_that_fails_ends_the_wait_in_flight").await else { return };
    r.repeats_ledger.fail_lookups.store(true, Ordering::SeqCst);
    let (downstream, release) = (Downstream::default(), Notify::new());
    let args = json!({ "service": unique("api") });
    let first = r.first.call(&DEPLOY, Some(alice()), &args, || async {
        let receipt = downstream.deploy("api");
        release.notified().await;
        Ok::<_, Error>(receipt)
    });
    let repeat = async {
        idem_tests::wait_until("the first call's handler to start", || downstream.attempts.load(Ordering::SeqCst) > 0)
            .await;
        let repeat =
            r.repeats.call(&DEPLOY, Some(alice()), &args, || async { Ok::<_, Error>(downstream.deploy("api")) });
        let repeat = repeat.await;
        release.notify_one();
        repeat
    };
    let (first, repeat) = tokio::join!(first, repeat);
    assert!(matches!(repeat, Err(Error::Idem(ref code)) if code == "in_flight"), "{repeat:?}");
    assert!(!first.unwrap().replayed);
    assert_eq!(downstream.attempts.load(Ordering::SeqCst), 1);
}

/// Every future of `futures`, concurrently, in order.
async fn futures_join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future finished")).collect()
}
