//! Only final errors are stored, so a variant that is never final may hold a type serde cannot
//! handle (an `std::io::Error`, as a `thiserror` `#[from]` would): `#[serde(skip)]` leaves it out
//! of the stored form, and the error type still implements `IdempotentError`.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Rejection, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ShipError {
    /// The carrier's final answer: stored and replayed.
    Undeliverable(String),
    /// Nothing was sent: never stored, so never serialised.
    #[serde(skip)]
    Io(std::io::Error),
    Refused(String),
}

impl From<std::io::Error> for ShipError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl IdempotentError for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Undeliverable(_) => ErrorClass::Final,
            Self::Io(_) | Self::Refused(_) => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused(rejection.to_string())
    }
}

static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "order_id")]
async fn ship(order_id: String) -> Result<String, ShipError> {
    if ATTEMPTS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(std::io::Error::other("the carrier's socket closed before sending").into());
    }
    if order_id == "nowhere" {
        return Err(ShipError::Undeliverable("no such address".to_owned()));
    }
    Ok(format!("shipped {order_id}"))
}

fn main() {
    Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap().install();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        assert!(matches!(ship("o-1".to_owned()).await, Err(ShipError::Io(_))));
        // Nothing happened, so the repeat runs again.
        assert_eq!(ship("o-1".to_owned()).await.unwrap(), "shipped o-1");
        assert!(matches!(ship("nowhere".to_owned()).await, Err(ShipError::Undeliverable(_))));
        // The final answer is replayed: the handler does not run a fourth time.
        assert!(matches!(ship("nowhere".to_owned()).await, Err(ShipError::Undeliverable(_))));
        assert_eq!(ATTEMPTS.load(Ordering::SeqCst), 3);
    });
}
