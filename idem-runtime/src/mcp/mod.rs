//! MCP servers with rmcp: callers from the request context, outcomes an agent can act on, the
//! ready status tool, and the startup audit.
//!
//! On an rmcp tool (a method with `#[tool]` below `#[idempotent]`), the attribute adds a
//! [`Context`] parameter to read the caller from, and returns a [`ToolOutcome`] that rmcp turns
//! into the tool result:
//!
//! - a fresh or replayed result carries `_meta.idem = {"ref": "…", "replayed": true|false}`;
//! - a refusal is an `isError` result in words for the model, with
//!   `_meta.idem = {"code": "in_flight" | "conflict" | …, "ref": "…", "statusTool": "idem_status",
//!   "executed": false, "retry": "no" | "safe"}`.
//!
//! The caller: over streamable HTTP, the [`Caller`] an auth middleware put into the request's
//! extensions ([`require_bearer`] is a small one to replace with your own validation); over
//! stdio, the handle's configured local identity ([`Idem::with_local_caller`]). Neither: refused.

use std::sync::Arc;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext};
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject, MetaObject, Tool, ToolAnnotations};
use rmcp::{ErrorData, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::idem::{HasIdem, Idem};
use crate::key::Ref;
use crate::rejection::{Rejection, STATUS_TOOL};
use crate::scope::Caller;

/// The request context an idempotent rmcp tool reads its caller from.
pub type Context = rmcp::service::RequestContext<RoleServer>;

/// The authenticated caller of a request: the [`Caller`] an HTTP auth middleware inserted into
/// the request's extensions (or directly into the context's).
#[must_use]
pub fn caller_of(context: &Context) -> Option<Caller> {
    if let Some(caller) =
        context.extensions.get::<http::request::Parts>().and_then(|parts| parts.extensions.get::<Caller>())
    {
        return Some(caller.clone());
    }
    context.extensions.get::<Caller>().cloned()
}

/// Whether the request arrived over HTTP (rmcp put its request parts into the context). Such a
/// request is answered for its authenticated caller only: never the local (stdio) identity, nor
/// a caller in scope — without one it is refused.
#[must_use]
pub fn is_remote(context: &Context) -> bool {
    context.extensions.get::<http::request::Parts>().is_some()
}

/// The caller a request is served for: its authenticated one; over stdio, failing that, the
/// caller in scope or the handle's local identity. Over HTTP without one: none. For tools
/// without a recipe that must answer per caller (a listing scoped to the caller's tenant).
#[must_use]
pub fn request_caller(idem: &Idem, context: &Context) -> Option<Caller> {
    caller_of(context).or_else(|| {
        if is_remote(context) {
            return None;
        }
        crate::idem::current_caller().or_else(|| idem.local_caller().cloned())
    })
}

/// What an idempotent rmcp tool returns: its own result (fresh or replayed), or idem's refusal.
#[derive(Debug)]
#[non_exhaustive]
pub enum ToolOutcome<R> {
    /// The handler's result, from this call or replayed from the ledger.
    Served {
        /// The result, as the handler's return type.
        result: R,
        /// The operation's ref.
        reference: Ref,
        /// Whether it was replayed.
        replayed: bool,
    },
    /// idem answered without running the handler.
    Refused(Rejection),
}

impl<R: IntoCallToolResult> IntoCallToolResult for ToolOutcome<R> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            Self::Served { result, reference, replayed } => match result.into_call_tool_result()? {
                CallToolResponse::Complete(mut result) => {
                    let idem = json!({ "ref": reference.to_string(), "replayed": replayed });
                    result.meta.get_or_insert_with(|| MetaObject(JsonObject::new())).0.insert("idem".to_owned(), idem);
                    Ok(CallToolResponse::Complete(result))
                }
                other => Ok(other),
            },
            Self::Refused(rejection) => Ok(CallToolResponse::Complete(refusal(&rejection))),
        }
    }
}

/// The tool result an agent gets for a refusal: `isError`, words to act on, codes in `_meta`.
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
    let mut meta = JsonObject::new();
    meta.insert("idem".to_owned(), Value::Object(idem));
    result.meta = Some(MetaObject(meta));
    result
}

/// Structured output that idem can store and replay: like rmcp's `Json<T>` (the value goes to
/// `structuredContent` and a text block), and `Serialize + Deserialize` itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json<T>(pub T);

impl<T: Serialize + schemars::JsonSchema + 'static> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        rmcp::Json(self.0).into_call_tool_result()
    }
}

/// The `outputSchema` rmcp would infer for a `Json<T>` result; `#[idempotent]` states it for
/// the tools it rewrites.
#[must_use]
pub fn output_schema<T: schemars::JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_output::<T>()
}

#[derive(Deserialize)]
struct StatusArgs {
    #[serde(rename = "ref")]
    reference: String,
}

/// The ready, read-only status tool: an operation's state by ref, for the caller's tenant only.
///
/// Add it to your router: `Self::tool_router() + idem_runtime::mcp::status_tool()`, or use
/// [`checked_router`]. Keep the combined router in a field and serve that one:
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
        return refusal(&Rejection::NoCaller);
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
            let stored = report.result.as_deref().and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok());
            let (result, error) = match stored {
                Some(Value::Object(mut stored)) => (stored.remove("ok"), stored.remove("err")),
                _ => (None, None),
            };
            let advice = match report.state {
                crate::State::InProgress | crate::State::Unknown if report.superseded => {
                    "an earlier operation that never settled; a newer one replaced it after its window ended. \
                     Do not retry it; an operator may still resolve it"
                }
                crate::State::InProgress if report.lease_expired => {
                    "the process running it stopped answering; the next repeat resolves it per the tool's policy"
                }
                crate::State::InProgress => "still running; ask again shortly, do not re-submit",
                crate::State::Completed if error.is_some() => "completed with a final error; a repeat returns it",
                crate::State::Completed => "completed; a repeat of the same call returns this result",
                crate::State::Failed => "failed without effect; repeating the call runs it again",
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

/// An `isError` status answer with `_meta.idem.code`.
fn status_error(code: &str, text: String) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    let mut meta = JsonObject::new();
    meta.insert("idem".to_owned(), json!({ "code": code }));
    result.meta = Some(MetaObject(meta));
    result
}

/// A listed tool whose `idempotentHint: true` no recipe backs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditError {
    /// The offending tools' names.
    pub tools: Vec<String>,
}

impl std::fmt::Display for AuditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refusing to serve tool(s) {} that advertise idempotentHint: true without an idem recipe: hosts would \
             retry them blindly. Add `#[idempotent(key = \"...\")]` (or `inherent = \"...\"`) to each, or drop \
             the hint",
            self.tools.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        )
    }
}

impl std::error::Error for AuditError {}

/// What backs a tool's `idempotentHint: true`, as `#[idempotent]` records it in the tool's
/// `_meta.idem` (`{"key": ["card", "amount_cents"]}` or `{"inherent": true}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backing {
    /// A key recipe over these argument paths.
    Key(&'static [&'static str]),
    /// A naturally idempotent tool, with a written reason.
    Inherent,
}

/// The `_meta` `#[idempotent]` gives a tool: the user's own (`#[tool(meta = ...)]`), plus
/// `idem: {"key": [...]}` or `idem: {"inherent": true}`.
#[must_use]
pub fn backed_meta(meta: Option<MetaObject>, backing: Backing) -> MetaObject {
    let mut meta = meta.unwrap_or_else(|| MetaObject(JsonObject::new()));
    let idem = match backing {
        Backing::Key(paths) => json!({ "key": paths }),
        Backing::Inherent => json!({ "inherent": true }),
    };
    meta.0.insert("idem".to_owned(), idem);
    meta
}

/// Whether a tool's `_meta` says a recipe backs it (see [`backed_meta`]).
fn backed_by_recipe(tool: &Tool) -> bool {
    let idem = tool.meta.as_ref().and_then(|meta| meta.0.get("idem"));
    idem.is_some_and(|idem| idem.get("key").is_some_and(Value::is_array) || idem.get("inherent") == Some(&json!(true)))
}

/// The startup audit: every tool `router` lists with `idempotentHint: true` must be backed by a
/// recipe — an `#[idempotent]` tool (its `_meta.idem` says so, from whichever audited impl or
/// named router it came) or one of `backed` (tools added by hand that `Idem::call` protects).
///
/// # Errors
/// The offending tools.
pub fn audit<S: Send + Sync + 'static>(router: &ToolRouter<S>, backed: &[&str]) -> Result<(), AuditError> {
    let tools: Vec<String> = router
        .list_all()
        .into_iter()
        .filter(|tool| tool.annotations.as_ref().is_some_and(|a| a.idempotent_hint == Some(true)))
        .filter(|tool| !backed.contains(&tool.name.as_ref()) && !backed_by_recipe(tool))
        .map(|tool| tool.name.to_string())
        .collect();
    if tools.is_empty() { Ok(()) } else { Err(AuditError { tools }) }
}

/// `router` plus the status tool, after the [`audit`]: what a server should serve.
///
/// # Errors
/// As [`audit`].
pub fn checked_router<S: HasIdem + Send + Sync + 'static>(
    router: ToolRouter<S>,
    backed: &[&str],
) -> Result<ToolRouter<S>, AuditError> {
    audit(&router, backed)?;
    Ok(router + status_tool())
}

/// A validator for [`require_bearer`]: a token in, a caller out (or `None`: 401).
pub type Validator = Arc<dyn Fn(&str) -> Option<Caller> + Send + Sync>;

/// The demo validator: a bearer token `tenant:subject` is taken at its word. Replace it with
/// real validation (a JWT check, a session lookup) before exposing a server.
#[must_use]
pub fn demo_tokens() -> Validator {
    Arc::new(|token: &str| {
        let (tenant, subject) = token.split_once(':')?;
        Caller::try_new(tenant, subject).ok()
    })
}

/// An axum middleware: `Authorization: Bearer <token>` → the validator's [`Caller`] in the
/// request extensions, where idempotent tools find it; anything else is answered 401.
///
/// `router.layer(axum::middleware::from_fn_with_state(demo_tokens(), require_bearer))`
#[cfg(feature = "mcp-http")]
pub async fn require_bearer(
    axum::extract::State(validate): axum::extract::State<Validator>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match token.and_then(|token| validate(token.trim())) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => (http::StatusCode::UNAUTHORIZED, "a valid bearer token is required").into_response(),
    }
}
