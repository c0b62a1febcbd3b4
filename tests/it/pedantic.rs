//! The code `#[idempotent]` generates passes `clippy::pedantic` with warnings denied: run by
//! `cargo clippy --workspace --all-targets -- -D warnings` (trybuild's `ui/pass` runs rustc only).
//! Nothing here carries an `#[allow]`: whatever clippy finds is the macro's to fix.

#![deny(warnings, clippy::pedantic)]

use idem_runtime::mcp::{self, Step};
use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Operation, Reconciled, Rejection,
    audit_idempotent, idempotent, run_as,
};
use rmcp::handler::server::tool::InputResponses;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
enum ShopError {
    Declined,
    Idem(String),
}

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Declined => ErrorClass::Final,
            Self::Idem(_) => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem(rejection.code().to_owned())
    }
}

impl rmcp::model::IntoContents for ShopError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(format!("{self:?}"))]
    }
}

#[derive(Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Charge {
    card: String,
    amount_cents: u64,
    conversation_id: String,
    memo: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    card: String,
}

fn charge_args(card: &str) -> Charge {
    Charge { card: card.to_owned(), amount_cents: 100, conversation_id: "c-1".to_owned(), memo: None }
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
    #[idempotent(key = "card, amount_cents", ignore = "memo", window = "15m", stale = "takeover")]
    #[tool(description = "Charge a card")]
    async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(format!("charged {} to {}", args.amount_cents, args.card))
    }

    #[idempotent(key = "card", within = "conversation_id", reconcile = Self::check)]
    #[tool(description = "Refund a card")]
    async fn refund(
        &self,
        Parameters(Charge { card, amount_cents, .. }): Parameters<Charge>,
    ) -> Result<String, ShopError> {
        if amount_cents == 0 {
            return Err(ShopError::Declined);
        }
        Ok(format!("refunded {amount_cents} to {card}"))
    }

    #[idempotent(inherent = "sets the card's nickname; a repeat writes the same value")]
    #[tool(description = "Name a card")]
    async fn nickname(&self, Parameters(args): Parameters<Charge>) -> String {
        args.card
    }

    /// Seven parameters of the user's own: the context parameter the macro adds is not counted
    /// against them (`clippy::too_many_arguments`).
    #[idempotent(key = "card")]
    #[tool(description = "Charge with every extractor")]
    async fn charge_everything(
        &self,
        Parameters(args): Parameters<Charge>,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
        peer: rmcp::Peer<rmcp::RoleServer>,
        id: rmcp::handler::server::tool::RequestId,
        tool: rmcp::handler::server::tool::ToolName,
        _trace: rmcp::handler::server::tool::Extension<String>,
    ) -> Result<String, ShopError> {
        let _ = (context, peer, id, tool);
        Ok(args.card)
    }

    /// A tool that may run as an MCP task (its server, a plain router here, cannot be asked
    /// whether it advertises tasks).
    #[idempotent(key = "card", task = true)]
    #[tool(description = "Charge a card, as a task when the client can poll")]
    async fn charge_task(
        &self,
        Parameters(args): Parameters<Charge>,
    ) -> Result<rmcp::Json<Charge>, idem_runtime::mcp::ToolError> {
        Ok(rmcp::Json(args))
    }

    /// A tool that may ask for input first (a multi-round-trip request), with every option of it.
    #[idempotent(key = "card", input_key = "pick.content.amount", single_use_state = true)]
    #[tool(description = "Charge a card after a confirmation")]
    async fn charge_confirmed(
        &self,
        Parameters(args): Parameters<Charge>,
        InputResponses(responses): InputResponses,
    ) -> Result<Step<rmcp::Json<Receipt>>, ShopError> {
        match mcp::confirmed(responses.as_ref(), "pick") {
            None => Ok(Step::InputRequired(mcp::confirm("pick", "How much?"))),
            Some(false) => Err(ShopError::Declined),
            Some(true) => Ok(Step::Done(rmcp::Json(Receipt { card: args.card }))),
        }
    }

    async fn check(&self, operation: Operation) -> Reconciled<String, ShopError> {
        // Stands in for asking the downstream about `operation.ledger_key()`.
        tokio::task::yield_now().await;
        let _ = (&self.idem, operation.reference());
        Reconciled::NothingHappened
    }
}

/// Named arguments, the installed handle, a scope of the whole tenant.
#[idempotent(key = "card, amount_cents", ignore = "memo", scope = "tenant")]
async fn charge(card: String, amount_cents: u64, memo: Option<String>) -> Result<u64, ShopError> {
    let _ = (card, memo);
    Ok(amount_cents)
}

/// One arguments struct, borrowed; the handle and the caller named explicitly.
#[idempotent(key = "card", idem = idem, caller = Caller::new("acme", "ops"))]
async fn charge_struct(idem: &Idem, args: &Charge) -> Result<u64, ShopError> {
    let _ = idem;
    Ok(args.amount_cents)
}

/// A user's `_x` parameter: the generated code does not read it by that name
/// (`clippy::used_underscore_binding`). A one-line body.
#[idempotent(key = "card")]
async fn underscored(card: String, _trace: Option<String>) -> Result<String, ShopError> {
    Ok(card)
}

/// A generic handler.
#[idempotent(key = "id")]
async fn store<T: Serialize + serde::de::DeserializeOwned + Send>(id: u64, value: T) -> Result<T, ShopError> {
    let _ = id;
    Ok(value)
}

fn shop() -> Shop {
    Shop { idem: Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap() }
}

#[test]
fn rmcp_tools_are_listed_with_their_hints() {
    // Calls through rmcp are exercised in `rmcp_tools.rs`; here the generated code must compile
    // under `clippy::pedantic` and list the hints the recipes back.
    let tools = Shop::tool_router().list_all();
    let hinted: Vec<_> = tools
        .iter()
        .filter(|tool| tool.annotations.as_ref().and_then(|a| a.idempotent_hint) == Some(true))
        .map(|tool| tool.name.to_string())
        .collect();
    assert_eq!(hinted, ["charge", "charge_confirmed", "charge_everything", "charge_task", "nickname", "refund"]);
    assert_eq!(
        Shop::idem_backed_tools(),
        ["charge", "refund", "nickname", "charge_everything", "charge_task", "charge_confirmed"]
    );
    let confirmed = tools.iter().find(|tool| tool.name == "charge_confirmed").expect("listed");
    let recipe = confirmed.meta.as_ref().and_then(|meta| meta.0.get(idem_runtime::mcp::wire::RECIPE_META_KEY));
    assert_eq!(
        recipe,
        Some(&serde_json::json!({
            "key": ["card"],
            "stale": "hold",
            "scope": "caller",
            "inputKey": ["pick.content.amount"],
            "singleUseState": true,
        }))
    );
    assert!(confirmed.output_schema.is_some(), "the `T` of `Step<Json<T>>` gives the output schema");
    let _ = shop();
}

#[tokio::test]
async fn free_functions_run() {
    let _installed = crate::INSTALLED_HANDLE.lock().await;
    let idem = Idem::new(MemoryLedger::new());
    assert_eq!(charge_struct(&idem, &charge_args("tok")).await, Ok(100));
    let explicit = Idem::new(MemoryLedger::new());
    explicit.install();
    let caller = Caller::new("acme", "bob");
    assert_eq!(run_as(caller.clone(), charge("tok".to_owned(), 5, None)).await, Ok(5));
    assert_eq!(run_as(caller.clone(), underscored("tok".to_owned(), None)).await, Ok("tok".to_owned()));
    assert_eq!(run_as(caller, store(1, vec!["a".to_owned()])).await, Ok(vec!["a".to_owned()]));
}
