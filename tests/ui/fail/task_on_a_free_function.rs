//! `task = true` lets an rmcp tool answer with an MCP task; on a handler that is not a tool it
//! would do nothing, so it is refused.

use idem_runtime::idempotent;
use idem_runtime::mcp::ToolError;

#[idempotent(key = "order_id", task = true)]
async fn place(order_id: String) -> Result<String, ToolError> {
    Ok(format!("placed {order_id}"))
}

fn main() {
    let _ = place;
}
