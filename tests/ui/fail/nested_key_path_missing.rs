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

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: Customer,
}

#[idempotent(key = "order_id, customer.idd")]
async fn place(order: Order) -> Result<String, ShopError> {
    Ok(format!("placed {} for {}", order.order_id, order.customer.id))
}

fn main() {
    let _ = place;
}
