//! The handle: a ledger, a clock and the limits every call runs under, the builders that set
//! them and their defaults. It also keeps the registry of recipes, so two tools never share keys
//! by accident.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::ledger::{Ledger, Timeout};
use crate::recipe::Recipe;
use crate::rejection::Rejection;
use crate::scope::Caller;
use crate::secret::Secret;

use super::background::BACKGROUND_JOBS;
use super::hooks::Hooks;
use super::keyring::Secrets;
use super::stored::ResultSeal;
use super::time::{FirstMeasure, Skew};
use super::wait::Waiting;

/// How long a record lives when its recipe sets no window.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a claim is held without renewal; a running handler renews it every third of this.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long one ledger statement may take before the ledger counts as unavailable.
pub const DEFAULT_LEDGER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest stored result accepted by default.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;
/// How long a completed result stays replayable after it settles, even if its window ended
/// meanwhile (a handler slower than its window).
pub const DEFAULT_SETTLE_GRACE: Duration = Duration::from_secs(60);
/// How long an operator's verdict ([`Idem::resolve`]) stays readable and replayable.
pub const DEFAULT_VERDICT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long an operation that never settled (unknown, or in progress under a dead holder) is
/// kept past its window for an operator, before the sweep may delete it.
pub const DEFAULT_UNSETTLED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest lease [`Idem::with_lease`] accepts: it is renewed every third of it, in whole
/// milliseconds.
const MIN_LEASE: Duration = Duration::from_millis(3);
/// The shortest ledger timeout [`Idem::with_ledger_timeout`] accepts.
const MIN_LEDGER_TIMEOUT: Duration = Duration::from_millis(1);
/// The namespace of keys when none is configured.
const DEFAULT_NAMESPACE: &str = "default";

/// The handle that runs handlers under recipes: a ledger, a clock and the limits. Cheap to clone.
///
/// The `with_*` builders refuse (panic) a value that cannot work, and say so under `# Panics`;
/// they change no value silently, with two rules that hold for every duration: ledger time
/// counts whole milliseconds (a sub-millisecond part is dropped), and a time beyond what a
/// signed 64-bit count of milliseconds holds (some 292 million years) stays at that end.
#[derive(Clone)]
pub struct Idem {
    pub(super) inner: Arc<Inner>,
}

/// What a handle is configured with; shared by its clones, copied on a change.
#[derive(Clone)]
pub(super) struct Inner {
    /// The ledger as given, wrapped in the ledger timeout: every call goes through this.
    pub(super) ledger: Arc<dyn Ledger>,
    /// The ledger as given (wrapped anew whenever the timeout changes).
    pub(super) untimed: Arc<dyn Ledger>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) lease: Duration,
    pub(super) retention: Duration,
    pub(super) grace: Duration,
    pub(super) verdict_retention: Duration,
    pub(super) unsettled_retention: Duration,
    pub(super) max_result_bytes: usize,
    pub(super) local_caller: Option<Caller>,
    /// Seals results before they are stored, opens them when read back.
    pub(super) seal: Option<Arc<dyn ResultSeal>>,
    /// The namespace of every tool's keys, if set (else each recipe's, else the default).
    pub(super) namespace: Option<String>,
    /// The recipes seen per tool name: (namespace, where declared).
    pub(super) registry: Arc<std::sync::Mutex<Registry>>,
    /// The secret given in code, if any (else `IDEM_SECRET`, else the ledger's default).
    pub(super) secret: Option<Secret>,
    /// Previous secrets given in code, still honoured for operations recorded under them.
    pub(super) previous: Vec<Secret>,
    /// The secrets in use, resolved and checked on first use.
    pub(super) secrets: Arc<Secrets>,
    pub(super) ledger_timeout: Duration,
    /// Whether the ledger timeout was set by hand (then a lease too short for it is refused).
    pub(super) ledger_timeout_set: bool,
    /// This handle's clock against the ledger's.
    pub(super) skew: Arc<std::sync::Mutex<Option<Skew>>>,
    /// Set while a background measurement of the skew runs, so calls start at most one.
    pub(super) measuring: Arc<AtomicBool>,
    /// A cold handle's first measurement of the skew, shared by the calls that queue on it.
    pub(super) first_measure: Arc<FirstMeasure>,
    /// Bounds the background ledger work (lost-claim releases, completion retries).
    pub(super) background: Arc<tokio::sync::Semaphore>,
    /// The operations this process waits on and the claims it holds (`wait`); kept across the
    /// `with_*` builders, so a holder wakes the waiters of every handle made from this one.
    pub(super) waiting: Arc<Waiting>,
    /// The claims this process is sending or holding, for coalescing identical calls.
    pub(super) claims: Arc<super::coalesce::Claims>,
    /// Told of each call's lifecycle ([`Idem::with_hooks`]).
    pub(super) hooks: Option<Arc<dyn Hooks>>,
}

/// The recipes a handle has seen, per tool name: their namespace and where each is declared.
type Registry = std::collections::HashMap<&'static str, Vec<(String, &'static std::panic::Location<'static>)>>;

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("lease", &self.inner.lease)
            .field("retention", &self.inner.retention)
            .field("max_result_bytes", &self.inner.max_result_bytes)
            .field("local_caller", &self.inner.local_caller)
            .finish_non_exhaustive()
    }
}

impl Idem {
    /// A handle on `ledger` with the system clock and the default lease, retention and limits.
    #[must_use]
    pub fn new(ledger: impl Ledger) -> Self {
        Self::from_shared(Arc::new(ledger))
    }

    /// A handle on a shared ledger (chosen at run time).
    #[must_use]
    pub fn from_shared(ledger: Arc<dyn Ledger>) -> Self {
        Self {
            inner: Arc::new(Inner {
                ledger: Arc::new(Timeout::new(Arc::clone(&ledger), DEFAULT_LEDGER_TIMEOUT)),
                untimed: ledger,
                clock: Arc::new(SystemClock),
                lease: DEFAULT_LEASE,
                retention: DEFAULT_RETENTION,
                grace: DEFAULT_SETTLE_GRACE,
                verdict_retention: DEFAULT_VERDICT_RETENTION,
                unsettled_retention: DEFAULT_UNSETTLED_RETENTION,
                max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
                local_caller: None,
                seal: None,
                namespace: None,
                registry: Arc::default(),
                secret: None,
                previous: Vec::new(),
                secrets: Arc::default(),
                ledger_timeout: DEFAULT_LEDGER_TIMEOUT,
                ledger_timeout_set: false,
                skew: Arc::default(),
                measuring: Arc::default(),
                first_measure: Arc::default(),
                background: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_JOBS)),
                waiting: Arc::default(),
                claims: Arc::default(),
                hooks: None,
            }),
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Inner)) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        change(inner);
        // One place bounds every ledger call: the ledger is wrapped in the timeout once.
        inner.ledger = Arc::new(Timeout::new(Arc::clone(&inner.untimed), inner.ledger_timeout));
        // A new clock, ledger or lease makes the old skew measurement meaningless.
        inner.skew = Arc::default();
        inner.measuring = Arc::default();
        inner.first_measure = Arc::default();
        inner.secrets = Arc::default();
        self
    }

    /// Uses `clock` instead of the system clock (tests step it over a window edge).
    #[must_use]
    pub fn with_clock(self, clock: impl Clock) -> Self {
        self.configure(|inner| inner.clock = Arc::new(clock))
    }

    /// How long a claim is held before a repeat may treat its holder as dead (default 30 s).
    /// A running handler renews it every third of this, so it bounds detection of a crash, not
    /// the handler's running time. A ledger timeout left at its default is lowered to half the
    /// lease (a ledger timeout set by hand is never changed: see below).
    ///
    /// # Panics
    /// If `lease` is under 3 ms: the renewer renews every third of it, in whole milliseconds.
    /// If a ledger timeout set with [`Idem::with_ledger_timeout`] is more than half of `lease`:
    /// a claim whose answer could take longer than its lease could be taken over before its
    /// holder learns it won.
    #[must_use]
    pub fn with_lease(self, lease: Duration) -> Self {
        assert!(
            lease >= MIN_LEASE,
            "the lease ({lease:?}) must be at least {MIN_LEASE:?}: a running handler renews it every third of it"
        );
        self.configure(|inner| {
            inner.lease = lease;
            if inner.ledger_timeout > lease / 2 {
                assert!(
                    !inner.ledger_timeout_set,
                    "the ledger timeout ({:?}) must be under half the lease ({lease:?}): lower it with \
                     `with_ledger_timeout` before shortening the lease, or keep a longer lease",
                    inner.ledger_timeout
                );
                inner.ledger_timeout = lease / 2;
            }
        })
    }

    /// How long records of recipes without a window live (default 24 h).
    #[must_use]
    pub fn with_retention(self, retention: Duration) -> Self {
        self.configure(|inner| inner.retention = retention)
    }

    /// How long a completed result stays replayable after it settles even if its window ended
    /// meanwhile (default 60 s): the caller of a handler slower than its window can still
    /// collect the result.
    #[must_use]
    pub fn with_settle_grace(self, grace: Duration) -> Self {
        self.configure(|inner| inner.grace = grace)
    }

    /// How long an operator's verdict ([`Idem::resolve`]) stays readable and replayable, at
    /// least (default 24 h).
    #[must_use]
    pub fn with_verdict_retention(self, retention: Duration) -> Self {
        self.configure(|inner| inner.verdict_retention = retention)
    }

    /// How long an operation that never settled — unknown, or in progress under a holder that
    /// died — is kept past its window for an operator (default 7 days). Once its window has
    /// ended, a repeat starts a new operation (with a new idempotency key) and the old record
    /// stays beside it, visible to [`Idem::status`] and [`Idem::resolve`], until this passes.
    #[must_use]
    pub fn with_unsettled_retention(self, retention: Duration) -> Self {
        self.configure(|inner| inner.unsettled_retention = retention)
    }

    /// The largest result stored for replay (default 1 MiB). A larger result is returned to its
    /// caller but recorded as "outcome unknown", so repeats are told to check rather than run.
    #[must_use]
    pub fn with_max_result_bytes(self, max: usize) -> Self {
        self.configure(|inner| inner.max_result_bytes = max)
    }

    /// How long one ledger operation may take (default 10 s, and at most half the lease). A
    /// ledger that does not answer in time is unavailable: the handler does not run, and the
    /// caller is told so.
    ///
    /// # Panics
    /// If `timeout` is under 1 ms (no statement answers in no time), or more than half the
    /// lease: a claim answered after its lease ran out could already belong to someone else.
    /// Set a longer lease first ([`Idem::with_lease`]).
    #[must_use]
    pub fn with_ledger_timeout(self, timeout: Duration) -> Self {
        assert!(
            timeout >= MIN_LEDGER_TIMEOUT,
            "the ledger timeout ({timeout:?}) must be at least {MIN_LEDGER_TIMEOUT:?}: no statement answers in no time"
        );
        self.configure(|inner| {
            assert!(
                timeout <= inner.lease / 2,
                "the ledger timeout ({timeout:?}) must be under half the lease ({:?}): a claim answered after \
                 its lease ran out could already belong to someone else; set a longer lease with `with_lease` first",
                inner.lease
            );
            inner.ledger_timeout = timeout;
            inner.ledger_timeout_set = true;
        })
    }

    /// The caller to use when none is given and none is in scope
    /// ([`run_as`](super::run_as)): the configured identity of a local, single-user
    /// transport such as stdio.
    #[must_use]
    pub fn with_local_caller(self, caller: Caller) -> Self {
        self.configure(|inner| inner.local_caller = Some(caller))
    }

    /// Keys every operation with `secret` (HMAC-SHA256), instead of the one in `IDEM_SECRET` or
    /// the ledger's default. Every replica on one ledger must use the same secret.
    ///
    /// Without one: `IDEM_SECRET` (`<version>:<hex>`, at least 32 bytes, see [`crate::secret`]);
    /// else a [`MemoryLedger`](crate::MemoryLedger) uses a random secret per process, and the
    /// embedded SQLite default one it generates once and keeps beside its file (owner-only);
    /// PostgreSQL and MySQL refuse — check at startup with [`Idem::check_secret`].
    #[must_use]
    pub fn with_secret(self, secret: Secret) -> Self {
        self.configure(|inner| inner.secret = Some(secret))
    }

    /// Also honours `secret`, a previous one, for operations recorded under it: during a
    /// rotation a repeat of an operation made under the old secret is answered from that record
    /// (replayed, in flight, unknown) rather than run again. Keep it until the longest window
    /// (or retention) of operations made under it has run; see [`crate::secret`] for the steps.
    #[must_use]
    pub fn with_previous_secret(self, secret: Secret) -> Self {
        self.configure(|inner| inner.previous.push(secret))
    }

    /// Derives every tool's keys in `namespace`, the server's name — two servers on one ledger
    /// with a tool of the same name then never share keys. Without it, each recipe's own: the
    /// name of the package that declares the handler (`#[idempotent]`), else `"default"`.
    /// Renaming the namespace re-keys every tool (repeats of earlier operations run again).
    #[must_use]
    pub fn with_namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.configure(|inner| inner.namespace = Some(namespace))
    }

    /// Seals every result before it is stored and opens it when read back (replays, status,
    /// an operator's verdict): see [`ResultSeal`]. Without one, results are stored as given.
    #[must_use]
    pub fn with_result_seal(self, seal: impl ResultSeal) -> Self {
        let seal: Arc<dyn ResultSeal> = Arc::new(seal);
        self.configure(|inner| inner.seal = Some(seal))
    }

    /// The namespace `recipe`'s keys are derived in.
    #[must_use]
    pub fn namespace<'a>(&'a self, recipe: &'a Recipe) -> &'a str {
        self.inner.namespace.as_deref().or(recipe.namespace_name()).unwrap_or(DEFAULT_NAMESPACE)
    }

    /// Registers `recipe` with this handle, refusing a different recipe (declared elsewhere)
    /// with the same tool name in the same namespace: the two would share keys. Every call
    /// registers its recipe before anything else; call this at startup to find a clash before
    /// the first call does.
    ///
    /// # Errors
    /// [`Rejection::DuplicateTool`], naming both places.
    pub fn register(&self, recipe: &Recipe) -> Result<(), Rejection> {
        let namespace = self.namespace(recipe);
        let mut registry = self.inner.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = registry.entry(recipe.tool()).or_default();
        match seen.iter().find(|(known, _)| known == namespace) {
            None => {
                seen.push((namespace.to_owned(), recipe.site()));
                Ok(())
            }
            Some((_, site)) if *site == recipe.site() => Ok(()),
            Some((_, site)) => {
                let rejection = Rejection::DuplicateTool {
                    namespace: namespace.to_owned(),
                    tool: recipe.tool().to_owned(),
                    first: site.to_string(),
                    second: recipe.site().to_string(),
                };
                tracing::error!(%rejection, "duplicate tool; handler not run");
                Err(rejection)
            }
        }
    }

    /// The configured local identity, if any.
    #[must_use]
    pub fn local_caller(&self) -> Option<&Caller> {
        self.inner.local_caller.as_ref()
    }

    /// The ledger.
    #[must_use]
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.inner.ledger
    }
}
