//! An impl that uses `#[idempotent]` is audited, above or below `#[tool_router]`; every hinted
//! tool in it has a recipe.

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

macro_rules! shop {
    ($shop:ident, $($attrs:tt)*) => {
        struct $shop {
            idem: Idem,
        }

        impl HasIdem for $shop {
            fn idem(&self) -> &Idem {
                &self.idem
            }
        }

        $($attrs)*
        impl $shop {
            #[idempotent(key = "card, amount_cents")]
            #[tool(description = "Charge a card")]
            async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
                Ok(format!("charged {} to {}", args.amount_cents, args.card))
            }

            #[idempotent(key = "card, amount_cents")]
            #[tool(description = "Refund a card", annotations(idempotent_hint = true))]
            async fn refund(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
                Ok(format!("refunded {} to {}", args.amount_cents, args.card))
            }
        }
    };
}

shop!(AuditAbove, #[audit_idempotent] #[tool_router]);
shop!(AuditBelow, #[tool_router] #[audit_idempotent]);

fn main() {
    assert_eq!(AuditAbove::idem_backed_tools(), ["charge", "refund"]);
    assert_eq!(AuditBelow::idem_backed_tools(), ["charge", "refund"]);
    assert_eq!(AuditAbove::tool_router().list_all().len(), 2);
    assert_eq!(AuditBelow::tool_router().list_all().len(), 2);
}
