//! The streaming canonicaliser's compound values: arrays, objects (members put in RFC 8785
//! order as the object ends, duplicates refused) and map keys.

use std::collections::HashSet;
use std::fmt;

use serde::ser::{self, Impossible, Serialize};

use crate::canonical::encode::{utf16_cmp, write_double};
use crate::canonical::error::{CanonicalError, Path};
use crate::canonical::string::write_string;

use super::super::Entry;
use super::{Span, Stop, ValueWriter, Writer};

/// Writes an array; for tuple variants, `{"variant":[...]}`.
pub(in crate::canonical::stream) struct SeqWriter<'w, 'p, 'k> {
    pub(super) w: &'w mut Writer<'k>,
    pub(super) parent: &'p Path<'p>,
    pub(super) variant: Option<&'static str>,
    /// Depth of the elements.
    pub(super) depth: usize,
    pub(super) count: usize,
    /// Paths that end at the variant, and where the array starts.
    pub(super) capture: u64,
    pub(super) start: usize,
}

impl SeqWriter<'_, '_, '_> {
    pub(super) fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
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

    pub(super) fn finish(self) -> Result<(), Stop> {
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
pub(super) const LINEAR_DUPLICATE_CHECK: usize = 16;

/// Writes an object (for struct variants, `{"variant":{...}}`); at the top level, the
/// arguments' members, kept apart in `w.out`.
pub(in crate::canonical::stream) struct ObjectWriter<'w, 'p, 'k> {
    pub(super) w: &'w mut Writer<'k>,
    pub(super) parent: &'p Path<'p>,
    pub(super) variant: Option<&'static str>,
    /// Depth of the member values.
    pub(super) depth: usize,
    /// The top level: members are entries of `w.out`, unframed. Else `{` is at `start`.
    pub(super) top: bool,
    pub(super) start: usize,
    /// This object's first span in `w.spans`, and its names' start in `w.names`.
    pub(super) first_span: usize,
    pub(super) names_start: usize,
    /// A struct variant's wrapper: the paths that end at the variant, and where its value starts.
    pub(super) wrapped: Option<(u64, usize)>,
    /// Paths that matched up to this object, `level` segments.
    pub(super) mask: u64,
    pub(super) level: usize,
    /// The map key being written (one buffer per map).
    pub(super) key: String,
    /// The member waiting for its value.
    pub(super) pending: Option<Pending>,
    /// Names seen so far, once there are many.
    pub(super) seen: Option<HashSet<Box<str>>>,
}

/// A member whose name is written: a static field name (else the name is `key`), where its
/// text starts, and where its name is in the name buffer.
#[derive(Clone, Copy)]
pub(in crate::canonical::stream) struct Pending {
    pub(super) name: Option<&'static str>,
    pub(super) start: usize,
    pub(super) name_at: (usize, usize),
}

impl<'w, 'p, 'k> ObjectWriter<'w, 'p, 'k> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
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
    pub(super) fn map_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
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
    pub(super) fn begin(&mut self, name: Option<&'static str>) -> Result<(), Stop> {
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
    pub(super) fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
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
    pub(super) fn finish(self) -> Result<(), Stop> {
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
pub(in crate::canonical::stream) struct KeyWriter<'p, 'o> {
    pub(super) path: &'p Path<'p>,
    pub(super) out: &'o mut String,
}

impl KeyWriter<'_, '_> {
    pub(super) fn refuse(&self) -> Stop {
        Stop::Failed(CanonicalError::NonStringKey { path: self.path.render() })
    }

    pub(super) fn display(self, value: impl fmt::Display) -> Result<(), Stop> {
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
    refuse_non_string_keys!();
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Stop> {
        self.out.push_str(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Stop> {
        value.serialize(self)
    }
}
