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
//! secret (`IDEM_SECRET_PREVIOUS`, [`Builder::previous_secret`](crate::Builder::previous_secret))
//! until the longest window has run. A call whose operation was recorded under a previous
//! secret is answered from that record (replayed, in flight, unknown), never run a second time.
//!
//! A secret change never silently re-keys live operations: the ledger keeps, per version, until
//! when operations keyed under it may still be repeated (each serving handle keeps its current
//! version's time ahead), and a handle that honours that version neither as its secret nor as a
//! previous one refuses to serve until then ([`SecretError::Rekeying`]) — unless the version is
//! named in [`RETIRED_VERSIONS_ENV`]
//! ([`Builder::retired_secret_version`](crate::Builder::retired_secret_version)): re-keying
//! accepted, repeats of its operations run again.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use sha2::{Digest, Sha256};

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

const BLOCK: usize = 64;

/// HMAC-SHA256 (RFC 2104) with the key's padded blocks absorbed once, so each MAC costs two
/// hash finalisations and no key schedule. The hash is driven block by block from the two
/// absorbed states: a MAC of a short message is exactly two compressions, with no buffering,
/// allocation or state copying beyond 32 bytes (keys, fingerprints and argument tags take a
/// dozen MACs per call).
#[derive(Clone)]
pub(crate) struct Hmac {
    inner: [u32; 8],
    outer: [u32; 8],
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_INIT: [u32; 8] =
    [0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19];

impl Hmac {
    pub(crate) fn new(key: &[u8]) -> Self {
        let mut block = [0u8; BLOCK];
        if key.len() > BLOCK {
            block[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let pad = |byte: u8| {
            let mut state = SHA256_INIT;
            sha2::block_api::compress256(&mut state, &[block.map(|b| b ^ byte)]);
            state
        };
        Self { inner: pad(0x36), outer: pad(0x5c) }
    }

    /// The MAC of the concatenation of `parts`.
    #[cfg(test)]
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.mac_after(&[], parts)
    }

    /// The MAC of the concatenation of `head` and `parts`.
    fn mac_after(&self, head: &[&[u8]], parts: &[&[u8]]) -> [u8; 32] {
        let mut inner = Stream::new(self.inner);
        for part in head.iter().chain(parts) {
            inner.update(part);
        }
        let mut outer = Stream::new(self.outer);
        outer.update(&inner.finish());
        outer.finish()
    }
}

/// SHA-256 continued from a state that has absorbed one block (the padded key).
struct Stream {
    state: [u32; 8],
    block: [u8; BLOCK],
    filled: usize,
    /// Bytes absorbed, the key's block included.
    length: u64,
}

impl Stream {
    const fn new(state: [u32; 8]) -> Self {
        Self { state, block: [0; BLOCK], filled: 0, length: BLOCK as u64 }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.length += data.len() as u64;
        while !data.is_empty() {
            let take = (BLOCK - self.filled).min(data.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == BLOCK {
                sha2::block_api::compress256(&mut self.state, &[self.block]);
                self.filled = 0;
            }
        }
    }

    /// FIPS 180-4 padding: `0x80`, zeros, and the length in bits, big-endian.
    fn finish(mut self) -> [u8; 32] {
        self.block[self.filled] = 0x80;
        self.block[self.filled + 1..].fill(0);
        if self.filled + 1 > BLOCK - 8 {
            sha2::block_api::compress256(&mut self.state, &[self.block]);
            self.block = [0; BLOCK];
        }
        self.block[BLOCK - 8..].copy_from_slice(&(self.length * 8).to_be_bytes());
        sha2::block_api::compress256(&mut self.state, &[self.block]);
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.state) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }
}

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
    fn in_env(self, name: &str) -> Self {
        Self::In { place: format!("the environment variable {name}"), error: Box::new(self) }
    }

    fn in_file(self, path: &Path) -> Self {
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

/// The short form of a check value ([`Secret::check_short`]).
#[must_use]
pub(crate) fn short_check(check: &[u8; 32]) -> String {
    hex(&check[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(text: &str) -> Vec<u8> {
        text.as_bytes().chunks(2).map(|pair| (hex_value(pair[0]).unwrap() << 4) | hex_value(pair[1]).unwrap()).collect()
    }

    /// RFC 4231, test cases 1–4, 6 and 7 (case 5 truncates the output, which we never do).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        let long_key = vec![0xaa; 131];
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (vec![0x0b; 20], b"Hi There".to_vec(), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (vec![0xaa; 20], vec![0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            (
                unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                long_key.clone(),
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                long_key,
                b"This is a test using a larger than block-size key and a larger than block-size data. The key \
                  needs to be hashed before being used by the HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (key, data, expected) in cases {
            assert_eq!(hex(&Hmac::new(&key).mac(&[&data])), expected);
            // Split input gives the same MAC.
            let (a, b) = data.split_at(data.len() / 2);
            assert_eq!(hex(&Hmac::new(&key).mac(&[a, b])), expected);
        }
    }

    /// Every message length around the padding and block boundaries, split anywhere, against
    /// HMAC written out with the `Digest` API.
    #[test]
    fn hmac_matches_the_digest_api_at_every_length() {
        let reference = |key: &[u8], data: &[u8]| {
            let mut block = [0u8; BLOCK];
            block[..key.len()].copy_from_slice(key);
            let inner = Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(data).finalize();
            Sha256::new().chain_update(block.map(|b| b ^ 0x5c)).chain_update(inner).finalize().to_vec()
        };
        let key = [0x0b_u8; 40];
        let hmac = Hmac::new(&key);
        let data: Vec<u8> = (0..300_u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in 0..data.len() {
            let message = &data[..len];
            let expected = reference(&key, message);
            assert_eq!(hmac.mac(&[message]).to_vec(), expected, "length {len}");
            let split = len / 3;
            assert_eq!(hmac.mac(&[&message[..split], &[], &message[split..]]).to_vec(), expected, "length {len}");
        }
    }

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
