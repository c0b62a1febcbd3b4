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
}

struct Shop {
    idem: Idem,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

// Audited above `#[tool_router]`: the hinted `refund` has no recipe.
#[audit_idempotent]
#[tool_router]
impl Shop {
    #[idempotent(key = "card, amount_cents")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("charged {} to {}", args.amount_cents, args.card))
    }

    #[tool(description = "Refund a card", annotations(idempotent_hint = true))]
    async fn refund(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("refunded {} to {}", args.amount_cents, args.card))
    }
}

fn main() {}
