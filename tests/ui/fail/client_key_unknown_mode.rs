//! `client_key` is `"required"` or `"optional"`; anything else is refused with both words.

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
    #[idempotent(key = "project, title", client_key = "always")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        Ok(format!("{}: {}", args.project, args.title))
    }
}

fn main() {}
