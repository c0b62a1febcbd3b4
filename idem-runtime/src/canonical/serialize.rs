//! The strict serializer: a Rust value (`Serialize`) to a `serde_json::Value` ([`to_value`]),
//! refusing where `serde_json::to_value` would quietly change the value.
//!
//! What it guarantees: the `Value` it returns is the value the `Serialize` impl emitted, or an
//! error — never an approximation of it. NaN and infinities are refused (serde_json makes them
//! `null`, and every non-finite argument would share one key), a member name emitted twice is
//! refused (serde_json keeps the last, hiding the other), `i128`/`u128` beyond the 64-bit range
//! must equal a double exactly, map keys must be string-like, and nesting is bounded by
//! [`MAX_DEPTH`](super::MAX_DEPTH). Every value it returns, the encoder accepts.
//!
//! It is the reference the streaming path ([`Members`](super::Members)), by which `#[idempotent]`
//! and [`Idem::call`](crate::Idem::call) key their arguments, is tested against; `#[idempotent]`
//! still reads a `within` id with it.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};
use serde_json::{Map, Value};

use super::encode::{fits_double, float_value, integer_value, write_double};
use super::enter;
use super::error::{CanonicalError, Path};

/// Strict equivalent of `serde_json::to_value`.
///
/// Where serde_json would quietly change the value, this refuses:
/// non-finite `f32`/`f64` give [`CanonicalError::NonFinite`] (serde_json
/// yields `null`), a member name emitted twice gives
/// [`CanonicalError::DuplicateKey`] (serde_json keeps the last), `i128`/`u128`
/// beyond the 64-bit range become the double they equal exactly or give
/// [`CanonicalError::InexactInteger`], and nesting beyond [`MAX_DEPTH`](super::MAX_DEPTH) gives
/// [`CanonicalError::TooDeep`]. Map keys follow serde_json: strings, chars,
/// integers, bools and finite floats become strings (floats in ECMAScript
/// form, as a JavaScript object key would be), anything else is
/// [`CanonicalError::NonStringKey`].
///
/// Every integer in the 64-bit range (any `u64` or `i64`, and `i128`/`u128`
/// within it) is kept exactly, and [`write_canonical`](super::write_canonical) writes its exact
/// digits: snowflake ids and nanosecond timestamps are accepted.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, CanonicalError> {
    value.serialize(ValueSerializer { path: &Path::Root, depth: 0, arguments: false }).map_err(|Failure(error)| error)
}

/// [`to_value`] for a call's arguments, an object of arguments by name: each argument is bounded
/// by [`MAX_DEPTH`](super::MAX_DEPTH) on its own, as if serialised alone (the object holding
/// them is not a level of any argument), so an argument is accepted whether it arrives alone or
/// in a JSON object of arguments.
pub(crate) fn arguments_to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, CanonicalError> {
    value.serialize(ValueSerializer { path: &Path::Root, depth: 0, arguments: true }).map_err(|Failure(error)| error)
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
    /// The object of a call's arguments (see [`arguments_to_value`]): it adds no level.
    arguments: bool,
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
        let mut depth = if self.arguments && variant.is_none() { self.depth } else { enter(self.path, self.depth)? };
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
        let inner =
            value.serialize(ValueSerializer { path: &Path::Key(self.path, variant), depth, arguments: false })?;
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
        let item = value.serialize(ValueSerializer {
            path: &Path::Index(base, self.items.len()),
            depth: self.depth,
            arguments: false,
        })?;
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
        let member = self.with_object_path(|path| {
            value.serialize(ValueSerializer { path: &Path::Key(path, &key), depth, arguments: false })
        })?;
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
    refuse_non_string_keys!();

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
}
