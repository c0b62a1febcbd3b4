//! The orchestration, end to end on the in-memory ledger, counting executions on the far side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, StatusReport, Token,
};
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, Key, ManualClock, MemoryLedger, Recipe, Reconciled, Ref, Rejection,
    StalePolicy, State, TenantTag, current_operation, with_caller,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ToolError {
    /// Validation failed before anything was sent.
    Invalid(String),
    /// The processor declined: final.
    Declined,
    /// The processor timed out: unknown.
    Timeout,
    /// idem answered instead of running the handler.
    Rejected { code: String, message: String },
}

impl IdempotentError for ToolError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Invalid(_) | Self::Rejected { .. } => ErrorClass::NothingHappened,
            Self::Declined => ErrorClass::Final,
            Self::Timeout => ErrorClass::Unknown,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

impl ToolError {
    fn code(&self) -> &str {
        match self {
            Self::Rejected { code, .. } => code,
            _ => "handler",
        }
    }
}

static CHARGE: Recipe = Recipe::new("charge_card", &["card", "amount_cents"]).window(Duration::from_secs(900));

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn charge(amount: u64, note: &str) -> Value {
    json!({ "card": "tok_visa", "amount_cents": amount, "note": note })
}

/// A fake processor on the far side of the boundary: it counts charges.
#[derive(Default)]
struct Processor {
    charges: AtomicUsize,
}

impl Processor {
    async fn charge(&self, amount: u64) -> Result<String, ToolError> {
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("receipt-{n}-{amount}"))
    }
    fn count(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn sequential_repeat_runs_once_and_replays_the_stored_result() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    let first = idem.call(&CHARGE, Some(&alice()), &charge(500, "x"), || processor.charge(500)).await.unwrap();
    let second = idem.call(&CHARGE, Some(&alice()), &charge(500, "x"), || processor.charge(500)).await.unwrap();
    assert_eq!(processor.count(), 1);
    assert_eq!((first.replayed, second.replayed), (false, true));
    assert_eq!(second.value, first.value);
    assert_eq!(second.reference, first.reference);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_calls_run_once_and_the_rest_are_told_in_flight() {
    let idem = Idem::new(MemoryLedger::new());
    let processor = Arc::new(Processor::default());
    let release = Arc::new(tokio::sync::Notify::new());
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..50 {
        let (idem, processor, release, barrier, answers) =
            (idem.clone(), Arc::clone(&processor), Arc::clone(&release), Arc::clone(&barrier), answers.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let result = idem
                .call(&CHARGE, Some(&alice()), &charge(700, "x"), || async {
                    // Hold the claim until every other caller has been answered.
                    release.notified().await;
                    processor.charge(700).await
                })
                .await;
            answers.send(result).unwrap();
        });
    }
    // 49 answers arrive while the winner still holds the claim: none of them waited for it.
    for _ in 0..49 {
        let error = answered.recv().await.unwrap().expect_err("a repeat while in flight must not run");
        let ToolError::Rejected { code, message } = error else { panic!("{error:?}") };
        assert_eq!(code, "in_flight");
        assert!(message.contains("Do not submit it again") && message.contains("idem_status"), "{message}");
    }
    assert_eq!(processor.count(), 0, "the winner has not run its effect yet");
    release.notify_one();
    let served = answered.recv().await.unwrap().expect("the winner completes");
    assert!(!served.replayed);
    assert_eq!(processor.count(), 1, "exactly one execution");
}

#[tokio::test]
async fn changed_non_key_argument_is_a_conflict_naming_it() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    idem.call(&CHARGE, Some(&alice()), &charge(500, "first"), || processor.charge(500)).await.unwrap();
    let error = idem.call(&CHARGE, Some(&alice()), &charge(500, "second"), || processor.charge(500)).await.unwrap_err();
    let ToolError::Rejected { code, message } = error else { panic!("{error:?}") };
    assert_eq!(code, "conflict");
    assert!(message.contains("differing: note"), "{message}");
    assert!(!message.contains("first") && !message.contains("second"), "values never leak: {message}");
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn ignored_argument_changes_are_not_conflicts() {
    static NOTED: Recipe = Recipe::new("charge_card", &["card", "amount_cents"]).ignore(&["note"]);
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    idem.call(&NOTED, Some(&alice()), &charge(500, "first"), || processor.charge(500)).await.unwrap();
    let again = idem.call(&NOTED, Some(&alice()), &charge(500, "second"), || processor.charge(500)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn changed_key_argument_is_a_second_operation() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    let a = idem.call(&CHARGE, Some(&alice()), &charge(500, "x"), || processor.charge(500)).await.unwrap();
    let b = idem.call(&CHARGE, Some(&alice()), &charge(501, "x"), || processor.charge(501)).await.unwrap();
    assert_eq!(processor.count(), 2);
    assert_ne!(a.reference, b.reference);
}

#[tokio::test]
async fn another_caller_is_another_operation() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    idem.call(&CHARGE, Some(&alice()), &charge(500, "x"), || processor.charge(500)).await.unwrap();
    let bob = Caller::new("acme", "bob");
    let other = idem.call(&CHARGE, Some(&bob), &charge(500, "x"), || processor.charge(500)).await.unwrap();
    assert!(!other.replayed);
    assert_eq!(processor.count(), 2);
}

#[tokio::test]
async fn the_handler_reads_its_key_to_forward_it() {
    let idem = Idem::new(MemoryLedger::new());
    let served = idem
        .call(&CHARGE, Some(&alice()), &charge(500, "x"), || async {
            let operation = current_operation().expect("inside an idempotent handler");
            assert_eq!(operation.tool(), "charge_card");
            Ok::<_, ToolError>(operation.key().to_string())
        })
        .await
        .unwrap();
    assert_eq!(served.value.len(), 64);
    assert!(served.value.starts_with(&served.reference.to_string()));
    assert!(current_operation().is_none(), "outside a handler there is no operation");
}

#[tokio::test]
async fn nothing_happened_runs_again_final_replays_unknown_stops() {
    let idem = Idem::new(MemoryLedger::new());
    let runs = AtomicUsize::new(0);
    let failing = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(ToolError::Invalid("card expired".into()))
    };
    assert!(idem.call(&CHARGE, Some(&alice()), &charge(1, "x"), failing).await.is_err());
    assert!(idem.call(&CHARGE, Some(&alice()), &charge(1, "x"), failing).await.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "nothing happened: the repeat runs again");

    let declined = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(ToolError::Declined)
    };
    assert_eq!(idem.call(&CHARGE, Some(&alice()), &charge(2, "x"), declined).await, Err(ToolError::Declined));
    assert_eq!(idem.call(&CHARGE, Some(&alice()), &charge(2, "x"), declined).await, Err(ToolError::Declined));
    assert_eq!(runs.load(Ordering::SeqCst), 3, "a final error is replayed, not re-run");

    let timeout = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(ToolError::Timeout)
    };
    assert_eq!(idem.call(&CHARGE, Some(&alice()), &charge(3, "x"), timeout).await, Err(ToolError::Timeout));
    let error = idem.call(&CHARGE, Some(&alice()), &charge(3, "x"), timeout).await.unwrap_err();
    assert_eq!(error.code(), "outcome_unknown");
    assert_eq!(runs.load(Ordering::SeqCst), 4, "an unknown outcome is never re-run");
}

#[tokio::test]
async fn a_call_without_a_caller_fails_closed() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    let error = idem.call(&CHARGE, None, &charge(500, "x"), || processor.charge(500)).await.unwrap_err();
    assert_eq!(error.code(), "no_caller");
    assert_eq!(processor.count(), 0);
    // A caller in scope, or a configured local identity, is used when none is passed.
    let args = charge(500, "x");
    let scoped = with_caller(alice(), idem.call(&CHARGE, None, &args, || processor.charge(500)));
    assert!(!scoped.await.unwrap().replayed);
    let local = idem.clone().with_local_caller(alice());
    assert!(local.call(&CHARGE, None, &charge(500, "x"), || processor.charge(500)).await.unwrap().replayed);
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn unrepresentable_arguments_are_refused_before_anything_runs() {
    let (idem, processor) = (Idem::new(MemoryLedger::new()), Processor::default());
    // (u64::MAX used to be refused here; integers in the 64-bit range are now kept exactly.)
    let mut too_deep = json!(1);
    for _ in 0..=idem_runtime::canonical::MAX_DEPTH {
        too_deep = json!([too_deep]);
    }
    let args = json!({ "card": "c", "amount_cents": 1, "items": too_deep });
    let error = idem.call(&CHARGE, Some(&alice()), &args, || processor.charge(1)).await.unwrap_err();
    assert_eq!(error.code(), "invalid_arguments");
    let error = idem.call(&CHARGE, Some(&alice()), &json!([1, 2]), || processor.charge(1)).await.unwrap_err();
    assert_eq!(error.code(), "invalid_arguments");
    assert_eq!(processor.count(), 0);
}

#[tokio::test]
async fn window_edge_through_the_orchestration() {
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::new(MemoryLedger::new()).with_clock(clock.clone());
    let processor = Processor::default();
    idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), || processor.charge(9)).await.unwrap();
    clock.advance(Duration::from_secs(900) - Duration::from_millis(1));
    assert!(idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), || processor.charge(9)).await.unwrap().replayed);
    clock.advance(Duration::from_millis(2));
    assert!(!idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), || processor.charge(9)).await.unwrap().replayed);
    assert_eq!(processor.count(), 2);
}

/// Claims a key as a process that then dies: no completion ever arrives.
async fn crash_after_claim(idem: &Idem, recipe: &Recipe) {
    let never = || async {
        std::future::pending::<()>().await;
        Ok::<String, ToolError>(String::new())
    };
    let (caller, args) = (alice(), charge(42, "x"));
    let call = idem.call(recipe, Some(&caller), &args, never);
    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err(), "the handler never finishes");
}

#[tokio::test]
async fn stale_lease_policies() {
    for (policy, expected_runs, expected) in
        [(StalePolicy::Takeover, 1, "ran"), (StalePolicy::Hold, 0, "outcome_unknown")]
    {
        let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(policy);
        let clock = ManualClock::new(1_700_000_000_000);
        let idem = Idem::new(MemoryLedger::new()).with_clock(clock.clone()).with_lease(Duration::from_secs(30));
        crash_after_claim(&idem, &recipe).await;
        let runs = AtomicUsize::new(0);
        let retry = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            let operation = current_operation().unwrap();
            assert!(operation.is_takeover(), "the handler knows the downstream may have seen its key");
            Ok::<_, ToolError>("ran".to_owned())
        };
        let early = idem.call(&recipe, Some(&alice()), &charge(42, "x"), retry).await.unwrap_err();
        assert_eq!(early.code(), "in_flight", "{policy:?}: the lease is still live");
        clock.advance(Duration::from_secs(31));
        let answer = idem.call(&recipe, Some(&alice()), &charge(42, "x"), retry).await;
        let got = match &answer {
            Ok(served) => served.value.as_str(),
            Err(error) => error.code(),
        };
        assert_eq!((got, runs.load(Ordering::SeqCst)), (expected, expected_runs), "{policy:?}");
    }
}

#[tokio::test]
async fn reconcile_asks_the_downstream_before_running_again() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Reconcile);
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::new(MemoryLedger::new()).with_clock(clock.clone());
    crash_after_claim(&idem, &recipe).await;
    clock.advance(Duration::from_secs(31));
    let runs = AtomicUsize::new(0);
    let handler = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ToolError>("ran again".to_owned())
    };
    let found = |operation: idem_runtime::Operation| async move {
        assert_eq!(operation.tool(), "charge_card");
        Reconciled::Happened(Ok::<_, ToolError>("found downstream".to_owned()))
    };
    let served = idem.call_reconciling(&recipe, Some(&alice()), &charge(42, "x"), found, handler).await.unwrap();
    assert_eq!(served.value, "found downstream");
    let again = idem.call(&recipe, Some(&alice()), &charge(42, "x"), handler).await.unwrap();
    assert_eq!((again.value.as_str(), again.replayed), ("found downstream", true));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "reconcile found the effect: nothing ran twice");
}

#[tokio::test]
async fn a_running_handler_keeps_its_lease() {
    let recipe = Recipe::new("slow", &["card"]).stale(StalePolicy::Takeover);
    let idem = Idem::new(MemoryLedger::new()).with_lease(Duration::from_millis(300));
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            idem.call(&recipe, Some(&alice()), &json!({ "card": "c" }), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                Ok::<_, ToolError>(())
            })
            .await
        })
    };
    // Well past the original lease, the renewed claim still answers "in flight".
    tokio::time::sleep(Duration::from_millis(700)).await;
    let repeat = idem
        .call(&recipe, Some(&alice()), &json!({ "card": "c" }), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(())
        })
        .await
        .unwrap_err();
    assert_eq!(repeat.code(), "in_flight");
    slow.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_oversized_result_is_returned_once_and_recorded_as_unknown() {
    let idem = Idem::new(MemoryLedger::new()).with_max_result_bytes(64);
    let big = "x".repeat(1000);
    let (caller, args) = (alice(), charge(1, "x"));
    let served = idem.call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ToolError>(big.clone()) }).await;
    assert_eq!(served.unwrap().value.len(), 1000, "this caller still gets its result");
    let repeat = idem.call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ToolError>(big.clone()) }).await;
    assert_eq!(repeat.unwrap_err().code(), "outcome_unknown");
}

#[tokio::test]
async fn status_and_resolve_for_the_callers_tenant() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]);
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::new(MemoryLedger::new()).with_clock(clock.clone());
    let done = idem.call(&recipe, Some(&alice()), &charge(1, "x"), || async { Ok::<_, ToolError>(5) }).await.unwrap();
    let status = idem.status(&alice(), &done.reference.to_string()).await.unwrap().unwrap();
    assert_eq!((status.state, status.result.as_deref()), (State::Completed, Some(&b"{\"ok\":5}"[..])));
    let mallory = Caller::new("evil", "mallory");
    assert_eq!(idem.status(&mallory, &done.reference.to_string()).await.unwrap(), None);
    assert!(idem.status(&alice(), "not-a-ref").await.unwrap_err().to_string().contains("hex digits"));

    crash_after_claim(&idem, &recipe).await;
    clock.advance(Duration::from_secs(31));
    let held = idem.call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(1) }).await;
    let reference = held.unwrap_err();
    let ToolError::Rejected { message, .. } = &reference else { panic!() };
    let reference = message.split("ref ").nth(1).unwrap()[..16].to_owned();
    idem.resolve(&alice(), &reference, Resolution::NothingHappened).await.unwrap();
    let after = idem.call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(7) }).await;
    assert_eq!(after.unwrap().value, 7, "resolved as not happened: the repeat runs");
}

/// A ledger that cannot be reached.
struct Down;

impl Ledger for Down {
    fn claim<'a>(&'a self, _: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
    fn renew<'a>(&'a self, _: &'a Key, _: Token, _: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
    fn complete<'a>(&'a self, _: &'a Key, _: Token, _: Outcome) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
    fn status<'a>(&'a self, _: TenantTag, _: Ref, _: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
    fn resolve<'a>(&'a self, _: TenantTag, _: Ref, _: Resolution, _: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
    fn sweep(&self, _: u64, _: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(async { Err(LedgerError::Unavailable { detail: "connection refused".into() }) })
    }
}

#[tokio::test]
async fn an_unreachable_ledger_never_lets_the_handler_run() {
    let (idem, processor) = (Idem::new(Down), Processor::default());
    let error = idem.call(&CHARGE, Some(&alice()), &charge(500, "x"), || processor.charge(500)).await.unwrap_err();
    let ToolError::Rejected { code, message } = error else { panic!() };
    assert_eq!(code, "ledger_unavailable");
    assert!(message.contains("nothing was executed") && message.contains("safe to retry"), "{message}");
    assert_eq!(processor.count(), 0);
}

#[tokio::test]
async fn a_panicking_handler_leaves_an_unknown_outcome_not_a_stuck_claim() {
    let idem = Idem::new(MemoryLedger::new());
    let panicking = idem.clone();
    let panicked = tokio::spawn(async move {
        let (caller, args) = (alice(), charge(77, "x"));
        let broken = || async {
            if args["amount_cents"] == 77 {
                panic!("the handler broke after its effect");
            }
            Ok::<_, ToolError>(String::new())
        };
        drop(panicking.call(&CHARGE, Some(&caller), &args, broken).await);
    });
    assert!(panicked.await.unwrap_err().is_panic(), "the panic continues to the caller");
    let (caller, args) = (alice(), charge(77, "x"));
    let repeat = idem.call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ToolError>(String::new()) }).await;
    assert_eq!(repeat.unwrap_err().code(), "outcome_unknown", "recorded at once, not left in flight");
}

/// A ledger whose first `lose` claims commit but whose answers are lost on the way back.
struct LostAnswer {
    inner: MemoryLedger,
    lose: AtomicUsize,
}

impl Ledger for LostAnswer {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let claim = self.inner.claim(request).await?;
            if self.lose.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(LedgerError::Unavailable { detail: "connection reset".into() });
            }
            Ok(claim)
        })
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.renew(key, token, until)
    }
    fn complete<'a>(&'a self, key: &'a Key, token: Token, outcome: Outcome) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.complete(key, token, outcome)
    }
    fn status<'a>(
        &'a self,
        t: TenantTag,
        r: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.inner.status(t, r, now)
    }
    fn resolve<'a>(&'a self, t: TenantTag, r: Ref, x: Resolution, now: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.resolve(t, r, x, now)
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        self.inner.sweep(now, limit)
    }
}

#[tokio::test]
async fn one_lost_claim_answer_is_recovered_by_sending_the_claim_again() {
    let idem = Idem::new(LostAnswer { inner: MemoryLedger::new(), lose: AtomicUsize::new(1) });
    let processor = Processor::default();
    let served = idem.call(&CHARGE, Some(&alice()), &charge(5, "x"), || processor.charge(5)).await.unwrap();
    assert!(!served.replayed, "the re-sent claim (same token) is recognised as the one that won");
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn a_lost_claim_answer_is_released_so_the_retry_runs() {
    let idem = Idem::new(LostAnswer { inner: MemoryLedger::new(), lose: AtomicUsize::new(2) });
    let processor = Processor::default();
    let error = idem.call(&CHARGE, Some(&alice()), &charge(5, "x"), || processor.charge(5)).await.unwrap_err();
    assert_eq!(error.code(), "ledger_unavailable");
    assert_eq!(processor.count(), 0, "nothing ran");
    // The claim had committed; it is released in the background, so a retry soon runs instead of
    // hearing "in flight" until the lease ends (or "outcome unknown" after it, under `hold`).
    let mut retried = None;
    for _ in 0..100 {
        match idem.call(&CHARGE, Some(&alice()), &charge(5, "x"), || processor.charge(5)).await {
            Ok(served) => {
                retried = Some(served);
                break;
            }
            Err(error) if error.code() == "in_flight" => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(error) => panic!("{error:?}"),
        }
    }
    assert!(!retried.expect("released within a second").replayed);
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn the_forwarded_key_names_the_operation_in_its_window() {
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::new(MemoryLedger::new()).with_clock(clock.clone());
    let forwarded = || async { Ok::<_, ToolError>(current_operation().unwrap().idempotency_key()) };
    let first = idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), forwarded).await.unwrap();
    assert_eq!(first.value.len(), 64);
    clock.advance(Duration::from_secs(901));
    let next_window = idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), forwarded).await.unwrap();
    assert!(!next_window.replayed);
    assert_eq!(next_window.reference, first.reference, "the same ledger key");
    assert_ne!(next_window.value, first.value, "a new operation forwards a new key downstream");

    // A takeover of a dead holder forwards the same key as the dead holder did.
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let seen = std::sync::Mutex::new(Vec::new());
    let remember_then_hang = || async {
        seen.lock().unwrap().push(current_operation().unwrap().idempotency_key());
        std::future::pending::<()>().await;
        Ok::<String, ToolError>(String::new())
    };
    let (caller, args) = (alice(), charge(10, "x"));
    let hung = idem.call(&recipe, Some(&caller), &args, remember_then_hang);
    assert!(tokio::time::timeout(Duration::from_millis(20), hung).await.is_err());
    clock.advance(Duration::from_secs(31));
    let taken = idem.call(&recipe, Some(&alice()), &charge(10, "x"), forwarded).await.unwrap();
    assert_eq!(seen.lock().unwrap().as_slice(), [taken.value], "the downstream can dedupe the takeover");
}
