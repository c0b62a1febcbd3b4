//! Why there is no usable secret (`SecretError`): each case in words, with what to change.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{MIN_SECRET_BYTES, PREVIOUS_SECRETS_ENV, RETIRED_VERSIONS_ENV, SECRET_ENV};

/// Why there is no usable secret. Two errors are equal when they say the same thing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SecretError {
    /// None is configured, and the ledger is shared by replicas, which must share one.
    Required {
        /// The ledger, in words.
        ledger: String,
    },
    /// Fewer than [`MIN_SECRET_BYTES`] bytes.
    TooShort {
        /// How many there were.
        bytes: usize,
    },
    /// Not `<version>:<hex bytes>`.
    Malformed {
        /// What is wrong.
        why: String,
    },
    /// The secret file cannot be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        error: std::sync::Arc<std::io::Error>,
    },
    /// This secret's bytes are not those the ledger has seen under its version: another
    /// replica keys with other bytes, and the two would never find each other's operations.
    Mismatch {
        /// The version both claim.
        version: u32,
        /// This secret's check value, short form.
        ours: String,
        /// The one the ledger keeps for the version, short form.
        kept: String,
    },
    /// The secret could not be checked against the ledger's check value (the ledger did not
    /// answer): nothing runs until it can be.
    Unchecked {
        /// The ledger's words.
        detail: String,
    },
    /// Operations keyed under versions this handle honours neither as its secret nor as a
    /// previous one may still be repeated: serving would give their repeats new keys, and they
    /// would run again. Keep those secrets as previous ones until the time given, or name the
    /// versions as retired to accept re-keying.
    Rekeying {
        /// The version this handle keys new operations with.
        current: u32,
        /// Each such version, with the time (the ledger's, in milliseconds since the Unix epoch)
        /// until which its operations may be repeated.
        live: Vec<(u32, u64)>,
    },
    /// A version named retired is this handle's secret or a previous one.
    RetiredInUse {
        /// The version.
        version: u32,
    },
    /// A malformed secret in an environment variable or file.
    In {
        /// Where it was.
        place: String,
        /// What is wrong with it.
        error: Box<SecretError>,
    },
}

impl SecretError {
    pub(super) fn in_env(self, name: &str) -> Self {
        Self::In { place: format!("the environment variable {name}"), error: Box::new(self) }
    }

    pub(super) fn in_file(self, path: &Path) -> Self {
        Self::In { place: format!("the secret file {}", path.display()), error: Box::new(self) }
    }
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Required { ledger } => write!(
                f,
                "no idem secret is configured, and {ledger} is shared by replicas, which must all use the same \
                 one: set {SECRET_ENV}=1:<hex> with at least {MIN_SECRET_BYTES} random bytes (e.g. \
                 `1:$(openssl rand -hex 32)`), the same on every replica, or pass it in code with \
                 `Idem::builder(…).secret(…)`"
            ),
            Self::TooShort { bytes } => write!(
                f,
                "the idem secret has {bytes} bytes; it needs at least {MIN_SECRET_BYTES} random bytes \
                 (`openssl rand -hex 32`)"
            ),
            Self::Malformed { why } => write!(f, "the idem secret is malformed: {why}"),
            Self::Io { path, error } => {
                write!(f, "cannot read or create the idem secret file {}: {error}", path.display())
            }
            Self::Mismatch { version, ours, kept } => write!(
                f,
                "this idem secret is not the one the ledger has seen under version {version} (check value {ours} \
                 here, {kept} in the ledger): every replica must use the same bytes for a version — copy \
                 {SECRET_ENV} from a running replica, or give a new secret a new version and keep the old one in \
                 {PREVIOUS_SECRETS_ENV}"
            ),
            Self::Unchecked { detail } => write!(
                f,
                "the idem secret could not be checked against the ledger's check value ({detail}); nothing runs \
                 until the ledger answers"
            ),
            Self::Rekeying { current, live } => {
                let versions = |separator: &str| {
                    live.iter().map(|(version, _)| version.to_string()).collect::<Vec<_>>().join(separator)
                };
                let until = live
                    .iter()
                    .map(|(version, until)| format!("version {version} until {}", crate::clock::rfc3339(*until)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let which = if live.len() == 1 { "version" } else { "versions" };
                write!(
                    f,
                    "this idem handle keys with secret version {current}, but operations keyed under {which} {} may \
                     still be repeated ({until}, ledger time): with that secret kept neither as the secret nor as a \
                     previous one, each repeat would get a new key and run again. Keep the old secret in \
                     {PREVIOUS_SECRETS_ENV} ({PREVIOUS_SECRETS_ENV}=<version>:<hex>, or `Builder::previous_secret`) \
                     until then, or accept that their repeats run again: {RETIRED_VERSIONS_ENV}={} (or \
                     `Builder::retired_secret_version`)",
                    versions(", "),
                    versions(",")
                )
            }
            Self::RetiredInUse { version } => write!(
                f,
                "secret version {version} is named retired ({RETIRED_VERSIONS_ENV}, or \
                 `Builder::retired_secret_version`), but this handle keys with it, as its secret or a previous one: \
                 retire only a version it no longer uses"
            ),
            Self::In { place, error } => write!(f, "{place}: {error}"),
        }
    }
}

impl std::error::Error for SecretError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { error, .. } => Some(&**error),
            Self::In { error, .. } => Some(&**error),
            Self::Required { .. }
            | Self::TooShort { .. }
            | Self::Malformed { .. }
            | Self::Mismatch { .. }
            | Self::Unchecked { .. }
            | Self::Rekeying { .. }
            | Self::RetiredInUse { .. } => None,
        }
    }
}

impl PartialEq for SecretError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Required { ledger: a }, Self::Required { ledger: b }) => a == b,
            (Self::TooShort { bytes: a }, Self::TooShort { bytes: b }) => a == b,
            (Self::Malformed { why: a }, Self::Malformed { why: b }) => a == b,
            (Self::Io { path: a, error: x }, Self::Io { path: b, error: y }) => {
                a == b && x.kind() == y.kind() && x.to_string() == y.to_string()
            }
            (Self::In { place: a, error: x }, Self::In { place: b, error: y }) => a == b && x == y,
            (Self::Mismatch { version: a, ours: x, kept: k }, Self::Mismatch { version: b, ours: y, kept: l }) => {
                a == b && x == y && k == l
            }
            (Self::Unchecked { detail: a }, Self::Unchecked { detail: b }) => a == b,
            (Self::Rekeying { current: a, live: x }, Self::Rekeying { current: b, live: y }) => a == b && x == y,
            (Self::RetiredInUse { version: a }, Self::RetiredInUse { version: b }) => a == b,
            _ => false,
        }
    }
}

impl Eq for SecretError {}
