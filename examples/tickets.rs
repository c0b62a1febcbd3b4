//! A tickets MCP server over stdio: open a ticket (safe to repeat), list them.
//! `cargo run --example tickets`; `examples/mcp_server.rs` also serves streamable HTTP.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idem_runtime::mcp::{self, ToolError};
use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, idempotent};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{Json, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments are part of the operation's identity, so they are `Serialize` as well.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Open {
    /// The project, e.g. `billing`.
    project: String,
    title: String,
    /// Not in the key: the same project and title with another body is a conflict, not a second ticket.
    body: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Ticket {
    id: u64,
    project: String,
    title: String,
    open: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Tickets {
    tickets: Vec<Ticket>,
}

#[derive(Clone)]
struct TicketServer {
    idem: Idem,
    tickets: Arc<Mutex<Vec<Ticket>>>,
    // `Self::tool_router()` plus idem's `idem_status`: the router this server serves.
    tool_router: ToolRouter<Self>,
}

impl HasIdem for TicketServer {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent] // a tool hinted idempotent without a recipe does not compile
#[tool_router]
impl TicketServer {
    fn new(idem: Idem) -> Self {
        Self { idem, tickets: Arc::default(), tool_router: Self::tool_router() + mcp::status_tool() }
    }

    fn tickets(&self) -> MutexGuard<'_, Vec<Ticket>> {
        self.tickets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[idempotent(key = "project, title")]
    #[tool(description = "Open a ticket. Safe to repeat: a repeat returns the ticket it opened.")]
    async fn open_ticket(&self, Parameters(open): Parameters<Open>) -> Result<Json<Ticket>, ToolError> {
        if open.title.trim().is_empty() {
            return Err(ToolError::invalid("the title must not be empty"));
        }
        let mut tickets = self.tickets();
        let ticket = Ticket { id: tickets.len() as u64 + 1, project: open.project, title: open.title, open: true };
        tickets.push(ticket.clone());
        Ok(Json(ticket))
    }

    #[tool(description = "List the tickets.", annotations(read_only_hint = true))]
    async fn list_tickets(&self) -> Json<Tickets> {
        Json(Tickets { tickets: self.tickets().clone() })
    }
}

// The router kept in the struct: a plain `#[tool_handler]` would serve no `idem_status`.
#[tool_handler(router = self.tool_router)]
impl ServerHandler for TicketServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // On stdio, stdout is the protocol: logs go to stderr. `RUST_LOG` sets the level.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    // The tickets live in memory, so the ledger does too: a durable ledger would replay
    // "ticket 1 opened" after a restart, for a ticket that no longer exists.
    // Nothing authenticates a request over stdio: the server acts for one local user.
    let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("local", "user")).build()?;
    let server = TicketServer::new(idem);
    // Stops, saying what to change, unless hinted tools have recipes, `idem_status` is served, stdio has a caller.
    mcp::check(&server, &server.tool_router, mcp::Transport::Stdio)?;
    server.serve(rmcp::transport::stdio()).await?.waiting().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use idem_runtime::mcp::ToolContext;

    use super::*;

    #[tokio::test]
    async fn opening_the_same_ticket_twice_opens_one() {
        let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap();
        let server = TicketServer::new(idem);
        let open = || {
            let (project, title, body) = ("billing".to_owned(), "Refunds fail".to_owned(), "500 on /refund".to_owned());
            Parameters(Open { project, title, body })
        };
        let first = server.open_ticket(ToolContext::local(), open()).await.into_result().expect("opened");
        let again = server.open_ticket(ToolContext::local(), open()).await.into_result().expect("replayed");
        assert_eq!(again.0.id, first.0.id, "the repeat gets the ticket the first call opened");
        assert_eq!(server.tickets().len(), 1, "one ticket exists");
    }
}
