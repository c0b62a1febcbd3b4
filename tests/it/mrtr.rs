//! Multi-round-trip requests (MCP 2026-07-28) through a real rmcp server, on every ledger: a
//! tool that asks for confirmation charges once after the confirmation, never on the first
//! round, and every repeat — of the continuation, or of the original call after it completed —
//! is a replay. Raw JSON-RPC `tools/call` requests carry `inputResponses` and the echoed
//! `requestState` as a client would; the fake processor records every charge with the key it
//! was forwarded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use idem_runtime::ledger::Ledger;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::mcp::{self, Step, ToolError};
use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, current_operation, idempotent};
use rmcp::handler::server::tool::{InputResponses, RequestState};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{ServiceExt, tool, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

macro_rules! on_every_ledger {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("postgres").await } )* }
    };
}

on_every_ledger!(
    an_input_request_never_completes_the_operation,
    a_repeated_continuation_is_a_replay,
    the_original_call_after_completion_is_a_replay,
    a_declined_confirmation_charges_nothing,
    a_tampered_or_foreign_state_is_refused_and_charges_nothing,
    a_single_use_state_is_refused_the_second_time,
    an_input_key_makes_each_chosen_value_its_own_operation,
    a_state_sealed_before_a_rotation_step_is_accepted_after_it,
);

async fn ledger(backend: &str) -> Option<Arc<dyn Ledger>> {
    let test = std::thread::current().name().unwrap_or("mrtr").to_owned();
    match backend {
        "memory" => Some(Arc::new(MemoryLedger::new())),
        "sqlite" => {
            let dir = std::env::temp_dir().join(format!("idem-mrtr-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{}.sqlite3", test.replace("::", "-")));
            let _ = std::fs::remove_file(&file);
            let url = format!("sqlite://{}?mode=rwc", file.display());
            Some(Arc::new(SeaOrmLedger::connect(&url).await.expect("open the SQLite file")))
        }
        "postgres" => {
            idem_tests::durable(&test, "IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test").await
        }
        other => unreachable!("no backend {other}"),
    }
}

/// A ledger of the test's own on the servers (memory and SQLite are already): a test that keys
/// with secret versions of its own would be refused on the suite's shared database, whose other
/// operations live under version 1.
async fn own_ledger(backend: &str, name: &str) -> Option<Arc<dyn Ledger>> {
    if backend != "postgres" {
        return ledger(backend).await;
    }
    let test = std::thread::current().name().unwrap_or("mrtr").to_owned();
    let (env, default) = idem_tests::POSTGRES;
    let url = idem_tests::own_database(&test, env, default, name).await?;
    Some(Arc::new(SeaOrmLedger::connect(&url).await.expect("connect to the test's own database")))
}

/// A unique order id per test run: a shared database keeps earlier runs' operations.
fn order_id() -> String {
    format!("o-{:016x}", idem_runtime::ledger::Token::random().get())
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Charge {
    order_id: String,
    amount_cents: u64,
}

/// The fake card processor: it dedupes nothing and records every charge with the key it was
/// forwarded.
#[derive(Default)]
struct Processor {
    charges: Mutex<Vec<(String, String)>>,
    /// The next charge is refused outright (nothing happened).
    refuse_next: AtomicBool,
}

impl Processor {
    fn charge(&self, order_id: &str) -> Result<String, ToolError> {
        if self.refuse_next.swap(false, Ordering::SeqCst) {
            return Err(ToolError::nothing_happened("the processor is busy; nothing was charged"));
        }
        let key = current_operation().expect("inside the handler").idempotency_key();
        let mut charges = self.charges.lock().unwrap();
        charges.push((order_id.to_owned(), key));
        Ok(format!("charged {order_id} (#{})", charges.len()))
    }

    /// The charges of `order_id`, and how many distinct forwarded keys they carry.
    fn of(&self, order_id: &str) -> (usize, usize) {
        let charges = self.charges.lock().unwrap();
        let mine: Vec<&String> = charges.iter().filter(|(order, _)| order == order_id).map(|(_, key)| key).collect();
        let keys: std::collections::BTreeSet<&&String> = mine.iter().collect();
        (mine.len(), keys.len())
    }
}

struct Till {
    idem: Idem,
    processor: Arc<Processor>,
}

impl HasIdem for Till {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

/// The state the tool keeps across its rounds, given back to it by rmcp's `RequestState`.
const INNER_STATE: &str = "asked-once";

#[tool_router(server_handler)]
#[audit_idempotent]
impl Till {
    #[idempotent(key = "order_id", window = "15m")]
    #[tool(description = "Charge an order; asks the user to confirm first")]
    async fn charge(
        &self,
        Parameters(charge): Parameters<Charge>,
        InputResponses(responses): InputResponses,
        RequestState(state): RequestState,
    ) -> Result<Step<String>, ToolError> {
        match mcp::confirmed(responses.as_ref(), "confirm") {
            None => {
                let mut ask = mcp::confirm("confirm", format!("Charge {} cents?", charge.amount_cents));
                ask.request_state = Some(INNER_STATE.to_owned());
                Ok(Step::InputRequired(ask))
            }
            Some(false) => Err(ToolError::nothing_happened("the user declined; nothing was charged")),
            Some(true) if state.as_deref() != Some(INNER_STATE) => {
                Err(ToolError::invalid(format!("the tool's own state did not come back: {state:?}")))
            }
            Some(true) => self.processor.charge(&charge.order_id).map(Step::Done),
        }
    }

    #[idempotent(key = "order_id", window = "15m", single_use_state = true)]
    #[tool(description = "Charge an order; asks the user to confirm first, and takes each confirmation once")]
    async fn charge_once(
        &self,
        Parameters(charge): Parameters<Charge>,
        InputResponses(responses): InputResponses,
    ) -> Result<Step<String>, ToolError> {
        match mcp::confirmed(responses.as_ref(), "confirm") {
            None => Ok(Step::InputRequired(mcp::confirm("confirm", format!("Charge {} cents?", charge.amount_cents)))),
            Some(false) => Err(ToolError::nothing_happened("the user declined; nothing was charged")),
            Some(true) => self.processor.charge(&charge.order_id).map(Step::Done),
        }
    }

    #[idempotent(key = "order_id", window = "15m", input_key = "pick.content.amount_cents")]
    #[tool(description = "Tip an order; asks the user for the amount")]
    async fn tip(
        &self,
        Parameters(order): Parameters<Order>,
        InputResponses(responses): InputResponses,
    ) -> Result<Step<String>, ToolError> {
        let amount = responses.as_ref().and_then(|responses| responses.get("pick")?.pointer("/content/amount_cents"));
        match amount {
            None => Ok(Step::InputRequired(mcp::confirm("pick", "How much, in cents?"))),
            Some(amount) => self.processor.charge(&format!("{} tip {amount}", order.order_id)).map(Step::Done),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    order_id: String,
}

fn till(ledger: Arc<dyn Ledger>) -> Till {
    let idem = idem_tests::builder(ledger).local_caller(Caller::new("acme", "alice")).build().unwrap();
    Till { idem, processor: Arc::default() }
}

/// A client of the 2026-07-28 revision on one end of an in-memory pipe: no `initialize`, the
/// protocol version and capabilities in every request's `_meta`.
struct Client {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    next_id: u64,
}

impl Client {
    fn connect<S: rmcp::ServerHandler>(server: S) -> Self {
        let (client, server_end) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let running = server.serve(tokio::io::split(server_end)).await.expect("the server starts");
            let _ = running.waiting().await;
        });
        let (reader, writer) = tokio::io::split(client);
        Self { writer, lines: BufReader::new(reader).lines(), next_id: 0 }
    }

    /// A `tools/call` under a new JSON-RPC id; `extra` adds `inputResponses` / `requestState`.
    /// Its `result`.
    async fn call(&mut self, tool: &str, arguments: &Value, extra: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut params = json!({
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "form": {} } },
            },
        });
        if let Value::Object(extra) = extra {
            params.as_object_mut().unwrap().extend(extra);
        }
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params });
        let mut line = serde_json::to_vec(&request).unwrap();
        line.push(b'\n');
        self.writer.write_all(&line).await.unwrap();
        loop {
            let line = tokio::time::timeout(std::time::Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("the server answers")
                .unwrap()
                .expect("the server keeps the pipe open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message.get("result").cloned().unwrap_or_else(|| panic!("no result: {message}"));
            }
        }
    }
}

/// The continuation of `asked`: the same arguments, the answer to its `confirm` request, and
/// its `requestState` echoed.
fn answering(asked: &Value, action: &str) -> Value {
    let mut extra = json!({ "inputResponses": { "confirm": { "action": action, "content": {} } } });
    if let Some(state) = asked.get("requestState") {
        extra["requestState"] = state.clone();
    }
    extra
}

fn outcome(result: &Value) -> &Value {
    &result["_meta"]["dev.idem/outcome"]
}

fn text(result: &Value) -> &str {
    result.pointer("/content/0/text").and_then(Value::as_str).unwrap_or_default()
}

/// The defect this guards against: an `input_required` answer recorded as the operation's
/// result would be replayed to the continuation forever, and the charge would never happen.
async fn an_input_request_never_completes_the_operation(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let server = till(ledger);
    let processor = Arc::clone(&server.processor);
    let mut client = Client::connect(server);
    let order = order_id();
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });

    let asked = client.call("charge", &arguments, json!({})).await;
    assert_eq!(asked["resultType"], json!("input_required"), "{asked}");
    assert!(asked["inputRequests"]["confirm"].is_object(), "{asked}");
    assert_eq!(processor.of(&order), (0, 0), "asking charges nothing");

    let done = client.call("charge", &arguments, answering(&asked, "accept")).await;
    assert_eq!(done["resultType"], json!("complete"), "the continuation runs the handler: {done}");
    assert_eq!(text(&done), format!("charged {order} (#1)"), "{done}");
    assert_eq!(outcome(&done)["replayed"], json!(false), "{done}");
    assert_eq!(processor.of(&order), (1, 1), "one charge after the confirmation");
}

/// Asks, and answers with `action`: the continuation's result.
async fn ask_and_answer(client: &mut Client, tool: &str, arguments: &Value, action: &str) -> (Value, Value) {
    let asked = client.call(tool, arguments, json!({})).await;
    assert_eq!(asked["resultType"], json!("input_required"), "{asked}");
    let answered = client.call(tool, arguments, answering(&asked, action)).await;
    (asked, answered)
}

fn start(backend_ledger: Arc<dyn Ledger>) -> (Client, Arc<Processor>, String) {
    let server = till(backend_ledger);
    let processor = Arc::clone(&server.processor);
    (Client::connect(server), processor, order_id())
}

async fn a_repeated_continuation_is_a_replay(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });
    let (asked, done) = ask_and_answer(&mut client, "charge", &arguments, "accept").await;
    assert_eq!(processor.of(&order), (1, 1), "{done}");

    let again = client.call("charge", &arguments, answering(&asked, "accept")).await;
    assert_eq!(again["resultType"], json!("complete"), "{again}");
    assert_eq!(outcome(&again)["replayed"], json!(true), "the repeated continuation is a replay: {again}");
    assert_eq!(text(&again), text(&done), "the stored result: {again}");
    assert_eq!(outcome(&again)["ref"], outcome(&done)["ref"], "one operation");
    assert_eq!(processor.of(&order), (1, 1), "charged once");
}

async fn the_original_call_after_completion_is_a_replay(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });
    let (_, done) = ask_and_answer(&mut client, "charge", &arguments, "accept").await;
    assert_eq!(outcome(&done)["replayed"], json!(false), "{done}");

    // The confirmation is no part of the operation's identity: the call without it is the
    // same operation, done already.
    let original = client.call("charge", &arguments, json!({})).await;
    assert_eq!(original["resultType"], json!("complete"), "not asked again: {original}");
    assert_eq!(outcome(&original)["replayed"], json!(true), "{original}");
    assert_eq!(text(&original), text(&done), "{original}");
    assert_eq!(processor.of(&order), (1, 1), "charged once");
}

async fn a_declined_confirmation_charges_nothing(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });
    let (asked, declined) = ask_and_answer(&mut client, "charge", &arguments, "decline").await;
    assert_eq!(declined["isError"], json!(true), "{declined}");
    assert!(text(&declined).contains("declined"), "{declined}");
    assert_eq!(processor.of(&order), (0, 0), "declining charges nothing");

    let cancelled = client.call("charge", &arguments, answering(&asked, "cancel")).await;
    assert_eq!(cancelled["isError"], json!(true), "{cancelled}");
    assert_eq!(processor.of(&order), (0, 0), "cancelling charges nothing");

    // Nothing happened, so nothing is replayed: the user may still confirm.
    let (_, done) = ask_and_answer(&mut client, "charge", &arguments, "accept").await;
    assert_eq!(outcome(&done)["replayed"], json!(false), "{done}");
    assert_eq!(processor.of(&order), (1, 1), "{done}");
}

async fn a_tampered_or_foreign_state_is_refused_and_charges_nothing(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });
    let asked = client.call("charge", &arguments, json!({})).await;
    let state = asked["requestState"].as_str().expect("a requestState").to_owned();
    assert!(state.starts_with("idem1."), "idem seals the tool's state: {state}");
    assert!(state.ends_with(&format!(".{INNER_STATE}")), "and keeps it inside: {state}");

    let refused = |result: &Value, code: &str| {
        assert_eq!(result["isError"], json!(true), "{result}");
        assert_eq!(outcome(result)["code"], json!(code), "{result}");
        assert_eq!(outcome(result)["executed"], json!(false), "{result}");
        assert!(text(result).contains("start over"), "words an agent can act on: {result}");
    };
    let accept = json!({ "confirm": { "action": "accept", "content": {} } });
    let with_state = |state: &str| json!({ "inputResponses": accept, "requestState": state });

    // One character of the MAC changed.
    let mut tampered: Vec<char> = state.chars().collect();
    let at = "idem1.".len() + 33 + state["idem1.".len() + 33..].find('.').unwrap() + 1;
    tampered[at] = if tampered[at] == '0' { '1' } else { '0' };
    let tampered: String = tampered.into_iter().collect();
    refused(&client.call("charge", &arguments, with_state(&tampered)).await, "request_state_invalid");
    // The tool's own state changed.
    let swapped = state.replace(INNER_STATE, "asked-twice");
    refused(&client.call("charge", &arguments, with_state(&swapped)).await, "request_state_invalid");
    // Issued for another order, or another amount, or another tool.
    let other_order = json!({ "order_id": order_id(), "amount_cents": 24_000 });
    let foreign = client.call("charge", &other_order, json!({})).await["requestState"].clone();
    refused(&client.call("charge", &arguments, with_state(foreign.as_str().unwrap())).await, "request_state_invalid");
    let other_amount = json!({ "order_id": order, "amount_cents": 99 });
    refused(&client.call("charge", &other_amount, with_state(&state)).await, "request_state_invalid");
    let other_tool = client.call("charge_once", &arguments, json!({})).await["requestState"].clone();
    refused(
        &client.call("charge", &arguments, with_state(other_tool.as_str().unwrap())).await,
        "request_state_invalid",
    );
    // Not idem's at all, or none with the answer.
    refused(&client.call("charge", &arguments, with_state("asked-once")).await, "request_state_invalid");
    refused(&client.call("charge", &arguments, json!({ "inputResponses": accept })).await, "request_state_invalid");
    assert_eq!(processor.of(&order), (0, 0), "no refused continuation charged");

    // Each refusal released the claim as "nothing happened": the real state still works.
    let done = client.call("charge", &arguments, with_state(&state)).await;
    assert_eq!(done["resultType"], json!("complete"), "{done}");
    assert_eq!(outcome(&done)["replayed"], json!(false), "{done}");
    assert_eq!(processor.of(&order), (1, 1));
}

async fn a_single_use_state_is_refused_the_second_time(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order, "amount_cents": 24_000 });

    // The first continuation fails with "nothing happened" (the processor is busy): the
    // operation may run again, but not on the confirmation it used.
    let asked = client.call("charge_once", &arguments, json!({})).await;
    processor.refuse_next.store(true, Ordering::SeqCst);
    let busy = client.call("charge_once", &arguments, answering(&asked, "accept")).await;
    assert_eq!(busy["isError"], json!(true), "{busy}");
    assert!(text(&busy).contains("busy"), "{busy}");
    let again = client.call("charge_once", &arguments, answering(&asked, "accept")).await;
    assert_eq!(outcome(&again)["code"], json!("request_state_used"), "{again}");
    assert!(text(&again).contains("already used; call the tool again"), "{again}");
    assert_eq!(processor.of(&order), (0, 0), "the used confirmation charged nothing");

    // A new confirmation works once; a repeat of its continuation after completion is a
    // replay, never a "used" refusal.
    let (renewed, done) = ask_and_answer(&mut client, "charge_once", &arguments, "accept").await;
    assert_eq!(outcome(&done)["replayed"], json!(false), "{done}");
    let replay = client.call("charge_once", &arguments, answering(&renewed, "accept")).await;
    assert_eq!(outcome(&replay)["replayed"], json!(true), "{replay}");
    assert_eq!(processor.of(&order), (1, 1));

    // Without `single_use_state` the same sequence charges on the second continuation.
    let other = order_id();
    let arguments = json!({ "order_id": other, "amount_cents": 24_000 });
    let asked = client.call("charge", &arguments, json!({})).await;
    processor.refuse_next.store(true, Ordering::SeqCst);
    let busy = client.call("charge", &arguments, answering(&asked, "accept")).await;
    assert_eq!(busy["isError"], json!(true), "{busy}");
    let again = client.call("charge", &arguments, answering(&asked, "accept")).await;
    assert_eq!(outcome(&again)["replayed"], json!(false), "{again}");
    assert_eq!(processor.of(&other), (1, 1));
}

async fn an_input_key_makes_each_chosen_value_its_own_operation(backend: &str) {
    let Some(ledger) = ledger(backend).await else { return };
    let (mut client, processor, order) = start(ledger);
    let arguments = json!({ "order_id": order });
    let asked = client.call("tip", &arguments, json!({})).await;
    let pick = |cents: u64| {
        json!({
            "inputResponses": { "pick": { "action": "accept", "content": { "amount_cents": cents } } },
            "requestState": asked["requestState"],
        })
    };
    let first = client.call("tip", &arguments, pick(500)).await;
    let again = client.call("tip", &arguments, pick(500)).await;
    let other = client.call("tip", &arguments, pick(700)).await;
    assert_eq!(outcome(&first)["replayed"], json!(false), "{first}");
    assert_eq!(outcome(&again)["replayed"], json!(true), "the same amount is the same operation: {again}");
    assert_eq!(outcome(&other)["replayed"], json!(false), "another amount is another operation: {other}");
    assert_ne!(outcome(&other)["ref"], outcome(&first)["ref"]);
    assert_eq!(processor.of(&format!("{order} tip 500")), (1, 1));
    assert_eq!(processor.of(&format!("{order} tip 700")), (1, 1));

    // The call without a chosen amount is another operation again: it only asks.
    let original = client.call("tip", &arguments, json!({})).await;
    assert_eq!(original["resultType"], json!("input_required"), "{original}");
}

/// A rotation step between the two rounds: the first round was answered by a replica keyed with
/// the previous secret, the continuation reaches one keyed with the new secret (the previous one
/// still honoured). The state it echoes opens, the charge happens once, and the user does not
/// have to start over — for a single-use state too.
async fn a_state_sealed_before_a_rotation_step_is_accepted_after_it(backend: &str) {
    let Some(ledger) = own_ledger(backend, "mrtr_rotation").await else { return };
    let base = u32::try_from(idem_runtime::ledger::Token::random().get() % 1_000_000_000).unwrap() + 1_000;
    let (v1, v2) = (
        idem_runtime::secret::Secret::new(base, &[0x11; 32]).unwrap(),
        idem_runtime::secret::Secret::new(base + 1, &[0x22; 32]).unwrap(),
    );
    let alice = Caller::new("acme", "alice");
    let processor = Arc::new(Processor::default());
    let replica = |idem: idem_runtime::settings::Builder| Till {
        idem: idem.local_caller(alice.clone()).build().unwrap(),
        processor: Arc::clone(&processor),
    };
    let mut before = Client::connect(replica(Idem::builder(Arc::clone(&ledger)).secret(v1.clone())));
    let mut after = Client::connect(replica(Idem::builder(ledger).secret(v2).previous_secret(v1)));
    for tool in ["charge", "charge_once"] {
        let order = order_id();
        let arguments = json!({ "order_id": order, "amount_cents": 1_500 });
        let asked = before.call(tool, &arguments, json!({})).await;
        assert_eq!(asked["resultType"], json!("input_required"), "{tool}: {asked}");
        let done = after.call(tool, &arguments, answering(&asked, "accept")).await;
        assert_eq!(
            done["resultType"],
            json!("complete"),
            "{tool}: the state sealed before the step was refused: {done}"
        );
        assert_eq!(
            text(&done),
            format!("charged {order} (#{})", if tool == "charge" { 1 } else { 2 }),
            "{tool}: {done}"
        );
        assert_eq!(processor.of(&order), (1, 1), "{tool}: charged once");
    }
}
