//! What a replica does when its ledger fails over under it (issue 30, item 2), with the
//! failover played on a memory ledger whose clock is the server's: the connection a statement
//! was sent on dies (the statement fails, maybe after it committed), and the server that answers
//! next is another machine, with another clock. The same through a real PostgreSQL cluster is
//! `reliability::pg_failover`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::{Ledger, LedgerError, Token};
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection, StalePolicy, clock::ManualClock,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use serde_json::json;

const T0: u64 = 1_900_000_000_000;
/// How far ahead the promoted standby's clock reads: more than a lease.
const AHEAD: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(10);

/// A tool whose dead holder is taken over: a lease stamped on the wrong clock runs it twice.
static CHARGE: Recipe = Recipe::new("failover_charge", &["order_id"]).stale(StalePolicy::Takeover);

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Error {
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

/// Fails the next `n` statements of the kinds it is told, as a connection cut mid-statement
/// does: the answer is lost (the statement is not sent: the failover lost it).
#[derive(Default)]
struct Cut {
    claims: AtomicUsize,
    lookups: AtomicUsize,
    /// Claims that commit before their answer is lost.
    committed_claims: AtomicUsize,
    /// Reads of the ledger's clock that take [`SLOW`] (a new primary still warming up).
    slow_nows: AtomicUsize,
    /// Reads of the ledger's clock that fail.
    failed_nows: AtomicUsize,
    /// The server that answers reads [`AHEAD`] of the one before (on a ledger whose clock the
    /// test cannot move).
    ahead: AtomicBool,
    /// Set when a slow read of the clock starts.
    slow_started: AtomicBool,
}

/// How long a slow read of the ledger's clock takes.
const SLOW: Duration = Duration::from_millis(800);

fn take(left: &AtomicUsize) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

impl Tap for Cut {
    fn before(&self, call: Call) -> Pass {
        let cut = match call {
            Call::Claim => take(&self.claims),
            Call::Lookup | Call::Status => take(&self.lookups),
            _ => false,
        };
        if cut || (call == Call::Now && take(&self.failed_nows)) {
            return Pass::Fail(LedgerError::ambiguous("connection reset by peer"));
        }
        if call == Call::Now && take(&self.slow_nows) {
            self.slow_started.store(true, Ordering::SeqCst);
            return Pass::After(SLOW);
        }
        if call == Call::Claim && take(&self.committed_claims) {
            return Pass::Lost(LedgerError::ambiguous("connection reset by peer"));
        }
        Pass::Through
    }

    fn clock_shift(&self) -> i64 {
        if self.ahead.load(Ordering::SeqCst) { i64::try_from(AHEAD.as_millis()).unwrap() } else { 0 }
    }
}

/// Charges `order` on `idem`, counting runs; the handler waits for `release` if one is given.
async fn charge(
    idem: &Idem,
    order: &str,
    runs: &AtomicUsize,
    release: Option<&tokio::sync::Notify>,
) -> Result<idem_runtime::Served<String>, Error> {
    idem.call(&CHARGE, Some(&Caller::new("acme", "alice")), &json!({ "order_id": order, "amount": 5 }), || async {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(release) = release {
            release.notified().await;
        }
        Ok::<_, Error>(format!("charged #{n}"))
    })
    .await
}

fn order() -> String {
    format!("o-{}", Token::random().get())
}

/// A ledger whose server clock the test moves, behind a tap that cuts statements, and a
/// replica on it that has measured its clock against the ledger's (offset 0).
async fn measured_replica() -> (ManualClock, Arc<Tapped<Cut>>, Idem, String) {
    let server = ManualClock::new(T0);
    let ledger = Tapped::new(Arc::new(MemoryLedger::with_clock(server.clone())), Cut::default());
    let replica = idem_tests::builder(Arc::clone(&ledger) as Arc<dyn Ledger>)
        .clock(ManualClock::new(T0))
        .lease(LEASE)
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    let first = charge(&replica, &order(), &runs, None).await.expect("a first call measures the clock");
    (server, ledger, replica, first.reference.to_string())
}

/// Another replica that starts after the failover: it measures the new primary's clock.
fn fresh_replica(ledger: &Arc<Tapped<Cut>>) -> Idem {
    idem_tests::builder(Arc::clone(ledger) as Arc<dyn Ledger>).clock(ManualClock::new(T0)).lease(LEASE).build().unwrap()
}

/// Runs `order` on `first` (held in its handler) and repeats it on `second`: the repeat must
/// hear "in flight", not take over a lease `first` stamped on the old primary's clock.
async fn repeat_while_running(first: &Idem, second: &Idem, order: &str, backend: &str) {
    let (runs, release) = (AtomicUsize::new(0), tokio::sync::Notify::new());
    let running = charge(first, order, &runs, Some(&release));
    let repeat = async {
        let started = async {
            while runs.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), started).await.is_err() {
            release.notify_one();
            return Err(Error::Idem(Rejection::ledger_unavailable(format!("{backend}: the first call never ran"))));
        }
        let answer = charge(second, order, &runs, None).await;
        release.notify_one();
        answer
    };
    let (first_answer, repeat) = tokio::join!(running, repeat);
    let ran = runs.load(Ordering::SeqCst);
    assert_eq!(ran, 1, "{backend}: the charge ran {ran} times across the failover, not once");
    match first_answer {
        Ok(served) => assert_eq!(served.value, "charged #1", "{backend}"),
        Err(Error::Idem(rejection)) => panic!("{backend}: the first call was refused: {rejection}"),
    }
    match repeat {
        Err(Error::Idem(rejection)) => assert_eq!(rejection.code(), "in_flight", "{backend}: {rejection}"),
        Ok(served) => panic!("{backend}: the repeat was answered {:?} while the first ran", served.value),
    }
}

/// The claim itself is the statement the failover cut: it is sent again with the same token —
/// stamped on the new primary's clock, measured first, not on the clock of a server that is
/// gone. Before, the resend carried a lease that had already lapsed on the new primary, and a
/// repeat through another replica took it over and ran the charge a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_by_a_failover_is_sent_again_on_the_new_primarys_clock() {
    let (server, ledger, replica, _) = measured_replica().await;
    server.advance(AHEAD);
    ledger.claims.store(1, Ordering::SeqCst);
    repeat_while_running(&replica, &fresh_replica(&ledger), &order(), "memory").await;
}

/// The same, when the cut claim had committed (and reached the standby that was promoted):
/// the ledger holds the first send's lease, stamped on the old primary's clock. The resend is
/// recognised as ours, and the lease is renewed to the new stamp before the handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_committed_before_the_cut_holds_a_lease_on_the_new_clock() {
    let (server, ledger, replica, _) = measured_replica().await;
    server.advance(AHEAD);
    ledger.committed_claims.store(1, Ordering::SeqCst);
    repeat_while_running(&replica, &fresh_replica(&ledger), &order(), "memory").await;
    assert_eq!(ledger.committed_claims.load(Ordering::SeqCst), 0);
}

/// Any statement the failover cut (here a status read) makes the next claim measure the clock
/// first: the server that answers may be another machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_measures_the_clock_again_after_a_lost_connection() {
    let (server, ledger, replica, reference) = measured_replica().await;
    server.advance(AHEAD);
    ledger.lookups.store(1, Ordering::SeqCst);
    let cut = replica.status(&Caller::new("acme", "alice"), &reference).await;
    assert!(cut.is_err(), "the status read was not cut: {cut:?}");
    assert_eq!(ledger.lookups.load(Ordering::SeqCst), 0, "the status read never reached the ledger");
    repeat_while_running(&replica, &fresh_replica(&ledger), &order(), "memory").await;
}

/// Every ledger the promise must hold on — memory, SQLite, PostgreSQL, MariaDB and Redis — each
/// behind a [`Cut`], with the clocks of this machine (a failover's new clock is [`Cut::ahead`]).
async fn every_backend(test: &str) -> Vec<(&'static str, Arc<Tapped<Cut>>)> {
    let mut ledgers = crate::ledger_redis::every_ledger_and_redis(test).await;
    // The memory ledger with a clock of its own, as a server's (the default keeps none).
    ledgers[0] = ("memory", Arc::new(idem_runtime::MemoryLedger::with_clock(idem_runtime::clock::SystemClock)));
    ledgers.into_iter().map(|(name, ledger)| (name, Tapped::new(ledger, Cut::default()))).collect()
}

fn replica_on(ledger: &Arc<Tapped<Cut>>) -> Idem {
    idem_tests::builder(Arc::clone(ledger) as Arc<dyn Ledger>).lease(LEASE).build().unwrap()
}

/// A replica on `ledger` that has measured its clock against the ledger's (its first call), and
/// that call's ref.
async fn serving(ledger: &Arc<Tapped<Cut>>, backend: &str) -> (Idem, String) {
    let replica = replica_on(ledger);
    let first = charge(&replica, &order(), &AtomicUsize::new(0), None).await;
    let Ok(first) = first else { panic!("{backend}: a first call measures the clock and runs") };
    (replica, first.reference.to_string())
}

/// Issue 41, item 1 (a). After a statement lost its server, one call measures the new primary's
/// clock (slowly) and a second call arrives meanwhile. The second must wait for that
/// measurement: before, it fell through to the old offset ("untrusted" is not "fresh"), claimed
/// with a lease that had lapsed already on the new primary's clock, ran, and a repeat through
/// another replica took it over and charged again (ran 2 times, on every backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_arriving_while_another_call_measures_is_stamped_on_the_new_clock() {
    for (backend, ledger) in every_backend("failover_measuring").await {
        let (replica, reference) = serving(&ledger, backend).await;
        // The failover: a status read loses its server, and the server that answers next reads
        // a minute ahead.
        ledger.ahead.store(true, Ordering::SeqCst);
        ledger.lookups.store(1, Ordering::SeqCst);
        let cut = replica.status(&Caller::new("acme", "alice"), &reference).await;
        assert!(cut.is_err(), "{backend}: the status read was not cut: {cut:?}");
        ledger.slow_nows.store(1, Ordering::SeqCst);
        let measuring = async { charge(&replica, &order(), &AtomicUsize::new(0), None).await };
        let arriving = async {
            // Arrives once the first call is measuring, well before its measurement ends.
            let what = format!("{backend}: the first call to measure the clock");
            idem_tests::wait_until(&what, || ledger.slow_started.load(Ordering::SeqCst)).await;
            repeat_while_running(&replica, &replica_on(&ledger), &order(), backend).await;
        };
        let (measured, ()) = tokio::join!(measuring, arriving);
        assert!(measured.is_ok(), "{backend}: the call that measured was refused");
        assert_eq!(ledger.slow_nows.load(Ordering::SeqCst), 0, "{backend}: the clock was never read slowly");
    }
}

/// Issue 41, item 1 (b). A claim cut by a failover is sent again only on a clock read after the
/// cut; when that read fails too, the caller is told nothing was executed. Before, `restamp` kept
/// the old stamp when the read failed, the resend won with a lease that had lapsed already on the
/// new primary's clock, and a repeat through another replica took it over and charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_claim_is_not_sent_again_on_the_old_clock_when_the_clock_cannot_be_read() {
    for (backend, ledger) in every_backend("failover_unmeasured").await {
        let (replica, _) = serving(&ledger, backend).await;
        ledger.ahead.store(true, Ordering::SeqCst);
        ledger.claims.store(1, Ordering::SeqCst);
        ledger.failed_nows.store(1, Ordering::SeqCst);
        let (order, runs, release) = (order(), AtomicUsize::new(0), tokio::sync::Notify::new());
        let ended = AtomicBool::new(false);
        let cut = async {
            let answer = charge(&replica, &order, &runs, Some(&release)).await;
            ended.store(true, Ordering::SeqCst);
            answer
        };
        let repeat = async {
            // The repeat comes once the cut call has run its handler, or ended without.
            let what = format!("{backend}: the cut call to run or end");
            idem_tests::wait_until(&what, || runs.load(Ordering::SeqCst) > 0 || ended.load(Ordering::SeqCst)).await;
            let answer = charge(&replica_on(&ledger), &order, &runs, None).await;
            release.notify_one();
            answer
        };
        let (cut, repeat) = tokio::join!(cut, repeat);
        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(ran, 1, "{backend}: the charge ran {ran} times across the failover, not once");
        match cut {
            Err(Error::Idem(rejection)) => assert_eq!(rejection.code(), "ledger_unavailable", "{backend}: {rejection}"),
            Ok(served) => panic!(
                "{backend}: the cut claim was sent again on the old primary's clock and answered {:?}",
                served.value
            ),
        }
        let Ok(repeat) = repeat else { panic!("{backend}: the repeat, the only run, was refused") };
        assert!(!repeat.replayed, "{backend}");
        assert_eq!(ledger.failed_nows.load(Ordering::SeqCst), 0, "{backend}: the clock read never failed");
    }
}
