//! What a status request or an operator's verb answers when it cannot: [`StatusError`], shared by
//! [`Idem::status`](super::Idem::status) and [`Admin`](super::Admin), so neither room imports
//! the other for it.

use crate::key::{AddressError, RefError};
use crate::ledger::LedgerError;
use crate::secret::SecretError;

/// A status or resolve request that could not be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// The ref is malformed.
    Ref(RefError),
    /// The operation's address is malformed (or a ref alone where a verdict needs the address).
    Address(AddressError),
    /// The ledger failed or refused.
    Ledger(LedgerError),
    /// The handle has no usable secret.
    Secret(SecretError),
    /// A "completed" verdict the operation's tool could not read back: nothing was stored.
    Misfit {
        /// The tool.
        tool: String,
        /// Where and how the verdict does not fit.
        reason: String,
        /// The result's shape on one line ([`ToolFacts::expected_shape`](super::ToolFacts::expected_shape)).
        expected: String,
    },
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ref(error) => error.fmt(f),
            Self::Address(error) => error.fmt(f),
            Self::Ledger(error) => error.fmt(f),
            Self::Secret(error) => error.fmt(f),
            Self::Misfit { tool, reason, expected } => write!(
                f,
                "the verdict does not fit {tool}'s result, so no repeat could read it: {reason}. It expects \
                 {expected}. Nothing was stored: give the result as the tool returns it (`idem show` prints \
                 the shape)"
            ),
        }
    }
}

/// Transparent, as its message is: the wrapped error's own cause.
impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Ref(error) => error.source(),
            Self::Address(error) => error.source(),
            Self::Ledger(error) => error.source(),
            Self::Secret(error) => error.source(),
            Self::Misfit { .. } => None,
        }
    }
}

impl From<RefError> for StatusError {
    fn from(error: RefError) -> Self {
        Self::Ref(error)
    }
}

impl From<AddressError> for StatusError {
    fn from(error: AddressError) -> Self {
        Self::Address(error)
    }
}

impl From<LedgerError> for StatusError {
    fn from(error: LedgerError) -> Self {
        Self::Ledger(error)
    }
}

impl From<SecretError> for StatusError {
    fn from(error: SecretError) -> Self {
        Self::Secret(error)
    }
}
