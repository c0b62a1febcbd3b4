//! Every option of `#[idempotent]` in use: `window`, `ignore`, `stale`, `reconcile`, `scope`,
//! `within`, `task`, `name`, `idem` and `caller`, on methods of an rmcp server and on free functions.

use std::sync::LazyLock;

use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Operation, Reconciled, Rejection,
    audit_idempotent, idempotent};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum ChargeError {
    Declined,
    TimedOut,
    Idem(String),
}

impl IdempotentError for ChargeError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Declined => ErrorClass::Final,
            Self::TimedOut => ErrorClass::Unknown,
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
    conversation_id: String,
    memo: Option<String>,
}

struct Processor {
    idem: Idem,
}

impl HasIdem for Processor {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router]
#[audit_idempotent]
impl Processor {
    #[idempotent(key = "card, amount_cents", window = "15m", ignore = "memo", stale = "takeover")]
    #[tool(description = "Charge; the processor dedupes by the forwarded key")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ChargeError> {
        let key = idem_runtime::current_operation().map(|operation| operation.ledger_key().to_string());
        Ok(format!("charged {} to {} with key {key:?}", args.amount_cents, args.card))
    }

    #[idempotent(key = "card, amount_cents", stale = "reconcile", reconcile = Self::check)]
    #[tool(description = "Charge; a dead holder's charge is looked up by its key")]
    async fn charge_checked(&self, Parameters(args): Parameters<Charge>) -> Result<String, ChargeError> {
        if args.amount_cents > 1_000_000 {
            return Err(ChargeError::Declined);
        }
        Err(ChargeError::TimedOut)
    }

    #[idempotent(key = "card", reconcile = Self::check, scope = "tenant", name = "refund_v2")]
    #[tool(name = "refund", description = "Refund, once per card in the whole tenant")]
    async fn refund(&self, Parameters(Charge { card, .. }): Parameters<Charge>) -> Result<String, ChargeError> {
        Ok(format!("refunded {card}"))
    }

    #[idempotent(key = "card, amount_cents", within = "conversation_id", stale = "hold", scope = "caller")]
    #[tool(description = "Charge, once per conversation")]
    async fn charge_in_conversation(&self, Parameters(args): Parameters<Charge>) -> Result<String, ChargeError> {
        Ok(format!("charged {} in {}", args.card, args.conversation_id))
    }

    async fn check(&self, operation: Operation) -> Reconciled<String, ChargeError> {
        let _ = (&self.idem, operation.ledger_key());
        Reconciled::NothingHappened
    }
}

/// A server that holds its `Idem` without implementing `HasIdem`, and a fixed caller.
struct Backoffice {
    ledger: Idem,
    operator: Caller,
}

#[audit_idempotent]
impl Backoffice {
    #[idempotent(key = "order_id", idem = self.ledger, caller = self.operator)]
    async fn cancel(&self, order_id: String) -> Result<String, ChargeError> {
        Ok(format!("cancelled {order_id}"))
    }

    #[idempotent(key = "order_id", idem = &self.ledger, caller = Caller::new("acme", "batch"))]
    async fn archive(&self, order_id: String) -> Result<String, ChargeError> {
        Ok(format!("archived {order_id}"))
    }
}

static IDEM: LazyLock<Idem> = LazyLock::new(|| Idem::new(MemoryLedger::new()));

/// A free function with its own `Idem`, the caller as an argument, a reconcile function.
#[idempotent(key = "card, amount_cents", idem = *IDEM, caller = who, reconcile = check_charge)]
async fn charge(who: Caller, card: String, amount_cents: u64) -> Result<u64, ChargeError> {
    let _ = (who.tenant(), card);
    Ok(amount_cents)
}

async fn check_charge(operation: Operation) -> Reconciled<u64, ChargeError> {
    let _ = operation.reference();
    Reconciled::StillUnknown
}

/// The task id arrives as a named argument.
#[idempotent(key = "card", within = "conversation_id", ignore = "memo")]
async fn tip(card: String, conversation_id: String, memo: String) -> Result<(), ChargeError> {
    let _ = (card, conversation_id, memo);
    Ok(())
}

fn main() {
    let _ = Processor::tool_router();
    let office = Backoffice { ledger: Idem::new(MemoryLedger::new()), operator: Caller::new("acme", "ops") };
    let _ = office.cancel(String::new());
    let _ = office.archive(String::new());
    let _ = charge;
    let _ = tip;
}
