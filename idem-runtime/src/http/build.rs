//! The checks made when an [`IdempotencyLayer`](super::IdempotencyLayer) is built and first
//! applied: no safe method, something protected, a namespace on a ledger other services may
//! share, and one layer per route — one handler per route over its ledger, one layer alive per
//! route on its handle.

use http::Method;

use super::Config;
use crate::recipe::Recipe;

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
                // The ledger's catalogue refuses a route another layer protects: another
                // route's handler, or the same one under another layer alive at once on this
                // handle (one function building `/v1` and `/v2`, or a clone configured further).
                match self.idem.declare(recipe, None, Some(&self.identity)) {
                    Ok(_) => {}
                    Err(clash) if clash.another_layer => panic!(
                        "two IdempotencyLayers alive at once protect `{}` in namespace `{namespace}` on one handle: \
                         their requests would be one operation per key, and one router would be answered the \
                         other's responses. Give each layer its own namespace — `.namespace(\"payments-v2\")` (on \
                         a handle without `Builder::namespace`, which wins over a layer's) — or, for one service \
                         served twice, apply one layer (clones of it) to both routers. A layer inside \
                         `Router::nest(\"/v2\", ..)` names its routes as that router has them (`/payments`) or in \
                         full (`/v2/payments`)",
                        recipe.tool()
                    ),
                    Err(clash) => panic!(
                        "two IdempotencyLayers protect `{}` in namespace `{namespace}` on one ledger (`{}`; \
                         `{}`): their requests would be one operation per key. Protect the route in one \
                         layer only, or give each layer its own namespace — `.namespace(\"payments-v2\")` — on a \
                         handle without `Builder::namespace` (which wins over a layer's). A layer inside \
                         `Router::nest(\"/v2\", ..)` sees the path without `/v2`",
                        recipe.tool(),
                        clash.first,
                        clash.second
                    ),
                }
            }
        });
    }
}
