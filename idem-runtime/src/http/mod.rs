//! The HTTP door (feature `http`): [`IdempotencyLayer`], a tower layer that makes a service's
//! unsafe requests safe to repeat under the `Idempotency-Key` header, as the IETF draft "The
//! Idempotency-Key HTTP Header Field" describes — on the same engine as the MCP door: one
//! handle, one ledger, the same claims, leases, stale policies, waiting, sweeper, CLI, metrics
//! and hooks.
//!
//! ```no_run
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
//!     .layer(IdempotencyLayer::new(idem, principal).route(http::Method::POST, "/payments", Route::new()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! What a request gets, step by step:
//! 1. A request the layer does not protect (another method or route) passes through untouched. A
//!    route named with [`IdempotencyLayer::route`] is matched as axum's router matches its
//!    template (the root `/`, `{id}`, a catch-all `{*rest}`); a template it could not match so is
//!    refused when the layer is built.
//! 2. A missing, repeated, empty, unquoted or over-255-character key: **400**, nothing claimed.
//! 3. No principal (the function you give returned `None`): **401**, nothing claimed — a key is
//!    never shared between principals, so a request nobody vouches for is not keyed at all.
//! 4. A body over the limit (`max_request_bytes`, 1 MiB by default): **413**, nothing claimed. A
//!    body labelled JSON that the strict canonical parser
//!    ([`parse_strict`](crate::canonical::parse_strict)) refuses — a member name twice, an
//!    integer beyond the 64-bit range no double holds, malformed text: **400**, nothing claimed.
//! 5. The operation is keyed by principal, method, route and key, and fingerprinted over method,
//!    path, query and body (its canonical JSON when it is labelled JSON, its bytes otherwise):
//!    - the first request runs the service; its response — whatever its status — is stored
//!      (status, the allow-listed headers, body) and returned;
//!    - a repeat after it completed gets the stored response with `Idempotent-Replayed: true`;
//!    - a repeat while it runs: **409** with `Retry-After` (or, with [`Route::wait`], the
//!      response once it completes);
//!    - the same key with another request (method, path, query or body): **422**;
//!    - the outcome unknown (a service error, a response too large to store, a holder that died
//!      under the `hold` policy): **409**, type `outcome-unknown`, no `Retry-After`;
//!    - the ledger unreachable or the server draining: **503** with `Retry-After`, nothing executed.
//!
//! A protected request runs on a task of its own (the layer needs a Tokio runtime): a client that
//! hangs up mid-request does not stop the service halfway, so its response is recorded and the
//! client's retry is answered from it.
//!
//! Which responses are stored: every response the service returned, 2xx, 4xx and 5xx alike — the
//! service ran, and only it knows whether the effect happened — except the statuses a route
//! declares "nothing happened" ([`Route::nothing_happened_on`], e.g. a 429 your service returns
//! before doing anything): those reach the client and the next repeat runs again. The layer's
//! own refusals (400, 401, 409, 413, 422, 503) are never stored: nothing ran.
//!
//! Every refusal is `application/problem+json` with `type` (`urn:idem:problem:…`), `title`,
//! `status` and `detail`.

mod answer;
mod forward;
mod key;
mod service;
mod template;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

pub use self::answer::IDEMPOTENT_REPLAYED;
pub use self::forward::{Child, ForwardKey, ForwardKeyLayer, forwarded_child_key, forwarded_key};
pub use self::key::{IDEMPOTENCY_KEY, MAX_KEY_CHARS};
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

/// Who makes a request: your authentication's principal, from the request's head.
pub type Principal = dyn Fn(&http::request::Parts) -> Option<Caller> + Send + Sync;

/// How one route's requests are kept: window, stale policy, waiting, and the statuses that mean
/// nothing happened.
#[derive(Clone, Debug)]
pub struct Route {
    window: Option<Duration>,
    stale: StalePolicy,
    wait: Option<Duration>,
    nothing_happened: Vec<StatusCode>,
}

impl Default for Route {
    fn default() -> Self {
        Self::new()
    }
}

impl Route {
    /// The defaults: the handle's retention as window, `hold` on a dead holder, no waiting, every
    /// response stored.
    #[must_use]
    pub const fn new() -> Self {
        Self { window: None, stale: StalePolicy::Hold, wait: None, nothing_happened: Vec::new() }
    }

    /// How long a key names one operation (a retry after it starts a new one).
    #[must_use]
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// What a repeat does when the request's holder died mid-request (see [`StalePolicy`]).
    #[must_use]
    pub const fn stale(mut self, stale: StalePolicy) -> Self {
        self.stale = stale;
        self
    }

    /// A repeat that finds the request in progress waits up to `wait` for its response instead of
    /// being answered 409 at once.
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Responses with these statuses mean the service did nothing (it refused before acting):
    /// they reach the client but are not stored, and the next repeat runs the service again.
    #[must_use]
    pub fn nothing_happened_on(mut self, statuses: &[StatusCode]) -> Self {
        self.nothing_happened = statuses.to_vec();
        self
    }

    /// This route's recipe for `tool` (leaked once, at configuration).
    #[track_caller]
    fn recipe(&self, tool: String) -> &'static Recipe {
        let tool: &'static str = Box::leak(tool.into_boxed_str());
        let mut recipe = Recipe::new(tool, &["route", "key"]).stale(self.stale);
        if let Some(window) = self.window {
            recipe = recipe.window(window);
        }
        if let Some(wait) = self.wait {
            recipe = recipe.wait(wait);
        }
        Box::leak(Box::new(recipe))
    }
}

/// A configured route: its method, its path template and how it is kept.
struct Protected {
    method: Method,
    /// The template as axum's router reads it (see `template.rs`).
    pieces: Vec<template::Piece>,
    template: String,
    recipe: &'static Recipe,
    nothing_happened: Vec<StatusCode>,
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
}

/// What the layer's services share.
pub(crate) struct Config {
    idem: Idem,
    principal: Arc<Principal>,
    routes: Vec<Protected>,
    /// The methods protected on every route no configured route names, with their recipes.
    methods: Vec<(Method, &'static Recipe)>,
    default_route: Route,
    max_request_bytes: usize,
    max_response_bytes: usize,
    stored_headers: Vec<HeaderName>,
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
    /// authentication: a verified token's subject, a session's user). It protects POST and PATCH
    /// requests on every route by default ([`IdempotencyLayer::methods`]); routes named with
    /// [`IdempotencyLayer::route`] get their own settings.
    #[track_caller]
    pub fn new(
        idem: Idem,
        principal: impl Fn(&http::request::Parts) -> Option<Caller> + Send + Sync + 'static,
    ) -> Self {
        let default_route = Route::new();
        let methods = [Method::POST, Method::PATCH]
            .into_iter()
            .map(|method| {
                let recipe = default_route.recipe(format!("{method} *"));
                (method, recipe)
            })
            .collect();
        Self {
            config: Arc::new(Config {
                idem,
                principal: Arc::new(principal),
                routes: Vec::new(),
                methods,
                default_route,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                stored_headers: vec![
                    http::header::CONTENT_TYPE,
                    http::header::LOCATION,
                    http::header::ETAG,
                    http::header::CACHE_CONTROL,
                ],
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::get_mut(&mut self.config).expect("an IdempotencyLayer is configured before it is cloned")
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
    /// under other parameter names): the message says what to write instead.
    #[must_use]
    #[track_caller]
    pub fn route(mut self, method: Method, path: &str, route: Route) -> Self {
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
        let recipe = route.recipe(format!("{method} {template}"));
        self.config().routes.push(Protected {
            method,
            pieces,
            template,
            recipe,
            nothing_happened: route.nothing_happened,
        });
        self
    }

    /// The methods protected on routes not named with [`IdempotencyLayer::route`] (POST and PATCH
    /// by default; none: only the named routes). Their operations are keyed under the matched
    /// route (axum's `MatchedPath` when there is one, else the path), with the default settings.
    #[must_use]
    #[track_caller]
    pub fn methods(mut self, methods: &[Method]) -> Self {
        let recipes = methods
            .iter()
            .map(|method| (method.clone(), self.config.default_route.recipe(format!("{method} *"))))
            .collect();
        self.config().methods = recipes;
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

    /// The response headers stored and replayed besides status and body (default:
    /// `content-type`, `location`, `etag`, `cache-control`). Others reach the first client only.
    #[must_use]
    pub fn store_headers(mut self, names: &[HeaderName]) -> Self {
        self.config().stored_headers = names.to_vec();
        self
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent::new(inner, Arc::clone(&self.config))
    }
}
