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

use std::collections::HashSet;

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: String,
    tags: HashSet<String>,
}

#[idempotent(key = "order.order_id, order.tags")]
async fn tag(order: Order, attempt: u32) -> Result<String, ShopError> {
    Ok(format!("{} {attempt}", order.order_id))
}

fn main() {}
