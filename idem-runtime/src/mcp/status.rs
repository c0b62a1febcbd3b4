//! The ready, read-only status tool (`idem_status`): an operation's state by ref, answered
//! from the ledger; and the check that a server really serves it.
//!
//! Guarantees: a lookup is scoped to the request's caller (the tenant only for records made
//! under `scope = "tenant"`), with the same caller rules as the tools; backend errors are
//! logged under an incident id, never sent to the agent. A server that answers idempotent tools
//! without serving the status tool (a plain `#[tool_handler]`) is reported: by
//! [`check`](super::check) at startup, else in the log at its first idempotent call.

use std::sync::Arc;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{Value, json};

use super::caller::{Context, is_remote, no_caller, request_caller};
use super::meta::{self, OUTCOME_META_KEY};
use super::outcome::refusal;
use crate::idem::StoredValue;
use crate::idem::{HasIdem, Idem};
use crate::rejection::STATUS_TOOL;

#[derive(Deserialize)]
struct StatusArgs {
    #[serde(rename = "ref")]
    reference: String,
}

/// The ready, read-only status tool: an operation's state by ref, for the caller's tenant only.
///
/// Add it to your router: `Self::tool_router() + idem_runtime::mcp::status_tool()`. Keep the
/// combined router in a field and serve that one ([`check`](super::check) makes sure):
/// `#[tool_handler(router = self.tool_router)]` — a plain `#[tool_handler]` serves
/// `Self::tool_router()`, which lacks the status tool.
#[must_use]
pub fn status_tool<S: HasIdem + Send + Sync + 'static>() -> ToolRouter<S> {
    let schema = json!({
        "type": "object",
        "properties": { "ref": { "type": "string", "description": "the 16-hex-digit ref from an in-flight, conflict or unknown answer" } },
        "required": ["ref"]
    });
    let Value::Object(schema) = schema else { unreachable!("a literal object") };
    let tool = Tool::new(
        STATUS_TOOL,
        "Reports the state of an earlier operation by its ref (in progress, completed with its result, failed, or \
         outcome unknown). Read-only; use it instead of re-submitting a call that was answered 'in flight'.",
        Arc::new(schema),
    )
    .with_annotations(ToolAnnotations::new().read_only(true));
    let route = ToolRoute::new_dyn(tool, |context: ToolCallContext<'_, S>| {
        Box::pin(async move {
            let result = status_call(context.service.idem(), &context.request_context, context.arguments).await;
            Ok(CallToolResponse::Complete(result))
        })
    });
    ToolRouter::new().with_route(route)
}

async fn status_call(idem: &Idem, context: &Context, arguments: Option<JsonObject>) -> CallToolResult {
    let Some(caller) = request_caller(idem, context) else {
        return refusal(&no_caller(is_remote(context)));
    };
    let args: StatusArgs = match serde_json::from_value(Value::Object(arguments.unwrap_or_default())) {
        Ok(args) => args,
        Err(_) => {
            return status_error("bad_request", "pass the operation's ref: {\"ref\": \"<16 hex digits>\"}".to_owned());
        }
    };
    match idem.status(&caller, &args.reference).await {
        Ok(Some(report)) => {
            // The stored result is `{"ok": value}` or `{"err": error}`: show it as such.
            let (result, error) = match report.result.as_deref().and_then(StoredValue::parse) {
                Some(StoredValue::Ok(value)) => (Some(value), None),
                Some(StoredValue::Err(error)) => (None, Some(error)),
                None => (None, None),
            };
            let advice = match report.state {
                crate::ledger::State::InProgress | crate::ledger::State::Unknown if report.superseded => {
                    "an earlier operation that never settled; a newer one replaced it after its window ended. \
                     Do not retry it; an operator may still resolve it"
                }
                crate::ledger::State::InProgress if report.lease_expired => {
                    "the process running it stopped answering; the next repeat resolves it per the tool's policy"
                }
                crate::ledger::State::InProgress => "still running; ask again shortly, do not re-submit",
                crate::ledger::State::Completed if error.is_some() => {
                    "completed with a final error; a repeat returns it"
                }
                crate::ledger::State::Completed => "completed; a repeat of the same call returns this result",
                crate::ledger::State::Failed => "failed without effect; repeating the call runs it again",
                _ => "outcome unknown; do not retry, ask an operator to resolve it",
            };
            let mut body = json!({
                "ref": report.reference.to_string(),
                "state": report.state.as_str(),
                "advice": advice,
                "windowEnd": report.window_end,
                "expiresAt": report.expires_at,
                "superseded": report.superseded,
                "result": result,
            });
            if let Some(error) = error {
                body["error"] = error;
            }
            let mut done = CallToolResult::structured(body);
            done.is_error = Some(false);
            done
        }
        Ok(None) => status_error(
            "not_found",
            format!(
                "no operation with ref {} exists for you (refs are per tenant and expire with their window)",
                args.reference.trim()
            ),
        ),
        Err(crate::StatusError::Ref(error)) => status_error("bad_request", error.to_string()),
        Err(error) => {
            // The backend's words name hosts, users and relations: logged, not sent.
            let incident = crate::rejection::incident(&error.to_string());
            status_error(
                "ledger_unavailable",
                format!(
                    "the idempotency ledger is unavailable, so the status cannot be read now; ask again later \
                     (incident {incident} in the server's log)"
                ),
            )
        }
    }
}

/// An `isError` status answer with the code in `_meta` under [`OUTCOME_META_KEY`].
fn status_error(code: &str, text: String) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    meta::insert(&mut result.meta, OUTCOME_META_KEY, json!({ "code": code }));
    result
}
