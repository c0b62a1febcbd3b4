use idem_runtime::idempotent;

#[idempotent(key = "order_id")]
struct Place {
    order_id: String,
}

fn main() {
    let _ = Place { order_id: String::new() }.order_id;
}
