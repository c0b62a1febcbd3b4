//! A recipe: how a tool's calls become keys, and what to do with a stale lease.

use std::panic::Location;
use std::time::Duration;

pub use crate::window::{MAX_WINDOW, WindowError, parse_window};

/// The longest [`Recipe::wait`] (and `wait = "..."`) accepted: a minute. A request held open
/// longer outlives most clients' timeouts; the status tool serves a longer wait better.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Which caller-related parts go into the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeRule {
    /// Tenant and subject of the authenticated caller (the default).
    Caller,
    /// The whole tenant: the same call by two subjects of one tenant is one operation. Use it for
    /// operations the tenant owns (paying an invoice), not the person.
    Tenant,
    /// The caller narrowed by an explicit task or conversation id found at this argument path
    /// (`#[idempotent(within = "conversation_id")]`). MCP has no sessions and request ids are
    /// reused, so a narrower scope must be an argument.
    Within(&'static str),
}

impl ScopeRule {
    /// The argument path that narrows the scope, for [`ScopeRule::Within`].
    #[must_use]
    pub const fn within(self) -> Option<&'static str> {
        match self {
            Self::Within(path) => Some(path),
            Self::Caller | Self::Tenant => None,
        }
    }
}

/// What a claim does when it finds an in-progress record whose lease has expired (the process
/// that held it died, or lost its ledger, mid-call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StalePolicy {
    /// Run the handler again under a new fencing token. Safe when the downstream system honours
    /// the forwarded key, so a second attempt cannot make a second effect.
    Takeover,
    /// Ask the downstream what happened first (the tool's reconcile function), then record that,
    /// or run again only if it says nothing happened.
    Reconcile,
    /// Report "outcome unknown" until an operator resolves the record. The default: it never
    /// re-executes silently.
    Hold,
}

/// How one tool's calls are keyed. Usually written by `#[idempotent]`; constructible in `const`.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Recipe, StalePolicy};
///
/// static CHARGE: Recipe = Recipe::new("charge_card", &["card", "amount_cents"])
///     .window(Duration::from_secs(15 * 60))
///     .ignore(&["note"])
///     .stale(StalePolicy::Takeover);
/// assert_eq!(CHARGE.tool(), "charge_card");
/// assert_eq!(CHARGE.window_duration(), Some(Duration::from_secs(15 * 60)));
/// ```
///
/// One naming scheme: an option's plain name (`window`, `ignore`, `stale`, …, as in
/// `#[idempotent(...)]`) is its `const` setter; its getter is the option's name followed by what
/// it returns (`window_duration`, `ignore_paths`, `stale_policy`, `scope_rule`, `key_paths`,
/// `namespace_name`, `owner_path`, `task_enabled`, `single_use_state_enabled`, …). `tool` and
/// `site` have no setter; `is_optional_key` asks about one path.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    tool: &'static str,
    namespace: Option<&'static str>,
    /// Where the recipe is declared: two recipes of one tool name are told apart by it.
    site: &'static Location<'static>,
    /// The handler that serves the tool, if named ([`Recipe::owner`]).
    owner: Option<&'static str>,
    key: &'static [&'static str],
    optional: &'static [&'static str],
    ignore: &'static [&'static str],
    window: Option<Duration>,
    scope: ScopeRule,
    stale: StalePolicy,
    wait: Option<Duration>,
    task: bool,
    input_key: &'static [&'static str],
    single_use_state: bool,
    state_ttl: Duration,
    client_key: ClientKey,
    result_schema: Option<fn() -> serde_json::Value>,
}

/// Whether an MCP tool's calls carry a key of the client's own in the request's
/// `_meta["idempotency-key"]` ([`CLIENT_KEY_META`]), as the Universal Commerce Protocol's MCP
/// binding sends it ([`Recipe::client_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientKey {
    /// A client key in `_meta` is no part of the operation (the default).
    #[default]
    Ignored,
    /// A client key, when sent, joins the operation's identity; a call without one is keyed by
    /// the recipe alone.
    Optional,
    /// Every call must send one; a call without it is refused, in words, and runs nothing.
    Required,
}

/// Where a client sends its own key: the request's `_meta` member of this name.
pub const CLIENT_KEY_META: &str = "idempotency-key";

/// The name a client's key joins the key under (`$meta.idempotency-key`): no argument can have it.
#[cfg(feature = "rmcp")]
pub(crate) const CLIENT_KEY_PATH: &str = "$meta.idempotency-key";

/// The longest client key accepted, in characters.
pub const MAX_CLIENT_KEY_CHARS: usize = 255;

/// The name an input-response path joins the key under (`$input.pick.content.amount`): no
/// argument can have it.
pub(crate) const INPUT_KEY_PREFIX: &str = "$input.";

/// How long a `requestState` idem sends with an input request stays valid by default: ten
/// minutes ([`Recipe::state_ttl`]).
pub const DEFAULT_STATE_TTL: Duration = Duration::from_secs(10 * 60);

impl Recipe {
    /// This recipe for `tool`, declared at `site`: a door that keeps a recipe's settings before
    /// it knows the operation's name (an HTTP route's, named when its layer names the route).
    #[cfg(feature = "http-tower")]
    pub(crate) const fn named(mut self, tool: &'static str, site: &'static Location<'static>) -> Self {
        self.tool = tool;
        self.site = site;
        self
    }

    /// A recipe for `tool` keyed by the argument paths `key` (`"customer.id"` reaches into an
    /// object). Defaults: no window (the ledger's retention), caller scope, `hold` on stale leases.
    ///
    /// Every key path is required: a call through [`Idem::call`](crate::Idem::call) whose
    /// arguments lack one (or give it as `null`) is refused as invalid arguments, naming the
    /// path, because hashing it as `null` would make every such call (a typo'd member name, a
    /// client that forgot it) one operation. See [`Recipe::optional_keys`].
    ///
    /// The tool name is part of the key: renaming a tool re-keys it (repeats of operations made
    /// under the old name run again). One [`Idem`](crate::Idem) refuses two recipes declared in
    /// different places with the same tool name in the same namespace.
    #[must_use]
    #[track_caller]
    pub const fn new(tool: &'static str, key: &'static [&'static str]) -> Self {
        Self {
            tool,
            namespace: None,
            site: Location::caller(),
            owner: None,
            key,
            optional: &[],
            ignore: &[],
            window: None,
            scope: ScopeRule::Caller,
            stale: StalePolicy::Hold,
            wait: None,
            task: false,
            input_key: &[],
            single_use_state: false,
            state_ttl: DEFAULT_STATE_TTL,
            client_key: ClientKey::Ignored,
            result_schema: None,
        }
    }

    /// The namespace the tool's keys are derived in, unless the handle sets one for all its
    /// tools ([`Builder::namespace`](crate::settings::Builder::namespace)). `#[idempotent]` sets the
    /// name of the package that declares the handler; a hand-built recipe without one uses
    /// `"default"`. Renaming a namespace re-keys its tools.
    #[must_use]
    pub const fn namespace(mut self, namespace: &'static str) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Names the handler that serves the tool (`"billing::Invoices::create"`), so that two
    /// different handlers given one tool name in one namespace are refused wherever they run —
    /// two handles, processes or binaries on one ledger — instead of sharing operations
    /// ([`Rejection::DuplicateTool`](crate::Rejection::DuplicateTool)). `#[idempotent]` names its
    /// handler by its path; a recipe without an owner is owned by its tool name, as a handler
    /// pinned with `#[idempotent(name = "...")]` is.
    #[must_use]
    pub const fn owner(mut self, owner: &'static str) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The namespace of the package that declares the handler, unless one was set: what
    /// `#[idempotent]` passes (`option_env!("CARGO_PKG_NAME")`).
    #[doc(hidden)]
    #[must_use]
    pub const fn package(mut self, package: Option<&'static str>) -> Self {
        if self.namespace.is_none() {
            self.namespace = package;
        }
        self
    }

    /// Key paths that may be missing or `null` in a JSON call: for these (and only these) an
    /// absent value is a value of its own, keyed as `null`, so `{"coupon": null}`, no `coupon`
    /// and (for `"customer.coupon"`) a `customer` without one are all the same key.
    ///
    /// Each must be one of the recipe's key paths; naming another one panics, which is a compile
    /// error where the recipe is a `static` or `const`:
    ///
    /// ```compile_fail
    /// use idem_runtime::Recipe;
    /// static TYPO: Recipe = Recipe::new("apply_coupon", &["order_id", "coupon"]).optional_keys(&["copuon"]);
    /// ```
    ///
    /// (`#[idempotent]` handlers take typed arguments, where an `Option` key field that is
    /// `None` is always a legitimate value; this setting is for the JSON entry point.)
    #[must_use]
    pub const fn optional_keys(mut self, paths: &'static [&'static str]) -> Self {
        let mut i = 0;
        while i < paths.len() {
            assert!(
                contains(self.key, paths[i]),
                "`Recipe::optional_keys` names a path that is not one of the recipe's key paths"
            );
            i += 1;
        }
        self.optional = paths;
        self
    }

    /// How long after the first claim a repeat is the same operation.
    #[must_use]
    pub const fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Top-level arguments left out of the conflict fingerprint (a free-text note, a trace id).
    #[must_use]
    pub const fn ignore(mut self, ignore: &'static [&'static str]) -> Self {
        self.ignore = ignore;
        self
    }

    /// The scope rule.
    #[must_use]
    pub const fn scope(mut self, scope: ScopeRule) -> Self {
        self.scope = scope;
        self
    }

    /// The stale-lease policy.
    #[must_use]
    pub const fn stale(mut self, stale: StalePolicy) -> Self {
        self.stale = stale;
        self
    }

    /// How long a repeat that finds the operation in progress waits for it to settle before it
    /// is answered "in flight": it gets the first call's result as a replay if it completes in
    /// time (the same bytes every repeat gets), runs the handler itself if the first call
    /// failed with nothing done, and is told "outcome unknown" if that is how it ended. Without
    /// it, the default, "in flight" is answered at once.
    ///
    /// Waiting holds no database connection and no lock: the waiters of one operation in one
    /// process share a single poller that reads the record with a growing pause, and are woken
    /// at once when the holder runs in the same process. A waiter never treats a late holder
    /// as dead: at the deadline it is answered "in flight", and only a later claim applies the
    /// stale policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_runtime::Recipe;
    ///
    /// static DEPLOY: Recipe = Recipe::new("deploy", &["service", "version"]).wait(Duration::from_secs(5));
    /// assert_eq!(DEPLOY.wait_duration(), Some(Duration::from_secs(5)));
    /// ```
    ///
    /// # Panics
    /// If `wait` is under 1 ms or over [`MAX_WAIT`] (a minute): a compile error where the recipe
    /// is a `static` or `const`. A caller that would wait longer is better served by the status
    /// tool than by a request held open.
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        assert!(
            wait.as_millis() >= 1 && wait.as_millis() <= MAX_WAIT.as_millis(),
            "`Recipe::wait` takes a duration from 1 ms to 60 s"
        );
        self.wait = Some(wait);
        self
    }

    /// Whether the tool may run as an MCP task (the tasks extension, `io.modelcontextprotocol/tasks`;
    /// `#[idempotent(task = true)]`): a repeat that finds the operation in progress is answered
    /// with the operation's task when the client declared the extension, and `tasks/get` for
    /// it is answered from the ledger (`idem_runtime::mcp::tasks::get_task`, feature
    /// `rmcp`). Clients without the extension get the in-flight answer as before. Not part of
    /// the key.
    #[must_use]
    pub const fn task(mut self, task: bool) -> Self {
        self.task = task;
        self
    }

    /// Whether the tool may run as an MCP task ([`Recipe::task`]).
    #[must_use]
    pub const fn task_enabled(&self) -> bool {
        self.task
    }

    /// Input-response paths (multi-round-trip requests, rmcp tools) whose values join the key:
    /// `"pick.content.amount"` is the `amount` field of the `content` of the client's response to
    /// the input request `pick`. Each joins under the name `$input.<path>`, which no argument
    /// can have.
    ///
    /// By default input responses are no part of an operation's identity: a confirmation does
    /// not change what is done, so the confirmed call and a repeat of the original call are one
    /// operation. Name the responses that do change it (an amount the user chooses). A call
    /// without the response (the first round) and the continuation with it are then different
    /// operations, by design: the first only asks.
    #[must_use]
    pub const fn input_key(mut self, paths: &'static [&'static str]) -> Self {
        self.input_key = paths;
        self
    }

    /// Accept the `requestState` of an input request at most once: a second continuation with
    /// the same state (after the first one's handler failed with "nothing happened") is refused,
    /// enforced through the ledger so every replica agrees. A continuation whose operation has
    /// completed is still a replay.
    #[must_use]
    pub const fn single_use_state(mut self, single_use: bool) -> Self {
        self.single_use_state = single_use;
        self
    }

    /// Let the client's own key (`_meta["idempotency-key"]`, a non-empty string of at most 255
    /// characters) join the operation's identity — beside the recipe's key paths, still under the
    /// caller's scope and the tool. The same client key with other arguments is a conflict (the
    /// fingerprint covers every argument); another client key is another operation. With
    /// [`ClientKey::Required`], a call without one is refused and runs nothing. MCP tools only.
    #[must_use]
    pub const fn client_key(mut self, mode: ClientKey) -> Self {
        self.client_key = mode;
        self
    }

    /// How long the `requestState` idem sends with an input request stays valid (default
    /// [`DEFAULT_STATE_TTL`], ten minutes); a continuation after it is refused and told to
    /// start over.
    #[must_use]
    pub const fn state_ttl(mut self, ttl: Duration) -> Self {
        self.state_ttl = ttl;
        self
    }

    /// The JSON Schema of the tool's result (the value a call's handler returns as `Ok`), for a
    /// recipe whose calls carry none of their own: what an operator's "completed" verdict is
    /// checked against before it is stored, and what `idem show` prints
    /// ([`ToolFacts`](crate::admin::ToolFacts)). `#[idempotent]` finds the schema of its handler's
    /// `Ok` type itself, which wins; the HTTP layer's routes carry the stored response's. Not
    /// part of the key.
    ///
    /// The check reads the subset of JSON Schema that [`ToolFacts::check`] describes; a schema's
    /// first `examples` entry is what `idem show` offers as an example verdict.
    ///
    /// ```
    /// use idem_runtime::Recipe;
    ///
    /// fn receipt() -> serde_json::Value {
    ///     serde_json::json!({
    ///         "type": "object",
    ///         "properties": { "charge_id": { "type": "string" } },
    ///         "required": ["charge_id"],
    ///     })
    /// }
    /// static CHARGE: Recipe = Recipe::new("charge_card", &["order_id"]).result_schema(receipt);
    /// assert!(CHARGE.result_schema_fn().is_some());
    /// ```
    ///
    /// [`ToolFacts::check`]: crate::admin::ToolFacts::check
    #[must_use]
    pub const fn result_schema(mut self, schema: fn() -> serde_json::Value) -> Self {
        self.result_schema = Some(schema);
        self
    }

    /// The function that makes the result's JSON Schema ([`Recipe::result_schema`]), if set.
    #[must_use]
    pub const fn result_schema_fn(&self) -> Option<fn() -> serde_json::Value> {
        self.result_schema
    }

    /// Whether a client's key in `_meta` joins the operation ([`Recipe::client_key`]).
    #[must_use]
    pub const fn client_key_mode(&self) -> ClientKey {
        self.client_key
    }

    /// The input-response paths that join the key ([`Recipe::input_key`]).
    #[must_use]
    pub const fn input_key_paths(&self) -> &'static [&'static str] {
        self.input_key
    }

    /// Whether a `requestState` is accepted at most once ([`Recipe::single_use_state`]).
    #[must_use]
    pub const fn single_use_state_enabled(&self) -> bool {
        self.single_use_state
    }

    /// How long a `requestState` stays valid ([`Recipe::state_ttl`]).
    #[must_use]
    pub const fn state_ttl_duration(&self) -> Duration {
        self.state_ttl
    }

    /// The tool's name, part of the key.
    #[must_use]
    pub const fn tool(&self) -> &'static str {
        self.tool
    }

    /// The handler that serves the tool, if named ([`Recipe::owner`]).
    #[must_use]
    pub const fn owner_path(&self) -> Option<&'static str> {
        self.owner
    }

    /// The recipe's own namespace ([`Recipe::namespace`]), if any.
    #[must_use]
    pub const fn namespace_name(&self) -> Option<&'static str> {
        self.namespace
    }

    /// Where the recipe is declared (the `Recipe::new` call, or the `#[idempotent]` attribute).
    #[must_use]
    pub const fn site(&self) -> &'static Location<'static> {
        self.site
    }

    /// The key's argument paths.
    #[must_use]
    pub const fn key_paths(&self) -> &'static [&'static str] {
        self.key
    }

    /// The key paths that may be missing or `null` ([`Recipe::optional_keys`]).
    #[must_use]
    pub const fn optional_key_paths(&self) -> &'static [&'static str] {
        self.optional
    }

    /// Whether the key path `path` may be missing or `null`.
    #[must_use]
    pub const fn is_optional_key(&self, path: &str) -> bool {
        contains(self.optional, path)
    }

    /// Arguments left out of the fingerprint.
    #[must_use]
    pub const fn ignore_paths(&self) -> &'static [&'static str] {
        self.ignore
    }

    /// The window, if set.
    #[must_use]
    pub const fn window_duration(&self) -> Option<Duration> {
        self.window
    }

    /// The scope rule.
    #[must_use]
    pub const fn scope_rule(&self) -> ScopeRule {
        self.scope
    }

    /// The stale-lease policy.
    #[must_use]
    pub const fn stale_policy(&self) -> StalePolicy {
        self.stale
    }

    /// How long a repeat waits for an operation in progress ([`Recipe::wait`]), if it does.
    #[must_use]
    pub const fn wait_duration(&self) -> Option<Duration> {
        self.wait
    }
}

/// Whether `paths` holds `path` (usable in `const`).
const fn contains(paths: &[&str], path: &str) -> bool {
    let mut i = 0;
    while i < paths.len() {
        if eq(paths[i], path) {
            return true;
        }
        i += 1;
    }
    false
}

/// String equality, usable in `const`.
const fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
