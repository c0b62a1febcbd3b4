//! MCP tasks (SEP-2663, extension `io.modelcontextprotocol/tasks`) answered from the ledger: the
//! task a `task = true` tool answers a concurrent repeat with, and `tasks/get` / `tasks/cancel`
//! for a server's `ServerHandler` to forward to ([`get_task`], [`cancel_task`]).
//!
//! Guarantees: a task's `taskId` is its operation's ref, so every repeat of one operation gets
//! the same id, on any replica and after a restart (there is no per-process task state: the
//! ledger's record is the task). `tasks/get` is scoped to the caller exactly like the status
//! tool — a task of another subject or tenant is "not found", never its state. A completed
//! task's result is the `CallToolResult` a repeat of the call would replay, rebuilt from the
//! stored JSON alone (the reason a `task = true` tool returns `rmcp::Json<T>` or `String` and
//! errs with [`ToolError`]: those render the same from their JSON as from their type).

use rmcp::model::{
    CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult, DetailedTask, ErrorCode, GetTaskParams,
    GetTaskResult, IntoContents, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use super::caller::{Context, is_remote, no_caller, request_caller};
use super::error::ToolError;
use super::meta::OUTCOME_META_KEY;
use super::outcome::mark_served;
use crate::StatusError;
use crate::clock::rfc3339;
use crate::idem::Idem;
use crate::idem::StoredValue;
use crate::key::Ref;
use crate::ledger::{State, StatusReport};
use crate::recipe::Recipe;
use crate::rejection::{STATUS_TOOL, incident};
use crate::scope::Caller;

/// The poll interval a task suggests, in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 1_000;

/// The JSON-RPC error code of a `failed` task whose operation ended without effect (nothing
/// ran; calling the tool again runs it). Outside the range JSON-RPC reserves.
pub const NOTHING_RAN: i32 = -31_001;

/// The JSON-RPC error code of a `failed` task whose outcome is unknown (the effect may or may
/// not have happened; do not retry).
pub const OUTCOME_UNKNOWN: i32 = -31_002;

/// The JSON-RPC error code of a `tasks/cancel` idem refuses: it cannot stop a side effect.
pub const CANNOT_CANCEL: i32 = -31_003;

/// The task `call_tool` answers a concurrent repeat with: the in-progress operation's, as
/// `tasks/get` would show it now (so `tasks/get` for it resolves before the client has it).
/// `None`: the ledger no longer shows it to this caller, or cannot be read — the caller is told
/// "in flight" as before.
pub(crate) async fn created(
    idem: &Idem,
    caller: Option<&Caller>,
    fallback: bool,
    reference: Ref,
) -> Option<CreateTaskResult> {
    let caller = match caller {
        Some(caller) => caller.clone(),
        None if fallback => crate::idem::current_caller().or_else(|| idem.local_caller().cloned())?,
        None => return None,
    };
    match idem.status(&caller, &reference.to_string()).await {
        Ok(Some(report)) => Some(CreateTaskResult::new(task_of(idem, &report).task)),
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(%reference, %error, "could not read the task of an operation in flight; answering in flight");
            None
        }
    }
}

/// Whether a repeat of `recipe` from this request may be answered with a task: the tool runs as
/// a task, the client declared the extension, and the server (when it can tell) advertises it.
/// The server is asked last, and only when the other two hold.
pub(crate) fn answers_with_task(
    recipe: &Recipe,
    client_declares: bool,
    server_advertises: impl FnOnce() -> Option<bool>,
) -> bool {
    recipe.task_enabled() && client_declares && server_advertises() != Some(false)
}

/// `tasks/get` answered from the ledger, for the caller of `context` (its authenticated caller;
/// over stdio the local identity): call it from your server's `ServerHandler::get_task`.
///
/// ```text
/// async fn get_task(&self, request: GetTaskParams, context: RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData> {
///     idem_runtime::mcp::tasks::get_task(self.idem(), &request, &context).await
/// }
/// ```
///
/// The server must advertise the extension (`ServerCapabilities::builder().enable_tools().enable_tasks()`),
/// else rmcp answers `tasks/get` with "method not found" before this runs.
///
/// | the operation | the task |
/// |---|---|
/// | in progress | `working`, with a status message: poll, do not re-submit |
/// | completed (a result or a final error) | `completed`, `result` = the `CallToolResult` a repeat of the call replays (`_meta["dev.idem/outcome"].replayed: true`, ending with the replay note) |
/// | failed: nothing happened | `failed`, `error.code` [`NOTHING_RAN`]: nothing ran, calling the tool again runs it |
/// | outcome unknown (or superseded unsettled) | `failed`, `error.code` [`OUTCOME_UNKNOWN`]: do not retry; an operator resolves it |
///
/// # Errors
/// `invalid_params` ("task not found") for an id that is not a task of this caller: unknown,
/// expired, malformed, or another subject's or tenant's. `internal_error` when the ledger
/// cannot be read (the detail is logged under an incident id, never sent).
pub async fn get_task(
    idem: &Idem,
    request: &GetTaskParams,
    context: &RequestContext<RoleServer>,
) -> Result<GetTaskResult, ErrorData> {
    let report = find(idem, &request.task_id, context).await?;
    Ok(GetTaskResult::new(task_of(idem, &report)))
}

/// `tasks/cancel` for an idem task: always an error that says why — idem cannot stop a side
/// effect that is under way (its result is recorded, and `tasks/get` shows it), nor undo one
/// that happened. Call it from `ServerHandler::cancel_task`.
///
/// # Errors
/// "Task not found" as [`get_task`]; otherwise [`CANNOT_CANCEL`] with the task's state in words.
pub async fn cancel_task(
    idem: &Idem,
    request: &CancelTaskParams,
    context: &RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    let report = find(idem, &request.task_id, context).await?;
    let reference = report.reference;
    let state = match report.state {
        State::InProgress => "it is still running, and its result will be recorded and shown by `tasks/get`",
        State::Completed => "it has completed",
        State::Failed => "it ended without effect",
        _ => "its outcome is unknown",
    };
    Err(ErrorData::new(
        ErrorCode(CANNOT_CANCEL),
        format!(
            "task {reference} cannot be cancelled: idem does not interrupt or undo a side effect, and {state}. Poll \
             `tasks/get` for its outcome; to reverse an effect, call the tool that undoes it"
        ),
        Some(
            json!({ OUTCOME_META_KEY: { "code": "cannot_cancel", "ref": reference.to_string(), "state": report.state.as_str() } }),
        ),
    ))
}

/// The caller's operation `task_id`, or the error `tasks/get` answers.
async fn find(idem: &Idem, task_id: &str, context: &Context) -> Result<StatusReport, ErrorData> {
    let Some(caller) = request_caller(idem, context) else {
        let rejection = no_caller(is_remote(context));
        return Err(ErrorData::invalid_request(rejection.to_string(), Some(json!({ "code": rejection.code() }))));
    };
    match idem.status(&caller, task_id).await {
        Ok(Some(report)) => Ok(report),
        Ok(None) | Err(StatusError::Ref(_)) => Err(not_found(task_id)),
        Err(error) => {
            // The backend's words name hosts, users and relations: logged, not sent.
            let incident = incident(&error.to_string());
            Err(ErrorData::internal_error(
                format!(
                    "the idempotency ledger is unavailable, so task {} cannot be read now; ask again later (incident \
                     {incident} in the server's log)",
                    task_id.trim()
                ),
                None,
            ))
        }
    }
}

fn not_found(task_id: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "task not found: no task {:?} exists for you (a task belongs to the caller that started it, and ends with \
             its operation's window). Call the tool again to start a new one",
            task_id.trim()
        ),
        None,
    )
}

/// The task an operation's record stands for.
fn task_of(idem: &Idem, report: &StatusReport) -> DetailedTask {
    let reference = report.reference;
    let ttl = report.window_end.saturating_sub(report.created_at);
    let working = report.state == State::InProgress && !report.superseded;
    // idem does not record when an operation settled: a settled task was last updated "now".
    let updated = if working { report.created_at } else { idem.ledger_now() };
    let task = Task::new(reference.to_string(), TaskStatus::Working, rfc3339(report.created_at), rfc3339(updated))
        .with_ttl_ms(ttl)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    let payload = match report.state {
        State::InProgress if !report.superseded => {
            let message = if report.lease_expired {
                "the process running it stopped answering; the next repeat of the call resolves it per the tool's \
                 policy. Do not re-submit"
            } else {
                "still running; poll tasks/get, do not re-submit the call"
            };
            return DetailedTask::new(task.with_status_message(message), TaskPayload::Working);
        }
        State::Completed => match report.result.as_deref().map(|stored| replayed_result(stored, reference)) {
            Some(Ok(result)) => TaskPayload::Completed { result },
            _ => failed(
                OUTCOME_UNKNOWN,
                format!(
                    "task {reference} completed, but its stored result cannot be read; nothing was executed again. \
                     Do not retry; an operator can read ref {reference} with `{STATUS_TOOL}`"
                ),
                reference,
                "unreadable_result",
                "no",
            ),
        },
        State::Failed => failed(
            NOTHING_RAN,
            format!(
                "task {reference} ended without effect: nothing was executed. It is safe to call the tool again, \
                 which runs it anew"
            ),
            reference,
            "failed",
            "safe",
        ),
        _ => failed(
            OUTCOME_UNKNOWN,
            format!(
                "task {reference}: the outcome is unknown — the operation may or may not have taken effect. Do not \
                 retry it; an operator must resolve it (`idem show {reference}` gives its address)"
            ),
            reference,
            "outcome_unknown",
            "no",
        ),
    };
    DetailedTask::new(task, payload)
}

fn failed(code: i32, message: String, reference: Ref, idem_code: &str, retry: &str) -> TaskPayload {
    let outcome = json!({ "code": idem_code, "ref": reference.to_string(), "executed": false, "retry": retry });
    let error = json!({ "code": code, "message": message, "data": { OUTCOME_META_KEY: outcome } });
    let Value::Object(error) = error else { unreachable!("a literal object") };
    TaskPayload::Failed { error }
}

/// The `CallToolResult` a repeat would replay, from the stored `{"ok": …}` / `{"err": …}` JSON:
/// a string as one text block (as rmcp sends a `String`), any other value as structured content
/// with its JSON as text (as rmcp sends `Json<T>`); an error through [`ToolError`]'s words.
fn replayed_result(stored: &[u8], reference: Ref) -> Result<JsonObject, ()> {
    let mut result = match StoredValue::parse(stored).ok_or(())? {
        StoredValue::Ok(Value::String(text)) => CallToolResult::success(vec![ContentBlock::text(text)]),
        StoredValue::Ok(value) => CallToolResult::structured(value),
        StoredValue::Err(error) => {
            let contents = match serde_json::from_value::<ToolError>(error.clone()) {
                Ok(error) => error.into_contents(),
                Err(_) => vec![ContentBlock::text(match error {
                    Value::String(text) => text,
                    other => other.to_string(),
                })],
            };
            CallToolResult::error(contents)
        }
    };
    mark_served(&mut result, reference, true, true);
    match serde_json::to_value(result) {
        Ok(Value::Object(result)) => Ok(result),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_250), "2000-02-29T00:00:00.250Z");
        assert_eq!(rfc3339(1_785_231_000_000), "2026-07-28T09:30:00.000Z");
    }

    #[test]
    fn a_stored_result_renders_as_rmcp_renders_its_type() {
        let reference = Ref::from_bytes([1; 8]);
        let structured = replayed_result(br#"{"ok":{"id":7}}"#, reference).unwrap();
        let expected = rmcp::Json(json!({ "id": 7 }));
        let rmcp::model::CallToolResponse::Complete(mut expected) =
            rmcp::handler::server::tool::IntoCallToolResult::into_call_tool_result(expected).unwrap()
        else {
            panic!("complete")
        };
        mark_served(&mut expected, reference, true, true);
        assert_eq!(Value::Object(structured), serde_json::to_value(&expected).unwrap());
        let text = replayed_result(br#"{"ok":"done"}"#, reference).unwrap();
        assert_eq!(text["content"][0]["text"], "done");
        assert!(text.get("structuredContent").is_none());
        let declined = serde_json::to_vec(&json!({ "err": ToolError::final_answer("declined") })).unwrap();
        let declined = replayed_result(&declined, reference).unwrap();
        assert_eq!(declined["isError"], true);
        assert_eq!(declined["content"][0]["text"], "declined");
    }
}
