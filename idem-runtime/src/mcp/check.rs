//! The check an rmcp server passes before it serves ([`check`]): every tool its router lists
//! with `idempotentHint: true` is backed by a recipe, it serves the status tool idem's answers
//! name, and its transport can name a caller.
//!
//! `#[idempotent]` records what backs a tool in its definition's `_meta` under
//! [`RECIPE_META_KEY`](super::wire::RECIPE_META_KEY) ([`recipe_meta`](super::wire::recipe_meta), [`backed_meta`]); a tool added by hand that
//! `Idem::call` protects says so with [`recipe_meta`](super::wire::recipe_meta) on its definition.

use rmcp::ServerHandler;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, MetaObject, Tool};
use serde_json::{Value, json};

use super::meta::{RECIPE_META_KEY, insert};
use crate::idem::HasIdem;
use crate::rejection::STATUS_TOOL;

/// How a server is reached, for [`check`]: it says where each request's caller comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// Standard input and output: nothing authenticates a request, so the server acts for the
    /// handle's local caller ([`Builder::local_caller`](crate::settings::Builder::local_caller)),
    /// which it must have.
    Stdio,
    /// Streamable HTTP: each request is served for the caller an auth middleware put into it
    /// (`require_bearer`, feature `mcp-http`); without one it is refused with `no_caller`.
    Http,
}

/// What keeps a server from serving its idempotent tools safely, found by [`check`]; the words
/// say what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotReady {
    /// Tools the router lists with `idempotentHint: true` that no recipe backs: hosts would
    /// retry them blindly.
    Unbacked {
        /// The offending tools' names.
        tools: Vec<String>,
    },
    /// The server does not serve `idem_status`, the tool idem's answers (in flight, outcome
    /// unknown) tell agents to call.
    NoStatusTool {
        /// The server's type.
        server: &'static str,
    },
    /// The server is to serve on stdio, and its handle has no local caller: every idempotent
    /// call would be refused.
    NoLocalCaller,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unbacked { tools } => write!(
                f,
                "refusing to serve tool(s) {} that advertise idempotentHint: true without an idem recipe: hosts \
                 would retry them blindly. Add `#[idempotent(key = \"...\")]` (or `inherent = \"...\"`) to each, \
                 or drop the hint; a tool added by hand says what backs it in its definition's `_meta` \
                 (`idem_runtime::mcp::wire::recipe_meta` with the recipe `Idem::call` protects it with, or \
                 `backed_meta(.., Backing::Inherent)`)",
                tools.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
            ),
            Self::NoStatusTool { server } => write!(
                f,
                "`{server}` does not serve `{STATUS_TOOL}`, the tool that idem's answers (in flight, outcome \
                 unknown) tell agents to call: a plain `#[tool_handler]` serves `Self::tool_router()` alone. Keep \
                 `Self::tool_router() + idem_runtime::mcp::status_tool()` in a field and serve that one: \
                 `#[tool_handler(router = self.tool_router)]`"
            ),
            Self::NoLocalCaller => f.write_str(
                "refusing to serve on stdio: this server's idem handle has no local caller, and a request over \
                 stdio carries no authenticated one, so every idempotent tool call would be refused. Configure the \
                 caller this server acts for: \
                 `Idem::builder(ledger).local_caller(Caller::try_new(tenant, subject)?).build()?`",
            ),
        }
    }
}

impl std::error::Error for NotReady {}

/// Checks an rmcp server before it serves, in one call: every tool `router` lists with
/// `idempotentHint: true` is backed by a recipe (an `#[idempotent]` tool, from whichever audited
/// impl or named router it came, or a tool added by hand whose definition carries
/// [`recipe_meta`](super::wire::recipe_meta), or [`backed_meta`] with [`Backing::Inherent`]); the server serves the status tool (as its `#[tool_handler]` lists it); and
/// over [`Transport::Stdio`] its handle has a local caller. `router` is the one the server
/// serves, usually the field its `#[tool_handler(router = self.tool_router)]` names.
///
/// ```
/// # use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, mcp};
/// # use rmcp::handler::server::router::tool::ToolRouter;
/// # use rmcp::{ServerHandler, tool_handler};
/// #[derive(Clone)]
/// struct Server {
///     idem: Idem,
///     tool_router: ToolRouter<Self>,
/// }
/// # impl HasIdem for Server { fn idem(&self) -> &Idem { &self.idem } }
/// #[tool_handler(router = self.tool_router)]
/// impl ServerHandler for Server {}
///
/// let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("local", "user")).build()?;
/// let server = Server { idem, tool_router: mcp::status_tool() };
/// assert!(mcp::check(&server, &server.tool_router, mcp::Transport::Stdio).is_ok());
///
/// let server = Server { idem: Idem::new(MemoryLedger::new()), tool_router: ToolRouter::new() };
/// assert!(mcp::check(&server, &server.tool_router, mcp::Transport::Http).is_err()); // no `idem_status`
/// # Ok::<(), idem_runtime::settings::BuildError>(())
/// ```
///
/// # Errors
/// The first of: tools hinted idempotent that nothing backs, the status tool not served, no
/// local caller for stdio.
pub fn check<S>(server: &S, router: &ToolRouter<S>, transport: Transport) -> Result<(), NotReady>
where
    S: ServerHandler + HasIdem + Send + Sync + 'static,
{
    let tools: Vec<String> = router
        .list_all()
        .into_iter()
        .filter(|tool| tool.annotations.as_ref().is_some_and(|a| a.idempotent_hint == Some(true)))
        .filter(|tool| !backed_by_recipe(tool))
        .map(|tool| tool.name.to_string())
        .collect();
    if !tools.is_empty() {
        return Err(NotReady::Unbacked { tools });
    }
    if server.get_tool(STATUS_TOOL).is_none() {
        return Err(NotReady::NoStatusTool { server: std::any::type_name::<S>() });
    }
    if transport == Transport::Stdio && server.idem().local_caller().is_none() {
        return Err(NotReady::NoLocalCaller);
    }
    Ok(())
}

/// What backs a tool's `idempotentHint: true`, as recorded in the tool's `_meta` under
/// [`RECIPE_META_KEY`](super::wire::RECIPE_META_KEY) (`{"key": ["card", "amount_cents"]}` or `{"inherent": true}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backing {
    /// A key recipe over these argument paths.
    Key(&'static [&'static str]),
    /// A naturally idempotent tool, with a written reason.
    Inherent,
}

/// The `_meta` of a tool's definition: the user's own (`#[tool(meta = ...)]`), plus
/// `{"key": [...]}` or `{"inherent": true}` under [`RECIPE_META_KEY`](super::wire::RECIPE_META_KEY). `#[idempotent]` gives a
/// naturally idempotent tool this one, and a keyed tool [`recipe_meta`](super::wire::recipe_meta) (its whole recipe).
#[must_use]
pub fn backed_meta(meta: Option<MetaObject>, backing: Backing) -> MetaObject {
    let backing = match backing {
        Backing::Key(paths) => json!({ "key": paths }),
        Backing::Inherent => json!({ "inherent": true }),
    };
    let mut meta = Some(meta.unwrap_or_else(|| MetaObject(JsonObject::new())));
    insert(&mut meta, RECIPE_META_KEY, backing);
    meta.unwrap_or_else(|| MetaObject(JsonObject::new()))
}

/// Whether a tool's `_meta` says a recipe backs it (see [`backed_meta`]).
fn backed_by_recipe(tool: &Tool) -> bool {
    let backs =
        |recipe: &Value| recipe.get("key").is_some_and(Value::is_array) || recipe.get("inherent") == Some(&json!(true));
    let meta = tool.meta.as_ref().map(|meta| &meta.0);
    meta.and_then(|meta| meta.get(RECIPE_META_KEY)).is_some_and(backs)
}
