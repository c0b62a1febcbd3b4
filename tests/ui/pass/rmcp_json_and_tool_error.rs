//! The first-hour server: rmcp's own `Json<T>` as the success type (idem stores and replays the
//! inner `T`) and idem's ready `ToolError`, with no error plumbing of the user's own. The tool
//! still lists the output schema rmcp infers from `Json<T>`.

#![deny(warnings)]

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
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<Json<Ticket>, ToolError> {
        if args.title.is_empty() {
            return Err(ToolError::invalid("the title is empty"));
        }
        Ok(Json(Ticket { id: args.project.len() as u64 }))
    }

    #[idempotent(key = "project")]
    #[tool(description = "Archive a project")]
    async fn archive(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        Err(ToolError::final_answer(format!("{} cannot be archived", args.project)))
    }
}

fn main() {
    let tools = Desk::tool_router().list_all();
    let open = tools.iter().find(|tool| tool.name == "open_ticket").expect("listed");
    let schema = open.output_schema.as_ref().expect("the schema rmcp infers from `Json<Ticket>`");
    assert!(schema.get("properties").and_then(|properties| properties.get("id")).is_some(), "{schema:?}");
    let _ = Desk { idem: Idem::new(idem_runtime::MemoryLedger::new()) }.idem;
}
