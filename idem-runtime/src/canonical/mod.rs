//! RFC 8785 (JSON Canonicalization Scheme, JCS) canonical JSON, with one deliberate
//! deviation for integers beyond 2^53 (see [Numbers](#numbers)).
//!
//! Idempotency keys are derived by hashing the canonical bytes of a tool
//! call's arguments, so this module guarantees two things:
//!
//! * two encodings of the same value (member order, whitespace, escapes,
//!   `1.0` vs `1` vs `1e0`) give the same bytes, and
//! * any change of value changes the bytes.
//!
//! The second guarantee is why everything here refuses rather than
//! approximates: NaN and infinities are errors (never `null`), integers beyond
//! the 64-bit range that a double cannot hold exactly are errors (rounding
//! would put two integers on one key), duplicate member names are errors (a
//! parser would silently keep one of them), and nesting is bounded by
//! [`MAX_DEPTH`] so hostile input cannot overflow the stack.
//!
//! # Numbers
//!
//! RFC 8785 treats every number as an IEEE-754 double and writes it as
//! ECMAScript's `Number.prototype.toString` does. That is right for
//! fractions, but integers beyond 2^53 (snowflake ids, nanosecond
//! timestamps) would be rounded to a neighbouring double, so two different
//! ids would share a key. These bytes are only ever hashed by idem itself, so
//! idem deviates from RFC 8785 for integers:
//!
//! * **An integer in the 64-bit range** (`i64::MIN ..= u64::MAX`, which is
//!   what a serde_json `Value` holds exactly) **is written as its exact
//!   decimal digits.** Up to 2^53 in magnitude (every integer a double holds
//!   with all its neighbours) this is exactly the text RFC 8785 prescribes.
//! * **An integral double in that range is written as the integer it
//!   equals**, so a number's bytes depend on its value, not on whether it
//!   arrived as an integer or a double. This is the deviation proper: RFC
//!   8785 writes the double 2^60 as `1152921504606847000`, which is the exact
//!   text of a different integer (a different snowflake id), so keeping RFC
//!   8785's text there would put two ids on one key.
//! * **Everything else is written as RFC 8785 says**: fractions, and numbers
//!   beyond the 64-bit range (`1e20` is `100000000000000000000`, 2^68 is
//!   `295147905179352830000`, `1e21` is `1e+21`). Beyond that range numbers
//!   are doubles, as in RFC 8785; an integer there that is not exactly a
//!   double is refused ([`CanonicalError::InexactInteger`]).
//!
//! Integers keep their digits only when they arrive as integers: JSON text
//! with a fraction or an exponent (`1152921504606847000.0`) is a double, as
//! serde_json reads it too, and a value already rounded to a double before
//! it reaches idem cannot be unrounded.
//!
//! [`parse_strict`] is a small parser of its own rather than
//! `serde_json::from_str`: besides rejecting duplicates, it converts decimal
//! text to the correctly rounded double. serde_json's default float parsing
//! is best-effort and can be a few units in the last place off, so two
//! spellings of one number could get different keys, and canonical output
//! would not always parse back to itself.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};
use serde_json::{Map, Number, Value};

/// Nesting deeper than this is refused (protects the recursive encoder and the stack).
///
/// Depth counts arrays and objects: `[[1]]` is two levels deep, a scalar is
/// zero. [`to_value`], [`parse_strict`] and [`write_canonical`] all apply it.
pub const MAX_DEPTH: usize = 128;

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
    /// exact; see [Numbers](self#numbers).
    InexactInteger {
        /// Where the integer is.
        path: String,
        /// The integer, in decimal.
        value: String,
    },
    /// Nesting deeper than [`MAX_DEPTH`].
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

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// Where the encoder, serializer or parser currently is, as a linked list on
/// the stack: free to extend, rendered to text only when an error needs it.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
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

/// Checks that one more array or object fits below [`MAX_DEPTH`] and returns
/// the depth of its children.
fn enter(path: &Path<'_>, depth: usize) -> Result<usize, CanonicalError> {
    let inner = depth + 1;
    if inner > MAX_DEPTH { Err(CanonicalError::TooDeep { path: path.render(), limit: MAX_DEPTH }) } else { Ok(inner) }
}

// ---------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------

/// Bits of precision in an IEEE-754 double's significand.
const DOUBLE_PRECISION_BITS: u32 = 53;

/// -2^63 (`i64::MIN`) and 2^64 (one past `u64::MAX`): integral doubles in
/// `EXACT_MIN..EXACT_END` are written as the integer they equal.
const EXACT_MIN: f64 = -9_223_372_036_854_775_808.0;
const EXACT_END: f64 = 18_446_744_073_709_551_616.0;

/// Whether an integer of this magnitude converts to `f64` without rounding:
/// its significant bits (between the highest and lowest set bit) must fit
/// the 53-bit significand. Unlike a round trip through `as`, this cannot be
/// fooled by saturating casts.
fn fits_double(magnitude: u128) -> bool {
    magnitude == 0 || 128 - magnitude.leading_zeros() - magnitude.trailing_zeros() <= DOUBLE_PRECISION_BITS
}

/// A JSON number for an integer of any width: an integer where serde_json
/// can hold it (the 64-bit range, kept exactly), otherwise the double it
/// equals exactly, or `InexactInteger` if there is none.
fn integer_value(n: i128, path: &Path<'_>) -> Result<Value, CanonicalError> {
    if let Ok(small) = u64::try_from(n) {
        Ok(Value::Number(small.into()))
    } else if let Ok(small) = i64::try_from(n) {
        Ok(Value::Number(small.into()))
    } else if fits_double(n.unsigned_abs()) {
        // Exact by the check above.
        float_value(n as f64, path)
    } else {
        Err(CanonicalError::InexactInteger { path: path.render(), value: n.to_string() })
    }
}

/// A JSON number for a double, refusing NaN and infinities.
fn float_value(f: f64, path: &Path<'_>) -> Result<Value, CanonicalError> {
    Number::from_f64(f).map(Value::Number).ok_or_else(|| CanonicalError::NonFinite { path: path.render() })
}

/// The integer an integral double in the 64-bit range equals (`-0.0` is 0).
fn integral_in_range(f: f64) -> Option<i128> {
    // Exact: the value is an integer, and -2^63 <= f < 2^64 fits an i128.
    (f.fract() == 0.0 && (EXACT_MIN..EXACT_END).contains(&f)).then_some(f as i128)
}

/// Writes a serde_json number: an integer in the 64-bit range as its exact
/// digits, any other finite number as RFC 8785 says (see [Numbers](self#numbers)).
fn write_number<O: Out>(n: &Number, path: &Path<'_>, out: &mut O) -> Result<(), CanonicalError> {
    if let Some(u) = n.as_u64() {
        write_integer(i128::from(u), out);
    } else if let Some(i) = n.as_i64() {
        write_integer(i128::from(i), out);
    } else {
        match n.as_f64() {
            Some(f) if f.is_finite() => write_finite(f, out),
            _ => return Err(CanonicalError::NonFinite { path: path.render() }),
        }
    }
    Ok(())
}

/// A finite double: the integer it equals if that is in the 64-bit range,
/// otherwise its RFC 8785 (ECMAScript) text.
fn write_finite<O: Out>(f: f64, out: &mut O) {
    match integral_in_range(f) {
        Some(n) => write_integer(n, out),
        None => write_double(f, out),
    }
}

/// An integer's exact decimal digits. For magnitudes up to 2^53 this is also
/// its ECMAScript text, as RFC 8785 asks.
fn write_integer<O: Out>(n: i128, out: &mut O) {
    let mut digits = [0u8; 40];
    let mut start = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        start -= 1;
        // A decimal digit, so the cast is exact.
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push('-');
    }
    for &digit in &digits[start..] {
        out.push(char::from(digit));
    }
}

/// ECMAScript `Number.prototype.toString`, as RFC 8785 section 3.2.2.3 requires.
fn write_double<O: Out>(f: f64, out: &mut O) {
    out.push_str(ryu_js::Buffer::new().format_finite(f));
}

// ---------------------------------------------------------------------------
// Canonical encoder
// ---------------------------------------------------------------------------

/// Append the RFC 8785 canonical form of `value` to `out`.
///
/// On error `out` is left exactly as it was, so a caller hashing a prefix and
/// the value together never hashes half a value.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    let start = out.len();
    write_value(value, &Path::Root, 0, out).inspect_err(|_| out.truncate(start))
}

/// Append `text` as an RFC 8785 canonical JSON string (quoted and escaped) to `out`.
pub fn write_canonical_str(text: &str, out: &mut Vec<u8>) {
    write_string(text, out);
}

/// Where the encoder writes: a `Vec<u8>` for hashing, a `String` for error paths and keys.
trait Out {
    fn push_str(&mut self, text: &str);
    fn push(&mut self, c: char);
}

impl Out for String {
    fn push_str(&mut self, text: &str) {
        String::push_str(self, text);
    }
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
}

impl Out for Vec<u8> {
    fn push_str(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
    fn push(&mut self, c: char) {
        let mut buffer = [0u8; 4];
        self.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
    }
}

/// Convenience: the canonical form of `value` in a fresh `Vec`.
pub fn to_canonical_vec(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::new();
    write_canonical(value, &mut out)?;
    Ok(out)
}

fn write_value<O: Out>(value: &Value, path: &Path<'_>, depth: usize, out: &mut O) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, path, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => write_array(items, path, depth, out)?,
        Value::Object(members) => write_object(members, path, depth, out)?,
    }
    Ok(())
}

fn write_array<O: Out>(items: &[Value], path: &Path<'_>, depth: usize, out: &mut O) -> Result<(), CanonicalError> {
    let depth = enter(path, depth)?;
    out.push('[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_value(item, &Path::Index(path, index), depth, out)?;
    }
    out.push(']');
    Ok(())
}

fn write_object<O: Out>(
    members: &Map<String, Value>,
    path: &Path<'_>,
    depth: usize,
    out: &mut O,
) -> Result<(), CanonicalError> {
    let depth = enter(path, depth)?;
    let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
    sorted.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
    out.push('{');
    for (index, (key, member)) in sorted.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_value(member, &Path::Key(path, key), depth, out)?;
    }
    out.push('}');
    Ok(())
}

/// RFC 8785 section 3.2.2.2: the short escapes, `\u00xx` (lowercase) for the
/// other controls, and everything else verbatim.
fn write_string<O: Out>(s: &str, out: &mut O) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut start = 0;
    for (index, byte) in s.bytes().enumerate() {
        let short = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0c => "\\f",
            0x0d => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `index` is an ASCII byte, hence a char boundary.
        out.push_str(&s[start..index]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            out.push_str(short);
        }
        start = index + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Orders member names by UTF-16 code units (RFC 8785 section 3.2.3). For names without
/// characters above U+FFFF the byte order is the same order, and much cheaper.
#[must_use]
pub fn utf16_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    // Below U+10000 UTF-8 byte order equals code point order equals UTF-16 order; only a
    // 4-byte UTF-8 sequence (lead byte >= 0xF0, a surrogate pair in UTF-16) can differ.
    if a.bytes().chain(b.bytes()).all(|byte| byte < 0xf0) {
        a.as_bytes().cmp(b.as_bytes())
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

// ---------------------------------------------------------------------------
// Strict Serialize -> Value
// ---------------------------------------------------------------------------

/// Strict equivalent of `serde_json::to_value`.
///
/// Where serde_json would quietly change the value, this refuses:
/// non-finite `f32`/`f64` give [`CanonicalError::NonFinite`] (serde_json
/// yields `null`), a member name emitted twice gives
/// [`CanonicalError::DuplicateKey`] (serde_json keeps the last), `i128`/`u128`
/// beyond the 64-bit range become the double they equal exactly or give
/// [`CanonicalError::InexactInteger`], and nesting beyond [`MAX_DEPTH`] gives
/// [`CanonicalError::TooDeep`]. Map keys follow serde_json: strings, chars,
/// integers, bools and finite floats become strings (floats in ECMAScript
/// form, as a JavaScript object key would be), anything else is
/// [`CanonicalError::NonStringKey`].
///
/// Every integer in the 64-bit range (any `u64` or `i64`, and `i128`/`u128`
/// within it) is kept exactly, and [`write_canonical`] writes its exact
/// digits: snowflake ids and nanosecond timestamps are accepted.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, CanonicalError> {
    value.serialize(ValueSerializer { path: &Path::Root, depth: 0 }).map_err(|Failure(error)| error)
}

/// serde needs an error type implementing `serde::ser::Error`; wrapping keeps
/// that impl off the public [`CanonicalError`].
#[derive(Debug)]
struct Failure(CanonicalError);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Failure {}

impl ser::Error for Failure {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Failure(CanonicalError::Invalid { message: format!("the value's Serialize impl failed: {msg}") })
    }
}

impl From<CanonicalError> for Failure {
    fn from(error: CanonicalError) -> Self {
        Failure(error)
    }
}

/// Size hints come from the value's Serialize impl; don't let one reserve
/// unbounded memory up front.
const LEN_HINT_CAP: usize = 1024;

/// Serializes one value found at `path`, inside `depth` arrays and objects.
#[derive(Clone, Copy)]
struct ValueSerializer<'p> {
    path: &'p Path<'p>,
    depth: usize,
}

/// `{variant: inner}`, the externally tagged form serde_json uses for enums.
fn tagged(variant: &'static str, inner: Value) -> Value {
    let mut map = Map::new();
    map.insert(variant.to_owned(), inner);
    Value::Object(map)
}

impl<'p> ValueSerializer<'p> {
    /// Opens an array, or an object holding an array for tuple variants.
    fn open_seq(self, variant: Option<&'static str>, len: usize) -> Result<SeqBuilder<'p>, Failure> {
        let mut depth = enter(self.path, self.depth)?;
        if let Some(name) = variant {
            depth = enter(&Path::Key(self.path, name), depth)?;
        }
        Ok(SeqBuilder { parent: self.path, variant, depth, items: Vec::with_capacity(len.min(LEN_HINT_CAP)) })
    }

    /// Opens an object, or an object holding an object for struct variants.
    fn open_map(self, variant: Option<&'static str>) -> Result<MapBuilder<'p>, Failure> {
        let mut depth = enter(self.path, self.depth)?;
        if let Some(name) = variant {
            depth = enter(&Path::Key(self.path, name), depth)?;
        }
        Ok(MapBuilder { parent: self.path, variant, depth, map: Map::new(), next_key: None })
    }
}

impl<'p> ser::Serializer for ValueSerializer<'p> {
    type Ok = Value;
    type Error = Failure;
    type SerializeSeq = SeqBuilder<'p>;
    type SerializeTuple = SeqBuilder<'p>;
    type SerializeTupleStruct = SeqBuilder<'p>;
    type SerializeTupleVariant = SeqBuilder<'p>;
    type SerializeMap = MapBuilder<'p>;
    type SerializeStruct = MapBuilder<'p>;
    type SerializeStructVariant = MapBuilder<'p>;

    fn serialize_bool(self, v: bool) -> Result<Value, Failure> {
        Ok(Value::Bool(v))
    }

    fn serialize_i8(self, v: i8) -> Result<Value, Failure> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<Value, Failure> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<Value, Failure> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<Value, Failure> {
        Ok(Value::Number(v.into()))
    }

    fn serialize_i128(self, v: i128) -> Result<Value, Failure> {
        Ok(integer_value(v, self.path)?)
    }

    fn serialize_u8(self, v: u8) -> Result<Value, Failure> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<Value, Failure> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<Value, Failure> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<Value, Failure> {
        Ok(Value::Number(v.into()))
    }

    fn serialize_u128(self, v: u128) -> Result<Value, Failure> {
        match i128::try_from(v) {
            Ok(v) => self.serialize_i128(v),
            // Above i128::MAX (2^127 itself is a double): same exactness rule.
            Err(_) if fits_double(v) => Ok(float_value(v as f64, self.path)?),
            Err(_) => Err(Failure(CanonicalError::InexactInteger { path: self.path.render(), value: v.to_string() })),
        }
    }

    fn serialize_f32(self, v: f32) -> Result<Value, Failure> {
        // Widening is exact; serde_json does the same.
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<Value, Failure> {
        Ok(float_value(v, self.path)?)
    }

    fn serialize_char(self, v: char) -> Result<Value, Failure> {
        Ok(Value::String(v.to_string()))
    }

    fn serialize_str(self, v: &str) -> Result<Value, Failure> {
        Ok(Value::String(v.to_owned()))
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<Value, Failure> {
        enter(self.path, self.depth)?;
        Ok(Value::Array(v.iter().map(|&b| Value::Number(b.into())).collect()))
    }

    fn serialize_none(self) -> Result<Value, Failure> {
        Ok(Value::Null)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, Failure> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<Value, Failure> {
        Ok(Value::Null)
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<Value, Failure> {
        Ok(Value::Null)
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result<Value, Failure> {
        Ok(Value::String(variant.to_owned()))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<Value, Failure> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Value, Failure> {
        let depth = enter(self.path, self.depth)?;
        let inner = value.serialize(ValueSerializer { path: &Path::Key(self.path, variant), depth })?;
        Ok(tagged(variant, inner))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<SeqBuilder<'p>, Failure> {
        self.open_seq(None, len.unwrap_or(0))
    }

    fn serialize_tuple(self, len: usize) -> Result<SeqBuilder<'p>, Failure> {
        self.open_seq(None, len)
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<SeqBuilder<'p>, Failure> {
        self.open_seq(None, len)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<SeqBuilder<'p>, Failure> {
        self.open_seq(Some(variant), len)
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<MapBuilder<'p>, Failure> {
        self.open_map(None)
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<MapBuilder<'p>, Failure> {
        self.open_map(None)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<MapBuilder<'p>, Failure> {
        self.open_map(Some(variant))
    }
}

/// Collects an array; for tuple variants, wraps it as `{variant: [...]}`.
struct SeqBuilder<'p> {
    parent: &'p Path<'p>,
    variant: Option<&'static str>,
    /// Depth of the elements.
    depth: usize,
    items: Vec<Value>,
}

impl SeqBuilder<'_> {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        let tagged;
        let base = match self.variant {
            Some(name) => {
                tagged = Path::Key(self.parent, name);
                &tagged
            }
            None => self.parent,
        };
        let item =
            value.serialize(ValueSerializer { path: &Path::Index(base, self.items.len()), depth: self.depth })?;
        self.items.push(item);
        Ok(())
    }

    fn finish(self) -> Value {
        let array = Value::Array(self.items);
        match self.variant {
            Some(name) => tagged(name, array),
            None => array,
        }
    }
}

impl ser::SerializeSeq for SeqBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        self.push(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

impl ser::SerializeTuple for SeqBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        self.push(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

impl ser::SerializeTupleStruct for SeqBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        self.push(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

impl ser::SerializeTupleVariant for SeqBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        self.push(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

/// Collects an object; for struct variants, wraps it as `{variant: {...}}`.
struct MapBuilder<'p> {
    parent: &'p Path<'p>,
    variant: Option<&'static str>,
    /// Depth of the member values.
    depth: usize,
    map: Map<String, Value>,
    next_key: Option<String>,
}

impl MapBuilder<'_> {
    /// Runs `f` with the path of the object being built.
    fn with_object_path<R>(&self, f: impl FnOnce(&Path<'_>) -> R) -> R {
        match self.variant {
            Some(name) => f(&Path::Key(self.parent, name)),
            None => f(self.parent),
        }
    }

    fn key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Failure> {
        let key = self.with_object_path(|path| key.serialize(KeySerializer { path }))?;
        if self.map.contains_key(&key) {
            let path = self.with_object_path(|path| path.render());
            return Err(Failure(CanonicalError::DuplicateKey { path, key }));
        }
        self.next_key = Some(key);
        Ok(())
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        let Some(key) = self.next_key.take() else {
            return Err(ser::Error::custom("serialize_value was called before serialize_key"));
        };
        let depth = self.depth;
        let member =
            self.with_object_path(|path| value.serialize(ValueSerializer { path: &Path::Key(path, &key), depth }))?;
        self.map.insert(key, member);
        Ok(())
    }

    fn finish(self) -> Value {
        let object = Value::Object(self.map);
        match self.variant {
            Some(name) => tagged(name, object),
            None => object,
        }
    }
}

impl ser::SerializeMap for MapBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Failure> {
        self.key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Failure> {
        self.value(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

impl ser::SerializeStruct for MapBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Failure> {
        self.key(key)?;
        self.value(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

impl ser::SerializeStructVariant for MapBuilder<'_> {
    type Ok = Value;
    type Error = Failure;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Failure> {
        self.key(key)?;
        self.value(value)
    }

    fn end(self) -> Result<Value, Failure> {
        Ok(self.finish())
    }
}

/// Turns a map key into a member name the way serde_json's `MapKeySerializer`
/// does; `path` is the map's.
struct KeySerializer<'p> {
    path: &'p Path<'p>,
}

impl KeySerializer<'_> {
    fn refuse(&self) -> Failure {
        Failure(CanonicalError::NonStringKey { path: self.path.render() })
    }
}

impl ser::Serializer for KeySerializer<'_> {
    type Ok = String;
    type Error = Failure;
    type SerializeSeq = Impossible<String, Failure>;
    type SerializeTuple = Impossible<String, Failure>;
    type SerializeTupleStruct = Impossible<String, Failure>;
    type SerializeTupleVariant = Impossible<String, Failure>;
    type SerializeMap = Impossible<String, Failure>;
    type SerializeStruct = Impossible<String, Failure>;
    type SerializeStructVariant = Impossible<String, Failure>;

    fn serialize_bool(self, v: bool) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_i8(self, v: i8) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_i16(self, v: i16) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_i32(self, v: i32) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_i64(self, v: i64) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_i128(self, v: i128) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_u8(self, v: u8) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_u16(self, v: u16) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_u32(self, v: u32) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_u64(self, v: u64) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_u128(self, v: u128) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_f32(self, v: f32) -> Result<String, Failure> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<String, Failure> {
        if v.is_finite() {
            let mut key = String::new();
            write_double(v, &mut key);
            Ok(key)
        } else {
            Err(Failure(CanonicalError::NonFinite { path: self.path.render() }))
        }
    }

    fn serialize_char(self, v: char) -> Result<String, Failure> {
        Ok(v.to_string())
    }

    fn serialize_str(self, v: &str) -> Result<String, Failure> {
        Ok(v.to_owned())
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_none(self) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_unit(self) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        variant: &'static str,
    ) -> Result<String, Failure> {
        Ok(variant.to_owned())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, Failure> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, Failure> {
        Err(self.refuse())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Failure> {
        Err(self.refuse())
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Failure> {
        Err(self.refuse())
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, Failure> {
        Err(self.refuse())
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Failure> {
        Err(self.refuse())
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Failure> {
        Err(self.refuse())
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, Failure> {
        Err(self.refuse())
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _variant_index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Failure> {
        Err(self.refuse())
    }
}

// ---------------------------------------------------------------------------
// Strict parser
// ---------------------------------------------------------------------------

/// Parse raw JSON text (RFC 8259) strictly into a `Value`.
///
/// Unlike `serde_json::from_str`: a member name twice in one object is
/// [`CanonicalError::DuplicateKey`] (serde_json silently keeps the last),
/// nesting beyond [`MAX_DEPTH`] is [`CanonicalError::TooDeep`], and numbers
/// with a fraction or exponent become the correctly rounded double (so every
/// spelling of a number gives the same key; serde_json's default parser can
/// be one unit in the last place off). Integer literals in the 64-bit range
/// are kept exactly, as `u64`/`i64`; beyond it they must name a double
/// exactly or be its canonical text, otherwise they are
/// [`CanonicalError::InexactInteger`] rather than being rounded onto some
/// other integer's key (see [Numbers](self#numbers)). A number beyond the
/// double range (`1e400`), lone
/// surrogate escapes, unescaped control characters, a byte-order mark and
/// anything after the value are [`CanonicalError::Invalid`].
///
/// Whatever this returns, [`write_canonical`] accepts, and parsing canonical
/// output gives back the same value.
pub fn parse_strict(json: &str) -> Result<Value, CanonicalError> {
    let mut parser = Parser { text: json, pos: 0 };
    parser.skip_whitespace();
    let value = parser.value(&Path::Root, 0)?;
    parser.skip_whitespace();
    if parser.pos < json.len() {
        return Err(parser.invalid("unexpected characters after the JSON value"));
    }
    Ok(value)
}

/// A recursive-descent parser over the text; recursion is bounded by
/// [`MAX_DEPTH`], checked before each descent.
struct Parser<'t> {
    text: &'t str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn skip_digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// A malformed-JSON error at the current position.
    fn invalid(&self, what: &str) -> CanonicalError {
        let before = self.text.as_bytes().get(..self.pos).unwrap_or_default();
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |newline| newline + 1);
        // Count characters, not bytes: skip UTF-8 continuation bytes.
        let column = 1 + before[line_start..].iter().filter(|&&b| b & 0xc0 != 0x80).count();
        CanonicalError::Invalid { message: format!("malformed JSON at line {line} column {column}: {what}") }
    }

    /// One value; leading whitespace has been skipped.
    fn value(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        match self.peek() {
            Some(b'{') => self.object(path, depth),
            Some(b'[') => self.array(path, depth),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(path),
            Some(_) => Err(self.invalid("expected a JSON value")),
            None => Err(self.invalid("unexpected end of input; expected a JSON value")),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, CanonicalError> {
        if self.text.as_bytes()[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.invalid("expected a JSON value"))
        }
    }

    fn array(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        let depth = enter(path, depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            let item = self.value(&Path::Index(path, items.len()), depth)?;
            items.push(item);
            self.skip_whitespace();
            if self.eat(b']') {
                return Ok(Value::Array(items));
            }
            if !self.eat(b',') {
                return Err(self.invalid("expected `,` or `]` after an array element"));
            }
        }
    }

    fn object(&mut self, path: &Path<'_>, depth: usize) -> Result<Value, CanonicalError> {
        let depth = enter(path, depth)?;
        self.pos += 1; // '{'
        let mut members = Map::new();
        self.skip_whitespace();
        if self.eat(b'}') {
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_whitespace();
            let key = self.member_name(path, &members)?;
            self.skip_whitespace();
            if !self.eat(b':') {
                return Err(self.invalid("expected `:` after a member name"));
            }
            self.skip_whitespace();
            let member = self.value(&Path::Key(path, &key), depth)?;
            members.insert(key, member);
            self.skip_whitespace();
            if self.eat(b'}') {
                return Ok(Value::Object(members));
            }
            if !self.eat(b',') {
                return Err(self.invalid("expected `,` or `}` after an object member"));
            }
        }
    }

    /// A member name, refused if the object already has it.
    fn member_name(&mut self, path: &Path<'_>, members: &Map<String, Value>) -> Result<String, CanonicalError> {
        if self.peek() != Some(b'"') {
            return Err(self.invalid("expected a member name in double quotes"));
        }
        let key = self.string()?;
        if members.contains_key(&key) {
            return Err(CanonicalError::DuplicateKey { path: path.render(), key });
        }
        Ok(key)
    }

    /// A string literal, unescaped; `pos` is at the opening quote.
    fn string(&mut self) -> Result<String, CanonicalError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(byte) = self.peek() {
                if byte == b'"' || byte == b'\\' || byte < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Both ends sit next to ASCII bytes (or the end), so on char boundaries.
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                Some(_) => {
                    return Err(self.invalid("control character in a string; escape it"));
                }
                None => return Err(self.invalid("unterminated string")),
            }
        }
    }

    /// The character an escape stands for; `pos` is just past the backslash.
    fn escape(&mut self) -> Result<char, CanonicalError> {
        let Some(byte) = self.peek() else {
            return Err(self.invalid("unterminated string"));
        };
        self.pos += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => {
                self.pos -= 1;
                return Err(self.invalid("unknown escape in a string"));
            }
        })
    }

    /// `\uXXXX`, joining a surrogate pair; lone surrogates are refused
    /// because a Rust string (and RFC 8785) cannot hold them.
    fn unicode_escape(&mut self) -> Result<char, CanonicalError> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return Err(self.invalid("lone surrogate in a \\u escape"));
                }
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(self.invalid("lone surrogate in a \\u escape"));
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(self.invalid("lone surrogate in a \\u escape")),
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.invalid("invalid \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32, CanonicalError> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or_else(|| self.invalid("expected four hex digits after \\u"))?;
            code = code * 16 + digit;
            self.pos += 1;
        }
        Ok(code)
    }

    /// A number per the RFC 8259 grammar.
    fn number(&mut self, path: &Path<'_>) -> Result<Value, CanonicalError> {
        let start = self.pos;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.skip_digits();
            }
            _ => return Err(self.invalid("expected a digit")),
        }
        let mut integral = true;
        if self.eat(b'.') {
            integral = false;
            if self.skip_digits() == 0 {
                return Err(self.invalid("expected a digit after the decimal point"));
            }
        }
        if self.eat(b'e') || self.eat(b'E') {
            integral = false;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if self.skip_digits() == 0 {
                return Err(self.invalid("expected a digit in the exponent"));
            }
        }
        let literal = &self.text[start..self.pos];
        if integral { self.integer(literal, path) } else { self.double(literal, path).map(Value::Number) }
    }

    /// An integer literal (no fraction or exponent). In the 64-bit range it is
    /// kept exactly, as a `u64` or `i64`. Beyond it, it must name exactly one
    /// double: either by being exactly equal to it, or by being that double's
    /// canonical text, which is how RFC 8785 itself prints large doubles
    /// (`295147905179352830000`): refusing those would make canonical output
    /// unparseable. Any other literal, such as `18446744073709551617`, would
    /// silently share a key with a different integer and is
    /// [`CanonicalError::InexactInteger`]. `-0` is the double -0, as in
    /// serde_json.
    fn integer(&self, literal: &str, path: &Path<'_>) -> Result<Value, CanonicalError> {
        if literal == "-0" {
            return float_value(-0.0, path);
        }
        if let Ok(n) = literal.parse::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        if let Ok(n) = literal.parse::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        let number = self.double(literal, path)?;
        let names_one_double = number.as_f64().is_some_and(|f| {
            let exact = format!("{:.0}", f.abs()) == literal.trim_start_matches('-');
            let mut canonical = String::new();
            write_finite(f, &mut canonical);
            exact || canonical == literal
        });
        if names_one_double {
            Ok(Value::Number(number))
        } else {
            Err(CanonicalError::InexactInteger { path: path.render(), value: literal.to_owned() })
        }
    }

    /// The correctly rounded double for a literal (std's parser is exact,
    /// unlike serde_json's default), refusing overflow to infinity.
    fn double(&self, literal: &str, path: &Path<'_>) -> Result<Number, CanonicalError> {
        literal.parse::<f64>().ok().and_then(Number::from_f64).ok_or_else(|| self.out_of_range(literal, path))
    }

    fn out_of_range(&self, literal: &str, path: &Path<'_>) -> CanonicalError {
        let place = match path.render() {
            at if at.is_empty() => String::new(),
            at => format!(" in argument `{at}`"),
        };
        CanonicalError::Invalid {
            message: format!(
                "number {literal}{place} is beyond the range of an IEEE-754 double; \
                 send a smaller number or a string"
            ),
        }
    }
}
