//! What `#[idempotent]` expands to on an rmcp tool (feature `rmcp`): the run that answers with a
//! [`ToolOutcome`] and takes the caller from the request context, and the argument-kind impls
//! for rmcp's own parameter types. Reached only through `idem_runtime::__private`, beside
//! `crate::macro_support` (the transport-free part); nothing here is public API.

use std::future::Future;

use super::caller::{Context, caller_of, is_remote, no_caller};
use super::outcome::ToolOutcome;
use crate::idem::{Idem, Operation, Reconciled};
use crate::macro_support::{Arguments, ExtractorKind, HandlerResult, Probe, RawArgumentsKind};
use crate::recipe::Recipe;
use crate::rejection::Rejection;
use crate::scope::Caller;

/// Runs an rmcp tool's handler under `recipe`, with the caller from the request context (else
/// the handle's local identity), keeping idem's refusals for the agent-facing result.
pub async fn run_mcp<R, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    context: &Context,
    caller: Option<Caller>,
    arguments: Arguments,
    reconcile: Option<C>,
    handler: F,
) -> ToolOutcome<R>
where
    R: HandlerResult,
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
    let fallback = !is_remote(context);
    let caller = caller.or_else(|| caller_of(context));
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
        Err(Rejection::NoCaller) => ToolOutcome::Refused(no_caller(context)),
        Err(rejection) => ToolOutcome::Refused(rejection),
    }
}

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
