//! What `#[idempotent]` expands to on an rmcp tool (feature `rmcp`): the run that answers with a
//! [`ToolOutcome`] and takes the caller from the request context, the checks that a tool's
//! result and error are types rmcp can send, the first-call check that the server serves the
//! status tool, and the argument-kind impls for rmcp's own parameter types. Reached only through `idem_runtime::__private`, beside
//! `crate::macro_support` (the transport-free part); nothing here is public API.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::ServerHandler;
use rmcp::handler::server::tool::IntoCallToolResult;

use super::caller::no_caller;
use super::check::NotReady;
use super::context::ToolContext;
use super::mrtr::Continuation;
use super::outcome::ToolOutcome;
use super::task;
use crate::idem::{Call, Idem, Operation, Ran, Reconciled};
use crate::macro_support::{Arguments, ExtractorKind, HandlerResult, Probe, RawArgumentsKind, Storable, Unrecorded};
use crate::recipe::{CLIENT_KEY_PATH, ClientKey, INPUT_KEY_PREFIX, MAX_CLIENT_KEY_CHARS, Recipe};
use crate::rejection::{IdempotentError, Rejection, STATUS_TOOL};
use crate::scope::Caller;

/// Who calls an rmcp tool, and how its answer is shaped.
pub struct ToolCall<'a> {
    /// The request.
    pub context: &'a ToolContext,
    /// `caller = ...` of the recipe, which comes before the request's.
    pub caller: Option<Caller>,
    /// `false` leaves the replay note out of a replay's text (`_meta` still says it).
    pub replay_note: bool,
    /// For a `task = true` tool: asks whether the server advertises the tasks extension
    /// (answering `None`: it cannot be asked). Asked only when a repeat is about to be answered
    /// with a task, never on the path of an ordinary call: a server that does not advertise it
    /// is never made to answer with a task its `tasks/get` cannot serve.
    pub server_tasks: Option<&'a (dyn Fn() -> Option<bool> + Sync)>,
}

/// Runs an rmcp tool's handler under `recipe`, with the caller from the request context (else
/// the handle's local identity), keeping idem's refusals for the agent-facing result.
pub async fn call_tool<R, M, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    call: ToolCall<'_>,
    arguments: Arguments,
    reconcile: Option<C>,
    handler: F,
) -> ToolOutcome<R>
where
    R: HandlerResult<M>,
    R::Success: ToolSuccess,
    R::Ok: Storable,
    R::Err: IdempotentError + ToolErrorContents,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
    C: FnOnce(Operation) -> CFut,
    CFut: Future<Output = Reconciled<R::Ok, R::Err>>,
{
    let Some(idem) = idem else {
        return ToolOutcome::Refused(Rejection::ledger_unavailable(
            "no idem ledger is configured for this tool (implement `HasIdem`)",
        ));
    };
    // Over HTTP only the request's authenticated caller counts: no fallback to a caller in
    // scope or the local identity.
    let ToolCall { context, caller, replay_note, server_tasks } = call;
    let fallback = !context.is_remote();
    let caller = caller.or_else(|| context.caller().cloned());
    let mut arguments = arguments;
    for path in recipe.input_key_paths() {
        if let Some(value) = context.input_value(path) {
            arguments.select(&format!("{INPUT_KEY_PREFIX}{path}"), value);
        }
    }
    if let Err(rejection) = client_key(recipe, context, &mut arguments) {
        return ToolOutcome::Refused(rejection);
    }
    // A continuation is checked inside the claim it wins: a repeat of a completed operation is
    // a replay before anything about its input is looked at.
    let round = Continuation::of(idem, context, recipe.single_use_state_enabled(), recipe.state_ttl_duration());
    let handler = || round.run(handler);
    let reconcile = |operation| async move {
        match reconcile {
            Some(reconcile) => reconcile(operation).await,
            None => Reconciled::StillUnknown,
        }
    };
    let arguments = arguments.finish();
    let served = idem.execute(Call { recipe, caller: caller.as_ref(), fallback, arguments, reconcile, handler }).await;
    let (value, reference, replayed) = match served {
        Ok(served) => (served.value, served.reference, served.replayed),
        Err(Rejection::NoCaller) => return ToolOutcome::Refused(no_caller(context.is_remote())),
        // A repeat of a running task-capable operation, from a client that can poll: its task.
        Err(Rejection::InFlight { reference, lease_left })
            if task::answers_with_task(recipe, context.declares_tasks(), || server_tasks.and_then(|ask| ask())) =>
        {
            return match task::created(idem, caller.as_ref(), fallback, reference).await {
                Some(task) => ToolOutcome::Task { task, reference },
                None => ToolOutcome::Refused(Rejection::InFlight { reference, lease_left }),
            };
        }
        Err(rejection) => return ToolOutcome::Refused(rejection),
    };
    let result = match value {
        Ran::Outcome(result) => result,
        Ran::Unrecorded(Unrecorded::Asked(asked)) => return ToolOutcome::InputRequired { result: asked, reference },
        Ran::Unrecorded(Unrecorded::Refused(rejection)) => return ToolOutcome::Refused(rejection),
    };
    ToolOutcome::Served { result: R::from_result(result), reference, replayed, replay_note }
}

/// The [`HandlerResult`] shape of rmcp's `Result<Json<T>, E>`: the inner `T` is stored and
/// replayed, and wrapped in `Json` again for rmcp (structured content, the inferred schema).
pub struct RmcpJson;

impl<T, E> HandlerResult<RmcpJson> for Result<rmcp::Json<T>, E> {
    type Success = rmcp::Json<T>;
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Result<T, E> {
        self.map(|json| json.0)
    }
    fn from_result(result: Result<T, E>) -> Self {
        result.map(rmcp::Json)
    }
}

/// What rmcp can send as a tool's result, checked where idem runs the tool so that a type rmcp
/// cannot send is named in idem's words before rmcp's own error about the tool's route.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the result of an rmcp tool",
    label = "the success type of this tool",
    note = "return `rmcp::Json<{Self}>` for structured output (with `schemars::JsonSchema` derived for `{Self}`), \
            or a `String`, a `CallToolResult` or a type that implements `rmcp::model::IntoContents`"
)]
pub trait ToolSuccess {}
impl<T: IntoCallToolResult> ToolSuccess for T {}

/// What rmcp can send as a tool's error (see [`ToolSuccess`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of an rmcp tool: rmcp does not know what to show the model",
    label = "the error type of this tool",
    note = "implement `rmcp::model::IntoContents` for `{Self}` (the words the model reads), or return \
            `idem_runtime::mcp::ToolError`, which does"
)]
pub trait ToolErrorContents {}
impl<T: IntoCallToolResult> ToolErrorContents for T {}

/// At a server type's first idempotent call, logs an error if the server lists this tool but
/// not the status tool that idem's answers name (a plain `#[tool_handler]`): rmcp gives idem no
/// hook when a server starts, so this is the first moment it can tell. Checked once per type;
/// `site` (a static of the calling tool) keeps every later call at that tool off the lock (a
/// tool in an impl generic over the server type is checked for its first instance only).
pub fn check_status_once<S: ?Sized>(
    site: &'static AtomicBool,
    tool: &str,
    serves_status: impl FnOnce(&str) -> Option<bool>,
) {
    if site.swap(true, Ordering::Relaxed) {
        return;
    }
    static CHECKED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let server = std::any::type_name::<S>();
    if !CHECKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(server) {
        return;
    }
    if serves_status(tool) == Some(false) {
        let error = NotReady::NoStatusTool { server };
        tracing::error!(%error, "the status tool is not served");
    }
}

/// For a `task = true` tool: whether its server advertises the tasks extension, logging an
/// error the first time a tool site would have answered with a task and its server does not
/// (its clients get "in flight", never a task, until it does: `ServerCapabilities::builder().enable_tasks()`, and
/// `tasks/get` forwarded to `idem_runtime::mcp::tasks::get_task`).
pub fn server_tasks(site: &'static AtomicBool, tool: &str, advertises: Option<bool>) -> Option<bool> {
    if advertises == Some(false) && !site.swap(true, Ordering::Relaxed) {
        tracing::error!(
            tool,
            "`{tool}` may run as an MCP task (`task = true`), but its server does not advertise the tasks extension: \
             its clients are told \"in flight\" instead. Advertise it in `get_info` \
             (`ServerCapabilities::builder().enable_tools().enable_tasks()`) and forward `tasks/get` to \
             `idem_runtime::mcp::tasks::get_task`"
        );
    }
    advertises
}

/// The success and error types of a `task = true` tool: those whose answer `tasks/get` rebuilds
/// from the stored JSON exactly as a replay renders it from the type.
#[diagnostic::on_unimplemented(
    message = "a `task = true` tool must return `Result<rmcp::Json<T>, ToolError>` or `Result<String, ToolError>`, \
               not `{Self}`",
    label = "the return type of this task tool",
    note = "`tasks/get` may be answered by any replica, after a restart, without the tool's type: it rebuilds the \
            result from the stored JSON as rmcp renders `Json<T>` (structured content) or `String` (text), and the \
            error through `idem_runtime::mcp::ToolError`'s words"
)]
pub trait TaskResult {}
impl<T> TaskResult for Result<rmcp::Json<T>, super::ToolError> {}
impl TaskResult for Result<String, super::ToolError> {}

/// Checks (at compile time) that a `task = true` tool's result is a [`TaskResult`].
pub const fn task_result<R: TaskResult>() {}

/// Asks a server whether it serves the status tool, if it is an rmcp `ServerHandler` (else
/// nothing to ask): `(&&Server(server)).idem_serves_status("tool")`, by autoref as [`Probe`].
pub struct Server<'a, S: ?Sized>(pub &'a S);

/// The server is a `ServerHandler`: `Some(serves)` when it lists `tool` itself (so its
/// `get_tool` is meaningful), else `None`.
pub trait ServerHandlerKind {
    /// Whether the server serves the status tool.
    fn idem_serves_status(&self, tool: &str) -> Option<bool>;
    /// Whether the server advertises the tasks extension (its `get_info`).
    fn idem_advertises_tasks(&self) -> Option<bool>;
}
impl<S: ServerHandler> ServerHandlerKind for &Server<'_, S> {
    fn idem_serves_status(&self, tool: &str) -> Option<bool> {
        self.0.get_tool(tool).map(|_| self.0.get_tool(STATUS_TOOL).is_some())
    }
    fn idem_advertises_tasks(&self) -> Option<bool> {
        Some(self.0.get_info().capabilities.supports_tasks())
    }
}

/// Not a `ServerHandler` (its router is served by another type): nothing to ask.
pub trait OtherServerKind {
    /// Nothing to ask.
    fn idem_serves_status(&self, _tool: &str) -> Option<bool> {
        None
    }
    /// Nothing to ask.
    fn idem_advertises_tasks(&self) -> Option<bool> {
        None
    }
}
impl<S: ?Sized> OtherServerKind for Server<'_, S> {}

/// The server kind traits, for the generated `use`.
pub mod server_kinds {
    pub use super::{OtherServerKind as _, ServerHandlerKind as _};
}

/// A reconcile function that never finds anything (the type of `no_reconcile`).
pub type NoReconcile<T, E> = fn(Operation) -> std::future::Ready<Reconciled<T, E>>;

/// The `reconcile` argument of [`call_tool`] for recipes without one.
#[must_use]
pub const fn no_reconcile<T, E>() -> Option<NoReconcile<T, E>> {
    None
}

/// Level 1 of [`Probe`]: rmcp's raw arguments map is an argument.
impl RawArgumentsKind for &&&&&Probe<'_, rmcp::model::JsonObject> {}

/// Level 3 of [`Probe`]: rmcp's extractors are left out.
impl<T> ExtractorKind for &&&Probe<'_, T> where
    T: rmcp::handler::server::common::FromContextPart<rmcp::handler::server::tool::ToolCallContext<'static, AnyServer>>
{
}

/// Stands for the server type when asking whether a type is one of rmcp's extractors.
pub struct AnyServer;

/// The preferred level of [`ShapeOf`](crate::macro_support::ShapeOf): a `Result` whose `Ok` type
/// has a JSON Schema (what rmcp's `Json<T>` needs too).
pub trait ShapeKind {
    /// The schema of the `Ok` type.
    fn idem_result_schema(&self) -> Option<fn() -> serde_json::Value>;
}

impl<T: schemars::JsonSchema, E> ShapeKind for &crate::macro_support::ShapeOf<Result<T, E>> {
    fn idem_result_schema(&self) -> Option<fn() -> serde_json::Value> {
        Some(schema_of::<T>)
    }
}

fn schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Bool(true))
}

/// Joins the client's own key (`_meta["idempotency-key"]`) to the operation's key when the
/// recipe takes one ([`Recipe::client_key`]); refuses a missing (required) or malformed one.
fn client_key(recipe: &Recipe, context: &ToolContext, arguments: &mut Arguments) -> Result<(), Rejection> {
    let mode = recipe.client_key_mode();
    if mode == ClientKey::Ignored {
        return Ok(());
    }
    match context.client_key() {
        None if mode == ClientKey::Required => Err(Rejection::ClientKey { why: "this call sent none" }),
        None => Ok(()),
        Some(serde_json::Value::String(key)) if key.is_empty() => {
            Err(Rejection::ClientKey { why: "this call sent an empty one" })
        }
        Some(serde_json::Value::String(key)) if key.chars().count() > MAX_CLIENT_KEY_CHARS => {
            Err(Rejection::ClientKey { why: "this call sent one longer than 255 characters" })
        }
        Some(serde_json::Value::String(key)) => {
            arguments.select(CLIENT_KEY_PATH, key);
            Ok(())
        }
        Some(_) => Err(Rejection::ClientKey { why: "this call sent one that is not a string" }),
    }
}
