//! The first hour with rmcp, over the wire: rmcp's own `Json<T>` and idem's `ToolError` are
//! stored and replayed; a replay ends with a line of text the model reads (unless the recipe
//! says `replay_note = false`); a server that does not serve `idem_status` is caught, at startup
//! by `mcp::check` and in the log at its first idempotent call.

#![cfg(feature = "rmcp")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_runtime::mcp::{self, ToolContext, ToolError};
use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, idempotent};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, ServerHandler, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct OpenTicket {
    project: String,
    title: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Ticket {
    id: usize,
}

/// A server as the README builds it: its router plus `idem_status` in a field, served.
struct Desk {
    idem: Idem,
    opened: AtomicUsize,
    tool_router: ToolRouter<Self>,
}

impl HasIdem for Desk {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
#[tool_router]
impl Desk {
    fn new() -> Self {
        let tool_router = Self::tool_router() + mcp::status_tool();
        Self { idem: local_idem(), opened: AtomicUsize::new(0), tool_router }
    }

    #[idempotent(key = "project, title")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<Json<Ticket>, ToolError> {
        if args.project == "archived" {
            return Err(ToolError::final_answer(format!("{} is archived", args.project)));
        }
        let _ = args.title;
        Ok(Json(Ticket { id: self.opened.fetch_add(1, Ordering::SeqCst) + 1 }))
    }

    #[idempotent(key = "project, title", replay_note = false)]
    #[tool(description = "Open a ticket, quietly")]
    async fn open_quietly(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        let id = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("ticket {id} in {}", args.project))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Desk {}

fn local_idem() -> Idem {
    Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap()
}

#[path = "support/wire.rs"]
mod wire;
use wire::Wire;

fn content(result: &Value) -> Vec<Value> {
    result["content"].as_array().expect("content blocks").clone()
}

#[tokio::test]
async fn a_replay_ends_with_a_line_the_model_reads() {
    let mut wire = Wire::connect(Desk::new()).await;
    let ticket = json!({ "project": "web", "title": "login fails" });
    let first = wire.call("open_ticket", ticket.clone()).await;
    let again = wire.call("open_ticket", ticket).await;

    assert_eq!(first["_meta"]["dev.idem/outcome"]["replayed"], json!(false), "{first}");
    assert_eq!(again["_meta"]["dev.idem/outcome"]["replayed"], json!(true), "{again}");
    assert_eq!(first["structuredContent"], json!({ "id": 1 }), "rmcp's `Json<T>` is structured: {first}");
    assert_eq!(again["structuredContent"], first["structuredContent"], "the stored `T`, replayed: {again}");

    // Only the prefixed key: the unprefixed `idem` of earlier drafts is gone.
    assert_eq!(first["_meta"].get("idem"), None, "{first}");
    let reference = again["_meta"]["dev.idem/outcome"]["ref"].as_str().expect("a ref").to_owned();
    let (first, again) = (content(&first), content(&again));
    assert_eq!(first.len(), 1, "a fresh answer has no note: {first:?}");
    assert_eq!(again[..1], first[..], "the replay starts with the same content");
    let note = again.last().and_then(|block| block["text"].as_str()).expect("a text block");
    assert_eq!(note, mcp::wire::replay_note(idem_runtime::Ref::parse(&reference).expect("a ref")));
    assert!(note.contains("nothing was executed again") && note.contains(&reference), "{note}");
}

#[tokio::test]
async fn a_replayed_final_error_is_marked_too() {
    let mut wire = Wire::connect(Desk::new()).await;
    let archived = json!({ "project": "archived", "title": "old" });
    let first = wire.call("open_ticket", archived.clone()).await;
    let again = wire.call("open_ticket", archived).await;
    assert_eq!((first["isError"].clone(), again["isError"].clone()), (json!(true), json!(true)));
    assert_eq!(content(&first), [json!({ "type": "text", "text": "archived is archived" })]);
    assert_eq!(content(&again)[..1], content(&first)[..]);
    let note = content(&again)[1]["text"].as_str().unwrap_or_default().to_owned();
    assert!(note.contains("nothing was executed again"), "{again}");
}

#[tokio::test]
async fn replay_note_false_replays_the_content_alone() {
    let mut wire = Wire::connect(Desk::new()).await;
    let ticket = json!({ "project": "web", "title": "quiet" });
    let first = wire.call("open_quietly", ticket.clone()).await;
    let again = wire.call("open_quietly", ticket).await;
    assert_eq!(again["_meta"]["dev.idem/outcome"]["replayed"], json!(true), "{again}");
    assert_eq!(content(&again), content(&first), "no note: {again}");
}

#[tokio::test]
async fn a_tool_called_directly_runs_once_for_a_repeat() {
    let desk = Desk::new();
    let args = || Parameters(OpenTicket { project: "web".to_owned(), title: "login fails".to_owned() });
    let first = desk.open_ticket(ToolContext::local(), args()).await.into_result().expect("opened");
    let again = desk.open_ticket(ToolContext::local(), args()).await.into_result().expect("replayed");
    assert_eq!((first.0.id, again.0.id), (1, 1));
    assert_eq!(desk.opened.load(Ordering::SeqCst), 1);
    // Over HTTP, only the request's authenticated caller counts: another caller, another ticket.
    let other = ToolContext::for_caller(Caller::new("globex", "bob"));
    assert_eq!(desk.open_ticket(other, args()).await.into_result().expect("opened").0.id, 2);
}

/// The same tools behind a plain `#[tool_handler]`, which serves `Self::tool_router()` alone.
struct PlainDesk {
    idem: Idem,
}

impl HasIdem for PlainDesk {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[audit_idempotent]
#[tool_router]
impl PlainDesk {
    #[idempotent(key = "project, title")]
    #[tool(description = "Open a ticket")]
    async fn open_ticket(&self, Parameters(args): Parameters<OpenTicket>) -> Result<String, ToolError> {
        Ok(format!("opened {} in {}", args.title, args.project))
    }
}

#[tool_handler]
impl ServerHandler for PlainDesk {}

#[test]
fn a_server_without_the_status_tool_is_caught_at_startup() {
    let plain = PlainDesk { idem: local_idem() };
    let error = mcp::check(&plain, &PlainDesk::tool_router(), mcp::Transport::Stdio).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("PlainDesk` does not serve `idem_status`"), "{text}");
    assert!(text.contains("#[tool_handler(router = self.tool_router)]"), "says what to do: {text}");
    let desk = Desk::new();
    mcp::check(&desk, &desk.tool_router, mcp::Transport::Stdio).expect("the router with `status_tool` serves it");
}

#[tokio::test]
async fn a_server_without_the_status_tool_is_logged_at_its_first_call() {
    let logged = Arc::new(Mutex::new(Vec::new()));
    let _guard = tracing::subscriber::set_default(Recorder(Arc::clone(&logged)));
    let plain = PlainDesk { idem: local_idem() };
    let args = || Parameters(OpenTicket { project: "web".to_owned(), title: "t".to_owned() });
    for _ in 0..3 {
        plain.open_ticket(ToolContext::local(), args()).await.into_result().expect("served all the same");
    }
    let desk = Desk::new();
    desk.open_ticket(ToolContext::local(), args()).await.into_result().expect("opened");
    let errors = logged.lock().unwrap().clone();
    assert_eq!(errors.len(), 1, "once, for the plain server only: {errors:?}");
    assert!(errors[0].contains("PlainDesk` does not serve `idem_status`"), "{errors:?}");
}

/// Records the `error` field of every event at error level.
struct Recorder(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Field<'a>(&'a mut Option<String>);
        impl tracing::field::Visit for Field<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "error" {
                    *self.0 = Some(format!("{value:?}"));
                }
            }
        }
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut error = None;
            event.record(&mut Field(&mut error));
            self.0.lock().unwrap().extend(error);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
