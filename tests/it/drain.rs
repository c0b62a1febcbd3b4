//! A drain waits for the outcomes still being recorded (issue 41, item 3): a call that answered
//! its caller but whose recording hit a short ledger outage goes on recording in the background,
//! and SIGTERM's drain must wait for it — else the process exits, the acknowledged result is
//! lost, and under `takeover` the repeat runs again. On every ledger: memory, SQLite,
//! PostgreSQL, MariaDB and Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::{Ledger, LedgerError, State, Token};
use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, Recipe, Rejection, StalePolicy};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use serde_json::json;

static PAY: Recipe = Recipe::new("drain_pay", &["order_id"]).stale(StalePolicy::Takeover);

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

/// A short outage of the statements that record outcomes: the next `completes` are refused.
struct Outage {
    completes: AtomicUsize,
}

impl Tap for Outage {
    fn before(&self, call: Call) -> Pass {
        let down = call == Call::Complete
            && self.completes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if down { Pass::Fail(LedgerError::unavailable("connection refused (a short outage)")) } else { Pass::Through }
    }
}

fn caller() -> Caller {
    Caller::new("acme", "alice")
}

async fn pay(idem: &Idem, order: &str, runs: &AtomicUsize) -> Result<idem_runtime::Served<String>, Error> {
    idem.call(&PAY, Some(&caller()), &json!({ "order_id": order, "amount": 5 }), || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(format!("paid {order}"))
    })
    .await
}

/// The call answers "paid" while its recording is refused (three quick tries, then the first
/// background retry), and the handle drains at once, as on SIGTERM. The drain returns only once
/// the outcome is recorded: what a repeat finds after the process exits is the result. Before,
/// the drain returned at once with `still_running: 0` and the record still in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_waits_for_an_answered_calls_outcome_to_be_recorded() {
    for (backend, ledger) in crate::ledger_redis::every_ledger_and_redis("drain_waits").await {
        let outage = Tapped::new(Arc::clone(&ledger), Outage { completes: AtomicUsize::new(4) });
        let idem =
            idem_tests::builder(outage.clone() as Arc<dyn Ledger>).lease(Duration::from_secs(10)).build().unwrap();
        let (order, runs) = (format!("o-{}", Token::random().get()), AtomicUsize::new(0));
        let served = pay(&idem, &order, &runs).await.unwrap_or_else(|Error::Idem(r)| panic!("{backend}: {r}"));
        assert!(!served.replayed, "{backend}");
        let drained = idem.drain(Duration::from_secs(30)).await;
        assert_eq!(drained.still_running, 0, "{backend}: the recording did not finish within the drain's deadline");
        // The process exits here: what the ledger holds now is what every repeat will find.
        let next = idem_tests::builder(Arc::clone(&ledger)).lease(Duration::from_secs(10)).build().unwrap();
        let report = next.status(&caller(), &served.reference.to_string()).await.expect("the status is read");
        let state = report.map(|report| report.state);
        assert_eq!(
            state,
            Some(State::Completed),
            "{backend}: the drain returned before the answered call's outcome was recorded"
        );
        let repeat =
            pay(&next, &order, &runs).await.unwrap_or_else(|Error::Idem(r)| panic!("{backend}: the repeat: {r}"));
        assert!(repeat.replayed, "{backend}: the repeat was not a replay");
        assert_eq!(repeat.value, served.value, "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the payment ran again");
        assert_eq!(outage.completes.load(Ordering::SeqCst), 0, "{backend}: the outage never happened");
    }
}

/// An outage longer than the drain's deadline: the drain ends at its deadline, counts the
/// answered call still recording in `still_running` and `still_recording`, and its log names
/// the operation it left.
#[tokio::test]
async fn a_drain_at_its_deadline_counts_and_names_the_outcomes_still_being_recorded() {
    let log = idem_tests::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber());
    let ledger =
        Tapped::new(Arc::new(idem_runtime::MemoryLedger::new()), Outage { completes: AtomicUsize::new(usize::MAX) });
    let idem = idem_tests::builder(ledger as Arc<dyn Ledger>).lease(Duration::from_secs(10)).build().unwrap();
    let runs = AtomicUsize::new(0);
    let served = pay(&idem, "o-1", &runs).await.unwrap_or_else(|Error::Idem(r)| panic!("{r}"));
    let drained = idem.drain(Duration::from_millis(700)).await;
    assert_eq!((drained.still_running, drained.still_recording), (1, 1), "{drained:?}");
    let text = log.text();
    assert!(
        text.contains(&served.reference.to_string()) && text.contains("drained until the deadline"),
        "the drain's log names the operation it left: {text}"
    );
}

/// Fails every statement that records an outcome while `down` is set.
struct Down {
    down: std::sync::atomic::AtomicBool,
}

impl Tap for Down {
    fn before(&self, call: Call) -> Pass {
        if call == Call::Complete && self.down.load(Ordering::SeqCst) {
            Pass::Fail(LedgerError::unavailable("connection refused (an outage)"))
        } else {
            Pass::Through
        }
    }
}

/// More answered calls whose recording hits an outage than a handle runs background jobs at once
/// (32): each one is still recorded once the ledger is back, and the drain waits for every one.
/// Before, a recording past the 32nd was dropped at once ("too much background work"), its record
/// left in progress for the stale policy — a `takeover` repeat ran the payment again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answered_call_is_recorded_though_more_wait_than_the_background_runs_at_once() {
    const CALLS: usize = 40;
    let memory: Arc<dyn Ledger> = Arc::new(idem_runtime::MemoryLedger::new());
    let ledger = Tapped::new(Arc::clone(&memory), Down { down: std::sync::atomic::AtomicBool::new(true) });
    let idem = idem_tests::builder(ledger.clone() as Arc<dyn Ledger>).lease(Duration::from_secs(10)).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..CALLS {
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        calls.spawn(async move { pay(&idem, &format!("o-many-{n}"), &runs).await.map(|served| served.reference) });
    }
    let mut references = Vec::new();
    while let Some(answer) = calls.join_next().await {
        references.push(answer.unwrap().unwrap_or_else(|Error::Idem(r)| panic!("{r}")));
    }
    // Every call answered, none recorded: the outage ends, and the handle drains.
    ledger.down.store(false, Ordering::SeqCst);
    let drained = idem.drain(Duration::from_secs(30)).await;
    assert_eq!(drained.still_running, 0, "{drained:?}");
    let next = idem_tests::builder(memory).build().unwrap();
    let mut unrecorded = 0;
    for reference in &references {
        let report = next.status(&caller(), &reference.to_string()).await.unwrap();
        if report.map(|report| report.state) != Some(State::Completed) {
            unrecorded += 1;
        }
    }
    assert_eq!(unrecorded, 0, "of {CALLS} answered calls, {unrecorded} were never recorded");
    assert_eq!(runs.load(Ordering::SeqCst), CALLS);
}
