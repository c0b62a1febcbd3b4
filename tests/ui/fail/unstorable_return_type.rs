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

struct Receipt {
    number: u64,
}

#[idempotent(key = "order_id")]
async fn place(order_id: String) -> Result<Receipt, ShopError> {
    let _ = order_id;
    Ok(Receipt { number: 1 })
}

fn main() {
    let _ = place;
}
