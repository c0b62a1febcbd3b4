//! rig agents (feature `rig`): [`Idempotent`] wraps a rig [`Tool`] so that a repeated call — a
//! model that re-issues a call it lost track of, an agent restarted from its history — runs the
//! tool once and answers every repeat with the stored output, through the one engine
//! ([`Idem::call`]).
//!
//! Guarantees: the wrapped tool keeps its name, description and parameters; its arguments are
//! keyed by the recipe, under the [`Caller`] the host attached to the run's tool context (a call
//! without one is refused, and the tool does not run); a repeat gets the first output, ending with
//! a line that says nothing ran again; a refusal is a [`ToolExecutionError`] whose code is idem's
//! and whose words tell the model what to do (wait and repeat, or stop and tell the user).
//!
//! ```no_run
//! use idem_runtime::rig::Idempotent;
//! use idem_runtime::{Idem, Recipe};
//! use rig_core::tool::{Tool, ToolContext};
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Invoice { customer: String, amount_cents: u64 }
//! # #[derive(Debug)] struct Failed;
//! # impl std::fmt::Display for Failed {
//! #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("failed") }
//! # }
//! # impl std::error::Error for Failed {}
//! struct SendInvoice;
//! impl Tool for SendInvoice {
//!     const NAME: &'static str = "send_invoice";
//!     type Args = Invoice;
//!     type Output = String;
//!     type Error = Failed;
//!     fn description(&self) -> String { "Send an invoice".into() }
//!     fn parameters(&self) -> serde_json::Value { serde_json::json!({ "type": "object" }) }
//!     async fn call(&self, _: &mut ToolContext, invoice: Invoice) -> Result<String, Failed> {
//!         Ok(format!("invoiced {} {}", invoice.customer, invoice.amount_cents))
//!     }
//! }
//!
//! static SEND_INVOICE: Recipe = Recipe::new(SendInvoice::NAME, &["customer", "amount_cents"]);
//!
//! # fn build(idem: Idem) {
//! // Give the agent the wrapped tool in place of the tool: `AgentBuilder::new(model).tool(tool)`,
//! // and each run its caller: `.prompt(..).tool_context(ToolContext::new().with_scope(Arc::new(caller)))`.
//! let tool = Idempotent::new(SendInvoice, idem, &SEND_INVOICE);
//! # let _ = tool; }
//! ```

use rig_core::tool::{IntoToolOutput, Tool, ToolContext, ToolErrorKind, ToolExecutionError, ToolOutput};
use serde::{Deserialize, Serialize};

use crate::idem::Idem;
use crate::recipe::Recipe;
use crate::rejection::{ErrorClass, IdempotentError, Rejection, replay_words};
use crate::scope::Caller;

/// A rig [`Tool`] made safe to repeat: give it to the agent in place of the tool.
///
/// The caller is the [`Caller`] the host attached to the run's tool context as a scope
/// (`prompt(..).tool_context(ToolContext::new().with_scope(Arc::new(caller)))`); a call without
/// one is refused (`no_caller`). Not the task-local [`run_as`](crate::run_as): rig-agent may run
/// one run's tool calls from another run's future (its shared driver), so only the context says
/// whose call it is. Errors are classified by [`Idempotent::classify_errors`]; by default an
/// error of kind `invalid_args`, `not_found` or `permission_denied` (a refusal too), or
/// `rate_limited`, means nothing happened (a repeat runs again), and any other error — a
/// timeout, a network failure — leaves the outcome unknown (repeats are refused until an
/// operator settles it).
pub struct Idempotent<T> {
    tool: T,
    idem: Idem,
    recipe: &'static Recipe,
    classify: fn(&ToolExecutionError) -> ErrorClass,
    note: bool,
}

impl<T: Tool> Idempotent<T> {
    /// `tool`, keyed by `recipe` on `idem`'s ledger.
    ///
    /// # Panics
    /// When `recipe` names another tool than `T::NAME`: two tools under one recipe would replay
    /// each other's outputs. Build the recipe with `Recipe::new(T::NAME, …)`.
    pub fn new(tool: T, idem: Idem, recipe: &'static Recipe) -> Self {
        assert!(
            recipe.tool() == T::NAME,
            "the recipe for rig tool `{}` names tool `{}`: build it with `Recipe::new({}::NAME, …)`",
            T::NAME,
            recipe.tool(),
            std::any::type_name::<T>(),
        );
        Self { tool, idem, recipe, classify: default_class, note: true }
    }

    /// The same tool, whose replayed output is the stored output alone: without the text block
    /// that tells the model nothing ran again (which turns a lone JSON output into two blocks).
    #[must_use]
    pub const fn without_replay_note(mut self) -> Self {
        self.note = false;
        self
    }

    /// The same tool, with `classify` saying what each of its errors means for the operation:
    /// [`ErrorClass::Final`] stores the error and replays it to every repeat.
    #[must_use]
    pub const fn classify_errors(mut self, classify: fn(&ToolExecutionError) -> ErrorClass) -> Self {
        self.classify = classify;
        self
    }
}

/// The default classification (see [`Idempotent`]).
fn default_class(error: &ToolExecutionError) -> ErrorClass {
    let before_any_effect = matches!(
        error.kind(),
        ToolErrorKind::InvalidArgs
            | ToolErrorKind::NotFound
            | ToolErrorKind::PermissionDenied
            | ToolErrorKind::RateLimited
    );
    // Not `retryable()`: rig calls a timeout and a network failure retryable, and either can come
    // after the effect.
    if before_any_effect { ErrorClass::NothingHappened } else { ErrorClass::Unknown }
}

/// How a run ended, as the engine stores it: the tool's error with this run's class of it (only a
/// final error is stored, so one read back is final), or (never stored) idem's refusal.
#[derive(Serialize, Deserialize)]
enum Failure {
    Tool {
        error: ToolExecutionError,
        #[serde(skip)]
        class: Option<ErrorClass>,
    },
    #[serde(skip)]
    Refused(Rejection),
}

impl IdempotentError for Failure {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Tool { class, .. } => class.unwrap_or(ErrorClass::Final),
            Self::Refused(_) => ErrorClass::NothingHappened,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused(rejection)
    }
}

impl Failure {
    const fn of(error: ToolExecutionError, class: ErrorClass) -> Self {
        Self::Tool { error, class: Some(class) }
    }
}

impl<T> Tool for Idempotent<T>
where
    T: Tool,
    T::Args: Serialize,
{
    const NAME: &'static str = T::NAME;
    type Args = T::Args;
    type Output = ToolOutput;
    type Error = ToolExecutionError;

    fn description(&self) -> String {
        self.tool.description()
    }

    fn parameters(&self) -> serde_json::Value {
        self.tool.parameters()
    }

    async fn call(&self, context: &mut ToolContext, args: T::Args) -> Result<ToolOutput, ToolExecutionError> {
        // Keyed before the arguments move into the tool.
        let arguments = crate::canonical::to_value(&args)
            .map_err(|error| ToolExecutionError::invalid_args(format!("the arguments cannot be keyed: {error}")))?;
        let Some(caller) = context.scope::<Caller>() else {
            return Err(ToolExecutionError::new(
                ToolErrorKind::PermissionDenied,
                "nothing was executed: this agent run has no caller, so the call cannot be made safe to repeat. \
                 Retrying will not help: the host must attach one to the run's tool context",
            )
            .with_code(Rejection::NoCaller.code())
            .with_retryable(false));
        };
        let classify = self.classify;
        let served = self
            .idem
            .call(self.recipe, Some(caller.as_ref()), &arguments, || async move {
                match self.tool.call(context, args).await {
                    // The effect happened: an output that cannot be presented is not "nothing".
                    Ok(output) => output.into_tool_output().map_err(|error| Failure::of(error, ErrorClass::Unknown)),
                    Err(error) => {
                        let error = self.tool.map_error(error);
                        let class = classify(&error);
                        Err(Failure::of(error, class))
                    }
                }
            })
            .await;
        match served {
            Ok(served) if served.replayed && self.note => {
                let mut content = served.value.into_content();
                content.push(rig_core::message::ToolResultContent::text(replay_words(served.reference)));
                ToolOutput::content(content)
            }
            Ok(served) => Ok(served.value),
            Err(Failure::Tool { error, .. }) => Err(error),
            Err(Failure::Refused(rejection)) => Err(refusal(&rejection)),
        }
    }
}

/// idem's refusal as a tool error: its code, whether a retry is safe, and words for a model
/// that has no status tool to call.
fn refusal(rejection: &Rejection) -> ToolExecutionError {
    let words = match rejection {
        Rejection::InFlight { reference, .. } => format!(
            "in flight, ref {reference}: this operation is already in progress. Do not call it with other \
             arguments; wait, then repeat exactly the same call to get its result"
        ),
        Rejection::OutcomeUnknown { reference } => format!(
            "outcome unknown, ref {reference}: the operation may or may not have taken effect. Do not retry it; \
             tell the user that an operator must check ref {reference}"
        ),
        Rejection::UnreadableResult { reference, .. } => format!(
            "the result of ref {reference} is stored but cannot be read here. Do not retry it; tell the user \
             that an operator must check ref {reference}"
        ),
        other => other.to_string(),
    };
    let kind = match rejection {
        Rejection::InvalidArguments { .. } | Rejection::Conflict { .. } => ToolErrorKind::InvalidArgs,
        Rejection::NoCaller | Rejection::NoLocalCaller => ToolErrorKind::PermissionDenied,
        _ => ToolErrorKind::Other,
    };
    ToolExecutionError::new(kind, words)
        .with_code(rejection.code())
        .with_retryable(rejection.retry_is_safe() || matches!(rejection, Rejection::InFlight { .. }))
}
