//! Tenant isolation: a tenant can never replay, read, settle or learn the existence of another
//! tenant's operation — on every ledger (memory, SQLite file, PostgreSQL, MariaDB).
//!
//! Tenant A holds three operations (completed, in progress, unknown). Tenant B:
//! - making the same calls runs B's own operations (never A's replay, `in_flight` or conflict);
//! - asking `Idem::status` for A's refs, and for 1,000 random refs, always gets `None`;
//! - `Idem::resolve` on A's refs always gets `NotFound` (never `NotResolvable`, which would
//!   confirm the ref exists), and A's records are unchanged afterwards.
//!
//! Positive controls: A sees its own records, B sees its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::ledger::{LedgerError, Resolution};
use idem_runtime::{
    Caller, ErrorClass, IdempotentError, MemoryLedger, Recipe, Rejection, StatusError, current_operation, ledger::State,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::support;
use crate::support::{scale, unique};

static CHARGE: Recipe = Recipe::new("rel_isolation_charge", &["order_id"]);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum IsoError {
    Timeout,
    Rejected(String),
}

impl IdempotentError for IsoError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Timeout => ErrorClass::Unknown,
            Self::Rejected(_) => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected(rejection.code().to_owned())
    }
}

macro_rules! on_every_ledger {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_ledger!(tenants_never_see_each_other);

fn random_ref() -> String {
    format!("{:016x}", idem_runtime::ledger::Token::random().get() ^ (idem_runtime::ledger::Token::random().get() << 1))
}

async fn tenants_never_see_each_other(backend: &str) {
    let idem = if backend == "memory" {
        idem_tests::idem(MemoryLedger::new())
    } else {
        let Some((_, ledger)) = support::connect(backend, "reliability_isolation::tenants_never_see_each_other").await
        else {
            return;
        };
        idem_tests::idem(ledger)
    };
    // Same subject name in both tenants: only the tenant differs.
    let a = Caller::new(unique("rel-iso-a"), "alice");
    let b = Caller::new(unique("rel-iso-b"), "alice");
    let runs_a = AtomicUsize::new(0);
    let runs_b = AtomicUsize::new(0);
    let orders = [unique("done"), unique("running"), unique("unknown")];
    let args = |i: usize| json!({ "order_id": orders[i], "amount_cents": 500 });

    // A: a completed operation.
    let done = idem
        .call(&CHARGE, Some(&a), &args(0), || async {
            runs_a.fetch_add(1, Ordering::SeqCst);
            Ok::<_, IsoError>(format!("A:{}", current_operation().unwrap().reference()))
        })
        .await
        .unwrap();
    // A: an operation whose outcome is unknown.
    let unknown = idem
        .call(&CHARGE, Some(&a), &args(2), || async {
            runs_a.fetch_add(1, Ordering::SeqCst);
            Err::<String, _>(IsoError::Timeout)
        })
        .await;
    assert_eq!(unknown, Err(IsoError::Timeout));
    // A: an operation in flight (its handler waits until B is done).
    let release = Arc::new(tokio::sync::Notify::new());
    let (claimed_tx, claimed) = tokio::sync::oneshot::channel();
    let running = {
        let (idem, a, args, release) = (idem.clone(), a.clone(), args(1), Arc::clone(&release));
        tokio::spawn(async move {
            idem.call(&CHARGE, Some(&a), &args, || async move {
                claimed_tx.send(current_operation().unwrap().reference().to_string()).unwrap();
                release.notified().await;
                Ok::<_, IsoError>("A:running".to_owned())
            })
            .await
        })
    };
    let running_ref = claimed.await.unwrap();
    let refs_a = [done.reference.to_string(), running_ref, {
        let status = idem.status(&a, &done.reference.to_string()).await.unwrap().unwrap();
        assert_eq!(status.state, State::Completed, "A sees its own record");
        // The unknown one's ref, as A's status tool would be asked.
        idem.admin().key_of(&CHARGE, &a, &json!({ "order_id": orders[2] })).unwrap().reference().to_string()
    }];
    let expected_a = [State::Completed, State::InProgress, State::Unknown];
    for (reference, state) in refs_a.iter().zip(expected_a) {
        assert_eq!(idem.status(&a, reference).await.unwrap().map(|s| s.state), Some(state), "A's own {reference}");
    }

    // B makes the same three calls, and variants with other non-key arguments: its own
    // operations every time — no replay of A's, no `in_flight`, no conflict.
    let mut refs_b = Vec::new();
    for (i, order) in orders.iter().enumerate() {
        for amount in [500, 999] {
            let arguments = json!({ "order_id": order, "amount_cents": amount });
            let served = idem
                .call(&CHARGE, Some(&b), &arguments, || async {
                    runs_b.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, IsoError>("B".to_owned())
                })
                .await;
            match served {
                Ok(served) if amount == 500 => {
                    assert_eq!((served.value.as_str(), served.replayed), ("B", false), "B runs its own operation");
                    assert!(!refs_a.contains(&served.reference.to_string()));
                    refs_b.push(served.reference.to_string());
                }
                // The same key with other arguments conflicts with B's *own* operation.
                Err(IsoError::Rejected(code)) if amount == 999 => assert_eq!(code, "conflict"),
                other => panic!("B, order {i}, amount {amount}: {other:?}"),
            }
        }
    }
    assert_eq!(runs_b.load(Ordering::SeqCst), 3);

    // B asks about A's refs and about random ones: nothing, ever.
    let guesses = scale(1_000, 10_000);
    let mut seen = 0;
    for reference in refs_a.iter().cloned().chain((0..guesses).map(|_| random_ref())) {
        if idem.status(&b, &reference).await.unwrap().is_some() {
            seen += 1;
        }
    }
    // B tries to settle A's operations, by their exact addresses: "not found", exactly as for an
    // operation that does not exist.
    let mut settled = 0;
    for reference in &refs_a {
        let address = idem.status(&a, reference).await.unwrap().expect("A's own").address().to_string();
        for resolution in [Resolution::NothingHappened, Resolution::Completed(br#"{"ok":"forged"}"#.to_vec())] {
            match idem.admin().resolve(b.tenant(), &address, resolution).await {
                Err(StatusError::Ledger(LedgerError::NotFound)) => {}
                other => {
                    settled += 1;
                    eprintln!("B resolving A's {reference}: {other:?}");
                }
            }
        }
    }
    let nonexistent = format!("{}@1900000000000", random_ref());
    let not_found_for_nonexistent = idem.admin().resolve(b.tenant(), &nonexistent, Resolution::NothingHappened).await;
    assert_eq!(not_found_for_nonexistent, Err(StatusError::Ledger(LedgerError::NotFound)));
    // Positive controls: B sees its own; A does not see B's.
    for reference in &refs_b {
        assert!(idem.status(&b, reference).await.unwrap().is_some(), "B sees its own {reference}");
        assert!(idem.status(&a, reference).await.unwrap().is_none(), "A does not see B's {reference}");
    }
    // A's records are untouched, and A's in-flight call finishes as A's.
    for (reference, state) in refs_a.iter().zip(expected_a) {
        assert_eq!(idem.status(&a, reference).await.unwrap().map(|s| s.state), Some(state));
    }
    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap().value, "A:running");
    let replay = idem.call(&CHARGE, Some(&a), &args(0), || async { Ok::<_, IsoError>("again".to_owned()) }).await;
    assert_eq!((replay.as_ref().unwrap().value.clone(), replay.unwrap().replayed), (done.value.clone(), true));
    assert_eq!(runs_a.load(Ordering::SeqCst), 2);

    support::print_table(
        &format!("isolation, {backend}"),
        &[
            "backend",
            "B status probes (A's refs + random)",
            "answers other than None",
            "B resolve attempts on A's refs",
            "answers other than NotFound",
            "B's same calls that ran as B's own",
        ],
        &[vec![
            backend.to_owned(),
            (refs_a.len() + guesses).to_string(),
            seen.to_string(),
            (refs_a.len() * 2).to_string(),
            settled.to_string(),
            format!("{}/3", runs_b.load(Ordering::SeqCst)),
        ]],
    );
    assert_eq!(seen, 0, "B learned of an operation that is not its own");
    assert_eq!(settled, 0, "B's resolve on A's refs must be NotFound");
}
