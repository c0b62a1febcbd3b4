//! What `#[idempotent]` expands to on an rmcp tool (feature `rmcp`): the run that answers with a
//! [`ToolOutcome`] and takes the caller from the request context, and the argument-kind impls
//! for rmcp's own parameter types. Reached only through `idem_runtime::__private`, beside
//! `crate::macro_support` (the transport-free part); nothing here is public API.

use std::future::Future;

use rmcp::handler::server::tool::IntoCallToolResult;

use super::context::ToolContext;
use super::outcome::ToolOutcome;
use crate::idem::{Idem, Operation, Reconciled};
use crate::macro_support::{Arguments, ExtractorKind, HandlerResult, Probe, RawArgumentsKind, Storable};
use crate::recipe::Recipe;
use crate::rejection::{IdempotentError, Rejection};
use crate::scope::Caller;

/// Runs an rmcp tool's handler under `recipe`, with the caller from the request context (else
/// the handle's local identity), keeping idem's refusals for the agent-facing result.
pub async fn run_mcp<R, M, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    context: &ToolContext,
    caller: Option<Caller>,
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
    let fallback = !context.is_remote();
    let caller = caller.or_else(|| context.caller().cloned());
    let handler = || async { handler().await.into_result() };
    let reconcile = |operation| async move {
        match reconcile {
            Some(reconcile) => reconcile(operation).await,
            None => Reconciled::StillUnknown,
        }
    };
    match idem.execute(recipe, caller.as_ref(), fallback, arguments.finish(), reconcile, handler).await {
        Ok(served) => ToolOutcome::Served {
            result: R::from_result(served.value),
            reference: served.reference,
            replayed: served.replayed,
        },
        Err(rejection) => ToolOutcome::Refused(rejection),
    }
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

/// A reconcile function that never finds anything (the type of `no_reconcile`).
pub type NoReconcile<T, E> = fn(Operation) -> std::future::Ready<Reconciled<T, E>>;

/// The `reconcile` argument of [`run_mcp`] for recipes without one.
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
