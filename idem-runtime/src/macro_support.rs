//! What `#[idempotent]` expands to. Reached only through `idem_runtime::__private`; nothing here
//! is public API.

use std::borrow::Borrow;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::canonical::{self, CanonicalError};
use crate::idem::{CallArguments, Idem, Operation, Reconciled, Served};
use crate::recipe::Recipe;
use crate::rejection::{IdempotentError, Rejection};
use crate::scope::Caller;

/// A handler's result type, split into what is stored and what is classified.
#[diagnostic::on_unimplemented(
    message = "an `#[idempotent]` handler must return `Result<T, E>`, not `{Self}`",
    label = "this return type",
    note = "`T` is stored and replayed to repeats (serde); `E` implements `idem_runtime::IdempotentError`"
)]
pub trait HandlerResult: Sized {
    /// The success type.
    type Ok: Storable;
    /// The error type.
    type Err: IdempotentError;
    /// As a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// From a plain `Result`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T: Storable, E: IdempotentError> HandlerResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Self {
        self
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

/// A result idem can store and replay.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed by idem",
    label = "the success type of this `#[idempotent]` handler",
    note = "idem stores the first call's result and replays it to every repeat: derive `serde::Serialize` and \
            `serde::Deserialize` for `{Self}`"
)]
pub trait Storable: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> Storable for T {}

/// Collects a call's arguments from the handler's parameters.
#[derive(Debug, Default)]
pub struct Arguments {
    arguments: CallArguments<'static>,
    error: Option<CanonicalError>,
}

impl Arguments {
    /// No arguments yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn value<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Option<Value> {
        match canonical::to_value(value) {
            Ok(value) => Some(value),
            Err(error) => {
                self.error.get_or_insert(error.within(name));
                None
            }
        }
    }

    /// All arguments at once: the handler's arguments struct (rmcp's `Parameters<T>`).
    pub fn all<T: Serialize + ?Sized>(&mut self, value: &T) {
        match self.value("", value) {
            Some(Value::Object(map)) => self.arguments.all = std::borrow::Cow::Owned(map),
            Some(_) => {
                self.error.get_or_insert(CanonicalError::Invalid {
                    message: "the arguments struct must serialise to a JSON object".to_owned(),
                });
            }
            None => {}
        }
    }

    /// One named argument.
    pub fn insert<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        if let Some(value) = self.value(name, value) {
            self.arguments.all.to_mut().insert(name.to_owned(), value);
        }
    }

    /// One of the key's values, by its path.
    pub fn select<T: Serialize + ?Sized>(&mut self, path: &str, value: &T) {
        if let Some(value) = self.value(path, value) {
            self.arguments.selected.insert(path.to_owned(), value);
        }
    }

    /// The task id that narrows the scope.
    pub fn task<T: Serialize + ?Sized>(&mut self, value: &T) {
        self.arguments.task = self.value("task", value);
    }

    fn finish(self) -> Result<CallArguments<'static>, Rejection> {
        match self.error {
            Some(error) => Err(Rejection::InvalidArguments { error }),
            None => Ok(self.arguments),
        }
    }
}

/// The `Idem` named by `idem = expr` (an `Idem`, a reference to one, or anything that borrows one).
pub fn handle<I: Borrow<Idem> + ?Sized>(idem: &I) -> Idem {
    idem.borrow().clone()
}

/// The caller named by `caller = expr`.
pub fn caller<C: Borrow<Caller> + ?Sized>(caller: &C) -> Caller {
    caller.borrow().clone()
}

/// The process-wide `Idem` installed with [`Idem::install`], for free functions.
#[must_use]
pub fn installed() -> Option<Idem> {
    Idem::installed()
}

fn no_idem<E: IdempotentError>() -> E {
    E::from_rejection(Rejection::ledger_unavailable(
        "no idem ledger is configured for this handler: call `Idem::install` at startup, implement `HasIdem`, \
         or pass `idem = ...`",
    ))
}

/// Runs a handler under `recipe`.
pub async fn run<R, F, Fut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    caller: Option<Caller>,
    arguments: Arguments,
    handler: F,
) -> R
where
    R: HandlerResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
{
    let never = |_| async { Reconciled::StillUnknown };
    run_reconciling(idem, recipe, caller, arguments, never, handler).await
}

/// Runs a handler under a `reconcile` recipe.
pub async fn run_reconciling<R, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    caller: Option<Caller>,
    arguments: Arguments,
    reconcile: C,
    handler: F,
) -> R
where
    R: HandlerResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
    C: FnOnce(Operation) -> CFut,
    CFut: Future<Output = Reconciled<R::Ok, R::Err>>,
{
    let Some(idem) = idem else { return R::from_result(Err(no_idem())) };
    let handler = || async { handler().await.into_result() };
    let served = idem.execute(recipe, caller.as_ref(), true, arguments.finish(), reconcile, handler).await;
    R::from_result(flatten(served))
}

fn flatten<T, E: IdempotentError>(served: Result<Served<Result<T, E>>, Rejection>) -> Result<T, E> {
    match served {
        Ok(served) => served.value,
        Err(rejection) => Err(E::from_rejection(rejection)),
    }
}

/// Runs an rmcp tool's handler under `recipe`, with the caller from the request context (else
/// the handle's local identity), keeping idem's refusals for the agent-facing result.
#[cfg(feature = "rmcp")]
pub async fn run_mcp<R, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    context: &crate::mcp::Context,
    caller: Option<Caller>,
    arguments: Arguments,
    reconcile: Option<C>,
    handler: F,
) -> crate::mcp::ToolOutcome<R>
where
    R: HandlerResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
    C: FnOnce(Operation) -> CFut,
    CFut: Future<Output = Reconciled<R::Ok, R::Err>>,
{
    use crate::mcp::ToolOutcome;
    let Some(idem) = idem else {
        return ToolOutcome::Refused(Rejection::ledger_unavailable(
            "no idem ledger is configured for this tool (implement `HasIdem`)",
        ));
    };
    // Over HTTP only the request's authenticated caller counts: no fallback to a caller in
    // scope or the local identity.
    let fallback = !crate::mcp::is_remote(context);
    let caller = caller.or_else(|| crate::mcp::caller_of(context));
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

/// A reconcile function that never finds anything (the type of `no_reconcile`).
pub type NoReconcile<T, E> = fn(Operation) -> std::future::Ready<Reconciled<T, E>>;

/// The `reconcile` argument of [`run_mcp`] for recipes without one.
#[cfg(feature = "rmcp")]
#[must_use]
pub const fn no_reconcile<T, E>() -> Option<NoReconcile<T, E>> {
    None
}
