//! The streaming canonicaliser: a Rust value (`Serialize`) straight to its RFC 8785 bytes, with
//! no `serde_json::Value` in between ([`Members`]).
//!
//! What it guarantees: for any value, the bytes are exactly `write_canonical(&to_value(v)?)`,
//! and it refuses exactly what [`to_value`](super::to_value) refuses, with the same error (the
//! same variant, path and message, found in the same order). It is a second implementation of
//! the strict serializer's rules, so `canonical/differential.rs` compares the two over generated values;
//! the `Value` path stays the reference.
//!
//! How: every value is written in one pass. An object's members are written one after another
//! as they arrive, each `"name":value` recorded as a byte range; when the object ends, the
//! ranges are put in RFC 8785 order (UTF-16 order of the names), which costs nothing when they
//! arrived in order and one copy of the object otherwise. Names of a struct's fields are
//! `&'static str` and are never copied; map keys are written into one buffer per map. The
//! members of the top-level object (a call's arguments) are kept apart, so that a key and a
//! fingerprint hash them by name without writing them again.

use std::fmt;

use serde::ser::Serialize;
use serde_json::{Map, Value};

use super::encode::{utf16_cmp, write_canonical};
use super::error::{CanonicalError, Path};
use super::string::write_string;

mod writer;

use writer::{Capture, NOT_AN_OBJECT, Stop, Top, TopWriter, ValueWriter, Writer};

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
///
/// Where the first [`Found::INLINE`] paths' values are is held in place (a recipe's key has one
/// to three paths): a call's arguments cost one allocation here, for the values' bytes.
#[derive(Debug, Default)]
pub(crate) struct Found {
    bytes: Vec<u8>,
    inline: [Option<(usize, usize)>; Found::INLINE],
    /// Paths from the `INLINE`th on.
    more: Vec<Option<(usize, usize)>>,
}

impl Found {
    const INLINE: usize = 4;

    fn new(paths: usize) -> Self {
        Self { bytes: Vec::new(), inline: [None; Self::INLINE], more: vec![None; paths.saturating_sub(Self::INLINE)] }
    }

    fn set(&mut self, index: usize, value: &[u8]) {
        if self.bytes.capacity() == 0 {
            // Room for a few key values at once, instead of growing by doubling from 8 bytes.
            self.bytes.reserve(value.len().max(64));
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(value);
        let at = Some((start, self.bytes.len()));
        match index.checked_sub(Self::INLINE) {
            None => self.inline[index] = at,
            Some(beyond) => self.more[beyond] = at,
        }
    }

    /// The canonical value at the `index`th path, if the arguments have one (`null` included).
    pub(crate) fn get(&self, index: usize) -> Option<&[u8]> {
        let at = match index.checked_sub(Self::INLINE) {
            None => self.inline[index],
            Some(beyond) => self.more.get(beyond).copied().flatten(),
        };
        at.map(|(start, end)| &self.bytes[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::Members;

    /// Every path's value is found, past the ones held in place too; a path that leads nowhere
    /// finds nothing.
    #[test]
    fn values_are_found_at_every_path() {
        let arguments = serde_json::json!({
            "a": 1, "b": "two", "c": [3], "d": {"x": null}, "e": true, "f": {"g": 6.5}, "h": null
        });
        let paths = ["a", "b", "c", "d", "e", "f.g", "h", "missing", "f.missing"];
        let (_, found) = Members::of_arguments_at(&arguments, &paths).unwrap();
        let expected: [Option<&[u8]>; 9] = [
            Some(b"1"),
            Some(b"\"two\""),
            Some(b"[3]"),
            Some(br#"{"x":null}"#),
            Some(b"true"),
            Some(b"6.5"),
            Some(b"null"),
            None,
            None,
        ];
        for (index, expected) in expected.into_iter().enumerate() {
            assert_eq!(found.get(index), expected, "{}", paths[index]);
        }
        assert_eq!(found.get(paths.len()), None);
    }
}
