//! Generated code raises no warnings (clippy's pedantic group is checked by `tests/it/pedantic.rs`,
//! since trybuild runs rustc, not clippy).

#![deny(warnings, clippy::pedantic)]

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
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
    memo: Option<String>,
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
    #[idempotent(key = "card, amount_cents", ignore = "memo", window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("charged {} to {}", args.amount_cents, args.card))
    }

    #[idempotent(key = "card")]
    #[tool(description = "Refund a card")]
    async fn refund(&self, Parameters(Charge { card, .. }): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("refunded {card}"))
    }
}

#[idempotent(key = "card, amount_cents", ignore = "memo")]
async fn charge(card: String, amount_cents: u64, memo: Option<String>) -> Result<u64, ShopError> {
    let _ = (card, memo);
    Ok(amount_cents)
}

/// A one-line body: no `unused_braces` (whose suggested fix would not compile).
#[idempotent(key = "id")]
async fn one_line(id: u64) -> Result<u64, ShopError> { Ok(id) }

/// A parameter compiled out by `#[cfg]` is not read by the generated code.
#[idempotent(key = "card")]
async fn with_cfg(card: String, #[cfg(any())] trace: String) -> Result<String, ShopError> {
    Ok(card)
}

#[idempotent(key = "card")]
async fn charge_struct(args: Charge) -> Result<u64, ShopError> {
    Ok(args.amount_cents)
}

fn main() {
    let shop = Shop { idem: Idem::new(idem_runtime::MemoryLedger::new()) };
    let _ = (Shop::tool_router(), Shop::idem_backed_tools(), shop.idem);
    drop(charge(String::new(), 1, None));
    drop(one_line(1));
    drop(with_cfg(String::new()));
    drop(charge_struct(Charge { card: String::new(), amount_cents: 1, memo: None }));
}
