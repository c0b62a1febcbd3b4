//! The main use: `&self` methods of an rmcp server, audited, with `#[idempotent]` above `#[tool]`,
//! taking `Parameters(args)` and a destructuring `Parameters(Charge { .. })` pattern.

use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, Rejection, audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ChargeError {
    Declined,
    Idem(String),
}

impl IdempotentError for ChargeError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Declined => ErrorClass::Final,
            Self::Idem(_) => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.to_string())
    }
}

impl rmcp::model::IntoContents for ChargeError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(format!("{self:?}"))]
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
    #[idempotent(key = "card, amount_cents", window = "15m")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ChargeError> {
        if args.amount_cents == 0 {
            return Err(ChargeError::Declined);
        }
        Ok(format!("charged {} to {}", args.amount_cents, args.card))
    }

    #[idempotent(key = "card, amount_cents", ignore = "memo")]
    #[tool(description = "Refund a charge", annotations(idempotent_hint = true, destructive_hint = false))]
    async fn refund(
        &self,
        Parameters(Charge { card, amount_cents, .. }): Parameters<Charge>,
    ) -> Result<String, ChargeError> {
        Ok(format!("refunded {amount_cents} to {card}"))
    }
}

fn main() {
    let _ = Shop::tool_router();
}
