//! The serializers of the streaming canonicaliser's values: the top level (a map or struct
//! written member by member) and a value at any depth; arrays, objects and map keys are in
//! `compound`.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};

use crate::canonical::encode::{fits_double, write_finite, write_integer};
use crate::canonical::enter;
use crate::canonical::error::{CanonicalError, Path};
use crate::canonical::string::write_string;

use super::{Found, Members};

mod compound;

use compound::{ObjectWriter, SeqWriter};

/// The message of arguments that are not an object.
pub(super) const NOT_AN_OBJECT: &str = "the arguments must be a JSON object";

/// How the top-level object counts towards [`MAX_DEPTH`](super::MAX_DEPTH).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Top {
    /// A call's arguments: each member on its own, as `arguments_to_value` counts.
    Arguments,
    /// A value: the object is a level, as `to_value` counts.
    Value,
}

/// Why writing stopped: an error of the strict serializer, or (top level only) a value that is
/// not a map or struct, left to the `Value` path.
#[derive(Debug)]
pub(super) enum Stop {
    Failed(CanonicalError),
    NotAnObject,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(error) => error.fmt(f),
            Self::NotAnObject => f.write_str(NOT_AN_OBJECT),
        }
    }
}

impl std::error::Error for Stop {}

impl ser::Error for Stop {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        // The same words as the strict serializer's.
        Stop::Failed(CanonicalError::Invalid { message: format!("the value's Serialize impl failed: {msg}") })
    }
}

impl From<CanonicalError> for Stop {
    fn from(error: CanonicalError) -> Self {
        Stop::Failed(error)
    }
}

/// The paths whose values are captured while writing, and what was found.
pub(super) struct Capture<'k> {
    pub(super) paths: &'k [&'k str],
    pub(super) found: Found,
}

impl Capture<'_> {
    /// Of the paths in `mask` (which matched up to `level`), those whose segment at `level` is
    /// `name`: `(continuing, ending here)`.
    pub(super) fn step(&self, mask: u64, level: usize, name: &str) -> (u64, u64) {
        let (mut deeper, mut here) = (0, 0);
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if let Some((segment, more)) = segment(self.paths[index], level)
                && segment == name
            {
                if more {
                    deeper |= 1 << index;
                } else {
                    here |= 1 << index;
                }
            }
        }
        (deeper, here)
    }

    /// Records `value` as the value of the paths in `mask`.
    pub(super) fn record(&mut self, mask: u64, value: &[u8]) {
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            self.found.set(index, value);
        }
    }
}

/// The `level`th dot-separated segment of `path` (`"customer.id"`, 1: `"id"`), and whether
/// more follow; `None` if it has fewer. `str::split` by bytes: this runs for every member of a
/// call's arguments and every key path.
fn segment(path: &str, level: usize) -> Option<(&str, bool)> {
    let mut rest = path;
    for _ in 0..level {
        let dot = rest.bytes().position(|byte| byte == b'.')?;
        rest = &rest[dot + 1..];
    }
    Some(match rest.bytes().position(|byte| byte == b'.') {
        Some(dot) => (&rest[..dot], true),
        None => (rest, false),
    })
}

/// One member of an object being written: its raw name, in `Writer::names`, and its text.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) name: (usize, usize),
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Where everything is written: the top-level members, and the open nested objects.
pub(super) struct Writer<'k> {
    pub(super) out: Members,
    /// The members of the open nested objects, innermost last.
    pub(super) spans: Vec<Span>,
    /// Their names.
    pub(super) names: String,
    /// For putting an object's members in order.
    pub(super) scratch: Vec<u8>,
    pub(super) capture: Capture<'k>,
}

impl<'k> Writer<'k> {
    pub(super) fn new(out: Members, capture: Capture<'k>) -> Self {
        Self { out, spans: Vec::new(), names: String::new(), scratch: Vec::new(), capture }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.out.bytes.extend_from_slice(bytes);
    }

    pub(super) fn len(&self) -> usize {
        self.out.bytes.len()
    }
}

/// Serialises the top-level value: a map or a struct is written member by member; anything
/// else stops with [`Stop::NotAnObject`] and is left to the `Value` path.
pub(super) struct TopWriter<'w, 'k> {
    pub(super) w: &'w mut Writer<'k>,
    pub(super) top: Top,
    pub(super) mask: u64,
}

impl<'w, 'k> TopWriter<'w, 'k> {
    pub(super) fn object(self) -> Result<ObjectWriter<'w, 'static, 'k>, Stop> {
        let depth = match self.top {
            Top::Arguments => 0,
            Top::Value => enter(&Path::Root, 0)?,
        };
        Ok(ObjectWriter::new(self.w, &Path::Root, None, depth, None, self.mask, 0, true))
    }
}

impl<'w, 'k> ser::Serializer for TopWriter<'w, 'k> {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Impossible<(), Stop>;
    type SerializeTuple = Impossible<(), Stop>;
    type SerializeTupleStruct = Impossible<(), Stop>;
    type SerializeTupleVariant = Impossible<(), Stop>;
    type SerializeMap = ObjectWriter<'w, 'static, 'k>;
    type SerializeStruct = ObjectWriter<'w, 'static, 'k>;
    type SerializeStructVariant = Impossible<(), Stop>;

    fn serialize_bool(self, _: bool) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_i8(self, _: i8) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_i16(self, _: i16) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_i32(self, _: i32) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_i64(self, _: i64) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_i128(self, _: i128) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_u8(self, _: u8) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_u16(self, _: u16) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_u32(self, _: u32) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_u64(self, _: u64) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_u128(self, _: u128) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_f32(self, _: f32) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_f64(self, _: f64) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_char(self, _: char) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_str(self, _: &str) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_none(self) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Stop> {
        Err(Stop::NotAnObject)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Stop> {
        self.object()
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Stop> {
        self.object()
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Stop> {
        Err(Stop::NotAnObject)
    }
}

/// Serialises one value found at `path`, inside `depth` arrays and objects, capturing it or
/// its members for the paths in `mask` (which matched up to `level` segments).
pub(super) struct ValueWriter<'w, 'p, 'k> {
    pub(super) w: &'w mut Writer<'k>,
    pub(super) path: &'p Path<'p>,
    pub(super) depth: usize,
    pub(super) mask: u64,
    pub(super) level: usize,
}

impl<'w, 'p, 'k> ValueWriter<'w, 'p, 'k> {
    /// Opens an array, or `{"variant":[` for tuple variants.
    pub(super) fn open_seq(self, variant: Option<&'static str>) -> Result<SeqWriter<'w, 'p, 'k>, Stop> {
        let mut depth = enter(self.path, self.depth)?;
        let mut capture = 0;
        let mut start = 0;
        if let Some(name) = variant {
            depth = enter(&Path::Key(self.path, name), depth)?;
            capture = if self.mask == 0 { 0 } else { self.w.capture.step(self.mask, self.level, name).1 };
            self.w.push(b"{");
            write_string(name, &mut self.w.out.bytes);
            self.w.push(b":");
            start = self.w.len();
        }
        self.w.push(b"[");
        Ok(SeqWriter { w: self.w, parent: self.path, variant, depth, count: 0, capture, start })
    }

    /// Opens an object, or `{"variant":{` for struct variants.
    pub(super) fn open_map(self, variant: Option<&'static str>) -> Result<ObjectWriter<'w, 'p, 'k>, Stop> {
        let mut depth = enter(self.path, self.depth)?;
        let (mut mask, mut level) = (self.mask, self.level);
        let mut wrapped = None;
        if let Some(name) = variant {
            depth = enter(&Path::Key(self.path, name), depth)?;
            let (deeper, here) = if mask == 0 { (0, 0) } else { self.w.capture.step(mask, level, name) };
            (mask, level) = (deeper, level + 1);
            self.w.push(b"{");
            write_string(name, &mut self.w.out.bytes);
            self.w.push(b":");
            wrapped = Some((here, self.w.len()));
        }
        Ok(ObjectWriter::new(self.w, self.path, variant, depth, wrapped, mask, level, false))
    }
}

impl<'w, 'p, 'k> ser::Serializer for ValueWriter<'w, 'p, 'k> {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = SeqWriter<'w, 'p, 'k>;
    type SerializeTuple = SeqWriter<'w, 'p, 'k>;
    type SerializeTupleStruct = SeqWriter<'w, 'p, 'k>;
    type SerializeTupleVariant = SeqWriter<'w, 'p, 'k>;
    type SerializeMap = ObjectWriter<'w, 'p, 'k>;
    type SerializeStruct = ObjectWriter<'w, 'p, 'k>;
    type SerializeStructVariant = ObjectWriter<'w, 'p, 'k>;

    fn serialize_bool(self, v: bool) -> Result<(), Stop> {
        self.w.push(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), Stop> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), Stop> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), Stop> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<(), Stop> {
        write_integer(i128::from(v), &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), Stop> {
        // As `integer_value` then `write_number`: exact in the 64-bit range, else the double it
        // equals exactly, else refused.
        if u64::try_from(v).is_ok() || i64::try_from(v).is_ok() {
            write_integer(v, &mut self.w.out.bytes);
        } else if fits_double(v.unsigned_abs()) {
            // Exact by the check above.
            write_finite(v as f64, &mut self.w.out.bytes);
        } else {
            return Err(Stop::Failed(CanonicalError::InexactInteger {
                path: self.path.render(),
                value: v.to_string(),
            }));
        }
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result<(), Stop> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), Stop> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), Stop> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<(), Stop> {
        write_integer(i128::from(v), &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), Stop> {
        match i128::try_from(v) {
            Ok(v) => self.serialize_i128(v),
            Err(_) if fits_double(v) => {
                write_finite(v as f64, &mut self.w.out.bytes);
                Ok(())
            }
            Err(_) => {
                Err(Stop::Failed(CanonicalError::InexactInteger { path: self.path.render(), value: v.to_string() }))
            }
        }
    }

    fn serialize_f32(self, v: f32) -> Result<(), Stop> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), Stop> {
        if !v.is_finite() {
            return Err(Stop::Failed(CanonicalError::NonFinite { path: self.path.render() }));
        }
        write_finite(v, &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), Stop> {
        let mut buffer = [0u8; 4];
        write_string(v.encode_utf8(&mut buffer), &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), Stop> {
        write_string(v, &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Stop> {
        enter(self.path, self.depth)?;
        self.w.push(b"[");
        for (index, byte) in v.iter().enumerate() {
            if index > 0 {
                self.w.push(b",");
            }
            write_integer(i128::from(*byte), &mut self.w.out.bytes);
        }
        self.w.push(b"]");
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Stop> {
        self.w.push(b"null");
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Stop> {
        self.serialize_none()
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Stop> {
        self.serialize_none()
    }

    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Stop> {
        write_string(variant, &mut self.w.out.bytes);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        let depth = enter(self.path, self.depth)?;
        let (deeper, here) = if self.mask == 0 { (0, 0) } else { self.w.capture.step(self.mask, self.level, variant) };
        self.w.push(b"{");
        write_string(variant, &mut self.w.out.bytes);
        self.w.push(b":");
        let start = self.w.len();
        value.serialize(ValueWriter {
            w: &mut *self.w,
            path: &Path::Key(self.path, variant),
            depth,
            mask: deeper,
            level: self.level + 1,
        })?;
        if here != 0 {
            let w = &mut *self.w;
            w.capture.record(here, &w.out.bytes[start..]);
        }
        self.w.push(b"}");
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Stop> {
        self.open_seq(None)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Stop> {
        self.open_seq(None)
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, Stop> {
        self.open_seq(None)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Stop> {
        self.open_seq(Some(variant))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Stop> {
        self.open_map(None)
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, Stop> {
        self.open_map(None)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Stop> {
        self.open_map(Some(variant))
    }
}

#[cfg(test)]
mod tests {
    use super::segment;

    /// `segment` is `split('.').nth(level)` and whether another segment follows.
    #[test]
    fn segment_is_split_by_dots() {
        for path in ["", "a", "order_id", "customer.id", "a.b.c", "a..b", ".a", "a.", "é.ü"] {
            for level in 0..5 {
                let mut split = path.split('.');
                let expected = split.nth(level).map(|segment| (segment, split.next().is_some()));
                assert_eq!(segment(path, level), expected, "{path:?} at {level}");
            }
        }
    }
}
