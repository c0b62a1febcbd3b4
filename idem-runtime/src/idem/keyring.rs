//! The secrets a handle keys with: the one given in code, else `IDEM_SECRET`, else the
//! ledger's default — and the previous ones still honoured during a rotation. Resolved once
//! per configuration; without one, nothing runs unkeyed.

use std::sync::Arc;

use crate::rejection::Rejection;
use crate::secret::{Secret, SecretError};

use super::Idem;

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

impl Idem {
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
    pub(super) fn keyring(&self) -> Result<Arc<Keyring>, SecretError> {
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
}

/// The refusal of a call on a handle without a usable secret: nothing runs unkeyed.
pub(super) fn no_secret(error: &SecretError) -> Rejection {
    Rejection::ledger_unavailable(format!("no usable idem secret: {error}"))
}
