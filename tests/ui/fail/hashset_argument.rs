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

#[idempotent(key = "order_id")]
async fn tag(order_id: String, tags: HashSet<String>) -> Result<String, ShopError> {
    Ok(format!("{order_id}: {}", tags.len()))
}

fn main() {}
