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

#[derive(Serialize, Deserialize)]
struct Customer {
    id: u64,
}

#[idempotent(key = "customer.id")]
async fn place(customer: Option<Customer>, order_id: String) -> Result<String, ShopError> {
    Ok(format!("{order_id} {}", customer.map_or(0, |c| c.id)))
}

fn main() {}
