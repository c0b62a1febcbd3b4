//! Hooks (`Builder::hooks`): the sequence of events a recording hook sees for a fresh call, a
//! replay, a conflict, an in-flight repeat (two calls at once), an unknown outcome and a failure,
//! on the memory ledger and SQLite (a file); that no event carries an argument's value or a
//! result; and that a panicking hook breaks no call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_runtime::ledger::Token;
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection,
    hooks::{CallEvent, Completion, Hooks},
    ledger::Ledger,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

/// A value planted in every argument and result: no event may show it.
const SECRET: &str = "4111-1111-1111-1111-planted";

static CHARGE: Recipe = Recipe::new("charge", &["order"]).namespace("payments");
/// The same tool for a downstream that dedupes by the forwarded key: a dead holder's lease is
/// taken over.
static CHARGE_TAKEOVER: Recipe =
    Recipe::new("charge", &["order"]).namespace("payments").stale(idem_runtime::StalePolicy::Takeover);

#[derive(Debug, Serialize, Deserialize)]
enum Error {
    /// The downstream timed out: it may have charged.
    TimedOut,
    /// The downstream refused before doing anything.
    Refused,
    Idem(String),
}

impl IdempotentError for Error {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::TimedOut => ErrorClass::Unknown,
            Self::Refused | Self::Idem(_) => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.code().to_owned())
    }
}

/// Writes each event down as `"<what> <ref>"`, checks what every event says of the call, and
/// keeps each event's `Debug` text.
#[derive(Default)]
struct Recording {
    events: Mutex<Vec<String>>,
    debug: Mutex<Vec<String>>,
}

impl Recording {
    fn note(&self, what: &str, event: &CallEvent<'_>) {
        assert_eq!((event.tool, event.namespace), ("charge", "payments"));
        assert_eq!((event.caller.tenant(), event.caller.subject()), ("acme", "alice"));
        self.events.lock().unwrap().push(format!("{what} {}", event.reference));
        self.debug.lock().unwrap().push(format!("{event:?}"));
    }

    /// The events since the last take.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

impl Hooks for Recording {
    fn on_claim(&self, event: &CallEvent<'_>) {
        self.note("claim", event);
    }
    fn on_takeover(&self, event: &CallEvent<'_>) {
        self.note("takeover", event);
    }
    fn on_reconcile(&self, event: &CallEvent<'_>) {
        self.note("reconcile", event);
    }
    fn on_replay(&self, event: &CallEvent<'_>) {
        self.note("replay", event);
    }
    fn on_in_flight(&self, event: &CallEvent<'_>) {
        self.note("in_flight", event);
    }
    fn on_conflict(&self, event: &CallEvent<'_>) {
        self.note("conflict", event);
    }
    fn on_unknown(&self, event: &CallEvent<'_>) {
        self.note("unknown", event);
    }
    fn on_complete(&self, event: &CallEvent<'_>, completion: Completion) {
        self.note(&format!("complete:{}", completion.as_str()), event);
        self.debug.lock().unwrap().push(format!("{completion:?}"));
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Token::random().get())
}

async fn ledger(backend: &str) -> Arc<dyn Ledger> {
    match backend {
        "memory" => Arc::new(MemoryLedger::new()),
        _ => {
            let dir = std::env::temp_dir().join(unique("idem-hooks"));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
            Arc::new(idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("open a SQLite file"))
        }
    }
}

/// A handle with a recording hook on `backend`'s ledger.
async fn recorded(backend: &str) -> (Idem, Arc<Recording>) {
    let recording = Arc::new(Recording::default());
    let idem = idem_tests::builder(ledger(backend).await).hooks(recording.clone()).build().unwrap();
    (idem, recording)
}

/// The arguments of one order, a secret beside the key.
fn charge(order: &str, amount: u64) -> serde_json::Value {
    json!({ "order": order, "amount": amount, "card": SECRET })
}

macro_rules! on_memory_and_sqlite {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
    };
}

on_memory_and_sqlite!(
    a_fresh_call_a_replay_and_a_conflict,
    an_in_flight_repeat_while_the_first_call_runs,
    an_unknown_outcome_and_its_repeat,
    a_failure_is_claimed_again,
    no_event_shows_an_argument_or_a_result,
    a_panicking_hook_breaks_no_call,
    a_dead_holders_lease_is_taken_over,
);

/// A fresh call: claimed, then completed; its repeat: replayed; the same order with another
/// amount: a conflict. One event per answer, all naming the operation's ref.
async fn a_fresh_call_a_replay_and_a_conflict(backend: &str) {
    let (idem, recording) = recorded(backend).await;
    let order = unique("o");
    let run = || async { Ok::<_, Error>(format!("receipt for {SECRET}")) };
    let first = idem.call(&CHARGE, Some(&alice()), &charge(&order, 100), run).await.unwrap();
    let r = first.reference;
    assert_eq!(recording.take(), [format!("claim {r}"), format!("complete:completed {r}")]);

    let again = idem.call(&CHARGE, Some(&alice()), &charge(&order, 100), run).await.unwrap();
    assert!(again.replayed);
    assert_eq!(recording.take(), [format!("replay {r}")]);

    let other = idem.call(&CHARGE, Some(&alice()), &charge(&order, 999), run).await;
    assert!(matches!(other, Err(Error::Idem(code)) if code == "conflict"));
    assert_eq!(recording.take(), [format!("conflict {r}")]);
}

/// Two calls at once: the second finds the first running and is told "in flight"; the first
/// then completes. The repeat's event comes between the first call's two.
async fn an_in_flight_repeat_while_the_first_call_runs(backend: &str) {
    let (idem, recording) = recorded(backend).await;
    let (started, release) = (Notify::new(), Notify::new());
    let args = charge(&unique("o"), 100);
    let first = async {
        idem.call(&CHARGE, Some(&alice()), &args, || async {
            started.notify_one();
            release.notified().await;
            Ok::<_, Error>("receipt".to_owned())
        })
        .await
    };
    let repeat = async {
        idem_tests::within("the first call's handler to start", started.notified()).await;
        let repeat = tokio::spawn({
            let (idem, args) = (idem.clone(), args.clone());
            async move { idem.call(&CHARGE, Some(&alice()), &args, || async { Ok::<_, Error>("second".to_owned()) }).await }
        });
        let repeat = repeat.await.unwrap();
        release.notify_one();
        repeat
    };
    let (first, repeat) = tokio::join!(first, repeat);
    let r = first.unwrap().reference;
    assert!(matches!(repeat, Err(Error::Idem(code)) if code == "in_flight"));
    assert_eq!(recording.take(), [format!("claim {r}"), format!("in_flight {r}"), format!("complete:completed {r}")]);
}

/// A handler whose downstream timed out: recorded unknown; its repeat is told "unknown".
async fn an_unknown_outcome_and_its_repeat(backend: &str) {
    let (idem, recording) = recorded(backend).await;
    let args = charge(&unique("o"), 100);
    let first = idem.call(&CHARGE, Some(&alice()), &args, || async { Err::<String, _>(Error::TimedOut) }).await;
    assert!(matches!(first, Err(Error::TimedOut)));
    let events = recording.take();
    let r = events[0].strip_prefix("claim ").expect("a claim first").to_owned();
    assert_eq!(events, [format!("claim {r}"), format!("complete:unknown {r}")]);

    let again = idem.call(&CHARGE, Some(&alice()), &args, || async { Ok::<_, Error>("charged".to_owned()) }).await;
    assert!(matches!(again, Err(Error::Idem(code)) if code == "outcome_unknown"));
    assert_eq!(recording.take(), [format!("unknown {r}")]);
}

/// "Nothing happened" is recorded failed, and the repeat claims (and runs) again.
async fn a_failure_is_claimed_again(backend: &str) {
    let (idem, recording) = recorded(backend).await;
    let args = charge(&unique("o"), 100);
    let first = idem.call(&CHARGE, Some(&alice()), &args, || async { Err::<String, _>(Error::Refused) }).await;
    assert!(matches!(first, Err(Error::Refused)));
    let again = idem.call(&CHARGE, Some(&alice()), &args, || async { Ok::<_, Error>("charged".to_owned()) }).await;
    let r = again.unwrap().reference;
    let expected =
        [format!("claim {r}"), format!("complete:failed {r}"), format!("claim {r}"), format!("complete:completed {r}")];
    assert_eq!(recording.take(), expected);
}

/// The `Debug` text of every event (each kind met above) never holds the planted value that
/// was in the arguments and the result, nor the amount's digits next to its name.
async fn no_event_shows_an_argument_or_a_result(backend: &str) {
    let (idem, recording) = recorded(backend).await;
    let order = unique("o");
    let run = || async { Ok::<_, Error>(format!("receipt for {SECRET}")) };
    idem.call(&CHARGE, Some(&alice()), &charge(&order, 73_519), run).await.unwrap();
    idem.call(&CHARGE, Some(&alice()), &charge(&order, 73_519), run).await.unwrap();
    let _ = idem.call(&CHARGE, Some(&alice()), &charge(&order, 99_317), run).await;
    let unknown = charge(&unique("o"), 73_519);
    let _ = idem.call(&CHARGE, Some(&alice()), &unknown, || async { Err::<String, _>(Error::TimedOut) }).await;
    let _ = idem.call(&CHARGE, Some(&alice()), &unknown, run).await;
    let debug = recording.debug.lock().unwrap().join("\n");
    assert_eq!(recording.take().len(), 7, "claim, complete, replay, conflict, claim, complete, unknown: {debug}");
    for planted in [SECRET, "73519", "99317", &order] {
        assert!(!debug.contains(planted), "an event shows {planted:?}:\n{debug}");
    }
    assert!(debug.contains("acme") && debug.contains("charge"), "the events name the caller and tool:\n{debug}");
}

/// A hook that panics on every event: every call still gets its answer (a fresh result, a
/// replay), and the next hook call is made as usual.
async fn a_panicking_hook_breaks_no_call(backend: &str) {
    #[derive(Default)]
    struct Panicking(AtomicUsize);
    impl Hooks for Panicking {
        fn on_claim(&self, _: &CallEvent<'_>) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a broken audit log");
        }
        fn on_replay(&self, _: &CallEvent<'_>) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a broken audit log");
        }
        fn on_complete(&self, _: &CallEvent<'_>, _: Completion) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a broken audit log");
        }
    }
    let hooks = Arc::new(Panicking::default());
    let idem = idem_tests::builder(ledger(backend).await).hooks(hooks.clone()).build().unwrap();
    let args = charge(&unique("o"), 100);
    let effects = AtomicUsize::new(0);
    let run = || async {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("receipt".to_owned())
    };
    let first = idem.call(&CHARGE, Some(&alice()), &args, run).await.unwrap();
    let again = idem.call(&CHARGE, Some(&alice()), &args, run).await.unwrap();
    assert_eq!((first.value.as_str(), again.value.as_str(), again.replayed), ("receipt", "receipt", true));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the completion was recorded despite the panic");
    assert_eq!(hooks.0.load(Ordering::SeqCst), 3, "claim, complete, replay: each hook was called");
}

/// A holder that dies mid-call (its call is dropped: no renewals, no completion) leaves its
/// claim without a completion; once its lease has lapsed, a repeat on another handle takes it
/// over, runs and completes.
async fn a_dead_holders_lease_is_taken_over(backend: &str) {
    let shared = ledger(backend).await;
    let recording = Arc::new(Recording::default());
    let lease = std::time::Duration::from_millis(90);
    let holder = idem_tests::builder(Arc::clone(&shared)).lease(lease).hooks(recording.clone()).build().unwrap();
    let repeats = idem_tests::builder(shared).lease(lease).hooks(recording.clone()).build().unwrap();
    let args = charge(&unique("o"), 100);
    let (started, caller) = (Notify::new(), alice());
    let dying = holder.call(&CHARGE_TAKEOVER, Some(&caller), &args, || async {
        started.notify_one();
        std::future::pending::<Result<String, Error>>().await
    });
    // The holder's call is dropped once its handler runs: it dies holding the claim.
    tokio::select! {
        answer = dying => panic!("the holder's call ended before its handler started: {answer:?}"),
        () = started.notified() => {}
    }
    let events = recording.take();
    let r = events[0].strip_prefix("claim ").expect("a claim first").to_owned();
    assert_eq!(events, [format!("claim {r}")], "a dead holder records nothing");
    let run = || async { Ok::<_, Error>("charged".to_owned()) };
    let deadline = tokio::time::Instant::now() + idem_tests::WAIT;
    let again = loop {
        // In flight until the lease has lapsed (on the ledger's clock), then taken over.
        match repeats.call(&CHARGE_TAKEOVER, Some(&alice()), &args, run).await {
            Err(Error::Idem(code)) if code == "in_flight" => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still in flight {:?} after its holder died",
                    idem_tests::WAIT
                );
                tokio::time::sleep(lease / 3).await;
            }
            other => break other.unwrap(),
        }
    };
    assert!(!again.replayed);
    let events: Vec<String> = recording.take().into_iter().filter(|event| !event.starts_with("in_flight")).collect();
    assert_eq!(events, [format!("takeover {r}"), format!("complete:completed {r}")]);
}
