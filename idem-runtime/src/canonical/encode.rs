//! The canonical encoder: a `serde_json::Value` to its RFC 8785 bytes, with idem's integer
//! deviation (see [Numbers](crate::canonical#numbers)).
//!
//! What it guarantees, for any `Value`: two values that are equal as JSON give the same bytes
//! (members are sorted by UTF-16 code units, strings escaped one way, a number written by its
//! value however it is held: `1.0` and `1` are both `1`, `-0` is `0`), and values that differ
//! as JSON give different bytes. On error nothing is written. It refuses only what a
//! `Value` can hold but JSON cannot express canonically: nesting beyond
//! [`MAX_DEPTH`](super::MAX_DEPTH), and a non-finite number (which a `Value` built by serde_json
//! never holds). Duplicate member names cannot reach it: a `Value` object holds each name once.
//!
//! It also owns the number rule the serializer and the parser make numbers by
//! ([`integer_value`], [`float_value`]), so every number they produce has exactly one canonical
//! text.

use serde_json::{Map, Number, Value};

use super::enter;
use super::error::{CanonicalError, Path};
use super::string::{Out, write_string};

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

/// Append `n` as a canonical JSON integer to `out`.
pub(crate) fn write_canonical_integer(n: i128, out: &mut Vec<u8>) {
    write_integer(n, out);
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

/// Whether every name can be ordered by its UTF-8 bytes: none has a character above U+FFFF (see
/// [`utf16_cmp`]).
#[must_use]
pub(super) fn byte_order_is_utf16_order(names: &str) -> bool {
    names.bytes().all(|byte| byte < 0xf0)
}

/// Orders member names by UTF-16 code units (RFC 8785 section 3.2.3). For names without
/// characters above U+FFFF the byte order is the same order, and much cheaper.
#[must_use]
pub fn utf16_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    // Below U+10000 UTF-8 byte order equals code point order equals UTF-16 order; only a
    // 4-byte UTF-8 sequence (lead byte >= 0xF0, a surrogate pair in UTF-16) can differ.
    if byte_order_is_utf16_order(a) && byte_order_is_utf16_order(b) {
        a.as_bytes().cmp(b.as_bytes())
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
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
pub(super) fn fits_double(magnitude: u128) -> bool {
    magnitude == 0 || 128 - magnitude.leading_zeros() - magnitude.trailing_zeros() <= DOUBLE_PRECISION_BITS
}

/// A JSON number for an integer of any width: an integer where serde_json
/// can hold it (the 64-bit range, kept exactly), otherwise the double it
/// equals exactly, or `InexactInteger` if there is none.
pub(super) fn integer_value(n: i128, path: &Path<'_>) -> Result<Value, CanonicalError> {
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
pub(super) fn float_value(f: f64, path: &Path<'_>) -> Result<Value, CanonicalError> {
    Number::from_f64(f).map(Value::Number).ok_or_else(|| CanonicalError::NonFinite { path: path.render() })
}

/// The integer an integral double in the 64-bit range equals (`-0.0` is 0).
fn integral_in_range(f: f64) -> Option<i128> {
    // Exact: the value is an integer, and -2^63 <= f < 2^64 fits an i128.
    (f.fract() == 0.0 && (EXACT_MIN..EXACT_END).contains(&f)).then_some(f as i128)
}

/// Writes a serde_json number: an integer in the 64-bit range as its exact
/// digits, any other finite number as RFC 8785 says (see [Numbers](crate::canonical#numbers)).
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
pub(super) fn write_finite<O: Out>(f: f64, out: &mut O) {
    match integral_in_range(f) {
        Some(n) => write_integer(n, out),
        None => write_double(f, out),
    }
}

/// An integer's exact decimal digits. For magnitudes up to 2^53 this is also
/// its ECMAScript text, as RFC 8785 asks.
pub(super) fn write_integer<O: Out>(n: i128, out: &mut O) {
    let mut digits = [0u8; 40];
    let mut start = digits.len();
    let magnitude = n.unsigned_abs();
    if let Ok(mut rest) = u64::try_from(magnitude) {
        // The common case, in 64-bit arithmetic (128-bit division is a library call).
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
        // ASCII digits.
        out.push_str(std::str::from_utf8(&digits[start..]).unwrap_or_default());
        return;
    }
    let mut rest = magnitude;
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
pub(super) fn write_double<O: Out>(f: f64, out: &mut O) {
    out.push_str(ryu_js::Buffer::new().format_finite(f));
}
