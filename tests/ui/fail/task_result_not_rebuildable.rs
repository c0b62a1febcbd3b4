//! A `task = true` tool whose error is its own type: `tasks/get` could not rebuild its words from
//! the stored JSON without the type, so it is refused, with the accepted types.

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct OpenTicket {
    project: String,
    title: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct DeskError(String);

impl IdempotentError for DeskError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Final
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

impl rmcp::model::IntoContents for DeskError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(format!("the desk says: {}", self.0))]
    }
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
    #[idempotent(key = "project, title", task = true)]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, DeskError> {
        Ok(format!("{}: {}", args.project, args.title))
    }
}

fn main() {}
