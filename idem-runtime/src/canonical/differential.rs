//! The streaming canonicaliser ([`Members`]) against the reference path through a
//! `serde_json::Value` (the strict serializer, the encoder, `Key::derive`, `Fingerprint::of`,
//! the arguments' lookup by path), over generated values: the same bytes, keys, fingerprints,
//! tags and errors, or a test failure. A faster key that is a different key is a bug.
//!
//! Values are generated as a tree that drives every `Serializer` method (128-bit integers,
//! `f32`, chars, bytes, every enum variant shape, options, newtypes, maps with non-string
//! keys), with member names from a small pool that needs UTF-16 ordering and collides often
//! (so duplicates, nested key paths and replaced members all happen).

use proptest::prelude::*;
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant, Serializer};
use serde_json::{Map, Value};

use super::serialize::arguments_to_value;
use super::{CanonicalError, MAX_DEPTH, Members, to_canonical_vec, to_value};
use crate::idem::CallArguments;
use crate::key::{Fingerprint, Key};
use crate::recipe::{Recipe, ScopeRule};
use crate::rejection::Rejection;
use crate::scope::{Caller, Scope};
use crate::secret::Secret;

/// Member names: ASCII, Latin-1, a BMP character above the surrogates (U+FF61, after a
/// surrogate pair in UTF-16 but before it in UTF-8), characters beyond U+FFFF, a name with a
/// dot, an empty name, and names that need escaping.
const NAMES: &[&str] =
    &["a", "b", "ab", "é", "\u{ff61}", "\u{1f600}", "\u{10000}", "a.b", "", "q\"", "\u{7}", "Variant", "1"];

/// A value that drives the serializer the way a `Serialize` impl would.
#[derive(Debug, Clone)]
enum G {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(f64),
    F32(f32),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    Unit,
    UnitVariant(&'static str),
    NewtypeVariant(&'static str, Box<G>),
    TupleVariant(&'static str, Vec<G>),
    StructVariant(&'static str, Vec<(&'static str, G)>),
    Seq(Vec<G>),
    Struct(Vec<(&'static str, G)>),
    Map(Vec<(K, G)>),
    Some(Box<G>),
    Newtype(Box<G>),
}

/// A map key: what serde_json turns into a member name, and what it refuses.
#[derive(Debug, Clone)]
enum K {
    Str(&'static str),
    I64(i64),
    U128(u128),
    Bool(bool),
    F64(f64),
    Char(char),
    UnitVariant(&'static str),
    Newtype(Box<K>),
    /// Refused: `NonStringKey`.
    Unit,
    /// Refused: `NonStringKey`.
    Seq,
}

impl Serialize for K {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            K::Str(v) => s.serialize_str(v),
            K::I64(v) => s.serialize_i64(*v),
            K::U128(v) => s.serialize_u128(*v),
            K::Bool(v) => s.serialize_bool(*v),
            K::F64(v) => s.serialize_f64(*v),
            K::Char(v) => s.serialize_char(*v),
            K::UnitVariant(v) => s.serialize_unit_variant("K", 0, v),
            K::Newtype(v) => s.serialize_newtype_struct("K", v),
            K::Unit => s.serialize_unit(),
            K::Seq => s.serialize_seq(Some(0))?.end(),
        }
    }
}

impl Serialize for G {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            G::Null => s.serialize_none(),
            G::Bool(v) => s.serialize_bool(*v),
            G::I64(v) => s.serialize_i64(*v),
            G::U64(v) => s.serialize_u64(*v),
            G::I128(v) => s.serialize_i128(*v),
            G::U128(v) => s.serialize_u128(*v),
            G::F64(v) => s.serialize_f64(*v),
            G::F32(v) => s.serialize_f32(*v),
            G::Char(v) => s.serialize_char(*v),
            G::Str(v) => s.serialize_str(v),
            G::Bytes(v) => s.serialize_bytes(v),
            G::Unit => s.serialize_unit(),
            G::UnitVariant(v) => s.serialize_unit_variant("G", 0, v),
            G::NewtypeVariant(v, inner) => s.serialize_newtype_variant("G", 0, v, inner),
            G::TupleVariant(v, items) => {
                let mut seq = s.serialize_tuple_variant("G", 0, v, items.len())?;
                for item in items {
                    ser::SerializeTupleVariant::serialize_field(&mut seq, item)?;
                }
                ser::SerializeTupleVariant::end(seq)
            }
            G::StructVariant(v, fields) => {
                let mut object = s.serialize_struct_variant("G", 0, v, fields.len())?;
                for (name, value) in fields {
                    object.serialize_field(name, value)?;
                }
                object.end()
            }
            G::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            G::Struct(fields) => {
                let mut object = s.serialize_struct("G", fields.len())?;
                for (name, value) in fields {
                    object.serialize_field(name, value)?;
                }
                object.end()
            }
            G::Map(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
            G::Some(inner) => s.serialize_some(inner),
            G::Newtype(inner) => s.serialize_newtype_struct("G", inner),
        }
    }
}

fn name() -> impl Strategy<Value = &'static str> + Clone {
    prop::sample::select(NAMES)
}

/// Doubles of every spelling: integral (within and beyond 2^53 and the 64-bit range), `-0`,
/// fractions, the extremes, and now and then NaN or an infinity (refused).
fn double() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => any::<i32>().prop_map(f64::from),
        2 => any::<f64>().prop_filter("finite", |f| f.is_finite()),
        2 => prop::sample::select(vec![
            0.0, -0.0, 0.5, 1e20, 1e21, 1e-7, 5e-324, f64::MAX, f64::MIN, 9_007_199_254_740_993.0,
            1_152_921_504_606_846_976.0, 18_446_744_073_709_551_616.0, -9_223_372_036_854_775_808.0,
            295_147_905_179_352_825_856.0,
        ]),
        1 => prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
    ]
}

/// 128-bit integers: in the 64-bit range, beyond it as a double (exact), and beyond it inexact.
fn wide() -> impl Strategy<Value = i128> {
    prop_oneof![
        any::<i64>().prop_map(i128::from),
        any::<u64>().prop_map(i128::from),
        any::<i128>(),
        (64u32..127).prop_map(|bits| 1i128 << bits),
        (64u32..126).prop_map(|bits| -(1i128 << bits)),
        (64u32..120).prop_map(|bits| (1i128 << bits) + 1),
    ]
}

fn key() -> impl Strategy<Value = K> {
    prop_oneof![
        12 => name().prop_map(K::Str),
        1 => any::<i64>().prop_map(K::I64),
        1 => prop::sample::select(vec![0u128, 1, u128::MAX]).prop_map(K::U128),
        1 => any::<bool>().prop_map(K::Bool),
        1 => double().prop_map(K::F64),
        1 => prop::sample::select(vec!['a', 'é', '\u{1f600}']).prop_map(K::Char),
        1 => name().prop_map(K::UnitVariant),
        1 => name().prop_map(|n| K::Newtype(Box::new(K::Str(n)))),
        1 => Just(K::Unit),
        1 => Just(K::Seq),
    ]
}

fn leaf() -> impl Strategy<Value = G> {
    prop_oneof![
        2 => Just(G::Null),
        1 => Just(G::Unit),
        1 => any::<bool>().prop_map(G::Bool),
        3 => any::<i64>().prop_map(G::I64),
        2 => any::<u64>().prop_map(G::U64),
        2 => wide().prop_map(G::I128),
        1 => prop_oneof![any::<u128>(), Just(1u128 << 127), Just((1u128 << 127) + 1), Just(u128::MAX)].prop_map(G::U128),
        3 => double().prop_map(G::F64),
        1 => any::<f32>().prop_map(G::F32),
        1 => any::<char>().prop_map(G::Char),
        4 => "(\\PC|[\"\\\\\\x00-\\x1f\u{ff61}\u{1f600}]){0,6}".prop_map(G::Str),
        1 => prop::collection::vec(any::<u8>(), 0..4).prop_map(G::Bytes),
        1 => name().prop_map(G::UnitVariant),
    ]
}

fn value() -> impl Strategy<Value = G> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        let fields = prop::collection::vec((name(), inner.clone()), 0..6);
        prop_oneof![
            3 => fields.clone().prop_map(G::Struct),
            3 => prop::collection::vec((key(), inner.clone()), 0..6).prop_map(G::Map),
            2 => prop::collection::vec(inner.clone(), 0..4).prop_map(G::Seq),
            1 => (name(), inner.clone()).prop_map(|(n, v)| G::NewtypeVariant(n, Box::new(v))),
            1 => (name(), prop::collection::vec(inner.clone(), 0..3)).prop_map(|(n, v)| G::TupleVariant(n, v)),
            1 => (name(), fields).prop_map(|(n, f)| G::StructVariant(n, f)),
            1 => inner.clone().prop_map(|v| G::Some(Box::new(v))),
            1 => inner.prop_map(|v| G::Newtype(Box::new(v))),
        ]
    })
}

/// Arguments: mostly objects (structs or maps of named members), sometimes anything.
fn arguments() -> impl Strategy<Value = G> {
    let member = || (name(), value());
    prop_oneof![
        4 => prop::collection::vec(member(), 0..7).prop_map(G::Struct),
        4 => prop::collection::vec(member(), 0..7)
            .prop_map(|members| G::Map(members.into_iter().map(|(n, v)| (K::Str(n), v)).collect())),
        1 => value(),
    ]
}

/// Key paths of one to three segments, from the same names (so they often lead somewhere).
fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(name(), 1..4).prop_map(|segments| segments.join("."))
}

fn secret() -> Secret {
    Secret::new(3, &[0x5a; 32]).unwrap()
}

/// The members the reference path makes of an object.
fn reference_members(map: &Map<String, Value>) -> Members {
    Members::from_map(map).unwrap()
}

/// The stream against `to_value` for one value: as a member's value (bytes and errors), and as
/// an object of members.
fn check_value(g: &G) -> Result<(), TestCaseError> {
    let reference = to_value(g);
    let mut members = Members::new();
    let streamed = members.insert("x", g);
    match (&reference, &streamed) {
        (Ok(value), Ok(())) => {
            let expected = to_canonical_vec(value).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(members.get("x").unwrap()), String::from_utf8_lossy(&expected));
        }
        (Err(expected), Err(found)) => {
            prop_assert_eq!(expected, found);
            prop_assert!(members.is_empty(), "a refused value left a member");
        }
        _ => prop_assert!(false, "to_value: {reference:?}, stream: {streamed:?}"),
    }
    match (reference, Members::of_object(g)) {
        (Ok(Value::Object(map)), Ok(Some(found))) => prop_assert_eq!(reference_members(&map), found),
        (Ok(value), Ok(None)) => prop_assert!(!value.is_object()),
        (Err(expected), Err(found)) => prop_assert_eq!(expected, found),
        (expected, found) => prop_assert!(false, "to_value: {expected:?}, stream: {found:?}"),
    }
    Ok(())
}

/// The stream against `arguments_to_value` + `Fingerprint::of` for one call's arguments.
fn check_arguments(g: &G, ignore: &[&str]) -> Result<(), TestCaseError> {
    let secret = secret();
    let reference = arguments_to_value(g);
    let streamed = Members::of_arguments(g);
    match (reference, streamed) {
        (Ok(Value::Object(map)), Ok(members)) => {
            prop_assert_eq!(&reference_members(&map), &members);
            let expected = Fingerprint::of(&secret, &map, ignore).unwrap();
            let found = Fingerprint::of_members(&secret, &members, ignore);
            prop_assert_eq!(expected.digest(), found.digest());
            prop_assert_eq!(expected.tags(), found.tags());
            prop_assert_eq!(expected.names(), found.names());
            // A call's path tags later, and only a claim that is sent: the same tags then.
            let mut later = Fingerprint::digest_of_members(&secret, &members, ignore);
            prop_assert_eq!(expected.digest(), later.digest());
            later.tag(&secret);
            prop_assert_eq!(&expected, &later);
        }
        (Ok(value), Err(CanonicalError::Invalid { message })) => {
            prop_assert!(!value.is_object());
            prop_assert_eq!(message, "the arguments must be a JSON object");
        }
        (Err(expected), Err(found)) => prop_assert_eq!(expected, found),
        (expected, found) => prop_assert!(false, "reference: {expected:?}, stream: {found:?}"),
    }
    Ok(())
}

fn leak(paths: Vec<String>) -> &'static [&'static str] {
    Vec::leak(paths.into_iter().map(|path| &*String::leak(path)).collect())
}

/// The stream against the reference through `Idem::call`'s split of the arguments: key paths
/// (nested, optional, missing, `null`), the `within` id, the key and the fingerprint.
fn check_call(
    g: &G,
    keys: Vec<String>,
    optional: &[bool],
    ignore: Vec<String>,
    within: Option<String>,
) -> Result<(), TestCaseError> {
    let optional = keys.iter().zip(optional).filter(|(_, optional)| **optional).map(|(key, _)| key.clone()).collect();
    let mut recipe = Recipe::new("tool", leak(keys)).optional_keys(leak(optional)).ignore(leak(ignore));
    if let Some(within) = within {
        recipe = recipe.scope(ScopeRule::Within(String::leak(within)));
    }
    let secret = secret();
    let caller = Caller::new("acme", "alice");
    let reference = CallArguments::of_value(&recipe, g);
    let streamed = CallArguments::of(&recipe, g);
    let (expected, found) = match (reference, streamed) {
        (Ok(expected), Ok(found)) => (expected, found),
        (Err(Rejection::InvalidArguments { error: expected }), Err(Rejection::InvalidArguments { error: found })) => {
            prop_assert_eq!(expected, found);
            return Ok(());
        }
        (expected, found) => {
            prop_assert!(false, "reference: {expected:?}, stream: {found:?}");
            unreachable!()
        }
    };
    // The id is read back from its canonical text, so `0.0` may come back as `0`: what the
    // scope keys is its canonical form, which must be the same.
    let canonical = |within: &Option<Value>| within.as_ref().map(|value| to_canonical_vec(value).unwrap());
    prop_assert_eq!(canonical(&expected.within), canonical(&found.within));
    prop_assert_eq!(
        expected.within.as_ref().is_some_and(Value::is_null),
        found.within.as_ref().is_some_and(Value::is_null)
    );
    let scope = match &found.within {
        Some(within) if !within.is_null() => Scope::within(&caller, within.clone()),
        _ => Scope::caller(&caller),
    };
    let (all, selected) = (&expected.all, &expected.selected);
    let expected_key = Key::derive(&secret, "ns", &scope, "tool", selected).unwrap();
    let found_key = Key::derive_members(&secret, "ns", &scope, "tool", &found.selected).unwrap();
    prop_assert_eq!(expected_key, found_key);
    let expected_print = Fingerprint::of(&secret, all, recipe.ignore_paths()).unwrap();
    let found_print = Fingerprint::of_members(&secret, &found.all, recipe.ignore_paths());
    prop_assert_eq!(expected_print.digest(), found_print.digest());
    prop_assert_eq!(expected_print.tags(), found_print.tags());
    prop_assert_eq!(expected_print.names(), found_print.names());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Any value: the same canonical bytes, or the same refusal.
    #[test]
    fn a_value_streams_to_the_bytes_of_its_value(g in value()) {
        check_value(&g)?;
    }

    /// Any arguments: the same members, fingerprint digest, tags and names, or the same refusal.
    #[test]
    fn arguments_stream_to_the_fingerprint_of_their_value(g in arguments(), ignore in prop::collection::vec(name(), 0..3)) {
        check_arguments(&g, &ignore)?;
    }

    /// Any arguments and recipe: the same key, fingerprint and scope id, or the same refusal.
    #[test]
    fn a_call_streams_to_the_key_of_its_value(
        g in arguments(),
        // Up to seven key paths (and the `within` id): past the four whose values are held in
        // place.
        keys in prop::collection::vec(path(), 0..8),
        optional in prop::collection::vec(prop::bool::weighted(0.3), 8),
        ignore in prop::collection::vec(name().prop_map(str::to_owned), 0..3),
        within in prop::option::weighted(0.3, path()),
    ) {
        check_call(&g, keys, &optional, ignore, within)?;
    }
}

/// Nesting at and beyond the limit, as a member, as arguments and as an object.
#[test]
fn depth_is_bounded_alike() {
    fn nest(depth: usize, leaf: G, wrap: fn(G) -> G) -> G {
        (0..depth).fold(leaf, |inner, _| wrap(inner))
    }
    let wraps: [fn(G) -> G; 5] = [
        |g| G::Seq(vec![g]),
        |g| G::Struct(vec![("a", g)]),
        |g| G::Map(vec![(K::Str("é"), g)]),
        |g| G::NewtypeVariant("V", Box::new(g)),
        |g| G::StructVariant("V", vec![("b", g)]),
    ];
    for wrap in wraps {
        for depth in [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1] {
            for leaf in [G::I64(1), G::Bytes(vec![1]), G::Seq(vec![]), G::TupleVariant("T", vec![])] {
                let g = nest(depth, leaf, wrap);
                check_value(&g).unwrap();
                check_arguments(&G::Struct(vec![("arg", g.clone())]), &[]).unwrap();
                check_call(&G::Struct(vec![("arg", g)]), vec!["arg.a".into(), "arg".into()], &[true], vec![], None)
                    .unwrap();
            }
        }
    }
}

/// Many members: duplicates are found past the linear check, and order is RFC 8785's.
#[test]
fn wide_objects_alike() {
    let names: Vec<&'static str> = (0..40).map(|i| &*String::leak(format!("m{}", (i * 7) % 40))).collect();
    let members: Vec<(K, G)> = names.iter().map(|name| (K::Str(name), G::I64(1))).collect();
    check_value(&G::Map(members.clone())).unwrap();
    check_arguments(&G::Map(members.clone()), &[]).unwrap();
    let mut duplicated = members;
    duplicated.push((K::Str("m3"), G::F64(f64::NAN)));
    check_value(&G::Map(duplicated.clone())).unwrap();
    check_arguments(&G::Map(duplicated), &[]).unwrap();
    assert!(matches!(
        Members::of_arguments(&G::Struct(vec![("a", G::Null), ("a", G::Null)])),
        Err(CanonicalError::DuplicateKey { .. })
    ));
}
