//! The secrets a handle keys with: the one given in code, else `IDEM_SECRET`, else the
//! ledger's default — and the previous ones still honoured during a rotation. Each is checked
//! against the check value the ledger keeps for its version, so a replica whose bytes differ
//! from the others' cannot serve. Kept once resolved; a failure (an unreadable secret file, a
//! ledger that did not answer) is retried on a later call, after a pause that doubles, and never
//! kept for the handle's life. Without a secret, nothing runs unkeyed.
//!
//! A secret change never silently re-keys live operations: the ledger keeps, per version, until
//! when its operations may still be repeated ([`Ledger::secret_versions`]). A serving handle
//! keeps its current version's time ahead of every record it may make — when it resolves its
//! keyring, and again when a call finds less than half of [`REFRESH`] to spare (one statement per
//! handle that often, never per call; at once for a recipe whose window reaches past it) — and
//! refuses to serve while a version it honours neither as its secret nor as a previous one (nor
//! gave up: [`Builder::retired_secret_version`](super::Builder::retired_secret_version)) has
//! operations that may still be repeated ([`SecretError::Rekeying`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::rejection::Rejection;
use crate::secret::{Secret, SecretError, short_check};

use super::Idem;
use super::time::{clamp, millis};

/// The first pause before a failed resolution is tried again; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two resolutions of a handle's secrets.
const LONGEST_PAUSE: Duration = Duration::from_secs(5);
/// How far past the longest life of a record it may make a serving handle keeps its current
/// secret version's time in the ledger: it writes it again once less than half of this is left.
pub(super) const REFRESH: Duration = Duration::from_secs(3600);

/// The secrets a handle keys with.
#[derive(Debug)]
pub(super) struct Keyring {
    /// New operations are keyed with this one.
    pub(super) current: Secret,
    /// Operations recorded under these are still found.
    pub(super) previous: Vec<Secret>,
    /// Versions given up: their live operations may be re-keyed.
    pub(super) retired: Vec<u32>,
}

impl Keyring {
    pub(super) fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.current).chain(&self.previous)
    }
}

/// A handle's resolution of its secrets: the keyring once it checked out, else the last
/// failure and when to try again.
#[derive(Default)]
pub(super) struct Secrets {
    resolved: OnceLock<Arc<Keyring>>,
    /// Taken by the one resolution under way; the calls that arrive meanwhile take its outcome.
    failure: tokio::sync::Mutex<Option<Failure>>,
    /// The time the ledger keeps for the current version, as this handle last wrote it (ledger
    /// time; 0 before it did).
    live_until: AtomicU64,
    /// Set while a write of that time runs in the background.
    keeping: AtomicBool,
    /// Held while a call keeps the version's time before it runs (a window past the time kept).
    keeping_now: tokio::sync::Mutex<()>,
}

struct Failure {
    error: SecretError,
    /// Not tried again before this.
    retry_at: Instant,
    pause: Duration,
}

/// Whether a resolution may keep its check values in the ledger (a serving replica's first use
/// of a version) or only compare with what is kept (the operator's paths, which never create).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Keep,
    Compare,
}

impl Idem {
    /// The secrets in use: resolved and checked once, retried after a failure.
    pub(super) async fn keyring(&self, check: Check) -> Result<Arc<Keyring>, SecretError> {
        let secrets = &self.inner.secrets;
        if let Some(keyring) = secrets.resolved.get() {
            return Ok(Arc::clone(keyring));
        }
        let mut failure = secrets.failure.lock().await;
        if let Some(keyring) = secrets.resolved.get() {
            return Ok(Arc::clone(keyring));
        }
        if let Some(failed) = &*failure
            && Instant::now() < failed.retry_at
        {
            return Err(failed.error.clone());
        }
        match self.resolve_keyring(check).await {
            Ok(keyring) => {
                *failure = None;
                let keyring = Arc::new(keyring);
                if check == Check::Keep {
                    // Only a keyring whose check values the ledger now keeps is kept: a compared
                    // one may meet a version nobody has used yet, and is checked again next time.
                    let _ = secrets.resolved.set(Arc::clone(&keyring));
                }
                Ok(keyring)
            }
            Err(error) => {
                let pause = failure.as_ref().map_or(FIRST_PAUSE, |failed| (failed.pause * 2).min(LONGEST_PAUSE));
                tracing::error!(%error, retry_in_ms = pause.as_millis(), "no usable idem secret; nothing runs");
                *failure = Some(Failure { error: error.clone(), retry_at: Instant::now() + pause, pause });
                Err(error)
            }
        }
    }

    /// The secrets as configured, not checked against the ledger: the keyring once resolved,
    /// else read anew (for a derivation that runs nothing, [`Admin::key_of`](super::Admin::key_of)).
    pub(super) fn configured_keyring(&self) -> Result<Arc<Keyring>, SecretError> {
        match self.inner.secrets.resolved.get() {
            Some(keyring) => Ok(Arc::clone(keyring)),
            None => self.configured().map(Arc::new),
        }
    }

    fn configured(&self) -> Result<Keyring, SecretError> {
        let settings = &self.inner.settings;
        let (current, mut previous) = match &settings.secret {
            Some(secret) => (secret.clone(), Vec::new()),
            None => match crate::secret::from_env()? {
                Some(configured) => configured,
                None => (self.inner.ledger.default_secret()?, Vec::new()),
            },
        };
        previous.extend(settings.previous.iter().cloned());
        let mut retired = settings.retired.clone();
        if settings.secret.is_none() {
            retired.extend(crate::secret::retired_from_env()?);
        }
        if let Some(version) = retired
            .iter()
            .find(|version| std::iter::once(&current).chain(&previous).any(|secret| secret.version() == **version))
        {
            return Err(SecretError::RetiredInUse { version: *version });
        }
        Ok(Keyring { current, previous, retired })
    }

    /// How long past now a record this handle makes now, under a recipe whose window is
    /// `window` (else the retention), may still answer a repeat: its window, then the unsettled
    /// retention (an unknown or dead operation waits for its operator), then an operator's
    /// verdict's retention or the settle grace, whichever is longer, and a lease.
    fn record_life(&self, window: Option<Duration>) -> u64 {
        let settings = &self.inner.settings;
        let life = window
            .unwrap_or(settings.retention)
            .saturating_add(settings.unsettled_retention)
            .saturating_add(settings.verdict_retention.max(settings.grace))
            .saturating_add(settings.lease);
        millis(life)
    }

    /// Refuses `keyring` if the ledger lists a version it neither keys with nor gave up whose
    /// operations may still be repeated at `now`.
    fn refuse_rekeying(keyring: &Keyring, known: &[(u32, u64)], now: u64) -> Result<(), SecretError> {
        let live: Vec<(u32, u64)> = known
            .iter()
            .filter(|(version, until)| {
                *until > now
                    && !keyring.retired.contains(version)
                    && keyring.all().all(|secret| secret.version() != *version)
            })
            .copied()
            .collect();
        if live.is_empty() { Ok(()) } else { Err(SecretError::Rekeying { current: keyring.current.version(), live }) }
    }

    /// Keeps the current version's time in the ledger ahead of a record a call under a recipe of
    /// `window` may make now: at once if the time kept does not cover it (the call waits, and
    /// is refused if the ledger does not take it), in the background once less than half of
    /// [`REFRESH`] is left to spare.
    pub(super) async fn keep_secret_live(&self, keyring: &Keyring, window: Option<Duration>) -> Result<(), Rejection> {
        let secrets = &self.inner.secrets;
        let now = self.ledger_now();
        let needed = clamp(now.saturating_add(self.record_life(window)));
        let kept = secrets.live_until.load(Ordering::Acquire);
        let wanted = clamp(needed.saturating_add(millis(REFRESH)));
        if needed > kept {
            // One statement for a burst of such calls, not one each: they queue, and the first
            // one's time covers the rest.
            let _one = secrets.keeping_now.lock().await;
            if needed <= secrets.live_until.load(Ordering::Acquire) {
                return Ok(());
            }
            let version = keyring.current.version();
            return match self.inner.ledger.secret_versions(Some((version, wanted))).await {
                Ok(_) => {
                    secrets.live_until.fetch_max(wanted, Ordering::AcqRel);
                    Ok(())
                }
                Err(error) => {
                    tracing::error!(%error, version, "the ledger did not keep the secret version's time; handler not run");
                    Err(Rejection::ledger_unavailable(&error))
                }
            };
        }
        if needed.saturating_add(millis(REFRESH / 2)) > kept && !secrets.keeping.swap(true, Ordering::AcqRel) {
            let (idem, version) = (self.clone(), keyring.current.version());
            tokio::spawn(async move {
                let secrets = &idem.inner.secrets;
                match idem.inner.ledger.secret_versions(Some((version, wanted))).await {
                    Ok(_) => {
                        secrets.live_until.fetch_max(wanted, Ordering::AcqRel);
                    }
                    // Tried again by the next call: the time kept still covers this one.
                    Err(error) => tracing::warn!(%error, version, "could not keep the secret version's time yet"),
                }
                secrets.keeping.store(false, Ordering::Release);
            });
        }
        Ok(())
    }

    async fn resolve_keyring(&self, check: Check) -> Result<Keyring, SecretError> {
        let keyring = self.configured()?;
        for secret in keyring.all() {
            let ours = secret.check_value();
            let offered = (check == Check::Keep).then_some(&ours);
            let kept = self
                .inner
                .ledger
                .secret_check(secret.version(), offered)
                .await
                .map_err(|error| SecretError::Unchecked { detail: error.to_string() })?;
            if let Some(kept) = kept
                && kept != ours
            {
                return Err(SecretError::Mismatch {
                    version: secret.version(),
                    ours: secret.check_short(),
                    kept: short_check(&kept),
                });
            }
        }
        if check == Check::Keep {
            // No version the ledger knows may have live operations this keyring would re-key —
            // read first, so a handle that is refused leaves no time of its own behind; then its
            // own version's time is kept, and read again: a replica that started meanwhile with
            // another version is seen by one of the two.
            let unchecked = |error: crate::ledger::LedgerError| SecretError::Unchecked { detail: error.to_string() };
            let now = self.ledger_now();
            let known = self.inner.ledger.secret_versions(None).await.map_err(unchecked)?;
            Self::refuse_rekeying(&keyring, &known, now)?;
            let until = clamp(now.saturating_add(self.record_life(None)).saturating_add(millis(REFRESH)));
            let version = keyring.current.version();
            let known = self.inner.ledger.secret_versions(Some((version, until))).await.map_err(unchecked)?;
            Self::refuse_rekeying(&keyring, &known, now)?;
            self.inner.secrets.live_until.fetch_max(until, Ordering::AcqRel);
            let previous: Vec<_> =
                keyring.previous.iter().map(|secret| (secret.version(), secret.check_short())).collect();
            tracing::info!(
                version = keyring.current.version(),
                check = %keyring.current.check_short(),
                ?previous,
                "keying with the idem secret (every replica must log the same check value for a version)"
            );
        }
        Ok(keyring)
    }
}

/// The refusal of a call on a handle without a usable secret: nothing runs unkeyed.
pub(super) fn no_secret(error: &SecretError) -> Rejection {
    Rejection::ledger_unavailable(format!("no usable idem secret: {error}"))
}
