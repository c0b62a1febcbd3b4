//! A tool whose arguments are a JSON object (`Parameters<JsonObject>`): a key path cannot name
//! its members at compile time. Without help, rustc says "no field `order_id` on type `Map<…>`".

use idem_runtime::mcp::ToolError;
use idem_runtime::{HasIdem, Idem, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::JsonObject;
use rmcp::{tool, tool_router};

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
    #[idempotent(key = "order_id")]
    #[tool(description = "Place an order")]
    async fn place(&self, Parameters(args): Parameters<JsonObject>) -> Result<String, ToolError> {
        Ok(format!("{args:?}"))
    }
}

fn main() {}
