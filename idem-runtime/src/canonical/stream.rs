//! The streaming canonicaliser: a Rust value (`Serialize`) straight to its RFC 8785 bytes, with
//! no `serde_json::Value` in between ([`Members`]).
//!
//! What it guarantees: for any value, the bytes are exactly `write_canonical(&to_value(v)?)`,
//! and it refuses exactly what [`to_value`](super::to_value) refuses, with the same error (the
//! same variant, path and message, found in the same order). It is a second implementation of
//! the strict serializer's rules, so `tests/streaming.rs` compares the two over generated values;
//! the `Value` path stays the reference.
//!
//! How: every value is written in one pass. An object's members are written one after another
//! as they arrive, each `"name":value` recorded as a byte range; when the object ends, the
//! ranges are put in RFC 8785 order (UTF-16 order of the names), which costs nothing when they
//! arrived in order and one copy of the object otherwise. Names of a struct's fields are
//! `&'static str` and are never copied; map keys are written into one buffer per map. The
//! members of the top-level object (a call's arguments) are kept apart, so that a key and a
//! fingerprint hash them by name without writing them again.

use std::collections::HashSet;
use std::fmt;

use serde::ser::{self, Impossible, Serialize};
use serde_json::{Map, Value};

use super::encode::{fits_double, utf16_cmp, write_canonical, write_double, write_finite, write_integer};
use super::enter;
use super::error::{CanonicalError, Path};
use super::string::write_string;

/// Named canonical values in RFC 8785 member order: the members of one JSON object, each
/// written once as canonical bytes, to be hashed by name (a call's arguments for its
/// fingerprint, the key's values by path).
///
/// Each member is held as its canonical text `"name":value`; [`Members::write_object`] writes
/// the object they make. Names are unique: inserting a name again replaces its value.
#[derive(Clone, Default)]
pub struct Members {
    /// Every member's `"name":value`, in the order written (replaced ones stay, unreferenced).
    bytes: Vec<u8>,
    /// Every member's raw name, in the order written.
    names: String,
    /// The members, in RFC 8785 order.
    entries: Vec<Entry>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The raw name, in `names`.
    name: (usize, usize),
    /// `"name":value` is `bytes[member..end]`, the value `bytes[value..end]`.
    member: usize,
    value: usize,
    end: usize,
}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, value) in self.iter() {
            map.entry(&name, &String::from_utf8_lossy(value));
        }
        map.finish()
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Members {}

/// Bytes and names reserved up front for a call's arguments: one allocation each for typical
/// tool arguments.
const INITIAL_BYTES: usize = 256;
const INITIAL_NAMES: usize = 64;

impl Members {
    /// No members.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The members of a call's arguments: `arguments` must serialise to an object (a struct, a
    /// map, a `serde_json::Value` object), each member bounded by
    /// [`MAX_DEPTH`](super::MAX_DEPTH) on its own — what [`to_value`](super::to_value) accepts of
    /// each argument alone, with the same errors.
    ///
    /// # Errors
    /// What the strict serializer refuses, or `Invalid` if the arguments are not an object.
    pub fn of_arguments<T: Serialize + ?Sized>(arguments: &T) -> Result<Self, CanonicalError> {
        Ok(Self::of_arguments_at(arguments, &[])?.0)
    }

    /// [`Members::of_arguments`], and the canonical value found at each of `paths` (dotted
    /// member paths, `customer.id`) as a lookup in the `serde_json::Value` would find it:
    /// through objects only.
    pub(crate) fn of_arguments_at<T: Serialize + ?Sized>(
        arguments: &T,
        paths: &[&str],
    ) -> Result<(Self, Found), CanonicalError> {
        Self::capture(arguments, paths, Top::Arguments)?
            .ok_or_else(|| CanonicalError::Invalid { message: NOT_AN_OBJECT.to_owned() })
    }

    /// The members of `value` as [`to_value`](super::to_value) sees it (the object itself is a
    /// level of nesting). `Ok(None)`: `value` has a canonical form, but it is not an object.
    pub(crate) fn of_object<T: Serialize + ?Sized>(value: &T) -> Result<Option<Self>, CanonicalError> {
        Ok(Self::capture(value, &[], Top::Value)?.map(|(members, _)| members))
    }

    fn capture<T: Serialize + ?Sized>(
        value: &T,
        paths: &[&str],
        top: Top,
    ) -> Result<Option<(Self, Found)>, CanonicalError> {
        if paths.len() > u64::BITS as usize {
            // More paths than a mask holds (never, in practice).
            return Self::through_value(value, paths, top);
        }
        let out = Members {
            bytes: Vec::with_capacity(INITIAL_BYTES),
            names: String::with_capacity(INITIAL_NAMES),
            entries: Vec::with_capacity(8),
        };
        let mut writer = Writer::new(out, Capture { paths, found: Found::new(paths.len()) });
        let mask = if paths.is_empty() { 0 } else { u64::MAX >> (u64::BITS as usize - paths.len()) };
        match value.serialize(TopWriter { w: &mut writer, top, mask }) {
            Ok(()) => {
                let Writer { mut out, capture, .. } = writer;
                out.sort();
                Ok(Some((out, capture.found)))
            }
            Err(Stop::Failed(error)) => Err(error),
            // Not a map or a struct: whatever it is, the `Value` path says what it makes.
            Err(Stop::NotAnObject) => Self::through_value(value, paths, top),
        }
    }

    /// Through the strict serializer's `Value`: the reference behaviour, for the shapes the
    /// stream leaves to it.
    fn through_value<T: Serialize + ?Sized>(
        value: &T,
        paths: &[&str],
        top: Top,
    ) -> Result<Option<(Self, Found)>, CanonicalError> {
        let value = match top {
            Top::Arguments => super::arguments_to_value(value)?,
            Top::Value => super::to_value(value)?,
        };
        let Value::Object(map) = value else { return Ok(None) };
        let members = Self::from_map(&map)?;
        let mut found = Found::new(paths.len());
        for (index, path) in paths.iter().enumerate() {
            let mut segments = path.split('.');
            let first = segments.next().and_then(|name| map.get(name));
            if let Some(value) =
                first.and_then(|first| segments.try_fold(first, |value, segment| value.as_object()?.get(segment)))
            {
                found.set(index, &super::to_canonical_vec(value)?);
            }
        }
        Ok(Some((members, found)))
    }

    /// The members of a `serde_json` object, each value written by
    /// [`write_canonical`](super::write_canonical).
    ///
    /// # Errors
    /// A value [`write_canonical`](super::write_canonical) refuses, its path within its member.
    pub fn from_map(map: &Map<String, Value>) -> Result<Self, CanonicalError> {
        let mut members = Self::new();
        for (name, value) in map {
            let member = members.bytes.len();
            write_string(name, &mut members.bytes);
            members.bytes.push(b':');
            let start = members.bytes.len();
            write_canonical(value, &mut members.bytes).map_err(|error| error.within(name))?;
            members.push_entry(name, member, start);
        }
        members.sort();
        Ok(members)
    }

    /// Sets the member `name` to `value` as [`to_value`](super::to_value) serialises it alone
    /// (replacing a member of that name). On error nothing changes; the error's path is within
    /// the value, not prefixed with `name`.
    ///
    /// # Errors
    /// What the strict serializer refuses.
    pub fn insert<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), CanonicalError> {
        self.reserve_first();
        let mark = self.bytes.len();
        let mut writer = Writer::new(std::mem::take(self), Capture { paths: &[], found: Found::new(0) });
        write_string(name, &mut writer.out.bytes);
        writer.push(b":");
        let start = writer.len();
        let written = value.serialize(ValueWriter { w: &mut writer, path: &Path::Root, depth: 0, mask: 0, level: 0 });
        *self = writer.out;
        match written {
            Ok(()) => {
                self.insert_entry(name, mark, start);
                Ok(())
            }
            Err(Stop::Failed(error)) => {
                self.bytes.truncate(mark);
                Err(error)
            }
            Err(Stop::NotAnObject) => unreachable!("only the top level asks for an object"),
        }
    }

    /// Sets the member `name` to a value already in canonical form.
    pub(crate) fn insert_canonical(&mut self, name: &str, canonical: &[u8]) {
        self.reserve_first();
        let member = self.bytes.len();
        write_string(name, &mut self.bytes);
        self.bytes.push(b':');
        let start = self.bytes.len();
        self.bytes.extend_from_slice(canonical);
        self.insert_entry(name, member, start);
    }

    /// Room for a few small members in one allocation each, before the first is written.
    fn reserve_first(&mut self) {
        if self.bytes.capacity() == 0 {
            self.bytes.reserve(INITIAL_BYTES / 4);
            self.names.reserve(INITIAL_NAMES / 2);
            self.entries.reserve(4);
        }
    }

    /// Records the member whose text is `bytes[member..]`, its value from `value`, in order.
    fn insert_entry(&mut self, name: &str, member: usize, value: usize) {
        let position = self.entries.binary_search_by(|entry| utf16_cmp(self.name(entry), name));
        let from = self.names.len();
        self.names.push_str(name);
        let entry = Entry { name: (from, self.names.len()), member, value, end: self.bytes.len() };
        match position {
            Ok(at) => self.entries[at] = entry,
            Err(at) => self.entries.insert(at, entry),
        }
    }

    /// Records the member whose text is `bytes[member..]`, unsorted (see [`Members::sort`]).
    fn push_entry(&mut self, name: &str, member: usize, value: usize) {
        let from = self.names.len();
        self.names.push_str(name);
        self.entries.push(Entry { name: (from, self.names.len()), member, value, end: self.bytes.len() });
    }

    /// Puts the entries in RFC 8785 order (names are unique).
    fn sort(&mut self) {
        let names = &self.names;
        let name = |entry: &Entry| &names[entry.name.0..entry.name.1];
        // One look at all the names instead of one per comparison: the usual case is bytes.
        if super::encode::byte_order_is_utf16_order(names) {
            self.entries.sort_unstable_by(|a, b| name(a).as_bytes().cmp(name(b).as_bytes()));
        } else {
            self.entries.sort_unstable_by(|a, b| utf16_cmp(name(a), name(b)));
        }
    }

    fn name(&self, entry: &Entry) -> &str {
        &self.names[entry.name.0..entry.name.1]
    }

    /// The length of the object [`Members::write_object`] writes of all of them.
    fn object_len(&self) -> usize {
        self.entries.iter().map(|entry| entry.end - entry.member + 1).sum::<usize>() + 2
    }

    /// How many members.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(name, canonical value)` of each member, in RFC 8785 order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries.iter().map(|entry| (self.name(entry), &self.bytes[entry.value..entry.end]))
    }

    /// The names, in RFC 8785 order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|entry| self.name(entry))
    }

    /// The canonical value of the member `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find_map(|(member, value)| (member == name).then_some(value))
    }

    /// Keeps only the members whose name passes `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let names = &self.names;
        self.entries.retain(|entry| keep(&names[entry.name.0..entry.name.1]));
    }

    /// Appends the canonical object of the members that pass `keep(name, canonical value)`,
    /// calling `on_member(name, canonical value)` for each of them, in order.
    pub fn write_object<'s>(
        &'s self,
        out: &mut Vec<u8>,
        mut keep: impl FnMut(&str, &[u8]) -> bool,
        mut on_member: impl FnMut(&'s str, &'s [u8]),
    ) {
        out.reserve(self.object_len());
        out.push(b'{');
        let mut first = true;
        for entry in &self.entries {
            let (name, value) = (self.name(entry), &self.bytes[entry.value..entry.end]);
            if !keep(name, value) {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(&self.bytes[entry.member..entry.end]);
            on_member(name, value);
        }
        out.push(b'}');
    }
}

/// The canonical values found at a list of paths, by the path's index.
#[derive(Debug, Default)]
pub(crate) struct Found {
    bytes: Vec<u8>,
    at: Vec<Option<(usize, usize)>>,
}

impl Found {
    fn new(paths: usize) -> Self {
        Self { bytes: Vec::new(), at: vec![None; paths] }
    }

    fn set(&mut self, index: usize, value: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.at[index] = Some((start, self.bytes.len()));
    }

    /// The canonical value at the `index`th path, if the arguments have one (`null` included).
    pub(crate) fn get(&self, index: usize) -> Option<&[u8]> {
        self.at.get(index).copied().flatten().map(|(start, end)| &self.bytes[start..end])
    }
}

/// The message of arguments that are not an object.
const NOT_AN_OBJECT: &str = "the arguments must be a JSON object";

/// How the top-level object counts towards [`MAX_DEPTH`](super::MAX_DEPTH).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Top {
    /// A call's arguments: each member on its own, as `arguments_to_value` counts.
    Arguments,
    /// A value: the object is a level, as `to_value` counts.
    Value,
}

/// Why writing stopped: an error of the strict serializer, or (top level only) a value that is
/// not a map or struct, left to the `Value` path.
#[derive(Debug)]
enum Stop {
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
struct Capture<'k> {
    paths: &'k [&'k str],
    found: Found,
}

impl Capture<'_> {
    /// Of the paths in `mask` (which matched up to `level`), those whose segment at `level` is
    /// `name`: `(continuing, ending here)`.
    fn step(&self, mask: u64, level: usize, name: &str) -> (u64, u64) {
        let (mut deeper, mut here) = (0, 0);
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let mut segments = self.paths[index].split('.');
            if segments.nth(level) == Some(name) {
                if segments.next().is_some() {
                    deeper |= 1 << index;
                } else {
                    here |= 1 << index;
                }
            }
        }
        (deeper, here)
    }

    /// Records `value` as the value of the paths in `mask`.
    fn record(&mut self, mask: u64, value: &[u8]) {
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            self.found.set(index, value);
        }
    }
}

/// One member of an object being written: its raw name, in `Writer::names`, and its text.
#[derive(Clone, Copy)]
struct Span {
    name: (usize, usize),
    start: usize,
    end: usize,
}

/// Where everything is written: the top-level members, and the open nested objects.
struct Writer<'k> {
    out: Members,
    /// The members of the open nested objects, innermost last.
    spans: Vec<Span>,
    /// Their names.
    names: String,
    /// For putting an object's members in order.
    scratch: Vec<u8>,
    capture: Capture<'k>,
}

impl<'k> Writer<'k> {
    fn new(out: Members, capture: Capture<'k>) -> Self {
        Self { out, spans: Vec::new(), names: String::new(), scratch: Vec::new(), capture }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.out.bytes.extend_from_slice(bytes);
    }

    fn len(&self) -> usize {
        self.out.bytes.len()
    }
}

/// Serialises the top-level value: a map or a struct is written member by member; anything
/// else stops with [`Stop::NotAnObject`] and is left to the `Value` path.
struct TopWriter<'w, 'k> {
    w: &'w mut Writer<'k>,
    top: Top,
    mask: u64,
}

impl<'w, 'k> TopWriter<'w, 'k> {
    fn object(self) -> Result<ObjectWriter<'w, 'static, 'k>, Stop> {
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
struct ValueWriter<'w, 'p, 'k> {
    w: &'w mut Writer<'k>,
    path: &'p Path<'p>,
    depth: usize,
    mask: u64,
    level: usize,
}

impl<'w, 'p, 'k> ValueWriter<'w, 'p, 'k> {
    /// Opens an array, or `{"variant":[` for tuple variants.
    fn open_seq(self, variant: Option<&'static str>) -> Result<SeqWriter<'w, 'p, 'k>, Stop> {
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
    fn open_map(self, variant: Option<&'static str>) -> Result<ObjectWriter<'w, 'p, 'k>, Stop> {
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

/// Writes an array; for tuple variants, `{"variant":[...]}`.
struct SeqWriter<'w, 'p, 'k> {
    w: &'w mut Writer<'k>,
    parent: &'p Path<'p>,
    variant: Option<&'static str>,
    /// Depth of the elements.
    depth: usize,
    count: usize,
    /// Paths that end at the variant, and where the array starts.
    capture: u64,
    start: usize,
}

impl SeqWriter<'_, '_, '_> {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        let tagged;
        let base = match self.variant {
            Some(name) => {
                tagged = Path::Key(self.parent, name);
                &tagged
            }
            None => self.parent,
        };
        if self.count > 0 {
            self.w.push(b",");
        }
        value.serialize(ValueWriter {
            w: &mut *self.w,
            path: &Path::Index(base, self.count),
            depth: self.depth,
            mask: 0,
            level: 0,
        })?;
        self.count += 1;
        Ok(())
    }

    fn finish(self) -> Result<(), Stop> {
        self.w.push(b"]");
        if self.variant.is_some() {
            if self.capture != 0 {
                let w = &mut *self.w;
                w.capture.record(self.capture, &w.out.bytes[self.start..]);
            }
            self.w.push(b"}");
        }
        Ok(())
    }
}

impl ser::SerializeSeq for SeqWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.push(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

impl ser::SerializeTuple for SeqWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.push(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for SeqWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.push(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for SeqWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.push(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

/// Above this many members, duplicate names are found through a hash set rather than by
/// comparing with each earlier name.
const LINEAR_DUPLICATE_CHECK: usize = 16;

/// Writes an object (for struct variants, `{"variant":{...}}`); at the top level, the
/// arguments' members, kept apart in `w.out`.
struct ObjectWriter<'w, 'p, 'k> {
    w: &'w mut Writer<'k>,
    parent: &'p Path<'p>,
    variant: Option<&'static str>,
    /// Depth of the member values.
    depth: usize,
    /// The top level: members are entries of `w.out`, unframed. Else `{` is at `start`.
    top: bool,
    start: usize,
    /// This object's first span in `w.spans`, and its names' start in `w.names`.
    first_span: usize,
    names_start: usize,
    /// A struct variant's wrapper: the paths that end at the variant, and where its value starts.
    wrapped: Option<(u64, usize)>,
    /// Paths that matched up to this object, `level` segments.
    mask: u64,
    level: usize,
    /// The map key being written (one buffer per map).
    key: String,
    /// The member waiting for its value.
    pending: Option<Pending>,
    /// Names seen so far, once there are many.
    seen: Option<HashSet<Box<str>>>,
}

/// A member whose name is written: a static field name (else the name is `key`), where its
/// text starts, and where its name is in the name buffer.
#[derive(Clone, Copy)]
struct Pending {
    name: Option<&'static str>,
    start: usize,
    name_at: (usize, usize),
}

impl<'w, 'p, 'k> ObjectWriter<'w, 'p, 'k> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        w: &'w mut Writer<'k>,
        parent: &'p Path<'p>,
        variant: Option<&'static str>,
        depth: usize,
        wrapped: Option<(u64, usize)>,
        mask: u64,
        level: usize,
        top: bool,
    ) -> Self {
        let start = w.len();
        if !top {
            w.push(b"{");
        }
        let (first_span, names_start) = (w.spans.len(), w.names.len());
        Self {
            w,
            parent,
            variant,
            depth,
            top,
            start,
            first_span,
            names_start,
            wrapped,
            mask,
            level,
            key: String::new(),
            pending: None,
            seen: None,
        }
    }

    /// A map key, as serde_json turns it into a member name.
    fn map_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
        self.key.clear();
        let tagged;
        let path = match self.variant {
            Some(name) => {
                tagged = Path::Key(self.parent, name);
                &tagged
            }
            None => self.parent,
        };
        key.serialize(KeyWriter { path, out: &mut self.key })?;
        self.begin(None)
    }

    /// Starts the member named `name` (else `self.key`): refuses a name this object already
    /// has, then writes `"name":`.
    fn begin(&mut self, name: Option<&'static str>) -> Result<(), Stop> {
        let text: &str = match name {
            Some(name) => name,
            None => &self.key,
        };
        let w = &mut *self.w;
        let count = if self.top { w.out.entries.len() } else { w.spans.len() - self.first_span };
        let duplicate = if count > LINEAR_DUPLICATE_CHECK {
            let seen = self.seen.get_or_insert_with(|| {
                if self.top {
                    w.out.entries.iter().map(|entry| Box::from(&w.out.names[entry.name.0..entry.name.1])).collect()
                } else {
                    w.spans[self.first_span..]
                        .iter()
                        .map(|span| Box::from(&w.names[span.name.0..span.name.1]))
                        .collect()
                }
            });
            !seen.insert(Box::from(text))
        } else if self.top {
            w.out.entries.iter().any(|entry| &w.out.names[entry.name.0..entry.name.1] == text)
        } else {
            w.spans[self.first_span..].iter().any(|span| &w.names[span.name.0..span.name.1] == text)
        };
        if duplicate {
            let path = match self.variant {
                Some(variant) => Path::Key(self.parent, variant).render(),
                None => self.parent.render(),
            };
            return Err(Stop::Failed(CanonicalError::DuplicateKey { path, key: text.to_owned() }));
        }
        if !self.top && count > 0 {
            w.push(b",");
        }
        let start = w.len();
        write_string(text, &mut w.out.bytes);
        w.push(b":");
        let names = if self.top { &mut w.out.names } else { &mut w.names };
        let from = names.len();
        names.push_str(text);
        self.pending = Some(Pending { name, start, name_at: (from, names.len()) });
        Ok(())
    }

    /// The value of the pending member.
    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        let Some(pending) = self.pending.take() else {
            return Err(ser::Error::custom("serialize_value was called before serialize_key"));
        };
        let name: &str = match pending.name {
            Some(name) => name,
            None => &self.key,
        };
        let (deeper, here) = if self.mask == 0 { (0, 0) } else { self.w.capture.step(self.mask, self.level, name) };
        let tagged;
        let object = match self.variant {
            Some(variant) => {
                tagged = Path::Key(self.parent, variant);
                &tagged
            }
            None => self.parent,
        };
        let start = self.w.len();
        value.serialize(ValueWriter {
            w: &mut *self.w,
            path: &Path::Key(object, name),
            depth: self.depth,
            mask: deeper,
            level: self.level + 1,
        })?;
        let w = &mut *self.w;
        if here != 0 {
            w.capture.record(here, &w.out.bytes[start..]);
        }
        let end = w.len();
        if self.top {
            w.out.entries.push(Entry { name: pending.name_at, member: pending.start, value: start, end });
        } else {
            w.spans.push(Span { name: pending.name_at, start: pending.start, end });
        }
        Ok(())
    }

    /// Puts the members in order and closes the object (and a struct variant's wrapper).
    fn finish(self) -> Result<(), Stop> {
        if self.top {
            // Sorted once, in `Members::capture`.
            return Ok(());
        }
        let Writer { out, spans, names, scratch, capture } = &mut *self.w;
        let members = &mut spans[self.first_span..];
        let name = |span: &Span| &names[span.name.0..span.name.1];
        let in_order = members.windows(2).all(|pair| utf16_cmp(name(&pair[0]), name(&pair[1])).is_lt());
        if !in_order {
            // Members are `"name":value` separated by commas: copy them out and back in order.
            let base = self.start + 1;
            scratch.clear();
            scratch.extend_from_slice(&out.bytes[base..]);
            members.sort_unstable_by(|a, b| utf16_cmp(name(a), name(b)));
            out.bytes.truncate(base);
            for (index, span) in members.iter().enumerate() {
                if index > 0 {
                    out.bytes.push(b',');
                }
                out.bytes.extend_from_slice(&scratch[span.start - base..span.end - base]);
            }
        }
        out.bytes.push(b'}');
        spans.truncate(self.first_span);
        names.truncate(self.names_start);
        if let Some((here, start)) = self.wrapped {
            if here != 0 {
                capture.record(here, &out.bytes[start..]);
            }
            out.bytes.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for ObjectWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
        self.map_key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.value(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

impl ser::SerializeStruct for ObjectWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Stop> {
        self.begin(Some(key))?;
        self.value(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for ObjectWriter<'_, '_, '_> {
    type Ok = ();
    type Error = Stop;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Stop> {
        self.begin(Some(key))?;
        self.value(value)
    }

    fn end(self) -> Result<(), Stop> {
        self.finish()
    }
}

/// Turns a map key into a member name the way serde_json's `MapKeySerializer` does (and the
/// strict serializer's `KeySerializer`), into `out`; `path` is the map's.
struct KeyWriter<'p, 'o> {
    path: &'p Path<'p>,
    out: &'o mut String,
}

impl KeyWriter<'_, '_> {
    fn refuse(&self) -> Stop {
        Stop::Failed(CanonicalError::NonStringKey { path: self.path.render() })
    }

    fn display(self, value: impl fmt::Display) -> Result<(), Stop> {
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = write!(self.out, "{value}");
        Ok(())
    }
}

impl ser::Serializer for KeyWriter<'_, '_> {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Impossible<(), Stop>;
    type SerializeTuple = Impossible<(), Stop>;
    type SerializeTupleStruct = Impossible<(), Stop>;
    type SerializeTupleVariant = Impossible<(), Stop>;
    type SerializeMap = Impossible<(), Stop>;
    type SerializeStruct = Impossible<(), Stop>;
    type SerializeStructVariant = Impossible<(), Stop>;

    fn serialize_bool(self, v: bool) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Stop> {
        self.display(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Stop> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Stop> {
        if v.is_finite() {
            write_double(v, self.out);
            Ok(())
        } else {
            Err(Stop::Failed(CanonicalError::NonFinite { path: self.path.render() }))
        }
    }
    fn serialize_char(self, v: char) -> Result<(), Stop> {
        self.out.push(v);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Stop> {
        self.out.push_str(v);
        Ok(())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_none(self) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_unit(self) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Stop> {
        self.out.push_str(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Stop> {
        Err(self.refuse())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Stop> {
        Err(self.refuse())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Stop> {
        Err(self.refuse())
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, Stop> {
        Err(self.refuse())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Stop> {
        Err(self.refuse())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Stop> {
        Err(self.refuse())
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, Stop> {
        Err(self.refuse())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Stop> {
        Err(self.refuse())
    }
}
