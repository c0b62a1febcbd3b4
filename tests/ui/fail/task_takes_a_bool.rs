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

#[idempotent(key = "order_id", task = "conversation_id")]
async fn place(order_id: String, conversation_id: String) -> Result<String, ShopError> {
    Ok(format!("placed {order_id} in {conversation_id}"))
}

fn main() {
    let _ = place;
}
