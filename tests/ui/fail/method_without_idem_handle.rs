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

struct Shop;

#[idem_runtime::audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id")]
    async fn place(&self, order_id: String) -> Result<String, ShopError> {
        Ok(format!("placed {order_id}"))
    }
}

fn main() {}
