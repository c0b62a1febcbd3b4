//! `crate = path` for re-exporters: a crate that wraps idem re-exports it, and its users (who do
//! not depend on `idem_runtime` by name) point the generated code at the re-export.

/// What a re-exporting crate's `lib.rs` holds.
mod toolkit {
    pub use idem_runtime;
    pub use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
}

use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct ShopError(String);

impl toolkit::IdempotentError for ShopError {
    fn classify(&self) -> toolkit::ErrorClass {
        toolkit::ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: toolkit::Rejection) -> Self {
        Self(rejection.to_string())
    }
}

#[toolkit::idempotent(key = "order_id", window = "1h", crate = crate::toolkit::idem_runtime)]
async fn place(order_id: String) -> Result<String, ShopError> {
    Ok(format!("placed {order_id}"))
}

struct Shop {
    idem: toolkit::Idem,
}

impl toolkit::HasIdem for Shop {
    fn idem(&self) -> &toolkit::Idem {
        &self.idem
    }
}

mod handlers {
    use super::{Shop, ShopError, toolkit};

    #[toolkit::audit_idempotent]
    impl Shop {
        #[toolkit::idempotent(key = "order_id", stale = "takeover", scope = "tenant", crate = toolkit::idem_runtime)]
        pub async fn cancel(&self, order_id: String) -> Result<String, ShopError> {
            Ok(format!("cancelled {order_id}"))
        }
    }
}

fn main() {
    let _ = place;
    let _ = Shop::cancel;
}
