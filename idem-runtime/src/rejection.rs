//! What idem answers instead of running a handler, and how a handler's errors are classified.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::canonical::CanonicalError;
use crate::key::Ref;

/// The name of the status tool that answers for a ref; rejections tell agents to call it.
pub const STATUS_TOOL: &str = "idem_status";

/// Why idem answered a call without running its handler (or without its stored result).
///
/// Each message is written for the model or operator who reads it: it says whether anything was
/// executed and what to do next. [`Rejection::code`] is the machine-readable form.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Rejection {
    /// The same operation is running now (another call holds its claim).
    InFlight {
        /// The operation's ref.
        reference: Ref,
        /// How long the holder's lease still ran when this answer was given (at most the
        /// handle's lease): by then the operation has settled, or its holder is presumed dead and
        /// the tool's stale policy decides. Zero for a lease that has run out on a clock that
        /// cannot be trusted to act on it; `None` where it is not known. Over HTTP it is the
        /// answer's `Retry-After`.
        lease_left: Option<Duration>,
    },
    /// The same key was used with different arguments.
    Conflict {
        /// The ref of the existing operation.
        reference: Ref,
        /// Names of this call's arguments whose values differ from the stored operation's.
        differing: Vec<String>,
        /// How many of the stored operation's arguments this call does not have.
        missing: usize,
    },
    /// The operation ran but its outcome cannot be known (a downstream timeout, a dead holder
    /// under the `hold` policy).
    OutcomeUnknown {
        /// The operation's ref.
        reference: Ref,
    },
    /// The ledger could not be reached; the handler did not run.
    LedgerUnavailable {
        /// The backend's words, for operators: logged with the incident, never shown to the
        /// caller (they name hosts, users, relations).
        detail: String,
        /// A random ref that names this failure in the server's log, to correlate a caller's
        /// report with it.
        incident: Ref,
    },
    /// The call came without an authenticated caller (over HTTP: the request had no
    /// authenticated principal), so its key cannot be scoped; the handler did not run. Calling
    /// again helps only once the client authenticates.
    NoCaller,
    /// A local request (stdio) on a server started without a local caller
    /// ([`Builder::local_caller`](crate::settings::Builder::local_caller)): nothing authenticates such
    /// requests, so no key can be scoped and the handler did not run. Only the server's operator
    /// can fix it; retrying cannot.
    NoLocalCaller,
    /// The arguments cannot be canonicalised (NaN, an integer beyond the 64-bit range that a
    /// double cannot hold, too deep); the handler did not run.
    InvalidArguments {
        /// What is wrong, and where.
        error: CanonicalError,
    },
    /// The server is shutting down ([`Idem::drain`](crate::Idem::drain)): the handler did not
    /// run, and retrying (on another replica, or on this one once restarted) is safe.
    ShuttingDown,
    /// Two different handlers serve one tool name in one namespace on this ledger — on one
    /// handle, on two handles, or in two processes or binaries — so they would share keys and
    /// replay each other's results. Every call of either is refused once both have been seen,
    /// whichever came first. A server bug; the message says how to fix it.
    DuplicateTool {
        /// The namespace.
        namespace: String,
        /// The tool name.
        tool: String,
        /// The other handler (or handlers): its path, `name = "..."` for a pinned or hand-built
        /// recipe, or where its recipe is declared when both are on one handle.
        first: String,
        /// The refused handler, named the same way.
        second: String,
    },
    /// A continuation of a multi-round-trip request (MCP `inputResponses` / `requestState`)
    /// whose `requestState` this server did not issue for this caller, tool and arguments, was
    /// altered, or is missing while input responses are given; the handler did not run.
    RequestStateInvalid {
        /// What is wrong with it, in words for the caller.
        why: &'static str,
    },
    /// A continuation whose `requestState` has expired; the handler did not run.
    RequestStateExpired,
    /// A continuation whose `requestState` was already used by an earlier continuation (the
    /// tool accepts each at most once: `single_use_state`); the handler did not run.
    RequestStateUsed,
    /// The tool keys its operations by a key of the client's own (`_meta["idempotency-key"]`),
    /// and the call sent none (when it is required) or one that is not a non-empty string of at
    /// most 255 characters; the handler did not run.
    ClientKey {
        /// What is wrong with it, in words for the caller.
        why: &'static str,
    },
    /// The operation completed, but its stored result no longer decodes as the handler's result
    /// type (the code changed since it was stored).
    UnreadableResult {
        /// The operation's ref.
        reference: Ref,
        /// The decoder's words.
        detail: String,
    },
}

impl Rejection {
    /// "The ledger is unavailable": logs `detail` at error level under a new incident ref, and
    /// returns the refusal that shows the caller only the ref.
    #[must_use]
    pub fn ledger_unavailable(detail: impl fmt::Display) -> Self {
        let detail = detail.to_string();
        Self::LedgerUnavailable { incident: incident(&detail), detail }
    }

    /// A stable machine-readable code: `in_flight`, `conflict`, `outcome_unknown`,
    /// `ledger_unavailable`, `no_caller`, `no_local_caller`, `shutting_down`, `invalid_arguments`,
    /// `duplicate_tool`, `request_state_invalid`, `request_state_expired`, `request_state_used`,
    /// `invalid_client_key` or `unreadable_result`.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::InFlight { .. } => "in_flight",
            Self::Conflict { .. } => "conflict",
            Self::OutcomeUnknown { .. } => "outcome_unknown",
            Self::LedgerUnavailable { .. } => "ledger_unavailable",
            Self::NoCaller => "no_caller",
            Self::NoLocalCaller => "no_local_caller",
            Self::ShuttingDown => "shutting_down",
            Self::InvalidArguments { .. } => "invalid_arguments",
            Self::DuplicateTool { .. } => "duplicate_tool",
            Self::RequestStateInvalid { .. } => "request_state_invalid",
            Self::RequestStateExpired => "request_state_expired",
            Self::RequestStateUsed => "request_state_used",
            Self::UnreadableResult { .. } => "unreadable_result",
            Self::ClientKey { .. } => "invalid_client_key",
        }
    }

    /// The ref of the operation this answer is about, if one was derived.
    #[must_use]
    pub const fn reference(&self) -> Option<Ref> {
        match self {
            Self::InFlight { reference, .. }
            | Self::Conflict { reference, .. }
            | Self::OutcomeUnknown { reference }
            | Self::UnreadableResult { reference, .. } => Some(*reference),
            Self::LedgerUnavailable { .. }
            | Self::NoCaller
            | Self::NoLocalCaller
            | Self::ShuttingDown
            | Self::InvalidArguments { .. }
            | Self::DuplicateTool { .. }
            | Self::RequestStateInvalid { .. }
            | Self::RequestStateExpired
            | Self::RequestStateUsed
            | Self::ClientKey { .. } => None,
        }
    }

    /// Whether a plain retry of the same call is safe and useful.
    #[must_use]
    pub const fn retry_is_safe(&self) -> bool {
        matches!(self, Self::LedgerUnavailable { .. } | Self::ShuttingDown)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InFlight { reference, .. } => write!(
                f,
                "in flight, ref {reference}: this operation is already in progress. Do not submit it \
                 again; call `{STATUS_TOOL}` with ref {reference} for its outcome"
            ),
            Self::Conflict { reference, differing, missing } => {
                write!(f, "conflict, ref {reference}: an operation with the same key but different arguments exists")?;
                if !differing.is_empty() {
                    write!(f, "; differing: {}", differing.join(", "))?;
                }
                if *missing > 0 {
                    write!(f, "; {missing} argument(s) of the earlier call are missing")?;
                }
                f.write_str(
                    ". Nothing was executed. Repeat the earlier arguments exactly, or change a key \
                     argument if this is a new operation",
                )
            }
            Self::OutcomeUnknown { reference } => write!(
                f,
                "outcome unknown, ref {reference}: the operation may or may not have taken effect. Do not \
                 retry; call `{STATUS_TOOL}` with ref {reference}, or ask an operator to resolve it"
            ),
            Self::LedgerUnavailable { incident, .. } => write!(
                f,
                "nothing was executed: the idempotency ledger is unavailable. It is safe to retry this call \
                 later (incident {incident} in the server's log)"
            ),
            Self::NoCaller => f.write_str(
                "nothing was executed: the call came without an authenticated caller, so it cannot be made safe \
                 to repeat. Repeating it unchanged will not help: the client must authenticate (send its \
                 credentials with the request) before calling again",
            ),
            Self::NoLocalCaller => f.write_str(
                "nothing was executed: this server was started without a caller for local requests, so none of \
                 its calls can be made safe to repeat. Retrying will not help: the server's operator must \
                 configure one (`Idem::builder(…).local_caller(…)`) and restart it",
            ),
            Self::ShuttingDown => f.write_str(
                "nothing was executed: this server is shutting down. It is safe to retry this call in a moment \
                 (another replica takes it, or this one once it has restarted)",
            ),
            Self::InvalidArguments { error } => write!(f, "nothing was executed: {error}"),
            Self::DuplicateTool { namespace, tool, first, second } if instances_of_one(first, second) => write!(
                f,
                "nothing was executed: two instances of one generic handler serve tool `{tool}` in namespace \
                 `{namespace}` on this ledger (`{second}` and `{first}`); they run different code, so they would \
                 share keys and replay each other's results; both are refused. One `name` cannot tell them apart: \
                 serve each instance on a handle with its own namespace (`Idem::builder(…).namespace(…)`), or \
                 give each type a handler of its own with its own `#[idempotent(name = \"...\")]`"
            ),
            Self::DuplicateTool { namespace, tool, first, second } => write!(
                f,
                "nothing was executed: two different handlers serve tool `{tool}` in namespace `{namespace}` on \
                 this ledger (`{second}` and `{first}`), so they would share keys and replay each other's \
                 results; both are refused. Give one its own tool name with `#[idempotent(name = \"...\")]`, or \
                 serve them in different namespaces (`Idem::builder(…).namespace(…)`). If one is the other moved or \
                 renamed in code, pin the tool with `#[idempotent(name = \"{tool}\")]` so that moves never \
                 change it again, and forget the old handler: `idem tools forget {namespace} {tool}`"
            ),
            Self::RequestStateInvalid { why } => write!(
                f,
                "nothing was executed: the requestState of this call cannot be accepted ({why}). Call the tool \
                 again without requestState and inputResponses to start over"
            ),
            Self::RequestStateExpired => f.write_str(
                "nothing was executed: the requestState of this call has expired (the input it answers was asked \
                 too long ago). Call the tool again without requestState and inputResponses to start over",
            ),
            Self::RequestStateUsed => f.write_str(
                "nothing was executed: this confirmation was already used; call the tool again without \
                 requestState and inputResponses to get a new one",
            ),
            Self::ClientKey { why } => write!(
                f,
                "nothing was executed: this tool keys each operation by a key of the client's own in \
                 `_meta[\"idempotency-key\"]`, and {why}; send a unique string per operation (a UUID), the \
                 same on every retry of it"
            ),
            Self::UnreadableResult { reference, detail } => write!(
                f,
                "ref {reference} completed earlier, but its stored result cannot be read by this version of \
                 the tool ({detail}). Nothing ran again. Do not retry: its operator can correct the stored \
                 result (`idem show {reference}`); call `{STATUS_TOOL}` with ref {reference}"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

/// Logs `detail` (a backend's words: hosts, users, relations) at error level under a new random
/// ref, and returns the ref — what a caller is shown instead.
/// Whether the handlers of a [`Rejection::DuplicateTool`] are instances of one generic handler
/// (`Store<A>::create`, `Store<B>::create`): the same once their generic arguments are left out
/// (a leading qualified path, `<A as Handler>::handle`, is kept: `A` is no generic argument).
fn instances_of_one(first: &str, second: &str) -> bool {
    fn declaration(owner: &str) -> String {
        // Per open bracket: whether it is left out (generic arguments) or kept.
        let mut open: Vec<bool> = Vec::new();
        let mut previous = ' ';
        let mut out = String::with_capacity(owner.len());
        for (at, c) in owner.char_indices() {
            let kept = !open.contains(&true);
            // `->` of a function pointer type is no bracket.
            let closing = c == '>' && previous != '-';
            if c == '<' {
                open.push(at != 0);
                if at == 0 {
                    out.push(c);
                }
            } else if closing {
                let left_out = open.pop() != Some(false);
                if !left_out {
                    out.push(c);
                }
            } else if kept {
                out.push(c);
            }
            previous = c;
        }
        out
    }
    let second = declaration(second);
    first.split("`, `").all(|first| declaration(first) == second)
}

/// The line a replayed answer ends with, in every door that can add one (an MCP tool's text, a
/// rig tool's output), so that a model whose host drops the door's metadata does not take the
/// stored answer for a second execution.
#[cfg(any(feature = "rmcp", feature = "rig"))]
pub(crate) fn replay_words(reference: Ref) -> String {
    format!(
        "(idem: this is the stored result of an earlier identical call, ref {reference}; nothing was executed \
         again)"
    )
}

pub(crate) fn incident(detail: &str) -> Ref {
    let incident = Ref::from_bytes(crate::bytes::random());
    tracing::error!(%incident, %detail, "the idempotency ledger is unavailable; nothing was done");
    incident
}

/// What a handler's error means for the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Nothing happened (validation failed before any effect, the downstream refused the request
    /// outright). The record is marked failed and the next repeat runs again.
    NothingHappened,
    /// This error is the operation's final answer (a card declined): it is stored and replayed.
    Final,
    /// The effect may or may not have happened (a downstream timeout). Repeats are told the
    /// outcome is unknown and not to retry.
    Unknown,
}

/// What idem needs of an error type to store its final errors: JSON both ways. Implemented for
/// every `Serialize + DeserializeOwned` type; named here so that a missing derive is explained
/// in idem's words (and `IdempotentError`'s supertrait is one its users can see).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored, and the final errors of an `#[idempotent]` handler are stored and replayed",
    label = "derive `serde::Serialize` and `serde::Deserialize` for this type",
    note = "only errors that `classify` calls `ErrorClass::Final` are ever stored: a variant that is never final may \
            hold a type serde cannot handle (an `std::io::Error`) if you mark it `#[serde(skip)]`"
)]
pub trait StorableError: Sized {
    /// Writes this error as `Serialize` does.
    #[doc(hidden)]
    fn store<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;

    /// Reads an error back as `Deserialize` does.
    #[doc(hidden)]
    fn restore<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

// No supertraits above and `do_not_recommend` here: a type lacking a derive is then told
// `StorableError`'s words (and the `#[serde(skip)]` way out), not rustc's bare "consider adding
// `#[derive(Deserialize)]`", which leads straight into a field serde cannot handle.
#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> StorableError for T {
    fn store<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize(serializer)
    }

    fn restore<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer)
    }
}

/// A stored error as serde writes it.
pub(crate) struct Storing<'a, E>(pub(crate) &'a E);

impl<E: StorableError> Serialize for Storing<'_, E> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.store(serializer)
    }
}

/// A stored error as serde reads it back.
pub(crate) struct Restored<E>(pub(crate) E);

impl<'de, E: StorableError> serde::Deserialize<'de> for Restored<E> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        E::restore(deserializer).map(Self)
    }
}

/// An error type an `#[idempotent]` handler may return.
///
/// The classification is the error type's, chosen in code per variant — idem never guesses
/// whether an error left an effect behind. `Serialize + DeserializeOwned` ([`StorableError`])
/// lets a [`Final`](ErrorClass::Final) error be stored and replayed like a success.
///
/// Only final errors are ever stored, so a variant that is never final may hold a type serde
/// cannot handle (a `thiserror` `#[from] std::io::Error`): mark it `#[serde(skip)]`. (Should
/// `classify` call such a variant final after all, storing it fails and the operation is
/// recorded as "outcome unknown", never replayed wrong.)
///
/// ```
/// # use idem_runtime::{ErrorClass, IdempotentError, Rejection};
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum ShipError {
///     Undeliverable(String),
///     #[serde(skip)]
///     Io(std::io::Error),
///     Refused(String),
/// }
///
/// impl IdempotentError for ShipError {
///     fn classify(&self) -> ErrorClass {
///         match self {
///             Self::Undeliverable(_) => ErrorClass::Final,
///             Self::Io(_) | Self::Refused(_) => ErrorClass::NothingHappened,
///         }
///     }
///     fn from_rejection(rejection: Rejection) -> Self {
///         Self::Refused(rejection.to_string())
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what its errors mean for a repeated call",
    label = "the error type of this `#[idempotent]` handler",
    note = "if `{Self}` is your own type, implement `idem_runtime::IdempotentError` for it: `classify` tells, \
            per error, whether nothing happened, the error is final (stored and replayed), or the outcome is \
            unknown; `from_rejection` turns idem's own answers (in flight, conflict, unknown, ledger unavailable) \
            into `{Self}`",
    note = "a type from another crate (`rmcp::ErrorData`, `String`, `Box<dyn Error>`) cannot implement it: define \
            your own error type, or use `idem_runtime::mcp::ToolError` (feature `rmcp`), which is ready for rmcp tools"
)]
pub trait IdempotentError: StorableError + Sized {
    /// What this error means for the operation.
    fn classify(&self) -> ErrorClass;

    /// Builds the error returned when idem answers without running the handler.
    fn from_rejection(rejection: Rejection) -> Self;
}

#[cfg(test)]
mod tests {
    use super::instances_of_one;

    #[test]
    fn instances_of_one_generic_handler_are_told_from_two_handlers() {
        assert!(instances_of_one("a::Store<a::B>::create", "a::Store<a::A>::create"));
        assert!(instances_of_one("a::load::<a::B>", "a::load::<a::A>"));
        assert!(instances_of_one("name = \"p\" for <a::B>", "name = \"p\" for <a::A>"));
        assert!(instances_of_one("<a::W<u8> as a::H>::handle", "<a::W<u16> as a::H>::handle"));
        assert!(!instances_of_one("<a::A as a::H>::handle", "<a::B as a::H>::handle"));
        assert!(!instances_of_one("a::Orders::create", "a::Invoices::create"));
        assert!(!instances_of_one("a::Store<a::A>::create`, `a::Orders::create", "a::Store<a::B>::create"));
        assert!(!instances_of_one("a::f<fn(u8) -> u8>::g", "a::f<u8>::h"));
    }
}
