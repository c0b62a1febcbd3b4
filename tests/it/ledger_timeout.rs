//! A ledger that never answers is unavailable within the ledger timeout on every path — a
//! call's, an agent's status read, and each of the operator's — on every backend: the timeout
//! is a layer around the ledger, so no path can reach it unbounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_runtime::ledger::{Ledger, Resolution};
use idem_runtime::{Caller, Idem, Recipe, admin::PendingFilter};
use idem_tests::tap::{Call, Pass, Tap, Tapped};

/// Hangs every call once `hanging` is set (the ledger's clock is read first, while it answers).
struct Hanging {
    hanging: AtomicBool,
}

impl Tap for Hanging {
    fn before(&self, _call: Call) -> Pass {
        if self.hanging.load(Ordering::SeqCst) { Pass::Hang } else { Pass::Through }
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Error(String);

impl idem_runtime::IdempotentError for Error {
    fn classify(&self) -> idem_runtime::ErrorClass {
        idem_runtime::ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: idem_runtime::Rejection) -> Self {
        Self(rejection.code().to_owned())
    }
}

static PLACE: Recipe = Recipe::new("place_order", &["order_id"]);

const TIMEOUT: Duration = Duration::from_millis(50);
/// Far beyond the timeout: an answer after this means nothing bounded the call.
const PATIENCE: Duration = Duration::from_secs(3);

async fn answered<T>(what: &str, backend: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, call)
        .await
        .unwrap_or_else(|_| panic!("{backend}: {what} was still waiting for the ledger after {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_ledger_is_unavailable_within_the_timeout_on_every_path() {
    for (backend, ledger) in idem_tests::every_ledger("a_hanging_ledger_is_unavailable").await {
        let tapped = Tapped::new(ledger, Hanging { hanging: AtomicBool::new(false) });
        let idem = idem_tests::builder(Arc::clone(&tapped) as Arc<dyn Ledger>)
            .lease(Duration::from_secs(1))
            .ledger_timeout(TIMEOUT)
            .build()
            .unwrap();
        let alice = Caller::new("acme", "alice");
        // One call while the ledger answers: the clock is measured and the secret checked. A
        // cold handle's first call sends several statements, any of which may pass the 50 ms
        // bound on a busy machine: it is tried again (a new operation each time) until it is
        // answered, since what is tested is the hanging ledger below.
        let mut served = None;
        for attempt in 0..20 {
            let order = serde_json::json!({ "order_id": format!("o-{attempt}") });
            match idem.call(&PLACE, Some(&alice), &order, || async { Ok::<_, Error>(1) }).await {
                Ok(answer) => {
                    served = Some(answer);
                    break;
                }
                Err(error) => assert_eq!(error.0, "ledger_unavailable", "{backend}"),
            }
        }
        let served = served.unwrap_or_else(|| panic!("{backend}: the ledger never answered within {TIMEOUT:?}"));
        let reference = served.reference.to_string();
        let address = idem.status(&alice, &reference).await.unwrap().expect("the operation").address().to_string();
        tapped.hanging.store(true, Ordering::SeqCst);

        let status = answered("status", backend, idem.status(&alice, &reference)).await;
        assert!(status.is_err(), "{backend}: status of a hanging ledger: {status:?}");
        let inspect = answered("inspect", backend, idem.admin().inspect("acme", &reference)).await;
        assert!(inspect.is_err(), "{backend}: inspect: {inspect:?}");
        let resolve =
            answered("resolve", backend, idem.admin().resolve(alice.tenant(), &address, Resolution::NothingHappened))
                .await;
        // Refused either way, never acted on: its statement timed out (ambiguous), or — the
        // reads above having lost their server — the clock, measured again first, did not answer.
        assert!(matches!(resolve, Err(idem_runtime::StatusError::Ledger(_))), "{backend}: resolve: {resolve:?}");
        let stats = answered("stats", backend, idem.admin().stats()).await;
        assert!(stats.is_err(), "{backend}: stats: {stats:?}");
        let pending = answered("pending", backend, idem.admin().pending(&PendingFilter::new(10))).await;
        assert!(pending.is_err(), "{backend}: pending: {pending:?}");
        let sweep = answered("sweep", backend, idem.admin().sweep(10)).await;
        assert!(sweep.is_err(), "{backend}: sweep: {sweep:?}");
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let call = answered(
            "a call",
            backend,
            idem.call(&PLACE, Some(&alice), &serde_json::json!({ "order_id": "o-2" }), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(2)
            }),
        )
        .await;
        assert_eq!(
            call.map(|served| served.value).map_err(|Error(code)| code).unwrap_err(),
            "ledger_unavailable",
            "{backend}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{backend}: a handler ran without the ledger");
    }
}

/// The layer is applied however the handle was configured: a timeout set after other settings
/// still bounds the operator's paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_set_last_is_the_one_every_path_keeps() {
    let tapped = Tapped::new(Arc::new(idem_runtime::MemoryLedger::new()), Hanging { hanging: AtomicBool::new(true) });
    let idem: Idem = idem_tests::builder(tapped as Arc<dyn Ledger>)
        .ledger_timeout(TIMEOUT)
        .retention(Duration::from_secs(60))
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let stats = answered("stats", "memory", idem.admin().stats()).await;
    assert!(stats.is_err(), "stats of a hanging ledger: {stats:?}");
}
