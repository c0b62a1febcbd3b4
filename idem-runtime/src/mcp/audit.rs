//! The startup audit: a tool listed with `idempotentHint: true` must be backed by a recipe.
//!
//! `#[idempotent]` records what backs a tool in its definition's `_meta` under
//! [`RECIPE_META_KEY`] ([`recipe_meta`](super::recipe_meta), [`backed_meta`]);
//! [`audit`] refuses a router that lists a hint nothing backs (tools registered by hand
//! included), and [`checked_router`] is the audited router plus the status tool.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, MetaObject, Tool};
use serde_json::{Value, json};

use super::meta::{RECIPE_META_KEY, insert};
use super::status::status_tool;
use crate::idem::HasIdem;

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

/// What backs a tool's `idempotentHint: true`, as recorded in the tool's `_meta` under
/// [`RECIPE_META_KEY`] (`{"key": ["card", "amount_cents"]}` or `{"inherent": true}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backing {
    /// A key recipe over these argument paths.
    Key(&'static [&'static str]),
    /// A naturally idempotent tool, with a written reason.
    Inherent,
}

/// The `_meta` of a tool's definition: the user's own (`#[tool(meta = ...)]`), plus
/// `{"key": [...]}` or `{"inherent": true}` under [`RECIPE_META_KEY`]. `#[idempotent]` gives a
/// naturally idempotent tool this one, and a keyed tool [`recipe_meta`](super::recipe_meta) (its whole recipe).
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

/// The startup audit: every tool `router` lists with `idempotentHint: true` must be backed by a
/// recipe — an `#[idempotent]` tool (its `_meta` says so, from whichever audited impl or
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
