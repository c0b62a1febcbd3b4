//! One call, top to bottom: its arguments → its key → the claim → the handler → the record →
//! the answer. [`Idem::call`] and [`Idem::call_reconciling`] are the public entry points, and
//! `#[idempotent]` enters at `Idem::execute`, which reads as the list of steps. Once a call is
//! keyed, each step is one method of an `Attempt`: the handle, the claim it sends, and the lease
//! it holds if it wins.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::key::{Fingerprint, Ref};
use crate::ledger::{Claim, ClaimRequest, LedgerError, Outcome, State, Token, Won, seal_label, superseded};
use crate::recipe::Recipe;
use crate::rejection::{ErrorClass, IdempotentError, Rejection};
use crate::scope::Caller;
use crate::secret::Secret;

use super::Idem;
use super::arguments::{CallArguments, Derive, scope_of};
use super::coalesce::Begin;
use super::ending::{Ending, Sent};
use super::hooks::{Completion, Seen, Timer, Watch};
use super::keyring::{Check, Keyring, no_secret};
use super::operation::{LeaseState, Operation, acting_for, caller_of, running_as};
use super::owners::{self, Ownership};
use super::request_state::Binding;
use super::time::{clamp, millis};
use super::wait::Waited;

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

impl Idem {
    /// Runs `handler` as the operation `recipe` derives from `caller` and `arguments`, at most
    /// once per key, and answers repeats from the ledger. `caller` falls back to the one in
    /// scope ([`run_as`](super::run_as)) and then to the local caller; with none, the
    /// call is refused.
    ///
    /// `arguments` are the tool's arguments by name: anything that serialises to an object (a
    /// struct, a map, a `serde_json::Value` object). They are canonicalised here, as
    /// `#[idempotent]` does ([`crate::canonical::to_value`]): NaN, infinities and other values
    /// without a canonical form are refused (`invalid_arguments`), never keyed as `null`.
    ///
    /// # Errors
    /// The handler's own error, or `E::from_rejection` of why it did not run.
    pub async fn call<T, E, F, Fut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &(impl Serialize + ?Sized),
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
    /// holder's lease, `reconcile` asks the downstream what happened (by the operation's
    /// idempotency key) before anything runs again.
    ///
    /// # Errors
    /// As [`Idem::call`].
    pub async fn call_reconciling<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &(impl Serialize + ?Sized),
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
        let arguments = CallArguments::of(recipe, arguments);
        match self.execute(recipe, caller, true, arguments, reconcile, handler).await {
            Ok(Served { value: Ok(value), replayed, reference }) => Ok(Served { value, replayed, reference }),
            Ok(Served { value: Err(error), .. }) => Err(error),
            Err(rejection) => Err(E::from_rejection(rejection)),
        }
    }

    /// The orchestration behind [`Idem::call`] and `#[idempotent]`. Without a `caller`, the one
    /// in scope or the local identity — if `fallback` (never for a request that came over
    /// HTTP). The handler and a reconcile function run with the caller in scope.
    pub(crate) async fn execute<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        fallback: bool,
        arguments: Result<CallArguments, Rejection>,
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
        // Counted until the outcome is recorded; refused once the handle drains.
        let _underway = self.inner.drain.enter()?;
        // Arguments → key.
        let tool = recipe.tool();
        self.register(recipe)?;
        let arguments = arguments?;
        let keyring = self.keyring(Check::Keep).await.map_err(|error| no_secret(&error))?;
        // The ledger keeps this secret version's operations live as long as this call's may be.
        self.keep_secret_live(&keyring, recipe.window_duration()).await?;
        let caller = caller_of(self, caller, fallback)?;
        let watch = Watch::new(self, recipe, &caller);
        let inner = &self.inner;
        Ownership {
            ledger: &inner.untimed,
            timed: &*inner.ledger,
            namespace: self.namespace(recipe),
            recipe,
            owner: arguments.owner.as_deref(),
            // The handler's own (`#[idempotent]`), else the recipe's (the HTTP layer's routes).
            result_schema: arguments.result_schema.or(recipe.result_schema_fn()),
            now: self.ledger_now(),
            horizon: owners::horizon(
                recipe.window_duration(),
                inner.settings.retention,
                inner.settings.grace,
                inner.settings.lease,
            ),
            patience: inner.settings.ledger_timeout.saturating_mul(2),
        }
        .check()
        .await
        .inspect_err(|rejection| {
            if matches!(rejection, Rejection::LedgerUnavailable { .. }) {
                watch.unavailable();
            }
        })?;
        let scope = scope_of(recipe, &caller, &arguments)?;
        // With `wait`, a repeat that finds the operation in flight waits for it to settle, and
        // claims again if it ended without effect.
        let deadline = recipe.wait_duration().map(|wait| tokio::time::Instant::now() + wait);
        // Held until the outcome is recorded (or the call ends): identical calls in this
        // process are answered "in flight" meanwhile, with no statement.
        let mut held = None;
        // How long the first of identical calls may take to answer: two sends of its claim,
        // and during a rotation a look, a release and a claim per previous secret, each bounded
        // by the ledger timeout.
        let statements = 2 + 3 * u32::try_from(keyring.previous.len()).unwrap_or(u32::MAX / 4);
        let patience = self.inner.settings.ledger_timeout.saturating_mul(statements);
        let (attempt, won, window_end) = loop {
            let (now, clock_trusted) = self.ledger_time().await.map_err(|error| {
                tracing::error!(tool, %error, "the ledger's clock could not be read; handler not run");
                watch.unavailable();
                unavailable(&error)
            })?;
            let at = Derive { recipe, scope: &scope, arguments: &arguments, now, clock_trusted };
            // Key → claim.
            let mut attempt = Attempt::prepare(self, &keyring.current, &at)?;
            // Identical calls in this process share one claim (see `coalesce.rs`).
            // A coalesced call waits for the first one's answer at most as long as it may take
            // (see `patience` above), then claims on its own.
            let begin = if self.inner.ledger.local() {
                Begin::Alone
            } else {
                self.inner.claims.begin(&attempt.request, patience).await
            };
            let (mut claim, pending, sent) = match begin {
                Begin::Answered(claim, version) if version == attempt.binding.secret.version() => (claim, None, false),
                Begin::Answered(claim, version) => match keyring.all().find(|secret| secret.version() == version) {
                    // Answered by an operation keyed under a previous secret (found by the first
                    // of these calls): this call names that operation, and compares its tags.
                    Some(secret) => {
                        attempt = Attempt::prepare(self, secret, &at)?;
                        (claim, None, false)
                    }
                    // A secret this handle does not honour (a clone configured otherwise shares
                    // the process's claims): the answer is not this call's to give.
                    None => (attempt.claim(&at).await.inspect_err(|_| watch.unavailable())?, None, true),
                },
                Begin::Claim(pending) => {
                    (attempt.claim(&at).await.inspect_err(|_| watch.unavailable())?, Some(pending), true)
                }
                Begin::Alone => (attempt.claim(&at).await.inspect_err(|_| watch.unavailable())?, None, true),
            };
            // During a rotation, a fresh claim this call sent (or another's claim it found in
            // flight, which may be one about to yield) is checked against operations under
            // previous secrets. An answer shared by an identical call was checked by that call.
            let holds = matches!(claim, Claim::Won { attempt: Won::Fresh, .. });
            if sent
                && (holds || matches!(claim, Claim::InFlight { .. }))
                && let Some(earlier) =
                    attempt.earlier_operation(&keyring, &at, holds).await.inspect_err(|r| watch.refused(r))?
            {
                (attempt, claim) = earlier;
            }
            // A claim that did not win is answered from the ledger.
            let reference = attempt.reference();
            if let Some(pending) = pending {
                let version = attempt.binding.secret.version();
                match &claim {
                    Claim::Won { .. } => held = Some(pending.won(version)),
                    answer => pending.answered(answer, version),
                }
            }
            match claim {
                Claim::Won { attempt: won, window_end } => {
                    if !keyring.previous.is_empty() {
                        attempt.bind_earlier_secrets(&keyring, &at)?;
                    }
                    break (attempt, won, window_end);
                }
                Claim::Replay { result } => return attempt.replayed(result, &watch, "replay"),
                Claim::InFlight { lease_until } => {
                    // How long the holder's lease still runs, on the clock the claim was judged by.
                    let lease_left = |now: u64| {
                        let left = std::time::Duration::from_millis(lease_until.saturating_sub(now));
                        Some(left.min(self.inner.settings.lease))
                    };
                    let Some(deadline) = deadline else {
                        tracing::info!(tool, %reference, "in flight");
                        watch.saw(reference, Seen::InFlight);
                        return Err(Rejection::InFlight { reference, lease_left: lease_left(self.ledger_now()) });
                    };
                    tracing::debug!(tool, %reference, "in flight; waiting for it to settle");
                    // The wait may claim again with this request: it is sent whole.
                    attempt.complete_request(&at);
                    match self.wait_for(&attempt.request, deadline).await {
                        Waited::Replay(result) => {
                            return attempt.replayed(result.to_vec(), &watch, "replay after a wait");
                        }
                        Waited::Unknown => {
                            tracing::warn!(tool, %reference, "outcome unknown after a wait");
                            watch.saw(reference, Seen::Unknown);
                            return Err(Rejection::OutcomeUnknown { reference });
                        }
                        Waited::ClaimAgain => {
                            tracing::info!(tool, %reference, "the operation ended without effect; claiming again");
                        }
                        Waited::InFlight | Waited::Unavailable => {
                            tracing::info!(tool, %reference, "still in flight after the wait");
                            watch.saw(reference, Seen::InFlight);
                            return Err(Rejection::InFlight { reference, lease_left: lease_left(self.ledger_now()) });
                        }
                    }
                }
                Claim::Unknown => {
                    tracing::warn!(tool, %reference, "outcome unknown");
                    watch.saw(reference, Seen::Unknown);
                    return Err(Rejection::OutcomeUnknown { reference });
                }
                Claim::Conflict { arg_tags } => {
                    attempt.complete_request(&at);
                    let (differing, missing) = attempt.fingerprint.differing(&arg_tags);
                    tracing::warn!(tool, %reference, ?differing, missing, "conflict");
                    watch.saw(reference, Seen::Conflict);
                    return Err(Rejection::Conflict { reference, differing, missing });
                }
            }
        };
        let reference = attempt.reference();
        // Held here until the outcome is recorded: its end wakes this process's waiters. Only a
        // recipe with `wait` has waiters (one key is one recipe), so no other call pays the lock.
        let _holding = recipe.wait_duration().is_some().then(|| self.inner.waiting.hold(attempt.request.key));
        // Claim → handler.
        let operation = attempt.operation(won, window_end);
        if operation.lease_lost() {
            // The answer came after the lease it granted ran out: another replica may hold the
            // operation by now. Give the claim back (fenced by our token) and run nothing.
            tracing::error!(tool, %reference, "the claim was answered after its lease ended; handler not run");
            self.release_lost_claim(&attempt.request);
            watch.unavailable();
            return Err(Rejection::ledger_unavailable(format!("ref {reference}: the ledger answered too late")));
        }
        watch.saw(reference, Seen::Won(won));
        let _running = watch.running();
        let result = attempt.perform(won, operation, &watch, reconcile, handler).await?;
        // Handler → record → answer.
        let (value, completion) = attempt.record(result, won).await;
        // Recorded: identical calls from now on are answered by the ledger (a replay).
        drop(held);
        watch.completed(reference, completion);
        if completion == Completion::Superseded
            && let Some(stored) = attempt.stored_result(window_end).await
        {
            // Superseded: the answer is the new holder's, the one every repeat gets too.
            return attempt.replay(stored);
        }
        Ok(Served { value, replayed: false, reference })
    }
}

/// One keyed attempt at a call: the claim it sends and, once won, the lease it holds.
struct Attempt<'a> {
    idem: &'a Idem,
    tool: &'static str,
    /// The claim, derived under one secret.
    request: ClaimRequest,
    /// The arguments' fingerprint, to name what differs in a conflict (its argument tags are
    /// computed by [`Attempt::complete_request`]).
    fingerprint: Fingerprint<'a>,
    /// Whether `request` carries the argument tags and the label: it is sent to the ledger.
    complete: bool,
    /// What the renewer knows of the lease, once the claim is won.
    lease: Arc<LeaseState>,
    /// Set once the handler recorded the result in its own transaction.
    recorded: Arc<AtomicBool>,
    /// What a `requestState` the operation sends is sealed to.
    binding: Arc<Binding>,
}

impl<'a> Attempt<'a> {
    /// Derives the claim for a call under `secret`, or the rejection that stops it before the
    /// ledger.
    fn prepare(idem: &'a Idem, secret: &Secret, at: &Derive<'_, 'a, '_>) -> Result<Self, Rejection> {
        let recipe = at.recipe;
        let key = at.arguments.key(secret, idem.namespace(recipe), at.scope, recipe.tool())?;
        let fingerprint = at.arguments.fingerprint(secret, recipe.ignore_paths())?;
        let window = recipe.window_duration().unwrap_or(idem.inner.settings.retention);
        let now = at.now;
        let window_end = clamp(now.saturating_add(millis(window)));
        let request = ClaimRequest {
            key,
            tenant: at.scope.tenant_tag(secret),
            subject: at.scope.subject_tag(secret),
            fingerprint: *fingerprint.digest(),
            // Filled in by `complete_request`, for a claim that is sent: a call answered by an
            // identical call's claim needs neither.
            arg_tags: Vec::new(),
            token: Token::random(),
            now,
            window_end,
            expires_at: clamp(window_end.saturating_add(millis(idem.inner.settings.unsettled_retention))),
            lease_until: clamp(now.saturating_add(millis(idem.inner.settings.lease))),
            stale: recipe.stale_policy(),
            clock_trusted: at.clock_trusted,
            label: None,
        };
        let binding = Binding::of(idem, secret, at, key, *fingerprint.digest())?;
        let lease = LeaseState { until: AtomicU64::new(request.lease_until), fenced: AtomicBool::new(false) };
        let (lease, recorded, binding) = (Arc::new(lease), Arc::default(), Arc::new(binding));
        Ok(Self { idem, tool: recipe.tool(), request, fingerprint, complete: false, lease, recorded, binding })
    }

    /// During a rotation, a won claim's operation also accepts a `requestState` its first
    /// round was given under another secret still honoured (sealed before the rotation step):
    /// its binding under each of them. Only for a claim that runs, and only while previous
    /// secrets are configured.
    fn bind_earlier_secrets(&mut self, keyring: &Keyring, at: &Derive<'_, 'a, '_>) -> Result<(), Rejection> {
        let own = self.binding.secret.version();
        let mut earlier = Vec::new();
        for secret in keyring.all().filter(|secret| secret.version() != own) {
            let (recipe, namespace) = (at.recipe, self.idem.namespace(at.recipe));
            let key = at.arguments.key(secret, namespace, at.scope, recipe.tool())?;
            let fingerprint = *at.arguments.fingerprint(secret, recipe.ignore_paths())?.digest();
            earlier.push(Binding::of(self.idem, secret, at, key, fingerprint)?);
        }
        if let Some(binding) = Arc::get_mut(&mut self.binding) {
            binding.earlier = earlier;
        }
        Ok(())
    }

    /// Completes the claim for the ledger: the argument tags (what a conflict names) and, on a
    /// ledger that keeps them, the sealed label (what an operator's `pending` shows). Done once,
    /// before anything sends or compares the request; a call answered by an identical call's
    /// claim never pays for them.
    fn complete_request(&mut self, at: &Derive<'_, 'a, '_>) {
        if self.complete {
            return;
        }
        let secret = &self.binding.secret;
        self.fingerprint.tag(secret);
        self.request.arg_tags = self.fingerprint.tags().to_vec();
        self.request.label = self.idem.inner.ledger.keeps_labels().then(|| {
            let namespace = self.idem.namespace(at.recipe);
            seal_label(secret, namespace, self.tool, at.scope.tenant_name(), at.scope.subject_name())
        });
        self.complete = true;
    }

    fn reference(&self) -> Ref {
        self.request.key.reference()
    }

    /// Sends the claim; a claim that fails is sent once more with the same token (a pooled
    /// connection the server dropped fails one statement; if the first send committed, the
    /// ledger recognises it as ours and says how it won) and its times stamped again (the
    /// server that answers it may be a promoted standby, with another clock). A claim that still
    /// fails after a send whose answer was lost is released in the background.
    async fn claim(&mut self, at: &Derive<'_, 'a, '_>) -> Result<Claim, Rejection> {
        self.complete_request(at);
        let idem = self.idem;
        let reference = self.reference();
        let timer = Timer::start();
        let first = idem.inner.ledger.claim(&self.request).await;
        let (claim, ambiguous) = match first {
            Err(error @ (LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. })) => 'again: {
                let stamped = self.request.lease_until;
                // Not sent again on the old stamp: if the clock cannot be read now, the call is
                // told nothing was executed (and a first send that may have committed is undone).
                if let Err(unmeasured) = self.restamp().await {
                    break 'again (Err(unmeasured), error.is_ambiguous());
                }
                let again = idem.inner.ledger.claim(&self.request).await;
                if matches!(again, Ok(Claim::Won { .. })) && self.request.lease_until > stamped {
                    // Had the first send committed, the ledger would hold its lease, stamped on
                    // the old clock: renewed to the new stamp, so both cases hold the same lease.
                    let (key, token, until) = (self.request.key, self.request.token, self.request.lease_until);
                    if idem.inner.ledger.renew(&key, token, until).await.is_ok() {
                        self.lease.until.fetch_max(until, Ordering::SeqCst);
                    }
                }
                let ambiguous = error.is_ambiguous() || again.as_ref().is_err_and(LedgerError::is_ambiguous);
                (again, ambiguous)
            }
            other => (other, false),
        };
        timer.claimed(self.tool);
        claim.map_err(|error| {
            tracing::error!(%reference, %error, ambiguous, "ledger unavailable; handler not run");
            if ambiguous {
                idem.release_lost_claim(&self.request);
            }
            unavailable(&error)
        })
    }

    /// Moves the claim's times to ledger time measured now — after a lost statement, measured
    /// against whichever server answers now (see `time.rs`). The lease this call counts on stays
    /// the earlier of the two until the ledger is known to hold the later one: if the first send
    /// committed, the ledger holds the first stamp.
    ///
    /// # Errors
    /// The clock could not be measured again: the claim is not sent again on the old stamp.
    async fn restamp(&mut self) -> Result<(), LedgerError> {
        let (now, clock_trusted) = self.idem.ledger_time().await?;
        let request = &mut self.request;
        let before = request.now;
        let shift = |at: u64| clamp(at.saturating_sub(before).saturating_add(now));
        request.window_end = shift(request.window_end);
        request.expires_at = shift(request.expires_at);
        request.lease_until = shift(request.lease_until);
        request.now = now;
        request.clock_trusted = clock_trusted;
        self.lease.until.fetch_min(request.lease_until, Ordering::SeqCst);
        Ok(())
    }

    /// After a fresh claim under the current secret (`holds`), or a claim found in flight under
    /// it: an operation recorded under a previous secret (before a rotation) that is still live
    /// is this call's operation. A fresh claim is given back, and the call is answered by that
    /// record — so every answer names the operation that gave it, never a claim that yields to
    /// it. `None`: there is none.
    ///
    /// Every replica claims first and looks second, so of two replicas keying one operation
    /// under different secrets at once, at least one sees the other's claim and yields; if both
    /// do, neither runs and the caller is told to ask again.
    async fn earlier_operation(
        &self,
        keyring: &Keyring,
        at: &Derive<'_, 'a, '_>,
        holds: bool,
    ) -> Result<Option<(Self, Claim)>, Rejection> {
        for secret in &keyring.previous {
            let mut earlier = Self::prepare(self.idem, secret, at)?;
            let found = match self.idem.inner.ledger.lookup(&earlier.request.key, at.now).await {
                Ok(found) => found,
                // Found in flight: that answer stands.
                Err(_) if !holds => return Ok(None),
                Err(error) => {
                    tracing::error!(reference = %self.reference(), %error, "ledger unavailable; handler not run");
                    self.give_back().await;
                    return Err(unavailable(&error));
                }
            };
            // Live as a claim sees it (`ledger::superseded`, the rule `RecordView::judge` applies).
            let live = found.is_some_and(|report| match report.state {
                State::Completed => true,
                State::InProgress | State::Unknown => {
                    !superseded(report.state, !report.lease_expired, report.window_end, at.now, at.clock_trusted)
                }
                State::Failed => false,
            });
            if !live {
                continue;
            }
            tracing::info!(reference = %earlier.reference(), version = secret.version(),
                "the operation was recorded under a previous secret; answering from that record");
            if holds {
                self.give_back().await;
            }
            let claim = match earlier.claim(at).await {
                Ok(claim) => claim,
                Err(_) if !holds => return Ok(None),
                Err(rejection) => return Err(rejection),
            };
            if !holds && claim.won().is_some() {
                // This call found another's claim in flight under the current secret: it runs
                // nothing, whatever it won here. Undo it, and let the in-flight answer stand.
                earlier.give_back().await;
                return Ok(None);
            }
            if matches!(claim, Claim::Won { attempt: Won::Fresh, .. }) {
                // It settled as "nothing happened" meanwhile, or its claimer yielded to ours:
                // running now could race a replica that keys it under the other secret.
                earlier.give_back().await;
                return Err(Rejection::InFlight { reference: earlier.reference(), lease_left: None });
            }
            return Ok(Some((earlier, claim)));
        }
        Ok(None)
    }

    /// Gives a claim that runs nothing back — a fresh one is removed (nothing ran, and no record
    /// reads as an outcome), a takeover's lease lapses again — in the background if the ledger
    /// does not answer at once.
    async fn give_back(&self) {
        let (idem, request) = (self.idem, &self.request);
        match idem.inner.ledger.release(&request.key, request.token).await {
            Ok(()) | Err(LedgerError::Fenced) => {}
            Err(_) => idem.release_lost_claim(request),
        }
    }

    /// The operation a won claim runs as: what the handler (or reconcile function) sees.
    fn operation(&self, won: Won, window_end: u64) -> Operation {
        Operation {
            key: self.request.key,
            tool: self.tool,
            attempt: won,
            token: self.request.token,
            window_end,
            idem: self.idem.clone(),
            lease: Arc::clone(&self.lease),
            recorded: Arc::clone(&self.recorded),
            binding: Arc::clone(&self.binding),
        }
    }

    /// Runs what the claim won: the handler, or for a dead holder's claim under `reconcile`,
    /// first the reconcile function, and the handler only if it found nothing happened.
    ///
    /// # Errors
    /// The reconcile function could not tell: the operation is recorded (and answered) as unknown.
    async fn perform<T, E, F, Fut, R, RFut>(
        &self,
        won: Won,
        operation: Operation,
        watch: &Watch<'_>,
        reconcile: R,
        handler: F,
    ) -> Result<Result<T, E>, Rejection>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let (tool, reference) = (self.tool, self.reference());
        // Every won claim names the key its handler forwards: what an operator checks the
        // downstream system for, also after this process dies mid-call.
        let key = operation.idempotency_key();
        Ok(match won {
            Won::Reconcile => {
                tracing::warn!(tool, %reference, idempotency_key = %key, "stale lease; reconciling with the downstream");
                let asked = acting_for(watch.caller().clone(), reconcile(operation.clone()));
                match self.idem.drive(&self.request, &self.lease, &self.recorded, asked).await {
                    Err(panic) => self.unwind(panic, watch).await,
                    Ok(Reconciled::Happened(result)) => result,
                    Ok(Reconciled::NothingHappened) => self.run(operation, watch, handler).await,
                    Ok(Reconciled::StillUnknown) => {
                        self.end(Ending::Record(Outcome::Unknown)).await;
                        watch.completed(reference, Completion::Unknown);
                        return Err(Rejection::OutcomeUnknown { reference });
                    }
                }
            }
            Won::Takeover => {
                tracing::warn!(tool, %reference, idempotency_key = %key,
                    "stale lease taken over; running again under a new token");
                self.run(operation, watch, handler).await
            }
            Won::Fresh => {
                tracing::info!(tool, %reference, idempotency_key = %key, "claimed");
                self.run(operation, watch, handler).await
            }
        })
    }

    /// Runs the handler as `operation` of the watched caller (in scope for everything it calls)
    /// under `Idem::drive`, which renews the lease meanwhile. A panic records the outcome as
    /// unknown (the effect may have happened) and then continues unwinding.
    async fn run<T, E, F, Fut>(&self, operation: Operation, watch: &Watch<'_>, handler: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let handler = running_as(operation, watch.caller().clone(), handler());
        match self.idem.drive(&self.request, &self.lease, &self.recorded, handler).await {
            Ok(result) => result,
            Err(panic) => self.unwind(panic, watch).await,
        }
    }

    async fn unwind(&self, panic: Box<dyn std::any::Any + Send>, watch: &Watch<'_>) -> ! {
        let reference = self.reference();
        tracing::error!(%reference, "the handler panicked; recording the outcome as unknown");
        self.end(Ending::Record(Outcome::Unknown)).await;
        watch.completed(reference, Completion::Unknown);
        std::panic::resume_unwind(panic)
    }

    /// Stores the handler's result per its classification and hands it back with what was
    /// recorded ([`Completion::Superseded`]: refused, the claim had been taken over meanwhile).
    async fn record<T, E>(&self, result: Result<T, E>, won: Won) -> (Result<T, E>, Completion)
    where
        T: Serialize,
        E: IdempotentError,
    {
        let reference = self.reference();
        let outcome = match &result {
            Ok(value) => self.idem.results().completion::<T, E>(reference, Ok(value)),
            Err(error) => match error.classify() {
                ErrorClass::NothingHappened => Outcome::Failed,
                ErrorClass::Final => self.idem.results().completion::<T, E>(reference, Err(error)),
                ErrorClass::Unknown => Outcome::Unknown,
            },
        };
        // "Nothing happened" from a run that took over (or reconciled and ran) speaks for this run
        // only: the holder it replaced may have acted — or may still, if it is alive but late.
        // Give the lease back instead, so the operation stays in progress (same window, same
        // forwarded key) and its stale policy decides again.
        let give_back = outcome == Outcome::Failed && won != Won::Fresh;
        let (completion, ending) = match outcome {
            _ if give_back => (Completion::GivenBack, Ending::GiveBack),
            Outcome::Completed(_) => (Completion::Completed, Ending::Record(outcome)),
            Outcome::Failed => (Completion::Failed, Ending::Record(outcome)),
            Outcome::Unknown => (Completion::Unknown, Ending::Record(outcome)),
        };
        let fenced = self.end(ending).await;
        (result, if fenced { Completion::Superseded } else { completion })
    }

    /// Sends the call's ending to the ledger. A failure here is logged, never hidden behind the
    /// caller's result: the effect happened. A few quick retries while the caller waits, then
    /// more in the background until the lease would have run out twice over — a late result is
    /// still recorded under `hold` (its record went unknown, not to someone else), and a
    /// recorded result is what every repeat needs. Returns whether the claim turned out to be
    /// superseded (fenced) — its holder's result was not recorded.
    async fn end(&self, ending: Ending) -> bool {
        let timer = Timer::start();
        let reference = self.reference();
        let recorded = self.recorded.load(Ordering::SeqCst);
        let superseded = 'sent: {
            for pause in [50, 250, 0] {
                match ending.send(self.idem, &self.request, recorded).await {
                    Ok(sent) => break 'sent sent == Sent::Superseded,
                    Err(LedgerError::Unavailable { detail, .. } | LedgerError::Ambiguous { detail, .. }) => {
                        tracing::warn!(%reference, %detail, "could not record the outcome yet; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                    }
                    Err(error) => {
                        tracing::error!(%reference, %error, "could not record the outcome");
                        break 'sent false;
                    }
                }
            }
            self.idem.keep_recording(&self.request, &self.lease, ending, recorded);
            false
        };
        timer.completed(self.tool);
        superseded
    }

    /// The stored result of the operation that ends its window at `window_end`, read by its full
    /// key, if the ledger has one — never a later operation's under the same key.
    async fn stored_result(&self, window_end: u64) -> Option<Vec<u8>> {
        let idem = self.idem;
        match idem.inner.ledger.lookup(&self.request.key, idem.ledger_now()).await {
            Ok(Some(report)) if report.state == State::Completed && report.window_end == window_end => report.result,
            _ => None,
        }
    }

    /// A repeat's answer from a stored result, logged and counted as what it was: a replay, or
    /// an ERROR when the handler cannot read the result back (an operator's verdict of another
    /// shape, a result sealed under another key) — refused, and nothing runs.
    fn replayed<T: DeserializeOwned, E: IdempotentError>(
        &self,
        stored: Vec<u8>,
        watch: &Watch<'_>,
        what: &'static str,
    ) -> Result<Served<Result<T, E>>, Rejection> {
        let (tool, reference) = (self.tool, self.reference());
        self.replay(stored)
            .inspect(|_| {
                tracing::info!(tool, %reference, "{what}");
                watch.saw(reference, Seen::Replayed);
            })
            .inspect_err(|rejection| {
                tracing::error!(tool, %reference, %rejection, "the stored result cannot be read back; the repeat is refused");
                watch.saw(reference, Seen::Unreadable);
            })
    }

    /// The answer from a stored result: the first run's, marked as a replay.
    fn replay<T: DeserializeOwned, E: IdempotentError>(
        &self,
        stored: Vec<u8>,
    ) -> Result<Served<Result<T, E>>, Rejection> {
        let reference = self.reference();
        let value = self.idem.results().decode::<T, E>(stored, reference)?;
        Ok(Served { value, replayed: true, reference })
    }
}

fn unavailable(error: &LedgerError) -> Rejection {
    Rejection::ledger_unavailable(error)
}
