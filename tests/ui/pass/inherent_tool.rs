//! A naturally idempotent tool says why in `inherent`; it may then advertise the hint (written
//! out, or added by the macro), in an audited impl, without a ledger or a `Result`.

use idem_runtime::{audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct SetStatus {
    order_id: String,
    status: String,
}

struct Shop;

#[audit_idempotent]
#[tool_router]
impl Shop {
    #[idempotent(inherent = "sets the order's status by id; a repeat writes the same value")]
    #[tool(description = "Set an order's status", annotations(idempotent_hint = true))]
    async fn set_status(&self, Parameters(args): Parameters<SetStatus>) -> String {
        format!("{} is {}", args.order_id, args.status)
    }

    #[idempotent(inherent = "deletes by id; deleting twice leaves it deleted")]
    #[tool(description = "Delete an order")]
    async fn delete(&self, Parameters(args): Parameters<SetStatus>) -> String {
        format!("{} deleted", args.order_id)
    }
}

fn main() {
    let _ = Shop::tool_router();
}
