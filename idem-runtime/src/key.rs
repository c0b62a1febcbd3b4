//! Keys, refs and fingerprints: what makes two calls "the same operation".
//!
//! Key material is one canonical JSON array,
//! `["idem/v2", secret version, namespace, scope, tool, selected]`, keyed with HMAC-SHA256 under
//! the server's [`Secret`]. Framing the parts as JSON (rather than concatenating strings) is what
//! keeps `("a", "bc")` and `("ab", "c")` apart; the secret is what keeps a reader of the ledger or
//! the logs from computing keys, refs, fingerprints or argument tags of guessed arguments.
//!
//! `idem/v1` keys were plain SHA-256 of public material; v2 keys are keyed and carry the
//! namespace, so records written by v1 are never found by v2 (they expire with their retention).

use std::fmt;

use crate::bytes::{hex_value, write_hex};
use crate::canonical::{self, CanonicalError, Members};
use crate::scope::Scope;
use crate::secret::Secret;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

// The tags live with the scope they are computed from; idem.rs and ledger/ still name them by
// this path.
pub(crate) use crate::scope::{SubjectTag, TenantTag};

/// The version tag at the head of all key material; bumping it re-keys every operation.
pub const KEY_VERSION: &str = "idem/v2";

/// Hex digits in a [`Ref`]: 64 bits, unique in practice within one tenant's retention.
pub const REF_HEX_LEN: usize = 16;

/// The idempotency key of one operation: HMAC-SHA256 under the server secret of its canonical
/// key material.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; 32]);

impl Key {
    /// Derives, under `secret`, the key for `tool` of `namespace` called under `scope` with the
    /// `selected` arguments. (To compute the key a handle would use, call
    /// [`Admin::key_of`](crate::admin::Admin::key_of).)
    ///
    /// `selected` maps each key path of the recipe (e.g. `"customer.id"`) to its value.
    pub fn derive(
        secret: &Secret,
        namespace: &str,
        scope: &Scope,
        tool: &str,
        selected: &Map<String, Value>,
    ) -> Result<Self, CanonicalError> {
        with_scratch(|material| {
            write_material_head(material, secret, namespace, scope, tool)?;
            write_object(selected.iter(), material, |_, _| {})?;
            material.push(b']');
            Ok(Self(secret.mac("idem/v2/key", &[material])))
        })
    }

    /// [`Key::derive`] from the `selected` values already in canonical form: the same key for
    /// the same values, with nothing left to refuse in them.
    ///
    /// # Errors
    /// The scope's task or conversation id has no canonical form.
    pub fn derive_members(
        secret: &Secret,
        namespace: &str,
        scope: &Scope,
        tool: &str,
        selected: &Members,
    ) -> Result<Self, CanonicalError> {
        with_scratch(|material| {
            write_material_head(material, secret, namespace, scope, tool)?;
            selected.write_object(material, |_, _| true, |_, _| {});
            material.push(b']');
            Ok(Self(secret.mac("idem/v2/key", &[material])))
        })
    }

    /// Wraps 32 raw bytes (as stored by a ledger).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw 32 bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The short reference given to callers and accepted by status lookups.
    #[must_use]
    pub fn reference(&self) -> Ref {
        let mut prefix = [0u8; REF_HEX_LEN / 2];
        prefix.copy_from_slice(&self.0[..REF_HEX_LEN / 2]);
        Ref(prefix)
    }

    /// The key to forward to the system that owns the side effect for the operation of this key
    /// whose window ends at `window_end`: 64 hex digits, what
    /// [`Operation::idempotency_key`](crate::Operation::idempotency_key) gives the handler and what
    /// `idem show` prints. One operation, one value: a takeover forwards the same, a new window a
    /// new one.
    #[must_use]
    pub fn idempotency_key(&self, window_end: u64) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"idem/v2/operation\0");
        hasher.update(self.0);
        hasher.update(window_end.to_be_bytes());
        crate::bytes::hex(&hasher.finalize())
    }
}

impl fmt::Display for Key {
    /// Lower-case hex, 64 characters: suitable as an `Idempotency-Key` header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(&self.0, f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// The short, shareable reference of an operation: the first 8 bytes of its key, in hex.
///
/// A ref is what an agent is told ("in flight, ref 3f2a…") and what it hands to the status tool.
/// It is not an authorisation: status lookups are always scoped to the caller. Being a prefix of a
/// keyed key, it cannot be computed (or confirmed) from guessed arguments without the secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ref([u8; REF_HEX_LEN / 2]);

impl Ref {
    /// The raw prefix bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; REF_HEX_LEN / 2] {
        &self.0
    }

    /// A ref from its raw bytes.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; REF_HEX_LEN / 2]) -> Self {
        Self(bytes)
    }

    /// Parses a ref as printed (16 hex digits; surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Self, RefError> {
        let text = text.trim();
        if text.len() != REF_HEX_LEN {
            return Err(RefError { input: text.to_owned() });
        }
        let mut bytes = [0u8; REF_HEX_LEN / 2];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let hi = hex_value(pair[0]).ok_or_else(|| RefError { input: text.to_owned() })?;
            let lo = hex_value(pair[1]).ok_or_else(|| RefError { input: text.to_owned() })?;
            bytes[i] = (hi << 4) | lo;
        }
        Ok(Self(bytes))
    }

    /// Whether `key` is the key this ref abbreviates.
    #[must_use]
    pub fn matches(&self, key: &Key) -> bool {
        key.0.starts_with(&self.0)
    }
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(&self.0, f)
    }
}

impl fmt::Debug for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ref({self})")
    }
}

/// A string that is not a ref.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefError {
    input: String,
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an operation ref; a ref is the {REF_HEX_LEN} hex digits given with an \
             in-flight or unknown answer",
            self.input
        )
    }
}

impl std::error::Error for RefError {}

/// An operation's address, for an operator: its ref and the end of its window (ledger
/// milliseconds), written `<ref>@<window end>`. A ref names a key, and one key can hold two
/// operations — an unsettled one superseded after its window ended, and the newer one that
/// superseded it (whose window ends later) — so a verdict names the address, never the ref alone.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Address {
    /// The operation's ref.
    pub reference: Ref,
    /// When its window ends: no other operation of the same key has this one.
    pub window_end: u64,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.reference, self.window_end)
    }
}

impl std::str::FromStr for Address {
    type Err = AddressError;

    /// Parses `<ref>@<window end>`, as `idem pending` and `idem show` print it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let invalid = || AddressError { input: text.to_owned() };
        let (reference, window_end) = text.split_once('@').ok_or_else(invalid)?;
        Ok(Self {
            reference: Ref::parse(reference).map_err(|_| invalid())?,
            window_end: window_end.parse().map_err(|_| invalid())?,
        })
    }
}

/// A string that is not an operation's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressError {
    input: String,
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an operation's address: give it as `idem pending` and `idem show` print it, \
             `<ref>@<window end>` (like 3f2a9c1e0b7d4e65@1764633600000) — a ref alone may name an \
             operation and the newer one that superseded it",
            self.input
        )
    }
}

impl std::error::Error for AddressError {}

/// A digest of all of a call's arguments (minus those a recipe ignores), stored with its record.
///
/// Same key with a different `digest` is a conflict. The per-argument `tags` (4 bytes each: a
/// 2-byte tag of the name and a 2-byte tag of the value) let the conflict answer name which
/// arguments differ without storing any value; the 32-byte digest alone decides. Digest and tags
/// are keyed (HMAC-SHA256 under the server secret): without the secret, they say nothing about
/// the values, not even which of a few guessed values it was.
///
/// **A top-level argument whose value is `null` counts as absent**: `{"note": null}` and `{}`
/// fingerprint alike. Many clients send an explicit `null` for an optional parameter they leave
/// unset and others omit it, and a retry through a different client (or an `#[idempotent]`
/// handler's `Option` parameter that is `None`) must not turn into a conflict. Setting the
/// argument later is a change like any other, named in the conflict. Inside an argument's value
/// `null` is data (a JSON merge patch clears a field with it): `{"address": {"line2": null}}`
/// and `{"address": {}}` differ. (Key arguments are not fingerprints: a missing or `null` key
/// path is refused by `Idem::call` unless the recipe declares it optional.)
#[derive(Clone, Debug)]
pub struct Fingerprint<'a> {
    digest: [u8; 32],
    tags: Vec<[u8; 4]>,
    names: Vec<&'a str>,
    /// The arguments and the names they ignore, until the tags (and names) are computed.
    untagged: Option<(&'a Members, &'a [&'a str])>,
}

impl PartialEq for Fingerprint<'_> {
    fn eq(&self, other: &Self) -> bool {
        (self.digest, &self.tags, &self.names) == (other.digest, &other.tags, &other.names)
    }
}

impl Eq for Fingerprint<'_> {}

impl<'a> Fingerprint<'a> {
    /// HMAC-SHA256 over the canonical object of the fingerprinted arguments: what decides a
    /// conflict.
    #[must_use]
    pub const fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// One tag per top-level argument, sorted by argument name (canonical order): what names
    /// the arguments that differ. Empty for a fingerprint from
    /// [`Fingerprint::digest_of_members`] until [`Fingerprint::tag`].
    #[must_use]
    pub fn tags(&self) -> &[[u8; 4]] {
        &self.tags
    }

    /// The argument names, in the order of [`Fingerprint::tags`] (empty until then). Not stored.
    #[must_use]
    pub fn names(&self) -> &[&'a str] {
        &self.names
    }

    /// Fingerprints the top-level members of `arguments` except the `ignore`d names and those
    /// whose value is `null` (absent and `null` are one state of an optional argument).
    ///
    /// Everything is keyed with `secret`.
    pub fn of(secret: &Secret, arguments: &'a Map<String, Value>, ignore: &[&str]) -> Result<Self, CanonicalError> {
        let mut material = Vec::with_capacity(128);
        let mut tags = Vec::with_capacity(arguments.len());
        let mut names = Vec::with_capacity(arguments.len());
        let kept = arguments.iter().filter(|(name, value)| !value.is_null() && !ignore.contains(&name.as_str()));
        write_object(kept, &mut material, |name, value_bytes| {
            tags.push(argument_tag(secret, name, value_bytes));
            names.push(name);
        })?;
        Ok(Self { digest: secret.mac("idem/v2/fingerprint", &[&material]), tags, names, untagged: None })
    }

    /// [`Fingerprint::of`] from arguments already in canonical form ([`Members::of_arguments`]):
    /// the same digest, tags and names for the same arguments.
    #[must_use]
    pub fn of_members(secret: &Secret, arguments: &'a Members, ignore: &[&str]) -> Self {
        let digest = members_digest(secret, arguments, ignore);
        let (names, tags) = members_tags(secret, arguments, ignore);
        Self { digest, tags, names, untagged: None }
    }

    /// [`Fingerprint::of_members`] without the argument tags yet: the digest is what a call
    /// needs to be answered; the tags only go into a claim that is sent, or name what differs in
    /// a conflict ([`Fingerprint::tag`] computes them then).
    #[must_use]
    pub fn digest_of_members(secret: &Secret, arguments: &'a Members, ignore: &'a [&'a str]) -> Self {
        let digest = members_digest(secret, arguments, ignore);
        Self { digest, tags: Vec::new(), names: Vec::new(), untagged: Some((arguments, ignore)) }
    }

    /// Computes the argument tags of a fingerprint made by
    /// [`Fingerprint::digest_of_members`], under the same `secret`; once (a fingerprint that has
    /// its tags keeps them).
    pub fn tag(&mut self, secret: &Secret) {
        let Some((arguments, ignore)) = self.untagged.take() else { return };
        (self.names, self.tags) = members_tags(secret, arguments, ignore);
    }

    /// Names of this call's arguments that differ from a stored record's `stored_tags`, and how
    /// many stored arguments are absent from this call.
    ///
    /// Explanatory only: a 2-byte tag collision can hide a name, never a conflict.
    #[must_use]
    pub fn differing(&self, stored_tags: &[[u8; 4]]) -> (Vec<String>, usize) {
        let mut differing = Vec::new();
        for (name, tag) in self.names.iter().zip(&self.tags) {
            // Two names may share a 2-byte name tag: the argument is unchanged if any stored
            // argument has its whole tag.
            if !stored_tags.contains(tag) {
                differing.push((*name).to_owned());
            }
        }
        let removed = stored_tags.iter().filter(|stored| !self.tags.iter().any(|tag| tag[..2] == stored[..2])).count();
        (differing, removed)
    }
}

/// Runs `f` with this thread's scratch buffer, emptied: the key's and the fingerprint's material
/// is written there and hashed, with no allocation per call.
fn with_scratch<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(512));
    }
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut material) => {
            material.clear();
            let result = f(&mut material);
            // A call with huge arguments does not keep its buffer for good.
            if material.capacity() > 64 * 1024 {
                *material = Vec::with_capacity(512);
            }
            result
        }
        // Never nested today; if it were, a buffer of its own.
        Err(_) => f(&mut Vec::new()),
    })
}

/// Appends `["idem/v2",version,namespace,scope,tool,` to `material`: key material up to the
/// selected values.
fn write_material_head(
    material: &mut Vec<u8>,
    secret: &Secret,
    namespace: &str,
    scope: &Scope,
    tool: &str,
) -> Result<(), CanonicalError> {
    material.extend_from_slice(b"[\"");
    material.extend_from_slice(KEY_VERSION.as_bytes());
    material.extend_from_slice(b"\",");
    canonical::write_canonical_integer(i128::from(secret.version()), material);
    material.push(b',');
    canonical::write_canonical_str(namespace, material);
    material.push(b',');
    scope.write_material(material)?;
    material.push(b',');
    canonical::write_canonical_str(tool, material);
    material.push(b',');
    Ok(())
}

/// The fingerprint's digest of `arguments`: their canonical object, without the ignored and
/// the `null` ones, keyed.
fn members_digest(secret: &Secret, arguments: &Members, ignore: &[&str]) -> [u8; 32] {
    with_scratch(|material| {
        arguments.write_object(material, |name, value| kept(name, value, ignore), |_, _| {});
        secret.mac("idem/v2/fingerprint", &[material])
    })
}

/// The names and tags of the fingerprinted `arguments`, in canonical order.
fn members_tags<'a>(secret: &Secret, arguments: &'a Members, ignore: &[&str]) -> (Vec<&'a str>, Vec<[u8; 4]>) {
    let kept = arguments.iter().filter(|(name, value)| kept(name, value, ignore));
    kept.map(|(name, value)| (name, argument_tag(secret, name, value))).unzip()
}

/// Whether a top-level argument is fingerprinted: not ignored, and not `null` (the only
/// canonical value that is exactly `null`; absent and `null` are one state).
fn kept(name: &str, value: &[u8], ignore: &[&str]) -> bool {
    value != b"null" && !ignore.contains(&name)
}

/// One argument's tag: 2 bytes of its name's MAC, 2 of its value's.
fn argument_tag(secret: &Secret, name: &str, value_bytes: &[u8]) -> [u8; 4] {
    // `mac("idem/v2/argument-name", name)`, remembered by the secret.
    let name_tag = secret.argument_name_tag(name);
    let value_tag = secret.mac("idem/v2/argument-value", &[name.as_bytes(), b"\0", value_bytes]);
    [name_tag[0], name_tag[1], value_tag[0], value_tag[1]]
}

/// Writes a canonical JSON object from `(name, value)` members in any order, calling
/// `on_member(name, canonical_value_bytes)` for each member in canonical order.
fn write_object<'a>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
    mut on_member: impl FnMut(&'a str, &[u8]),
) -> Result<(), CanonicalError> {
    let mut sorted: Vec<(&String, &Value)> = members.collect();
    sorted.sort_unstable_by(|a, b| canonical::utf16_cmp(a.0, b.0));
    out.push(b'{');
    for (i, (name, value)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        canonical::write_canonical_str(name, out);
        out.push(b':');
        let start = out.len();
        canonical::write_canonical(value, out).map_err(|error| error.within(name))?;
        on_member(name, &out[start..]);
    }
    out.push(b'}');
    Ok(())
}
