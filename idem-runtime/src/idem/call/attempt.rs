//! One keyed attempt at a call, a method per step: the claim derived and sent (again after a lost
//! answer, and checked against operations under previous secrets during a rotation), the handler
//! or reconcile function run under the lease, the outcome recorded, a stored result replayed.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Ran, Reconciled, Served, unavailable};
use crate::idem::Idem;
use crate::idem::arguments::Derive;
use crate::idem::ending::Ending;
use crate::idem::hooks::{Completion, Seen, Timer, Watch};
use crate::idem::keyring::Keyring;
use crate::idem::operation::{LeaseState, Operation, acting_for, running_as};
use crate::idem::request_state::Binding;
use crate::idem::time::{clamp, millis};
use crate::key::{Fingerprint, Ref};
use crate::ledger::{Claim, ClaimRequest, LedgerError, Outcome, State, Token, Won, seal_label, superseded};
use crate::rejection::{ErrorClass, IdempotentError, Rejection};
use crate::secret::Secret;

/// One keyed attempt at a call: the claim it sends and, once won, the lease it holds.
pub(super) struct Attempt<'a> {
    idem: &'a Idem,
    tool: &'static str,
    /// The claim, derived under one secret.
    pub(super) request: ClaimRequest,
    /// The arguments' fingerprint, to name what differs in a conflict (its argument tags are
    /// computed by [`Attempt::complete_request`]).
    pub(super) fingerprint: Fingerprint<'a>,
    /// Whether `request` carries the argument tags and the label: it is sent to the ledger.
    complete: bool,
    /// What the renewer knows of the lease, once the claim is won.
    lease: Arc<LeaseState>,
    /// Set once the handler recorded the result in its own transaction.
    recorded: Arc<AtomicBool>,
    /// What a `requestState` the operation sends is sealed to.
    pub(super) binding: Arc<Binding>,
}

impl<'a> Attempt<'a> {
    /// Derives the claim for a call under `secret`, or the rejection that stops it before the
    /// ledger.
    pub(super) fn prepare(idem: &'a Idem, secret: &Secret, at: &Derive<'_, 'a, '_>) -> Result<Self, Rejection> {
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
    pub(super) fn bind_earlier_secrets(&mut self, keyring: &Keyring, at: &Derive<'_, 'a, '_>) -> Result<(), Rejection> {
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
    pub(super) fn complete_request(&mut self, at: &Derive<'_, 'a, '_>) {
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

    pub(super) fn reference(&self) -> Ref {
        self.request.key.reference()
    }

    /// Sends the claim; a claim that fails is sent once more with the same token (a pooled
    /// connection the server dropped fails one statement; if the first send committed, the
    /// ledger recognises it as ours and says how it won) and its times stamped again (the
    /// server that answers it may be a promoted standby, with another clock). A claim that still
    /// fails after a send whose answer was lost is released in the background.
    pub(super) async fn claim(&mut self, at: &Derive<'_, 'a, '_>) -> Result<Claim, Rejection> {
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
    pub(super) async fn earlier_operation(
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
    pub(super) fn operation(&self, won: Won, window_end: u64) -> Operation {
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
    pub(super) async fn run<T, E, A, F, Fut, R, RFut>(
        &self,
        won: Won,
        operation: Operation,
        watch: &Watch<'_>,
        reconcile: R,
        handler: F,
    ) -> Result<Ran<T, E, A>, Rejection>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Ran<T, E, A>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let (tool, reference) = (self.tool, self.reference());
        // Every won claim names the key its handler forwards: what an operator checks the
        // downstream system for, also after this process dies mid-call. Derived only for a
        // log line that is written.
        let key = Lazy(|| operation.idempotency_key());
        Ok(match won {
            Won::Reconcile => {
                tracing::warn!(tool, %reference, idempotency_key = %key, "stale lease; reconciling with the downstream");
                let asked = acting_for(watch.caller().clone(), reconcile(operation.clone()));
                match self.idem.drive(&self.request, &self.lease, &self.recorded, asked).await {
                    Err(panic) => self.unwind(panic, watch).await,
                    Ok(Reconciled::Happened(result)) => Ran::Outcome(result),
                    Ok(Reconciled::NothingHappened) => self.run_handler(operation, watch, handler).await,
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
                self.run_handler(operation, watch, handler).await
            }
            Won::Fresh => {
                tracing::info!(tool, %reference, idempotency_key = %key, "claimed");
                self.run_handler(operation, watch, handler).await
            }
        })
    }

    /// Runs the handler as `operation` of the watched caller (in scope for everything it calls)
    /// under `Idem::drive`, which renews the lease meanwhile. A panic records the outcome as
    /// unknown (the effect may have happened) and then continues unwinding.
    async fn run_handler<T, E, A, F, Fut>(&self, operation: Operation, watch: &Watch<'_>, handler: F) -> Ran<T, E, A>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Ran<T, E, A>>,
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

    /// Stores the handler's result per its classification (an unrecorded answer as "nothing
    /// happened") and hands it back with what was recorded ([`Completion::Superseded`]:
    /// refused, the claim had been taken over meanwhile).
    pub(super) async fn record<T, E, A>(&self, ran: Ran<T, E, A>, won: Won) -> (Ran<T, E, A>, Completion)
    where
        T: Serialize,
        E: IdempotentError,
    {
        let reference = self.reference();
        let outcome = match &ran {
            Ran::Outcome(Ok(value)) => self.idem.results().completion::<T, E>(reference, Ok(value)),
            Ran::Outcome(Err(error)) => match error.classify() {
                ErrorClass::NothingHappened => Outcome::Failed,
                ErrorClass::Final => self.idem.results().completion::<T, E>(reference, Err(error)),
                ErrorClass::Unknown => Outcome::Unknown,
            },
            Ran::Unrecorded(_) => Outcome::Failed,
        };
        // "Nothing happened" from a run that took over (or reconciled and ran) speaks for this run
        // only: the holder it replaced may have acted — or may still, if it is alive but late.
        // Give the lease back instead, so the operation stays in progress (same window, same
        // forwarded key) and its stale policy decides again.
        let give_back = outcome == Outcome::Failed && won != Won::Fresh;
        let ending = if give_back { Ending::GiveBack } else { Ending::Record(outcome) };
        (ran, self.end(ending).await)
    }

    /// Sends the call's ending to the ledger. A failure here is logged, never hidden behind the
    /// caller's result: the effect happened. A few quick retries while the caller waits, then
    /// more in the background until the lease would have run out twice over — a late result is
    /// still recorded under `hold` (its record went unknown, not to someone else), and a
    /// recorded result is what every repeat needs. Returns how the call ended: as the ending
    /// records (also while the background still sends it), or superseded (fenced) — its
    /// holder's result was not recorded.
    async fn end(&self, ending: Ending) -> Completion {
        let timer = Timer::start();
        let reference = self.reference();
        let recorded = self.recorded.load(Ordering::SeqCst);
        let completion = ending.completion();
        let ended = 'sent: {
            for pause in [50, 250, 0] {
                match ending.send(self.idem, &self.request, recorded).await {
                    Ok(ended) => break 'sent ended,
                    Err(LedgerError::Unavailable { detail, .. } | LedgerError::Ambiguous { detail, .. }) => {
                        tracing::warn!(%reference, %detail, "could not record the outcome yet; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                    }
                    Err(error) => {
                        tracing::error!(%reference, %error, "could not record the outcome");
                        break 'sent completion;
                    }
                }
            }
            self.idem.keep_recording(&self.request, &self.lease, ending, recorded);
            completion
        };
        timer.completed(self.tool);
        ended
    }

    /// The stored result of the operation that ends its window at `window_end`, read by its full
    /// key, if the ledger has one — never a later operation's under the same key.
    pub(super) async fn stored_result(&self, window_end: u64) -> Option<Vec<u8>> {
        let idem = self.idem;
        match idem.inner.ledger.lookup(&self.request.key, idem.ledger_now()).await {
            Ok(Some(report)) if report.state == State::Completed && report.window_end == window_end => report.result,
            _ => None,
        }
    }

    /// A repeat's answer from a stored result, logged and counted as what it was: a replay, or
    /// an ERROR when the handler cannot read the result back (an operator's verdict of another
    /// shape, a result sealed under another key) — refused, and nothing runs.
    pub(super) fn replayed<T: DeserializeOwned, E: IdempotentError, A>(
        &self,
        stored: Vec<u8>,
        watch: &Watch<'_>,
        what: &'static str,
    ) -> Result<Served<Ran<T, E, A>>, Rejection> {
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
    pub(super) fn replay<T: DeserializeOwned, E: IdempotentError, A>(
        &self,
        stored: Vec<u8>,
    ) -> Result<Served<Ran<T, E, A>>, Rejection> {
        let reference = self.reference();
        let value = self.idem.results().decode::<T, E>(stored, reference)?;
        Ok(Served { value: Ran::Outcome(value), replayed: true, reference })
    }
}

/// A value written to a log line only if the line is written: `Lazy(|| derive())` displays
/// what `derive` returns, computed when (and each time) it is displayed.
struct Lazy<F>(F);

impl<F: Fn() -> D, D: std::fmt::Display> std::fmt::Display for Lazy<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.0)().fmt(f)
    }
}
