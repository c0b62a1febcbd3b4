//! An error type that implements `IdempotentError` but not serde (a `#[from] std::io::Error` variant):
//! serde's own message, and no longer rustc's false note that `IdempotentError` is a "sealed trait"
//! (its supertrait is idem's public `StorableError`, not serde's re-exported one).

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
