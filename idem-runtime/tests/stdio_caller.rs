//! A call that no caller can be found for, as the agent and the operator see it: over HTTP the
//! client must authenticate (`no_caller`); over stdio on a server started without
//! `Builder::local_caller`, only the operator can help (`no_local_caller`, logged at WARN) —
//! and `mcp::check` (with `Transport::Stdio`) catches that before serving.

use std::sync::{Arc, Mutex};

use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Rejection, audit_idempotent, idempotent, mcp,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const NO_LOCAL_CALLER: &str = "nothing was executed: this server was started without a caller for local requests, so \
     none of its calls can be made safe to repeat. Retrying will not help: the server's operator must configure one \
     (`Idem::builder(…).local_caller(…)`) and restart it";

const NO_CALLER: &str = "nothing was executed: the call came without an authenticated caller, so it cannot be made \
     safe to repeat. Repeating it unchanged will not help: the client must authenticate (send its credentials with \
     the request) before calling again";

#[derive(Debug, Serialize, Deserialize)]
struct Refused(String);

impl IdempotentError for Refused {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.to_string())
    }
}

impl rmcp::model::IntoContents for Refused {
    fn into_contents(self) -> Vec<rmcp::model::ContentBlock> {
        vec![rmcp::model::ContentBlock::text(self.0)]
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Ticket {
    title: String,
}

#[derive(Clone)]
struct Desk {
    idem: Idem,
    opened: Arc<Mutex<usize>>,
    /// Whether the next request arrives over HTTP (without an authenticated caller).
    over_http: Arc<Mutex<bool>>,
    router: ToolRouter<Self>,
}

impl HasIdem for Desk {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
#[tool_router]
impl Desk {
    fn new(idem: Idem) -> Self {
        let router = Self::tool_router() + mcp::status_tool();
        Self { idem, opened: Arc::default(), over_http: Arc::default(), router }
    }

    #[idempotent(key = "title")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(ticket): Parameters<Ticket>) -> Result<String, Refused> {
        *self.opened.lock().unwrap() += 1;
        Ok(format!("opened {}", ticket.title))
    }
}

#[tool_handler(router = self.router)]
impl rmcp::ServerHandler for Desk {
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        mut context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        // What rmcp's streamable HTTP transport does: the request's parts go into the context.
        if *self.over_http.lock().unwrap() {
            let (parts, ()) = http::Request::builder().uri("/mcp").body(()).unwrap().into_parts();
            context.extensions.insert(parts);
        }
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.router.call(call).await
    }
}

#[path = "support/wire.rs"]
mod wire;
use wire::Wire;

fn text(result: &Value) -> &str {
    result.pointer("/content/0/text").and_then(Value::as_str).unwrap_or_default()
}

fn idem_meta<'a>(result: &'a Value, field: &str) -> Option<&'a Value> {
    result.pointer(&format!("/_meta/dev.idem~1outcome/{field}"))
}

#[path = "support/log.rs"]
mod log;
use log::Captured;

#[test]
fn a_stdio_server_without_a_local_caller_is_caught_before_it_serves() {
    let server = Desk::new(Idem::new(MemoryLedger::new()));
    let error = mcp::check(&server, &server.router, mcp::Transport::Stdio).unwrap_err();
    assert_eq!(
        error.to_string(),
        "refusing to serve on stdio: this server's idem handle has no local caller, and a request over stdio carries \
         no authenticated one, so every idempotent tool call would be refused. Configure the caller this server acts \
         for: `Idem::builder(ledger).local_caller(Caller::try_new(tenant, subject)?).build()?`"
    );
    assert_eq!(
        mcp::check(&server, &server.router, mcp::Transport::Http),
        Ok(()),
        "over HTTP, callers come with requests"
    );
    let local = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("local", "user")).build().unwrap();
    let server = Desk::new(local);
    assert_eq!(mcp::check(&server, &server.router, mcp::Transport::Stdio), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_caller_says_whose_move_it_is() {
    let captured = Captured::default();
    let subscriber = captured.subscriber(tracing::Level::INFO);
    // The server runs on other threads: the subscriber must be global (this binary's only test
    // that installs one).
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let server = Desk::new(Idem::new(MemoryLedger::new()));
    let (opened, over_http) = (Arc::clone(&server.opened), Arc::clone(&server.over_http));
    let mut wire = Wire::connect(server).await;
    let args = json!({ "title": "printer on fire" });

    // Over stdio, on a server started without a local caller: the operator's move.
    let refused = wire.call("open_ticket", args.clone()).await;
    assert_eq!(text(&refused), NO_LOCAL_CALLER, "{refused}");
    assert_eq!(refused["isError"], json!(true));
    assert_eq!(idem_meta(&refused, "code"), Some(&json!("no_local_caller")), "{refused}");
    assert_eq!(idem_meta(&refused, "retry"), Some(&json!("no")), "consistent with the words: {refused}");
    assert_eq!(idem_meta(&refused, "executed"), Some(&json!(false)));
    let status = wire.call("idem_status", json!({ "ref": "0123456789abcdef" })).await;
    assert_eq!(text(&status), NO_LOCAL_CALLER, "the status tool too: {status}");
    let logged = captured.text();
    assert!(
        logged.lines().any(|line| line.contains(" WARN ")
            && line.ends_with(
                "idem_runtime::mcp::caller: refused a call over stdio: this server's idem handle has no local caller, \
             so every idempotent tool call on stdio is refused. Configure one with `Idem::builder(…).local_caller(…)` (and \
             check it at startup with `idem_runtime::mcp::check` and `Transport::Stdio`)"
            )),
        "the operator is told in the log: {logged}"
    );

    // Over HTTP without an authenticated principal: the client's move.
    *over_http.lock().unwrap() = true;
    let refused = wire.call("open_ticket", args).await;
    assert_eq!(text(&refused), NO_CALLER, "{refused}");
    assert_eq!(idem_meta(&refused, "code"), Some(&json!("no_caller")), "{refused}");
    assert_eq!(idem_meta(&refused, "retry"), Some(&json!("no")), "{refused}");
    let status = wire.call("idem_status", json!({ "ref": "0123456789abcdef" })).await;
    assert_eq!(text(&status), NO_CALLER, "the status tool too: {status}");
    assert_eq!(*opened.lock().unwrap(), 0, "nothing ran");
}
