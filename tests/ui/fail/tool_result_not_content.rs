//! A success type idem can store but rmcp cannot send (neither `Json<T>` nor content): idem
//! says to wrap it in `rmcp::Json`, before rmcp's error about the tool's route.

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

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Ticket {
    id: u64,
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
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<Ticket, ToolError> {
        Ok(Ticket { id: args.title.len() as u64 + args.project.len() as u64 })
    }
}

fn main() {}
