//! The orchestration, end to end on the in-memory ledger, counting executions on the far side.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::ledger::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, StatusReport, Token,
};
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, Key, MemoryLedger, Recipe, Reconciled, Ref, Rejection, StalePolicy,
    clock::ManualClock, current_operation, ledger::State, run_as, scope::TenantTag,
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
            Ok::<_, ToolError>(operation.ledger_key().to_string())
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
    let scoped = run_as(alice(), idem.call(&CHARGE, None, &args, || processor.charge(500)));
    assert!(!scoped.await.unwrap().replayed);
    let local = Idem::builder(Arc::clone(idem.admin().ledger())).local_caller(alice()).build().unwrap();
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
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
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
        let idem =
            Idem::builder(MemoryLedger::new()).clock(clock.clone()).lease(Duration::from_secs(30)).build().unwrap();
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
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
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
    let idem = Idem::builder(MemoryLedger::new()).lease(Duration::from_millis(300)).build().unwrap();
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
    let idem = Idem::builder(MemoryLedger::new()).max_result_bytes(64).build().unwrap();
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
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
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
    let address = idem.admin().inspect("acme", &reference).await.unwrap().expect("the held operation").address();
    idem.admin().resolve(alice().tenant(), &address.to_string(), Resolution::NothingHappened).await.unwrap();
    let after = idem.call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(7) }).await;
    assert_eq!(after.unwrap().value, 7, "resolved as not happened: the repeat runs");
}

/// A ledger with faults injected on the way back: claims that commit but whose answer is lost,
/// a ledger that is down for every call, and a count of every call made to it.
#[derive(Default)]
struct Faulty {
    inner: Arc<MemoryLedger>,
    /// Claims that commit and then lose their answer (ambiguous, like a dropped connection).
    lose: AtomicUsize,
    /// Whether every call fails before it reaches the ledger.
    down: std::sync::atomic::AtomicBool,
    /// Whether every call is sent but its answer is lost (the statement never commits).
    silent: std::sync::atomic::AtomicBool,
    /// Every call made.
    calls: AtomicUsize,
}

impl Faulty {
    fn fault<T: Send + 'static>(&self) -> Option<BoxFuture<'static, Result<T, LedgerError>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Some(Box::pin(async { Err(LedgerError::unavailable("connection refused")) }));
        }
        if self.silent.load(Ordering::SeqCst) {
            return Some(Box::pin(async { Err(LedgerError::ambiguous("connection reset")) }));
        }
        None
    }
}

impl Ledger for Faulty {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        if let Some(fault) = self.fault() {
            return fault;
        }
        Box::pin(async move {
            let claim = self.inner.claim(request).await?;
            if self.lose.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(LedgerError::ambiguous("connection reset"));
            }
            Ok(claim)
        })
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.renew(key, token, until))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.complete(key, token, outcome, keep_until))
    }
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.release(key, token))
    }
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.lookup(key, now))
    }
    fn status<'a>(
        &'a self,
        t: TenantTag,
        s: idem_runtime::scope::SubjectTag,
        r: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.status(t, s, r, now))
    }
    fn resolve<'a>(
        &'a self,
        t: TenantTag,
        a: idem_runtime::key::Address,
        x: Resolution,
        now: u64,
        keep: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.resolve(t, a, x, now, keep))
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.sweep(now, limit))
    }
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.now())
    }
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.secret_check(version, check))
    }
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.secret_versions(live))
    }
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.inspect(tenant, reference, window_end, now))
    }
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<idem_runtime::ledger::LedgerStats, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.stats(now))
    }
    fn pending<'a>(
        &'a self,
        query: &'a idem_runtime::ledger::PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<idem_runtime::ledger::PendingRecord>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.pending(query, now))
    }
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        self.fault().unwrap_or_else(|| self.inner.tool_owners(namespace, tool, owner, now, since))
    }
    fn default_secret(&self) -> Result<idem_runtime::secret::Secret, idem_runtime::secret::SecretError> {
        self.inner.default_secret()
    }
}

fn down() -> Faulty {
    let faulty = Faulty::default();
    faulty.down.store(true, Ordering::SeqCst);
    faulty
}

#[tokio::test]
async fn an_unreachable_ledger_never_lets_the_handler_run() {
    let (idem, processor) = (Idem::new(down()), Processor::default());
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

#[tokio::test]
async fn one_lost_claim_answer_is_recovered_by_sending_the_claim_again() {
    let faulty = Faulty::default();
    faulty.lose.store(1, Ordering::SeqCst);
    let idem = Idem::new(faulty);
    let processor = Processor::default();
    let served = idem.call(&CHARGE, Some(&alice()), &charge(5, "x"), || processor.charge(5)).await.unwrap();
    assert!(!served.replayed, "the re-sent claim (same token) is recognised as the one that won");
    assert_eq!(processor.count(), 1);
}

#[tokio::test]
async fn a_lost_claim_answer_is_released_so_the_retry_runs() {
    let faulty = Faulty::default();
    faulty.lose.store(2, Ordering::SeqCst);
    let idem = Idem::new(faulty);
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
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let forwarded = || async { Ok::<_, ToolError>(current_operation().unwrap().idempotency_key()) };
    let first = idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), forwarded).await.unwrap();
    assert_eq!(first.value.len(), 64);
    clock.advance(Duration::from_secs(901));
    let next_window = idem.call(&CHARGE, Some(&alice()), &charge(9, "x"), forwarded).await.unwrap();
    assert!(!next_window.replayed);
    assert_eq!(next_window.reference, first.reference, "the same ledger key");
    assert_ne!(next_window.value, first.value, "a new operation forwards a new key downstream");

    // A takeover of a dead holder forwards the same key as the dead holder did.
    let recipe = Recipe::new("charge_card_takeover", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
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

// ---------------------------------------------------------------------------------------------
// Issue 10: the paths to a duplicate effect or a lost result. Each downstream here dedupes by
// (or records) what users forward: `Operation::idempotency_key()`.
// ---------------------------------------------------------------------------------------------

/// A downstream that dedupes by the forwarded idempotency key and counts the effects it applied.
#[derive(Default)]
struct Dedupe {
    applied: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl Dedupe {
    fn charge(&self) -> String {
        let key = current_operation().expect("inside the handler").idempotency_key();
        let mut applied = self.applied.lock().unwrap();
        let n = applied.len() + 1;
        applied.entry(key).or_insert_with(|| format!("receipt-{n}")).clone()
    }
    fn effects(&self) -> usize {
        self.applied.lock().unwrap().len()
    }
    fn knows(&self, operation: &idem_runtime::Operation) -> Option<String> {
        self.applied.lock().unwrap().get(&operation.idempotency_key()).cloned()
    }
}

/// A holder under `recipe` that applies its effect downstream and then dies (its future dropped
/// before it records anything).
async fn die_after_effect(idem: &Idem, recipe: &Recipe, downstream: &Dedupe) {
    let (caller, args) = (alice(), charge(42, "x"));
    let call = idem.call(recipe, Some(&caller), &args, || async {
        downstream.charge();
        std::future::pending::<()>().await;
        Ok::<String, ToolError>(String::new())
    });
    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err(), "the holder hangs, then dies");
    assert_eq!(downstream.effects(), 1);
}

/// Issue 10.1: a takeover claim whose answer is lost is sent again; the re-send must be told it
/// won a takeover, so the handler forwards the dead holder's key (the downstream dedupes it) and,
/// under `reconcile`, the downstream is asked first.
#[tokio::test]
async fn a_resent_takeover_claim_forwards_the_dead_holders_key() {
    for policy in [StalePolicy::Takeover, StalePolicy::Reconcile] {
        let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(policy);
        let clock = ManualClock::new(1_700_000_000_000);
        let faulty = Arc::new(Faulty::default());
        let idem = Idem::builder(faulty.clone()).clock(clock.clone()).build().unwrap();
        let downstream = Dedupe::default();
        die_after_effect(&idem, &recipe, &downstream).await;
        clock.advance(Duration::from_secs(31));
        faulty.lose.store(1, Ordering::SeqCst);
        let asked = AtomicUsize::new(0);
        let reconcile = |operation: idem_runtime::Operation| {
            asked.fetch_add(1, Ordering::SeqCst);
            let found = downstream.knows(&operation);
            async move {
                found.map_or(Reconciled::NothingHappened, |receipt| {
                    Reconciled::<String, ToolError>::Happened(Ok(receipt))
                })
            }
        };
        let (caller, args) = (alice(), charge(42, "x"));
        let served = idem
            .call_reconciling(&recipe, Some(&caller), &args, reconcile, || async { Ok(downstream.charge()) })
            .await
            .unwrap();
        assert_eq!(served.value, "receipt-1", "{policy:?}: the dead holder's effect, not a second one");
        assert_eq!(downstream.effects(), 1, "{policy:?}");
        let asked = asked.load(Ordering::SeqCst);
        assert_eq!(asked, usize::from(policy == StalePolicy::Reconcile), "{policy:?}: reconcile asked first");
    }
}

/// Issue 10.2: a lost takeover claim is released back to in-progress under a lapsed lease, not to
/// failed: the operation may have happened, so the next repeat still goes through the tool's
/// policy and forwards the dead holder's key.
#[tokio::test]
async fn a_lost_takeover_claim_is_released_back_to_its_policy() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let clock = ManualClock::new(1_700_000_000_000);
    let faulty = Arc::new(Faulty::default());
    let idem = Idem::builder(faulty.clone()).clock(clock.clone()).lease(Duration::from_secs(30)).build().unwrap();
    let downstream = Dedupe::default();
    die_after_effect(&idem, &recipe, &downstream).await;
    clock.advance(Duration::from_secs(31));
    faulty.lose.store(2, Ordering::SeqCst);
    let (caller, args) = (alice(), charge(42, "x"));
    let lost = idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>(downstream.charge()) }).await;
    assert_eq!(lost.unwrap_err().code(), "ledger_unavailable");
    let reference = idem.admin().key_of(&recipe, &alice(), &args).unwrap().reference().to_string();
    let mut status = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = idem.status(&alice(), &reference).await.unwrap();
        if status.as_ref().is_some_and(|s| s.lease_expired) {
            break;
        }
    }
    let status = status.expect("the record");
    assert_eq!((status.state, status.lease_expired), (State::InProgress, true), "maybe happened stays maybe");
    let served =
        idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>(downstream.charge()) }).await.unwrap();
    assert_eq!((served.value.as_str(), downstream.effects()), ("receipt-1", 1), "deduped downstream: one effect");
}

/// Issue 10.2: background work after lost claims is bounded, and none is spent on a claim that
/// was never sent.
#[tokio::test]
async fn background_work_after_lost_claims_is_bounded() {
    for (fault, name) in [(0, "refused before sending"), (1, "sent, answer lost")] {
        let faulty = Arc::new(Faulty::default());
        if fault == 0 {
            faulty.down.store(true, Ordering::SeqCst);
        } else {
            faulty.silent.store(true, Ordering::SeqCst);
        }
        let idem = Idem::builder(faulty.clone()).lease(Duration::from_millis(600)).build().unwrap();
        for n in 0..100 {
            let args = charge(n, "x");
            let error = idem.call(&CHARGE, Some(&alice()), &args, || async { Ok::<_, ToolError>(1) }).await;
            assert_eq!(error.unwrap_err().code(), "ledger_unavailable");
        }
        let after_calls = faulty.calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let total = faulty.calls.load(Ordering::SeqCst);
        eprintln!("100 failed claims ({name}): {after_calls} ledger calls in the calls, {total} in all");
        if fault == 0 {
            assert_eq!(total, after_calls, "nothing was sent, so nothing is released");
        } else {
            // At most 32 releases at once, each at most 8 tries.
            assert!(total - after_calls <= 32 * 8, "{} background calls", total - after_calls);
        }
    }
}

/// Issue 10.3: under `hold`, a holder that is alive but late (its lease lapsed and a repeat
/// flipped the record to unknown) still records its result, and every repeat then gets it.
#[tokio::test]
async fn hold_records_a_late_holders_result() {
    let recipe = Recipe::new("send_email", &["card", "amount_cents"]).stale(StalePolicy::Hold);
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let holder = {
        let (idem, release) = (idem.clone(), Arc::clone(&release));
        tokio::spawn(async move {
            let (caller, args) = (alice(), charge(42, "x"));
            idem.call(&recipe, Some(&caller), &args, || async move {
                release.notified().await;
                Ok::<_, ToolError>("sent once".to_owned())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    clock.advance(Duration::from_secs(31));
    let (caller, args) = (alice(), charge(42, "x"));
    let flipped = idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>(String::new()) });
    assert_eq!(flipped.await.unwrap_err().code(), "outcome_unknown", "the lapsed lease under hold");
    release.notify_one();
    let served = holder.await.unwrap().unwrap();
    assert_eq!((served.value.as_str(), served.replayed), ("sent once", false));
    let again = idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>(String::new()) });
    let again = again.await.unwrap();
    assert_eq!((again.value.as_str(), again.replayed), ("sent once", true), "the late result, not unknown");
}

/// Issue 10.4: a replica whose clock runs 25 s ahead of the ledger's does not take a live
/// holder's operation over: it measures its skew and states times on the ledger's clock.
#[tokio::test]
async fn a_replica_whose_clock_runs_ahead_does_not_take_over_a_live_holder() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let ledger_clock = ManualClock::new(1_700_000_000_000);
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::with_clock(ledger_clock.clone()));
    let holder = Idem::builder(Arc::clone(&ledger)).clock(ledger_clock.clone()).build().unwrap();
    let ahead = Idem::builder(Arc::clone(&ledger)).clock(ManualClock::new(1_700_000_000_000 + 25_000)).build().unwrap();
    let downstream = Dedupe::default();
    let release = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (holder, release) = (holder.clone(), Arc::clone(&release));
        tokio::spawn(async move {
            holder
                .call(&recipe, Some(&alice()), &charge(42, "x"), || async move {
                    release.notified().await;
                    Ok::<_, ToolError>("first".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 6 s later by the ledger's clock (31 s by the fast replica's): the holder's lease is live.
    ledger_clock.advance(Duration::from_secs(6));
    let repeat = ahead
        .call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(downstream.charge()) })
        .await;
    assert_eq!(repeat.unwrap_err().code(), "in_flight", "a live holder is not taken over");
    assert_eq!(downstream.effects(), 0);
    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap().value, "first");
}

/// Issue 10.5: the lease is renewed by a task of its own, so a handler that blocks its thread
/// keeps its claim on a multi-threaded runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_handler_keeps_its_lease() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let idem = Idem::builder(MemoryLedger::new()).lease(Duration::from_millis(600)).build().unwrap();
    // The test's own task can be starved behind the blocked worker on a loaded machine, and then
    // asks only after the handler finished: that run shows nothing, so set it up again.
    for amount in 0..5 {
        let downstream = Arc::new(Dedupe::default());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let blocking = {
            let (idem, downstream, done) = (idem.clone(), Arc::clone(&downstream), Arc::clone(&done));
            tokio::spawn(async move {
                idem.call(&recipe, Some(&alice()), &charge(amount, "x"), || async {
                    tokio::task::yield_now().await;
                    let receipt = downstream.charge();
                    std::thread::sleep(Duration::from_millis(2400));
                    done.store(true, Ordering::SeqCst);
                    Ok::<_, ToolError>(receipt)
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1400)).await;
        if done.load(Ordering::SeqCst) {
            blocking.await.unwrap().unwrap();
            continue;
        }
        let repeat = idem
            .call(&recipe, Some(&alice()), &charge(amount, "x"), || async { Ok::<_, ToolError>(downstream.charge()) })
            .await;
        assert_eq!(repeat.unwrap_err().code(), "in_flight", "the blocked holder's lease was renewed beside it");
        assert_eq!(blocking.await.unwrap().unwrap().value, "receipt-1");
        assert_eq!(downstream.effects(), 1);
        return;
    }
    panic!("the test's task never got to ask while the handler was blocked");
}

/// Issue 10.5: a holder whose claim was taken over learns it from its next renewal, through
/// `Operation::lease_lost`, before its effect.
#[tokio::test]
async fn a_superseded_holder_learns_it_before_its_effect() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let clock = ManualClock::new(1_700_000_000_000);
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let slow =
        Idem::builder(Arc::clone(&ledger)).clock(clock.clone()).lease(Duration::from_millis(90)).build().unwrap();
    let other =
        Idem::builder(Arc::clone(&ledger)).clock(clock.clone()).lease(Duration::from_millis(90)).build().unwrap();
    let downstream = Arc::new(Dedupe::default());
    let paused = Arc::new(tokio::sync::Notify::new());
    let holder = {
        let (slow, downstream, paused) = (slow.clone(), Arc::clone(&downstream), Arc::clone(&paused));
        tokio::spawn(async move {
            slow.call(&recipe, Some(&alice()), &charge(42, "x"), || async move {
                assert!(!current_operation().unwrap().lease_lost());
                paused.notified().await;
                for _ in 0..100 {
                    if current_operation().unwrap().lease_lost() {
                        return Err(ToolError::Invalid("lease lost: nothing done".into()));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(downstream.charge())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    clock.advance(Duration::from_secs(1));
    let taken = other
        .call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(downstream.charge()) })
        .await;
    assert_eq!(taken.unwrap().value, "receipt-1");
    paused.notify_one();
    let late = holder.await.unwrap().unwrap();
    assert_eq!((late.value.as_str(), late.replayed), ("receipt-1", true), "the new holder's result");
    assert_eq!(downstream.effects(), 1, "the superseded holder did not act");
}

/// Issue 10.5: a ledger timeout that is not well under the lease is refused; an unset one is
/// lowered with a short lease. Settings are refused, never silently raised, and checked together
/// by `build`: the order they were given in changes nothing (issue 27: `with_ledger_timeout(20s)`
/// then `with_lease(60s)` used to panic, the reverse did not).
#[test]
fn settings_are_checked_together_when_the_handle_is_built() {
    let refused = |builder: idem_runtime::settings::Builder| builder.build().expect_err("refused").to_string();
    let message = refused(
        Idem::builder(MemoryLedger::new()).lease(Duration::from_secs(2)).ledger_timeout(Duration::from_secs(5)),
    );
    assert!(message.starts_with("the ledger timeout (5s) must be under half the lease (2s)"), "{message}");
    assert!(message.ends_with("give a shorter `ledger_timeout` or a longer `lease`"), "{message}");
    let message = refused(Idem::builder(MemoryLedger::new()).lease(Duration::from_millis(2)));
    assert!(message.starts_with("the lease (2ms) must be at least 3ms"), "{message}");
    let message = refused(Idem::builder(MemoryLedger::new()).ledger_timeout(Duration::ZERO));
    assert!(message.starts_with("the ledger timeout (0ns) must be at least 1ms"), "{message}");
    let message = refused(Idem::builder(MemoryLedger::new()).retention(Duration::ZERO));
    assert!(message.starts_with("the retention must be more than zero"), "{message}");
    // Either order builds the same handle.
    let timeout_first = Idem::builder(MemoryLedger::new())
        .ledger_timeout(Duration::from_secs(20))
        .lease(Duration::from_secs(60))
        .build();
    let lease_first = Idem::builder(MemoryLedger::new())
        .lease(Duration::from_secs(60))
        .ledger_timeout(Duration::from_secs(20))
        .build();
    assert_eq!(format!("{:?}", timeout_first.unwrap()), format!("{:?}", lease_first.unwrap()));
    // An unset timeout is lowered to half a short lease.
    let short = Idem::builder(MemoryLedger::new()).lease(Duration::from_secs(2)).build().unwrap();
    assert!(format!("{short:?}").contains("ledger_timeout: 1s"), "{short:?}");
}

/// Issue 10.6: a handler slower than its window still gets its result replayed to the repeats
/// that come right after it settles.
#[tokio::test]
async fn a_result_that_settles_after_its_window_is_replayed() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).window(Duration::from_secs(60));
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let processor = Processor::default();
    let (caller, args) = (alice(), charge(42, "x"));
    let slow = idem.call(&recipe, Some(&caller), &args, || async {
        clock.advance(Duration::from_secs(70));
        processor.charge(42).await
    });
    assert_eq!(slow.await.unwrap().value, "receipt-1-42");
    clock.advance(Duration::from_secs(5));
    let repeat = idem.call(&recipe, Some(&alice()), &charge(42, "x"), || processor.charge(42)).await.unwrap();
    assert_eq!((repeat.value.as_str(), repeat.replayed), ("receipt-1-42", true));
    assert_eq!(processor.count(), 1);
}

/// Issue 10.7: an unknown operation locks its key only for its window; then a new operation runs
/// (forwarding a new key) and the old one is still there for the operator.
#[tokio::test]
async fn an_unknown_operation_releases_its_key_when_its_window_ends() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).window(Duration::from_secs(60));
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let keys = std::sync::Mutex::new(Vec::new());
    let timeout = || async {
        keys.lock().unwrap().push(current_operation().unwrap().idempotency_key());
        Err::<String, _>(ToolError::Timeout)
    };
    let first = idem.call(&recipe, Some(&alice()), &charge(42, "x"), timeout).await.unwrap_err();
    assert_eq!(first, ToolError::Timeout);
    let blocked = idem.call(&recipe, Some(&alice()), &charge(42, "x"), timeout).await.unwrap_err();
    assert_eq!(blocked.code(), "outcome_unknown");
    clock.advance(Duration::from_secs(61));
    let (caller, args) = (alice(), charge(42, "x"));
    let ran = idem.call(&recipe, Some(&caller), &args, || async {
        keys.lock().unwrap().push(current_operation().unwrap().idempotency_key());
        Ok::<_, ToolError>("second".to_owned())
    });
    assert_eq!(ran.await.unwrap().value, "second");
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "a new operation forwards a new key");
}

/// A late holder whose superseded operation an operator settled is refused its completion; its
/// caller then gets its own result — never the newer operation's, which may have other
/// arguments.
#[tokio::test]
async fn a_refused_late_holder_never_gets_a_newer_operations_result() {
    let recipe = Recipe::new("send_email", &["card", "amount_cents"]).window(Duration::from_secs(60));
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let late = {
        let (idem, release) = (idem.clone(), Arc::clone(&release));
        tokio::spawn(async move {
            let (caller, args) = (alice(), charge(42, "first"));
            idem.call(&recipe, Some(&caller), &args, || async move {
                release.notified().await;
                Ok::<_, ToolError>("first, late".to_owned())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    clock.advance(Duration::from_secs(61));
    let (caller, args) = (alice(), charge(42, "second"));
    let newer = idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>("second".to_owned()) });
    let newer = newer.await.unwrap();
    assert_eq!((newer.value.as_str(), newer.replayed), ("second", false), "a new operation after the window");
    // The operator finds the old one among the pending operations, by its own address.
    let page = idem.admin().pending(&idem_runtime::admin::PendingFilter::new(100)).await.unwrap();
    let old = page.operations.iter().find(|op| op.reference == newer.reference && op.superseded).expect("listed");
    idem.admin()
        .resolve(alice().tenant(), &old.address().to_string(), Resolution::NothingHappened)
        .await
        .expect("the operator settles the old one");
    release.notify_one();
    let answer = late.await.unwrap().unwrap();
    assert_eq!((answer.value.as_str(), answer.replayed), ("first, late", false));
}

/// Issue 18, model finding 1: a run that took over a dead holder and then reports "nothing
/// happened" speaks for itself only — the dead holder may have acted. The operation stays in
/// progress under a lapsed lease (same window, same forwarded key), so the next repeat's effect
/// is deduped downstream; before, the record turned "failed" and the next repeat ran as a new
/// operation with a new key: a second effect within the window.
#[tokio::test]
async fn a_takeover_that_did_nothing_keeps_the_operation() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let clock = ManualClock::new(1_700_000_000_000);
    let idem = Idem::builder(MemoryLedger::new()).clock(clock.clone()).build().unwrap();
    let downstream = Dedupe::default();
    die_after_effect(&idem, &recipe, &downstream).await;
    clock.advance(Duration::from_secs(31));
    let (caller, args) = (alice(), charge(42, "x"));
    let gave_up = idem.call(&recipe, Some(&caller), &args, || async {
        Err::<String, _>(ToolError::Invalid("the lease was lost before the effect: nothing done".into()))
    });
    assert!(matches!(gave_up.await, Err(ToolError::Invalid(_))));
    clock.advance(Duration::from_secs(1));
    let served = idem.call(&recipe, Some(&caller), &args, || async { Ok::<_, ToolError>(downstream.charge()) });
    let served = served.await.unwrap();
    assert_eq!((served.value.as_str(), downstream.effects()), ("receipt-1", 1), "the dead holder's key, deduped");
}

/// Final review finding: a replica whose clock steps back (an NTP step, a restored VM) after it
/// measured its skew must not stamp its claims with the old offset — its lease would look
/// lapsed to every other replica at once, and a live holder would be taken over.
#[tokio::test]
async fn a_clock_that_steps_back_is_measured_again_before_it_stamps_a_claim() {
    let recipe = Recipe::new("charge_card", &["card", "amount_cents"]).stale(StalePolicy::Takeover);
    let ledger_clock = ManualClock::new(1_700_000_000_000);
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::with_clock(ledger_clock.clone()));
    let stepping = ManualClock::new(1_700_000_000_000);
    let holder = Idem::builder(Arc::clone(&ledger)).clock(stepping.clone()).build().unwrap();
    let other = Idem::builder(Arc::clone(&ledger)).clock(ledger_clock.clone()).build().unwrap();
    // Both measure their skew (0) with a first call.
    holder.call(&recipe, Some(&alice()), &charge(1, "warm"), || async { Ok::<_, ToolError>(0) }).await.unwrap();
    other.call(&recipe, Some(&alice()), &charge(2, "warm"), || async { Ok::<_, ToolError>(0) }).await.unwrap();
    stepping.set(1_700_000_000_000 - 3_600_000);
    let downstream = Arc::new(Dedupe::default());
    let release = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (holder, downstream, release) = (holder.clone(), Arc::clone(&downstream), Arc::clone(&release));
        tokio::spawn(async move {
            holder
                .call(&recipe, Some(&alice()), &charge(42, "x"), || async move {
                    let receipt = downstream.charge();
                    release.notified().await;
                    Ok::<_, ToolError>(receipt)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let repeat = other
        .call(&recipe, Some(&alice()), &charge(42, "x"), || async { Ok::<_, ToolError>(downstream.charge()) })
        .await;
    assert_eq!(repeat.unwrap_err().code(), "in_flight", "the holder is alive: its lease is on the ledger's clock");
    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap().value, "receipt-1");
    assert_eq!(downstream.effects(), 1);
}

/// Errors keep their cause typed (`source()`), say the same as before, and convert with `?`.
#[test]
fn errors_keep_their_cause_and_their_words() {
    use std::error::Error as _;
    let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    let error = LedgerError::unavailable("connection refused").with_source(cause);
    assert_eq!(error.to_string(), "the idempotency ledger is unavailable: connection refused");
    let source = error.source().expect("the cause is kept");
    assert_eq!(
        source.downcast_ref::<std::io::Error>().map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    assert_eq!(error, LedgerError::unavailable("connection refused"), "equal when they say the same thing");
    let status = idem_runtime::StatusError::from(error.clone());
    assert_eq!(status.to_string(), error.to_string());
    assert!(status.source().is_some_and(|source| source.is::<std::io::Error>()), "transparent: the cause itself");
}

#[path = "support/log.rs"]
mod log;

/// Issue 28, item 3: a won claim is logged at INFO with its ref and the key its handler
/// forwards, so an operator can check the downstream system even for a holder that died
/// before it logged anything else.
#[tokio::test]
async fn a_won_claim_logs_the_key_its_handler_forwards() {
    let captured = log::Captured::default();
    let _logging = tracing::subscriber::set_default(captured.subscriber(tracing::Level::INFO));
    let idem = Idem::new(MemoryLedger::new());
    let forwarded = std::sync::Mutex::new(None);
    let served = idem
        .call(&CHARGE, Some(&alice()), &charge(300, "x"), || async {
            *forwarded.lock().unwrap() = current_operation().map(|operation| operation.idempotency_key());
            Ok::<_, ToolError>("receipt".to_owned())
        })
        .await
        .unwrap();
    let forwarded = forwarded.lock().unwrap().clone().expect("the handler ran");
    let logged = captured.text();
    let line =
        logged.lines().find(|line| line.contains("claimed")).unwrap_or_else(|| panic!("no claim line:\n{logged}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(&format!("reference={}", served.reference)), "{line}");
    assert!(line.contains(&format!("idempotency_key={forwarded}")), "{line}");
}

/// Issue 28, item 2: a graceful stop. Once the handle drains, a new call is refused (safe to
/// retry elsewhere) and runs nothing; the call already running finishes and records its
/// outcome before the drain returns, so its operation is completed and replayable — not a
/// stranded claim for an operator to resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_the_running_call_finish_and_refuses_new_ones() {
    let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
    let idem = Idem::new(Arc::clone(&ledger));
    let processor = Arc::new(Processor::default());
    let (started, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let running = {
        let (idem, processor, started, release) =
            (idem.clone(), Arc::clone(&processor), Arc::clone(&started), Arc::clone(&release));
        tokio::spawn(async move {
            idem.call(&CHARGE, Some(&alice()), &charge(900, "x"), || async {
                started.notify_one();
                release.notified().await;
                processor.charge(900).await
            })
            .await
        })
    };
    started.notified().await;
    let drain = tokio::spawn({
        let idem = idem.clone();
        async move { idem.drain(Duration::from_secs(10)).await }
    });
    // The drain has closed the handle once a new call is refused (a call that came before it
    // runs, as it should); the refused one runs nothing.
    let mut amount = 901;
    let refused = loop {
        let ran = std::sync::atomic::AtomicBool::new(false);
        let answer = idem
            .call(&CHARGE, Some(&alice()), &charge(amount, "y"), || async {
                ran.store(true, Ordering::SeqCst);
                Ok::<_, ToolError>("other".to_owned())
            })
            .await;
        match answer {
            Err(error) if error.code() == "shutting_down" => {
                assert!(!ran.load(Ordering::SeqCst), "a refused call ran its handler");
                break error;
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => {
                amount += 1;
                tokio::task::yield_now().await;
            }
        }
    };
    assert!(
        matches!(&refused, ToolError::Rejected { message, .. } if message.contains("safe to retry")),
        "{refused:?}"
    );
    assert!(!drain.is_finished(), "the drain waits for the running call");
    release.notify_one();
    let served = running.await.unwrap().expect("the running call finishes");
    let drained = drain.await.unwrap();
    assert_eq!(drained.still_running, 0);
    assert_eq!(processor.count(), 1, "the running charge ran once");
    // After the restart, a repeat is replayed from the recorded outcome.
    let restarted = Idem::new(ledger);
    let again = restarted.call(&CHARGE, Some(&alice()), &charge(900, "x"), || processor.charge(900)).await.unwrap();
    assert!(again.replayed && again.value == served.value, "{again:?}");
    assert_eq!(processor.count(), 1);
}

/// A call still running at the deadline is counted, and its record stays in progress for its
/// stale policy (here, `hold`: a repeat is told it is in flight, then unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_gives_up_at_its_deadline() {
    let idem = Idem::new(MemoryLedger::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let stuck = {
        let (idem, started) = (idem.clone(), Arc::clone(&started));
        tokio::spawn(async move {
            idem.call(&CHARGE, Some(&alice()), &charge(902, "z"), || async {
                started.notify_one();
                std::future::pending::<Result<String, ToolError>>().await
            })
            .await
        })
    };
    started.notified().await;
    let drained = idem.drain(Duration::from_millis(50)).await;
    assert_eq!(drained.still_running, 1);
    stuck.abort();
}
