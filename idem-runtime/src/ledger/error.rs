//! What a ledger failure says, and what caused it.

use std::fmt;

use super::State;

/// What caused a [`LedgerError`], kept typed for [`Error::source`](std::error::Error::source)
/// (a `sea_orm::DbErr`, an `std::io::Error`); its text is already in the error's `detail`.
pub type ErrorSource = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A ledger failure.
///
/// Build one with [`LedgerError::unavailable`], [`LedgerError::ambiguous`] or
/// [`LedgerError::corrupt`] (plus [`LedgerError::with_source`] for its cause), or from a
/// `sea_orm::DbErr` with `?` (feature `sqlite`, `postgres` or `mysql`). Two errors are equal when
/// they say the same thing: their sources are not compared.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LedgerError {
    /// The ledger could not be reached or refused the statement. Nothing was written.
    #[non_exhaustive]
    Unavailable {
        /// The backend's words, for operators.
        detail: String,
        /// The backend's error, if there is one.
        source: Option<ErrorSource>,
    },
    /// The statement was sent but its answer never came (a timeout, a connection lost mid-way):
    /// it may have committed.
    #[non_exhaustive]
    Ambiguous {
        /// The backend's words, for operators.
        detail: String,
        /// The backend's error, if there is one.
        source: Option<ErrorSource>,
    },
    /// The caller no longer holds the claim (its lease was taken over); nothing was written.
    Fenced,
    /// No record for this ref in this tenant.
    NotFound,
    /// The record is in a state this operation does not apply to.
    NotResolvable {
        /// Its state.
        state: State,
    },
    /// A stored record could not be read back.
    #[non_exhaustive]
    Corrupt {
        /// What was wrong.
        detail: String,
        /// The error that found it, if there is one.
        source: Option<ErrorSource>,
    },
}

impl LedgerError {
    /// [`LedgerError::Unavailable`]: nothing was written.
    #[must_use]
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::Unavailable { detail: detail.into(), source: None }
    }

    /// [`LedgerError::Ambiguous`]: the statement may have committed.
    #[must_use]
    pub fn ambiguous(detail: impl Into<String>) -> Self {
        Self::Ambiguous { detail: detail.into(), source: None }
    }

    /// [`LedgerError::Corrupt`]: a stored record could not be read back.
    #[must_use]
    pub fn corrupt(detail: impl Into<String>) -> Self {
        Self::Corrupt { detail: detail.into(), source: None }
    }

    /// The same error, caused by `source` (what [`Error::source`](std::error::Error::source)
    /// returns). The message does not change: put what the operator needs in the detail.
    /// Variants without a detail have no source and are returned as they are.
    #[must_use]
    pub fn with_source(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        if let Self::Unavailable { source, .. } | Self::Ambiguous { source, .. } | Self::Corrupt { source, .. } =
            &mut self
        {
            *source = Some(std::sync::Arc::new(cause));
        }
        self
    }

    /// Whether the failed statement may still have taken effect (its answer was lost).
    #[must_use]
    pub const fn is_ambiguous(&self) -> bool {
        matches!(self, Self::Ambiguous { .. })
    }
}

impl PartialEq for LedgerError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Unavailable { detail: a, .. }, Self::Unavailable { detail: b, .. })
            | (Self::Ambiguous { detail: a, .. }, Self::Ambiguous { detail: b, .. })
            | (Self::Corrupt { detail: a, .. }, Self::Corrupt { detail: b, .. }) => a == b,
            (Self::Fenced, Self::Fenced) | (Self::NotFound, Self::NotFound) => true,
            (Self::NotResolvable { state: a }, Self::NotResolvable { state: b }) => a == b,
            _ => false,
        }
    }
}

impl Eq for LedgerError {}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable { detail, .. } => write!(f, "the idempotency ledger is unavailable: {detail}"),
            Self::Ambiguous { detail, .. } => {
                write!(f, "the idempotency ledger did not answer (the statement may have taken effect): {detail}")
            }
            Self::Fenced => f.write_str(
                "this claim was superseded (its lease expired and was taken over); the result was not recorded",
            ),
            Self::NotFound => f.write_str("no operation with this ref exists for this tenant"),
            Self::NotResolvable { state } => {
                write!(f, "the operation is {state}; only unknown or stale in-progress operations can be resolved")
            }
            Self::Corrupt { detail, .. } => write!(f, "a ledger record could not be read: {detail}"),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable { source, .. } | Self::Ambiguous { source, .. } | Self::Corrupt { source, .. } => {
                source.as_deref().map(|source| source as &(dyn std::error::Error + 'static))
            }
            Self::Fenced | Self::NotFound | Self::NotResolvable { .. } => None,
        }
    }
}
