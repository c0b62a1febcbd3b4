//! `replay_note` shapes the answer a model reads from an rmcp tool; on a handler that is not a
//! tool it would do nothing, so it is refused.

use idem_runtime::idempotent;
use idem_runtime::mcp::ToolError;

#[idempotent(key = "order_id", replay_note = false)]
async fn place(order_id: String) -> Result<String, ToolError> {
    Ok(format!("placed {order_id}"))
}

fn main() {
    let _ = place;
}
