//! The [`Idem`] handle and the orchestration it runs: derive, claim, run, record, replay.
//!
//! One job per file, in the order a call meets them:
//!
//! - this file: where a method finds its handle ([`HasIdem`]; free functions use
//!   [`Idem::install`]).
//! - `settings`: what a handle is built with — [`Builder`], checked once by [`Builder::build`].
//! - `handle`: the handle itself — its ledger, settings and runtime state, each in its own type;
//!   its whole public front, for a door or a handler (`new`, `builder`, `call`,
//!   `call_reconciling`, `status`, `admin`, `install`, `installed`, `drain`); a tool's namespace
//!   and the registry that keeps two recipes from sharing keys.
//! - `keyring`: the secrets a handle keys with, checked against the ledger's check values and
//!   kept once they check out (a failure is tried again later, never kept).
//! - `arguments`: a call's arguments as its recipe selects them, and the scope they are keyed in.
//! - `time`: ledger time — this handle's clock measured against the ledger's.
//! - `call`: one call, top to bottom: arguments → key → claim → handler → record → answer.
//! - `operation`: what a running handler sees: its [`Operation`] and its caller.
//! - `background`: work beside a call (the lease renewer) and after it (releases of lost
//!   claims, completion retries), bounded per handle.
//! - `stored`: the stored-result format, its size limit and its seal ([`ResultSeal`]).
//! - `wait`: a repeat that waits for an operation in progress (`wait = "5s"`): one poller per
//!   operation and process, woken by a holder in the same process.
//! - `hooks`: watching a call's lifecycle — [`Hooks`] for audit logs, and the one set of call
//!   points that also feeds the metrics.
//! - `metrics` (feature `metrics`): the counters, histograms and gauge of every call.
//! - `admin`: the operator's verbs ([`Admin`]: inspect, resolve, stats, sweep; the startup checks
//!   `check_secret` and `register`; the raw ledger, namespace and clocks); `pending` lists what is
//!   unsettled.
//! - `sweeper`: [`Admin::sweep`] in the background, on a jittered schedule ([`Admin::spawn_sweeper`]).

mod admin;
mod arguments;
mod background;
mod call;
mod coalesce;
mod drain;
mod ending;
mod facts;
mod handle;
mod hooks;
mod keyring;
#[cfg(feature = "metrics")]
pub mod metrics;
mod operation;
mod owners;
mod pending;
#[cfg_attr(all(not(feature = "rmcp"), not(test)), expect(dead_code, reason = "only rmcp tools ask for input"))]
mod request_state;
mod settings;
mod status_error;
mod stored;
mod sweeper;
mod time;
mod wait;

pub use admin::{About, Admin};
pub(crate) use arguments::CallArguments;
#[doc(hidden)]
pub use arguments::derive;
pub(crate) use call::{Call, Ran};
pub use call::{Reconciled, Served};
pub use drain::Drained;
pub use facts::ToolFacts;
pub use handle::Idem;
pub use hooks::{CallEvent, Completion, Hooks};
pub use operation::{Operation, current_caller, current_operation, run_as};
pub use pending::{CursorError, PendingCursor, PendingFilter, PendingOperation, PendingPage};
#[cfg(feature = "rmcp")]
pub(crate) use request_state::EchoedState;
#[cfg(feature = "http-tower")]
pub(crate) use settings::DEFAULT_NAMESPACE;
pub use settings::{
    BuildError, Builder, DEFAULT_LEASE, DEFAULT_LEDGER_TIMEOUT, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETENTION,
    DEFAULT_SETTLE_GRACE, DEFAULT_UNSETTLED_RETENTION, DEFAULT_VERDICT_RETENTION,
};
pub use status_error::StatusError;
pub use stored::ResultSeal;
pub(crate) use stored::StoredValue;
pub use sweeper::{Sweeper, SweeperStats};

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
