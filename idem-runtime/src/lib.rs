//! `idem` makes an agent tool call safe to repeat.
//!
//! A tool handler annotated with [`idempotent`] derives an idempotency key on the server
//! (namespace + caller scope + tool + canonicalised chosen arguments, HMAC-SHA256 under a server
//! [`Secret`](secret::Secret)), claims it in a [`Ledger`](ledger::Ledger)
//! before its side effect, and answers every repeat from the stored result instead of running
//! twice. This crate is the one users depend on: it re-exports the macros and holds key
//! derivation, the ledger trait and its backends, and the call orchestration.
//!
//! The pieces, bottom up:
//!
//! - [`canonical`]: RFC 8785 canonical JSON, so key order, whitespace and number spelling never
//!   change a key.
//! - [`Key`], [`Ref`], [`Fingerprint`](key::Fingerprint): what a call is, derived from a [`Recipe`] and a [`Scope`](scope::Scope).
//! - [`Ledger`](ledger::Ledger): the atomic claim and the record's state machine; [`MemoryLedger`] for tests.
//! - [`Idem`]: the handle that runs a handler under a recipe ([`Idem::call`]), built once with
//!   [`Idem::builder`]; an operation's status for its caller ([`Idem::status`]); and the
//!   operator's verbs on [`Admin`](admin::Admin) ([`Idem::admin`]: inspect, resolve with a [`Resolution`](admin::Resolution),
//!   stats, pending, sweep, and a sweeper that sweeps in the background on every replica).
//! - [`Hooks`](hooks::Hooks): an observer of each call's lifecycle for audit logs ([`Builder::hooks`](settings::Builder::hooks)): its
//!   claim, replay, in-flight, conflict or unknown answer, and the outcome it recorded
//!   ([`Completion`](hooks::Completion)), with the ref, tool, namespace and caller of a [`CallEvent`](hooks::CallEvent) — never an
//!   argument or a result.
//! - `metrics` (feature `metrics`, off by default): counters of every call by tool and outcome,
//!   claim and completion latency, and a gauge of operations in progress, through the
//!   [`metrics`](https://docs.rs/metrics) facade — free until a recorder is installed, then any
//!   exporter (Prometheus, OpenTelemetry through a bridge); the module lists them. Fed from the
//!   same call points as the hooks.
//!
//! The root names what a handler author writes: the attributes, the handle ([`Idem`], its
//! [`Builder`](settings::Builder)), the caller, the recipe, the error contract ([`IdempotentError`], [`Rejection`])
//! and what a running handler sees ([`Operation`]). The rest lives in its module: the operator's
//! verbs in [`admin`], the settings and their defaults in [`settings`], the lifecycle observer in [`hooks`], keys and refs in [`key`], scopes in
//! [`scope`], secrets in [`secret`], what a ledger implementation needs in [`ledger`], what only
//! an rmcp server needs in `mcp` (feature `rmcp`), canonical JSON in [`canonical`], test clocks
//! in [`clock`].
//!
//! ```
//! use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! enum ChargeError {
//!     Declined,
//!     Rejected(String),
//! }
//!
//! impl IdempotentError for ChargeError {
//!     fn classify(&self) -> ErrorClass {
//!         match self {
//!             // The processor said no: that is the answer, replay it.
//!             ChargeError::Declined => ErrorClass::Final,
//!             ChargeError::Rejected(_) => ErrorClass::NothingHappened,
//!         }
//!     }
//!     fn from_rejection(rejection: Rejection) -> Self {
//!         ChargeError::Rejected(rejection.to_string())
//!     }
//! }
//!
//! static CHARGE: Recipe = Recipe::new("charge_card", &["order_id", "amount"]);
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idem = Idem::new(MemoryLedger::new());
//! let caller = Caller::new("acme", "alice");
//! let args = serde_json::json!({ "order_id": "o-1", "amount": 1250 });
//!
//! let first = idem
//!     .call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ChargeError>("receipt-1".to_string()) })
//!     .await
//!     .unwrap();
//! let again = idem
//!     .call(&CHARGE, Some(&caller), &args, || async { Ok::<_, ChargeError>("receipt-2".to_string()) })
//!     .await
//!     .unwrap();
//! assert_eq!(again.value, "receipt-1");
//! assert!(again.replayed && !first.replayed);
//! # }
//! ```
//!
//! # Features
//!
//! The ledger backend is chosen at run time by the URL given to
//! [`ledger::connect`] (or a ledger type built directly); a feature only decides what is compiled in.
//! On docs.rs every item that needs a feature says which.
//!
//! | Feature | Default | What it adds | Pulls in |
//! |---|---|---|---|
//! | `sqlite` | yes | The embedded ledger: a SQLite file (WAL, `synchronous=FULL`), its secret beside it (`ledger::sea`) | sea-orm, bundled SQLite |
//! | `postgres` | | PostgreSQL: many replicas share one ledger (`ledger::sea`) | sea-orm, sqlx-postgres |
//! | `mysql` | | MySQL 8 / MariaDB 10.6+ (`ledger::sea`) | sea-orm, sqlx-mysql |
//! | `redis` | | Redis or Valkey, standalone or Redis Cluster (`ledger::redis`) | redis |
//! | `tls` | | TLS (rustls) for PostgreSQL and MySQL connections | rustls |
//! | `rmcp` | | MCP servers with rmcp: the caller from the request, agent-readable answers, the status tool, the startup audit (`mcp`) | rmcp, schemars, http |
//! | `mcp-http` | | `rmcp` over streamable HTTP: the caller from an auth middleware, a bearer layer | axum |
//! | `apalis` | | apalis workers: a tower layer that runs each job through the engine (`apalis`) | apalis-core |
//! | `rig` | | rig agents: a rig `Tool` wrapped so a repeated call runs once and is replayed (`rig`) | rig-core (no providers) |
//! | `mcp-client` | | The client's side: one `_meta["idempotency-key"]` across the retries of a `tools/call`, resent only to hinted tools (`mcp::client`) | rmcp's client |
//! | `http-tower` | | The `Idempotency-Key` door for any tower or hyper service, no axum (`http`) | http, http-body, tower-service |
//! | `http` | | `http-tower` on an axum `Router`: the matched route, the `IdempotencyKey` extractor | axum |
//! | `metrics` | | Counters, histograms and gauges of every call through the `metrics` facade (`metrics`) | metrics |
//!
//! A server on PostgreSQL writes `default-features = false, features = ["postgres"]`, and adds
//! `rmcp` or `http` for its door. Each feature builds without a warning and passes its unit tests
//! alone and in the combinations users pick (`rmcp` + `sqlite`, `http` + `postgres`, `redis`
//! alone, none); `.ci/run` holds that (`scripts/check-features.sh`).

// On docs.rs (nightly, `--cfg docsrs`): a badge on every item that needs a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "apalis")]
pub mod apalis;
mod bytes;
pub mod canonical;
pub mod clock;
#[cfg(feature = "http-tower")]
pub mod http;
mod idem;
pub mod key;
pub mod ledger;
mod macro_support;
#[cfg(feature = "rmcp")]
pub mod mcp;
pub mod recipe;
mod rejection;
#[cfg(feature = "rig")]
pub mod rig;
pub mod scope;
pub mod secret;
mod window;

#[cfg(feature = "metrics")]
pub use idem::metrics;
pub use idem::{
    Drained, HasIdem, Idem, Operation, Reconciled, Served, StatusError, current_caller, current_operation, run_as,
};
pub use key::{Key, Ref};
pub use ledger::memory::MemoryLedger;
pub use recipe::{Recipe, ScopeRule, StalePolicy};
pub use rejection::{ErrorClass, IdempotentError, Rejection, StorableError};
pub use scope::{Caller, CallerError};

/// The operator's verbs ([`Admin`](crate::admin::Admin), from [`Idem::admin`]) and what they take and answer.
pub mod admin {
    pub use crate::idem::{
        About, Admin, CursorError, PendingCursor, PendingFilter, PendingOperation, PendingPage, Sweeper, SweeperStats,
        ToolFacts,
    };
    pub use crate::ledger::{Label, LedgerStats, Resolution};
}

/// An observer of each call's lifecycle, for audit logs ([`Hooks`](crate::hooks::Hooks), set with
/// [`Builder::hooks`](crate::settings::Builder::hooks)): what it is told of a call ([`CallEvent`](crate::hooks::CallEvent)) and
/// how a call that won its claim ended ([`Completion`](crate::hooks::Completion)).
pub mod hooks {
    pub use crate::idem::{CallEvent, Completion, Hooks};
}

/// What a handle is built with ([`Builder`](crate::settings::Builder), from [`Idem::builder`]) and the defaults of its settings.
pub mod settings {
    pub use crate::idem::{
        BuildError, Builder, DEFAULT_LEASE, DEFAULT_LEDGER_TIMEOUT, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETENTION,
        DEFAULT_SETTLE_GRACE, DEFAULT_UNSETTLED_RETENTION, DEFAULT_VERDICT_RETENTION, ResultSeal,
    };
}

/// Makes an async handler safe to repeat: derive a key, claim it, run once, replay the rest.
///
/// Place it on an `async fn` returning `Result<T, E>` — a free function, or a method whose
/// `Self` implements [`HasIdem`] — and, on an rmcp tool, **above** `#[tool(...)]`.
///
/// ```
/// use idem_runtime::{ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Rejection, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum ChargeError { Declined, Refused(String) }
///
/// impl IdempotentError for ChargeError {
///     fn classify(&self) -> ErrorClass {
///         match self {
///             ChargeError::Declined => ErrorClass::Final,
///             ChargeError::Refused(_) => ErrorClass::NothingHappened,
///         }
///     }
///     fn from_rejection(rejection: Rejection) -> Self { ChargeError::Refused(rejection.to_string()) }
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct Charge { card: String, amount_cents: u64, note: Option<String> }
///
/// struct Payments { idem: Idem }
/// impl HasIdem for Payments { fn idem(&self) -> &Idem { &self.idem } }
///
/// #[idem_runtime::audit_idempotent]
/// impl Payments {
///     #[idempotent(key = "card, amount_cents", window = "15m", ignore = "note", stale = "takeover")]
///     async fn charge_card(&self, charge: Charge) -> Result<String, ChargeError> {
///         // Forward the key downstream, e.g. as an `Idempotency-Key` header.
///         let key = idem_runtime::current_operation().unwrap().idempotency_key();
///         Ok(format!("charged {} with reference {key}", charge.amount_cents))
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let payments = Payments {
///     idem: Idem::builder(MemoryLedger::new()).local_caller(idem_runtime::Caller::new("acme", "alice")).build().unwrap(),
/// };
/// let charge = || Charge { card: "tok_visa".into(), amount_cents: 1250, note: None };
/// let first = payments.charge_card(charge()).await.unwrap();
/// let again = payments.charge_card(charge()).await.unwrap(); // replayed: no second charge
/// assert_eq!(first, again);
/// # }
/// ```
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "order_id, customer.id"` | the arguments that make two calls the same operation: parameter names, or fields of the single arguments struct (rmcp's `Parameters<T>` included); dotted paths reach into nested structs. A business key states the uniqueness rule directly — prefer one. `key = "()"`: the call itself is the operation, once per caller (scope) and window — for a tool without arguments; arguments still count in the fingerprint | required, unless `inherent` |
/// | `window = "15m"` | how long after the **first claim** a repeat is the same operation (`s`, `m`, `h`, `d`; sliding, not a clock bucket) | the ledger retention (24 h, [`Builder::retention`](crate::settings::Builder::retention)) |
/// | `ignore = "note, trace_id"` | top-level arguments left out of the conflict fingerprint (and not serialised at all for plain parameters) | none |
/// | `stale = "takeover"` | a dead holder's lease: run again under a new fencing token; safe when the downstream dedupes by the forwarded key | `"hold"`: report "outcome unknown" until [`Admin::resolve`](crate::admin::Admin::resolve) |
/// | `reconcile = Self::check` | `stale = "reconcile"`: `async fn(&self, Operation) -> Reconciled<T, E>` (free functions: `async fn(Operation)`) asks the downstream what happened | — |
/// | `scope = "tenant"` | widen the key from the caller (tenant + subject) to the whole tenant | `"caller"` |
/// | `within = "conversation_id"` | narrow the key to a task or conversation id argument (MCP has no sessions; request ids are reused) | — |
/// | `task = true` | on an rmcp tool: it may run as an MCP task (the `io.modelcontextprotocol/tasks` extension). For a client that declared the extension, a repeat that finds the operation in progress gets the operation's task (`taskId` = its ref) instead of the in-flight answer, and `tasks/get` is answered from the ledger (`mcp::tasks::get_task`, feature `rmcp`). The result must be `rmcp::Json<T>` or `String`, the error `mcp::ToolError`, so that any replica can rebuild the answer from the stored JSON | `false` |
/// | `inherent = "sets the status by id"` | a naturally idempotent tool (an absolute write by id): no ledger, the hint only, with the reason written down | — |
/// | `name = "charge"` | the tool name in the key, with the namespace ([`Builder::namespace`](crate::settings::Builder::namespace), else the declaring package's name). Renaming a tool re-keys it: set `name` to the old name to keep its keys across a rename. Two different handlers under one tool name in one namespace on one ledger — one handle, two handles, two processes or binaries — are both refused (`duplicate_tool`), see [Who serves a tool](#who-serves-a-tool) | `#[tool(name = ...)]`, else the function's name |
/// | `wait = "5s"` | a repeat that finds the operation in progress waits up to this long (`s` or `m`, 1 s to [`MAX_WAIT`](recipe::MAX_WAIT)) for it to settle: completed, it gets the stored result as a replay; failed with nothing done, it claims again and may run the handler; unknown, "outcome unknown"; still running, "in flight". No connection or lock is held while it waits (see [`Recipe::wait`]) | none: "in flight" at once |
/// | `replay_note = false` | on an rmcp tool, leave out the line of text a replayed answer ends with ("this is the stored result of an earlier identical call … nothing was executed again"); `_meta["dev.idem/outcome"].replayed` still says it | `true`: hosts that drop `_meta` still show the model it was a replay |
/// | `input_key = "pick.content.amount"` | on an rmcp tool that may ask for input (`mcp::Step`, feature `rmcp`): input-response paths (the input request's id, then fields of the client's response) whose values join the key, under names no argument can have (`$input.pick.content.amount`). Input responses are no part of the key otherwise: a confirmation does not change what is done. With one, the first round (without the response) and each continuation with another value are different operations | none |
/// | `client_key = "required"` | on an rmcp tool: the client's own key in the request's `_meta["idempotency-key"]` (a non-empty string of at most 255 characters, as the Universal Commerce Protocol's MCP binding sends it) joins the operation's identity, beside the `key` paths and still under the caller's scope and the tool: the same client key with other arguments is a conflict, another one is another operation. `"required"` refuses a call without one (`invalid_client_key`, nothing runs); `"optional"` keys a call without one by its recipe alone | ignored |
/// | `single_use_state = true` | on an rmcp tool that may ask for input: a continuation's `requestState` is accepted once, enforced through the ledger on every replica (a second continuation after a "nothing happened" failure is refused: `request_state_used`); a repeat of a completed continuation is still a replay | `false` |
/// | `idem = self.payments_idem` | the [`Idem`] handle to use | [`HasIdem`] for methods, [`Idem::install`] for free functions |
/// | `caller = request_caller` | the authenticated [`Caller`] (an expression) | on an rmcp tool, the request's authenticated caller — over HTTP that one only; otherwise the caller in scope ([`run_as`], or the idempotent handler this one runs inside), else [`Builder::local_caller`](crate::settings::Builder::local_caller); none: refused |
/// | `crate = my_reexport::idem_runtime` | the path to this crate, for re-exporters | `::idem_runtime` |
///
/// # Parameters and what a key may name
///
/// | parameter | keyed and fingerprinted as | a key may name |
/// |---|---|---|
/// | `order_id: String` (a plain name) | the argument `order_id` | `order_id`, and `order.field` paths into a struct |
/// | the only argument, a struct: `order: Order` | its fields, as the arguments | its fields (`order_id`) — or, naming the parameter, `order.order_id` |
/// | the only argument, destructured: `Order { order_id, .. }: Order` | the struct's fields (all of them, not only those bound) | its fields |
/// | the only argument, unwrapped: `Parameters(o): Parameters<Order>` (rmcp), `Body(o): Body<Order>`, a renamed `Parameters` | the inner struct's fields | its fields |
/// | any other pattern (`(a, b): (String, u64)`, a struct pattern beside other arguments) | the pattern's text, as one argument | nothing: name the parameter and destructure it in the body |
/// | `_: T` | nothing: the handler reads none of it (changing it is no conflict) | nothing |
/// | an extractor by type (`RequestContext`, `Extension`, `Peer`, …) | nothing | nothing |
///
/// # Who serves a tool
///
/// A key holds the namespace and the tool name, not the handler: two different handlers under
/// one tool name would replay each other's results. So each call first records which handler
/// serves its tool — in the ledger (per namespace and tool, with the time) and in this process —
/// and refuses the call (`duplicate_tool`, naming both handlers and the fix) once a second
/// handler is seen for the same tool, on any handle, process or binary on the ledger. Both are
/// refused from then on, whichever came first; replicas of one build are one handler. The
/// ledger is asked at a tool's first call in a process and at most once a minute after.
///
/// - A method is named by its type's path and its name (`billing::Invoices::create`), any other
///   function by its module, impl and name (`billing::create`, `billing::Parcels::ship`, audited
///   or not). Never by an address: replicas and restarts of one build name it the same.
/// - The instances of a generic handler run different code, so each is its own handler, named
///   with its generic arguments: `Store<OrderRow>::create` and `Store<InvoiceRow>::create`, or
///   `load::<OrderRow>` when no parameter carries the type parameter. Two under one tool name
///   are refused like any two handlers: serve each on a handle with its own namespace, or give
///   each type a handler of its own with its own `name`. A type parameter a parameter carries
///   (`value: T`, `id: impl Serialize`) is no part of the handler: the argument is keyed by its
///   value.
/// - `name = "..."` pins the tool: the handler is then named by that name alone (a generic
///   one's instance by the name and its generic arguments), so moving or renaming it in code
///   changes neither its keys nor its owner. Give `name` to any handler you expect to move. In
///   one process two handlers pinned to one name are refused on one handle or many (told
///   apart by where they are declared); across processes a pin is one handler wherever it is
///   declared, which is what lets it move — so never pin two handlers to one name.
/// - Moving or renaming an unpinned handler makes it another handler: a server with the new code
///   is refused while the old one's operations can still be replayed (the tool's window or the
///   ledger retention, 24 h by default), or until an operator runs
///   `idem tools forget <namespace> <tool>` once the old build is gone. `idem tools` lists
///   every tool's handlers.
///
/// # With rmcp
///
/// Above `#[tool(...)]`, the attribute inserts `idempotent_hint = true` into its
/// `annotations(...)`, and refuses `idempotent_hint = false` or `read_only_hint = true` beside a
/// recipe. Below `#[tool]` it fails and says to move it. A method with `#[idempotent]` compiles
/// only in an impl marked [`audit_idempotent`], so a tool that claims the hint without a recipe
/// cannot sit beside it unnoticed.
///
/// # Compile-time checks
///
/// A key name that matches no argument or field, a nested path that does not exist, an empty
/// or duplicated key, a malformed or zero window, a zero wait or one over a minute, an unknown
/// option, a non-async handler, a success type that cannot be stored (`Serialize +
/// Deserialize`) and an error type that does not implement [`IdempotentError`] are compile
/// errors on the user's code.
#[doc(inline)]
pub use idem_macros::idempotent;

/// Audits a `#[tool_router]` impl: a tool whose annotations say `idempotent_hint = true` (the
/// bare word `idempotent_hint` counts) must carry `#[idempotent(key = ...)]` or
/// `#[idempotent(inherent = "...")]`, or the impl does not compile. Works above or below
/// `#[tool_router]`, and is required on every impl that uses `#[idempotent]` on a method. A type
/// may have several audited impls (rmcp's named routers). (A compiled example is `tests/ui/pass/` in the repository: this crate does
/// not depend on rmcp.)
///
/// ```text
/// #[audit_idempotent]
/// #[tool_router]
/// impl Payments {
///     #[idempotent(key = "card, amount_cents", window = "15m")]
///     #[tool(description = "Charge a card")]
///     async fn charge_card(&self, Parameters(args): Parameters<Charge>) -> Result<Receipt, ChargeError> { … }
/// }
/// ```
#[doc(inline)]
pub use idem_macros::audit_idempotent;

/// Items the macros expand to. Not public API: names and signatures change without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::idem::derive;
    pub use crate::macro_support::*;
    #[cfg(feature = "rmcp")]
    pub use crate::mcp::macro_support::*;
    #[cfg(feature = "rmcp")]
    pub use crate::mcp::outcome::output_schema;
    #[cfg(feature = "rmcp")]
    pub use crate::mcp::{ToolContext, ToolOutcome};
    pub use crate::recipe::ClientKey;
    pub use crate::{HasIdem, Idem, Recipe, ScopeRule, StalePolicy};
    /// The traits `ShapeOf` is asked through: the result's JSON Schema when rmcp's schemars
    /// knows its type, else none.
    pub mod shape_kinds {
        pub use crate::macro_support::NoShapeKind as _;
        #[cfg(feature = "rmcp")]
        pub use crate::mcp::macro_support::ShapeKind as _;
    }
}
