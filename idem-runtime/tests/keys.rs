//! Key derivation: what makes two calls the same operation, and what never may.

use idem_runtime::canonical::parse_strict;
use idem_runtime::{Caller, Key, Ref, key::Fingerprint, scope::Scope, secret::Secret};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// A fixed test secret: 32 bytes of 0x42, version 1.
fn secret() -> Secret {
    Secret::new(1, &[0x42; 32]).unwrap()
}

fn key(tenant: &str, subject: &str, tool: &str, selected: Value) -> Key {
    Key::derive(&secret(), "default", &Scope::caller(&Caller::new(tenant, subject)), tool, &object(selected)).unwrap()
}

#[test]
fn a_fixed_input_has_a_fixed_key() {
    // Pinned: any change to the framing, the version tag or the canonical form re-keys every
    // stored operation, which must be a deliberate, versioned decision. The expected MAC was
    // computed independently (Python's hmac, SHA-256, key 32 bytes of 0x42) over "idem/v2/key",
    // a NUL and the material
    // ["idem/v2",1,"default",{"subject":"alice","tenant":"acme"},"charge_card",{"amount":1250,"order_id":"o-1"}]
    let key = key("acme", "alice", "charge_card", json!({ "order_id": "o-1", "amount": 1250 }));
    assert_eq!(key.to_string(), "7bb3173f2a87fe534bbe0f9204759b5942c089cf53effa84d9e6835cfe08afba");
}

#[test]
fn framing_keeps_boundaries() {
    assert_ne!(key("a", "bc", "t", json!({})), key("ab", "c", "t", json!({})));
    assert_ne!(key("t", "s", "x", json!({ "a": "a", "b": "bc" })), key("t", "s", "x", json!({ "a": "ab", "b": "c" })));
    assert_ne!(key("t", "s", "ab", json!({ "c": 1 })), key("t", "s", "a", json!({ "bc": 1 })));
    assert_ne!(key("t", "s", "x", json!({ "a": "1" })), key("t", "s", "x", json!({ "a": 1 })));
}

#[test]
fn scopes_differ_by_rule() {
    let caller = Caller::new("acme", "alice");
    let selected = object(json!({ "id": 1 }));
    let by_caller = Key::derive(&secret(), "default", &Scope::caller(&caller), "t", &selected).unwrap();
    let by_tenant = Key::derive(&secret(), "default", &Scope::tenant(&caller), "t", &selected).unwrap();
    let by_task = Key::derive(&secret(), "default", &Scope::within(&caller, json!("conv-1")), "t", &selected).unwrap();
    let other_task =
        Key::derive(&secret(), "default", &Scope::within(&caller, json!("conv-2")), "t", &selected).unwrap();
    let bob_tenant =
        Key::derive(&secret(), "default", &Scope::tenant(&Caller::new("acme", "bob")), "t", &selected).unwrap();
    assert_eq!(by_tenant, bob_tenant, "tenant scope ignores the subject");
    let all = [by_caller, by_tenant, by_task, other_task];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn refs_round_trip_and_reject_junk() {
    let key = key("acme", "alice", "t", json!({ "id": 1 }));
    let reference = key.reference();
    assert_eq!(reference.to_string().len(), 16);
    assert!(key.to_string().starts_with(&reference.to_string()));
    assert_eq!(Ref::parse(&reference.to_string()), Ok(reference));
    assert_eq!(Ref::parse(&reference.to_string().to_uppercase()), Ok(reference));
    assert!(reference.matches(&key));
    for junk in ["", "xyz", "0123456789abcdeg", "0123456789abcdef0"] {
        assert!(Ref::parse(junk).unwrap_err().to_string().contains("16 hex digits"), "{junk}");
    }
}

#[test]
fn fingerprint_names_what_differs_and_respects_ignore() {
    let first = object(json!({ "card": "c", "amount": 5, "note": "a" }));
    let note_changed = object(json!({ "card": "c", "amount": 5, "note": "b" }));
    let changed_args = object(json!({ "card": "c", "amount": 6, "memo": 1 }));
    let fewer_args = object(json!({ "card": "c" }));
    let stored = Fingerprint::of(&secret(), &first, &["note"]).unwrap();
    let same_but_note = Fingerprint::of(&secret(), &note_changed, &["note"]).unwrap();
    assert_eq!(stored.digest(), same_but_note.digest(), "ignored arguments do not count");
    let changed = Fingerprint::of(&secret(), &changed_args, &["note"]).unwrap();
    assert_ne!(stored.digest(), changed.digest());
    let (differing, missing) = changed.differing(stored.tags());
    assert_eq!(differing, vec!["amount".to_owned(), "memo".to_owned()]);
    assert_eq!(missing, 0);
    let fewer = Fingerprint::of(&secret(), &fewer_args, &[]).unwrap();
    assert_eq!(fewer.differing(stored.tags()), (vec![], 1));
}

#[test]
fn non_finite_and_too_deep_arguments_are_refused_with_their_path() {
    #[derive(serde::Serialize)]
    struct Args {
        amount: f64,
    }
    let error = idem_runtime::canonical::to_value(&Args { amount: f64::NAN }).unwrap_err();
    assert!(error.to_string().contains("amount"), "{error}");
    let mut deep = json!(1);
    for _ in 0..=idem_runtime::canonical::MAX_DEPTH {
        deep = json!([deep]);
    }
    let selected = object(json!({ "big": { "n": deep } }));
    let error = Key::derive(&secret(), "default", &Scope::caller(&Caller::new("t", "s")), "x", &selected).unwrap_err();
    assert!(error.to_string().contains("big.n"), "{error}");
}

#[test]
fn integers_beyond_2_53_are_keyed_by_their_exact_digits() {
    // Pinned, computed independently (Python's hmac, as above) over the material
    // ["idem/v2",1,"default",{"subject":"alice","tenant":"acme"},"ship_order",{"order_id":1152921504606846976}]
    // RFC 8785 would write 2^60 as 1152921504606847000: a different snowflake id.
    let pinned = key("acme", "alice", "ship_order", json!({ "order_id": 1u64 << 60 }));
    assert_eq!(pinned.to_string(), "827af23a38e20e6f31cc32902aa17c491ba33d1e8e779382c5c17ee50908ebc2");
    // The same number as a double is the same key; neighbours are not.
    let as_double = json!({ "order_id": 2f64.powi(60) });
    assert_eq!(key("acme", "alice", "ship_order", as_double), pinned);
    let ids =
        [1u64 << 60, 1_152_921_504_606_847_000, (1 << 60) + 1, (1 << 53) + 1, (1 << 53) + 2, u64::MAX, u64::MAX - 1];
    let keys: std::collections::HashSet<Key> =
        ids.iter().map(|id| key("acme", "alice", "ship_order", json!({ "order_id": id }))).collect();
    assert_eq!(keys.len(), ids.len());
    // And in the fingerprint: a nanosecond later is a different fingerprint.
    let at = object(json!({ "at_ns": 1_700_000_000_123_456_789u64 }));
    let later = object(json!({ "at_ns": 1_700_000_000_123_456_790u64 }));
    assert_ne!(
        Fingerprint::of(&secret(), &at, &[]).unwrap().digest(),
        Fingerprint::of(&secret(), &later, &[]).unwrap().digest()
    );
}

#[test]
fn a_null_argument_fingerprints_like_an_absent_one() {
    // Some clients send `null` for optional parameters they leave unset, others omit them.
    let omitted = object(json!({ "order_id": "o-1", "amount": 5 }));
    let explicit = object(json!({ "order_id": "o-1", "amount": 5, "note": null, "trace": null }));
    let (a, b) =
        (Fingerprint::of(&secret(), &omitted, &[]).unwrap(), Fingerprint::of(&secret(), &explicit, &[]).unwrap());
    assert_eq!(a.digest(), b.digest());
    assert_eq!((a.tags(), a.names()), (b.tags(), b.names()));
    assert_eq!(b.differing(a.tags()), (vec![], 0));
    assert_eq!(a.differing(b.tags()), (vec![], 0));
    // The digest is the one of the object without its null members.
    let (only_null, empty) = (object(json!({ "note": null })), Map::new());
    assert_eq!(
        Fingerprint::of(&secret(), &only_null, &[]).unwrap().digest(),
        Fingerprint::of(&secret(), &empty, &[]).unwrap().digest()
    );
    // Setting it is a change, named; so is a null inside a value (that is data, not an absent
    // parameter).
    let noted = object(json!({ "order_id": "o-1", "amount": 5, "note": "x" }));
    let noted = Fingerprint::of(&secret(), &noted, &[]).unwrap();
    assert_ne!(noted.digest(), b.digest());
    assert_eq!(noted.differing(b.tags()), (vec!["note".to_owned()], 0));
    let inner_null = object(json!({ "address": { "line2": null } }));
    let inner_absent = object(json!({ "address": {} }));
    assert_ne!(
        Fingerprint::of(&secret(), &inner_null, &[]).unwrap().digest(),
        Fingerprint::of(&secret(), &inner_absent, &[]).unwrap().digest()
    );
}

/// Arbitrary JSON, with numbers drawn so that several spellings exist.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(|n| json!(n)),
        (-1e12f64..1e12).prop_map(|f| json!(f)),
        "[a-z\u{e9}\u{20ac}\u{1f600}\"\\\\\n]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-e]{1,3}", inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON text with members in reverse order, spaces, and alternative number
/// spellings (`5` as `5.0` or `50e-1`).
fn respell(value: &Value, out: &mut String, variant: u8) {
    match value {
        Value::Object(map) => {
            out.push_str("{ ");
            for (i, (name, member)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n ");
                }
                out.push_str(&serde_json::to_string(name).unwrap());
                out.push_str(" : ");
                respell(member, out, variant);
            }
            out.push_str(" }");
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                respell(item, out, variant);
            }
            out.push_str(" ]");
        }
        Value::Number(n) if n.is_i64() && variant % 3 == 1 => out.push_str(&format!("{n}.0")),
        Value::Number(n) if n.is_i64() && variant % 3 == 2 => out.push_str(&format!("{n}0e-1")),
        Value::Number(n) if n.is_f64() && variant % 2 == 1 => {
            out.push_str(&format!("{:e}", n.as_f64().unwrap()));
        }
        other => out.push_str(&other.to_string()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Key order, whitespace and number spelling never change a key.
    #[test]
    fn spelling_never_changes_a_key(args in prop::collection::btree_map("[a-f]{1,4}", json_value(), 1..6), variant in 0u8..6) {
        let original = Value::Object(args.into_iter().collect());
        let mut text = String::new();
        respell(&original, &mut text, variant);
        let reparsed = parse_strict(&text).unwrap();
        prop_assert_eq!(
            key("t", "s", "tool", original.clone()),
            key("t", "s", "tool", reparsed.clone())
        );
        let (all, again) = (object(original), object(reparsed));
        prop_assert_eq!(*Fingerprint::of(&secret(), &all, &[]).unwrap().digest(), *Fingerprint::of(&secret(), &again, &[]).unwrap().digest());
    }

    /// Changing any selected value always changes the key.
    #[test]
    fn any_change_of_a_selected_value_changes_the_key(
        args in prop::collection::btree_map("[a-f]{1,4}", json_value(), 1..6),
        replacement in json_value(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut changed = args.clone();
        let name = pick.get(&args.keys().cloned().collect::<Vec<_>>()).clone();
        prop_assume!(idem_runtime::canonical::to_canonical_vec(&changed[&name]).unwrap()
            != idem_runtime::canonical::to_canonical_vec(&replacement).unwrap());
        changed.insert(name, replacement);
        let before = Value::Object(args.into_iter().collect());
        let after = Value::Object(changed.into_iter().collect());
        prop_assert_ne!(key("t", "s", "tool", before), key("t", "s", "tool", after));
    }

    /// Two tenants never share a key for the same arguments.
    #[test]
    fn tenants_never_share_a_key(a in "[a-z0-9:]{1,12}", b in "[a-z0-9:]{1,12}", args in prop::collection::btree_map("[a-f]{1,4}", json_value(), 0..4)) {
        prop_assume!(a != b);
        let args = Value::Object(args.into_iter().collect());
        prop_assert_ne!(key(&a, "s", "tool", args.clone()), key(&b, "s", "tool", args));
    }
}

/// Two argument names whose 2-byte name tags collide: a call compared with its own stored tags
/// names no argument as differing (found by the long form of `reliability_hostile`, which named
/// an unchanged argument when its name tag collided with another's).
#[test]
fn colliding_name_tags_never_name_an_unchanged_argument() {
    let tag_of = |name: &str| {
        let mut one = serde_json::Map::new();
        one.insert(name.to_owned(), serde_json::json!(1));
        let fingerprint = idem_runtime::key::Fingerprint::of(&secret(), &one, &[]).unwrap();
        [fingerprint.tags()[0][0], fingerprint.tags()[0][1]]
    };
    let mut seen = std::collections::HashMap::new();
    let (a, b) = (0..100_000)
        .map(|i| format!("n{i}"))
        .find_map(|name| seen.insert(tag_of(&name), name.clone()).map(|earlier| (earlier, name)))
        .expect("a 2-byte tag collides within 100,000 names");
    let mut arguments = serde_json::Map::new();
    arguments.insert(a.clone(), serde_json::json!("first value"));
    arguments.insert(b.clone(), serde_json::json!(["another", 2]));
    let fingerprint = idem_runtime::key::Fingerprint::of(&secret(), &arguments, &[]).unwrap();
    assert_eq!(fingerprint.differing(fingerprint.tags()), (Vec::<String>::new(), 0), "{a} and {b}");
}
