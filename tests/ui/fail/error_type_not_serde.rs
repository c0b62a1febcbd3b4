//! An error type that implements `IdempotentError` but not serde (a `#[from] std::io::Error` variant):
//! idem's words — derive serde, and mark a variant that is never final `#[serde(skip)]` — not
//! rustc's "consider adding `#[derive(serde::Deserialize)]`", which leads into `io::Error`.

use idem_runtime::{ErrorClass, IdempotentError, Rejection};

#[derive(Debug)]
enum ShipError {
    Io(std::io::Error),
    Refused(String),
}

impl IdempotentError for ShipError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused(rejection.to_string())
    }
}

fn main() {
    let _ = ShipError::Io(std::io::Error::other("x"));
}
