//! [`ToolContext`]: what an idempotent rmcp tool needs from its request — the authenticated
//! caller, whether the request came over HTTP, whether its client declared the tasks extension,
//! and a continuation's input responses and `requestState` — as the rmcp extractor
//! `#[idempotent]` adds to the tool, and as a value a unit test builds in one call.
//!
//! Guarantees: read from a request, it carries exactly what [`caller_of`] and [`is_remote`]
//! say of that request, so a tool answers as it would with the request in hand. It runs before
//! the tool's own extractors: it copies the input responses (the tool's `InputResponses` still
//! gets them), and takes the `requestState` idem sealed, leaving the tool's own state inside it
//! for the tool's `RequestState`. Nothing in the state is trusted until it is checked inside
//! the continuation's claim.

use rmcp::ErrorData;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::InputResponses;
use serde_json::Value;

use super::caller::{caller_of, is_remote};
use crate::idem::EchoedState;
use crate::recipe::CLIENT_KEY_META;
use crate::scope::Caller;

/// The request an idempotent rmcp tool answers, as idem needs it: `#[idempotent]` adds a
/// parameter of this type in front of the tool's own (after `&self`), which rmcp fills from
/// each request.
///
/// # Testing a tool
///
/// A unit test calls the tool method directly, with a context built here instead of rmcp's
/// `RequestContext` (which only a running service can make), and
/// [`ToolOutcome::into_result`](super::ToolOutcome::into_result) turns the answer back into the
/// tool's own `Result`:
///
/// ```text
/// let server = Payments::new(Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap());
/// let first = server.charge_card(ToolContext::local(), Parameters(charge())).await.into_result();
/// let again = server.charge_card(ToolContext::local(), Parameters(charge())).await.into_result();
/// assert_eq!(first.unwrap().0, again.unwrap().0); // replayed: the processor charged once
/// ```
///
/// The call goes through the ledger exactly as over MCP: a repeat is replayed, a conflict or an
/// in-flight call is refused. (`examples/mcp_server.rs` has such a test.)
///
/// A continuation of a tool that asked for input ([`Step`](super::Step)) is called with
/// [`with_request_state`](Self::with_request_state) (the state the tool's answer carried) and
/// [`with_input_responses`](Self::with_input_responses), and the same responses for the tool's
/// own `InputResponses` parameter.
#[derive(Debug, Clone, Default)]
pub struct ToolContext {
    caller: Option<Caller>,
    remote: bool,
    tasks: bool,
    input_responses: Option<InputResponses>,
    state: Option<EchoedState>,
    /// The request's `_meta["idempotency-key"]`, as sent.
    client_key: Option<Value>,
}

impl ToolContext {
    /// As a request over stdio: no authenticated caller, so the caller in scope or the handle's
    /// local identity ([`Builder::local_caller`](crate::settings::Builder::local_caller)) is used.
    #[must_use]
    pub fn local() -> Self {
        Self::default()
    }

    /// As a request over HTTP that an auth middleware authenticated as `caller`.
    #[must_use]
    pub fn for_caller(caller: Caller) -> Self {
        Self { caller: Some(caller), remote: true, ..Self::default() }
    }

    /// As a request whose client declared (`true`) the tasks extension
    /// (`io.modelcontextprotocol/tasks`), or did not.
    #[must_use]
    pub const fn with_tasks(mut self, tasks: bool) -> Self {
        self.tasks = tasks;
        self
    }

    /// What `request` says: its authenticated caller (the [`Caller`] an HTTP auth middleware put
    /// into the request's extensions), whether it came over HTTP, and whether its client declared the tasks extension (the
    /// request's client capabilities, as rmcp reads them).
    #[must_use]
    pub fn from_request(request: &rmcp::service::RequestContext<rmcp::RoleServer>) -> Self {
        let tasks = request.client_capabilities().is_some_and(|capabilities| capabilities.supports_tasks());
        let client_key = request.meta.0.get(CLIENT_KEY_META).cloned();
        Self { caller: caller_of(request), remote: is_remote(request), tasks, client_key, ..Self::default() }
    }

    /// As a request whose `_meta` carries the client's own key `key` (`"idempotency-key"`).
    #[must_use]
    pub fn with_client_key(mut self, key: impl Into<String>) -> Self {
        self.client_key = Some(Value::String(key.into()));
        self
    }

    /// The request's `_meta["idempotency-key"]`, as sent.
    pub(crate) const fn client_key(&self) -> Option<&Value> {
        self.client_key.as_ref()
    }

    /// As a continuation of a multi-round-trip request that answers with `responses` (the
    /// tool's own `InputResponses` parameter should get the same).
    #[must_use]
    pub fn with_input_responses(mut self, responses: InputResponses) -> Self {
        self.input_responses = Some(responses);
        self
    }

    /// As a continuation that echoes `state`, the `requestState` of the input request it
    /// answers (as the tool's answer carried it).
    #[must_use]
    pub fn with_request_state(mut self, state: impl AsRef<str>) -> Self {
        self.state = Some(EchoedState::parse(state.as_ref()));
        self
    }

    /// The input responses of a continuation, if the request carries any.
    #[must_use]
    pub const fn input_responses(&self) -> Option<&InputResponses> {
        self.input_responses.as_ref()
    }

    /// The value at an input-response path (`"pick.content.amount"`: the `amount` field of the
    /// `content` of the response to the input request `pick`).
    pub(crate) fn input_value(&self, path: &str) -> Option<&Value> {
        let mut segments = path.split('.');
        let first = self.input_responses.as_ref()?.get(segments.next()?)?;
        segments.try_fold(first, |value, segment| value.as_object()?.get(segment))
    }

    /// The `requestState` the request echoed, taken apart but unchecked.
    pub(crate) const fn echoed_state(&self) -> Option<&EchoedState> {
        self.state.as_ref()
    }

    /// The request's authenticated caller, if it has one.
    #[must_use]
    pub const fn caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }

    /// Whether the request came over HTTP: then only its authenticated caller counts, never the
    /// local identity nor a caller in scope.
    #[must_use]
    pub const fn is_remote(&self) -> bool {
        self.remote
    }

    /// Whether the request's client declared the tasks extension (`io.modelcontextprotocol/tasks`):
    /// only then may a `task = true` tool answer with a task. Clients without it get exactly
    /// the answers they got before tasks existed.
    #[must_use]
    pub const fn declares_tasks(&self) -> bool {
        self.tasks
    }
}

impl<S> FromContextPart<ToolCallContext<'_, S>> for ToolContext {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let mut this = Self::from_request(&context.request_context);
        this.input_responses.clone_from(&context.input_responses);
        this.state = context.request_state.take().map(|text| EchoedState::parse(&text));
        // The tool's own state, for its `RequestState`: checked with the rest before it runs.
        context.request_state = this.state.as_ref().and_then(EchoedState::inner).map(str::to_owned);
        Ok(this)
    }
}
