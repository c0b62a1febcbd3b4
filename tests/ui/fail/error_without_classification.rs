use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ShopError {
    Declined,
}

#[idempotent(key = "order_id")]
async fn place(order_id: String) -> Result<String, ShopError> {
    Ok(format!("placed {order_id}"))
}

fn main() {
    let _ = place;
}
