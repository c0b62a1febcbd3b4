//! `wait` over a real rmcp server, and its composition with tasks: a repeat `tools/call` that
//! finds its operation in flight waits for it and is answered with its result, as a replay
//! (`_meta["dev.idem/outcome"].replayed`), or "in flight" once a wait shorter than the holder is
//! over — and for a `task = true` tool, a client that declared the tasks extension gets the
//! operation's task after the wait, a client without it "in flight". On memory, SQLite and
//! PostgreSQL (skipped by name without a server; a failure under `CI=true`).
//!
//! The first call runs on one server and the repeats mostly on another on the same ledger, as
//! on two replicas (they share nothing but the ledger), so a repeat that waits is seen reading
//! the record (the ledger beneath each replica counts its claims and reads). The handler holds
//! at a gate the test opens, so what the repeat is answered is decided by the order of events,
//! never by a clock. The downstream counts effects by the forwarded `idempotency_key()`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::ledger::Token;
use idem_runtime::mcp::ToolError;
use idem_runtime::{
    Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, current_operation, idempotent, ledger::Ledger,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::wire::{Wire, declares_tasks};
use tokio::sync::{Notify, Semaphore};

/// The `_meta` key of idem's outcome on a tool result.
const OUTCOME: &str = "dev.idem/outcome";
/// The `_meta` key of a tool definition's recipe.
const RECIPE: &str = "dev.idem/recipe";

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
/// happens, then holds at the gate until the test opens it, then says it has finished.
struct Downstream {
    effects: Mutex<HashMap<String, usize>>,
    started: Notify,
    gate: Semaphore,
    finished: AtomicBool,
}

impl Default for Downstream {
    fn default() -> Self {
        Self {
            effects: Mutex::default(),
            started: Notify::new(),
            gate: Semaphore::new(0),
            finished: AtomicBool::new(false),
        }
    }
}

impl Downstream {
    async fn deploy(&self, deploy: Deploy) -> Deployed {
        let key = current_operation().expect("inside an idempotent handler").idempotency_key();
        let count = {
            let mut effects = self.effects.lock().unwrap();
            let count = effects.entry(key).or_default();
            *count += 1;
            *count
        };
        self.started.notify_one();
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        self.finished.store(true, Ordering::SeqCst);
        let deployment = format!("{}@{} (#{count})", deploy.service, deploy.version);
        Deployed { service: deploy.service, version: deploy.version, deployment }
    }

    fn open(&self) {
        self.gate.add_permits(1_000);
    }

    fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// One operation reached the downstream, once.
    fn assert_one_effect(&self) {
        let effects = self.effects.lock().unwrap();
        assert_eq!(effects.len(), 1, "one operation reached the downstream: {effects:?}");
        assert_eq!(effects.values().copied().collect::<Vec<_>>(), [1], "and it happened once: {effects:?}");
    }
}

#[derive(Clone)]
struct Deployer {
    idem: Idem,
    downstream: Arc<Downstream>,
    router: ToolRouter<Self>,
}

impl HasIdem for Deployer {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
#[tool_router]
impl Deployer {
    fn new(idem: Idem, downstream: Arc<Downstream>) -> Self {
        let router = Self::tool_router() + idem_runtime::mcp::status_tool();
        Self { idem, downstream, router }
    }

    #[idempotent(key = "service, version", window = "15m", wait = "5s")]
    #[tool(description = "Deploy a version of a service (slow; a repeat waits up to 5 s for it)")]
    async fn deploy(&self, Parameters(deploy): Parameters<Deploy>) -> Result<Json<Deployed>, ToolError> {
        Ok(Json(self.downstream.deploy(deploy).await))
    }

    #[idempotent(key = "service, version", window = "15m", wait = "1s")]
    #[tool(description = "Deploy a version of a service (slower than a repeat waits)")]
    async fn deploy_briefly(&self, Parameters(deploy): Parameters<Deploy>) -> Result<Json<Deployed>, ToolError> {
        Ok(Json(self.downstream.deploy(deploy).await))
    }

    #[idempotent(key = "service, version", window = "15m", wait = "1s", task = true)]
    #[tool(description = "Deploy a version of a service (slower than a repeat waits; runs as a task)")]
    async fn deploy_as_task(&self, Parameters(deploy): Parameters<Deploy>) -> Result<Json<Deployed>, ToolError> {
        Ok(Json(self.downstream.deploy(deploy).await))
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for Deployer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        idem_runtime::mcp::tasks::get_task(&self.idem, &request, &context).await
    }
}

/// What one replica's ledger sees (a [`Tapped`] ledger): the claims it has answered and the
/// reads of a record (what a waiter that does not hold the claim sends while it waits).
struct Watched {
    answered: AtomicUsize,
    lookups: AtomicUsize,
}

impl Watched {
    fn new(inner: Arc<dyn Ledger>) -> Arc<Tapped<Self>> {
        Tapped::new(inner, Self { answered: AtomicUsize::new(0), lookups: AtomicUsize::new(0) })
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }

    /// Until this replica's ledger has answered `n` claims.
    async fn answered(&self, n: usize) {
        let answered = async {
            while self.answered.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), answered).await.expect("the repeats reach the ledger");
    }
}

impl Tap for Watched {
    fn before(&self, call: Call) -> Pass {
        if call == Call::Lookup {
            self.lookups.fetch_add(1, Ordering::SeqCst);
        }
        Pass::Through
    }

    fn after(&self, call: Call) {
        if call == Call::Claim {
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Two servers on one ledger, as two replicas, each over its own ledger counter: the first
/// call's (`here`) and another's (`there`).
struct Replicas {
    downstream: Arc<Downstream>,
    here: Wire,
    here_ledger: Arc<Tapped<Watched>>,
    there: Wire,
    there_ledger: Arc<Tapped<Watched>>,
}

async fn replicas(backend: &str, test: &str) -> Option<Replicas> {
    let shared = ledger(backend, test).await?;
    let downstream = Arc::new(Downstream::default());
    let (here_ledger, there_ledger) = (Watched::new(Arc::clone(&shared)), Watched::new(shared));
    let server = |ledger: &Arc<Tapped<Watched>>| {
        let ledger: Arc<dyn Ledger> = ledger.clone();
        // A namespace of its own: `rmcp_tasks` serves another `deploy` handler on the same
        // databases, and two handlers under one tool name are refused (`duplicate_tool`).
        let idem = idem_tests::builder(ledger)
            .namespace("idem-tests-waiting")
            .local_caller(Caller::new("acme", "alice"))
            .build()
            .unwrap();
        Deployer::new(idem, Arc::clone(&downstream))
    };
    let here = Wire::connect(server(&here_ledger)).await;
    let there = Wire::connect(server(&there_ledger)).await;
    Some(Replicas { downstream, here, here_ledger, there, there_ledger })
}

/// The ledger of `backend`, or `None` (reported skipped; a failure under CI).
async fn ledger(backend: &str, test: &str) -> Option<Arc<dyn Ledger>> {
    let test = format!("rmcp_waiting::{backend}::{test}");
    match backend {
        "memory" => Some(Arc::new(MemoryLedger::new())),
        "sqlite" => {
            let dir = std::env::temp_dir().join(unique("idem-rmcp-waiting"));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
            let ledger = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("open a SQLite file");
            Some(Arc::new(ledger))
        }
        _ => idem_tests::durable(&test, "IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test").await,
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Token::random().get())
}

/// Arguments no earlier run on a persistent database has used.
fn fresh_deploy() -> Value {
    json!({ "service": unique("api"), "version": "1.4.2" })
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("postgres").await } )* }
    };
}

on_every_backend!(
    concurrent_repeats_wait_and_are_answered_with_the_first_calls_result,
    a_holder_slower_than_the_wait_is_answered_in_flight,
    a_task_tool_answers_a_waited_repeat_with_its_task_or_in_flight,
);

/// Two repeats arrive while the first call runs — one on its own server, one on another replica
/// — and find it in flight (the ledger answered their claims before the gate opened). Both
/// wait and are answered with the first call's result, marked replayed and not "in flight",
/// after the handler finished; the downstream saw one effect.
async fn concurrent_repeats_wait_and_are_answered_with_the_first_calls_result(backend: &str) {
    let test = "concurrent_repeats_wait_and_are_answered_with_the_first_calls_result";
    let Some(mut r) = replicas(backend, test).await else { return };
    let deploy = fresh_deploy();

    let first = r.here.call("deploy", &deploy, false).await;
    r.here.started(first, &r.downstream.started).await;
    let repeat_here = r.here.call("deploy", &deploy, false).await;
    let repeat_there = r.there.call("deploy", &deploy, false).await;
    // Both repeats have found the operation in flight: only now does the first call finish. The
    // repeat on the holder's own replica asks no ledger (the claim is held in its process: it is
    // answered "in flight" at once, then waits), so it is given a moment instead.
    r.here_ledger.answered(1).await;
    r.there_ledger.answered(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!r.downstream.finished(), "the first call is still running");
    r.downstream.open();

    let repeat_here = r.here.result(repeat_here).await;
    assert!(r.downstream.finished(), "answered only after the first call finished: {repeat_here}");
    let repeat_there = r.there.result(repeat_there).await;
    let first = r.here.result(first).await;
    let reference = first["_meta"][OUTCOME]["ref"].as_str().expect("the first call's ref").to_owned();
    assert_eq!(first["_meta"][OUTCOME], json!({ "ref": reference, "replayed": false }), "{first}");
    assert_eq!(first["isError"], json!(false), "{first}");
    for repeat in [&repeat_here, &repeat_there] {
        assert_eq!(repeat["_meta"][OUTCOME], json!({ "ref": reference, "replayed": true }), "not in flight: {repeat}");
        assert_eq!(repeat["isError"], json!(false), "{repeat}");
        assert_eq!(repeat["structuredContent"], first["structuredContent"], "the first call's result: {repeat}");
    }
    assert!(r.there_ledger.lookups() > 0, "the repeat on the other replica read the record while it waited");
    r.downstream.assert_one_effect();
}

/// A repeat that finds a holder slower than its wait (`wait = "1s"`, the handler held at the
/// gate) waits — reading the record — and is told "in flight" with the operation's ref before
/// the holder finished; the holder still records its result, which a later repeat replays.
async fn a_holder_slower_than_the_wait_is_answered_in_flight(backend: &str) {
    let Some(mut r) = replicas(backend, "a_holder_slower_than_the_wait_is_answered_in_flight").await else { return };
    let deploy = fresh_deploy();

    let first = r.here.call("deploy_briefly", &deploy, false).await;
    r.here.started(first, &r.downstream.started).await;
    let repeat = r.there.call("deploy_briefly", &deploy, false).await;
    let repeat = r.there.result(repeat).await;
    assert!(!r.downstream.finished(), "answered while the first call still runs: {repeat}");
    assert_eq!(repeat["isError"], json!(true), "{repeat}");
    assert_eq!(repeat["_meta"][OUTCOME]["code"], "in_flight", "{repeat}");
    assert!(r.there_ledger.lookups() > 0, "the repeat waited, reading the record, before it was told: {repeat}");

    r.downstream.open();
    let first = r.here.result(first).await;
    let reference = &repeat["_meta"][OUTCOME]["ref"];
    assert_eq!(first["_meta"][OUTCOME], json!({ "ref": reference, "replayed": false }), "{first}");
    let later = r.there.call("deploy_briefly", &deploy, false).await;
    let later = r.there.result(later).await;
    assert_eq!(later["_meta"][OUTCOME], json!({ "ref": reference, "replayed": true }), "{later}");
    assert_eq!(later["structuredContent"], first["structuredContent"], "{later}");
    r.downstream.assert_one_effect();
}

/// `wait = "1s", task = true` on a server that advertises tasks, the holder slower than the
/// wait: a repeat from a client that declared the tasks extension waits, then gets the
/// operation's task (its id is the ref); a repeat from a client without it waits, then is told
/// "in flight". Both before the holder finished; `tasks/get` then finds it completed.
async fn a_task_tool_answers_a_waited_repeat_with_its_task_or_in_flight(backend: &str) {
    let test = "a_task_tool_answers_a_waited_repeat_with_its_task_or_in_flight";
    let Some(mut r) = replicas(backend, test).await else { return };
    let deploy = fresh_deploy();

    let first = r.here.call("deploy_as_task", &deploy, false).await;
    r.here.started(first, &r.downstream.started).await;

    let task = r.there.call("deploy_as_task", &deploy, true).await;
    let task = r.there.result(task).await;
    assert!(!r.downstream.finished(), "answered while the first call still runs: {task}");
    assert_eq!(task["resultType"], "task", "{task}");
    assert_eq!(task["status"], "working", "{task}");
    let task_id = task["taskId"].as_str().expect("a task id").to_owned();
    let waited = r.there_ledger.lookups();
    assert!(waited > 0, "the repeat waited, reading the record, before it got the task: {task}");

    let plain = r.there.call("deploy_as_task", &deploy, false).await;
    let plain = r.there.result(plain).await;
    assert!(!r.downstream.finished(), "answered while the first call still runs: {plain}");
    assert_eq!(plain["isError"], json!(true), "{plain}");
    assert_eq!(plain["_meta"][OUTCOME]["code"], "in_flight", "{plain}");
    assert_eq!(plain["_meta"][OUTCOME]["ref"], json!(task_id), "the task id is the ref: {plain}");
    assert!(r.there_ledger.lookups() > waited, "the plain repeat waited too: {plain}");

    r.downstream.open();
    let first = r.here.result(first).await;
    assert_eq!(first["_meta"][OUTCOME], json!({ "ref": task_id, "replayed": false }), "{first}");
    let completed = r.there.request("tasks/get", json!({ "taskId": task_id, "_meta": declares_tasks() })).await;
    assert_eq!(completed.pointer("/result/status"), Some(&json!("completed")), "{completed}");
    let result = completed.pointer("/result/result/structuredContent").expect("the task's result");
    assert_eq!(result, &first["structuredContent"], "the first call's result: {completed}");
    r.downstream.assert_one_effect();
}

/// Each tool's definition advertises its wait (and `task`) in the recipe under
/// `_meta["dev.idem/recipe"]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_definition_advertises_the_wait() {
    let idem = idem_tests::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap();
    let mut wire = Wire::connect(Deployer::new(idem, Arc::new(Downstream::default()))).await;
    let listed = wire.request("tools/list", json!({})).await;
    let tools = listed.pointer("/result/tools").and_then(Value::as_array).expect("the tools");
    let recipe = |name: &str| {
        let tool = tools.iter().find(|tool| tool["name"] == name).unwrap_or_else(|| panic!("`{name}`: {listed}"));
        tool["_meta"][RECIPE].clone()
    };
    let deploy = recipe("deploy");
    assert_eq!(deploy["waitMs"], 5000, "{deploy}");
    assert_eq!(deploy["key"], json!(["service", "version"]), "{deploy}");
    assert!(deploy.get("task").is_none(), "{deploy}");
    let briefly = recipe("deploy_briefly");
    assert_eq!(briefly["waitMs"], 1000, "{briefly}");
    let task = recipe("deploy_as_task");
    assert_eq!((&task["waitMs"], &task["task"]), (&json!(1000), &json!(true)), "{task}");
}
