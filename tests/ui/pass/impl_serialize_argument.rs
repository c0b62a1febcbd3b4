//! An `impl Trait` argument whose bounds say `Serialize` is keyed by its value, like a generic
//! `<P: Serialize>` parameter: as a key, as a fingerprinted argument, and behind a reference.

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
async fn place(order_id: impl Serialize + Send + Sync, note: &(impl serde::Serialize + ?Sized)) -> Result<u8, ShopError> {
    let _ = (serde_json::to_string(&order_id), serde_json::to_string(note));
    Ok(1)
}

#[idempotent(key = "order_id")]
async fn place_generic<P: Serialize + Send>(order_id: P) -> Result<u8, ShopError> {
    let _ = serde_json::to_string(&order_id);
    Ok(1)
}

fn main() {
    let _ = place("o-1", "gift");
    let _ = place(String::from("o-1"), &7_u32);
    let _ = place_generic(42_u64);
}
