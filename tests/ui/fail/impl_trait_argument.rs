//! An argument of type `impl Trait` whose bounds do not say `Serialize`: the macro cannot serialise it. Without
//! help, rustc suggests adding idem's internal `__private::KeyArgument` bound to it.

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

#[idempotent(key = "order_id")]
async fn place(order_id: impl Into<String>) -> Result<String, ShopError> {
    Ok(order_id.into())
}

fn main() {
    let _ = place("o-1");
}
