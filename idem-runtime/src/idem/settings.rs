//! What a handle is built with: [`Builder`] gathers the settings, [`Builder::build`] checks them
//! together, once, and the handle keeps them unchanged for its life ([`Settings`]). Nothing on a
//! call's path reads a setting through a lock, and no setting depends on the order it was given in.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::ledger::Ledger;
use crate::scope::Caller;
use crate::secret::Secret;

use super::Idem;
use super::hooks::Hooks;
use super::stored::ResultSeal;

/// How long a record lives when its recipe sets no window.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a claim is held without renewal; a running handler renews it every third of this.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long one ledger statement may take before the ledger counts as unavailable (at most half
/// the lease).
pub const DEFAULT_LEDGER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest stored result accepted by default.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;
/// How long a completed result stays replayable after it settles, even if its window ended
/// meanwhile (a handler slower than its window).
pub const DEFAULT_SETTLE_GRACE: Duration = Duration::from_secs(60);
/// How long an operator's verdict stays readable and replayable.
pub const DEFAULT_VERDICT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long an operation that never settled (unknown, or in progress under a dead holder) is
/// kept past its window for an operator, before the sweep may delete it.
pub const DEFAULT_UNSETTLED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest lease accepted: it is renewed every third of it, in whole milliseconds.
const MIN_LEASE: Duration = Duration::from_millis(3);
/// The shortest ledger timeout accepted.
const MIN_LEDGER_TIMEOUT: Duration = Duration::from_millis(1);

/// The namespace of keys when none is configured.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// A handle's settings, checked together by [`Builder::build`] and fixed from then on.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) lease: Duration,
    /// Always at most half the lease.
    pub(super) ledger_timeout: Duration,
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
    /// The secret given in code, if any (else `IDEM_SECRET`, else the ledger's default).
    pub(super) secret: Option<Secret>,
    /// Previous secrets given in code, still honoured for operations recorded under them.
    pub(super) previous: Vec<Secret>,
    /// Secret versions given up in code: re-keying their live operations accepted.
    pub(super) retired: Vec<u32>,
    /// Told of each call's lifecycle.
    pub(super) hooks: Option<Arc<dyn Hooks>>,
}

/// Gathers a handle's settings; [`Builder::build`] checks them together and makes the [`Idem`].
/// Made by [`Idem::builder`]. Every setting has a default; giving one twice keeps the last.
///
/// Two rules hold for every duration: ledger time counts whole milliseconds (a sub-millisecond
/// part is dropped), and a time beyond what a signed 64-bit count of milliseconds holds (some
/// 292 million years) stays at that end.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Caller, Idem, MemoryLedger};
///
/// let idem = Idem::builder(MemoryLedger::new())
///     .namespace("payments")
///     .lease(Duration::from_secs(60))
///     .local_caller(Caller::new("acme", "alice"))
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), idem_runtime::settings::BuildError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    ledger: Arc<dyn Ledger>,
    settings: Settings,
    /// The ledger timeout as given, if given (else the default, lowered to half the lease).
    ledger_timeout: Option<Duration>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("lease", &self.settings.lease)
            .field("ledger_timeout", &self.ledger_timeout)
            .field("retention", &self.settings.retention)
            .field("max_result_bytes", &self.settings.max_result_bytes)
            .field("namespace", &self.settings.namespace)
            .field("local_caller", &self.settings.local_caller)
            .finish_non_exhaustive()
    }
}

impl Builder {
    pub(super) fn new(ledger: impl Ledger) -> Self {
        // A ledger already shared (`Arc<dyn Ledger>`) is kept as it is, so every handle built on
        // one shared ledger sees the same ledger (the tool-owner check keys on it).
        let mut given = Some(ledger);
        let ledger: Arc<dyn Ledger> = match (&mut given as &mut dyn Any).downcast_mut::<Option<Arc<dyn Ledger>>>() {
            Some(shared) => shared.take().expect("taken once"),
            None => Arc::new(given.take().expect("taken once")),
        };
        Self {
            ledger,
            settings: Settings {
                clock: Arc::new(SystemClock),
                lease: DEFAULT_LEASE,
                ledger_timeout: DEFAULT_LEDGER_TIMEOUT,
                retention: DEFAULT_RETENTION,
                grace: DEFAULT_SETTLE_GRACE,
                verdict_retention: DEFAULT_VERDICT_RETENTION,
                unsettled_retention: DEFAULT_UNSETTLED_RETENTION,
                max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
                local_caller: None,
                seal: None,
                namespace: None,
                secret: None,
                previous: Vec::new(),
                retired: Vec::new(),
                hooks: None,
            },
            ledger_timeout: None,
        }
    }

    /// Uses `clock` instead of the system clock (tests step it over a window edge).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.settings.clock = Arc::new(clock);
        self
    }

    /// How long a claim is held before a repeat may treat its holder as dead (default 30 s, at
    /// least 3 ms). A running handler renews it every third of this, so it bounds detection of a
    /// crash, not the handler's running time. A ledger timeout not given is at most half of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long one ledger statement may take (default 10 s, at least 1 ms, at most half the
    /// lease). A ledger that does not answer in time is unavailable: the handler does not run,
    /// and the caller is told so. Every statement of the handle goes through this one bound.
    pub fn ledger_timeout(mut self, timeout: Duration) -> Self {
        self.ledger_timeout = Some(timeout);
        self
    }

    /// How long records of recipes without a window live (default 24 h, more than zero).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// How long a completed result stays replayable after it settles even if its window ended
    /// meanwhile (default 60 s): the caller of a handler slower than its window can still
    /// collect the result.
    pub fn settle_grace(mut self, grace: Duration) -> Self {
        self.settings.grace = grace;
        self
    }

    /// How long an operator's verdict ([`Admin::resolve`](super::Admin::resolve)) stays
    /// readable and replayable, at least (default 24 h).
    pub fn verdict_retention(mut self, retention: Duration) -> Self {
        self.settings.verdict_retention = retention;
        self
    }

    /// How long an operation that never settled — unknown, or in progress under a holder that
    /// died — is kept past its window for an operator (default 7 days). Once its window has
    /// ended, a repeat starts a new operation (with a new idempotency key) and the old record
    /// stays beside it, visible to the operator, until this passes.
    pub fn unsettled_retention(mut self, retention: Duration) -> Self {
        self.settings.unsettled_retention = retention;
        self
    }

    /// The largest result stored for replay (default 1 MiB). A larger result is returned to its
    /// caller but recorded as "outcome unknown", so repeats are told to check rather than run.
    pub fn max_result_bytes(mut self, max: usize) -> Self {
        self.settings.max_result_bytes = max;
        self
    }

    /// The caller to use when none is given and none is in scope ([`run_as`](super::run_as)):
    /// the configured identity of a local, single-user transport such as stdio.
    pub fn local_caller(mut self, caller: Caller) -> Self {
        self.settings.local_caller = Some(caller);
        self
    }

    /// Keys every operation with `secret` (HMAC-SHA256), instead of the one in `IDEM_SECRET` or
    /// the ledger's default. Every replica on one ledger must use the same secret.
    ///
    /// Without one: `IDEM_SECRET` (`<version>:<hex>`, at least 32 bytes, see [`crate::secret`]);
    /// else a [`MemoryLedger`](crate::MemoryLedger) uses a random secret per process, and the
    /// embedded SQLite default one it generates once and keeps beside its file (owner-only);
    /// PostgreSQL and MySQL refuse — check at startup with
    /// [`Admin::check_secret`](crate::admin::Admin::check_secret).
    pub fn secret(mut self, secret: Secret) -> Self {
        self.settings.secret = Some(secret);
        self
    }

    /// Also honours `secret`, a previous one, for operations recorded under it: during a
    /// rotation a repeat of an operation made under the old secret is answered from that record
    /// (replayed, in flight, unknown) rather than run again. Keep it until no operation made
    /// under it can answer a repeat: until then a handle without it refuses to serve
    /// ([`SecretError::Rekeying`](crate::secret::SecretError::Rekeying)) unless its version is
    /// given up ([`Builder::retired_secret_version`]); see [`crate::secret`] for the steps. May
    /// be given more than once.
    pub fn previous_secret(mut self, secret: Secret) -> Self {
        self.settings.previous.push(secret);
        self
    }

    /// Gives up secret `version`: serves even while operations keyed under it may still be
    /// repeated, accepting that such a repeat gets a new key and runs again (re-keying). Without
    /// it, a handle that keeps a version the ledger has seen neither as its secret nor as a
    /// previous one refuses to serve until that version's last operation could no longer be
    /// repeated ([`SecretError::Rekeying`](crate::secret::SecretError::Rekeying), which names the
    /// versions and until when). For a version dropped after its longest window has run (its
    /// unsettled operations then unreadable by the operator), or one another service keys with
    /// on a shared ledger. The same as [`IDEM_SECRET_RETIRED`](crate::secret::RETIRED_VERSIONS_ENV)
    /// (read when no secret is given in code). May be given more than once.
    pub fn retired_secret_version(mut self, version: u32) -> Self {
        self.settings.retired.push(version);
        self
    }

    /// Derives every tool's keys in `namespace`, the server's name — two servers on one ledger
    /// with a tool of the same name then never share keys. Without it, each recipe's own: the
    /// name of the package that declares the handler (`#[idempotent]`), else `"default"`.
    /// Renaming the namespace re-keys every tool (repeats of earlier operations run again).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.settings.namespace = Some(namespace.into());
        self
    }

    /// Seals every result before it is stored and opens it when read back (replays, status,
    /// an operator's verdict): see [`ResultSeal`]. Without one, results are stored as given.
    pub fn result_seal(mut self, seal: impl ResultSeal) -> Self {
        self.settings.seal = Some(Arc::new(seal));
        self
    }

    /// Calls `hooks` on every call of the handle (see [`Hooks`]).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.settings.hooks = Some(hooks);
        self
    }

    /// Checks the settings together and makes the handle. The ledger is wrapped in the ledger
    /// timeout here, once: every statement the handle sends goes through it.
    ///
    /// # Errors
    /// [`BuildError`], saying which setting to change: a lease under 3 ms, a ledger timeout
    /// under 1 ms or over half the lease, a retention of zero.
    pub fn build(self) -> Result<Idem, BuildError> {
        let Self { ledger, mut settings, ledger_timeout } = self;
        let lease = settings.lease;
        if lease < MIN_LEASE {
            return Err(BuildError::LeaseTooShort { lease });
        }
        settings.ledger_timeout = match ledger_timeout {
            Some(timeout) if timeout < MIN_LEDGER_TIMEOUT => return Err(BuildError::LedgerTimeoutTooShort { timeout }),
            Some(timeout) if timeout > lease / 2 => {
                return Err(BuildError::LedgerTimeoutOverHalfLease { timeout, lease });
            }
            Some(timeout) => timeout,
            None => DEFAULT_LEDGER_TIMEOUT.min(lease / 2),
        };
        if settings.retention.is_zero() {
            return Err(BuildError::NoRetention);
        }
        Ok(Idem::from_settings(ledger, settings))
    }
}

/// Settings that cannot work together, found by [`Builder::build`]; each says what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The lease is under 3 ms.
    LeaseTooShort {
        /// The lease given.
        lease: Duration,
    },
    /// The ledger timeout is under 1 ms.
    LedgerTimeoutTooShort {
        /// The timeout given.
        timeout: Duration,
    },
    /// The ledger timeout is more than half the lease.
    LedgerTimeoutOverHalfLease {
        /// The timeout given.
        timeout: Duration,
        /// The lease it was checked against.
        lease: Duration,
    },
    /// The retention is zero.
    NoRetention,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeaseTooShort { lease } => write!(
                f,
                "the lease ({lease:?}) must be at least {MIN_LEASE:?}: a running handler renews it every third of \
                 it; give a longer `lease`"
            ),
            Self::LedgerTimeoutTooShort { timeout } => write!(
                f,
                "the ledger timeout ({timeout:?}) must be at least {MIN_LEDGER_TIMEOUT:?}: no statement answers in no \
                 time; give a longer `ledger_timeout`"
            ),
            Self::LedgerTimeoutOverHalfLease { timeout, lease } => write!(
                f,
                "the ledger timeout ({timeout:?}) must be under half the lease ({lease:?}): a claim answered after its \
                 lease ran out could already belong to someone else; give a shorter `ledger_timeout` or a longer \
                 `lease`"
            ),
            Self::NoRetention => f.write_str(
                "the retention must be more than zero: a record kept for no time dedupes nothing, so a recipe without \
                 a window would run every repeat; give a longer `retention`",
            ),
        }
    }
}

impl std::error::Error for BuildError {}
