//! One server type, several audited `#[tool_router]` impls (named routers added together), plus
//! an audited impl of plain methods: they compile side by side, and the startup check (`mcp::check`) sees the
//! recipes of all of them.

use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Rejection, audit_idempotent, idempotent, mcp};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct ShopError(String);

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

impl rmcp::model::IntoContents for ShopError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(self.0)]
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Charge {
    card: String,
    amount_cents: u64,
}

struct Shop {
    idem: Idem,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router]
#[audit_idempotent]
impl Shop {
    #[idempotent(key = "card, amount_cents")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("charged {} to {}", args.amount_cents, args.card))
    }
}

#[audit_idempotent]
#[tool_router(router = admin_router)]
impl Shop {
    #[idempotent(key = "card, amount_cents")]
    #[tool(description = "Refund a card")]
    async fn refund(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("refunded {} to {}", args.amount_cents, args.card))
    }

    #[idempotent(inherent = "sets the card's nickname; a repeat writes the same value")]
    #[tool(description = "Name a card", annotations(idempotent_hint = true))]
    async fn nickname(&self, Parameters(args): Parameters<Charge>) -> String {
        args.card
    }
}

#[tool_router(router = reports_router)]
#[audit_idempotent]
impl Shop {
    #[tool(description = "List charges", annotations(read_only_hint = true))]
    async fn list(&self) -> String {
        String::new()
    }
}

#[audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id")]
    async fn place(&self, order_id: String) -> Result<String, ShopError> {
        Ok(format!("placed {order_id}"))
    }
}

#[tool_handler(router = (Shop::tool_router() + Shop::admin_router() + Shop::reports_router() + mcp::status_tool()))]
impl rmcp::ServerHandler for Shop {}

fn main() {
    let router = Shop::tool_router() + Shop::admin_router() + Shop::reports_router() + mcp::status_tool();
    let shop = Shop { idem: Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap() };
    mcp::check(&shop, &router, mcp::Transport::Stdio).expect("every hinted tool of every impl has a recipe");
    let mut names: Vec<String> = router.list_all().into_iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    assert_eq!(names, ["charge", "idem_status", "list", "nickname", "refund"]);
    let _ = shop.place("o-1".to_owned());
}
