//! A misspelt field of the `Parameters<T>` struct in `key`: reported at the literal, naming the
//! struct, without rustc's fix that would replace the whole literal by the bare field name.

use idem_runtime::mcp::ToolError;
use idem_runtime::{HasIdem, Idem, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct OpenTicket {
    project: String,
    title: String,
}

struct Desk {
    idem: Idem,
}

impl HasIdem for Desk {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router]
#[audit_idempotent]
impl Desk {
    #[idempotent(key = "project, titel")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        Ok(format!("opened {} in {}", args.title, args.project))
    }
}

fn main() {}
