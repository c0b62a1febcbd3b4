//! Hostile input: property runs over the canonical encoder, the strict parser, key derivation
//! and fingerprints (never a panic; every accepted input canonicalises to a fixpoint; spelling
//! never changes a key; duplicates are always refused), and named cases through `Idem::call`:
//! non-finite numbers, numbers beyond a double, nesting far beyond the limit, a multi-megabyte
//! argument, a result above the size limit, duplicate member names, arguments that are not an
//! object, hostile refs. Each named case checks the error, that the handler did not run where it
//! must not, and the ledger afterwards (`Idem::status`).
//!
//! Property cases: 1,000 per property in the short run, 100,000 in the long run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::canonical::{CanonicalError, MAX_DEPTH, parse_strict, to_canonical_vec, to_value};
use idem_runtime::ledger::{Ledger, Resolution};
use idem_runtime::{
    Caller, HasIdem, Idem, Key, MemoryLedger, Recipe, Ref, idempotent, key::Fingerprint, ledger::State, scope::Scope,
    scope::TenantTag,
};
use proptest::prelude::*;
use proptest::sample::Index;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde::Serialize;
use serde_json::{Map, Number, Value, json};
use sha2::{Digest, Sha256};

use crate::support;
use crate::support::{RelError, scale, stored_ok, unique};

/// HMAC-SHA256 (RFC 2104) for a key of one block or less, written out here so the definition is
/// checked against an independent implementation.
fn hmac_sha256(key: &[u8], label: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let inner =
        Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(label).chain_update(message).finalize();
    Sha256::new().chain_update(block.map(|b| b ^ 0x5c)).chain_update(inner).finalize().into()
}

fn config() -> ProptestConfig {
    // No regression files: a failure prints its minimal input, and this suite writes nothing.
    ProptestConfig {
        cases: u32::try_from(scale(1_000, 100_000)).unwrap(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Fragments of JSON and near-JSON: the alphabet of malformed input.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\"a\"",
    "\"\\u0061\"",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "\"\\ud83d\\ude00\"",
    "\\u00",
    "\\",
    "\\x",
    "0",
    "1",
    "-",
    "-0",
    "01",
    "1.",
    ".5",
    "+1",
    "1e",
    "1e400",
    "-1e400",
    "1e-400",
    "0.1",
    "1E+2",
    "9007199254740993",
    "9007199254740992",
    "18446744073709551615",
    "18446744073709551616",
    "295147905179352830000",
    "1e21",
    "123456789012345678901234567890",
    "true",
    "false",
    "null",
    "nul",
    "NaN",
    "Infinity",
    " ",
    "\t",
    "\n",
    "\r",
    "\u{feff}",
    "\u{0}",
    "\u{1f}",
    "é",
    "𝄞",
    "\u{7f}",
    "\"\u{1}\"",
    "//",
    "/*",
    "'a'",
    "\"\\/\"",
    "\"\\b\\f\\n\\r\\t\"",
    "\"\\q\"",
    "\"\\u12\"",
    "[[[[",
    "]]]]",
    "{\"a\":",
    "{\"a\":1,\"a\":2}",
];

fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::num::f64::NORMAL.prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::num::f64::SUBNORMAL.prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (0u32..64).prop_map(|e| Value::from(1u64 << e)),
        (-30i32..30).prop_map(|e| Number::from_f64(10f64.powi(e)).map_or(Value::Null, Value::Number)),
    ]
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c]{0,2}", any::<String>(), "[\\x00-\\x20\"\\\\/\u{e000}\u{ffff}\u{10000}\u{10ffff}]{0,4}"]
}

fn arb_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        any::<String>().prop_map(Value::String),
        "[\\x00-\\x40\u{2028}\u{fffd}\u{1f600}]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_name(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
    .boxed()
}

fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(prop::sample::select(TOKENS), 0..48).prop_map(|tokens| tokens.concat()),
        (arb_json(), prop::collection::vec((any::<Index>(), any::<Index>(), 0u8..4), 1..6))
            .prop_map(|(value, edits)| mutate(&serde_json::to_string(&value).unwrap(), &edits)),
    ]
}

/// Applies byte-level damage to JSON text: delete a character, insert a token, truncate,
/// duplicate a slice.
fn mutate(text: &str, edits: &[(Index, Index, u8)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for (at, token, op) in edits {
        let pos = at.index(chars.len() + 1);
        match op {
            0 if pos < chars.len() => {
                chars.remove(pos);
            }
            1 => {
                let inserted: Vec<char> = token.get(TOKENS).chars().collect();
                chars.splice(pos..pos, inserted);
            }
            2 => chars.truncate(pos),
            _ => {
                let end = (pos + 1 + token.index(8)).min(chars.len());
                let slice: Vec<char> = chars[pos.min(end)..end].to_vec();
                chars.splice(pos..pos, slice);
            }
        }
    }
    chars.into_iter().collect()
}

/// Writes a value as JSON text with the spelling chosen by `choices`: member order, whitespace,
/// string escapes (`\u` escapes, upper-case hex, surrogate pairs, `\/`) and number spellings
/// (`1`, `1.0`, `1e0`, `10e-1`, `1.0000000000000000e0`, …).
struct Speller<'a> {
    choices: &'a [u8],
    at: usize,
}

impl Speller<'_> {
    fn pick(&mut self, n: usize) -> usize {
        if self.choices.is_empty() {
            return 0;
        }
        let choice = self.choices[self.at % self.choices.len()];
        self.at += 1;
        usize::from(choice) % n
    }

    fn ws(&mut self, out: &mut String) {
        out.push_str(["", " ", "\n\t", "\r\n  "][self.pick(4)]);
    }

    fn value(&mut self, value: &Value, out: &mut String) {
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => self.number(n, out),
            Value::String(s) => self.string(s, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.ws(out);
                    self.value(item, out);
                    self.ws(out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                let mut members: Vec<(&String, &Value)> = members.iter().collect();
                match self.pick(3) {
                    0 => members.reverse(),
                    1 if !members.is_empty() => {
                        let by = self.pick(members.len());
                        members.rotate_left(by);
                    }
                    _ => {}
                }
                out.push('{');
                for (i, (name, member)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.ws(out);
                    self.string(name, out);
                    self.ws(out);
                    out.push(':');
                    self.ws(out);
                    self.value(member, out);
                    self.ws(out);
                }
                out.push('}');
            }
        }
    }

    fn string(&mut self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let mode = self.pick(3);
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' if mode == 2 => Some("\\/"),
                _ => None,
            };
            let must_escape = c < '\u{20}' || c == '"' || c == '\\';
            match (short, mode) {
                (Some(short), 0 | 2) => out.push_str(short),
                _ if mode == 1 || must_escape => {
                    let upper = self.pick(2) == 1;
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        if upper {
                            write!(out, "\\u{unit:04X}").unwrap();
                        } else {
                            write!(out, "\\u{unit:04x}").unwrap();
                        }
                    }
                }
                _ => out.push(c),
            }
        }
        out.push('"');
    }

    fn number(&mut self, n: &Number, out: &mut String) {
        let integer = n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
        let spellings: Vec<String> = if let Some(i) = integer {
            #[allow(clippy::cast_precision_loss)]
            let as_double = i as f64;
            if i.unsigned_abs() <= 1 << 53 {
                let mut all = vec![
                    format!("{i}"),
                    format!("{i}.0"),
                    format!("{i}e0"),
                    format!("{as_double:e}"),
                    format!("{i}.000E+0"),
                    format!("{as_double:.20e}"),
                ];
                if i != 0 {
                    all.push(format!("{i}0e-1"));
                }
                all
            } else if as_double as i128 == i {
                vec![format!("{i}"), format!("{i}.0"), format!("{as_double:e}"), format!("{as_double:.25E}")]
            } else {
                // Beyond 2^53 and not a double: only the integer literal is this integer (with a
                // fraction or exponent it is a double, as serde_json reads it too).
                vec![format!("{i}")]
            }
        } else {
            let f = n.as_f64().unwrap();
            vec![
                serde_json::to_string(&f).unwrap(),
                format!("{f:e}"),
                format!("{f:E}"),
                format!("{f:.17e}"),
                format!("{f:.30e}"),
            ]
        };
        let choice = self.pick(spellings.len());
        out.push_str(&spellings[choice]);
    }
}

fn spell(value: &Value, choices: &[u8]) -> String {
    let mut out = String::new();
    let mut speller = Speller { choices, at: 0 };
    speller.ws(&mut out);
    speller.value(value, &mut out);
    speller.ws(&mut out);
    out
}

#[derive(Debug, Clone, Serialize)]
enum Shape {
    Unit,
    Newtype(f64),
    Tuple(i128, u128),
    Struct { a: f32, b: Option<String> },
}

/// A Rust argument full of what JSON cannot hold exactly.
#[derive(Debug, Clone, Serialize)]
struct HostileArgs {
    f: f64,
    g: f32,
    big: i128,
    ubig: u128,
    text: String,
    bytes: Vec<u8>,
    by_int: BTreeMap<i64, f64>,
    by_char: BTreeMap<char, Option<f32>>,
    by_bool: BTreeMap<bool, u8>,
    shapes: Vec<Shape>,
    nested: Vec<Vec<Option<f64>>>,
    unit: (),
    tuple: (u8, String, f64),
}

impl HostileArgs {
    fn all_finite(&self) -> bool {
        let shapes = self.shapes.iter().all(|shape| match shape {
            Shape::Newtype(f) => f.is_finite(),
            Shape::Struct { a, .. } => a.is_finite(),
            _ => true,
        });
        self.f.is_finite()
            && self.g.is_finite()
            && self.by_int.values().all(|f| f.is_finite())
            && self.by_char.values().flatten().all(|f| f.is_finite())
            && shapes
            && self.nested.iter().flatten().flatten().all(|f| f.is_finite())
            && self.tuple.2.is_finite()
    }
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
        1 => Just(f64::MAX),
    ]
}

fn hostile_args() -> impl Strategy<Value = HostileArgs> {
    #[allow(clippy::cast_possible_truncation)]
    let shape = prop_oneof![
        Just(Shape::Unit),
        float().prop_map(Shape::Newtype),
        (any::<i128>(), any::<u128>()).prop_map(|(a, b)| Shape::Tuple(a, b)),
        (float(), proptest::option::of(any::<String>())).prop_map(|(a, b)| Shape::Struct { a: a as f32, b }),
    ];
    #[allow(clippy::cast_possible_truncation)]
    (
        (float(), float(), any::<i128>(), any::<u128>(), any::<String>(), prop::collection::vec(any::<u8>(), 0..8)),
        (
            prop::collection::btree_map(any::<i64>(), float(), 0..4),
            prop::collection::btree_map(any::<char>(), proptest::option::of(float()), 0..4),
            prop::collection::btree_map(any::<bool>(), any::<u8>(), 0..2),
            prop::collection::vec(shape, 0..4),
            prop::collection::vec(prop::collection::vec(proptest::option::of(float()), 0..3), 0..3),
            (any::<u8>(), any::<String>(), float()),
        ),
    )
        .prop_map(|((f, g, big, ubig, text, bytes), (by_int, by_char, by_bool, shapes, nested, tuple))| {
            HostileArgs {
                f,
                g: g as f32,
                big,
                ubig,
                text,
                bytes,
                by_int,
                by_char: by_char.into_iter().map(|(k, v)| (k, v.map(|f| f as f32))).collect(),
                by_bool,
                shapes,
                nested,
                unit: (),
                tuple,
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Any text: no panic. Accepted text canonicalises, the canonical form parses back to itself
    /// (a fixpoint), serde_json accepts it too and agrees on the canonical bytes.
    #[test]
    fn parse_strict_never_panics_and_is_a_fixpoint(text in hostile_text()) {
        if let Ok(value) = parse_strict(&text) {
            let canonical = to_canonical_vec(&value).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            let again = parse_strict(std::str::from_utf8(&canonical).unwrap())
                .map_err(|e| TestCaseError::fail(format!("canonical of {text:?} does not parse: {e}")))?;
            prop_assert_eq!(&to_canonical_vec(&again).unwrap(), &canonical);
            let lenient: Value = serde_json::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("strict accepted what serde_json refuses: {text:?}: {e}")))?;
            if let Ok(lenient) = to_canonical_vec(&lenient) {
                prop_assert_eq!(lenient, canonical, "serde_json and parse_strict disagree on {:?}", text);
            }
        }
    }

    /// Any value: no panic; canonical output is JSON that parses (strictly) back to the same bytes.
    #[test]
    fn canonical_form_of_any_value(value in arb_json()) {
        if let Ok(canonical) = to_canonical_vec(&value) {
            let text = std::str::from_utf8(&canonical).unwrap();
            let parsed = parse_strict(text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(to_canonical_vec(&parsed).unwrap(), canonical.clone());
            prop_assert!(serde_json::from_str::<Value>(text).is_ok());
        }
    }

    /// Member order, whitespace, escapes and number spelling never change the canonical bytes.
    #[test]
    fn spelling_never_changes_the_canonical_form(value in arb_json(), choices in prop::collection::vec(any::<u8>(), 1..64)) {
        if let Ok(canonical) = to_canonical_vec(&value) {
            let text = spell(&value, &choices);
            let parsed = parse_strict(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(to_canonical_vec(&parsed).unwrap(), canonical, "{}", text);
        }
    }

    /// A member name twice in one object — however each occurrence is escaped, at any depth —
    /// is always refused, naming the name.
    #[test]
    fn duplicate_member_names_are_always_refused(
        name in arb_name(),
        first in arb_json(),
        second in arb_json(),
        others in prop::collection::vec((arb_name(), arb_json()), 0..4),
        wrap in 0usize..6,
        choices in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        // Members before the second occurrence must parse, or their own error would come first.
        let parsable = |value: Value| if to_canonical_vec(&value).is_ok() { value } else { Value::Null };
        let first = parsable(first);
        let others: Vec<(String, Value)> = others
            .into_iter()
            .filter(|(other, _)| *other != name)
            .map(|(other, value)| (other, parsable(value)))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
        let mut speller = Speller { choices: &choices, at: 0 };
        let mut text = String::new();
        for level in 0..wrap {
            text.push_str(if level % 2 == 0 { "[" } else { "{\"w\":" });
        }
        text.push('{');
        speller.string(&name, &mut text);
        text.push(':');
        speller.value(&first, &mut text);
        for (other, value) in &others {
            text.push(',');
            speller.string(other, &mut text);
            text.push(':');
            speller.value(value, &mut text);
        }
        text.push(',');
        speller.string(&name, &mut text);
        text.push(':');
        speller.value(&second, &mut text);
        text.push('}');
        for level in (0..wrap).rev() {
            text.push(if level % 2 == 0 { ']' } else { '}' });
        }
        match parse_strict(&text) {
            Err(CanonicalError::DuplicateKey { key, .. }) => prop_assert_eq!(key, name),
            other => prop_assert!(false, "{text}: {other:?}"),
        }
    }

    /// A Rust argument: no panic, and a non-finite float is never turned into anything: the
    /// value is refused, naming where.
    #[test]
    fn to_value_never_panics_and_never_invents_a_value(args in hostile_args()) {
        match to_value(&args) {
            Ok(value) => {
                prop_assert!(args.all_finite(), "a non-finite float was accepted as {value}");
                match to_canonical_vec(&value) {
                    Ok(_) | Err(CanonicalError::InexactInteger { .. }) => {}
                    Err(other) => prop_assert!(false, "{other:?}"),
                }
            }
            Err(CanonicalError::NonFinite { path }) => prop_assert!(!args.all_finite() && !path.is_empty()),
            Err(CanonicalError::InexactInteger { path, .. }) => {
                prop_assert!(["big", "ubig", "shapes"].iter().any(|p| path.starts_with(p)), "{path}");
            }
            Err(other) => prop_assert!(false, "{other:?}"),
        }
    }

    /// Keys and fingerprints: no panic; refused exactly when a part has no canonical form; and
    /// equal to their definition — HMAC-SHA256 under the secret of "idem/v2/key", a NUL and the
    /// canonical JSON array `["idem/v2", version, namespace, scope, tool, selected]`, and of
    /// "idem/v2/fingerprint", a NUL and the canonical object of the kept (not ignored, not null)
    /// arguments.
    #[test]
    fn keys_and_fingerprints_match_their_definition(
        tenant in "\\PC{1,8}",
        subject in "\\PC{1,8}",
        tool in any::<String>(),
        members in prop::collection::vec((arb_name(), arb_json()), 0..6),
        task in proptest::option::of(arb_json()),
        widen in any::<bool>(),
        mask in any::<u8>(),
    ) {
        let Ok(caller) = Caller::try_new(tenant, subject) else { return Ok(()) };
        let selected: Map<String, Value> = members.into_iter().collect();
        let scope = match (&task, widen) {
            (Some(task), _) => Scope::within(&caller, task.clone()),
            (None, true) => Scope::tenant(&caller),
            (None, false) => Scope::caller(&caller),
        };
        let material = json!(["idem/v2", 1, "ns", scope.material(), tool, selected]);
        let key = Key::derive(&idem_tests::test_secret(), "ns", &scope, &tool, &selected);
        match to_canonical_vec(&material) {
            Ok(canonical) => {
                let key = key.map_err(|e| TestCaseError::fail(format!("refused a canonical value: {e}")))?;
                prop_assert_eq!(key.as_bytes(), &hmac_sha256(&[0x5e; 32], b"idem/v2/key\0", &canonical));
                prop_assert_eq!(Ref::parse(&key.reference().to_string()).unwrap(), key.reference());
                prop_assert!(key.reference().matches(&key));
            }
            Err(_) => prop_assert!(key.is_err(), "a key from a value with no canonical form"),
        }
        let names: Vec<&str> = selected.keys().map(String::as_str).collect();
        let ignore: Vec<&str> = names.iter().enumerate().filter(|(i, _)| mask & (1 << (i % 8)) != 0).map(|(_, n)| *n).collect();
        // A top-level `null` counts as absent.
        let kept: Map<String, Value> = selected
            .iter()
            .filter(|(n, v)| !v.is_null() && !ignore.contains(&n.as_str()))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let fingerprint = Fingerprint::of(&idem_tests::test_secret(), &selected, &ignore);
        match to_canonical_vec(&Value::Object(kept.clone())) {
            Ok(canonical) => {
                let fingerprint = fingerprint.map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(*fingerprint.digest(), hmac_sha256(&[0x5e; 32], b"idem/v2/fingerprint\0", &canonical));
                prop_assert_eq!(fingerprint.tags().len(), kept.len());
                prop_assert_eq!(fingerprint.differing(fingerprint.tags()), (Vec::<String>::new(), 0));
            }
            Err(_) => prop_assert!(fingerprint.is_err()),
        }
    }

    /// Refs from anywhere: no panic; only 16 hex digits parse.
    #[test]
    fn refs_parse_or_are_refused(text in prop_oneof![any::<String>(), "[0-9a-fA-F]{15,17}", "\\PC{16}"]) {
        match Ref::parse(&text) {
            Ok(reference) => {
                let trimmed = text.trim();
                prop_assert!(trimmed.len() == 16 && trimmed.bytes().all(|b| b.is_ascii_hexdigit()));
                prop_assert_eq!(reference.to_string(), trimmed.to_ascii_lowercase());
            }
            Err(error) => prop_assert!(error.to_string().contains("hex digits")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Named cases through `Idem::call`
// ---------------------------------------------------------------------------------------------

static CHARGE: Recipe = Recipe::new("rel_hostile_charge", &["order_id"]);

fn caller() -> Caller {
    Caller::new(unique("rel-hostile-tenant"), "agent")
}

fn reference_of(idem: &Idem, caller: &Caller, arguments: &Value) -> Option<String> {
    let order = arguments.get("order_id")?.clone();
    idem.admin().key_of(&CHARGE, caller, &json!({ "order_id": order })).ok().map(|key| key.reference().to_string())
}

/// Calls `arguments` and expects a refusal with `code` before anything ran or was recorded.
async fn refused(idem: &Idem, arguments: &Value, code: &str) -> String {
    let caller = caller();
    let runs = AtomicUsize::new(0);
    let error = idem
        .call(&CHARGE, Some(&caller), arguments, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, RelError>(())
        })
        .await
        .expect_err("refused");
    assert_eq!(error.code(), code, "{error:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler must not run");
    if let Some(reference) = reference_of(idem, &caller, arguments) {
        assert_eq!(idem.status(&caller, &reference).await.unwrap(), None, "nothing is recorded");
    }
    let RelError::Rejected { message, .. } = error else { unreachable!() };
    assert!(message.starts_with("nothing was executed"), "{message}");
    message
}

/// `[` × n, then `]` × n when `closed`.
fn brackets(n: usize, closed: bool) -> String {
    let mut text = "[".repeat(n);
    if closed {
        text.push_str(&"]".repeat(n));
    }
    text
}

/// A value nested `depth` arrays deep, built without recursion.
fn nested(depth: usize) -> Value {
    let mut value = json!("bottom");
    for _ in 0..depth {
        value = Value::Array(vec![value]);
    }
    value
}

#[test]
fn nesting_far_beyond_the_limit_in_text_is_refused_without_overflow() {
    for text in [
        brackets(100_000, false),
        brackets(100_000, true),
        "{\"a\":".repeat(100_000),
        format!("{}{}", "[{\"x\":".repeat(50_000), "1"),
    ] {
        match parse_strict(&text) {
            Err(CanonicalError::TooDeep { limit, .. }) => assert_eq!(limit, MAX_DEPTH),
            other => panic!("{other:?}"),
        }
    }
    // The limit itself: 128 levels parse, 129 do not.
    assert!(parse_strict(&brackets(MAX_DEPTH, true)).is_ok());
    assert!(matches!(parse_strict(&brackets(MAX_DEPTH + 1, true)), Err(CanonicalError::TooDeep { .. })));
}

#[tokio::test]
async fn nesting_beyond_the_limit_in_arguments_is_refused_naming_the_argument() {
    let idem = idem_tests::idem(MemoryLedger::new());
    // A key argument and a fingerprint-only argument, 129 and 1,000 levels deep. (A far deeper
    // `Value` cannot even be cloned or dropped on a test thread's stack — serde_json's own
    // recursion — so the extreme depths are exercised as text above.)
    for (depth, key_argument) in [(MAX_DEPTH + 1, true), (1_000, true), (MAX_DEPTH + 1, false), (1_000, false)] {
        let deep = nested(depth);
        assert!(matches!(to_canonical_vec(&deep), Err(CanonicalError::TooDeep { .. })));
        let arguments = if key_argument {
            json!({ "order_id": deep, "amount_cents": 1 })
        } else {
            json!({ "order_id": unique("o"), "meta": deep })
        };
        let message = refused(&idem, &arguments, "invalid_arguments").await;
        let named = if key_argument { "order_id" } else { "meta" };
        assert!(message.contains(&format!("argument `{named}")), "{message}");
        assert!(message.contains("levels deep"), "{message}");
    }
    // 128 levels in an argument is within the limit: it runs.
    let arguments = json!({ "order_id": unique("o"), "meta": nested(MAX_DEPTH) });
    let served = idem.call(&CHARGE, Some(&caller()), &arguments, || async { Ok::<_, RelError>(7) }).await;
    assert_eq!(served.unwrap().value, 7);
}

#[tokio::test]
async fn non_finite_and_inexact_numbers_are_refused_never_rounded_or_nulled() {
    #[derive(Serialize)]
    struct Charge {
        order_id: String,
        prices: Vec<Option<f32>>,
        total: f64,
    }
    let nan = Charge { order_id: "o-1".into(), prices: vec![Some(1.5), None, Some(f32::INFINITY)], total: f64::NAN };
    assert_eq!(to_value(&nan), Err(CanonicalError::NonFinite { path: "prices[2]".into() }));
    let inf = Charge { order_id: "o-1".into(), prices: vec![], total: f64::NEG_INFINITY };
    assert_eq!(to_value(&inf), Err(CanonicalError::NonFinite { path: "total".into() }));
    // The same through an `#[idempotent]` handler: refused before anything runs.
    let shop = Shop {
        idem: idem_tests::builder(MemoryLedger::new()).local_caller(caller()).build().unwrap(),
        runs: AtomicUsize::new(0),
    };
    for total in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let error = shop.charge("o-2".into(), total).await.unwrap_err();
        assert_eq!(error.code(), "invalid_arguments", "{error:?}");
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
    assert!(shop.charge("o-2".into(), 12.5).await.is_ok());

    // Numbers beyond a double in text, and integers beyond the 64-bit range that are not one:
    // refused, never infinity or a rounded neighbour.
    for text in ["1e400", "-1e400", "{\"amount\":1e309}", "[123456789012345678901234567890]", "18446744073709551617"] {
        assert!(parse_strict(text).is_err(), "{text}");
    }
    // Integers in the 64-bit range are kept exactly (they used to be refused beyond 2^53):
    // through `Idem::call` each one is its own operation, never a rounded neighbour's.
    assert_eq!(parse_strict("9007199254740993"), Ok(json!(9_007_199_254_740_993u64)));
    let idem = idem_tests::idem(MemoryLedger::new());
    let caller = caller();
    let mut references = Vec::new();
    for order in [json!(u64::MAX), json!(u64::MAX - 1), json!(i64::MIN + 1), json!(9_007_199_254_740_993u64)] {
        let arguments = json!({ "order_id": order, "amount_cents": 1 });
        let served = idem.call(&CHARGE, Some(&caller), &arguments, || async { Ok::<_, RelError>(()) }).await.unwrap();
        assert!(!served.replayed, "{order}");
        references.push(served.reference);
    }
    let distinct: std::collections::HashSet<_> = references.iter().collect();
    assert_eq!(distinct.len(), 4);
    // A u128 beyond both, from a Rust argument.
    assert!(matches!(to_value(&(u128::MAX - 1)), Err(CanonicalError::InexactInteger { .. })));
}

struct Shop {
    idem: Idem,
    runs: AtomicUsize,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Shop {
    #[idempotent(key = "order_id")]
    async fn charge(&self, order_id: String, total: f64) -> Result<String, RelError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{order_id}: {total}"))
    }
}

#[test]
fn duplicate_member_names_in_raw_json_are_refused() {
    for (text, path, key) in [
        (r#"{"a":1,"a":2}"#, "", "a"),
        (r#"{"a":1,"\u0061":1}"#, "", "a"),
        (r#"{"order":{"id":1,"i\u0064":2}}"#, "order", "id"),
        (r#"[{"x":[{"k":null,"k":null}]}]"#, "[0].x[0]", "k"),
        ("{\"\u{1f600}\":0,\"\\ud83d\\ude00\":0}", "", "\u{1f600}"),
    ] {
        assert_eq!(
            parse_strict(text),
            Err(CanonicalError::DuplicateKey { path: path.into(), key: key.into() }),
            "{text}"
        );
        // serde_json would have kept one of them silently.
        assert!(serde_json::from_str::<Value>(text).is_ok());
    }
}

#[tokio::test]
async fn arguments_that_are_not_an_object_and_hostile_refs() {
    let idem = idem_tests::idem(MemoryLedger::new());
    for arguments in [json!(null), json!([1, 2]), json!("order"), json!(3)] {
        refused(&idem, &arguments, "invalid_arguments").await;
    }
    let caller = caller();
    for reference in [
        "",
        "0123",
        "0123456789abcdefg",
        "éééééééé",
        "0123456789abcdeX",
        "\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}",
    ] {
        assert!(idem.status(&caller, reference).await.is_err(), "{reference:?}");
        assert!(
            idem.admin().resolve(caller.tenant(), reference, Resolution::NothingHappened).await.is_err(),
            "{reference:?}"
        );
    }
    assert!(Caller::try_new(" ", "x").is_err() && Caller::try_new("x", "\t").is_err());
}

macro_rules! on_every_ledger {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_ledger!(multi_megabyte_arguments, result_above_the_size_limit, sql_metacharacters_everywhere);

/// An `Idem` on `backend`, and the SQL connection behind it (none for memory).
async fn idem_on(backend: &str, test: &str) -> Option<(Idem, Option<sea_orm::DatabaseConnection>)> {
    if backend == "memory" {
        return Some((idem_tests::idem(MemoryLedger::new()), None));
    }
    let (_, ledger) = support::connect(backend, test).await?;
    let db = ledger.connection().clone();
    Some((idem_tests::idem(ledger), Some(db)))
}

/// The stored row of `key`: state, and the byte sizes of fingerprint, arg_tags and result.
async fn row_sizes(db: &sea_orm::DatabaseConnection, key: &Key) -> (i64, i64, i64, Option<i64>) {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT state, length(fingerprint), length(arg_tags), length(result) FROM idem_records WHERE key = $1"
        }
        DbBackend::MySql => {
            "SELECT state, length(fingerprint), length(arg_tags), length(result) FROM idem_records WHERE `key` = ?"
        }
        _ => "SELECT state, length(fingerprint), length(arg_tags), length(result) FROM idem_records WHERE key = ?",
    };
    let statement = Statement::from_sql_and_values(backend, sql, vec![key.as_bytes().to_vec().into()]);
    let row = db.query_one_raw(statement).await.unwrap().expect("the record");
    let int = |i: usize| {
        row.try_get_by_index::<Option<i64>>(i)
            .or_else(|_| row.try_get_by_index::<Option<i32>>(i).map(|v| v.map(i64::from)))
            .or_else(|_| row.try_get_by_index::<Option<i16>>(i).map(|v| v.map(i64::from)))
            .unwrap()
    };
    (int(0).unwrap(), int(1).unwrap(), int(2).unwrap(), int(3))
}

fn key_for(idem: &Idem, caller: &Caller, order: &Value) -> Key {
    idem.admin().key_of(&CHARGE, caller, &json!({ "order_id": order })).unwrap()
}

/// 8 MiB in a key argument, 8 MiB in a fingerprint-only argument, 200,000 numbers: each call
/// works, runs once, replays, and the ledger row holds digests only.
async fn multi_megabyte_arguments(backend: &str) {
    let Some((idem, db)) = idem_on(backend, "reliability_hostile::multi_megabyte_arguments").await else { return };
    let caller = caller();
    let big = "x".repeat(8 << 20);
    let many: Vec<u64> = (0..200_000).collect();
    for arguments in [
        json!({ "order_id": format!("{big}-{}", unique("k")), "amount_cents": 1 }),
        json!({ "order_id": unique("o"), "attachment": big, "amount_cents": 1 }),
        json!({ "order_id": unique("o"), "lines": many, "amount_cents": 1 }),
    ] {
        let runs = AtomicUsize::new(0);
        let handler = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, RelError>("accepted".to_owned())
        };
        let first = idem.call(&CHARGE, Some(&caller), &arguments, handler).await.unwrap();
        let again = idem.call(&CHARGE, Some(&caller), &arguments, handler).await.unwrap();
        assert_eq!((first.replayed, again.replayed, runs.load(Ordering::SeqCst)), (false, true, 1));
        let key = key_for(&idem, &caller, &arguments["order_id"]);
        let status = idem.status(&caller, &key.reference().to_string()).await.unwrap().unwrap();
        assert_eq!(status.state, State::Completed);
        assert_eq!(status.result.as_deref(), Some(&b"{\"ok\":\"accepted\"}"[..]));
        if let Some(db) = &db {
            let (state, fingerprint, tags, result) = row_sizes(db, &key).await;
            let arguments_count = i64::try_from(arguments.as_object().unwrap().len()).unwrap();
            assert_eq!((state, fingerprint, tags, result), (2, 32, 4 * arguments_count, Some(17)), "{backend}");
        }
    }
}

/// A result above `max_result_bytes`: the caller gets it; the record becomes unknown (not
/// stuck in progress); repeats are told to check; the operator path settles it.
async fn result_above_the_size_limit(backend: &str) {
    let Some((idem, _)) = idem_on(backend, "reliability_hostile::result_above_the_size_limit").await else { return };
    let idem = idem_tests::builder(Arc::clone(idem.admin().ledger())).max_result_bytes(1024).build().unwrap();
    let caller = caller();
    let runs = AtomicUsize::new(0);
    let big = "r".repeat(64 * 1024);
    let arguments = json!({ "order_id": unique("o") });
    let reference = key_for(&idem, &caller, &arguments["order_id"]).reference().to_string();
    let handler = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, RelError>(big.clone())
    };
    let served = idem.call(&CHARGE, Some(&caller), &arguments, handler).await.unwrap();
    assert_eq!(served.value.len(), big.len(), "the caller gets its result");
    let status = idem.status(&caller, &reference).await.unwrap().unwrap();
    assert_eq!((status.state, status.result), (State::Unknown, None));
    let repeat = idem.call(&CHARGE, Some(&caller), &arguments, handler).await.unwrap_err();
    assert_eq!(repeat.code(), "outcome_unknown");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run twice");
    // The boundary: a stored result of exactly the limit is kept, one byte more is not.
    for (len, kept) in [(1024 - 9, true), (1024 - 8, false)] {
        let arguments = json!({ "order_id": unique("o") });
        let value = "b".repeat(len); // stored as {"ok":"…"}: 9 bytes more
        let served = idem.call(&CHARGE, Some(&caller), &arguments, || async { Ok::<_, RelError>(value.clone()) });
        served.await.unwrap();
        let reference = key_for(&idem, &caller, &arguments["order_id"]).reference().to_string();
        let state = idem.status(&caller, &reference).await.unwrap().unwrap().state;
        assert_eq!(state == State::Completed, kept, "{len}: {state}");
    }
    // The way out: an operator stores a (small) result; repeats replay it.
    let address = idem.status(&caller, &reference).await.unwrap().expect("the unknown one").address();
    idem.admin()
        .resolve(caller.tenant(), &address.to_string(), Resolution::Completed(stored_ok(&"stored elsewhere")))
        .await
        .unwrap();
    let replay = idem.call(&CHARGE, Some(&caller), &arguments, handler).await.unwrap();
    assert_eq!((replay.value.as_str(), replay.replayed), ("stored elsewhere", true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Quotes, semicolons, NULs and comment markers in tenants and arguments are data.
async fn sql_metacharacters_everywhere(backend: &str) {
    let Some((idem, _)) = idem_on(backend, "reliability_hostile::sql_metacharacters_everywhere").await else { return };
    let caller = Caller::new(format!("t'; DROP TABLE idem_records; -- {}", unique("x")), "s\"\\\u{0}`");
    let arguments = json!({ "order_id": "o' OR '1'='1\u{0}/*", "note": "`key`; --" });
    let served = idem.call(&CHARGE, Some(&caller), &arguments, || async { Ok::<_, RelError>("ok".to_owned()) }).await;
    assert_eq!(served.unwrap().value, "ok");
    let again = idem.call(&CHARGE, Some(&caller), &arguments, || async { Ok::<_, RelError>("twice".to_owned()) }).await;
    let again = again.unwrap();
    assert_eq!((again.value.as_str(), again.replayed), ("ok", true));
    let reference = key_for(&idem, &caller, &arguments["order_id"]).reference().to_string();
    assert_eq!(idem.status(&caller, &reference).await.unwrap().unwrap().state, State::Completed);
    let ledger: &Arc<dyn Ledger> = idem.admin().ledger();
    assert!(
        ledger
            .status(
                TenantTag::of(&idem_tests::test_secret(), "t"),
                idem_runtime::scope::SubjectTag::TENANT,
                Ref::parse(&reference).unwrap(),
                idem.admin().now_ms()
            )
            .await
            .unwrap()
            .is_none()
    );
}
