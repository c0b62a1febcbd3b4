//! Issue 46, item 1: rig agents (`idem_runtime::rig::Idempotent`), driven by rig's scripted
//! completion model through a real `rig-agent` run.
//!
//! The model calls `send_invoice`; the agent is restarted from its history (a new handle on the
//! same SQLite file, the first run's messages passed back as history) and the model, having lost
//! track of it, calls `send_invoice` again under a new call id. The control without idem sends two
//! invoices; wrapped, one — the second call's result is the first one's, marked a replay. The
//! caller is the one the host attaches to each run's tool context.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::rig::Idempotent;
use idem_runtime::{Caller, Idem, Recipe};
use rig_agent::agent::AgentBuilder;
use rig_core::completion::{CompletionRequest, Message};
use rig_core::test_utils::{MockCompletionModel, MockTurn};
use rig_core::tool::{Tool, ToolContext};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct Invoice {
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("the mail server refused the invoice")]
struct Refused;

/// Sends an invoice through a mail server that does not dedupe: every call is an invoice.
#[derive(Clone)]
struct SendInvoice {
    sent: Arc<AtomicUsize>,
}

impl Tool for SendInvoice {
    const NAME: &'static str = "send_invoice";
    type Args = Invoice;
    type Output = String;
    type Error = Refused;

    fn description(&self) -> String {
        "Send an invoice to a customer".to_owned()
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": { "customer": { "type": "string" }, "amount_cents": { "type": "integer" } },
            "required": ["customer", "amount_cents"]
        })
    }

    async fn call(&self, _: &mut ToolContext, invoice: Invoice) -> Result<String, Refused> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("invoice #{n} sent to {} for {}", invoice.customer, invoice.amount_cents))
    }
}

static SEND_INVOICE: Recipe = Recipe::new(SendInvoice::NAME, &["customer", "amount_cents"]);

/// One run of the model's script: it calls `send_invoice` (call id `call_id`), then ends.
fn script(call_id: &str) -> MockCompletionModel {
    MockCompletionModel::from_turns([
        MockTurn::tool_call(call_id, SendInvoice::NAME, json!({ "customer": "acme", "amount_cents": 12_500 })),
        MockTurn::text("The invoice is on its way."),
    ])
}

/// What the tool answered the model, as the model's next request carries it.
fn tool_results(requests: &[CompletionRequest]) -> String {
    format!("{:?}", requests.last().map(|request| &request.chat_history))
}

/// A run's tool context with `caller` attached, as the host sets it.
fn as_caller(tenant: &str, subject: &str) -> ToolContext {
    ToolContext::new().with_scope(Arc::new(Caller::new(tenant, subject)))
}

/// Two runs of an agent with `tool`, the second restarted from the first's history.
async fn two_runs<T: Tool + 'static>(tool: impl Fn() -> T) -> String {
    let first = script("call_1");
    let agent = AgentBuilder::new(first).tool(tool()).build();
    let run = agent
        .prompt("Invoice acme for 125.00")
        .tool_context(as_caller("acme", "billing-agent"))
        .max_turns(3)
        .await
        .expect("the first run ends");
    let history: Vec<Message> = run.messages().to_vec();

    // The restart: a new agent (and, for the wrapped tool, a new handle), the same history, and
    // a model that calls the tool again under a new call id.
    let second = script("call_2");
    let recorded = second.clone();
    let agent = AgentBuilder::new(second).tool(tool()).build();
    agent
        .prompt("Did the invoice go out? Send it if not.")
        .tool_context(as_caller("acme", "billing-agent"))
        .history(history)
        .max_turns(3)
        .await
        .expect("the second run ends");
    tool_results(&recorded.requests())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invoice_called_again_after_a_restart_from_history_is_sent_once() {
    // The control: the plain tool sends the invoice twice.
    let sent = Arc::new(AtomicUsize::new(0));
    let plain = SendInvoice { sent: Arc::clone(&sent) };
    let _ = two_runs(|| plain.clone()).await;
    assert_eq!(sent.load(Ordering::SeqCst), 2, "without idem the second run sends a second invoice");

    // Wrapped: each run on its own handle over one SQLite file, as a restarted host would be.
    let dir = std::env::temp_dir().join(format!("idem-rig-{}-{}", std::process::id(), line!()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let sent = Arc::new(AtomicUsize::new(0));
    let handles: Vec<Idem> = {
        let mut handles = Vec::new();
        for _ in 0..2 {
            handles.push(idem_tests::idem(SeaOrmLedger::connect(&url).await.expect("open the SQLite file")));
        }
        handles
    };
    let next = AtomicUsize::new(0);
    let wrapped = || {
        let idem = handles[next.fetch_add(1, Ordering::SeqCst) % 2].clone();
        Idempotent::new(SendInvoice { sent: Arc::clone(&sent) }, idem, &SEND_INVOICE)
    };
    let answered = two_runs(wrapped).await;
    assert_eq!(sent.load(Ordering::SeqCst), 1, "one invoice across the restart");
    assert!(!answered.contains("invoice #2"), "the repeat did not send another: {answered}");
    assert!(answered.contains("nothing was executed again"), "and the model is told it was a replay: {answered}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another caller (attached to its run's tool context) is another operation: alice's repeat is a
/// replay, bob's call his own. A run without a caller is refused in words, and the tool does not
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_has_its_own_invoice_and_a_run_without_one_is_refused() {
    let sent = Arc::new(AtomicUsize::new(0));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let tool = || Idempotent::new(SendInvoice { sent: Arc::clone(&sent) }, idem.clone(), &SEND_INVOICE);
    for subject in ["alice", "bob", "alice"] {
        let agent = AgentBuilder::new(script("call_1")).tool(tool()).build();
        agent.prompt("Invoice acme").tool_context(as_caller("acme", subject)).max_turns(3).await.expect("the run ends");
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2, "alice's repeat is a replay; bob's call is his own");

    let model = script("call_1");
    let recorded = model.clone();
    let agent = AgentBuilder::new(model).tool(tool()).build();
    let _ = agent.prompt("Invoice acme").max_turns(3).await;
    assert_eq!(sent.load(Ordering::SeqCst), 2, "a run without a caller runs nothing");
    let answered = tool_results(&recorded.requests());
    assert!(answered.contains("this agent run has no caller"), "the model is told why: {answered}");
}

/// Two calls of one operation at once (the model emits it twice in one turn, the agent runs its
/// tools concurrently): the second is told "in flight" in words it can act on, and one invoice
/// is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_repeat_is_told_it_is_in_flight() {
    #[derive(Clone)]
    struct Slow(SendInvoice);
    impl Tool for Slow {
        const NAME: &'static str = SendInvoice::NAME;
        type Args = Invoice;
        type Output = String;
        type Error = Refused;
        fn description(&self) -> String {
            self.0.description()
        }
        fn parameters(&self) -> serde_json::Value {
            self.0.parameters()
        }
        async fn call(&self, context: &mut ToolContext, invoice: Invoice) -> Result<String, Refused> {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            self.0.call(context, invoice).await
        }
    }
    let sent = Arc::new(AtomicUsize::new(0));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let arguments = json!({ "customer": "acme", "amount_cents": 12_500 });
    let name = rig_core::message::ToolName::new(SendInvoice::NAME).expect("a tool name");
    let model = MockCompletionModel::from_turns([
        MockTurn::from_contents([
            rig_core::message::AssistantContent::tool_call("call_1", name.clone(), arguments.clone()),
            rig_core::message::AssistantContent::tool_call("call_2", name, arguments),
        ]),
        MockTurn::text("done"),
    ]);
    let recorded = model.clone();
    let agent = AgentBuilder::new(model)
        .tool(Idempotent::new(Slow(SendInvoice { sent: Arc::clone(&sent) }), idem, &SEND_INVOICE))
        .build();
    agent
        .prompt("Invoice acme twice, fast")
        .tool_context(as_caller("acme", "billing-agent"))
        .tool_concurrency(2)
        .max_turns(3)
        .await
        .expect("the run ends");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "one invoice");
    let answered = tool_results(&recorded.requests());
    assert!(answered.contains("in flight, ref"), "the repeat is told it is in flight: {answered}");
}

/// A tool that times out after its effect (the mail server took the invoice, its answer did not
/// come back): rig calls a timeout retryable, but the invoice may be out, so by default a repeat
/// is refused as outcome unknown and no second invoice is sent; the same for a network error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_effect_leaves_the_outcome_unknown() {
    use rig_core::tool::ToolExecutionError;
    #[derive(Clone)]
    struct LostAnswer {
        sent: Arc<AtomicUsize>,
        error: fn(String) -> ToolExecutionError,
    }
    impl Tool for LostAnswer {
        const NAME: &'static str = SendInvoice::NAME;
        type Args = Invoice;
        type Output = String;
        type Error = ToolExecutionError;
        fn description(&self) -> String {
            "Send an invoice to a customer".to_owned()
        }
        fn parameters(&self) -> serde_json::Value {
            json!({ "type": "object" })
        }
        async fn call(&self, _: &mut ToolContext, _: Invoice) -> Result<String, ToolExecutionError> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            Err((self.error)("the mail server did not answer in time".to_owned()))
        }
    }
    for (kind, error) in [
        ("timeout", ToolExecutionError::timeout as fn(String) -> ToolExecutionError),
        ("network", ToolExecutionError::network),
    ] {
        assert_eq!(error(String::new()).retryable(), Some(true), "rig calls a {kind} error retryable");
        let sent = Arc::new(AtomicUsize::new(0));
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let tool = Idempotent::new(LostAnswer { sent: Arc::clone(&sent), error }, idem, &SEND_INVOICE);
        let invoice = || Invoice { customer: "acme".to_owned(), amount_cents: 12_500 };
        let first = tool.call(&mut as_caller("acme", "billing-agent"), invoice()).await;
        assert!(first.is_err(), "{kind}: the tool's error reaches the model");
        let repeat = tool.call(&mut as_caller("acme", "billing-agent"), invoice()).await;
        assert_eq!(sent.load(Ordering::SeqCst), 1, "{kind}: the repeat sends no second invoice");
        let refused = repeat.expect_err("the repeat is refused");
        assert!(refused.to_string().contains("outcome unknown"), "{kind}: the repeat is told why: {refused}");
    }
}
