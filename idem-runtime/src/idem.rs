//! The orchestration: derive, claim, run, record, replay.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

use crate::canonical::CanonicalError;
use crate::clock::{Clock, SystemClock};
use crate::key::{Fingerprint, Key, Ref, RefError};
use crate::ledger::{Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, StatusReport, Token, Won};
use crate::recipe::{Recipe, ScopeRule};
use crate::rejection::{ErrorClass, IdempotentError, Rejection};
use crate::scope::{Caller, Scope};
use crate::secret::{Secret, SecretError};

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
/// How many times a lost claim's release is tried.
const RELEASE_TRIES: u32 = 8;
/// How many background ledger jobs (releasing a lost claim, retrying a completion) one handle
/// runs at once; past this, a lost claim is left to its lease.
const BACKGROUND_JOBS: usize = 32;

tokio::task_local! {
    static OPERATION: Operation;
    static CALLER: Caller;
}

/// The operation a handler is running as: read it with [`current_operation`] and forward
/// [`Operation::idempotency_key`] to the system that owns the side effect (an
/// `Idempotency-Key` header, a processor's reference field). Only that system can close the
/// window between the effect and the record.
#[derive(Debug, Clone)]
pub struct Operation {
    key: Key,
    tool: &'static str,
    attempt: Won,
    token: Token,
    /// When the operation's window ends; with the key, it names this operation downstream.
    window_end: u64,
    /// The handle it runs under (its clock, limits and grace).
    idem: Idem,
    /// What the renewer knows of the lease.
    lease: Arc<LeaseState>,
    /// Set once the handler recorded the result in its own transaction.
    recorded: Arc<AtomicBool>,
}

/// The lease as the renewer last saw it.
#[derive(Debug)]
struct LeaseState {
    /// Until when the ledger confirmed the lease (ledger time).
    until: AtomicU64,
    /// The ledger refused a renewal: the claim was taken over or settled by someone else.
    fenced: AtomicBool,
}

impl Operation {
    /// The operation's ledger key. It is the same in every window; forward
    /// [`Operation::idempotency_key`] downstream instead.
    #[must_use]
    pub const fn key(&self) -> &Key {
        &self.key
    }

    /// The key to forward to the system that owns the side effect (an `Idempotency-Key`
    /// header, a processor's reference field): 64 hex digits naming this operation in this
    /// window. A takeover of a dead holder's claim forwards the same value, so the downstream
    /// can dedupe it; a new operation after the window ended forwards a new one, so a
    /// downstream that keeps keys longer than the window does not replay an older operation.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"idem/v2/operation\0");
        hasher.update(self.key.as_bytes());
        hasher.update(self.window_end.to_be_bytes());
        hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The short ref callers are given.
    #[must_use]
    pub fn reference(&self) -> Ref {
        self.key.reference()
    }

    /// The tool's name.
    #[must_use]
    pub const fn tool(&self) -> &'static str {
        self.tool
    }

    /// The fencing token this run holds the claim with.
    #[must_use]
    pub const fn token(&self) -> Token {
        self.token
    }

    /// When this operation's window ends (milliseconds since the Unix epoch, ledger time).
    #[must_use]
    pub const fn window_end(&self) -> u64 {
        self.window_end
    }

    /// Whether this run may no longer hold its claim: a renewal was refused (another replica
    /// took the operation over, or an operator settled it), or no renewal has been confirmed
    /// for the whole lease (the ledger is unreachable, or this process was paused). Ask before
    /// an effect that the downstream cannot dedupe: if it is `true`, return an error that says
    /// nothing happened instead of acting.
    #[must_use]
    pub fn lease_lost(&self) -> bool {
        self.lease.fenced.load(Ordering::SeqCst) || self.idem.ledger_now() >= self.lease.until.load(Ordering::SeqCst)
    }

    /// Stores `value` as this operation's result on `conn` — a transaction of the handler's own
    /// — so the handler's writes and the stored result commit or roll back together. The
    /// handler then returns `Ok(value)` as usual; if its transaction rolled back, idem records
    /// the returned result itself.
    ///
    /// ```no_run
    /// # use idem_runtime::{current_operation, LedgerError};
    /// # use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
    /// # async fn handler(db: &DatabaseConnection) -> Result<String, LedgerError> {
    /// let operation = current_operation().expect("inside an idempotent handler");
    /// let txn = db.begin().await.map_err(|e| LedgerError::Unavailable { detail: e.to_string() })?;
    /// txn.execute_unprepared("INSERT INTO orders (id) VALUES ('o-1')").await.ok();
    /// let receipt = "order o-1 placed".to_owned();
    /// operation.complete_in(&txn, &receipt).await?;
    /// txn.commit().await.map_err(|e| LedgerError::Unavailable { detail: e.to_string() })?;
    /// Ok(receipt)
    /// # }
    /// ```
    ///
    /// # Errors
    /// The result cannot be serialised or exceeds the size limit, the claim was superseded
    /// ([`LedgerError::Fenced`]), or the statement failed.
    #[cfg(feature = "sea")]
    pub async fn complete_in<C, T>(&self, conn: &C, value: &T) -> Result<(), LedgerError>
    where
        C: sea_orm::ConnectionTrait,
        T: Serialize,
    {
        let max = self.idem.inner.max_result_bytes;
        let bytes = serde_json::to_vec(&Stored::<&T, ()>::Ok(value))
            .map_err(|error| LedgerError::Corrupt { detail: format!("the result cannot be stored: {error}") })?;
        if bytes.len() > max {
            return Err(LedgerError::Corrupt {
                detail: format!("the result is {} bytes, above the limit of {max}", bytes.len()),
            });
        }
        let bytes = self.idem.seal(bytes).map_err(|error| LedgerError::Corrupt { detail: error })?;
        let keep_until = self.idem.keep_until(self.idem.inner.grace);
        let outcome = Outcome::Completed(bytes);
        crate::ledger::sea::SeaOrmLedger::complete_on(conn, &self.key, self.token, outcome, keep_until).await?;
        self.recorded.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether this run took over a dead holder's claim: the downstream may already have seen
    /// this operation's idempotency key, and must dedupe by it.
    #[must_use]
    pub fn is_takeover(&self) -> bool {
        self.attempt != Won::Fresh
    }
}

/// The operation the current handler runs as, or `None` outside an idempotent handler.
///
/// Task-local: a task the handler spawns does not inherit it; pass the key along instead.
#[must_use]
pub fn current_operation() -> Option<Operation> {
    OPERATION.try_with(Clone::clone).ok()
}

/// Runs `future` with `caller` as the authenticated caller of every idempotent call inside it
/// that is not given one explicitly. Transports (your middleware) call this; every idempotent
/// handler runs this way as its own caller, so operations nested in it are its caller's.
pub async fn with_caller<F: Future>(caller: Caller, future: F) -> F::Output {
    CALLER.scope(caller, future).await
}

/// The caller in scope: the caller of the idempotent handler running now (nested operations and
/// anything else the handler calls act for it), or the one given to [`with_caller`].
#[must_use]
pub fn current_caller() -> Option<Caller> {
    CALLER.try_with(Clone::clone).ok()
}

/// Gives `#[idempotent]` methods their [`Idem`] handle: implement it for your server type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give `#[idempotent]` methods an `Idem` handle",
    label = "the receiver of this `#[idempotent]` method",
    note = "implement `idem_runtime::HasIdem` for `{Self}` (return the `Idem` it holds), or name one with \
            `#[idempotent(idem = self.idem, ...)]`"
)]
pub trait HasIdem {
    /// The handle this value's idempotent methods run under.
    fn idem(&self) -> &Idem;
}

impl HasIdem for Idem {
    fn idem(&self) -> &Idem {
        self
    }
}

static INSTALLED: std::sync::RwLock<Option<Idem>> = std::sync::RwLock::new(None);

/// A handler's result as idem served it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served<T> {
    /// The result: fresh, or decoded from the stored bytes.
    pub value: T,
    /// Whether it was replayed from the ledger rather than produced by this call.
    pub replayed: bool,
    /// The operation's ref.
    pub reference: Ref,
}

/// What a reconcile function found when asked about a stale operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reconciled<T, E> {
    /// The downstream did it; this is its result, stored and returned as if the handler had run.
    Happened(Result<T, E>),
    /// The downstream never saw it: run the handler now.
    NothingHappened,
    /// The downstream cannot tell: the operation stays unknown.
    StillUnknown,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Stored<T, E> {
    Ok(T),
    Err(E),
}

/// What happens to a result between the handler and the ledger: [`seal`](ResultSeal::seal)ed
/// before it is stored, [`open`](ResultSeal::open)ed after it is read back (replays, status).
///
/// Without one, results are stored as the handler returned them, and anyone who can read the
/// ledger (a backup, a replica, an export) can read them. Plug in an AEAD under a key from your
/// KMS to encrypt them, or a redaction (`open` returning its input) to keep only what repeats
/// need — then repeats get the redacted result. Every handle on a ledger must use the same seal.
pub trait ResultSeal: Send + Sync + 'static {
    /// The bytes to store for `plain` (the result's JSON).
    ///
    /// # Errors
    /// The result cannot be sealed: it is returned to its caller and recorded as "outcome
    /// unknown".
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String>;

    /// The result's JSON from stored bytes.
    ///
    /// # Errors
    /// The bytes cannot be opened (another key, tampering): repeats are refused as an
    /// unreadable result, and nothing runs again.
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, String>;
}

/// The handle that runs handlers under recipes: a ledger, a clock and the limits. Cheap to clone.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    retention: Duration,
    grace: Duration,
    verdict_retention: Duration,
    unsettled_retention: Duration,
    max_result_bytes: usize,
    local_caller: Option<Caller>,
    /// Seals results before they are stored, opens them when read back.
    seal: Option<Arc<dyn ResultSeal>>,
    /// The namespace of every tool's keys, if set (else each recipe's, else the default).
    namespace: Option<String>,
    /// The recipes seen per tool name: (namespace, where declared).
    registry: Arc<std::sync::Mutex<Registry>>,
    /// The secret given in code, if any (else `IDEM_SECRET`, else the ledger's default).
    secret: Option<Secret>,
    /// Previous secrets given in code, still honoured for operations recorded under them.
    previous: Vec<Secret>,
    /// The secrets in use, resolved on first use.
    keyring: Arc<OnceLock<Result<Arc<Keyring>, SecretError>>>,
    ledger_timeout: Duration,
    /// Whether the ledger timeout was set by hand (then a lease too short for it is refused).
    ledger_timeout_set: bool,
    /// This handle's clock against the ledger's.
    skew: Arc<std::sync::Mutex<Option<Skew>>>,
    /// Set while a background measurement of the skew runs, so calls start at most one.
    measuring: Arc<AtomicBool>,
    /// Bounds the background ledger work (lost-claim releases, completion retries).
    background: Arc<tokio::sync::Semaphore>,
}

/// The recipes a handle has seen, per tool name: their namespace and where each is declared.
type Registry = std::collections::HashMap<&'static str, Vec<(String, &'static std::panic::Location<'static>)>>;

/// A measurement of this handle's clock against the ledger's.
#[derive(Clone, Copy, Debug)]
struct Skew {
    /// When it was taken, by this handle's clock.
    at: u64,
    /// Ledger time minus local time, in milliseconds.
    offset: i64,
    /// Whether times corrected by it can be acted on (see [`ClaimRequest::clock_trusted`]).
    trusted: bool,
    /// The ledger keeps no clock: every handle on it shares this process's, for good.
    clockless: bool,
}

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
                ledger,
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
                keyring: Arc::default(),
                ledger_timeout: DEFAULT_LEDGER_TIMEOUT,
                ledger_timeout_set: false,
                skew: Arc::default(),
                measuring: Arc::default(),
                background: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_JOBS)),
            }),
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Inner)) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        change(inner);
        // A new clock, ledger or lease makes the old skew measurement meaningless.
        inner.skew = Arc::default();
        inner.measuring = Arc::default();
        inner.keyring = Arc::default();
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
    /// lease.
    ///
    /// # Panics
    /// If a ledger timeout set with [`Idem::with_ledger_timeout`] is not under half of `lease`:
    /// a claim whose answer could take longer than its lease could be taken over before its
    /// holder learns it won.
    #[must_use]
    pub fn with_lease(self, lease: Duration) -> Self {
        let lease = lease.max(Duration::from_millis(3));
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
    /// If `timeout` is not under half the lease: a claim answered after its lease ran out
    /// could already belong to someone else. Set a longer lease first ([`Idem::with_lease`]).
    #[must_use]
    pub fn with_ledger_timeout(self, timeout: Duration) -> Self {
        let timeout = timeout.max(Duration::from_millis(1));
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

    /// The caller to use when none is given and none is in scope ([`with_caller`]): the
    /// configured identity of a local, single-user transport such as stdio.
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

    /// Whether this handle has a secret to key operations with; call it at startup so a missing
    /// or malformed secret stops the server instead of refusing every call.
    ///
    /// # Errors
    /// No secret is configured and the ledger has no default (PostgreSQL, MySQL), or a
    /// configured one is malformed, or the SQLite default's secret file cannot be used.
    pub fn check_secret(&self) -> Result<(), SecretError> {
        self.keyring().map(|_| ())
    }

    /// The secrets in use: resolved once per configuration.
    fn keyring(&self) -> Result<Arc<Keyring>, SecretError> {
        self.inner.keyring.get_or_init(|| self.resolve_keyring().map(Arc::new)).clone()
    }

    fn resolve_keyring(&self) -> Result<Keyring, SecretError> {
        let (current, mut previous) = match &self.inner.secret {
            Some(secret) => (secret.clone(), Vec::new()),
            None => match crate::secret::from_env()? {
                Some(configured) => configured,
                None => (self.inner.ledger.default_secret()?, Vec::new()),
            },
        };
        previous.extend(self.inner.previous.iter().cloned());
        Ok(Keyring { current, previous })
    }

    /// The key a call of `recipe` by `caller` with `arguments` (a JSON object, as for
    /// [`Idem::call`]) has under this handle's current secret: what the handler would see as
    /// [`Operation::key`], and whose [`Key::reference`] the caller would be given. For operators
    /// and tests; a secret-less derivation does not exist.
    ///
    /// # Errors
    /// As [`Idem::call`] refuses: no secret, invalid arguments, a missing task id.
    pub fn key_of(&self, recipe: &Recipe, caller: &Caller, arguments: &Value) -> Result<Key, Rejection> {
        let keyring = self.keyring().map_err(|error| no_secret(&error))?;
        let arguments = CallArguments::from_json(recipe, arguments)?;
        let scope = scope_of(recipe, caller, &arguments)?;
        Key::derive(&keyring.current, self.namespace(recipe), &scope, recipe.tool(), &arguments.selected)
            .map_err(|error| Rejection::InvalidArguments { error })
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

    /// Seals every result before it is stored and opens it when read back (replays, status,
    /// an operator's verdict): see [`ResultSeal`]. Without one, results are stored as given.
    #[must_use]
    pub fn with_result_seal(self, seal: impl ResultSeal) -> Self {
        let seal: Arc<dyn ResultSeal> = Arc::new(seal);
        self.configure(|inner| inner.seal = Some(seal))
    }

    /// `plain` as it is stored.
    fn seal(&self, plain: Vec<u8>) -> Result<Vec<u8>, String> {
        match &self.inner.seal {
            Some(seal) => seal.seal(&plain).map_err(|error| format!("the result cannot be sealed: {error}")),
            None => Ok(plain),
        }
    }

    /// Stored bytes as the result's JSON.
    fn open(&self, stored: Vec<u8>, reference: Ref) -> Result<Vec<u8>, Rejection> {
        match &self.inner.seal {
            Some(seal) => seal.open(&stored).map_err(|error| {
                tracing::error!(%reference, %error, "a stored result cannot be opened");
                Rejection::UnreadableResult { reference, detail: "the stored result cannot be opened".to_owned() }
            }),
            None => Ok(stored),
        }
    }

    /// Makes this the process-wide handle that `#[idempotent]` free functions run under
    /// (methods use [`HasIdem`]). Replaces any handle installed before.
    pub fn install(&self) {
        let mut installed = INSTALLED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *installed = Some(self.clone());
    }

    /// The handle installed with [`Idem::install`], if any.
    #[must_use]
    pub fn installed() -> Option<Self> {
        INSTALLED.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
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

    /// Now, by this handle's clock.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Now on the ledger's clock, as last measured (this handle's clock corrected by the
    /// measured skew; uncorrected before the first measurement).
    #[must_use]
    pub fn ledger_now(&self) -> u64 {
        let offset = self.skew().map_or(0, |skew| skew.offset);
        self.now_ms().saturating_add_signed(offset)
    }

    fn skew(&self) -> Option<Skew> {
        *self.inner.skew.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Now on the ledger's clock, and whether it can be acted on. The first call measures the
    /// skew against the ledger's clock; after that a measurement older than a third of the lease
    /// is refreshed in the background (one extra statement per handle that often, never per
    /// call, and never on a call's path), and one older than the whole lease is not acted on.
    ///
    /// # Errors
    /// The ledger's clock has never been read: no time is stated on an unmeasured clock (a
    /// claim's lease and window would be on this replica's own clock).
    async fn ledger_time(&self) -> Result<(u64, bool), LedgerError> {
        let local = self.now_ms();
        let skew = match self.skew() {
            Some(skew) if skew.clockless => return Ok((local, true)),
            Some(skew) => Some(skew),
            None => None,
        };
        let skew = match skew {
            // This clock stepped back since the last measurement (an NTP step, a restored VM):
            // its offset is void, and nothing may be stamped with it — measure again now.
            Some(skew) if local < skew.at => None,
            other => other,
        };
        let Some(skew) = skew else {
            // Every call measures until one measurement exists.
            let skew = self.measure().await?;
            return Ok((self.now_ms().saturating_add_signed(skew.offset), skew.trusted));
        };
        let age = local - skew.at;
        if age >= millis(self.inner.lease / 3).max(1)
            && let Some(measuring) = Measuring::start(&self.inner.measuring)
        {
            let idem = self.clone();
            tokio::spawn(async move {
                let _measuring = measuring;
                let _ = idem.measure().await;
            });
        }
        let fresh = age < millis(self.inner.lease).max(1);
        Ok((local.saturating_add_signed(skew.offset), skew.trusted && fresh))
    }

    /// Ledger time that may be acted on (takeovers, expiry), for the operator's paths.
    async fn trusted_time(&self) -> Result<u64, LedgerError> {
        match self.ledger_time().await? {
            (now, true) => Ok(now),
            (_, false) => Err(LedgerError::Unavailable {
                detail: "this replica's clock against the ledger's is not settled yet; try again shortly".to_owned(),
            }),
        }
    }

    /// Measures this handle's clock against the ledger's, and keeps the measurement. A failed
    /// read keeps the last good offset, untrusted; with none, it keeps nothing and fails.
    async fn measure(&self) -> Result<Skew, LedgerError> {
        let last = self.skew();
        let before = self.now_ms();
        let answer = self.bounded(self.inner.ledger.now()).await;
        let after = self.now_ms();
        let quarter = millis(self.inner.lease / 4);
        let skew = match answer {
            // The ledger keeps no clock of its own: every handle on it shares this process's.
            Ok(None) => Skew { at: after, offset: 0, trusted: true, clockless: true },
            Ok(Some(ledger)) => {
                let midpoint = u64::try_from((u128::from(before) + u128::from(after)) / 2).unwrap_or(after);
                let offset = i64::try_from(i128::from(ledger) - i128::from(midpoint)).unwrap_or(0);
                let uncertain = after.saturating_sub(before) / 2 > quarter;
                // A clock that jumped since the last measurement is not acted on until it holds.
                let jumped = last.is_some_and(|last| last.offset.abs_diff(offset) > quarter);
                if uncertain || jumped {
                    tracing::warn!(
                        offset,
                        uncertain,
                        jumped,
                        "clock against the ledger's is not settled; \
                        no takeovers or window ends are acted on until it is"
                    );
                }
                Skew { at: after, offset, trusted: !uncertain && !jumped, clockless: false }
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the ledger's clock; no takeovers until it can be read");
                let Some(last) = last else { return Err(error) };
                Skew { at: after, offset: last.offset, trusted: false, clockless: false }
            }
        };
        *self.inner.skew.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(skew);
        Ok(skew)
    }

    /// Ledger time `after` from now.
    fn keep_until(&self, after: Duration) -> u64 {
        clamp(self.ledger_now().saturating_add(millis(after)))
    }

    /// Runs `handler` as the operation `recipe` derives from `caller` and `arguments`, at most
    /// once per key, and answers repeats from the ledger. `caller` falls back to the one in
    /// scope ([`with_caller`]) and then to the local caller; with none, the call is refused.
    ///
    /// `arguments` must be a JSON object of the tool's arguments by name. Build it from Rust
    /// values with [`crate::canonical::to_value`], not `serde_json::json!`/`to_value`: those turn
    /// NaN and infinities into `null` before idem can refuse them. (`#[idempotent]` does this.)
    ///
    /// # Errors
    /// The handler's own error, or `E::from_rejection` of why it did not run.
    pub async fn call<T, E, F, Fut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &Value,
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.call_reconciling(recipe, caller, arguments, |_| async { Reconciled::StillUnknown }, handler).await
    }

    /// [`Idem::call`] for a recipe with the `reconcile` stale policy: when a claim finds a dead
    /// holder's lease, `reconcile` asks the downstream what happened (by the operation's
    /// idempotency key) before anything runs again.
    ///
    /// # Errors
    /// As [`Idem::call`].
    pub async fn call_reconciling<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &Value,
        reconcile: R,
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let arguments = CallArguments::from_json(recipe, arguments);
        match self.execute(recipe, caller, true, arguments, reconcile, handler).await {
            Ok(Served { value: Ok(value), replayed, reference }) => Ok(Served { value, replayed, reference }),
            Ok(Served { value: Err(error), .. }) => Err(error),
            Err(rejection) => Err(E::from_rejection(rejection)),
        }
    }

    /// The orchestration behind [`Idem::call`] and `#[idempotent]`. Without a `caller`, the one
    /// in scope or the local identity — if `fallback` (never for a request that came over
    /// HTTP). The handler and a reconcile function run with the caller in scope.
    pub(crate) async fn execute<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        fallback: bool,
        arguments: Result<CallArguments<'_>, Rejection>,
        reconcile: R,
        handler: F,
    ) -> Result<Served<Result<T, E>>, Rejection>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let tool = recipe.tool();
        self.register(recipe)?;
        let arguments = arguments?;
        let keyring = self.keyring().map_err(|error| no_secret(&error))?;
        let caller = self.caller(caller, fallback)?;
        let scope = scope_of(recipe, &caller, &arguments)?;
        let (now, clock_trusted) = self.ledger_time().await.map_err(|error| {
            tracing::error!(tool, %error, "the ledger's clock could not be read; handler not run");
            unavailable(&error)
        })?;
        let at = Derive { recipe, scope: &scope, arguments: &arguments, now, clock_trusted };
        let (mut request, mut fingerprint) = self.prepare(&keyring.current, &at)?;
        let mut claim = self.claim(&request).await?;
        if matches!(claim, Claim::Won { attempt: Won::Fresh, .. })
            && let Some(earlier) = self.earlier_operation(&keyring, &at, &request).await?
        {
            (request, fingerprint, claim) = earlier;
        }
        let key = request.key;
        let reference = key.reference();
        let (attempt, window_end) = match claim {
            Claim::Won { attempt, window_end } => (attempt, window_end),
            Claim::Replay { result } => {
                tracing::info!(tool, %reference, "replay");
                let result = self.open(result, reference)?;
                return decode::<T, E>(&result, reference).map(|value| Served { value, replayed: true, reference });
            }
            Claim::InFlight { .. } => {
                tracing::info!(tool, %reference, "in flight");
                return Err(Rejection::InFlight { reference });
            }
            Claim::Unknown => {
                tracing::warn!(tool, %reference, "outcome unknown");
                return Err(Rejection::OutcomeUnknown { reference });
            }
            Claim::Conflict { arg_tags } => {
                let (differing, missing) = fingerprint.differing(&arg_tags);
                tracing::warn!(tool, %reference, ?differing, missing, "conflict");
                return Err(Rejection::Conflict { reference, differing, missing });
            }
        };
        let lease = Arc::new(LeaseState { until: AtomicU64::new(request.lease_until), fenced: AtomicBool::new(false) });
        let operation = Operation {
            key,
            tool,
            attempt,
            token: request.token,
            window_end,
            idem: self.clone(),
            lease: Arc::clone(&lease),
            recorded: Arc::default(),
        };
        if operation.lease_lost() {
            // The answer came after the lease it granted ran out: another replica may hold the
            // operation by now. Give the claim back (fenced by our token) and run nothing.
            tracing::error!(tool, %reference, "the claim was answered after its lease ended; handler not run");
            self.release_lost_claim(&request);
            return Err(Rejection::ledger_unavailable(format!("ref {reference}: the ledger answered too late")));
        }
        let recorded = Arc::clone(&operation.recorded);
        let result = match attempt {
            Won::Reconcile => {
                tracing::warn!(tool, %reference, "stale lease; reconciling with the downstream");
                let asked = CALLER.scope(caller.clone().into_owned(), reconcile(operation.clone()));
                match self.drive(&request, &lease, &recorded, asked).await {
                    Err(panic) => self.unwind(&request, &lease, panic).await,
                    Ok(Reconciled::Happened(result)) => result,
                    Ok(Reconciled::NothingHappened) => {
                        self.run(&request, operation, &caller, &lease, &recorded, handler).await
                    }
                    Ok(Reconciled::StillUnknown) => {
                        self.finish(&request, &lease, Outcome::Unknown, false).await;
                        return Err(Rejection::OutcomeUnknown { reference });
                    }
                }
            }
            Won::Takeover => {
                tracing::warn!(tool, %reference, "stale lease taken over; running again under a new token");
                self.run(&request, operation, &caller, &lease, &recorded, handler).await
            }
            Won::Fresh => {
                tracing::debug!(tool, %reference, "claimed");
                self.run(&request, operation, &caller, &lease, &recorded, handler).await
            }
        };
        let recorded = recorded.load(Ordering::SeqCst);
        let (value, fenced) = self.record(&request, &lease, result, recorded, attempt).await;
        if fenced && let Some(stored) = self.stored_result(&request, window_end).await {
            // Superseded: the answer is the new holder's, the one every repeat gets too.
            let stored = self.open(stored, reference)?;
            return decode::<T, E>(&stored, reference).map(|value| Served { value, replayed: true, reference });
        }
        Ok(Served { value, replayed: false, reference })
    }

    /// Sends the claim; a claim that fails is sent once more with the same token (a pooled
    /// connection the server dropped fails one statement; if the first send committed, the
    /// ledger recognises it as ours and says how it won). A claim that still fails after a send
    /// whose answer was lost is released in the background.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, Rejection> {
        let reference = request.key.reference();
        let first = self.bounded(self.inner.ledger.claim(request)).await;
        let (claim, ambiguous) = match first {
            Err(error @ (LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. })) => {
                let again = self.bounded(self.inner.ledger.claim(request)).await;
                let ambiguous = error.is_ambiguous() || again.as_ref().is_err_and(LedgerError::is_ambiguous);
                (again, ambiguous)
            }
            other => (other, false),
        };
        claim.map_err(|error| {
            tracing::error!(%reference, %error, ambiguous, "ledger unavailable; handler not run");
            if ambiguous {
                self.release_lost_claim(request);
            }
            unavailable(&error)
        })
    }

    /// The caller of a call: the one given, else (with `fallback`) the one in scope
    /// ([`with_caller`], an outer idempotent handler's), else the local identity; none: refused.
    fn caller<'c>(
        &self,
        caller: Option<&'c Caller>,
        fallback: bool,
    ) -> Result<std::borrow::Cow<'c, Caller>, Rejection> {
        match caller {
            Some(caller) => Ok(std::borrow::Cow::Borrowed(caller)),
            None if !fallback => Err(Rejection::NoCaller),
            None => CALLER
                .try_with(Clone::clone)
                .ok()
                .or_else(|| self.inner.local_caller.clone())
                .map(std::borrow::Cow::Owned)
                .ok_or(Rejection::NoCaller),
        }
    }

    /// Derives the claim for a call under `secret`, or the rejection that stops it before the
    /// ledger.
    fn prepare<'a>(
        &self,
        secret: &Secret,
        at: &Derive<'_, 'a, '_>,
    ) -> Result<(ClaimRequest, Fingerprint<'a>), Rejection> {
        let invalid = |error| Rejection::InvalidArguments { error };
        let recipe = at.recipe;
        let (all, selected) = (&*at.arguments.all, &at.arguments.selected);
        let key = Key::derive(secret, self.namespace(recipe), at.scope, recipe.tool(), selected).map_err(invalid)?;
        let fingerprint = Fingerprint::of(secret, all, recipe.ignored()).map_err(invalid)?;
        let window = recipe.window_duration().unwrap_or(self.inner.retention);
        let now = at.now;
        let window_end = clamp(now.saturating_add(millis(window)));
        let request = ClaimRequest {
            key,
            tenant: at.scope.tenant_tag(secret),
            subject: at.scope.subject_tag(secret),
            fingerprint: fingerprint.digest,
            arg_tags: fingerprint.tags.clone(),
            token: Token::random(),
            now,
            window_end,
            expires_at: clamp(window_end.saturating_add(millis(self.inner.unsettled_retention))),
            lease_until: clamp(now.saturating_add(millis(self.inner.lease))),
            stale: recipe.stale_policy(),
            clock_trusted: at.clock_trusted,
        };
        Ok((request, fingerprint))
    }

    /// After a fresh claim under the current secret: an operation recorded under a previous
    /// secret (before a rotation) that is still live is this call's operation. The fresh claim
    /// is given back and the call is answered by that record. `None`: there is none.
    ///
    /// Every replica claims first and looks second, so of two replicas keying one operation
    /// under different secrets at once, at least one sees the other's claim and yields; if both
    /// do, neither runs and the caller is told to ask again.
    async fn earlier_operation<'a>(
        &self,
        keyring: &Keyring,
        at: &Derive<'_, 'a, '_>,
        claimed: &ClaimRequest,
    ) -> Result<Option<(ClaimRequest, Fingerprint<'a>, Claim)>, Rejection> {
        for secret in &keyring.previous {
            let (request, fingerprint) = self.prepare(secret, at)?;
            let found = match self.bounded(self.inner.ledger.lookup(&request.key, at.now)).await {
                Ok(found) => found,
                Err(error) => {
                    tracing::error!(reference = %claimed.key.reference(), %error, "ledger unavailable; handler not run");
                    self.give_back(claimed).await;
                    return Err(unavailable(&error));
                }
            };
            // Live as `RecordView::judge` sees it: an unsettled record is over only once its
            // holder's lease has lapsed, its window has ended, and this clock can be trusted.
            let live = found.is_some_and(|report| match report.state {
                crate::ledger::State::Completed => true,
                crate::ledger::State::InProgress => {
                    !report.lease_expired || report.window_end > at.now || !at.clock_trusted
                }
                crate::ledger::State::Unknown => report.window_end > at.now || !at.clock_trusted,
                _ => false,
            });
            if !live {
                continue;
            }
            tracing::info!(reference = %request.key.reference(), version = secret.version(),
                "the operation was recorded under a previous secret; answering from that record");
            self.give_back(claimed).await;
            let claim = self.claim(&request).await?;
            if matches!(claim, Claim::Won { attempt: Won::Fresh, .. }) {
                // It settled as "nothing happened" meanwhile, or its claimer yielded to ours:
                // running now could race a replica that keys it under the other secret.
                self.give_back(&request).await;
                return Err(Rejection::InFlight { reference: request.key.reference() });
            }
            return Ok(Some((request, fingerprint, claim)));
        }
        Ok(None)
    }

    /// Gives a fresh claim back (it becomes "failed": nothing ran), in the background if the
    /// ledger does not answer at once.
    async fn give_back(&self, request: &ClaimRequest) {
        match self.bounded(self.inner.ledger.release(&request.key, request.token)).await {
            Ok(()) | Err(LedgerError::Fenced) => {}
            Err(_) => self.release_lost_claim(request),
        }
    }

    /// Runs `future` (the handler, or a reconcile function) while a task of its own renews the
    /// claim's lease, so a long run keeps its claim — even a handler that blocks its thread —
    /// and a refused renewal shows in [`Operation::lease_lost`]. A panic is caught and handed
    /// back.
    async fn drive<F: Future>(
        &self,
        request: &ClaimRequest,
        lease: &Arc<LeaseState>,
        recorded: &Arc<AtomicBool>,
        future: F,
    ) -> std::thread::Result<F::Output> {
        let mut future = CatchUnwind(Box::pin(future));
        // A future that finishes on its first poll needs no renewals.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx))).await;
        if let std::task::Poll::Ready(output) = first {
            return output;
        }
        let renewal = self.clone().renew(request.key, request.token, Arc::clone(lease), Arc::clone(recorded));
        let _stop = AbortOnDrop(tokio::spawn(renewal));
        // Let the renewer start (and set its timer) before the handler goes on: a handler that
        // then blocks its thread would otherwise keep a task spawned on this thread from ever
        // starting.
        tokio::task::yield_now().await;
        future.await
    }

    /// Renews the lease every third of it until stopped, the handler recorded its result itself,
    /// or the ledger refuses (the claim is someone else's now).
    async fn renew(self, key: Key, token: Token, lease: Arc<LeaseState>, recorded: Arc<AtomicBool>) {
        let every = self.inner.lease / 3;
        // The claim may have taken a while to answer: renew as soon as less than two thirds of
        // the lease is left, not a full third of a lease after the handler started.
        let left = lease.until.load(Ordering::SeqCst).saturating_sub(self.ledger_now());
        let mut pause = Duration::from_millis(left.saturating_sub(millis(self.inner.lease * 2 / 3))).min(every);
        loop {
            tokio::time::sleep(pause).await;
            pause = every;
            if recorded.load(Ordering::SeqCst) {
                return;
            }
            let until = self.keep_until(self.inner.lease);
            match self.bounded(self.inner.ledger.renew(&key, token, until)).await {
                Ok(()) => lease.until.fetch_max(until, Ordering::SeqCst),
                Err(LedgerError::Fenced) => {
                    tracing::warn!(reference = %key.reference(), "lease renewal refused: the claim is no longer ours");
                    lease.fenced.store(true, Ordering::SeqCst);
                    return;
                }
                Err(error) => {
                    tracing::warn!(reference = %key.reference(), %error, "lease renewal failed");
                    continue;
                }
            };
        }
    }

    /// Runs the handler as `operation` of `caller` (in scope for everything it calls) under
    /// [`Idem::drive`]. A panic records the outcome as unknown (the effect may have happened)
    /// and then continues unwinding.
    async fn run<T, E, F, Fut>(
        &self,
        request: &ClaimRequest,
        operation: Operation,
        caller: &Caller,
        lease: &Arc<LeaseState>,
        recorded: &Arc<AtomicBool>,
        handler: F,
    ) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let handler = CALLER.scope(caller.clone(), OPERATION.scope(operation, handler()));
        match self.drive(request, lease, recorded, handler).await {
            Ok(result) => result,
            Err(panic) => self.unwind(request, lease, panic).await,
        }
    }

    async fn unwind(&self, request: &ClaimRequest, lease: &LeaseState, panic: Box<dyn std::any::Any + Send>) -> ! {
        tracing::error!(reference = %request.key.reference(), "the handler panicked; recording the outcome as unknown");
        self.finish(request, lease, Outcome::Unknown, false).await;
        std::panic::resume_unwind(panic)
    }

    /// `operation`, or [`LedgerError::Ambiguous`] once the ledger timeout has passed (the
    /// statement may still commit).
    async fn bounded<T>(&self, operation: impl Future<Output = Result<T, LedgerError>>) -> Result<T, LedgerError> {
        match tokio::time::timeout(self.inner.ledger_timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(LedgerError::Ambiguous {
                detail: format!("no answer within {} ms", self.inner.ledger_timeout.as_millis()),
            }),
        }
    }

    /// The claim may have committed before its answer was lost. Undo it — fenced by our token,
    /// and only what it did: a fresh claim becomes failed, a takeover gives its lease back — so
    /// the retry the caller was told is safe runs instead of hearing "in flight" although
    /// nothing ran. In the background, at most [`RELEASE_TRIES`] times with growing pauses,
    /// stopping at the first answer; at most [`BACKGROUND_JOBS`] at once per handle, past which
    /// the claim is left to run out its lease.
    fn release_lost_claim(&self, request: &ClaimRequest) {
        let (key, token) = (request.key, request.token);
        let Ok(permit) = Arc::clone(&self.inner.background).try_acquire_owned() else {
            tracing::warn!(reference = %key.reference(), "too much background work; a lost claim is left to its lease");
            return;
        };
        let idem = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            // A few tries, spread over about a lease (and at least a few seconds, for a ledger
            // coming back from an outage).
            let mut pause = (idem.inner.lease / 16).max(Duration::from_millis(20));
            for attempt in 1..=RELEASE_TRIES {
                match idem.bounded(idem.inner.ledger.release(&key, token)).await {
                    Ok(()) => {
                        tracing::info!(reference = %key.reference(), "released a claim whose answer was lost");
                        return;
                    }
                    // Nothing of ours to undo: the claim never committed, or is someone else's.
                    Err(LedgerError::Fenced) => return,
                    Err(error) if attempt == RELEASE_TRIES => {
                        tracing::warn!(reference = %key.reference(), %error, "could not release a lost claim; \
                            it runs out its lease");
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// Stores the handler's result per its classification and hands it back.
    /// Returns the result and whether its completion was refused because the claim had been
    /// taken over meanwhile.
    async fn record<T, E>(
        &self,
        request: &ClaimRequest,
        lease: &LeaseState,
        result: Result<T, E>,
        recorded: bool,
        attempt: Won,
    ) -> (Result<T, E>, bool)
    where
        T: Serialize,
        E: IdempotentError,
    {
        let outcome = match &result {
            Ok(value) => self.encode(request, &Stored::<&T, &E>::Ok(value)),
            Err(error) => match error.classify() {
                ErrorClass::NothingHappened => Outcome::Failed,
                ErrorClass::Final => self.encode(request, &Stored::<&T, &E>::Err(error)),
                ErrorClass::Unknown => Outcome::Unknown,
            },
        };
        // "Nothing happened" from a run that took over (or reconciled and ran) speaks for this run
        // only: the holder it replaced may have acted — or may still, if it is alive but late.
        // Give the lease back instead, so the operation stays in progress (same window, same
        // forwarded key) and its stale policy decides again.
        let give_back = outcome == Outcome::Failed && attempt != Won::Fresh;
        let fenced = self.finish_with(request, lease, outcome, recorded, give_back).await;
        (result, fenced)
    }

    fn encode<S: Serialize>(&self, request: &ClaimRequest, stored: &S) -> Outcome {
        let reference = request.key.reference();
        match serde_json::to_vec(stored) {
            Ok(bytes) if bytes.len() <= self.inner.max_result_bytes => match self.seal(bytes) {
                Ok(sealed) => Outcome::Completed(sealed),
                Err(error) => {
                    tracing::error!(%reference, %error, "recording the outcome as unknown");
                    Outcome::Unknown
                }
            },
            Ok(bytes) => {
                tracing::error!(%reference, size = bytes.len(), max = self.inner.max_result_bytes,
                    "result too large to store; recording the outcome as unknown");
                Outcome::Unknown
            }
            Err(error) => {
                tracing::error!(%reference, %error, "result cannot be stored; recording the outcome as unknown");
                Outcome::Unknown
            }
        }
    }

    /// Completes the claim. A failure here is logged, never hidden behind the caller's result:
    /// the effect happened. A few quick retries while the caller waits, then more in the
    /// background until the lease would have run out twice over — a late result is still
    /// recorded under `hold` (its record went unknown, not to someone else), and a
    /// recorded result is what every repeat needs.
    /// Returns whether the claim turned out to be superseded (fenced) — its holder's result was
    /// not recorded.
    async fn finish(&self, request: &ClaimRequest, lease: &LeaseState, outcome: Outcome, recorded: bool) -> bool {
        self.finish_with(request, lease, outcome, recorded, false).await
    }

    /// [`Idem::finish`], or with `give_back` the claim's release instead of its completion.
    async fn finish_with(
        &self,
        request: &ClaimRequest,
        lease: &LeaseState,
        outcome: Outcome,
        recorded: bool,
        give_back: bool,
    ) -> bool {
        let reference = request.key.reference();
        for pause in [50, 250, 0] {
            match self.complete_once(request, &outcome, recorded, give_back).await {
                Ok(fenced) => return fenced,
                Err(LedgerError::Unavailable { detail } | LedgerError::Ambiguous { detail }) => {
                    tracing::warn!(%reference, %detail, "could not record the outcome yet; retrying");
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(error) => {
                    tracing::error!(%reference, %error, "could not record the outcome");
                    return false;
                }
            }
        }
        let Ok(permit) = Arc::clone(&self.inner.background).try_acquire_owned() else {
            tracing::error!(%reference, "could not record the outcome, and too much background work to keep trying");
            return false;
        };
        let (idem, request) = (self.clone(), request.clone());
        let until = lease.until.load(Ordering::SeqCst).saturating_add(millis(self.inner.lease));
        tokio::spawn(async move {
            let _permit = permit;
            let mut pause = Duration::from_millis(500);
            while idem.ledger_now() < until {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                match idem.complete_once(&request, &outcome, recorded, give_back).await {
                    Ok(_) => return,
                    Err(LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. }) => {}
                    Err(error) => {
                        tracing::error!(reference = %request.key.reference(), %error, "could not record the outcome");
                        return;
                    }
                }
            }
            tracing::error!(reference = %request.key.reference(), "gave up recording the outcome; its record \
                stays in progress and its lease runs out into the tool's stale policy");
        });
        false
    }

    /// One completion: `Ok(true)` if the claim was superseded, `Ok(false)` once recorded.
    async fn complete_once(
        &self,
        request: &ClaimRequest,
        outcome: &Outcome,
        recorded: bool,
        give_back: bool,
    ) -> Result<bool, LedgerError> {
        let keep_until = self.keep_until(self.inner.grace);
        let ending = if give_back {
            self.inner.ledger.release(&request.key, request.token)
        } else {
            self.inner.ledger.complete(&request.key, request.token, outcome.clone(), keep_until)
        };
        match self.bounded(ending).await {
            Ok(()) => Ok(false),
            Err(LedgerError::Fenced) if recorded => {
                tracing::debug!(reference = %request.key.reference(), "recorded in the handler's own transaction");
                Ok(false)
            }
            Err(LedgerError::Fenced) => {
                tracing::warn!(reference = %request.key.reference(),
                    "the claim was taken over while the handler ran; its result is not recorded");
                Ok(true)
            }
            Err(error) => Err(error),
        }
    }

    /// The stored result of the operation that ends its window at `window_end`, read by its full
    /// key, if the ledger has one — never a later operation's under the same key.
    async fn stored_result(&self, request: &ClaimRequest, window_end: u64) -> Option<Vec<u8>> {
        match self.bounded(self.inner.ledger.lookup(&request.key, self.ledger_now())).await {
            Ok(Some(report)) if report.state == crate::ledger::State::Completed && report.window_end == window_end => {
                report.result
            }
            _ => None,
        }
    }

    /// The status of operation `reference`, if the caller may see it: its own operations, and
    /// those of its tenant made with `scope = "tenant"`. Never another subject's.
    ///
    /// # Errors
    /// A malformed ref, or the ledger's failure.
    pub async fn status(&self, caller: &Caller, reference: &str) -> Result<Option<StatusReport>, StatusError> {
        let reference = Ref::parse(reference).map_err(StatusError::Ref)?;
        let keyring = self.keyring().map_err(StatusError::Secret)?;
        let (now, _) = self.ledger_time().await.map_err(StatusError::Ledger)?;
        for secret in keyring.all() {
            let tenant = crate::key::TenantTag::of(secret, caller.tenant());
            let subject = crate::key::SubjectTag::of(secret, caller.tenant(), caller.subject());
            let report =
                self.inner.ledger.status(tenant, subject, reference, now).await.map_err(StatusError::Ledger)?;
            if let Some(mut report) = report {
                // An unopenable result is not shown (the error is logged); its state still is.
                report.result = report.result.and_then(|stored| self.open(stored, report.reference).ok());
                return Ok(Some(report));
            }
        }
        Ok(None)
    }

    /// Settles an unknown (or dead-holder) operation of the caller's tenant: the operator path
    /// out of "outcome unknown". The verdict stays readable (and a completed one replayable)
    /// for the verdict retention at least.
    ///
    /// # Errors
    /// A malformed ref, no such operation, or one that is not unknown.
    pub async fn resolve(&self, caller: &Caller, reference: &str, resolution: Resolution) -> Result<(), StatusError> {
        let reference = Ref::parse(reference).map_err(StatusError::Ref)?;
        let keyring = self.keyring().map_err(StatusError::Secret)?;
        // A resolve acts on time (is the holder's lease over?): only on a settled clock.
        let now = self.trusted_time().await.map_err(StatusError::Ledger)?;
        let keep_until = clamp(now.saturating_add(millis(self.inner.verdict_retention)));
        let resolution = match resolution {
            Resolution::Completed(plain) => {
                let sealed = self.seal(plain).map_err(|detail| StatusError::Ledger(LedgerError::Corrupt { detail }))?;
                Resolution::Completed(sealed)
            }
            other => other,
        };
        let mut answer = Err(LedgerError::NotFound);
        for secret in keyring.all() {
            let tenant = crate::key::TenantTag::of(secret, caller.tenant());
            answer = self.inner.ledger.resolve(tenant, reference, resolution.clone(), now, keep_until).await;
            if answer != Err(LedgerError::NotFound) {
                break;
            }
        }
        answer.map_err(StatusError::Ledger)
    }

    /// Deletes expired records, `batch` at a time, until none are left; returns how many.
    ///
    /// # Errors
    /// The ledger's failure; records deleted before it stay deleted.
    pub async fn sweep(&self, batch: usize) -> Result<usize, LedgerError> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            // A sweep deletes by time: only on a settled clock.
            let now = self.trusted_time().await?;
            let swept = self.inner.ledger.sweep(now, batch).await?;
            total += swept;
            if swept < batch {
                tracing::debug!(swept = total, "sweep done");
                return Ok(total);
            }
        }
    }
}

/// The one background skew measurement in flight; ends when dropped.
struct Measuring(Arc<AtomicBool>);

impl Measuring {
    fn start(flag: &Arc<AtomicBool>) -> Option<Self> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| Self(Arc::clone(flag)))
    }
}

impl Drop for Measuring {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Aborts a spawned task when dropped (the renewer, when its handler finishes or is dropped).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A status or resolve request that could not be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// The ref is malformed.
    Ref(RefError),
    /// The ledger failed or refused.
    Ledger(LedgerError),
    /// The handle has no usable secret.
    Secret(SecretError),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ref(error) => error.fmt(f),
            Self::Ledger(error) => error.fmt(f),
            Self::Secret(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for StatusError {}

fn decode<T: DeserializeOwned, E: IdempotentError>(bytes: &[u8], reference: Ref) -> Result<Result<T, E>, Rejection> {
    match serde_json::from_slice::<Stored<T, E>>(bytes) {
        Ok(Stored::Ok(value)) => Ok(Ok(value)),
        Ok(Stored::Err(error)) => Ok(Err(error)),
        Err(error) => Err(Rejection::UnreadableResult { reference, detail: error.to_string() }),
    }
}

/// The namespace of keys when none is configured.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The secrets a handle keys with.
#[derive(Debug)]
struct Keyring {
    /// New operations are keyed with this one.
    current: Secret,
    /// Operations recorded under these are still found.
    previous: Vec<Secret>,
}

impl Keyring {
    fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.current).chain(&self.previous)
    }
}

/// What a claim is derived from, apart from the secret.
struct Derive<'r, 'a, 's> {
    recipe: &'r Recipe,
    scope: &'s Scope,
    arguments: &'a CallArguments<'a>,
    now: u64,
    clock_trusted: bool,
}

/// The scope `recipe` keys a call of `caller` in.
fn scope_of(recipe: &Recipe, caller: &Caller, arguments: &CallArguments<'_>) -> Result<Scope, Rejection> {
    Ok(match (recipe.scope_rule(), &arguments.task) {
        (ScopeRule::Tenant, _) => Scope::tenant(caller),
        (ScopeRule::Task(_), Some(task)) if !task.is_null() => Scope::task(caller, task.clone()),
        (ScopeRule::Task(path), _) => {
            return Err(Rejection::InvalidArguments {
                error: CanonicalError::Invalid {
                    message: format!("the task id argument `{path}` is missing; the key's scope needs it"),
                },
            });
        }
        _ => Scope::caller(caller),
    })
}

/// The refusal of a call on a handle without a usable secret: nothing runs unkeyed.
fn no_secret(error: &SecretError) -> Rejection {
    Rejection::ledger_unavailable(format!("no usable idem secret: {error}"))
}

fn unavailable(error: &LedgerError) -> Rejection {
    Rejection::ledger_unavailable(error)
}

/// A call's arguments, split the way a recipe needs them.
#[derive(Debug, Default)]
pub(crate) struct CallArguments<'a> {
    /// Every argument by name (the fingerprint's input; ignored names are dropped there).
    pub(crate) all: std::borrow::Cow<'a, Map<String, Value>>,
    /// The key's arguments by path.
    pub(crate) selected: Map<String, Value>,
    /// The task id, for `ScopeRule::Task`.
    pub(crate) task: Option<Value>,
}

impl<'a> CallArguments<'a> {
    /// Splits a JSON object of arguments by the recipe's paths.
    fn from_json(recipe: &Recipe, arguments: &'a Value) -> Result<Self, Rejection> {
        let Value::Object(all) = arguments else {
            return Err(Rejection::InvalidArguments {
                error: CanonicalError::Invalid { message: "the arguments must be a JSON object".to_owned() },
            });
        };
        // A missing or null key path is refused: as `null` it would make every call without it
        // (a typo, a forgetful client) one operation. Only the recipe's optional key paths take
        // "absent" as a value, and then absent and null are one value.
        let mut selected = Map::with_capacity(recipe.key_paths().len());
        for path in recipe.key_paths() {
            let value = match lookup(all, path) {
                Some(value) if !value.is_null() => value.clone(),
                _ if recipe.is_optional_key(path) => Value::Null,
                _ => {
                    return Err(Rejection::InvalidArguments {
                        error: CanonicalError::MissingKey { path: (*path).to_owned() },
                    });
                }
            };
            selected.insert((*path).to_owned(), value);
        }
        let task = match recipe.scope_rule() {
            ScopeRule::Task(path) => lookup(all, path).cloned(),
            _ => None,
        };
        Ok(Self { all: std::borrow::Cow::Borrowed(all), selected, task })
    }
}

/// The value at a dotted argument path (`"customer.id"`).
fn lookup<'a>(arguments: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut segments = path.split('.');
    let first = arguments.get(segments.next()?)?;
    segments.try_fold(first, |value, segment| value.as_object()?.get(segment))
}

/// Times are stored as signed 64-bit integers by SQL backends: keep them in that range, so
/// what a claim asks for is what it reads back.
fn clamp(ms: u64) -> u64 {
    ms.min(i64::MAX.unsigned_abs())
}

/// Polls a future, turning a panic into an `Err` (like `futures`' `catch_unwind`).
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
