//! rmcp's `Json<T>` is accepted as it is; what idem stores is `T`, so a `T` that is only
//! `Serialize` (all rmcp needs) is the type the message asks to derive `Deserialize` for.

use idem_runtime::mcp::ToolError;
use idem_runtime::{HasIdem, Idem, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct OpenTicket {
    project: String,
    title: String,
}

#[derive(Serialize, schemars::JsonSchema)]
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
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<Json<Ticket>, ToolError> {
        Ok(Json(Ticket { id: args.title.len() as u64 + args.project.len() as u64 }))
    }
}

fn main() {}
