//! Dotted key paths into an arguments struct (the single unnamed argument), into a named argument,
//! and into rmcp's `Parameters<T>`.

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
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

impl rmcp::model::IntoContents for ShopError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(self.0)]
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Customer {
    id: u64,
    address: Address,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Address {
    postcode: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    order_id: String,
    customer: Customer,
}

/// The single argument is the arguments struct: `customer.id` is a path into it.
#[idempotent(key = "order_id, customer.id")]
async fn place(order: Order) -> Result<String, ShopError> {
    Ok(format!("placed {} for {}", order.order_id, order.customer.id))
}

/// Two arguments: the first segment names one of them.
#[idempotent(key = "order.customer.address.postcode, attempt")]
async fn ship(order: Order, attempt: u32) -> Result<String, ShopError> {
    Ok(format!("shipped {} to {} ({attempt})", order.order_id, order.customer.address.postcode))
}

struct Shop {
    idem: Idem,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router]
#[audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id, customer.id")]
    #[tool(description = "Place an order")]
    async fn place(&self, Parameters(order): Parameters<Order>) -> Result<String, ShopError> {
        Ok(format!("placed {} for {}", order.order_id, order.customer.id))
    }
}

fn main() {
    let _ = place;
    let _ = ship;
    let _ = Shop::tool_router();
}
