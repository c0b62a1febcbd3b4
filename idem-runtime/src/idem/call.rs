//! One call, top to bottom: its arguments → its key → the claim → the handler → the record →
//! the answer. [`Idem::call`] and [`Idem::call_reconciling`] (declared in `handle.rs`) and
//! `#[idempotent]` all enter at `Idem::execute`, which reads as the list of steps. Once a call is
//! keyed, each step is one method of an `Attempt`: the handle, the claim it sends, and the lease
//! it holds if it wins.

mod attempt;

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::key::Ref;
use crate::ledger::{Claim, LedgerError, Won};
use crate::recipe::Recipe;
use crate::rejection::{IdempotentError, Rejection};
use crate::scope::{Caller, Scope};

use self::attempt::Attempt;
use super::Idem;
use super::arguments::{CallArguments, Derive, scope_of};
use super::coalesce::{Begin, Held};
use super::hooks::{Completion, Seen, Watch};
use super::keyring::{Check, Keyring, no_secret};
use super::operation::{Operation, caller_of};
use super::owners::{self, Ownership};
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

/// How a run of the handler ended: with an outcome, recorded per its classification, or with
/// an answer for its caller that records nothing — an MCP tool's input request, a continuation
/// idem refused inside the won claim — after which the claim is let go as after "nothing
/// happened". A door without such answers uses `Ran<T, E, Infallible>`.
pub(crate) enum Ran<T, E, A> {
    /// The handler's result.
    Outcome(Result<T, E>),
    /// Nothing to record: this goes back to the caller as it is.
    Unrecorded(A),
}

/// One call, as a door hands it to the engine ([`Idem::execute`]): the recipe, who calls, the
/// arguments, and the handler — with, for a `reconcile` recipe, what to ask the downstream
/// when a dead holder's claim is found. What the door answers is its own: the engine's answer
/// is `Served<Ran<..>>` or a [`Rejection`] for every door.
pub(crate) struct Call<'a, R, F> {
    pub(crate) recipe: &'a Recipe,
    /// The caller the door names, if any.
    pub(crate) caller: Option<&'a Caller>,
    /// Whether a call without one may run as the caller in scope or the local identity (never
    /// a request that came over HTTP).
    pub(crate) fallback: bool,
    /// The arguments as the recipe sees them, or why they cannot be keyed.
    pub(crate) arguments: Result<CallArguments, Rejection>,
    pub(crate) reconcile: R,
    pub(crate) handler: F,
}

/// What a claim came to: won, for this call to run, or answered from the ledger.
#[expect(clippy::large_enum_variant, reason = "made once per call and moved once: a box would allocate on every call")]
enum Claimed<'a, T, E, A> {
    /// Won (with the coalesced calls' claim held until the outcome is recorded).
    Won { attempt: Attempt<'a>, won: Won, window_end: u64, held: Option<Held> },
    /// A replay.
    Answered(Served<Ran<T, E, A>>),
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
    /// The one engine every door hands its [`Call`] to ([`Idem::call`], `#[idempotent]`, the
    /// MCP tools, the HTTP layer), read as the list of a call's steps. Without a caller, the
    /// one in scope or the local identity — if the call allows the fallback. The handler and a
    /// reconcile function run with the caller in scope; a repeat is answered `Ran::Outcome`
    /// with the stored result.
    pub(crate) async fn execute<T, E, A, F, Fut, R, RFut>(
        &self,
        call: Call<'_, R, F>,
    ) -> Result<Served<Ran<T, E, A>>, Rejection>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Ran<T, E, A>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let Call { recipe, caller, fallback, arguments, reconcile, handler } = call;
        // Counted until the outcome is recorded; refused once the handle drains.
        let _underway = self.inner.drain.enter()?;
        // Arguments → key.
        let tool = recipe.tool();
        let arguments = arguments?;
        let namespace = self.namespace(recipe);
        // Its handler, declared in the ledger's catalogue: a second one of the tool is refused.
        let declared = self
            .declare(recipe, arguments.owner.as_deref(), None)
            .map_err(|clash| owners::refusal(namespace, tool, clash))?;
        let keyring = self.keyring(Check::Keep).await.map_err(|error| {
            #[cfg(feature = "metrics")]
            super::metrics::secret_refused(tool);
            no_secret(&error)
        })?;
        // The ledger keeps this secret version's operations live as long as this call's may be.
        self.keep_secret_live(&keyring, recipe.window_duration()).await?;
        let caller = caller_of(self, caller, fallback)?;
        let watch = Watch::new(self, recipe, &caller);
        // The ledger's record of owners, asked at the handler's first call and every minute.
        let result_schema = arguments.result_schema.or(recipe.result_schema_fn());
        Ownership::of(self, recipe, namespace, declared, result_schema).check().await.inspect_err(|rejection| {
            if matches!(rejection, Rejection::LedgerUnavailable { .. }) {
                watch.unavailable();
            }
        })?;
        let scope = scope_of(recipe, &caller, &arguments)?;
        // Key → claim.
        let (attempt, won, window_end, held) =
            match self.claim_until_won(recipe, &keyring, &arguments, &scope, &watch).await? {
                Claimed::Won { attempt, won, window_end, held } => (attempt, won, window_end, held),
                Claimed::Answered(served) => return Ok(served),
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
        let result = attempt.run(won, operation, &watch, reconcile, handler).await?;
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

    /// Key → claim: derives the call's key and claims it, until it is won or answered from the
    /// ledger — a replay, or, with `wait`, a replay after the operation in flight settled. In
    /// flight, unknown and conflict are refusals.
    async fn claim_until_won<'a, T, E, A>(
        &'a self,
        recipe: &Recipe,
        keyring: &Keyring,
        arguments: &'a CallArguments,
        scope: &Scope,
        watch: &Watch<'_>,
    ) -> Result<Claimed<'a, T, E, A>, Rejection>
    where
        T: DeserializeOwned,
        E: IdempotentError,
    {
        let tool = recipe.tool();
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
        loop {
            let (now, clock_trusted) = self.ledger_time().await.map_err(|error| {
                tracing::error!(tool, %error, "the ledger's clock could not be read; handler not run");
                watch.unavailable();
                unavailable(&error)
            })?;
            let at = Derive { recipe, scope, arguments, now, clock_trusted };
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
                    attempt.earlier_operation(keyring, &at, holds).await.inspect_err(|r| watch.refused(r))?
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
                        attempt.bind_earlier_secrets(keyring, &at)?;
                    }
                    return Ok(Claimed::Won { attempt, won, window_end, held });
                }
                Claim::Replay { result } => return attempt.replayed(result, watch, "replay").map(Claimed::Answered),
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
                            return attempt
                                .replayed(result.to_vec(), watch, "replay after a wait")
                                .map(Claimed::Answered);
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
        }
    }
}

fn unavailable(error: &LedgerError) -> Rejection {
    Rejection::ledger_unavailable(error)
}
