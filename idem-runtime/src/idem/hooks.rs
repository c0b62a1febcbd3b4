//! Watching a call's lifecycle: the [`Hooks`] trait an audit log implements, the [`CallEvent`]
//! it is given, and `Watch`, the one set of call points `call.rs` reports to — which feeds the
//! handle's hooks (if set) and the built-in metrics (feature `metrics`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::key::Ref;
use crate::ledger::Won;
use crate::recipe::Recipe;
use crate::rejection::Rejection;
use crate::scope::Caller;

use super::Idem;

/// An observer of each call's lifecycle, for audit logs and bookkeeping: set it on the handle
/// with [`Builder::hooks`](super::Builder::hooks). Every method does nothing unless overridden.
///
/// Each call that reaches the ledger meets exactly one of `on_claim`, `on_takeover`,
/// `on_reconcile` (its claim won: it runs), `on_replay`, `on_unreadable`, `on_in_flight`,
/// `on_conflict` or `on_unknown` (a repeat answered from the ledger); a call that won its claim then meets
/// `on_complete` once its outcome is sent to the ledger — unless the call itself is dropped
/// first (its process dies, its future is cancelled): then the record stays in progress until
/// its lease lapses, and a later call's `on_takeover`, `on_reconcile` or `on_unknown` says so. (A call refused before the ledger — no caller,
/// invalid arguments — or because the ledger could not be reached meets none: nothing ran and
/// no operation exists; the `ledger_unavailable` metric and the log count those.) A repeat that
/// waits (`wait`) meets only the answer it finally gets.
///
/// Events name the operation (its ref), the tool, the namespace and the authenticated caller —
/// never an argument's value or a result: a hook cannot leak what the key keeps secret.
///
/// Hooks are called inline on the call's path, synchronously: keep them quick (hand the event
/// to a channel for anything slow). A hook cannot break a call: a panic in one is caught,
/// logged (`tracing` error) and the call goes on — unless the program is built with
/// `panic = "abort"`, where no panic can be caught.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::hooks::{CallEvent, Completion, Hooks};
/// use idem_runtime::{Idem, MemoryLedger};
///
/// struct AuditLog;
///
/// impl Hooks for AuditLog {
///     fn on_claim(&self, event: &CallEvent<'_>) {
///         tracing::info!(target: "audit", reference = %event.reference, tool = event.tool,
///             tenant = event.caller.tenant(), subject = event.caller.subject(), "started");
///     }
///     fn on_complete(&self, event: &CallEvent<'_>, completion: Completion) {
///         tracing::info!(target: "audit", reference = %event.reference, ?completion, "recorded");
///     }
/// }
///
/// let idem = Idem::builder(MemoryLedger::new()).hooks(Arc::new(AuditLog)).build()?;
/// # let _ = idem;
/// # Ok::<(), idem_runtime::settings::BuildError>(())
/// ```
pub trait Hooks: Send + Sync + 'static {
    /// A first claim won (no live record): the handler runs now.
    fn on_claim(&self, _event: &CallEvent<'_>) {}
    /// A dead holder's lease was taken over (`stale = "takeover"`): the handler runs again,
    /// under a new fencing token.
    fn on_takeover(&self, _event: &CallEvent<'_>) {}
    /// A dead holder's lease was claimed to reconcile it (`stale = "reconcile"`): the reconcile
    /// function asks the downstream before anything runs.
    fn on_reconcile(&self, _event: &CallEvent<'_>) {}
    /// A repeat was answered with the stored result of an earlier call.
    fn on_replay(&self, _event: &CallEvent<'_>) {}
    /// A repeat found a stored result its handler cannot read back (an operator's verdict of
    /// another shape, a result sealed under another key) and was refused: nothing ran, and the
    /// operation needs its operator.
    fn on_unreadable(&self, _event: &CallEvent<'_>) {}
    /// A repeat found the operation running and was told so ("in flight").
    fn on_in_flight(&self, _event: &CallEvent<'_>) {}
    /// A call with the key of an operation made with other arguments was refused.
    fn on_conflict(&self, _event: &CallEvent<'_>) {}
    /// A repeat found the operation's outcome unknown and was told to check, not retry.
    fn on_unknown(&self, _event: &CallEvent<'_>) {}
    /// The outcome of a call that won its claim, as it was sent to the ledger.
    fn on_complete(&self, _event: &CallEvent<'_>, _completion: Completion) {}
}

/// What one call is about: the operation's ref, the tool, the namespace and who called. Never
/// an argument's value or a result.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CallEvent<'a> {
    /// The operation's ref (what [`Idem::status`] and [`Admin::inspect`](super::Admin::inspect) take).
    pub reference: Ref,
    /// The tool's name.
    pub tool: &'a str,
    /// The namespace its key is derived in ([`Admin::namespace`](crate::admin::Admin::namespace)).
    pub namespace: &'a str,
    /// The authenticated caller (tenant and subject).
    pub caller: &'a Caller,
}

/// How a call that won its claim ended, as recorded ([`Hooks::on_complete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// Its result (or a final error) is stored; every repeat gets it.
    Completed,
    /// Nothing happened (an error classified so); the next repeat runs again.
    Failed,
    /// The effect may or may not have happened (an error classified so, a panic, a result too
    /// large to store, a reconcile that could not tell): repeats are told "outcome unknown".
    Unknown,
    /// A run that took over a dead holder's lease found nothing happened: it gave the lease
    /// back, and the operation stays in progress for its stale policy to decide again (the
    /// holder it replaced may have acted).
    GivenBack,
    /// The claim had been taken over while the handler ran: its outcome was refused, and the
    /// call is answered with the new holder's.
    Superseded,
}

impl Completion {
    /// The label of this completion in metrics: `completed`, `failed`, `unknown`,
    /// `given_back`, `superseded`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::GivenBack => "given_back",
            Self::Superseded => "superseded",
        }
    }
}

/// What a call saw of the ledger: the answer to its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Won(Won),
    Replayed,
    Unreadable,
    InFlight,
    Conflict,
    Unknown,
}

impl Seen {
    /// The `outcome` label of `idem_calls_total` (and the name a panicking hook is logged under).
    pub(super) const fn label(self) -> &'static str {
        match self {
            Self::Won(Won::Fresh) => "claimed",
            Self::Won(Won::Takeover) => "takeover",
            Self::Won(Won::Reconcile) => "reconciled",
            Self::Replayed => "replayed",
            Self::Unreadable => "unreadable_result",
            Self::InFlight => "in_flight",
            Self::Conflict => "conflict",
            Self::Unknown => "unknown",
        }
    }
}

/// One call as its observers see it: where `call.rs` reports what happens, once per event.
/// Without hooks and without the `metrics` feature, each report is one `Option` check.
pub(super) struct Watch<'a> {
    hooks: Option<&'a dyn Hooks>,
    tool: &'static str,
    namespace: &'a str,
    caller: &'a Caller,
}

impl<'a> Watch<'a> {
    /// An observer of a call of `recipe` by `caller`, on `idem`'s hooks.
    pub(super) fn new(idem: &'a Idem, recipe: &'a Recipe, caller: &'a Caller) -> Self {
        let hooks = idem.inner.settings.hooks.as_deref();
        Watch { hooks, tool: recipe.tool(), namespace: idem.namespace(recipe), caller }
    }

    /// The caller, for the handler's scope.
    pub(super) fn caller(&self) -> &Caller {
        self.caller
    }

    /// The answer to the call's claim.
    pub(super) fn saw(&self, reference: Ref, seen: Seen) {
        #[cfg(feature = "metrics")]
        super::metrics::call(self.tool, seen.label());
        self.hook(reference, seen.label(), |hooks, event| match seen {
            Seen::Won(Won::Fresh) => hooks.on_claim(event),
            Seen::Won(Won::Takeover) => hooks.on_takeover(event),
            Seen::Won(Won::Reconcile) => hooks.on_reconcile(event),
            Seen::Replayed => hooks.on_replay(event),
            Seen::Unreadable => hooks.on_unreadable(event),
            Seen::InFlight => hooks.on_in_flight(event),
            Seen::Conflict => hooks.on_conflict(event),
            Seen::Unknown => hooks.on_unknown(event),
        });
    }

    /// The ledger could not be reached: nothing ran (metrics only; no operation exists).
    pub(super) fn unavailable(&self) {
        #[cfg(feature = "metrics")]
        super::metrics::call(self.tool, "ledger_unavailable");
    }

    /// A call refused after its claim (answered from an earlier secret's record, or the ledger
    /// failed meanwhile): reported as what it was told.
    pub(super) fn refused(&self, rejection: &Rejection) {
        match rejection {
            Rejection::InFlight { reference, .. } => self.saw(*reference, Seen::InFlight),
            Rejection::LedgerUnavailable { .. } => self.unavailable(),
            _ => {}
        }
    }

    /// The outcome of a won claim, sent to the ledger.
    pub(super) fn completed(&self, reference: Ref, completion: Completion) {
        #[cfg(feature = "metrics")]
        super::metrics::completion(self.tool, completion.as_str());
        self.hook(reference, "on_complete", |hooks, event| hooks.on_complete(event, completion));
    }

    /// A won claim runs until the returned guard is dropped (recorded, panicked or cancelled):
    /// the in-progress gauge.
    pub(super) fn running(&self) -> Running {
        Running::start(self.tool)
    }

    fn hook(&self, reference: Ref, which: &'static str, call: impl FnOnce(&dyn Hooks, &CallEvent<'_>)) {
        let Some(hooks) = self.hooks else { return };
        let event = CallEvent { reference, tool: self.tool, namespace: self.namespace, caller: self.caller };
        if catch_unwind(AssertUnwindSafe(|| call(hooks, &event))).is_err() {
            tracing::error!(tool = self.tool, %reference, hook = which, "a hook panicked; the call goes on");
        }
    }
}

#[cfg(feature = "metrics")]
pub(super) use super::metrics::{Running, Timer};

/// Without the `metrics` feature: nothing to time or count.
#[cfg(not(feature = "metrics"))]
pub(super) struct Running;

#[cfg(not(feature = "metrics"))]
impl Running {
    fn start(_tool: &'static str) -> Self {
        Self
    }
}

/// Without the `metrics` feature: nothing to time.
#[cfg(not(feature = "metrics"))]
pub(super) struct Timer;

#[cfg(not(feature = "metrics"))]
impl Timer {
    pub(super) fn start() -> Self {
        Self
    }

    pub(super) fn claimed(self, _tool: &'static str) {}

    pub(super) fn completed(self, _tool: &'static str) {}
}
