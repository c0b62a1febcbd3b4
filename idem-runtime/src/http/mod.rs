//! The HTTP door (feature `http`): [`IdempotencyLayer`], a tower layer that makes a service's
//! unsafe requests safe to repeat under the `Idempotency-Key` header, as the IETF draft "The
//! Idempotency-Key HTTP Header Field" describes — on the same engine as the MCP door: one
//! handle, one ledger, the same claims, leases, stale policies, waiting, sweeper, CLI, metrics
//! and hooks.
//!
//! ```no_run
//! # #[cfg(feature = "http")]
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::routing::post;
//! use idem_runtime::http::{IdempotencyLayer, Route};
//! use idem_runtime::{Caller, Idem, MemoryLedger};
//!
//! let idem = Idem::new(MemoryLedger::new());
//! // Who is asking: your authentication's principal (here, a header an auth proxy sets).
//! let principal = |parts: &http::request::Parts| {
//!     let user = parts.headers.get("x-user")?.to_str().ok()?;
//!     Caller::try_new("shop", user).ok()
//! };
//! let app = axum::Router::new()
//!     .route("/payments", post(|| async { "charged" }))
//!     .layer(
//!         IdempotencyLayer::new(idem, principal)
//!             .namespace("shop")
//!             .route(http::Method::POST, "/payments", Route::new()),
//!     );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! With the `http` feature the layer knows axum: on a `Router` it protects the route the router
//! matched (axum's `MatchedPath`), [`IdempotencyLayer::methods`] can key every route of a method
//! by it, and [`IdempotencyKey`] is an extractor. The `http-tower` feature builds the layer alone,
//! for a plain tower or hyper service with no axum in the build: it matches the requests' paths
//! against the templates it was given, as axum's router would (never put that build on an axum
//! `Router` inside `nest`: it would see the path without the prefix).
//!
//! What a request gets, step by step:
//! 1. The layer protects what you declare — routes named with [`IdempotencyLayer::route`],
//!    matched as axum's router matches their templates (the root `/`, `{id}`, a catch-all
//!    `{*rest}`), or every matched route's requests of the methods given to
//!    [`IdempotencyLayer::methods`] — and nothing else: another route, method or merged router,
//!    or a path no route matches (the router's 404 or 405), passes through untouched. A template
//!    it could not match as the router does, a safe method (GET, HEAD, OPTIONS, TRACE), a layer
//!    that protects nothing, a layer without a namespace on a ledger other services may share,
//!    and two layers protecting one route on one handle are refused when the layer is built.
//! 2. A missing, repeated, empty, malformed or over-255-character key: **400**, nothing claimed.
//!    A key is the draft's quoted String (`"8e03…"`) or a bare token of visible ASCII
//!    (`8e03…`, as Stripe-style clients send it; refused under
//!    [`IdempotencyLayer::strict_keys`]); the handler reads it decoded through
//!    [`IdempotencyKey`].
//! 3. No principal (the function you give returned `None`): **401**, nothing claimed — a key is
//!    never shared between principals, so a request nobody vouches for is not keyed at all.
//! 4. A body over the limit (`max_request_bytes`, 1 MiB by default): **413**, nothing claimed. A
//!    body labelled JSON that the strict canonical parser
//!    ([`parse_strict`](crate::canonical::parse_strict)) refuses — a member name twice, an
//!    integer beyond the 64-bit range no double holds, malformed text: **400**, nothing claimed.
//! 5. The operation is keyed by principal, method, route and key, and fingerprinted over method,
//!    path, query and body (its canonical JSON when it is labelled JSON, its bytes otherwise):
//!    - the first request runs the service; its response is stored (status, the representation
//!      headers and the allow-listed ones, body) and returned;
//!    - a repeat after it completed gets the stored response with `Idempotent-Replayed: true`;
//!    - a repeat while it runs: **409** with `Retry-After` (or, with [`Route::wait`], the
//!      response once it completes);
//!    - the same key with another request (method, path, query or body): **422**;
//!    - the outcome unknown (a service error, a response too large to store, a holder that died
//!      under the `hold` policy): **409**, type `outcome-unknown`, no `Retry-After`;
//!    - the ledger unreachable or the server draining: **503** with `Retry-After`, nothing executed.
//!
//! A protected request runs to its end (the layer needs a Tokio runtime): it runs on its
//! connection's task, and a client that hangs up mid-request does not stop the service halfway —
//! the rest of the request goes on in a task of its own — so its response is recorded and the
//! client's retry is answered from it.
//!
//! Which responses are stored: every response the service returned, 2xx, 4xx and 5xx alike — the
//! service ran, and only it knows whether the effect happened — except the statuses that mean
//! "nothing happened": by default what the framework answers before the handler acts
//! ([`NOTHING_HAPPENED_BY_DEFAULT`]: 400, 404, 405, 413, 415, 422), or the list a route declares
//! ([`Route::nothing_happened_on`], e.g. adding a 429 your service returns before doing
//! anything). Those reach the client and the next repeat runs again. The layer's own refusals
//! (400, 401, 409, 413, 422, 503) are never stored: nothing ran.
//!
//! Every refusal is `application/problem+json` with `type` (`urn:idem:problem:…`), `title`,
//! `status` and `detail`.

mod answer;
mod build;
mod forward;
mod key;
mod service;
mod shape;
mod template;

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

pub use self::answer::IDEMPOTENT_REPLAYED;
pub use self::forward::{Child, ForwardKey, ForwardKeyLayer, forwarded_child_key, forwarded_key};
pub use self::key::{IDEMPOTENCY_KEY, IdempotencyKey, MAX_KEY_CHARS};
pub use self::service::{BoxError, Idempotent, LayerBody};

use crate::Idem;
use crate::recipe::{Recipe, StalePolicy};
use crate::scope::Caller;

/// The largest request body read by default (1 MiB): a larger one is refused with 413 before
/// anything is claimed.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// The largest response body stored by default (1 MiB): a larger one still reaches the client,
/// and its operation is recorded "outcome unknown" (it cannot be replayed).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The statuses not stored by default ([`Route::nothing_happened_on`]): what a framework answers
/// before the handler acts — 400 (a body or a path parameter that does not parse), 404 (a path
/// the router lacks, or a resource the handler did not find), 405 (a method the route lacks), 413
/// (a body over a limit), 415 (a content type the handler does not take), 422 (a body of the
/// wrong shape). The client gets the answer, and a corrected request under the same key runs.
pub const NOTHING_HAPPENED_BY_DEFAULT: [StatusCode; 6] = [
    StatusCode::BAD_REQUEST,
    StatusCode::NOT_FOUND,
    StatusCode::METHOD_NOT_ALLOWED,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    StatusCode::UNPROCESSABLE_ENTITY,
];

/// The representation headers, always stored with the body they describe, so a replay is what
/// the client got (a compression layer inside the layer stores its `content-encoding`).
pub const REPRESENTATION_HEADERS: [HeaderName; 4] = [
    http::header::CONTENT_TYPE,
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_LANGUAGE,
    http::header::CONTENT_LOCATION,
];

/// The other headers stored by default ([`IdempotencyLayer::store_headers`]).
pub const STORED_HEADERS_BY_DEFAULT: [HeaderName; 5] = [
    http::header::LOCATION,
    http::header::ETAG,
    http::header::LAST_MODIFIED,
    http::header::CACHE_CONTROL,
    http::header::VARY,
];

/// Who makes a request: your authentication's principal, from the request's head.
pub type Principal = dyn Fn(&http::request::Parts) -> Option<Caller> + Send + Sync;

/// How one route's requests are kept: window, stale policy, waiting, and the statuses that mean
/// nothing happened.
#[derive(Clone, Debug)]
pub struct Route {
    /// Window, stale policy and waiting, set through [`Recipe`]'s own builder; the tool, the
    /// namespace and where it is declared are the layer's to give when it names the route.
    recipe: Recipe,
    nothing_happened: Cow<'static, [StatusCode]>,
}

impl Default for Route {
    fn default() -> Self {
        Self::new()
    }
}

impl Route {
    /// The defaults: the handle's retention as window, `hold` on a dead holder, no waiting, every
    /// response stored but the framework's refusals ([`NOTHING_HAPPENED_BY_DEFAULT`]).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            recipe: Recipe::new("", &["route", "key"]).result_schema(shape::stored_response),
            nothing_happened: Cow::Borrowed(&NOTHING_HAPPENED_BY_DEFAULT),
        }
    }

    /// How long a key names one operation (a retry after it starts a new one).
    #[must_use]
    pub const fn window(mut self, window: Duration) -> Self {
        self.recipe = self.recipe.window(window);
        self
    }

    /// What a repeat does when the request's holder died mid-request (see [`StalePolicy`]).
    #[must_use]
    pub const fn stale(mut self, stale: StalePolicy) -> Self {
        self.recipe = self.recipe.stale(stale);
        self
    }

    /// A repeat that finds the request in progress waits up to `wait` for its response instead of
    /// being answered 409 at once.
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.recipe = self.recipe.wait(wait);
        self
    }

    /// Responses with these statuses mean the service did nothing (it refused before acting):
    /// they reach the client but are not stored, and the next repeat runs the service again.
    /// This replaces the default list ([`NOTHING_HAPPENED_BY_DEFAULT`]); `&[]` stores every
    /// response.
    #[must_use]
    pub fn nothing_happened_on(mut self, statuses: &[StatusCode]) -> Self {
        self.nothing_happened = Cow::Owned(statuses.to_vec());
        self
    }

    /// This route's recipe for `tool` in `namespace`, owned by the layer.
    #[track_caller]
    fn recipe(&self, tool: String, namespace: Option<&'static str>) -> Arc<Recipe> {
        let mut recipe = self.recipe.named(intern(tool), std::panic::Location::caller());
        if let Some(namespace) = namespace {
            recipe = recipe.namespace(namespace);
        }
        Arc::new(recipe)
    }
}

/// `text` as a `&'static str`, kept once per process however many layers name it: a recipe's
/// tool and namespace are `&'static str` (the macro's are literals), and a layer's come from its
/// configuration — a route's `POST /payments`, a service's namespace. Memory grows with the
/// distinct names, never with the layers built.
fn intern(text: String) -> &'static str {
    static KEPT: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = kept.get(text.as_str()) {
        return known;
    }
    let kept_once: &'static str = Box::leak(text.into_boxed_str());
    kept.insert(kept_once);
    kept_once
}

/// A configured route: its method, its path template and how it is kept.
#[derive(Clone)]
struct Protected {
    method: Method,
    /// The template as axum's router reads it (see `template.rs`).
    pieces: Vec<template::Piece>,
    template: String,
    recipe: Arc<Recipe>,
    nothing_happened: Cow<'static, [StatusCode]>,
}

impl Protected {
    /// Whether this route takes `method` requests to `path`, as axum's router would send them,
    /// and how closely (the smallest rank is the router's choice).
    fn matches(&self, method: &Method, path: &str) -> Option<template::Rank> {
        if *method != self.method {
            return None;
        }
        template::matches(&self.pieces, path)
    }

    /// Whether this route is the one the router matched: `matched` is what [`matched_templates`]
    /// read from the request, parsed once for all the layer's routes.
    fn is_route(&self, method: &Method, matched: &[Vec<template::Piece>]) -> bool {
        *method == self.method && matched.contains(&self.pieces)
    }
}

/// The route the router matched, as templates the layer's routes are compared with: `matched`
/// (axum's `MatchedPath`, the whole template, with the prefixes of the routers it is nested in)
/// and, under the prefix `nested` (axum's `NestedPath`: the layer sits inside that router), the
/// template as that router has it.
fn matched_templates(matched: &str, nested: Option<&str>) -> Vec<Vec<template::Piece>> {
    let inner = nested.and_then(|prefix| matched.strip_prefix(prefix.trim_end_matches('/')));
    [Some(matched), inner].into_iter().flatten().filter_map(|template| template::parse(template).ok()).collect()
}

/// What the layer's services share.
#[derive(Clone)]
pub(crate) struct Config {
    /// This layer: the same in its clones, another in a clone configured further. Dropped
    /// before the handle: while the catalogue sees this layer alive, its handle's address is
    /// its own.
    identity: Arc<()>,
    idem: Idem,
    principal: Arc<Principal>,
    routes: Vec<Protected>,
    /// The methods protected on every route no configured route names, with their recipes.
    methods: Vec<(Method, Arc<Recipe>)>,
    default_route: Route,
    /// The namespace the layer's operations are keyed in, if set ([`IdempotencyLayer::namespace`]).
    namespace: Option<&'static str>,
    strict_keys: bool,
    max_request_bytes: usize,
    max_response_bytes: usize,
    /// The headers stored with a response: the representation headers and the chosen others.
    stored_headers: Vec<HeaderName>,
    /// Set once the layer's routes were checked against its handle (the first `layer` call).
    checked: OnceLock<()>,
    /// Whether a request of a method given to `methods` came without the router's
    /// `MatchedPath` (the layer outside a router), said once.
    outside_router: Arc<std::sync::atomic::AtomicBool>,
}

/// A tower layer that makes requests safe to repeat under the `Idempotency-Key` header (see the
/// [module](self)). Put it on an axum `Router` with `.layer(...)`, or around any tower service of
/// `http` requests.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes: Vec<String> =
            self.config.routes.iter().map(|route| format!("{} {}", route.method, route.template)).collect();
        let methods: Vec<&Method> = self.config.methods.iter().map(|(method, _)| method).collect();
        f.debug_struct("IdempotencyLayer").field("routes", &routes).field("methods", &methods).finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer on `idem`'s ledger, with `principal` saying who makes each request (from your
    /// authentication: a verified token's subject, a session's user). It protects what you
    /// declare: routes with [`IdempotencyLayer::route`], or every route's requests of some
    /// methods with [`IdempotencyLayer::methods`] — nothing else, so another router merged under
    /// it is untouched. On a durable ledger, give it a [`namespace`](IdempotencyLayer::namespace).
    #[track_caller]
    pub fn new(
        idem: Idem,
        principal: impl Fn(&http::request::Parts) -> Option<Caller> + Send + Sync + 'static,
    ) -> Self {
        Self {
            config: Arc::new(Config {
                idem,
                principal: Arc::new(principal),
                routes: Vec::new(),
                methods: Vec::new(),
                default_route: Route::new(),
                namespace: None,
                strict_keys: false,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                stored_headers: REPRESENTATION_HEADERS.into_iter().chain(STORED_HEADERS_BY_DEFAULT).collect(),
                checked: OnceLock::new(),
                identity: Arc::new(()),
                outside_router: Arc::default(),
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        // A clone configured further is a layer of its own, checked again when applied; the one
        // it was cloned from is unchanged.
        let config = Arc::make_mut(&mut self.config);
        config.checked = OnceLock::new();
        config.identity = Arc::new(());
        config
    }

    /// Keys the layer's operations in `namespace` — your service's name (`"orders"`). Two
    /// services on one ledger with the same route, principal and key then never share an
    /// operation. A handle built with [`Builder::namespace`](crate::settings::Builder::namespace) keys
    /// every recipe in its own, which wins over this one.
    ///
    /// On a memory ledger the default is `"default"`; on any other (SQL, Redis: a ledger other
    /// services may share) a layer whose handle sets no namespace either is refused when it is
    /// built. Renaming the namespace re-keys the layer's operations (repeats of earlier requests
    /// run again).
    ///
    /// # Panics
    ///
    /// An empty namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        let namespace: String = namespace.into();
        assert!(!namespace.trim().is_empty(), "IdempotencyLayer::namespace: give the service's name, not an empty one");
        let namespace = intern(namespace);
        let config = self.config();
        config.namespace = Some(namespace);
        for route in &mut config.routes {
            route.recipe = Arc::new(route.recipe.namespace(namespace));
        }
        for (_, recipe) in &mut config.methods {
            *recipe = Arc::new(recipe.namespace(namespace));
        }
        self
    }

    /// Protects `method` requests to `path` with `route`'s settings. `path` is the template
    /// exactly as given to axum's `Router::route`, matched as axum 0.8's router matches it: `/`
    /// is the root, a trailing slash is part of the route, `{id}` matches one segment (or the
    /// rest of one, `/v{version}`), `{*rest}` at the end matches one or more remaining segments,
    /// and where two templates match, text wins over `{id}` over `{*rest}`. Its operations are
    /// keyed under the template, so `/payments/1` and `/payments/2` share one tool name and differ
    /// by their keys.
    ///
    /// # Panics
    ///
    /// When the layer could not match `path` as the router does — no leading `/`, axum 0.7's
    /// `:id` or `*rest`, text after a `{id}` in its segment, a `{*rest}` before the end, an
    /// unnamed or unclosed parameter — or when `method` and `path` are already protected (also
    /// under other parameter names), or `method` is safe (GET, HEAD, OPTIONS, TRACE: a repeat
    /// of a read must read again, not replay an old answer): the message says what to write
    /// instead.
    #[must_use]
    #[track_caller]
    pub fn route(mut self, method: Method, path: &str, route: Route) -> Self {
        build::refuse_safe(&method, &format!("IdempotencyLayer::route({method}, {path:?})"));
        let pieces = match template::parse(path) {
            Ok(pieces) => pieces,
            Err(advice) => panic!(
                "IdempotencyLayer::route({method}, {path:?}): the layer cannot match this template as axum's \
                 router does: {advice}"
            ),
        };
        if let Some(protected) =
            self.config.routes.iter().find(|protected| protected.method == method && protected.pieces == pieces)
        {
            panic!(
                "IdempotencyLayer::route({method}, {path:?}): `{method} {}` is already protected, and the router \
                 sends a request to one of them; name each route once",
                protected.template
            );
        }
        let template = path.to_owned();
        let recipe = route.recipe(format!("{method} {template}"), self.config.namespace);
        self.config().routes.push(Protected {
            method,
            pieces,
            template,
            recipe,
            nothing_happened: route.nothing_happened,
        });
        self
    }

    /// Protects every route's requests of `methods` (for example `&[Method::POST]`) besides the
    /// routes named with [`IdempotencyLayer::route`], with the default settings. Their
    /// operations are keyed under the route the router matched (axum's `MatchedPath`), so the
    /// layer must sit on the router (`Router::layer`); a request no route matches passes through
    /// to the router's 404 or 405, and nothing is stored. None by default.
    ///
    /// # Panics
    ///
    /// A safe method (GET, HEAD, OPTIONS, TRACE).
    #[cfg(feature = "http")]
    #[must_use]
    #[track_caller]
    pub fn methods(mut self, methods: &[Method]) -> Self {
        for method in methods {
            build::refuse_safe(method, &format!("IdempotencyLayer::methods(&[.., {method}, ..])"));
        }
        // A loop, not a closure: the recipes' site is the caller's `.methods(..)`.
        let mut recipes = Vec::with_capacity(methods.len());
        for method in methods {
            recipes
                .push((method.clone(), self.config.default_route.recipe(format!("{method} *"), self.config.namespace)));
        }
        self.config().methods = recipes;
        self
    }

    /// Accepts only the draft's quoted String as a key (`Idempotency-Key: "8e03…"`); a bare token
    /// (`Idempotency-Key: 8e03…`, as Stripe-style clients send it) is then refused with 400. By
    /// default both are accepted, and mean the same key.
    #[must_use]
    pub fn strict_keys(mut self) -> Self {
        self.config().strict_keys = true;
        self
    }

    /// The largest request body read (a larger one: 413, nothing claimed).
    #[must_use]
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.config().max_request_bytes = bytes;
        self
    }

    /// The largest response body stored (a larger one reaches the client, and the operation is
    /// recorded "outcome unknown").
    #[must_use]
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.config().max_response_bytes = bytes;
        self
    }

    /// The response headers stored and replayed besides status, body and the representation
    /// headers, which are always stored ([`REPRESENTATION_HEADERS`]: `content-type`,
    /// `content-encoding`, `content-language`, `content-location`). Default:
    /// [`STORED_HEADERS_BY_DEFAULT`] (`location`, `etag`, `last-modified`, `cache-control`,
    /// `vary`). Others reach the first client only.
    #[must_use]
    pub fn store_headers(mut self, names: &[HeaderName]) -> Self {
        let mut stored: Vec<HeaderName> = REPRESENTATION_HEADERS.to_vec();
        stored.extend(names.iter().filter(|name| !REPRESENTATION_HEADERS.contains(name)).cloned());
        self.config().stored_headers = stored;
        self
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    /// # Panics
    ///
    /// When the layer cannot keep its promise on its handle ([`IdempotencyLayer::namespace`],
    /// two layers protecting one route, a layer protecting nothing): the message says what to
    /// change. Checked once, at the first call (when axum's `Router::layer` applies it).
    fn layer(&self, inner: S) -> Self::Service {
        self.config.check();
        Idempotent::new(inner, Arc::clone(&self.config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layers built again and again (a router per test, per tenant) keep each route's and
    /// namespace's name once: their recipes are the layer's own, and nothing else is kept.
    #[test]
    fn a_layer_built_again_keeps_its_names_once() {
        let build = || {
            IdempotencyLayer::new(Idem::new(crate::MemoryLedger::new()), |_: &http::request::Parts| None)
                .namespace(String::from("orders"))
                .route(Method::POST, "/payments", Route::new())
        };
        let (first, again) = (build(), build());
        let (first, again) = (&first.config.routes[0].recipe, &again.config.routes[0].recipe);
        assert!(!Arc::ptr_eq(first, again), "each layer owns its recipe");
        assert_eq!(first.tool(), "POST /payments");
        assert!(std::ptr::eq(first.tool(), again.tool()), "the route's name is kept once");
        let (first, again) = (first.namespace_name().unwrap(), again.namespace_name().unwrap());
        assert!(std::ptr::eq(first, again), "the namespace is kept once");
    }
}
