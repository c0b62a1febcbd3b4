//! rmcp needs an arguments struct to be `Deserialize + JsonSchema`; idem also needs `Serialize`,
//! since the arguments are the operation's identity, and says so.

use idem_runtime::mcp::ToolError;
use idem_runtime::{HasIdem, Idem, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::Deserialize;

#[derive(Deserialize, schemars::JsonSchema)]
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
    #[idempotent(key = "project, title")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        Ok(format!("opened {} in {}", args.title, args.project))
    }
}

fn main() {}
