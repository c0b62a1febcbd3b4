//! `client_key` reads a key from an MCP request's `_meta`; a handler that is not an rmcp tool
//! has no `_meta`, so it is refused.

use idem_runtime::idempotent;
use idem_runtime::mcp::ToolError;

#[idempotent(key = "order_id", client_key = "required")]
async fn place(order_id: String) -> Result<String, ToolError> {
    Ok(format!("placed {order_id}"))
}

fn main() {
    let _ = place;
}
