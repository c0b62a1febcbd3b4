//! The hint a real rmcp server lists follows the recipe: `idempotentHint: true` exactly on the
//! tools with `#[idempotent]` (a key or an inherent reason), in the router's tool list and on the
//! wire, and a keyed tool called twice over MCP runs once.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Rejection, audit_idempotent, idempotent,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{ServiceExt, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Serialize, Deserialize)]
enum ShopError {
    Declined,
    Idem { code: String, message: String },
}

impl IdempotentError for ShopError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Declined => ErrorClass::Final,
            Self::Idem { .. } => ErrorClass::NothingHappened,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Idem { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

impl rmcp::model::IntoContents for ShopError {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(format!("{self:?}"))]
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct PlaceOrder {
    order_id: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct SetStatus {
    order_id: String,
    status: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Message {
    text: String,
}

struct Shop {
    idem: Idem,
    placed: AtomicUsize,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router(server_handler)]
#[audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id", window = "15m")]
    #[tool(description = "Place an order")]
    async fn place_order(&self, Parameters(order): Parameters<PlaceOrder>) -> Result<String, ShopError> {
        if order.amount_cents == 0 {
            return Err(ShopError::Declined);
        }
        let n = self.placed.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("order {} placed (#{n})", order.order_id))
    }

    #[idempotent(inherent = "sets the status by order id; a repeat writes the same value")]
    #[tool(description = "Set an order's status")]
    async fn set_status(&self, Parameters(args): Parameters<SetStatus>) -> String {
        format!("{} is {}", args.order_id, args.status)
    }

    #[tool(description = "Send a message to the customer")]
    async fn send_message(&self, Parameters(message): Parameters<Message>) -> String {
        format!("sent: {}", message.text)
    }

    #[tool(description = "Look up an order", annotations(read_only_hint = true))]
    async fn get_order(&self, Parameters(args): Parameters<SetStatus>) -> String {
        format!("{} is {}", args.order_id, args.status)
    }
}

fn shop() -> Shop {
    Shop {
        idem: Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap(),
        placed: AtomicUsize::new(0),
    }
}

const IDEMPOTENT: [&str; 2] = ["place_order", "set_status"];
const OTHERS: [&str; 2] = ["send_message", "get_order"];

fn idempotent_hint(tool: &rmcp::model::Tool) -> Option<bool> {
    tool.annotations.as_ref().and_then(|annotations| annotations.idempotent_hint)
}

#[test]
fn the_router_lists_the_hint_exactly_on_tools_with_a_recipe() {
    let tools = Shop::tool_router().list_all();
    let mut names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(names, ["get_order", "place_order", "send_message", "set_status"]);
    for tool in &tools {
        let expected = IDEMPOTENT.contains(&tool.name.as_ref());
        assert_eq!(idempotent_hint(tool) == Some(true), expected, "{}: {:?}", tool.name, tool.annotations);
    }
    let get_order = tools.iter().find(|tool| tool.name == "get_order").unwrap();
    assert_eq!(get_order.annotations.as_ref().and_then(|annotations| annotations.read_only_hint), Some(true));
    assert_eq!(idempotent_hint(get_order), None, "idem leaves a tool without `#[idempotent]` alone");
}

#[test]
fn the_wire_field_is_idempotent_hint_true_only_on_tools_with_a_recipe() {
    for tool in Shop::tool_router().list_all() {
        let json = serde_json::to_value(&tool).unwrap();
        let hint = json.pointer("/annotations/idempotentHint");
        if IDEMPOTENT.contains(&tool.name.as_ref()) {
            assert_eq!(hint, Some(&Value::Bool(true)), "{json}");
        } else {
            assert!(OTHERS.contains(&tool.name.as_ref()));
            assert_ne!(hint, Some(&Value::Bool(true)), "{json}");
        }
    }
    let text = serde_json::to_string(&Shop::tool_router().list_all()).unwrap();
    assert_eq!(text.matches(r#""idempotentHint":true"#).count(), 2, "{text}");
}

/// A line-delimited JSON-RPC client on one end of an in-memory pipe, the server on the other.
struct Wire {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl Wire {
    async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.writer.write_all(&line).await.unwrap();
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        loop {
            let line = tokio::time::timeout(std::time::Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("the server answers")
                .unwrap()
                .expect("the server keeps the pipe open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }
}

async fn connect<S: rmcp::ServerHandler>(handler: S) -> Wire {
    let (client, server) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = handler.serve(tokio::io::split(server)).await.expect("the server starts");
        let _ = running.waiting().await;
    });
    let (reader, writer) = tokio::io::split(client);
    let mut wire = Wire { writer, lines: BufReader::new(reader).lines() };
    let init = wire
        .request(
            1,
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "idem-test", "version": "0.0.0" }
            }),
        )
        .await;
    assert!(init.get("result").is_some(), "{init}");
    wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await;
    wire
}

#[tokio::test]
async fn tools_list_over_mcp_and_a_repeated_call_runs_once() {
    let mut wire = connect(shop()).await;

    let listed = wire.request(2, "tools/list", json!({})).await;
    let tools = listed["result"]["tools"].as_array().expect("a tool list").clone();
    assert_eq!(tools.len(), 4, "{listed}");
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let hinted = tool.pointer("/annotations/idempotentHint") == Some(&Value::Bool(true));
        assert_eq!(hinted, IDEMPOTENT.contains(&name), "{tool}");
    }

    let call = json!({ "name": "place_order", "arguments": { "order_id": "o-1", "amount_cents": 1250 } });
    let first = wire.request(3, "tools/call", call.clone()).await;
    let again = wire.request(4, "tools/call", call).await;
    let text = |response: &Value| response.pointer("/result/content/0/text").and_then(Value::as_str).map(str::to_owned);
    assert_eq!(text(&first).as_deref(), Some("order o-1 placed (#1)"), "{first}");
    assert_eq!(text(&again), text(&first), "the repeat is answered with the stored result: {again}");

    let other = json!({ "name": "place_order", "arguments": { "order_id": "o-2", "amount_cents": 1250 } });
    let second = wire.request(5, "tools/call", other).await;
    assert_eq!(text(&second).as_deref(), Some("order o-2 placed (#2)"), "{second}");
}

/// One server type, several `#[tool_router]` impls (named routers, added together).
struct Desk {
    idem: Idem,
}

impl HasIdem for Desk {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[tool_router]
#[audit_idempotent]
impl Desk {
    #[idempotent(key = "order_id")]
    #[tool(description = "Place an order")]
    async fn place(&self, Parameters(order): Parameters<PlaceOrder>) -> Result<String, ShopError> {
        Ok(order.order_id)
    }
}

#[audit_idempotent]
#[tool_router(router = admin_router)]
impl Desk {
    #[idempotent(inherent = "sets the status by order id; a repeat writes the same value")]
    #[tool(description = "Set an order's status", annotations(idempotent_hint = true))]
    async fn set_status(&self, Parameters(args): Parameters<SetStatus>) -> String {
        format!("{} is {}", args.order_id, args.status)
    }
}

/// No `#[idempotent]` here, so nothing obliges an audit: the startup check (`mcp::check`) catches it.
#[tool_router(router = legacy_router)]
impl Desk {
    #[tool(description = "Resend an invoice", annotations(idempotent_hint = true))]
    async fn resend(&self, Parameters(message): Parameters<Message>) -> String {
        message.text
    }
}

/// The server serves its default and admin routers with the status tool.
#[tool_handler(router = (Desk::tool_router() + Desk::admin_router() + idem_runtime::mcp::status_tool()))]
impl rmcp::ServerHandler for Desk {}

#[test]
fn the_startup_audit_sees_the_recipes_of_every_audited_impl() {
    use idem_runtime::mcp::{self, NotReady, Transport};
    let desk = Desk { idem: Idem::new(MemoryLedger::new()) };
    let router = Desk::tool_router() + Desk::admin_router() + mcp::status_tool();
    mcp::check(&desk, &router, Transport::Http).expect("both hinted tools have recipes");
    let mut names: Vec<String> = router.list_all().into_iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    assert_eq!(names, ["idem_status", "place", "set_status"]);
    assert_eq!(Desk::idem_backed_tools(), ["place"], "the default router's impl lists its own");

    let with_legacy = router + Desk::legacy_router();
    let refused = mcp::check(&desk, &with_legacy, Transport::Http).unwrap_err();
    assert_eq!(refused, NotReady::Unbacked { tools: vec!["resend".to_owned()] });
}

/// A tool added by hand, hinted idempotent: `mcp::check` refuses it until its definition says
/// what backs it (`wire::backed_meta` with `Backing::Inherent`, or `wire::recipe_meta`).
fn hand_added(meta: Option<rmcp::model::MetaObject>) -> rmcp::handler::server::router::tool::ToolRouter<Desk> {
    use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
    use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, Tool, ToolAnnotations};
    let mut tool = Tool::new("touch", "Sets a flag; a repeat sets it again", std::sync::Arc::new(Default::default()))
        .with_annotations(ToolAnnotations::new().idempotent(true));
    tool.meta = meta;
    let route = ToolRoute::new_dyn(tool, |_| {
        Box::pin(async { Ok(CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text("set")]))) })
    });
    ToolRouter::new().with_route(route)
}

#[test]
fn a_tool_added_by_hand_passes_the_check_once_its_definition_says_what_backs_it() {
    use idem_runtime::mcp::wire::{Backing, backed_meta};
    use idem_runtime::mcp::{self, NotReady, Transport};
    let desk = Desk { idem: Idem::new(MemoryLedger::new()) };
    let served = |meta| Desk::tool_router() + Desk::admin_router() + mcp::status_tool() + hand_added(meta);
    let refused = mcp::check(&desk, &served(None), Transport::Http).unwrap_err();
    assert_eq!(refused, NotReady::Unbacked { tools: vec!["touch".to_owned()] });
    assert!(refused.to_string().contains("mcp::wire::recipe_meta"), "says what a hand-added tool does: {refused}");
    mcp::check(&desk, &served(Some(backed_meta(None, Backing::Inherent))), Transport::Http)
        .expect("an inherent tool added by hand is backed");
}

#[test]
fn a_tool_lists_the_recipe_that_backs_its_hint() {
    let tools = Shop::tool_router().list_all();
    let meta = |name: &str| {
        let tool = tools.iter().find(|tool| tool.name == name).unwrap();
        serde_json::to_value(&tool.meta).unwrap()
    };
    let recipe = json!({ "key": ["order_id"], "windowMs": 900_000, "stale": "hold", "scope": "caller" });
    assert_eq!(meta("place_order"), json!({ "dev.idem/recipe": recipe }));
    let inherent = json!({ "inherent": true });
    assert_eq!(meta("set_status"), json!({ "dev.idem/recipe": inherent }));
    assert_eq!(meta("send_message"), Value::Null);
}

/// `tools/list` over a real rmcp server: each idempotent tool advertises its recipe under
/// `dev.idem/recipe` (the user's own `_meta` kept beside it), the others nothing of idem's.
#[tokio::test]
async fn tools_list_advertises_each_recipe_under_dev_idem_recipe() {
    let mut wire = connect(shop()).await;
    let listed = wire.request(2, "tools/list", json!({})).await;
    let tools = listed["result"]["tools"].as_array().expect("a tool list").clone();
    let recipe = |name: &str| {
        let tool = tools.iter().find(|tool| tool["name"] == name).unwrap_or_else(|| panic!("{name}: {listed}"));
        tool.pointer("/_meta/dev.idem~1recipe").cloned()
    };
    assert_eq!(
        recipe("place_order"),
        Some(json!({ "key": ["order_id"], "windowMs": 900_000, "stale": "hold", "scope": "caller" }))
    );
    assert_eq!(recipe("set_status"), Some(json!({ "inherent": true })));
    assert_eq!(recipe("send_message"), None);
    assert_eq!(recipe("get_order"), None);

    let mut wire = connect(Bench { idem: shop().idem }).await;
    let listed = wire.request(2, "tools/list", json!({})).await;
    let tool = &listed["result"]["tools"][0];
    assert_eq!(tool["_meta"]["team"], json!("payments"), "the tool's own `_meta` is kept: {tool}");
    assert_eq!(
        tool["_meta"]["dev.idem/recipe"],
        json!({
            "key": ["card", "amount_cents"],
            "windowMs": 86_400_000,
            "stale": "takeover",
            "scope": "tenant",
        }),
        "{tool}"
    );
}

/// A tool with its own `_meta` and every recipe option that shows in the advertisement.
struct Bench {
    idem: Idem,
}

impl HasIdem for Bench {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Charge {
    card: String,
    amount_cents: u64,
}

fn team_meta() -> rmcp::model::MetaObject {
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert("team".to_owned(), json!("payments"));
    meta
}

#[tool_router(server_handler)]
#[audit_idempotent]
impl Bench {
    #[idempotent(key = "card, amount_cents", window = "1d", stale = "takeover", scope = "tenant")]
    #[tool(description = "Charge a card", meta = team_meta())]
    async fn charge(&self, Parameters(charge): Parameters<Charge>) -> Result<String, ShopError> {
        Ok(charge.card)
    }
}

/// A checkout whose client sends its own key, as the Universal Commerce Protocol's MCP binding
/// does (`_meta["idempotency-key"]`).
struct Checkout {
    idem: Idem,
    completed: AtomicUsize,
}

impl HasIdem for Checkout {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Cart {
    cart_id: String,
    amount_cents: u64,
}

#[tool_router(server_handler)]
#[audit_idempotent]
impl Checkout {
    #[idempotent(key = "()", client_key = "required")]
    #[tool(description = "Complete a checkout")]
    async fn complete_checkout(&self, Parameters(cart): Parameters<Cart>) -> Result<String, ShopError> {
        let n = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("checkout {} completed (#{n})", cart.cart_id))
    }
}

/// Issue 29, item 4: the client's own key joins the operation (under the caller and the tool):
/// the same key replays, the same key with other arguments is a conflict, another key is another
/// operation, and a call without one (the recipe requires it) is refused in words, running nothing.
#[tokio::test]
async fn a_client_key_in_meta_names_the_operation() {
    let checkout = Checkout {
        idem: idem_tests::builder(MemoryLedger::new()).local_caller(Caller::new("shop", "agent")).build().unwrap(),
        completed: AtomicUsize::new(0),
    };
    let mut wire = connect(checkout).await;
    let listed = wire.request(2, "tools/list", json!({})).await;
    assert_eq!(
        listed.pointer("/result/tools/0/_meta/dev.idem~1recipe/clientKey"),
        Some(&json!("required")),
        "{listed}"
    );

    let call = |key: Value, amount: u64| {
        json!({
            "name": "complete_checkout",
            "arguments": { "cart_id": "c-1", "amount_cents": amount },
            "_meta": { "idempotency-key": key },
        })
    };
    let text = |response: &Value| {
        response.pointer("/result/content/0/text").and_then(Value::as_str).unwrap_or_default().to_owned()
    };
    let first = wire.request(3, "tools/call", call(json!("k-1"), 500)).await;
    assert_eq!(text(&first), "checkout c-1 completed (#1)", "{first}");
    let again = wire.request(4, "tools/call", call(json!("k-1"), 500)).await;
    assert!(text(&again).starts_with("checkout c-1 completed (#1)"), "a replay: {again}");
    let reused = wire.request(5, "tools/call", call(json!("k-1"), 900)).await;
    assert!(text(&reused).contains("conflict"), "the same key with other arguments: {reused}");
    let another = wire.request(6, "tools/call", call(json!("k-2"), 500)).await;
    assert_eq!(text(&another), "checkout c-1 completed (#2)", "another key, another operation: {another}");
    let keyless = json!({ "name": "complete_checkout", "arguments": { "cart_id": "c-1", "amount_cents": 500 } });
    let refused = wire.request(7, "tools/call", keyless).await;
    assert!(text(&refused).contains(r#"`_meta["idempotency-key"]`, and this call sent none"#), "{refused}");
    let not_a_string = wire.request(8, "tools/call", call(json!(42), 500)).await;
    assert!(text(&not_a_string).contains("not a string"), "{not_a_string}");
    let calls = wire.request(9, "tools/call", call(json!("k-1"), 500)).await;
    assert!(text(&calls).starts_with("checkout c-1 completed (#1)"), "{calls}");
}
