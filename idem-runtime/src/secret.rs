//! The server secret every key, fingerprint, argument tag and ref is keyed with (HMAC-SHA256,
//! RFC 2104), so a reader of the ledger, a backup or the logs cannot recover low-entropy
//! arguments or compute refs offline.
//!
//! A secret is at least 32 random bytes and carries a **version**, which is part of the key
//! material. Its text form — the `IDEM_SECRET` environment variable, the file the embedded
//! SQLite default keeps beside its ledger — is `<version>:<hex bytes>`, e.g.
//! `IDEM_SECRET=1:$(openssl rand -hex 32)`.
//!
//! Rotation: configure the new secret as the current one and keep the old one as a previous
//! secret (`IDEM_SECRET_PREVIOUS`, [`Builder::previous_secret`](crate::settings::Builder::previous_secret))
//! until the longest window has run. A call whose operation was recorded under a previous
//! secret is answered from that record (replayed, in flight, unknown), never run a second time.
//!
//! A secret change never silently re-keys live operations: the ledger keeps, per version, until
//! when operations keyed under it may still be repeated (each serving handle keeps its current
//! version's time ahead), and a handle that honours that version neither as its secret nor as a
//! previous one refuses to serve until then ([`SecretError::Rekeying`]) — unless the version is
//! named in [`RETIRED_VERSIONS_ENV`]
//! ([`Builder::retired_secret_version`](crate::settings::Builder::retired_secret_version)): re-keying
//! accepted, repeats of its operations run again.

mod error;
mod hmac;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

pub use error::SecretError;
use hmac::Hmac;

use crate::bytes::{hex, hex_value};

/// The environment variable holding the current secret: `<version>:<hex>`.
pub const SECRET_ENV: &str = "IDEM_SECRET";
/// The environment variable holding secrets still honoured for operations recorded under them,
/// comma-separated, each `<version>:<hex>`.
pub const PREVIOUS_SECRETS_ENV: &str = "IDEM_SECRET_PREVIOUS";
/// The environment variable naming secret versions given up (comma-separated, e.g. `1,2`): a
/// handle serves even while operations keyed under them may still be repeated, accepting that
/// such a repeat gets a new key and runs again (re-keying). For a version dropped after its
/// longest window, or one a ledger shares with another service; never needed once its time in
/// the ledger has passed.
pub const RETIRED_VERSIONS_ENV: &str = "IDEM_SECRET_RETIRED";
/// The fewest bytes a secret may have.
pub const MIN_SECRET_BYTES: usize = 32;

/// One version of the server secret. Its bytes are not kept, only the HMAC state derived from
/// them, and never printed.
#[derive(Clone)]
pub struct Secret {
    version: u32,
    hmac: Hmac,
    /// Tags of names computed under this secret, shared by its clones.
    remembered: Arc<Remembered>,
}

/// What a secret remembers of the names it tagged: the same argument names and the same callers
/// come with call after call. Each map is bounded: names come from callers.
#[derive(Default)]
struct Remembered {
    /// Argument names → the 2-byte name half of their tags.
    names: RwLock<HashMap<Box<str>, [u8; 2]>>,
    /// Tenant names → their tag, and their subjects' tags.
    scopes: RwLock<ScopeTags>,
    /// Who and what an operation was (see [`Secret::sealed_label`]) → its sealed label.
    labels: RwLock<HashMap<Box<[u8]>, SealedLabel>>,
}

#[derive(Default)]
struct ScopeTags {
    by_tenant: HashMap<Box<str>, TenantTags>,
    /// Tags kept, tenants' and subjects' together.
    kept: usize,
}

struct TenantTags {
    tag: [u8; 8],
    subjects: HashMap<Box<str>, [u8; 8]>,
}

/// The most tenant and subject tags a secret remembers, in all.
const SCOPE_TAGS_KEPT: usize = 4096;

/// A sealed label, shared by the calls that have it.
type SealedLabel = Arc<[u8]>;

/// The most sealed labels a secret remembers: one per tool, namespace and caller.
const LABELS_KEPT: usize = 4096;

/// The most argument names whose tags a secret remembers. A tool's argument names repeat on
/// every call, but they come from callers, so what is kept is bounded.
const NAME_TAGS_KEPT: usize = 1024;

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret").field("version", &self.version).finish_non_exhaustive()
    }
}

impl Secret {
    /// Version `version` (1 or more) of the secret, from `bytes` (at least
    /// [`MIN_SECRET_BYTES`] random bytes).
    ///
    /// # Errors
    /// A version of 0, or fewer than 32 bytes.
    pub fn new(version: u32, bytes: &[u8]) -> Result<Self, SecretError> {
        if version == 0 {
            return Err(SecretError::Malformed { why: "the version must be 1 or more".to_owned() });
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { bytes: bytes.len() });
        }
        Ok(Self { version, hmac: Hmac::new(bytes), remembered: Arc::default() })
    }

    /// A new random secret (32 bytes from the operating system) and its text form.
    ///
    /// # Panics
    /// If the operating system has no randomness to give.
    #[must_use]
    pub fn generate(version: u32) -> (Self, String) {
        let bytes: [u8; MIN_SECRET_BYTES] = crate::bytes::random();
        let text = format!("{}:{}", version.max(1), hex(&bytes));
        (Self { version: version.max(1), hmac: Hmac::new(&bytes), remembered: Arc::default() }, text)
    }

    /// Parses the text form `<version>:<hex bytes>` (surrounding whitespace ignored).
    ///
    /// # Errors
    /// Anything else, or fewer than 32 bytes.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        let malformed = || SecretError::Malformed {
            why: "expected `<version>:<hex bytes>`, e.g. `1:` followed by the output of `openssl rand -hex 32`"
                .to_owned(),
        };
        let (version, digits) = text.split_once(':').ok_or_else(malformed)?;
        let version: u32 = version.trim().parse().map_err(|_| malformed())?;
        let digits = digits.trim();
        if digits.len() % 2 != 0 {
            return Err(malformed());
        }
        let bytes = digits
            .as_bytes()
            .chunks(2)
            .map(|pair| Some((hex_value(pair[0])? << 4) | hex_value(pair[1])?))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(malformed)?;
        Self::new(version, &bytes)
    }

    /// The version, part of every key derived under this secret.
    #[must_use]
    pub const fn version(&self) -> u32 {
        self.version
    }

    /// This secret's check value: a keyed digest that tells two secrets of one version apart
    /// without revealing either. A ledger keeps the first it sees per version, and every
    /// replica (and the operator's CLI) compares its own against it.
    #[must_use]
    pub fn check_value(&self) -> [u8; 32] {
        self.mac("idem/v2/secret-check", &[])
    }

    /// The check value's short form (its first 4 bytes in hex), for logs and messages: the
    /// same on every replica that has the same secret.
    #[must_use]
    pub fn check_short(&self) -> String {
        short_check(&self.check_value())
    }

    /// HMAC-SHA256 under this secret of `label`, a NUL, and `parts`. Each use of the secret has
    /// its own label, so a value computed for one use never stands for another.
    pub(crate) fn mac(&self, label: &str, parts: &[&[u8]]) -> [u8; 32] {
        self.hmac.mac_after(&[label.as_bytes(), b"\0"], parts)
    }

    /// The first two bytes of `mac("idem/v2/argument-name", name)`: the name half of an argument's
    /// tag in a fingerprint. Computed once per name (up to [`NAME_TAGS_KEPT`] names), as the
    /// same names come with every call.
    pub(crate) fn argument_name_tag(&self, name: &str) -> [u8; 2] {
        let known = self.remembered.names.read().unwrap_or_else(PoisonError::into_inner).get(name).copied();
        if let Some(tag) = known {
            return tag;
        }
        let mac = self.mac("idem/v2/argument-name", &[name.as_bytes()]);
        let tag = [mac[0], mac[1]];
        let mut tags = self.remembered.names.write().unwrap_or_else(PoisonError::into_inner);
        if tags.len() < NAME_TAGS_KEPT {
            tags.insert(name.into(), tag);
        }
        tag
    }

    /// The label `seal()` seals under this secret for who and what an operation was, `who` (the
    /// parts it is sealed of, framed so that no two lists of parts share it: see
    /// `ledger::label`), sealed once per `who` (up to [`LABELS_KEPT`] of them): sealing is
    /// deterministic, and the same tool is called by the same caller call after call.
    pub(crate) fn sealed_label(&self, who: &[u8], seal: impl FnOnce() -> Vec<u8>) -> Arc<[u8]> {
        let known = self.remembered.labels.read().unwrap_or_else(PoisonError::into_inner).get(who).cloned();
        if let Some(sealed) = known {
            return sealed;
        }
        let sealed: Arc<[u8]> = seal().into();
        let mut labels = self.remembered.labels.write().unwrap_or_else(PoisonError::into_inner);
        if labels.len() < LABELS_KEPT {
            labels.insert(who.into(), Arc::clone(&sealed));
        }
        sealed
    }

    /// The tag `tag()` computes for `tenant` (with `subject`: for that subject of it), computed
    /// once per name under this secret (up to [`SCOPE_TAGS_KEPT`] in all): every call states its
    /// caller's tags.
    pub(crate) fn scope_tag(&self, tenant: &str, subject: Option<&str>, tag: impl FnOnce() -> [u8; 8]) -> [u8; 8] {
        let known = {
            let scopes = self.remembered.scopes.read().unwrap_or_else(PoisonError::into_inner);
            scopes.by_tenant.get(tenant).and_then(|tags| match subject {
                None => Some(tags.tag),
                Some(subject) => tags.subjects.get(subject).copied(),
            })
        };
        if let Some(known) = known {
            return known;
        }
        let computed = tag();
        let mut scopes = self.remembered.scopes.write().unwrap_or_else(PoisonError::into_inner);
        if scopes.kept >= SCOPE_TAGS_KEPT {
            return computed;
        }
        let ScopeTags { by_tenant, kept } = &mut *scopes;
        match subject {
            None => {
                if !by_tenant.contains_key(tenant) {
                    by_tenant.insert(tenant.into(), TenantTags { tag: computed, subjects: HashMap::new() });
                    *kept += 1;
                }
            }
            // A subject's tag is kept under its tenant's (which a call states first).
            Some(subject) => {
                if let Some(tags) = by_tenant.get_mut(tenant)
                    && tags.subjects.insert(subject.into(), computed).is_none()
                {
                    *kept += 1;
                }
            }
        }
        computed
    }

    /// Reads the secret kept in `path`, or makes one and keeps it there, readable by the owner
    /// only. Two processes starting together end up with the same secret: it is written to a
    /// temporary file and linked into place only if nothing is there yet.
    ///
    /// # Errors
    /// The file cannot be read or written, or holds something that is not a secret.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        let io = |error: std::io::Error| SecretError::Io { path: path.to_owned(), error: std::sync::Arc::new(error) };
        match std::fs::read_to_string(path) {
            Ok(text) => return Self::parse(&text).map_err(|error| error.in_file(path)),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(io(error)),
            Err(_) => {}
        }
        let (_, text) = Self::generate(1);
        let temporary = path.with_extension(format!("tmp{}", hex(&crate::bytes::random::<8>())));
        write_private(&temporary, &format!("{text}\n")).map_err(io)?;
        let linked = std::fs::hard_link(&temporary, path);
        let _ = std::fs::remove_file(&temporary);
        match linked {
            Ok(()) => tracing::warn!(
                path = %path.display(),
                "generated a new idem secret beside the ledger: operations keyed under any other secret are not \
                 found under it (their repeats run again); back it up, apart from the ledger"
            ),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io(error)),
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(&text).map_err(|error| error.in_file(path))
    }
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// The current secret and the previous ones still honoured, read from [`SECRET_ENV`] and
/// [`PREVIOUS_SECRETS_ENV`]; `None` when [`SECRET_ENV`] is unset or empty.
///
/// # Errors
/// A variable that is set but malformed.
pub fn from_env() -> Result<Option<(Secret, Vec<Secret>)>, SecretError> {
    let Some(current) = std::env::var(SECRET_ENV).ok().filter(|text| !text.trim().is_empty()) else {
        return Ok(None);
    };
    let current = Secret::parse(&current).map_err(|error| error.in_env(SECRET_ENV))?;
    let previous = std::env::var(PREVIOUS_SECRETS_ENV).unwrap_or_default();
    let previous = previous
        .split(',')
        .filter(|text| !text.trim().is_empty())
        .map(|text| Secret::parse(text).map_err(|error| error.in_env(PREVIOUS_SECRETS_ENV)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((current, previous)))
}

/// The secret versions named in [`RETIRED_VERSIONS_ENV`], comma-separated; none when it is unset.
///
/// # Errors
/// Anything in it that is not a version (a number from 1).
pub fn retired_from_env() -> Result<Vec<u32>, SecretError> {
    let text = std::env::var(RETIRED_VERSIONS_ENV).unwrap_or_default();
    text.split(',')
        .map(str::trim)
        .filter(|version| !version.is_empty())
        .map(|version| match version.parse::<u32>() {
            Ok(version) if version > 0 => Ok(version),
            _ => Err(SecretError::Malformed {
                why: format!("`{version}` is not a secret version: name versions, comma-separated (e.g. `1,2`)"),
            }
            .in_env(RETIRED_VERSIONS_ENV)),
        })
        .collect()
}

/// A process-wide random secret, for ledgers that forget everything when the process exits.
pub(crate) fn ephemeral() -> Secret {
    static EPHEMERAL: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();
    EPHEMERAL.get_or_init(|| Secret::generate(1).0).clone()
}

/// The short form of a check value ([`Secret::check_short`]).
#[must_use]
pub(crate) fn short_check(check: &[u8; 32]) -> String {
    hex(&check[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remembered name tag is the tag: on first use, on reuse, from a clone, and past the
    /// bound on what is kept.
    #[test]
    fn name_tags_are_remembered_exactly() {
        let secret = Secret::new(1, &[7; 32]).unwrap();
        let fresh = |name: &str| {
            let mac = secret.mac("idem/v2/argument-name", &[name.as_bytes()]);
            [mac[0], mac[1]]
        };
        let names: Vec<String> = (0..NAME_TAGS_KEPT + 10).map(|i| format!("name-{i}")).collect();
        for _ in 0..2 {
            for name in &names {
                assert_eq!(secret.argument_name_tag(name), fresh(name), "{name}");
                assert_eq!(secret.clone().argument_name_tag(name), fresh(name), "{name}");
            }
        }
        assert_eq!(secret.remembered.names.read().unwrap().len(), NAME_TAGS_KEPT);
        let other = Secret::new(1, &[8; 32]).unwrap();
        assert_ne!(other.argument_name_tag("name-0"), secret.argument_name_tag("name-0"));
    }

    /// A remembered tenant or subject tag is the tag, for every tenant and subject, past the
    /// bound on what is kept too.
    #[test]
    fn scope_tags_are_remembered_exactly() {
        use crate::scope::{SubjectTag, TenantTag};
        let secret = Secret::new(1, &[7; 32]).unwrap();
        let other = Secret::new(1, &[8; 32]).unwrap();
        let fresh_tenant = |tenant: &str| {
            let mac = secret.mac("idem/v2/tenant", &[tenant.as_bytes()]);
            TenantTag::from_bytes(mac[..8].try_into().unwrap())
        };
        let fresh_subject = |tenant: &str, subject: &str| {
            let mac = secret.mac("idem/v2/subject", &[tenant.as_bytes(), b"\0", subject.as_bytes()]);
            mac[..8].to_vec()
        };
        for _ in 0..2 {
            for t in 0..(SCOPE_TAGS_KEPT / 40) {
                let tenant = format!("tenant-{t}");
                assert_eq!(TenantTag::of(&secret, &tenant), fresh_tenant(&tenant), "{tenant}");
                for s in 0..50 {
                    let subject = format!("subject-{s}");
                    let tag = SubjectTag::of(&secret.clone(), &tenant, &subject);
                    assert_eq!(tag.as_bytes().to_vec(), fresh_subject(&tenant, &subject), "{tenant}/{subject}");
                    assert_ne!(tag, SubjectTag::of(&other, &tenant, &subject));
                }
            }
        }
        let scopes = secret.remembered.scopes.read().unwrap();
        let kept: usize = scopes.by_tenant.values().map(|t| 1 + t.subjects.len()).sum();
        assert_eq!((kept, scopes.kept), (SCOPE_TAGS_KEPT, SCOPE_TAGS_KEPT), "kept up to the bound, and counted");
    }

    #[test]
    fn the_text_form_round_trips_and_refuses_short_or_malformed_secrets() {
        let (secret, text) = Secret::generate(3);
        let parsed = Secret::parse(&text).unwrap();
        assert_eq!(parsed.version(), 3);
        assert_eq!(parsed.mac("x", &[b"y"]), secret.mac("x", &[b"y"]));
        assert_eq!(Secret::parse(&format!("1:{}", "ab".repeat(31))).unwrap_err(), SecretError::TooShort { bytes: 31 });
        assert!(matches!(Secret::parse("abcdef"), Err(SecretError::Malformed { .. })));
        assert!(matches!(Secret::parse(&format!("0:{}", "ab".repeat(32))), Err(SecretError::Malformed { .. })));
        assert!(matches!(Secret::parse(&format!("1:{}zz", "ab".repeat(32))), Err(SecretError::Malformed { .. })));
        assert!(!format!("{secret:?}").contains(&text[2..10]), "Debug never shows the bytes");
    }

    #[cfg(unix)]
    #[test]
    fn a_generated_secret_file_is_owner_only_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("idem-secret-{}", hex(&crate::bytes::random::<8>())));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.sqlite3.secret");
        let first = Secret::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Secret::load_or_create(&path).unwrap();
        assert_eq!(first.mac("k", &[b"v"]), again.mac("k", &[b"v"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
