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

use idem_runtime::{HasIdem, Idem, audit_idempotent};

struct Shop {
    idem: Idem,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[async_trait::async_trait]
trait Orders {
    async fn place(&self, order_id: String) -> Result<String, ShopError>;
}

#[async_trait::async_trait]
#[audit_idempotent]
impl Orders for Shop {
    #[idempotent(key = "order_id")]
    async fn place(&self, order_id: String) -> Result<String, ShopError> {
        Ok(order_id)
    }
}

fn main() {}
