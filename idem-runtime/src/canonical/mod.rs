//! RFC 8785 (JSON Canonicalization Scheme, JCS) canonical JSON, with one deliberate
//! deviation for integers beyond 2^53 (see [Numbers](#numbers)).
//!
//! Idempotency keys are derived by hashing the canonical bytes of a tool call's arguments. The
//! pieces, and what each one promises:
//!
//! * **The encoder** ([`write_canonical`], [`to_canonical_vec`], `write_canonical_str`,
//!   `utf16_cmp`) turns a `serde_json::Value` into bytes. Two values that are equal as JSON
//!   (member order, `1.0` vs `1`) give the same bytes, and any change of value changes the
//!   bytes. It refuses only nesting beyond [`MAX_DEPTH`] (and a non-finite number, which a
//!   `Value` does not hold); a `Value` cannot hold a member name twice.
//! * **The strict serializer** ([`to_value`]) turns a Rust value into a `Value` where
//!   `serde_json::to_value` would quietly change it: NaN and infinities are errors (never
//!   `null`), a member name emitted twice is an error (serde_json keeps the last), an integer
//!   beyond the 64-bit range that a double cannot hold exactly is an error (rounding would put
//!   two integers on one key), and so is nesting beyond [`MAX_DEPTH`]. It is the
//!   reference for what a call's arguments may be; calls themselves go through the stream.
//! * **The stream** ([`Members`]) is what calls key by: it writes a Rust value straight to
//!   canonical member bytes in one pass, with no `Value` in between, and gives exactly the
//!   bytes `write_canonical(&to_value(v)?)` gives, refusing exactly what [`to_value`] refuses
//!   with the same error. The `Value` path stays the reference it is tested against
//!   (`canonical/differential.rs`), and what a caller holding a `Value` uses.
//! * **The strict parser** ([`parse_strict`]) turns JSON *text* into a `Value`, for callers who
//!   hold text: it refuses a member name twice in one object (a parser would silently keep one
//!   of them) and rounds every number exactly. idem does not call it itself: rmcp hands tools
//!   their arguments already parsed by serde_json.
//! * **The error** ([`CanonicalError`]) says why a value has no canonical form, and where.
//!
//! Every piece refuses rather than approximates, because a silent approximation would break
//! the promise that a change of value changes the key; and every piece bounds nesting by
//! [`MAX_DEPTH`], so hostile input cannot overflow the stack.
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

/// The methods of a map-key serializer that refuse (with its `refuse()`): a JSON object's member
/// names are strings, so a key may not be bytes, absent, a unit, a newtype variant or a compound
/// value. The one list both key serializers — the strict one (`serialize.rs`) and the streaming
/// one (`stream/writer/compound.rs`) — refuse with, so they cannot drift apart.
macro_rules! refuse_non_string_keys {
    () => {
        fn serialize_bytes(self, _v: &[u8]) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_none(self) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_unit(self) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_unit_struct(self, _name: &'static str) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _value: &T,
        ) -> Result<Self::Ok, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_tuple_struct(
            self,
            _name: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleStruct, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_tuple_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleVariant, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, Self::Error> {
            Err(self.refuse())
        }
        fn serialize_struct_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStructVariant, Self::Error> {
            Err(self.refuse())
        }
    };
}

#[cfg(test)]
mod differential;
mod encode;
mod error;
mod parse;
mod serialize;
mod stream;
mod string;

pub(crate) use encode::write_canonical_integer;
pub use encode::{to_canonical_vec, write_canonical};
pub(crate) use encode::{utf16_cmp, write_canonical_str};
pub use error::CanonicalError;
pub use parse::parse_strict;
pub(crate) use serialize::arguments_to_value;
pub use serialize::to_value;
pub use stream::Members;

use error::Path;

/// Nesting deeper than this is refused (protects the recursive encoder and the stack).
///
/// Depth counts arrays and objects: `[[1]]` is two levels deep, a scalar is
/// zero. [`to_value`], [`parse_strict`] and [`write_canonical`] all apply it.
pub const MAX_DEPTH: usize = 128;

/// Checks that one more array or object fits below [`MAX_DEPTH`] and returns
/// the depth of its children.
fn enter(path: &Path<'_>, depth: usize) -> Result<usize, CanonicalError> {
    let inner = depth + 1;
    if inner > MAX_DEPTH { Err(CanonicalError::TooDeep { path: path.render(), limit: MAX_DEPTH }) } else { Ok(inner) }
}
