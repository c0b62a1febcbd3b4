//! What a replica does when its ledger fails over under it (issue 30, item 2), with the
//! failover played on a memory ledger whose clock is the server's: the connection a statement
//! was sent on dies (the statement fails, maybe after it committed), and the server that answers
//! next is another machine, with another clock. The same through a real PostgreSQL cluster is
//! `reliability::pg_failover`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
}

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
        if cut {
            return Pass::Fail(LedgerError::ambiguous("connection reset by peer"));
        }
        if call == Call::Claim && take(&self.committed_claims) {
            return Pass::Lost(LedgerError::ambiguous("connection reset by peer"));
        }
        Pass::Through
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
async fn repeat_while_running(first: &Idem, second: &Idem, order: &str) {
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
            return Err(Error::Idem(Rejection::ledger_unavailable("the first call never ran")));
        }
        let answer = charge(second, order, &runs, None).await;
        release.notify_one();
        answer
    };
    let (first_answer, repeat) = tokio::join!(running, repeat);
    let ran = runs.load(Ordering::SeqCst);
    assert_eq!(ran, 1, "the charge ran {ran} times across the failover, not once");
    assert_eq!(first_answer.expect("the first call runs").value, "charged #1");
    match repeat {
        Err(Error::Idem(rejection)) => assert_eq!(rejection.code(), "in_flight", "{rejection}"),
        Ok(served) => panic!("the repeat was answered {:?} while the first ran", served.value),
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
    repeat_while_running(&replica, &fresh_replica(&ledger), &order()).await;
}

/// The same, when the cut claim had committed (and reached the standby that was promoted):
/// the ledger holds the first send's lease, stamped on the old primary's clock. The resend is
/// recognised as ours, and the lease is renewed to the new stamp before the handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_committed_before_the_cut_holds_a_lease_on_the_new_clock() {
    let (server, ledger, replica, _) = measured_replica().await;
    server.advance(AHEAD);
    ledger.committed_claims.store(1, Ordering::SeqCst);
    repeat_while_running(&replica, &fresh_replica(&ledger), &order()).await;
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
    repeat_while_running(&replica, &fresh_replica(&ledger), &order()).await;
}
