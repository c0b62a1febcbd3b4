//! MCP tasks answered from the ledger, over a real rmcp server: a concurrent repeat of a
//! `task = true` tool from a client that declared `io.modelcontextprotocol/tasks` gets the
//! operation's task; `tasks/get` for it goes working → completed with what a replay gives, is
//! scoped to the caller, and still answers after a restart on the same ledger — on memory,
//! SQLite and PostgreSQL. The downstream counts effects by the forwarded `idempotency_key()`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_runtime::ledger::Ledger;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::mcp::ToolError;
use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, idempotent};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CancelTaskParams, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::wire::{Wire, declares_tasks};
use tokio::sync::{Notify, Semaphore};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Deploy {
    service: String,
    version: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Deployed {
    service: String,
    version: String,
    deployment: String,
}

/// The system that owns the effect: counts deployments by the key idem forwards. A deployment
/// waits at the gate until the test opens it.
struct Downstream {
    effects: Mutex<HashMap<String, usize>>,
    started: Notify,
    gate: Semaphore,
}

impl Default for Downstream {
    fn default() -> Self {
        Self { effects: Mutex::default(), started: Notify::new(), gate: Semaphore::new(0) }
    }
}

#[derive(Clone)]
struct Deployer {
    idem: Idem,
    downstream: Arc<Downstream>,
    router: ToolRouter<Self>,
    advertise_tasks: bool,
}

impl HasIdem for Deployer {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
#[tool_router]
impl Deployer {
    fn new(idem: Idem, downstream: Arc<Downstream>, advertise_tasks: bool) -> Self {
        let router = Self::tool_router() + idem_runtime::mcp::status_tool();
        Self { idem, downstream, router, advertise_tasks }
    }

    #[idempotent(key = "service, version", window = "15m", task = true)]
    #[tool(description = "Deploy a version of a service (slow)")]
    async fn deploy(&self, Parameters(deploy): Parameters<Deploy>) -> Result<Json<Deployed>, ToolError> {
        let key = idem_runtime::current_operation().expect("inside an idempotent handler").idempotency_key();
        self.downstream.started.notify_one();
        let _permit = self.downstream.gate.acquire().await.expect("the gate stays open");
        let count = {
            let mut effects = self.downstream.effects.lock().unwrap();
            let count = effects.entry(key).or_default();
            *count += 1;
            *count
        };
        let deployment = format!("{}@{} (#{count})", deploy.service, deploy.version);
        Ok(Json(Deployed { service: deploy.service, version: deploy.version, deployment }))
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for Deployer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.advertise_tasks {
            ServerCapabilities::builder().enable_tools().enable_tasks().build()
        } else {
            ServerCapabilities::builder().enable_tools().build()
        };
        ServerConfig::new(capabilities)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        idem_runtime::mcp::tasks::get_task(&self.idem, &request, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        idem_runtime::mcp::tasks::cancel_task(&self.idem, &request, &context).await
    }
}

fn server(ledger: Arc<dyn Ledger>, downstream: &Arc<Downstream>, subject: &str) -> Deployer {
    let idem = idem_tests::builder(ledger).local_caller(Caller::new("acme", subject)).build().unwrap();
    Deployer::new(idem, Arc::clone(downstream), true)
}

/// Arguments no earlier run on a persistent database has used.
fn fresh_deploy() -> Value {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    json!({ "service": format!("api-{}-{nanos}", std::process::id()), "version": "1.4.2" })
}

/// The parts of a tool result a model sees.
fn shown(result: &Value) -> Value {
    json!({
        "content": result["content"],
        "structuredContent": result["structuredContent"],
        "isError": result["isError"],
        "_meta": result["_meta"],
    })
}

fn not_found(answer: &Value) {
    assert_eq!(answer.pointer("/error/code"), Some(&json!(-32602)), "{answer}");
    let message = answer.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains("task not found"), "{answer}");
    assert!(answer.get("result").is_none(), "no state of the task is shown: {answer}");
}

/// Two concurrent identical calls → the second gets a task whose id `tasks/get` resolves,
/// working → completed with the result a replay gives; a client without the extension is told
/// "in flight"; another subject and an unknown id get "not found"; cancel is refused in words;
/// after a restart on the same ledger, the same task and the same ref. One effect downstream.
async fn scenario(ledger: Arc<dyn Ledger>, reopened: Option<Arc<dyn Ledger>>) {
    let downstream = Arc::new(Downstream::default());
    let mut alice = Wire::connect(server(Arc::clone(&ledger), &downstream, "alice")).await;
    let deploy = fresh_deploy();

    let first = alice.call("deploy", &deploy, true).await;
    alice.started(first, &downstream.started).await;
    let repeat = alice.call("deploy", &deploy, true).await;
    let repeat = alice.answer(repeat).await;
    let task = repeat.get("result").cloned().unwrap_or_else(|| panic!("a result: {repeat}"));
    assert_eq!(task["resultType"], "task", "{repeat}");
    assert_eq!(task["status"], "working", "{repeat}");
    assert_eq!(task["ttlMs"], 15 * 60 * 1000, "the recipe's window: {repeat}");
    assert!(task["pollIntervalMs"].as_u64().is_some_and(|ms| ms > 0), "{repeat}");
    let task_id = task["taskId"].as_str().expect("a task id").to_owned();

    // A client without the extension is answered as before tasks existed.
    let plain = alice.call("deploy", &deploy, false).await;
    let plain = alice.answer(plain).await;
    assert_eq!(plain.pointer("/result/isError"), Some(&json!(true)), "{plain}");
    assert_eq!(plain.pointer("/result/_meta/dev.idem~1outcome/code"), Some(&json!("in_flight")), "{plain}");
    assert_eq!(
        plain.pointer("/result/_meta/dev.idem~1outcome/ref"),
        Some(&json!(task_id)),
        "the task id is the ref: {plain}"
    );

    let working = alice.get_task(&task_id).await;
    assert_eq!(working.pointer("/result/taskId"), Some(&json!(task_id)), "{working}");
    assert_eq!(working.pointer("/result/status"), Some(&json!("working")), "{working}");
    assert_eq!(working.pointer("/result/createdAt"), task.get("createdAt"), "one task, one creation time: {working}");

    // Another subject of the same tenant, on the same ledger: not found, never its state.
    let mut bob = Wire::connect(server(Arc::clone(&ledger), &downstream, "bob")).await;
    not_found(&bob.get_task(&task_id).await);
    not_found(&alice.get_task("0123456789abcdef").await);
    not_found(&alice.get_task("not-a-task").await);

    let cancel = alice.request("tasks/cancel", json!({ "taskId": task_id, "_meta": declares_tasks() })).await;
    assert_eq!(cancel.pointer("/error/code"), Some(&json!(idem_runtime::mcp::tasks::CANNOT_CANCEL)), "{cancel}");
    let words = cancel.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
    assert!(words.contains("cannot be cancelled") && words.contains("still running"), "{cancel}");

    downstream.gate.add_permits(1_000);
    let first = alice.answer(first).await;
    let first = first.get("result").cloned().unwrap_or_else(|| panic!("a result: {first}"));
    assert_eq!(first["_meta"]["dev.idem/outcome"], json!({ "ref": task_id, "replayed": false }), "{first}");

    let completed = alice.get_task(&task_id).await;
    assert_eq!(completed.pointer("/result/status"), Some(&json!("completed")), "{completed}");
    let result = completed.pointer("/result/result").cloned().expect("the task's result");
    assert_eq!(result["structuredContent"], first["structuredContent"], "the first caller's result: {completed}");
    let replay = alice.call("deploy", &deploy, true).await;
    let replay = alice.answer(replay).await["result"].clone();
    assert_eq!(replay["_meta"]["dev.idem/outcome"], json!({ "ref": task_id, "replayed": true }), "{replay}");
    assert_eq!(shown(&result), shown(&replay), "tasks/get gives what a replay gives");

    if let Some(reopened) = reopened {
        // A new process: a new handle and server on the same database.
        let mut restarted = Wire::connect(server(reopened, &downstream, "alice")).await;
        let after = restarted.get_task(&task_id).await;
        assert_eq!(after.pointer("/result/status"), Some(&json!("completed")), "{after}");
        assert_eq!(shown(&after["result"]["result"]), shown(&replay), "{after}");
        let again = restarted.call("deploy", &deploy, true).await;
        let again = restarted.answer(again).await["result"].clone();
        assert_eq!(again["_meta"]["dev.idem/outcome"], json!({ "ref": task_id, "replayed": true }), "{again}");
    }

    let effects = downstream.effects.lock().unwrap();
    assert_eq!(effects.len(), 1, "one operation reached the downstream: {effects:?}");
    assert_eq!(effects.values().copied().collect::<Vec<_>>(), [1], "and it happened once: {effects:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_memory() {
    scenario(Arc::new(MemoryLedger::new()), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_sqlite_survive_a_restart() {
    let dir = std::env::temp_dir().join(format!("idem-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let ledger = SeaOrmLedger::connect(&url).await.expect("open the SQLite file");
    let reopened = SeaOrmLedger::connect(&url).await.expect("open the SQLite file again");
    scenario(Arc::new(ledger), Some(Arc::new(reopened))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_postgres_survive_a_restart() {
    const URL: &str = "postgres://postgres@127.0.0.1:5432/test";
    let test = "rmcp_tasks::tasks_on_postgres_survive_a_restart";
    let Some(ledger) = idem_tests::durable(test, "IDEM_TEST_POSTGRES_URL", URL).await else { return };
    let Some(reopened) = idem_tests::durable(test, "IDEM_TEST_POSTGRES_URL", URL).await else { return };
    scenario(ledger, Some(reopened)).await;
}

/// A server that does not advertise the extension never hands out a task its `tasks/get`
/// cannot answer: a client with the extension is told "in flight".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_extension_answers_in_flight() {
    let downstream = Arc::new(Downstream::default());
    let idem = idem_tests::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap();
    let mut wire = Wire::connect(Deployer::new(idem, Arc::clone(&downstream), false)).await;
    let deploy = fresh_deploy();
    let first = wire.call("deploy", &deploy, true).await;
    wire.started(first, &downstream.started).await;
    let repeat = wire.call("deploy", &deploy, true).await;
    let repeat = wire.answer(repeat).await;
    assert_eq!(repeat.pointer("/result/_meta/dev.idem~1outcome/code"), Some(&json!("in_flight")), "{repeat}");
    downstream.gate.add_permits(1);
    let first = wire.answer(first).await;
    assert_eq!(first.pointer("/result/_meta/dev.idem~1outcome/replayed"), Some(&json!(false)), "{first}");
}
