//! `wait = "..."`: a repeat that finds the operation in progress waits for it, up to a minute;
//! the recipe carries it for `Idem::call` users too.

use std::time::Duration;

use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct DeployError(String);

impl IdempotentError for DeployError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

#[idempotent(key = "service, version", wait = "5s")]
async fn deploy(service: String, version: u32) -> Result<String, DeployError> {
    Ok(format!("{service} at {version}"))
}

#[idempotent(key = "service", window = "15m", wait = "1m", stale = "takeover")]
async fn restart(service: String) -> Result<String, DeployError> {
    Ok(format!("{service} restarted"))
}

static ROLLBACK: Recipe = Recipe::new("rollback", &["service"]).wait(Duration::from_millis(1500));

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "ops")).build().unwrap().install();
    assert_eq!(deploy("api".into(), 7).await.unwrap(), "api at 7");
    assert_eq!(restart("api".into()).await.unwrap(), "api restarted");
    assert_eq!(ROLLBACK.wait_duration(), Some(Duration::from_millis(1500)));
}
