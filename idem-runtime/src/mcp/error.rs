//! [`ToolError`]: a ready error type for idempotent rmcp tools, so a server needs no error
//! plumbing of its own. Each constructor names what the error means for a repeat (the
//! classification is chosen in code, never guessed); the text a model reads says whether
//! anything was executed.

use std::fmt;

use rmcp::model::{ContentBlock, IntoContents};
use serde::{Deserialize, Serialize};

use crate::rejection::{ErrorClass, IdempotentError, Rejection};

/// The error of an idempotent rmcp tool, ready to return: it implements
/// [`IdempotentError`], serde, rmcp's [`IntoContents`] and [`std::error::Error`], and converts
/// from idem's own [`Rejection`] (so `?` works on a nested idempotent call).
///
/// Pick the constructor by what happened downstream:
///
/// | constructor | use it when | a repeat of the call |
/// |---|---|---|
/// | [`invalid`](Self::invalid) | the input was refused before anything was sent | runs again |
/// | [`nothing_happened`](Self::nothing_happened) | the downstream refused outright; no effect | runs again |
/// | [`final_answer`](Self::final_answer) | this error *is* the operation's answer (a card declined) | gets this error back (stored and replayed) |
/// | [`unknown`](Self::unknown) | the effect may or may not have happened (a timeout) | is told "outcome unknown", not run |
///
/// ```
/// use idem_runtime::mcp::ToolError;
/// use idem_runtime::{ErrorClass, IdempotentError};
///
/// let error = ToolError::invalid("amount_cents must be positive");
/// assert_eq!(error.classify(), ErrorClass::NothingHappened);
/// assert_eq!(error.to_string(), "invalid input, nothing was executed: amount_cents must be positive");
///
/// // Any `Display` works, so a downstream error maps in one step:
/// let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "the processor did not answer");
/// let error = ToolError::unknown(timeout);
/// assert_eq!(error.classify(), ErrorClass::Unknown);
/// ```
///
/// Only [`final_answer`](Self::final_answer) errors are stored; their JSON is
/// `{"kind": "final", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    kind: Kind,
    message: String,
    /// idem's code (`in_flight`, `conflict`, ...) when this is one of idem's own answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Invalid,
    NothingHappened,
    Final,
    Unknown,
    /// idem answered without running the handler.
    Refused,
}

impl ToolError {
    fn new(kind: Kind, message: impl fmt::Display) -> Self {
        Self { kind, message: message.to_string(), code: None }
    }

    /// The input was refused before anything was sent: nothing happened, a corrected call runs.
    #[must_use]
    pub fn invalid(message: impl fmt::Display) -> Self {
        Self::new(Kind::Invalid, message)
    }

    /// The downstream refused the request outright: nothing happened, so a repeat runs again.
    #[must_use]
    pub fn nothing_happened(message: impl fmt::Display) -> Self {
        Self::new(Kind::NothingHappened, message)
    }

    /// This error is the operation's final answer (a card declined): it is stored, and every
    /// repeat gets it back without running the handler.
    #[must_use]
    pub fn final_answer(message: impl fmt::Display) -> Self {
        Self::new(Kind::Final, message)
    }

    /// The effect may or may not have happened (a downstream timeout): repeats are told the
    /// outcome is unknown and not to retry, until an operator resolves it.
    #[must_use]
    pub fn unknown(message: impl fmt::Display) -> Self {
        Self::new(Kind::Unknown, message)
    }

    /// The message as given to the constructor (or idem's words, for one of its answers).
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// idem's machine-readable code (see [`Rejection::code`]) when idem answered without
    /// running the handler; `None` for the handler's own errors.
    #[must_use]
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

impl IdempotentError for ToolError {
    fn classify(&self) -> ErrorClass {
        match self.kind {
            // A refusal reached the handler only through `?` on a nested idempotent call, which
            // did not run: a repeat of this call asks it again, and it answers for itself.
            Kind::Invalid | Kind::NothingHappened | Kind::Refused => ErrorClass::NothingHappened,
            Kind::Final => ErrorClass::Final,
            Kind::Unknown => ErrorClass::Unknown,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self { kind: Kind::Refused, message: rejection.to_string(), code: Some(rejection.code().to_owned()) }
    }
}

impl From<Rejection> for ToolError {
    fn from(rejection: Rejection) -> Self {
        Self::from_rejection(rejection)
    }
}

/// The words a model reads: what happened, and whether anything was executed.
impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = &self.message;
        match self.kind {
            Kind::Invalid => write!(f, "invalid input, nothing was executed: {message}"),
            Kind::NothingHappened => write!(f, "nothing was executed: {message}"),
            Kind::Final | Kind::Refused => f.write_str(message),
            Kind::Unknown => write!(
                f,
                "the outcome is unknown: {message}. The operation may or may not have taken effect; do not \
                 retry this call"
            ),
        }
    }
}

impl std::error::Error for ToolError {}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.to_string())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_constructor_carries_its_class() {
        assert_eq!(ToolError::invalid("x").classify(), ErrorClass::NothingHappened);
        assert_eq!(ToolError::nothing_happened("x").classify(), ErrorClass::NothingHappened);
        assert_eq!(ToolError::final_answer("x").classify(), ErrorClass::Final);
        assert_eq!(ToolError::unknown("x").classify(), ErrorClass::Unknown);
        let refused = ToolError::from(Rejection::NoCaller);
        assert_eq!(refused.classify(), ErrorClass::NothingHappened);
        assert_eq!(refused.code(), Some("no_caller"));
        assert_eq!(refused.to_string(), Rejection::NoCaller.to_string());
    }

    #[test]
    fn a_final_answer_round_trips_through_its_stored_json() {
        let declined = ToolError::final_answer("the card was declined");
        let json = serde_json::to_value(&declined).unwrap();
        assert_eq!(json, serde_json::json!({ "kind": "final", "message": "the card was declined" }));
        assert_eq!(serde_json::from_value::<ToolError>(json).unwrap(), declined);
    }

    #[test]
    fn the_model_reads_whether_anything_ran() {
        let text = |error: ToolError| match &error.into_contents()[..] {
            [block] => block.as_text().map(|text| text.text.clone()).unwrap_or_default(),
            other => panic!("one text block, got {other:?}"),
        };
        assert_eq!(
            text(ToolError::nothing_happened("the carrier is closed")),
            "nothing was executed: the carrier is closed"
        );
        assert_eq!(text(ToolError::final_answer("declined")), "declined");
        assert!(text(ToolError::unknown("timeout")).contains("do not retry"));
    }
}
