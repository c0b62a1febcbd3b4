//! A generic free function: the recipe is a `static`, which generic parameters never reach.

use idem_runtime::{ErrorClass, IdempotentError, Rejection, idempotent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct StoreError(String);

impl IdempotentError for StoreError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

#[idempotent(key = "id", window = "24h")]
async fn put<T>(id: String, value: T) -> Result<T, StoreError>
where
    T: Serialize + DeserializeOwned + Send,
{
    let _ = id;
    Ok(value)
}

#[idempotent(key = "id")]
async fn put_ref<'a, T: Serialize + DeserializeOwned + Clone>(id: &'a str, value: &'a T) -> Result<T, StoreError> {
    let _ = id;
    Ok(value.clone())
}

fn main() {
    let _ = put::<u64>(String::new(), 1);
    let _ = put_ref::<Vec<String>>("a", &Vec::new());
}
