//! The checks made when an [`IdempotencyLayer`](super::IdempotencyLayer) is built and first
//! applied: no safe method, something protected, a namespace on a ledger other services may
//! share, and one layer per route — on its handle and among the layers alive in this process.

use std::sync::Arc;

use http::Method;

use super::Config;
use crate::recipe::Recipe;

/// The layers applied in this process, per ledger, namespace and operation name: two different
/// layers alive at once that protect one route on one ledger would share its operations.
struct Applied {
    ledger: std::sync::Weak<dyn crate::ledger::Ledger>,
    namespace: String,
    tool: String,
    layer: std::sync::Weak<()>,
}

static APPLIED: std::sync::Mutex<Vec<Applied>> = std::sync::Mutex::new(Vec::new());

/// Refuses protecting a safe method, saying why.
#[track_caller]
pub(super) fn refuse_safe(method: &Method, what: &str) {
    if [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method) {
        panic!(
            "{what}: {method} is a safe method — a repeat of a read must read again, and a stored answer would \
             replay an old state (\"paid\" after a refund); protect the methods that act (POST, PATCH, PUT, DELETE)"
        );
    }
}

impl Config {
    /// Checks the layer against its handle once, when it is first applied to a service: it
    /// protects something; on a ledger other services may share, its operations are kept in a
    /// namespace of their own; and no other layer on the handle protects one of its routes.
    ///
    /// # Panics
    ///
    /// When one of these fails, saying what to change.
    pub(super) fn check(&self) {
        self.checked.get_or_init(|| {
            let recipes: Vec<&Recipe> = self
                .routes
                .iter()
                .map(|route| &*route.recipe)
                .chain(self.methods.iter().map(|(_, recipe)| &**recipe))
                .collect();
            // `.methods(..)` exists with axum only (feature `http`).
            let or_methods = if cfg!(feature = "http") {
                ", or protect every route's requests of a method with `.methods(&[Method::POST])`"
            } else {
                ""
            };
            assert!(
                !recipes.is_empty(),
                "this IdempotencyLayer protects nothing: name its routes with \
                 `.route(Method::POST, \"/payments\", Route::new())`{or_methods}"
            );
            let ledger = self.idem.ledger();
            for recipe in &recipes {
                let namespace = self.idem.namespace(recipe);
                if self.namespace.is_none() && namespace == crate::idem::DEFAULT_NAMESPACE && !ledger.local() {
                    panic!(
                        "this IdempotencyLayer protects `{}` on a ledger other services may share, without a \
                         namespace: two services on one database with the same route, principal and key would \
                         share one operation, and the second would be answered the first's response. Name the \
                         service: `.namespace(\"orders\")` on the layer (or `Idem::builder(..).namespace(..)` for \
                         the whole handle; `default` is what no namespace means, so name another)",
                        recipe.tool()
                    );
                }
                self.refuse_another_layer(recipe.tool(), namespace);
                if let Err(crate::Rejection::DuplicateTool { namespace, tool, first, second }) =
                    self.idem.register(recipe)
                {
                    panic!(
                        "two IdempotencyLayers on one handle protect `{tool}` in namespace `{namespace}` (declared \
                         at `{first}` and at `{second}`): their requests would be one operation per key. Protect \
                         the route in one layer only, or give each layer its own namespace — \
                         `.namespace(\"payments-v2\")` — on a handle without `Builder::namespace` (which wins over \
                         a layer's). A layer inside `Router::nest(\"/v2\", ..)` sees the path without `/v2`"
                    );
                }
            }
        });
    }
}

impl Config {
    /// Records this layer as the one that protects `tool` in `namespace` on its ledger, refusing
    /// it when another layer alive in this process already does — also one built by the same
    /// code (a function called for `/v1` and for `/v2`), or a clone configured further.
    ///
    /// # Panics
    ///
    /// Another layer protects the route, saying what to change.
    fn refuse_another_layer(&self, tool: &str, namespace: &str) {
        let ledger = self.idem.ledger();
        let mut applied = APPLIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        applied.retain(|entry| entry.ledger.strong_count() > 0 && entry.layer.strong_count() > 0);
        let same = |entry: &&Applied| {
            entry.namespace == namespace
                && entry.tool == tool
                && std::ptr::addr_eq(entry.ledger.as_ptr(), Arc::as_ptr(ledger))
        };
        let mine = |entry: &Applied| std::ptr::eq(entry.layer.as_ptr(), Arc::as_ptr(&self.identity));
        if applied.iter().filter(same).any(|entry| !mine(entry)) {
            panic!(
                "two IdempotencyLayers alive at once protect `{tool}` in namespace `{namespace}` on one ledger: their \
                 requests would be one operation per key, and one router would be answered the other's responses. \
                 Give each layer its own namespace — `.namespace(\"payments-v2\")` (on a handle without \
                 `Builder::namespace`, which wins over a layer's) — or, for one service served twice, apply one \
                 layer (clones of it) to both routers. A layer inside `Router::nest(\"/v2\", ..)` names its routes \
                 as that router has them (`/payments`) or in full (`/v2/payments`)"
            );
        }
        if !applied.iter().filter(same).any(mine) {
            applied.push(Applied {
                ledger: Arc::downgrade(ledger),
                namespace: namespace.to_owned(),
                tool: tool.to_owned(),
                layer: Arc::downgrade(&self.identity),
            });
        }
    }
}
