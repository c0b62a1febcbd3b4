//! The `_meta` keys idem writes, under the project's own reverse-DNS prefix (MCP reserves the
//! unprefixed names for the specification): a call's outcome on every answer
//! ([`OUTCOME_META_KEY`]), and the recipe on every idempotent tool's definition
//! ([`RECIPE_META_KEY`]). The old key `idem` is written beside both for one release.
//!
//! Guarantees: every answer of an idempotent tool carries the same object under the new and the
//! old key; a definition's recipe object says what makes two calls one operation without
//! revealing anything a `tools/list` reader could not already see in the code.

use rmcp::model::{JsonObject, MetaObject};
use serde_json::{Value, json};

use crate::recipe::{ClientKey, Recipe, ScopeRule, StalePolicy};

/// The `_meta` key of idem's outcome on a tool result: `{"ref": "…", "replayed": false}` on an
/// answer, `{"code": "in_flight", "ref": …, "executed": false, "retry": "no", …}` on a refusal.
pub const OUTCOME_META_KEY: &str = "dev.idem/outcome";

/// The `_meta` key of the recipe on an idempotent tool's definition (`tools/list`), so hosts
/// and gateways can see what makes two calls one operation:
/// `{"key": ["card", "amount_cents"], "windowMs": 900000, "stale": "hold", "scope": "caller"}`,
/// or `{"inherent": true}` for a naturally idempotent tool.
pub const RECIPE_META_KEY: &str = "dev.idem/recipe";

/// Puts `value` under `key`.
pub(crate) fn insert(meta: &mut Option<MetaObject>, key: &str, value: Value) {
    meta.get_or_insert_with(|| MetaObject(JsonObject::new())).0.insert(key.to_owned(), value);
}

/// The object a tool's definition advertises under [`RECIPE_META_KEY`]:
///
/// | field | what it says |
/// |---|---|
/// | `key` | the argument paths that make two calls one operation |
/// | `windowMs` | how long after the first call a repeat is the same operation (absent: the ledger's retention) |
/// | `stale` | `"hold"`, `"takeover"` or `"reconcile"`: what a repeat does when the first call's process died |
/// | `scope` | `"caller"` (tenant and subject) or `"tenant"`; `within` names the argument that narrows it |
/// | `inputKey` | multi-round-trip input responses that join the key (absent: none) |
/// | `singleUseState` | `true` when a continuation's `requestState` is accepted once |
/// | `waitMs` | how long a repeat that finds the operation in progress waits for its result (absent: it is answered "in flight" at once) |
/// | `task` | `true` when a repeat may be answered with the operation's MCP task (clients that declare the tasks extension) |
#[must_use]
pub fn recipe_json(recipe: &Recipe) -> Value {
    let mut object = JsonObject::new();
    object.insert("key".to_owned(), json!(recipe.key_paths()));
    if let Some(window) = recipe.window_duration() {
        let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        object.insert("windowMs".to_owned(), json!(millis));
    }
    let stale = match recipe.stale_policy() {
        StalePolicy::Takeover => "takeover",
        StalePolicy::Reconcile => "reconcile",
        StalePolicy::Hold => "hold",
    };
    object.insert("stale".to_owned(), json!(stale));
    let scope = match recipe.scope_rule() {
        ScopeRule::Tenant => "tenant",
        ScopeRule::Caller => "caller",
        ScopeRule::Within(path) => {
            object.insert("within".to_owned(), json!(path));
            "caller"
        }
    };
    object.insert("scope".to_owned(), json!(scope));
    if !recipe.input_key_paths().is_empty() {
        object.insert("inputKey".to_owned(), json!(recipe.input_key_paths()));
    }
    if recipe.single_use_state_enabled() {
        object.insert("singleUseState".to_owned(), json!(true));
    }
    if let Some(wait) = recipe.wait_duration() {
        object.insert("waitMs".to_owned(), json!(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)));
    }
    if recipe.task_enabled() {
        object.insert("task".to_owned(), json!(true));
    }
    match recipe.client_key_mode() {
        ClientKey::Ignored => {}
        ClientKey::Optional => {
            object.insert("clientKey".to_owned(), json!("optional"));
        }
        ClientKey::Required => {
            object.insert("clientKey".to_owned(), json!("required"));
        }
    }
    Value::Object(object)
}

/// The `_meta` `#[idempotent]` gives a keyed tool's definition: the user's own
/// (`#[tool(meta = ...)]`), plus the recipe under [`RECIPE_META_KEY`] ([`recipe_json`]). A tool
/// registered by hand and protected
/// with [`Idem::call`](crate::Idem::call) can advertise its recipe the same way.
#[must_use]
pub fn recipe_meta(meta: Option<MetaObject>, recipe: &Recipe) -> MetaObject {
    let mut meta = meta.unwrap_or_else(|| MetaObject(JsonObject::new()));
    meta.0.insert(RECIPE_META_KEY.to_owned(), recipe_json(recipe));
    meta
}
