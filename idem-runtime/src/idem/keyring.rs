//! The secrets a handle keys with: the one given in code, else `IDEM_SECRET`, else the
//! ledger's default — and the previous ones still honoured during a rotation. Each is checked
//! against the check value the ledger keeps for its version, so a replica whose bytes differ
//! from the others' cannot serve. Kept once resolved; a failure (an unreadable secret file, a
//! ledger that did not answer) is retried on a later call, after a pause that doubles, and never
//! kept for the handle's life. Without a secret, nothing runs unkeyed.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::rejection::Rejection;
use crate::secret::{Secret, SecretError, short_check};

use super::Idem;

/// The first pause before a failed resolution is tried again; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two resolutions of a handle's secrets.
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// The secrets a handle keys with.
#[derive(Debug)]
pub(super) struct Keyring {
    /// New operations are keyed with this one.
    pub(super) current: Secret,
    /// Operations recorded under these are still found.
    pub(super) previous: Vec<Secret>,
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
    /// Whether this handle has a secret to key operations with, and whether it is the one the
    /// ledger has seen under its version; call it at startup so a missing, malformed or
    /// mismatched secret stops the server instead of refusing every call. The first replica to
    /// use a version keeps its check value in the ledger; every other compares with it.
    ///
    /// # Errors
    /// No secret is configured and the ledger has no default (PostgreSQL, MySQL), or a
    /// configured one is malformed, or the SQLite default's secret file cannot be used, or its
    /// bytes differ from those the ledger has seen under its version
    /// ([`SecretError::Mismatch`]), or the ledger did not answer ([`SecretError::Unchecked`]).
    pub async fn check_secret(&self) -> Result<(), SecretError> {
        self.keyring(Check::Keep).await.map(|_| ())
    }

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
        let (current, mut previous) = match &self.inner.settings.secret {
            Some(secret) => (secret.clone(), Vec::new()),
            None => match crate::secret::from_env()? {
                Some(configured) => configured,
                None => (self.inner.ledger.default_secret()?, Vec::new()),
            },
        };
        previous.extend(self.inner.settings.previous.iter().cloned());
        Ok(Keyring { current, previous })
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
