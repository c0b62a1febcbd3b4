use idem_runtime::{ErrorClass, IdempotentError, Rejection, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct ShopError(String);

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

/// A connection pool: a dependency of the handler, not part of the call.
struct Db;

#[idempotent(key = "order_id")]
async fn place(db: &Db, order_id: String) -> Result<String, ShopError> {
    let _ = db;
    Ok(order_id)
}

fn main() {}
