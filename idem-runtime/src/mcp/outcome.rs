//! What an idempotent rmcp tool returns to the agent: its own result with the operation's ref
//! in `_meta["dev.idem/outcome"]` (and, on a replay, a line of text saying so), or idem's refusal
//! as an `isError` result in words the model can act on, with codes in the same `_meta` object;
//! and the deprecated `Json` (rmcp's own `Json` is stored and replayed directly now).

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, JsonObject};
use serde_json::{Value, json};

use super::meta::{self, OUTCOME_META_KEY};
use crate::key::Ref;
use crate::macro_support::HandlerResult;
use crate::rejection::{IdempotentError, Rejection, STATUS_TOOL};

/// What an idempotent rmcp tool returns: its own result (fresh or replayed), or idem's refusal.
///
/// In a unit test, [`ToolOutcome::replayed`], [`ToolOutcome::reference`] and
/// [`ToolOutcome::rejection`] say how the call was answered, and `{:?}` prints it whatever the
/// result's type (rmcp's `Json<T>` is not `Debug`: the result shows as its type's name).
#[non_exhaustive]
pub enum ToolOutcome<R> {
    /// The handler's result, from this call or replayed from the ledger.
    #[non_exhaustive]
    Served {
        /// The result, as the handler's return type.
        result: R,
        /// The operation's ref.
        reference: Ref,
        /// Whether it was replayed.
        replayed: bool,
        /// Whether a replay carries [`replay_note`] as a last text block, for hosts that do not
        /// pass `_meta` to the model (`#[idempotent(replay_note = false)]` turns it off).
        replay_note: bool,
    },
    /// The handler asked the client for input before it acts (a multi-round-trip request,
    /// [`Step::InputRequired`](super::Step::InputRequired)), with its `requestState` sealed to
    /// the operation. Not stored: the operation is not done.
    #[non_exhaustive]
    InputRequired {
        /// The handler's input request.
        result: R,
        /// The operation's ref.
        reference: Ref,
    },
    /// idem answered without running the handler.
    Refused(Rejection),
    /// A repeat that found the operation in progress, from a client that declared the tasks
    /// extension, for a `task = true` tool: the operation's task, to poll with `tasks/get`
    /// (see [`get_task`](super::tasks::get_task)).
    #[non_exhaustive]
    Task {
        /// The task: `taskId` is the operation's ref.
        task: CreateTaskResult,
        /// The operation's ref.
        reference: Ref,
    },
}

impl<R> std::fmt::Debug for ToolOutcome<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let result = std::any::type_name::<R>();
        match self {
            Self::Served { reference, replayed, replay_note, .. } => f
                .debug_struct("Served")
                .field("result", &format_args!("<{result}>"))
                .field("reference", reference)
                .field("replayed", replayed)
                .field("replay_note", replay_note)
                .finish(),
            Self::InputRequired { reference, .. } => f
                .debug_struct("InputRequired")
                .field("result", &format_args!("<{result}>"))
                .field("reference", reference)
                .finish(),
            Self::Refused(rejection) => f.debug_tuple("Refused").field(rejection).finish(),
            Self::Task { task, reference } => {
                f.debug_struct("Task").field("task", task).field("reference", reference).finish()
            }
        }
    }
}

impl<R> ToolOutcome<R> {
    /// Whether the handler's result was replayed from the ledger (`false` for a fresh result,
    /// and for every answer that is not a result).
    #[must_use]
    pub const fn replayed(&self) -> bool {
        matches!(self, Self::Served { replayed: true, .. })
    }

    /// The operation's ref, unless idem refused before keying the call.
    #[must_use]
    pub fn reference(&self) -> Option<Ref> {
        match self {
            Self::Served { reference, .. } | Self::InputRequired { reference, .. } | Self::Task { reference, .. } => {
                Some(*reference)
            }
            Self::Refused(rejection) => rejection.reference(),
        }
    }

    /// idem's refusal, if it answered without running the handler.
    #[must_use]
    pub const fn rejection(&self) -> Option<&Rejection> {
        match self {
            Self::Refused(rejection) => Some(rejection),
            _ => None,
        }
    }

    /// The tool's own result: what it returned (or replayed), or idem's refusal as its error
    /// type (`from_rejection`). For calling a tool from a unit test (see
    /// [`ToolContext`](super::ToolContext)).
    pub fn into_result<M>(self) -> R
    where
        R: HandlerResult<M>,
        R::Err: IdempotentError,
    {
        match self {
            Self::Served { result, .. } | Self::InputRequired { result, .. } => result,
            Self::Refused(rejection) => R::from_result(Err(R::Err::from_rejection(rejection))),
            // A caller that cannot poll is told what a client without tasks is told.
            Self::Task { reference, .. } => {
                R::from_result(Err(R::Err::from_rejection(Rejection::InFlight { reference, lease_left: None })))
            }
        }
    }
}

impl<R: IntoCallToolResult> IntoCallToolResult for ToolOutcome<R> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            Self::Served { result, reference, replayed, replay_note: note } => match result.into_call_tool_result()? {
                CallToolResponse::Complete(mut result) => {
                    mark_served(&mut result, reference, replayed, note);
                    Ok(CallToolResponse::Complete(result))
                }
                other => Ok(other),
            },
            Self::InputRequired { result, reference } => match result.into_call_tool_result()? {
                CallToolResponse::InputRequired(mut request) => {
                    let outcome = json!({ "ref": reference.to_string(), "inputRequired": true, "executed": false });
                    meta::insert(&mut request.meta, OUTCOME_META_KEY, outcome);
                    Ok(CallToolResponse::InputRequired(request))
                }
                other => Ok(other),
            },
            Self::Refused(rejection) => Ok(CallToolResponse::Complete(refusal(&rejection))),
            Self::Task { task, .. } => Ok(CallToolResponse::Task(task)),
        }
    }
}

/// Marks a served result: the outcome in `_meta`, and on a replay (with `note`) the
/// [`replay_note`] as a last text block. One place, for a tool's answer and `tasks/get`'s.
pub(crate) fn mark_served(result: &mut CallToolResult, reference: Ref, replayed: bool, note: bool) {
    if replayed && note {
        result.content.push(ContentBlock::text(replay_note(reference)));
    }
    let outcome = json!({ "ref": reference.to_string(), "replayed": replayed });
    meta::insert(&mut result.meta, OUTCOME_META_KEY, outcome);
}

/// The line a replayed answer ends with, so that a model whose host drops `_meta` does not
/// take the stored answer for a second execution.
#[must_use]
pub fn replay_note(reference: Ref) -> String {
    crate::rejection::replay_words(reference)
}

/// The tool result an agent gets for a refusal: `isError`, words to act on, codes in `_meta`
/// under [`OUTCOME_META_KEY`].
#[must_use]
pub fn refusal(rejection: &Rejection) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(rejection.to_string())]);
    let mut idem = JsonObject::new();
    idem.insert("code".to_owned(), Value::String(rejection.code().to_owned()));
    if let Some(reference) = rejection.reference() {
        idem.insert("ref".to_owned(), Value::String(reference.to_string()));
        idem.insert("statusTool".to_owned(), Value::String(STATUS_TOOL.to_owned()));
    }
    if let Rejection::Conflict { differing, .. } = rejection {
        idem.insert("differing".to_owned(), json!(differing));
    }
    if let Rejection::LedgerUnavailable { incident, .. } = rejection {
        idem.insert("incident".to_owned(), Value::String(incident.to_string()));
    }
    idem.insert("executed".to_owned(), Value::Bool(false));
    idem.insert("retry".to_owned(), Value::String(if rejection.retry_is_safe() { "safe" } else { "no" }.to_owned()));
    meta::insert(&mut result.meta, OUTCOME_META_KEY, Value::Object(idem));
    result
}

/// The `outputSchema` rmcp would infer for a `Json<T>` result; `#[idempotent]` states it for
/// the tools it rewrites.
#[must_use]
pub fn output_schema<T: schemars::JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_output::<T>()
}
