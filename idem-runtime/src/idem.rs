//! The orchestration: derive, claim, run, record, replay.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::canonical::CanonicalError;
use crate::clock::{Clock, SystemClock};
use crate::key::{Fingerprint, Key, Ref, RefError};
use crate::ledger::{Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, StatusReport, Token, Won};
use crate::recipe::{Recipe, ScopeRule};
use crate::rejection::{ErrorClass, IdempotentError, Rejection};
use crate::scope::{Caller, Scope};

/// How long a record lives when its recipe sets no window.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a claim is held without renewal; a running handler renews it every third of this.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long one ledger statement may take before the ledger counts as unavailable.
pub const DEFAULT_LEDGER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest stored result accepted by default.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;

tokio::task_local! {
    static OPERATION: Operation;
    static CALLER: Caller;
}

/// The operation a handler is running as: read it with [`current_operation`] and forward
/// [`Operation::key`] to the system that owns the side effect (an `Idempotency-Key` header, a
/// processor's reference field). Only that system can close the window between the effect and
/// the record.
#[derive(Debug, Clone)]
pub struct Operation {
    key: Key,
    tool: &'static str,
    attempt: Won,
    token: Token,
    /// When the operation's window ends; with the key, it names this operation downstream.
    window_end: u64,
    /// The size limit `complete_in` enforces (durable ledgers only).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")), allow(dead_code))]
    max_result_bytes: usize,
    /// Set once the handler recorded the result in its own transaction.
    recorded: Arc<std::sync::atomic::AtomicBool>,
}

impl Operation {
    /// The operation's ledger key. It is the same in every window; forward
    /// [`Operation::idempotency_key`] downstream instead.
    #[must_use]
    pub const fn key(&self) -> &Key {
        &self.key
    }

    /// The key to forward to the system that owns the side effect (an `Idempotency-Key`
    /// header, a processor's reference field): 64 hex digits naming this operation in this
    /// window. A takeover of a dead holder's claim forwards the same value, so the downstream
    /// can dedupe it; a new operation after the window ended forwards a new one, so a
    /// downstream that keeps keys longer than the window does not replay an older operation.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"idem/v1/operation\0");
        hasher.update(self.key.as_bytes());
        hasher.update(self.window_end.to_be_bytes());
        hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The short ref callers are given.
    #[must_use]
    pub fn reference(&self) -> Ref {
        self.key.reference()
    }

    /// The tool's name.
    #[must_use]
    pub const fn tool(&self) -> &'static str {
        self.tool
    }

    /// The fencing token this run holds the claim with.
    #[must_use]
    pub const fn token(&self) -> Token {
        self.token
    }

    /// Stores `value` as this operation's result on `conn` — a transaction of the handler's own
    /// — so the handler's writes and the stored result commit or roll back together. The
    /// handler then returns `Ok(value)` as usual; if its transaction rolled back, idem records
    /// the returned result itself.
    ///
    /// ```no_run
    /// # use idem_runtime::{current_operation, LedgerError};
    /// # use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
    /// # async fn handler(db: &DatabaseConnection) -> Result<String, LedgerError> {
    /// let operation = current_operation().expect("inside an idempotent handler");
    /// let txn = db.begin().await.map_err(|e| LedgerError::Unavailable { detail: e.to_string() })?;
    /// txn.execute_unprepared("INSERT INTO orders (id) VALUES ('o-1')").await.ok();
    /// let receipt = "order o-1 placed".to_owned();
    /// operation.complete_in(&txn, &receipt).await?;
    /// txn.commit().await.map_err(|e| LedgerError::Unavailable { detail: e.to_string() })?;
    /// Ok(receipt)
    /// # }
    /// ```
    ///
    /// # Errors
    /// The result cannot be serialised or exceeds the size limit, the claim was superseded
    /// ([`LedgerError::Fenced`]), or the statement failed.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub async fn complete_in<C, T>(&self, conn: &C, value: &T) -> Result<(), LedgerError>
    where
        C: sea_orm::ConnectionTrait,
        T: Serialize,
    {
        let bytes = serde_json::to_vec(&Stored::<&T, ()>::Ok(value))
            .map_err(|error| LedgerError::Corrupt { detail: format!("the result cannot be stored: {error}") })?;
        if bytes.len() > self.max_result_bytes {
            return Err(LedgerError::Corrupt {
                detail: format!("the result is {} bytes, above the limit of {}", bytes.len(), self.max_result_bytes),
            });
        }
        crate::ledger::sea::SeaOrmLedger::complete_on(conn, &self.key, self.token, Outcome::Completed(bytes)).await?;
        self.recorded.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Whether this run took over a dead holder's claim: the downstream may already have seen
    /// this key, and must dedupe by it.
    #[must_use]
    pub fn is_takeover(&self) -> bool {
        self.attempt != Won::Fresh
    }
}

/// The operation the current handler runs as, or `None` outside an idempotent handler.
///
/// Task-local: a task the handler spawns does not inherit it; pass the key along instead.
#[must_use]
pub fn current_operation() -> Option<Operation> {
    OPERATION.try_with(Clone::clone).ok()
}

/// Runs `future` with `caller` as the authenticated caller of every idempotent call inside it
/// that is not given one explicitly. Transports (the MCP adapter, your middleware) call this.
pub async fn with_caller<F: Future>(caller: Caller, future: F) -> F::Output {
    CALLER.scope(caller, future).await
}

/// Gives `#[idempotent]` methods their [`Idem`] handle: implement it for your server type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give `#[idempotent]` methods an `Idem` handle",
    label = "the receiver of this `#[idempotent]` method",
    note = "implement `idem_runtime::HasIdem` for `{Self}` (return the `Idem` it holds), or name one with \
            `#[idempotent(idem = self.idem, ...)]`"
)]
pub trait HasIdem {
    /// The handle this value's idempotent methods run under.
    fn idem(&self) -> &Idem;
}

impl HasIdem for Idem {
    fn idem(&self) -> &Idem {
        self
    }
}

static INSTALLED: std::sync::RwLock<Option<Idem>> = std::sync::RwLock::new(None);

/// A handler's result as idem served it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served<T> {
    /// The result: fresh, or decoded from the stored bytes.
    pub value: T,
    /// Whether it was replayed from the ledger rather than produced by this call.
    pub replayed: bool,
    /// The operation's ref.
    pub reference: Ref,
}

/// What a reconcile function found when asked about a stale operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reconciled<T, E> {
    /// The downstream did it; this is its result, stored and returned as if the handler had run.
    Happened(Result<T, E>),
    /// The downstream never saw it: run the handler now.
    NothingHappened,
    /// The downstream cannot tell: the operation stays unknown.
    StillUnknown,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Stored<T, E> {
    Ok(T),
    Err(E),
}

/// The handle that runs handlers under recipes: a ledger, a clock and the limits. Cheap to clone.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    retention: Duration,
    max_result_bytes: usize,
    local_caller: Option<Caller>,
    ledger_timeout: Duration,
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("lease", &self.inner.lease)
            .field("retention", &self.inner.retention)
            .field("max_result_bytes", &self.inner.max_result_bytes)
            .field("local_caller", &self.inner.local_caller)
            .finish_non_exhaustive()
    }
}

impl Idem {
    /// A handle on `ledger` with the system clock and the default lease, retention and limits.
    #[must_use]
    pub fn new(ledger: impl Ledger) -> Self {
        Self::from_shared(Arc::new(ledger))
    }

    /// A handle on a shared ledger (chosen at run time).
    #[must_use]
    pub fn from_shared(ledger: Arc<dyn Ledger>) -> Self {
        Self {
            inner: Arc::new(Inner {
                ledger,
                clock: Arc::new(SystemClock),
                lease: DEFAULT_LEASE,
                retention: DEFAULT_RETENTION,
                max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
                local_caller: None,
                ledger_timeout: DEFAULT_LEDGER_TIMEOUT,
            }),
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Inner)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => change(inner),
            None => {
                let old = &self.inner;
                let mut inner = Inner {
                    ledger: Arc::clone(&old.ledger),
                    clock: Arc::clone(&old.clock),
                    lease: old.lease,
                    retention: old.retention,
                    max_result_bytes: old.max_result_bytes,
                    local_caller: old.local_caller.clone(),
                    ledger_timeout: old.ledger_timeout,
                };
                change(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// Uses `clock` instead of the system clock (tests step it over a window edge).
    #[must_use]
    pub fn with_clock(self, clock: impl Clock) -> Self {
        self.configure(|inner| inner.clock = Arc::new(clock))
    }

    /// How long a claim is held before a repeat may treat its holder as dead (default 30 s).
    /// A running handler renews it every third of this, so it bounds detection of a crash, not
    /// the handler's running time.
    #[must_use]
    pub fn with_lease(self, lease: Duration) -> Self {
        self.configure(|inner| inner.lease = lease.max(Duration::from_millis(3)))
    }

    /// How long records of recipes without a window live (default 24 h).
    #[must_use]
    pub fn with_retention(self, retention: Duration) -> Self {
        self.configure(|inner| inner.retention = retention)
    }

    /// The largest result stored for replay (default 1 MiB). A larger result is returned to its
    /// caller but recorded as "outcome unknown", so repeats are told to check rather than run.
    #[must_use]
    pub fn with_max_result_bytes(self, max: usize) -> Self {
        self.configure(|inner| inner.max_result_bytes = max)
    }

    /// How long one ledger operation may take (default 10 s). A ledger that does not answer in
    /// time is unavailable: the handler does not run, and the caller is told so.
    #[must_use]
    pub fn with_ledger_timeout(self, timeout: Duration) -> Self {
        self.configure(|inner| inner.ledger_timeout = timeout.max(Duration::from_millis(1)))
    }

    /// The caller to use when none is given and none is in scope ([`with_caller`]): the
    /// configured identity of a local, single-user transport such as stdio.
    #[must_use]
    pub fn with_local_caller(self, caller: Caller) -> Self {
        self.configure(|inner| inner.local_caller = Some(caller))
    }

    /// Makes this the process-wide handle that `#[idempotent]` free functions run under
    /// (methods use [`HasIdem`]). Replaces any handle installed before.
    pub fn install(&self) {
        let mut installed = INSTALLED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *installed = Some(self.clone());
    }

    /// The handle installed with [`Idem::install`], if any.
    #[must_use]
    pub fn installed() -> Option<Self> {
        INSTALLED.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The configured local identity, if any.
    #[must_use]
    pub fn local_caller(&self) -> Option<&Caller> {
        self.inner.local_caller.as_ref()
    }

    /// The ledger.
    #[must_use]
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.inner.ledger
    }

    /// Now, by this handle's clock.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Runs `handler` as the operation `recipe` derives from `caller` and `arguments`, at most
    /// once per key, and answers repeats from the ledger. `caller` falls back to the one in
    /// scope ([`with_caller`]) and then to the local caller; with none, the call is refused.
    ///
    /// `arguments` must be a JSON object of the tool's arguments by name. Build it from Rust
    /// values with [`crate::canonical::to_value`], not `serde_json::json!`/`to_value`: those turn
    /// NaN and infinities into `null` before idem can refuse them. (`#[idempotent]` does this.)
    ///
    /// # Errors
    /// The handler's own error, or `E::from_rejection` of why it did not run.
    pub async fn call<T, E, F, Fut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &Value,
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.call_reconciling(recipe, caller, arguments, |_| async { Reconciled::StillUnknown }, handler).await
    }

    /// [`Idem::call`] for a recipe with the `reconcile` stale policy: when a claim finds a dead
    /// holder's lease, `reconcile` asks the downstream what happened (by the operation's key)
    /// before anything runs again.
    ///
    /// # Errors
    /// As [`Idem::call`].
    pub async fn call_reconciling<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &Value,
        reconcile: R,
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let arguments = CallArguments::from_json(recipe, arguments);
        match self.execute(recipe, caller, arguments, reconcile, handler).await {
            Ok(Served { value: Ok(value), replayed, reference }) => Ok(Served { value, replayed, reference }),
            Ok(Served { value: Err(error), .. }) => Err(error),
            Err(rejection) => Err(E::from_rejection(rejection)),
        }
    }

    /// The orchestration behind [`Idem::call`] and `#[idempotent]`.
    pub(crate) async fn execute<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: Result<CallArguments<'_>, Rejection>,
        reconcile: R,
        handler: F,
    ) -> Result<Served<Result<T, E>>, Rejection>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let tool = recipe.tool();
        let arguments = arguments?;
        let (request, fingerprint) = self.prepare(recipe, caller, &arguments)?;
        let key = request.key;
        let reference = key.reference();
        let first = self.bounded(self.inner.ledger.claim(&request)).await;
        // A pooled connection the server dropped fails one statement; send the claim once more
        // (same token: if the first one committed, the ledger recognises it as ours).
        let claim = match first {
            Err(LedgerError::Unavailable { .. }) => self.bounded(self.inner.ledger.claim(&request)).await,
            other => other,
        };
        let claim = match claim {
            Ok(claim) => claim,
            Err(error) => {
                tracing::error!(tool, %reference, %error, "ledger unavailable; handler not run");
                self.release_lost_claim(&request);
                return Err(Rejection::LedgerUnavailable { detail: error.to_string() });
            }
        };
        let attempt = match claim {
            Claim::Won(attempt) => attempt,
            Claim::Replay { result } => {
                tracing::info!(tool, %reference, "replay");
                return decode::<T, E>(&result, reference).map(|value| Served { value, replayed: true, reference });
            }
            Claim::InFlight { .. } => {
                tracing::info!(tool, %reference, "in flight");
                return Err(Rejection::InFlight { reference });
            }
            Claim::Unknown => {
                tracing::warn!(tool, %reference, "outcome unknown");
                return Err(Rejection::OutcomeUnknown { reference });
            }
            Claim::Conflict { arg_tags } => {
                let (differing, missing) = fingerprint.differing(&arg_tags);
                tracing::warn!(tool, %reference, ?differing, missing, "conflict");
                return Err(Rejection::Conflict { reference, differing, missing });
            }
        };
        let Some(window_end) = self.window_end(&request, attempt).await else {
            // A takeover must forward the dead holder's key; without it, running could make a
            // second effect downstream. Leave the claim to its lease: the next repeat retries.
            tracing::error!(tool, %reference, "could not read the operation's window; handler not run");
            return Err(Rejection::LedgerUnavailable { detail: "the operation's record could not be read".to_owned() });
        };
        let operation = Operation {
            key,
            tool,
            attempt,
            token: request.token,
            window_end,
            max_result_bytes: self.inner.max_result_bytes,
            recorded: Arc::default(),
        };
        let recorded = Arc::clone(&operation.recorded);
        let result = match attempt {
            Won::Reconcile => {
                tracing::warn!(tool, %reference, "stale lease; reconciling with the downstream");
                match self.drive(&request, &recorded, reconcile(operation.clone())).await {
                    Err(panic) => self.unwind(&request, panic).await,
                    Ok(Reconciled::Happened(result)) => result,
                    Ok(Reconciled::NothingHappened) => self.run(&request, operation, &recorded, handler).await,
                    Ok(Reconciled::StillUnknown) => {
                        self.finish(&request, Outcome::Unknown, false).await;
                        return Err(Rejection::OutcomeUnknown { reference });
                    }
                }
            }
            Won::Takeover => {
                tracing::warn!(tool, %reference, "stale lease taken over; running again under a new token");
                self.run(&request, operation, &recorded, handler).await
            }
            Won::Fresh => {
                tracing::debug!(tool, %reference, "claimed");
                self.run(&request, operation, &recorded, handler).await
            }
        };
        let recorded = recorded.load(std::sync::atomic::Ordering::SeqCst);
        let (value, fenced) = self.record(&request, result, recorded).await;
        if fenced && let Some(stored) = self.stored_result(&request).await {
            // Superseded: the answer is the new holder's, the one every repeat gets too.
            return decode::<T, E>(&stored, reference).map(|value| Served { value, replayed: true, reference });
        }
        Ok(Served { value, replayed: false, reference })
    }

    /// Derives the claim for a call, or the rejection that stops it before the ledger.
    fn prepare<'a>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &'a CallArguments<'_>,
    ) -> Result<(ClaimRequest, Fingerprint<'a>), Rejection> {
        let caller = match caller {
            Some(caller) => std::borrow::Cow::Borrowed(caller),
            None => std::borrow::Cow::Owned(
                CALLER
                    .try_with(Clone::clone)
                    .ok()
                    .or_else(|| self.inner.local_caller.clone())
                    .ok_or(Rejection::NoCaller)?,
            ),
        };
        let invalid = |error| Rejection::InvalidArguments { error };
        let scope = match (recipe.scope_rule(), &arguments.task) {
            (ScopeRule::Tenant, _) => Scope::tenant(&caller),
            (ScopeRule::Task(_), Some(task)) if !task.is_null() => Scope::task(&caller, task.clone()),
            (ScopeRule::Task(path), _) => {
                return Err(invalid(CanonicalError::Invalid {
                    message: format!("the task id argument `{path}` is missing; the key's scope needs it"),
                }));
            }
            _ => Scope::caller(&caller),
        };
        let (all, selected) = (&*arguments.all, &arguments.selected);
        let key = Key::derive(&scope, recipe.tool(), selected).map_err(invalid)?;
        let fingerprint = Fingerprint::of(all, recipe.ignored()).map_err(invalid)?;
        let now = self.now_ms();
        let window = recipe.window_duration().unwrap_or(self.inner.retention);
        let request = ClaimRequest {
            key,
            tenant: scope.tenant_tag(),
            fingerprint: fingerprint.digest,
            arg_tags: fingerprint.tags.clone(),
            token: Token::random(),
            now,
            expires_at: clamp(now.saturating_add(millis(window))),
            lease_until: clamp(now.saturating_add(millis(self.inner.lease))),
            stale: recipe.stale_policy(),
        };
        Ok((request, fingerprint))
    }

    /// Runs `future` (the handler, or a reconcile function) while renewing the claim's lease
    /// beside it, so a long run keeps its claim; a panic is caught and handed back.
    ///
    /// The renewal never holds the future up: both are polled together, and renewing stops
    /// once the handler recorded its result itself ([`Operation::complete_in`]).
    async fn drive<F: Future>(
        &self,
        request: &ClaimRequest,
        recorded: &std::sync::atomic::AtomicBool,
        future: F,
    ) -> std::thread::Result<F::Output> {
        let mut future = CatchUnwind(Box::pin(future));
        // A future that finishes on its first poll needs no lease timer.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx))).await;
        if let std::task::Poll::Ready(output) = first {
            return output;
        }
        let renewer = async {
            let every = self.inner.lease / 3;
            loop {
                tokio::time::sleep(every).await;
                if recorded.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let until = self.lease_until();
                if let Err(error) = self.bounded(self.inner.ledger.renew(&request.key, request.token, until)).await {
                    tracing::warn!(reference = %request.key.reference(), %error, "lease renewal failed");
                }
            }
        };
        tokio::select! {
            biased;
            output = &mut future => output,
            () = renewer => unreachable!("the renewer never ends"),
        }
    }

    /// Runs the handler as `operation` under [`Idem::drive`]. A panic records the outcome as
    /// unknown (the effect may have happened) and then continues unwinding.
    async fn run<T, E, F, Fut>(
        &self,
        request: &ClaimRequest,
        operation: Operation,
        recorded: &std::sync::atomic::AtomicBool,
        handler: F,
    ) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.drive(request, recorded, OPERATION.scope(operation, handler())).await {
            Ok(result) => result,
            Err(panic) => self.unwind(request, panic).await,
        }
    }

    async fn unwind(&self, request: &ClaimRequest, panic: Box<dyn std::any::Any + Send>) -> ! {
        tracing::error!(reference = %request.key.reference(), "the handler panicked; recording the outcome as unknown");
        self.finish(request, Outcome::Unknown, false).await;
        std::panic::resume_unwind(panic)
    }

    /// `operation`, or [`LedgerError::Unavailable`] once the ledger timeout has passed.
    async fn bounded<T>(&self, operation: impl Future<Output = Result<T, LedgerError>>) -> Result<T, LedgerError> {
        match tokio::time::timeout(self.inner.ledger_timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(LedgerError::Unavailable {
                detail: format!("no answer within {} ms", self.inner.ledger_timeout.as_millis()),
            }),
        }
    }

    /// The claim may have committed before its answer was lost. Release it — fenced by our
    /// token, so it can touch nothing else — in the background until it works or the lease
    /// ends, so the retry the caller was told is safe runs instead of hearing "in flight" (or,
    /// under `hold`, "outcome unknown") although nothing ran.
    fn release_lost_claim(&self, request: &ClaimRequest) {
        let (ledger, key, token) = (Arc::clone(&self.inner.ledger), request.key, request.token);
        let (timeout, lease) = (self.inner.ledger_timeout, self.inner.lease);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + lease;
            let mut pause = Duration::from_millis(20);
            loop {
                match tokio::time::timeout(timeout, ledger.complete(&key, token, Outcome::Failed)).await {
                    Ok(Ok(())) => {
                        tracing::info!(reference = %key.reference(), "released a claim whose answer was lost");
                        return;
                    }
                    // Unavailable, timed out, or fenced (the claim may still be committing after a
                    // timeout, or never did): try again until the lease would have ended.
                    _ if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    _ => return,
                }
            }
        });
    }

    fn lease_until(&self) -> u64 {
        clamp(self.now_ms().saturating_add(millis(self.inner.lease)))
    }

    /// Stores the handler's result per its classification and hands it back.
    /// Returns the result and whether its completion was refused because the claim had been
    /// taken over meanwhile.
    async fn record<T, E>(&self, request: &ClaimRequest, result: Result<T, E>, recorded: bool) -> (Result<T, E>, bool)
    where
        T: Serialize,
        E: IdempotentError,
    {
        let outcome = match &result {
            Ok(value) => self.encode(request, &Stored::<&T, &E>::Ok(value)),
            Err(error) => match error.classify() {
                ErrorClass::NothingHappened => Outcome::Failed,
                ErrorClass::Final => self.encode(request, &Stored::<&T, &E>::Err(error)),
                ErrorClass::Unknown => Outcome::Unknown,
            },
        };
        let fenced = self.finish(request, outcome, recorded).await;
        (result, fenced)
    }

    fn encode<S: Serialize>(&self, request: &ClaimRequest, stored: &S) -> Outcome {
        let reference = request.key.reference();
        match serde_json::to_vec(stored) {
            Ok(bytes) if bytes.len() <= self.inner.max_result_bytes => Outcome::Completed(bytes),
            Ok(bytes) => {
                tracing::error!(%reference, size = bytes.len(), max = self.inner.max_result_bytes,
                    "result too large to store; recording the outcome as unknown");
                Outcome::Unknown
            }
            Err(error) => {
                tracing::error!(%reference, %error, "result cannot be stored; recording the outcome as unknown");
                Outcome::Unknown
            }
        }
    }

    /// Completes the claim. A failure here is logged, never hidden behind the caller's result:
    /// the effect happened, the record stays in progress, and its lease runs out into the
    /// tool's stale policy.
    /// Returns whether the claim turned out to be superseded (fenced) — its holder's result was
    /// not recorded.
    async fn finish(&self, request: &ClaimRequest, outcome: Outcome, recorded_by_handler: bool) -> bool {
        let reference = request.key.reference();
        // A brief ledger outage right after the effect would leave the record in progress until
        // its lease runs out: retry a few times while the lease is surely still ours.
        for pause in [50, 250, 1000, 0] {
            match self.bounded(self.inner.ledger.complete(&request.key, request.token, outcome.clone())).await {
                Ok(()) => return false,
                Err(LedgerError::Fenced) if recorded_by_handler => {
                    tracing::debug!(%reference, "recorded in the handler's own transaction");
                    return false;
                }
                Err(LedgerError::Fenced) => {
                    tracing::warn!(%reference, "the claim was taken over while the handler ran; its result is not recorded");
                    return true;
                }
                Err(LedgerError::Unavailable { detail }) if pause > 0 => {
                    tracing::warn!(%reference, %detail, "could not record the outcome yet; retrying");
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(error) => {
                    tracing::error!(%reference, %error, "could not record the outcome");
                    return false;
                }
            }
        }
        false
    }

    /// The stored result of a completed operation, if the ledger has one.
    async fn stored_result(&self, request: &ClaimRequest) -> Option<Vec<u8>> {
        let status = self.inner.ledger.status(request.tenant, request.key.reference(), self.now_ms());
        match self.bounded(status).await {
            Ok(Some(report)) if report.state == crate::ledger::State::Completed => report.result,
            _ => None,
        }
    }

    /// When the operation's window ends: the request's own for a fresh claim, the stored one
    /// for a takeover (one status read, only on that rare path), or `None` if it cannot be read.
    async fn window_end(&self, request: &ClaimRequest, attempt: Won) -> Option<u64> {
        if attempt == Won::Fresh {
            return Some(request.expires_at);
        }
        let report = self.bounded(self.inner.ledger.status(request.tenant, request.key.reference(), request.now));
        match report.await {
            Ok(Some(report)) => Some(report.expires_at),
            _ => None,
        }
    }

    /// The status of operation `reference` in the caller's tenant.
    ///
    /// # Errors
    /// A malformed ref, or the ledger's failure.
    pub async fn status(&self, caller: &Caller, reference: &str) -> Result<Option<StatusReport>, StatusError> {
        let reference = Ref::parse(reference).map_err(StatusError::Ref)?;
        let tenant = crate::key::TenantTag::of(caller.tenant());
        self.inner.ledger.status(tenant, reference, self.now_ms()).await.map_err(StatusError::Ledger)
    }

    /// Settles an unknown (or dead-holder) operation of the caller's tenant: the operator path
    /// out of "outcome unknown".
    ///
    /// # Errors
    /// A malformed ref, no such operation, or one that is not unknown.
    pub async fn resolve(&self, caller: &Caller, reference: &str, resolution: Resolution) -> Result<(), StatusError> {
        let reference = Ref::parse(reference).map_err(StatusError::Ref)?;
        let tenant = crate::key::TenantTag::of(caller.tenant());
        self.inner.ledger.resolve(tenant, reference, resolution, self.now_ms()).await.map_err(StatusError::Ledger)
    }

    /// Deletes expired records, `batch` at a time, until none are left; returns how many.
    ///
    /// # Errors
    /// The ledger's failure; records deleted before it stay deleted.
    pub async fn sweep(&self, batch: usize) -> Result<usize, LedgerError> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            let swept = self.inner.ledger.sweep(self.now_ms(), batch).await?;
            total += swept;
            if swept < batch {
                tracing::debug!(swept = total, "sweep done");
                return Ok(total);
            }
        }
    }
}

/// A status or resolve request that could not be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// The ref is malformed.
    Ref(RefError),
    /// The ledger failed or refused.
    Ledger(LedgerError),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ref(error) => error.fmt(f),
            Self::Ledger(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for StatusError {}

fn decode<T: DeserializeOwned, E: IdempotentError>(bytes: &[u8], reference: Ref) -> Result<Result<T, E>, Rejection> {
    match serde_json::from_slice::<Stored<T, E>>(bytes) {
        Ok(Stored::Ok(value)) => Ok(Ok(value)),
        Ok(Stored::Err(error)) => Ok(Err(error)),
        Err(error) => Err(Rejection::UnreadableResult { reference, detail: error.to_string() }),
    }
}

/// A call's arguments, split the way a recipe needs them.
#[derive(Debug, Default)]
pub(crate) struct CallArguments<'a> {
    /// Every argument by name (the fingerprint's input; ignored names are dropped there).
    pub(crate) all: std::borrow::Cow<'a, Map<String, Value>>,
    /// The key's arguments by path.
    pub(crate) selected: Map<String, Value>,
    /// The task id, for `ScopeRule::Task`.
    pub(crate) task: Option<Value>,
}

impl<'a> CallArguments<'a> {
    /// Splits a JSON object of arguments by the recipe's paths.
    fn from_json(recipe: &Recipe, arguments: &'a Value) -> Result<Self, Rejection> {
        let Value::Object(all) = arguments else {
            return Err(Rejection::InvalidArguments {
                error: CanonicalError::Invalid { message: "the arguments must be a JSON object".to_owned() },
            });
        };
        // A missing or null key path is refused: as `null` it would make every call without it
        // (a typo, a forgetful client) one operation. Only the recipe's optional key paths take
        // "absent" as a value, and then absent and null are one value.
        let mut selected = Map::with_capacity(recipe.key_paths().len());
        for path in recipe.key_paths() {
            let value = match lookup(all, path) {
                Some(value) if !value.is_null() => value.clone(),
                _ if recipe.is_optional_key(path) => Value::Null,
                _ => {
                    return Err(Rejection::InvalidArguments {
                        error: CanonicalError::MissingKey { path: (*path).to_owned() },
                    });
                }
            };
            selected.insert((*path).to_owned(), value);
        }
        let task = match recipe.scope_rule() {
            ScopeRule::Task(path) => lookup(all, path).cloned(),
            _ => None,
        };
        Ok(Self { all: std::borrow::Cow::Borrowed(all), selected, task })
    }
}

/// The value at a dotted argument path (`"customer.id"`).
fn lookup<'a>(arguments: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut segments = path.split('.');
    let first = arguments.get(segments.next()?)?;
    segments.try_fold(first, |value, segment| value.as_object()?.get(segment))
}

/// Times are stored as signed 64-bit integers by SQL backends: keep them in that range, so
/// what a claim asks for is what it reads back.
fn clamp(ms: u64) -> u64 {
    ms.min(i64::MAX.unsigned_abs())
}

/// Polls a future, turning a panic into an `Err` (like `futures`' `catch_unwind`).
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
