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

#[idempotent(key = "ordr_id")]
async fn place((first, last): (String, String), order_id: String) -> Result<String, ShopError> {
    Ok(format!("{first} {last} {order_id}"))
}

fn main() {}
