//! Why a value has no canonical form ([`CanonicalError`]), and where in the value it happened
//! ([`Path`]).
//!
//! Owns the error type every part of [`crate::canonical`] returns, its messages (in words a
//! model or an operator can act on, naming the argument by its path), and the path
//! notation `items[2].price` / `meta["content-type"]`. A path is rendered only when an error
//! needs it; a member name in it is quoted exactly as the encoder quotes strings, so a path is
//! never ambiguous.

use std::fmt;

use super::string::write_string;

/// Why a value has no canonical form.
///
/// Every variant that concerns part of a value carries its `path`, written as
/// `items[2].price` (member names that are not plain identifiers are quoted,
/// as in `meta["content-type"]`); the root itself is the empty string.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CanonicalError {
    /// NaN or ±infinity at `path` — JSON cannot represent it.
    NonFinite {
        /// Where the number is.
        path: String,
    },
    /// An integer beyond the 64-bit range that an IEEE-754 double cannot hold
    /// exactly (numbers there are RFC 8785 doubles, and rounding would put two
    /// different integers on one key). Integers in the 64-bit range are always
    /// exact; see [Numbers](crate::canonical#numbers).
    InexactInteger {
        /// Where the integer is.
        path: String,
        /// The integer, in decimal.
        value: String,
    },
    /// Nesting deeper than [`MAX_DEPTH`](super::MAX_DEPTH).
    TooDeep {
        /// The array or object that goes one level too deep.
        path: String,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The same member name twice in one object: in raw JSON text, or emitted
    /// twice by a `Serialize` impl (keeping either one would hide the other).
    DuplicateKey {
        /// The object holding the duplicate.
        path: String,
        /// The repeated member name.
        key: String,
    },
    /// A map key that is not a string (or char, integer, bool or finite float,
    /// which serde_json stringifies) when serialising.
    NonStringKey {
        /// The map whose key was refused.
        path: String,
    },
    /// A key path of the recipe that the call's arguments lack, or give as `null`. Hashing
    /// it as `null` would make every call without it (a typo'd member name, a client that
    /// forgot it) one operation, so the call is refused instead; a recipe declares the paths
    /// where "absent" is a value of its own with [`crate::Recipe::optional_keys`].
    MissingKey {
        /// The key path, as the recipe names it (`customer.id`).
        path: String,
    },
    /// Malformed JSON text, or a custom serde error from the value's Serialize impl.
    Invalid {
        /// What went wrong, ready to show.
        message: String,
    },
}

impl fmt::Display for CanonicalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NonFinite { path } => {
                write!(f, "{} is NaN or infinite, which JSON cannot represent; send a finite number", Subject(path))
            }
            Self::InexactInteger { path, value } => write!(
                f,
                "{} ({value}) is an integer beyond the 64-bit range that cannot be kept exactly \
                 (beyond it, numbers are IEEE-754 doubles); send it as a string",
                Subject(path)
            ),
            Self::TooDeep { path, limit } => write!(
                f,
                "{} nests arrays and objects more than {limit} levels deep; send a flatter value",
                Subject(path)
            ),
            Self::DuplicateKey { path, key } => {
                write!(f, "{} has the member name {key:?} more than once; send each member once", Subject(path))
            }
            Self::NonStringKey { path } => {
                write!(f, "{} is a map with a key that is not a string; use string (or integer) keys", Subject(path))
            }
            Self::MissingKey { path } => write!(
                f,
                "the key argument `{path}` is missing (or null), and the operation's idempotency key is \
                 derived from it; send it with a value. (If the tool means a missing `{path}` as a value \
                 of its own, its recipe must declare it with `Recipe::optional_keys`.)"
            ),
            Self::Invalid { message } => f.write_str(message),
        }
    }
}

impl CanonicalError {
    /// This error, its path prefixed with the argument `name` it occurred in.
    pub(crate) fn within(self, name: &str) -> Self {
        if name.is_empty() {
            return self;
        }
        let join = |path: String| match path.as_str() {
            "" => name.to_owned(),
            p if p.starts_with('[') => format!("{name}{p}"),
            p => format!("{name}.{p}"),
        };
        match self {
            Self::NonFinite { path } => Self::NonFinite { path: join(path) },
            Self::InexactInteger { path, value } => Self::InexactInteger { path: join(path), value },
            Self::TooDeep { path, limit } => Self::TooDeep { path: join(path), limit },
            Self::DuplicateKey { path, key } => Self::DuplicateKey { path: join(path), key },
            Self::NonStringKey { path } => Self::NonStringKey { path: join(path) },
            other => other,
        }
    }
}

impl std::error::Error for CanonicalError {}

/// Names the offending part of a value in an error message.
struct Subject<'a>(&'a str);

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { f.write_str("the value") } else { write!(f, "argument `{}`", self.0) }
    }
}

/// Where the encoder, serializer or parser currently is, as a linked list on
/// the stack: free to extend, rendered to text only when an error needs it.
#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    pub(super) fn render(&self) -> String {
        let mut segments = Vec::new();
        let mut node = self;
        loop {
            match node {
                Path::Root => break,
                Path::Key(parent, _) | Path::Index(parent, _) => {
                    segments.push(node);
                    node = parent;
                }
            }
        }
        let mut out = String::new();
        for segment in segments.iter().rev() {
            match segment {
                Path::Root => {}
                Path::Key(_, key) => push_path_key(key, &mut out),
                Path::Index(_, index) => {
                    out.push('[');
                    out.push_str(&index.to_string());
                    out.push(']');
                }
            }
        }
        out
    }
}

/// `.name` for identifier-like names, `["any name"]` for the rest, so a path
/// is never ambiguous (a member called `a.b` is not `a` then `b`).
fn push_path_key(key: &str, out: &mut String) {
    let plain = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(key);
    } else {
        out.push('[');
        write_string(key, out);
        out.push(']');
    }
}
