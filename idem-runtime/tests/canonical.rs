//! RFC 8785 canonical JSON: the RFC's published vectors, the strict
//! conversions' refusals, and properties over arbitrary JSON values.

use std::collections::BTreeMap;

use idem_runtime::canonical::{CanonicalError, MAX_DEPTH, parse_strict, to_canonical_vec, to_value, write_canonical};
use proptest::prelude::*;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::{Number, Value, json};

fn canonical(value: &Value) -> String {
    let bytes = to_canonical_vec(value).expect("value has a canonical form");
    String::from_utf8(bytes).expect("canonical JSON is UTF-8")
}

fn canonical_double(f: f64) -> Result<String, CanonicalError> {
    let value = to_value(&f)?;
    let bytes = to_canonical_vec(&value)?;
    Ok(String::from_utf8(bytes).expect("canonical JSON is UTF-8"))
}

fn nested_arrays(depth: usize) -> Value {
    let mut value = Value::Null;
    for _ in 0..depth {
        value = Value::Array(vec![value]);
    }
    value
}

fn nested_text(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A map that serialises its pairs in order, duplicates and odd keys included.
struct Pairs<K, V>(Vec<(K, V)>);

impl<K: Serialize, V: Serialize> Serialize for Pairs<K, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

// ---------------------------------------------------------------------------
// RFC 8785 published examples
// ---------------------------------------------------------------------------

/// RFC 8785 Appendix B: IEEE-754 bit patterns and their serialisation.
#[test]
fn rfc8785_appendix_b_numbers() {
    let table: &[(u64, &str)] = &[
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];
    for &(bits, expected) in table {
        let f = f64::from_bits(bits);
        assert_eq!(canonical_double(f).as_deref(), Ok(expected), "bits {bits:016x}");
        // The text must also parse back to the very same double (or to zero for -0).
        let back: f64 = expected.parse().expect("a JSON number");
        assert!(back == f && (f != 0.0 || back == 0.0), "bits {bits:016x} round trip");
    }
}

/// RFC 8785 Appendix B: NaN and Infinity have no serialisation.
#[test]
fn rfc8785_appendix_b_non_finite_is_an_error() {
    for bits in [0x7fffffffffffffff_u64, 0x7ff0000000000000, 0xfff0000000000000] {
        let f = f64::from_bits(bits);
        assert_eq!(canonical_double(f), Err(CanonicalError::NonFinite { path: String::new() }), "bits {bits:016x}");
    }
}

/// Boundaries of ECMAScript's switch between plain and exponent notation.
#[test]
fn ecmascript_notation_boundaries() {
    let cases: &[(f64, &str)] = &[
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (123e-9, "1.23e-7"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1.0, "1"),
        (-1.5, "-1.5"),
        (5e-324, "5e-324"),
        // Integral and in the 64-bit range: its exact digits (RFC 8785: 9223372036854776000).
        (9223372036854775808.0, "9223372036854775808"),
        // Exactly halfway between ...660.2 and ...660.3: the even digit wins.
        (1_588_041_723_873_660.0 + 0.25, "1588041723873660.2"),
    ];
    for &(f, expected) in cases {
        assert_eq!(canonical_double(f).as_deref(), Ok(expected), "{f:e}");
    }
}

/// RFC 8785 section 3.2.2 (and the UTF-8 bytes of section 3.2.4).
#[test]
fn rfc8785_section_3_2_2_sample() {
    let input = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;
    let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    let value = parse_strict(input).expect("the RFC sample parses");
    assert_eq!(canonical(&value), expected);

    let hex = "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72
               75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a
               5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31
               65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37
               5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30
               30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d";
    let bytes: Vec<u8> = hex.split_whitespace().map(|pair| u8::from_str_radix(pair, 16).expect("hex")).collect();
    assert_eq!(to_canonical_vec(&value).expect("canonical"), bytes);
}

/// RFC 8785 section 3.2.3: members sorted by UTF-16 code units.
#[test]
fn rfc8785_section_3_2_3_sorting() {
    let input = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#;
    let expected = concat!(
        "{",
        r#""\r":"Carriage Return","#,
        r#""1":"One","#,
        "\"\u{80}\":\"Control\",",
        "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",",
        "\"\u{20ac}\":\"Euro Sign\",",
        "\"\u{1f600}\":\"Emoji: Grinning Face\",",
        "\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"",
        "}"
    );
    let value = parse_strict(input).expect("the RFC sample parses");
    assert_eq!(canonical(&value), expected);
}

#[test]
fn string_escapes() {
    let all_controls: String = (0u8..0x20).map(char::from).collect();
    let value = Value::String(format!("{all_controls}\"\\/\u{7f}\u{2028}\u{2029}é😀"));
    let expected = concat!(
        r#""\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007\b\t\n\u000b\f\r\u000e\u000f"#,
        r#"\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f"#,
        "\\\"\\\\/\u{7f}\u{2028}\u{2029}é😀\""
    );
    assert_eq!(canonical(&value), expected);
}

#[test]
fn no_whitespace_and_nested_sorting() {
    let value =
        parse_strict(" { \"b\" : [ 1 , { \"z\" : 1 , \"a\" : 2 } ] ,\n\t\"a\" : { } , \"c\" : [ ] } ").expect("parses");
    assert_eq!(canonical(&value), r#"{"a":{},"b":[1,{"a":2,"z":1}],"c":[]}"#);
}

// ---------------------------------------------------------------------------
// write_canonical
// ---------------------------------------------------------------------------

#[test]
fn write_canonical_appends_on_success_and_leaves_out_alone_on_error() {
    let mut out = b"prefix:".to_vec();
    write_canonical(&json!({"a": [1, 2.5]}), &mut out).expect("canonical");
    assert_eq!(out, br#"prefix:{"a":[1,2.5]}"#);

    let mut out = b"prefix:".to_vec();
    let err = write_canonical(&json!({"a": [1, nested_arrays(MAX_DEPTH)]}), &mut out).unwrap_err();
    assert!(matches!(err, CanonicalError::TooDeep { .. }));
    assert_eq!(out, b"prefix:");
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct Charge {
    amount: f64,
    fee: f32,
}

#[derive(Serialize)]
struct Item {
    name: &'static str,
    price: f64,
}

#[derive(Serialize)]
struct Order {
    items: Vec<Item>,
}

#[test]
fn non_finite_fields_are_refused_with_their_path() {
    let err = to_value(&Charge { amount: f64::NAN, fee: 0.5 }).unwrap_err();
    assert_eq!(err, CanonicalError::NonFinite { path: "amount".into() });
    assert_eq!(
        err.to_string(),
        "argument `amount` is NaN or infinite, which JSON cannot represent; send a finite number"
    );

    let err = to_value(&Charge { amount: 1.0, fee: f32::INFINITY }).unwrap_err();
    assert_eq!(err, CanonicalError::NonFinite { path: "fee".into() });

    let order = Order {
        items: vec![
            Item { name: "a", price: 1.0 },
            Item { name: "b", price: 2.0 },
            Item { name: "c", price: f64::NEG_INFINITY },
        ],
    };
    let err = to_value(&order).unwrap_err();
    assert_eq!(err, CanonicalError::NonFinite { path: "items[2].price".into() });
}

#[test]
fn non_finite_root_is_refused() {
    let err = to_value(&f64::NAN).unwrap_err();
    assert_eq!(err, CanonicalError::NonFinite { path: String::new() });
    assert!(err.to_string().starts_with("the value is NaN or infinite"));
}

#[test]
fn paths_quote_member_names_that_are_not_plain() {
    let value = Pairs(vec![("a.b", f64::NAN)]);
    assert_eq!(to_value(&value).unwrap_err(), CanonicalError::NonFinite { path: r#"["a.b"]"#.into() });

    let value = Pairs(vec![("meta", Pairs(vec![("content type", vec![0.0, f64::NAN])]))]);
    assert_eq!(to_value(&value).unwrap_err(), CanonicalError::NonFinite { path: r#"meta["content type"][1]"#.into() });
}

/// Integers beyond 2^53 (snowflake ids, nanosecond times) keep their exact digits: RFC 8785
/// would print the nearest double, and two ids would share a key. (Deliberately replaces the
/// earlier refusal of these integers.)
#[test]
fn integers_beyond_2_53_keep_their_exact_digits() {
    const TWO_53: u64 = 1 << 53;
    let cases: &[(Value, &str)] = &[
        (json!(TWO_53), "9007199254740992"),
        (json!(-(TWO_53 as i64)), "-9007199254740992"),
        (json!(TWO_53 + 1), "9007199254740993"),
        (json!(TWO_53 + 2), "9007199254740994"),
        (json!(-(TWO_53 as i64) - 1), "-9007199254740993"),
        (json!(1u64 << 60), "1152921504606846976"),
        (json!(1_152_921_504_606_847_000u64), "1152921504606847000"),
        (json!(1u64 << 63), "9223372036854775808"),
        (json!(i64::MAX), "9223372036854775807"),
        (json!(i64::MIN), "-9223372036854775808"),
        (json!(i64::MIN + 1), "-9223372036854775807"),
        (json!(u64::MAX), "18446744073709551615"),
        (json!(u64::MAX - 1), "18446744073709551614"),
        (json!(0), "0"),
        (json!(-1), "-1"),
    ];
    for (value, expected) in cases {
        assert_eq!(canonical(value), *expected, "{value}");
        // And the canonical text is that integer again.
        assert_eq!(parse_strict(expected).as_ref(), Ok(value), "{expected}");
    }
    assert_eq!(
        canonical(&json!({"id": u64::MAX, "at": [i64::MIN]})),
        r#"{"at":[-9223372036854775808],"id":18446744073709551615}"#
    );
}

/// A number's text depends on its value alone: an integral double in the 64-bit range is
/// written as the integer it is. RFC 8785 prints 2^60 as 1152921504606847000, which is a
/// different (valid) snowflake id: keeping that would put two ids on one key.
#[test]
fn integral_doubles_in_the_64_bit_range_are_written_as_their_integer() {
    let two_60 = 2f64.powi(60);
    assert_eq!(canonical_double(two_60).as_deref(), Ok("1152921504606846976"));
    assert_eq!(canonical(&json!(1u64 << 60)), canonical_double(two_60).unwrap());
    assert_ne!(canonical_double(two_60).unwrap(), canonical(&json!(1_152_921_504_606_847_000u64)));
    for (f, expected) in [
        (9223372036854775808.0, "9223372036854775808"),
        (-9223372036854775808.0, "-9223372036854775808"),
        (18446744073709549568.0, "18446744073709549568"),
        (1e19, "10000000000000000000"),
        (-0.0, "0"),
        // 2^64 is beyond every u64: RFC 8785 text, which no integer in range can be.
        (18446744073709551616.0, "18446744073709552000"),
        (-9223372036854777856.0, "-9223372036854778000"),
        // Beyond the 64-bit range, and for all fractions: RFC 8785 unchanged.
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
    ] {
        assert_eq!(canonical_double(f).as_deref(), Ok(expected), "{f:e}");
    }
    // 2^53 - 0.5 is a fraction: RFC 8785's shortest round-trip digits.
    assert_eq!(canonical_double(4503599627370495.5).as_deref(), Ok("4503599627370495.5"));
}

/// Among integers and integral doubles near one another, equal values give equal bytes and
/// different values different bytes.
#[test]
fn distinct_big_integers_never_canonicalise_alike() {
    let mut numbers: Vec<Value> = Vec::new();
    for base in [1u64 << 53, 1 << 60, 1 << 63, 1_152_921_504_606_847_000, 9_223_372_036_854_776_000, u64::MAX - 4096] {
        for delta in 0..4096u64.min(u64::MAX - base) {
            if delta < 8 || delta % 997 == 0 || delta == 2048 {
                numbers.push(json!(base + delta));
                let double = (base + delta) as f64;
                numbers.push(Value::Number(Number::from_f64(double).unwrap()));
            }
        }
    }
    numbers.extend([json!(i64::MIN), json!(i64::MIN + 1), json!(-9_223_372_036_854_775_000i64)]);
    let mut seen: BTreeMap<String, i128> = BTreeMap::new();
    for value in &numbers {
        let exact = exact_integer(value.as_number().unwrap()).expect("integral");
        let text = canonical(value);
        if let Some(&before) = seen.get(&text) {
            assert_eq!(before, exact, "{before} and {exact} share the canonical text {text}");
        }
        seen.insert(text, exact);
    }
}

#[test]
fn wide_integers_in_to_value() {
    assert_eq!(to_value(&5i128), Ok(json!(5)));
    assert_eq!(to_value(&-5i128), Ok(json!(-5)));
    assert_eq!(to_value(&u128::from(u64::MAX)), Ok(json!(u64::MAX)));
    assert_eq!(to_value(&i128::from(i64::MIN)), Ok(json!(i64::MIN)));
    // Beyond 64 bits but exactly a double: kept as that double.
    let two_100 = to_value(&(1u128 << 100)).expect("2^100 is a double");
    assert_eq!(canonical(&two_100), "1.2676506002282294e+30");
    let top = to_value(&(1u128 << 127)).expect("2^127 is a double");
    assert_eq!(canonical(&top), "1.7014118346046923e+38");
    let min = to_value(&i128::MIN).expect("-2^127 is a double");
    assert_eq!(canonical(&min), "-1.7014118346046923e+38");
    // Saturating casts must not make these look exact.
    for (value, digits) in [
        (to_value(&i128::MAX), i128::MAX.to_string()),
        (to_value(&u128::MAX), u128::MAX.to_string()),
        (to_value(&((1u128 << 100) + 1)), ((1u128 << 100) + 1).to_string()),
        (to_value(&-((1i128 << 100) + 1)), (-((1i128 << 100) + 1)).to_string()),
    ] {
        assert_eq!(value, Err(CanonicalError::InexactInteger { path: String::new(), value: digits }));
    }
}

#[test]
fn parse_strict_integer_literals() {
    // Integer literals in the 64-bit range are kept exactly, as integers.
    assert_eq!(parse_strict("9007199254740992"), Ok(json!(9007199254740992u64)));
    assert_eq!(parse_strict("-9223372036854775808"), Ok(json!(i64::MIN)));
    for (literal, value) in [
        ("9007199254740993", json!(9_007_199_254_740_993u64)),
        ("-9007199254740993", json!(-9_007_199_254_740_993i64)),
        ("9223372036854775807", json!(i64::MAX)),
        ("9223372036854776000", json!(9_223_372_036_854_776_000u64)),
        ("18446744073709551615", json!(u64::MAX)),
    ] {
        assert_eq!(parse_strict(literal), Ok(value.clone()), "{literal}");
        assert_eq!(canonical(&value), literal);
    }
    // Beyond 64 bits integers are RFC 8785 doubles: the literal must be one exactly...
    assert_eq!(
        parse_strict(r#"{"id": 100000000000000000000000000001}"#),
        Err(CanonicalError::InexactInteger { path: "id".into(), value: "100000000000000000000000000001".into() })
    );
    // 10^23 is not a double (the nearest prints as 1e+23).
    assert!(matches!(parse_strict("100000000000000000000000"), Err(CanonicalError::InexactInteger { .. })));
    assert!(matches!(parse_strict("18446744073709551617"), Err(CanonicalError::InexactInteger { .. })));
    let two_100 = parse_strict("1267650600228229401496703205376").expect("2^100 is a double");
    assert_eq!(canonical(&two_100), "1.2676506002282294e+30");
    assert_eq!(canonical(&parse_strict("18446744073709551616").expect("2^64 is a double")), "18446744073709552000");
    // ...or its canonical spelling, so canonical output (the RFC's own vectors included) always
    // parses back.
    for literal in ["295147905179352830000", "999999999999999700000", "18446744073709552000", "-18446744073709552000"] {
        let value = parse_strict(literal).expect(literal);
        assert!(value.is_f64(), "{literal}");
        assert_eq!(canonical(&value), literal);
    }
    // RFC 8785's spelling of -2^63 is not its canonical text here (that is -9223372036854775808),
    // and as an integer it would be a different one: refused rather than rounded.
    assert_eq!(
        parse_strict("-9223372036854776000"),
        Err(CanonicalError::InexactInteger { path: String::new(), value: "-9223372036854776000".into() })
    );
    // Written as a decimal or exponent it is an ordinary (rounded) double, as in the RFC and serde_json.
    assert_eq!(canonical(&parse_strict("1E30").expect("parses")), "1e+30");
    assert_eq!(canonical(&parse_strict("1.152921504606846976e18").expect("parses")), "1152921504606846976");
    assert_eq!(canonical(&parse_strict("-0").expect("parses")), "0");
}

#[test]
fn parse_strict_numbers_are_correctly_rounded() {
    // Every spelling of the same double gives the same bytes.
    for text in ["1e23", "1.0e23", "0.1e24", "99999999999999999999999.99", "100000000000000000000000.0"] {
        assert_eq!(canonical(&parse_strict(text).expect("parses")), "1e+23", "{text}");
    }
    // Values serde_json's default (best-effort) parser gets one ulp wrong.
    for f in [2.699038309416696e-307, -1.6810777060633125e53, 1.9152320786075119e86] {
        let text = canonical_double(f).expect("finite");
        let parsed = parse_strict(&text).expect("parses");
        assert_eq!(parsed.as_f64().map(f64::to_bits), Some(f.to_bits()), "{text}");
    }
    assert_eq!(canonical(&parse_strict("1e-400").expect("underflows to zero")), "0");
    let err = parse_strict(r#"{"x": 1e400}"#).unwrap_err();
    assert!(matches!(&err, CanonicalError::Invalid { message } if message.contains("`x`")), "{err}");
    assert!(matches!(parse_strict("-1e400"), Err(CanonicalError::Invalid { .. })));
}

#[test]
fn depth_limit() {
    assert_eq!(MAX_DEPTH, 128);
    let ok = nested_arrays(MAX_DEPTH);
    let too_deep = nested_arrays(MAX_DEPTH + 1);
    let deep_path = "[0]".repeat(MAX_DEPTH);
    let expected = CanonicalError::TooDeep { path: deep_path, limit: MAX_DEPTH };

    // write_canonical
    assert_eq!(canonical(&ok), nested_text(MAX_DEPTH).replace("[]", "[null]"));
    assert_eq!(to_canonical_vec(&too_deep), Err(expected.clone()));

    // to_value
    assert_eq!(to_value(&ok).as_ref(), Ok(&ok));
    assert_eq!(to_value(&too_deep), Err(expected));

    // parse_strict
    let parsed = parse_strict(&nested_text(MAX_DEPTH)).expect("128 levels are fine");
    assert_eq!(canonical(&parsed), nested_text(MAX_DEPTH));
    assert!(matches!(parse_strict(&nested_text(MAX_DEPTH + 1)), Err(CanonicalError::TooDeep { limit: MAX_DEPTH, .. })));
    let objects = format!("{}1{}", r#"{"a":"#.repeat(MAX_DEPTH + 1), "}".repeat(MAX_DEPTH + 1));
    let err = parse_strict(&objects).unwrap_err();
    assert_eq!(err, CanonicalError::TooDeep { path: vec!["a"; MAX_DEPTH].join("."), limit: MAX_DEPTH });
}

#[test]
fn enum_variants_count_toward_depth() {
    #[derive(Serialize)]
    enum Tagged {
        Tuple(u8, u8),
        Struct { x: u8 },
        Newtype(u8),
    }
    // `{variant: [..]}` and `{variant: {..}}` take two levels.
    for tagged in [Tagged::Tuple(1, 2), Tagged::Struct { x: 1 }] {
        // Serialising the enum itself below 127 arrays must fail the same way.
        struct Deep<'a>(&'a Tagged, usize);
        impl Serialize for Deep<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                if self.1 == 0 {
                    self.0.serialize(serializer)
                } else {
                    [Deep(self.0, self.1 - 1)].serialize(serializer)
                }
            }
        }
        assert!(to_value(&Deep(&tagged, MAX_DEPTH - 2)).is_ok());
        assert!(matches!(
            to_value(&Deep(&tagged, MAX_DEPTH - 1)),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH, .. })
        ));
    }
    assert!(to_value(&Tagged::Newtype(1)).is_ok());
}

#[test]
fn very_deep_text_is_refused_without_overflowing_the_stack() {
    let deep = nested_text(100_000);
    assert!(matches!(parse_strict(&deep), Err(CanonicalError::TooDeep { limit: MAX_DEPTH, .. })));
    let unclosed = "[".repeat(100_000);
    assert!(matches!(parse_strict(&unclosed), Err(CanonicalError::TooDeep { .. })));
    let objects = r#"{"a":"#.repeat(100_000);
    assert!(matches!(parse_strict(&objects), Err(CanonicalError::TooDeep { .. })));
}

#[test]
fn duplicate_member_names() {
    assert_eq!(
        parse_strict(r#"{"a":1,"a":2}"#),
        Err(CanonicalError::DuplicateKey { path: String::new(), key: "a".into() })
    );
    // Same name after unescaping.
    assert_eq!(
        parse_strict(r#"{"a":1,"\u0061":1}"#),
        Err(CanonicalError::DuplicateKey { path: String::new(), key: "a".into() })
    );
    let err = parse_strict(r#"{"x":[{"b":1},{"b":1,"c":0,"b":2}]}"#).unwrap_err();
    assert_eq!(err, CanonicalError::DuplicateKey { path: "x[1]".into(), key: "b".into() });
    assert_eq!(err.to_string(), r#"argument `x[1]` has the member name "b" more than once; send each member once"#);
    // The same name in different objects is fine.
    assert!(parse_strict(r#"{"a":{"a":1},"b":{"a":2}}"#).is_ok());
    // A Serialize impl emitting a name twice is refused too.
    let mut outer = BTreeMap::new();
    outer.insert("m", Pairs(vec![("k", 1), ("k", 2)]));
    assert_eq!(to_value(&outer), Err(CanonicalError::DuplicateKey { path: "m".into(), key: "k".into() }));
}

#[test]
fn map_keys_follow_serde_json() {
    let mut ints = BTreeMap::new();
    ints.insert(-3i32, "neg");
    ints.insert(10, "ten");
    assert_eq!(to_value(&ints), Ok(json!({"-3": "neg", "10": "ten"})));

    let mut chars = BTreeMap::new();
    chars.insert('x', 1);
    assert_eq!(to_value(&chars), Ok(json!({"x": 1})));

    let mut bools = BTreeMap::new();
    bools.insert(true, 1);
    assert_eq!(to_value(&bools), Ok(json!({"true": 1})));

    // Floats as JavaScript would name the member: 1.0 is "1".
    assert_eq!(to_value(&Pairs(vec![(1.0f64, 1), (0.5, 2)])), Ok(json!({"1": 1, "0.5": 2})));
    assert_eq!(to_value(&Pairs(vec![(f64::NAN, 1)])), Err(CanonicalError::NonFinite { path: String::new() }));

    #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
    enum Color {
        Red,
    }
    let mut colors = BTreeMap::new();
    colors.insert(Color::Red, 1);
    assert_eq!(to_value(&colors), Ok(json!({"Red": 1})));

    let mut tuples = BTreeMap::new();
    tuples.insert((1, 2), "pair");
    let err = to_value(&BTreeMap::from([("m", tuples)])).unwrap_err();
    assert_eq!(err, CanonicalError::NonStringKey { path: "m".into() });
    assert!(err.to_string().contains("argument `m`"));

    let mut bytes = BTreeMap::new();
    bytes.insert(vec![1u8], 1);
    assert_eq!(to_value(&bytes), Err(CanonicalError::NonStringKey { path: String::new() }));
    assert_eq!(to_value(&Pairs(vec![(None::<&str>, 1)])), Err(CanonicalError::NonStringKey { path: String::new() }));
}

#[test]
fn to_value_matches_serde_json_for_ordinary_data() {
    #[derive(Serialize)]
    enum Shape {
        Point,
        Circle { radius: f64 },
        Pair(i32, i32),
        Named(String),
    }
    #[derive(Serialize)]
    struct Unit;
    #[derive(Serialize)]
    struct Wrapper(u8);
    #[derive(Serialize)]
    struct Everything {
        shapes: Vec<Shape>,
        maybe: Option<u8>,
        nothing: Option<u8>,
        tuple: (bool, char, &'static str),
        unit: (),
        unit_struct: Unit,
        wrapper: Wrapper,
        #[serde(with = "bytes_as_bytes")]
        bytes: Vec<u8>,
        small: f32,
        big: u64,
        neg: i64,
        map: BTreeMap<String, Vec<u16>>,
    }
    mod bytes_as_bytes {
        pub fn serialize<S: serde::Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(bytes)
        }
    }
    let value = Everything {
        shapes: vec![Shape::Point, Shape::Circle { radius: 1.5 }, Shape::Pair(-1, 2), Shape::Named("n".into())],
        maybe: Some(3),
        nothing: None,
        tuple: (true, 'é', "s"),
        unit: (),
        unit_struct: Unit,
        wrapper: Wrapper(7),
        bytes: vec![0, 255],
        small: 0.1,
        big: u64::MAX,
        neg: i64::MIN,
        map: BTreeMap::from([("k".to_owned(), vec![1, 2])]),
    };
    let ours = to_value(&value).expect("finite");
    let theirs = serde_json::to_value(&value).expect("serde_json");
    assert_eq!(ours, theirs);

    let err = to_value(&vec![Shape::Point, Shape::Circle { radius: f64::NAN }]).unwrap_err();
    assert_eq!(err, CanonicalError::NonFinite { path: "[1].Circle.radius".into() });
}

#[test]
fn custom_serialize_errors_are_invalid() {
    struct Broken;
    impl Serialize for Broken {
        fn serialize<S: serde::Serializer>(&self, _serializer: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("broken on purpose"))
        }
    }
    let err = to_value(&vec![Broken]).unwrap_err();
    assert!(matches!(&err, CanonicalError::Invalid { message } if message.contains("broken on purpose")), "{err}");
}

#[test]
fn malformed_text_is_refused() {
    let bad = [
        "",
        "   ",
        "{} x",
        "{}{}",
        "[1,]",
        "[,1]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        "{a:1}",
        "[1 2]",
        "01",
        "-01",
        "1.",
        ".5",
        "+1",
        "-",
        "1e",
        "1e+",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "nul",
        "tru",
        "'a'",
        "\"\u{1}\"",
        "\"a\nb\"",
        r#""\x""#,
        r#""\u12""#,
        r#""\ud800""#,
        r#""\ud800\u0041""#,
        r#""\udc00""#,
        "\"unterminated",
        "\u{feff}{}",
        "[1]\u{0}",
    ];
    for text in bad {
        assert!(
            matches!(parse_strict(text), Err(CanonicalError::Invalid { .. })),
            "{text:?} -> {:?}",
            parse_strict(text)
        );
    }
    let err = parse_strict("{\n  \"a\": tru\n}").unwrap_err();
    assert_eq!(err.to_string(), "malformed JSON at line 2 column 8: expected a JSON value");
}

#[test]
fn well_formed_corner_cases_are_accepted() {
    let cases: &[(&str, &str)] = &[
        (" \t\r\n1 \t\r\n", "1"),
        (r#""\ud83d\ude00""#, "\"😀\""),
        (r#""\/\b\f\n\r\t\"\\""#, r#""/\b\f\n\r\t\"\\""#),
        ("1E+2", "100"),
        ("0.1e1", "1"),
        ("-0.0", "0"),
        ("[]", "[]"),
        ("{}", "{}"),
        (r#"{"":0}"#, r#"{"":0}"#),
        ("\"\u{7f}\u{10ffff}\"", "\"\u{7f}\u{10ffff}\""),
    ];
    for (text, expected) in cases {
        assert_eq!(canonical(&parse_strict(text).expect(text)), *expected, "{text:?}");
    }
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

const TWO_53: i64 = 1 << 53;

/// serde_json's default float parser is best-effort (its `float_roundtrip`
/// feature is off): over 20 million random doubles it was at most 2 units in
/// the last place off. parse_strict is held to 0.
const SERDE_JSON_ULPS: u64 = 4;

fn arb_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::char::range('a', 'z'),
        2 => any::<char>(),
        1 => prop::char::range('\u{0}', '\u{1f}'),
        1 => prop::sample::select(vec![
            '"', '\\', '/', '\u{7f}', '\u{80}', 'ö', '€', '\u{2028}', '\u{2029}', '\u{e000}', '\u{fb33}',
            '\u{ffff}', '\u{10000}', '😀', '\u{10ffff}',
        ]),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop::collection::vec(arb_char(), 0..8).prop_map(|chars| chars.into_iter().collect())
}

fn arb_finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |f| f.is_finite()),
        -1e6..1e6f64,
        (-TWO_53..TWO_53).prop_map(|n| n as f64),
        // Integral doubles beyond 2^53, which ECMAScript prints as padded digits up to 1e21.
        any::<i64>().prop_map(|n| n as f64),
        (-1e22..1e22f64).prop_map(f64::trunc),
        prop::sample::select(vec![0.0, -0.0, 0.1, 1e21, 1e-7, 5e-324, f64::MAX, f64::MIN_POSITIVE]),
    ]
}

fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-TWO_53..=TWO_53).prop_map(|n| Value::Number(n.into())),
        (-1000i64..1000).prop_map(|n| Value::Number(n.into())),
        // Snowflake ids and nanosecond times: integers beyond 2^53.
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        arb_finite_f64().prop_map(|f| Value::Number(Number::from_f64(f).expect("finite"))),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_string(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// The exact value of a number that is an integer (an integer, or an integral double), else `None`.
fn exact_integer(n: &Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = n.as_u64() {
        return Some(u.into());
    }
    n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e38).map(|f| f as i128)
}

/// Equality up to number representation: integers (and integral doubles)
/// compare exactly, other numbers as doubles, and `ulps` allows that many
/// units in the last place of difference between doubles.
fn same_value(a: &Value, b: &Value, ulps: u64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (exact_integer(x), exact_integer(y)) {
            (Some(i), Some(j)) if i == j => true,
            (Some(_), Some(_)) if ulps == 0 => false,
            _ => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => x == y || (x.signum() == y.signum() && x.to_bits().abs_diff(y.to_bits()) <= ulps),
                _ => false,
            },
        },
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| same_value(x, y, ulps))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            xs.len() == ys.len() && xs.iter().all(|(k, x)| ys.get(k).is_some_and(|y| same_value(x, y, ulps)))
        }
        _ => a == b,
    }
}

/// The shortest digits `s` and exponent of `x` (so `x` is `0.s × 10^(n)`,
/// with `n` returned), as ECMA-262 asks: Rust's shortest round-trip digits,
/// except that when `x` lies exactly halfway between two shortest
/// candidates the even one is taken (ECMA-262's recommended tie rule, which
/// V8 and Ryu follow; Rust rounds such ties up).
fn shortest_digits(x: f64) -> (String, i32) {
    let split = |text: String| {
        let (mantissa, exponent) = text.split_once('e').map(|(m, e)| (m.replace('.', ""), e.to_owned())).expect("exp");
        (mantissa, exponent.parse::<i32>().expect("exponent") + 1)
    };
    let (digits, n) = split(format!("{x:e}"));
    // Rust prints the exact decimal expansion when given a precision; no
    // double needs more than 767 significant digits.
    let (exact, exact_n) = split(format!("{x:.800e}"));
    let k = digits.len();
    let tie = exact_n == n && exact[k..].starts_with('5') && exact[k + 1..].bytes().all(|b| b == b'0');
    if tie {
        let lower: u128 = exact[..k].parse().expect("at most 17 digits");
        for candidate in [lower, lower + 1] {
            let text = candidate.to_string();
            let round_trips = format!("0.{text}e{n}").parse::<f64>().ok() == Some(x);
            if candidate % 2 == 0 && text.len() == k && round_trips {
                return (text, n);
            }
        }
    }
    (digits, n)
}

/// ECMAScript Number::toString (ECMA-262 6.1.6.1.20) built independently
/// of ryu-js, from [`shortest_digits`].
fn ecmascript_reference(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    let sign = if f < 0.0 { "-" } else { "" };
    let (digits, n) = shortest_digits(f.abs());
    let k = digits.len() as i32;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let e_sign = if e < 0 { "-" } else { "+" };
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        format!("{first}{rest}e{e_sign}{}", e.abs())
    };
    format!("{sign}{body}")
}

/// idem's number text: RFC 8785's, except that an integral double in the 64-bit range
/// (-2^63 ..= 2^64 - 1) is written as its exact integer digits, like any integer there.
fn idem_reference(f: f64) -> String {
    if f.fract() == 0.0 && (-9223372036854775808.0..18446744073709551616.0).contains(&f) {
        (f as i128).to_string()
    } else {
        ecmascript_reference(f)
    }
}

/// Writes `value` as JSON text in a deliberately unusual but equivalent way:
/// members in reverse order, whitespace everywhere, characters escaped as
/// `\uXXXX` (surrogate pairs above U+FFFF) and numbers in other spellings.
fn noisy_json(value: &Value, seed: u64, out: &mut String) {
    let ws = [" ", "\n", "\t", "\r\n  ", ""][(seed % 5) as usize];
    match value {
        Value::Number(n) => {
            out.push_str(ws);
            // A fraction or exponent makes a double, so integers a double cannot hold keep their digits.
            let respellable = |i: i64| (i as f64) as i128 == i128::from(i);
            match (n.as_i64(), n.as_f64()) {
                (Some(i), _) if !respellable(i) => out.push_str(&i.to_string()),
                (Some(i), _) if seed.is_multiple_of(3) => out.push_str(&format!("{i}.000e0")),
                (Some(i), _) if seed % 3 == 1 => out.push_str(&format!("{i}E+0")),
                (None, _) if n.is_u64() => out.push_str(&n.to_string()),
                (_, Some(f)) if seed.is_multiple_of(2) => out.push_str(&format!("{f:e}")),
                (_, Some(f)) => out.push_str(&format!("{f:?}")),
                _ => out.push_str(&n.to_string()),
            }
            out.push_str(ws);
        }
        Value::String(s) => noisy_string(s, seed, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                noisy_json(item, seed.rotate_left(7) ^ i as u64, out);
            }
            out.push_str(ws);
            out.push(']');
        }
        Value::Object(members) => {
            out.push_str(ws);
            out.push('{');
            for (i, (key, member)) in members.iter().rev().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                noisy_string(key, seed ^ 0x55, out);
                out.push(':');
                noisy_json(member, seed.rotate_left(11) ^ i as u64, out);
            }
            out.push_str(ws);
            out.push('}');
        }
        other => {
            out.push_str(ws);
            out.push_str(&other.to_string());
        }
    }
}

fn noisy_string(s: &str, seed: u64, out: &mut String) {
    out.push_str(" \"");
    for (i, c) in s.chars().enumerate() {
        if (seed >> (i % 64)) & 1 == 1 || c < ' ' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04X}"));
            }
        } else if c == '"' || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c == '/' {
            out.push_str("\\/");
        } else {
            out.push(c);
        }
    }
    out.push_str("\" ");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (1) Canonical bytes parse back to the original value. With parse_strict
    /// the doubles are bit-for-bit identical, which makes canonicalisation
    /// injective; serde_json's best-effort float parsing gets a few ulps.
    #[test]
    fn canonical_bytes_parse_back_to_the_value(value in arb_json()) {
        let bytes = to_canonical_vec(&value).expect("canonical");
        let back: Value = serde_json::from_slice(&bytes).expect("serde_json parses canonical JSON");
        prop_assert!(same_value(&value, &back, SERDE_JSON_ULPS), "serde_json: {value} vs {back}");
        let strict = parse_strict(std::str::from_utf8(&bytes).expect("UTF-8")).expect("parse_strict");
        prop_assert!(same_value(&value, &strict, 0), "parse_strict: {value} vs {strict}");
    }

    /// (2) canonical(parse(canonical(v))) == canonical(v).
    #[test]
    fn canonicalising_is_idempotent(value in arb_json()) {
        let once = to_canonical_vec(&value).expect("canonical");
        let reparsed = parse_strict(std::str::from_utf8(&once).expect("UTF-8")).expect("parses");
        prop_assert_eq!(to_canonical_vec(&reparsed).expect("canonical"), once);
    }

    /// (3) Whitespace and member order do not matter.
    #[test]
    fn pretty_printing_does_not_change_the_bytes(value in arb_json()) {
        let pretty = serde_json::to_string_pretty(&value).expect("serde_json");
        let reparsed = parse_strict(&pretty).expect("parses");
        prop_assert_eq!(to_canonical_vec(&reparsed).expect("canonical"), to_canonical_vec(&value).expect("canonical"));
    }

    /// (3b) Neither do escapes, member order or number spelling.
    #[test]
    fn any_equivalent_encoding_gives_the_same_bytes(value in arb_json(), seed in any::<u64>()) {
        let mut text = String::new();
        noisy_json(&value, seed, &mut text);
        let reparsed = parse_strict(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(to_canonical_vec(&reparsed).expect("canonical"), to_canonical_vec(&value).expect("canonical"));
    }

    /// (4) An integer and the same number as a double are one value.
    #[test]
    fn integers_and_integral_doubles_agree(n in -TWO_53 + 1..TWO_53) {
        let as_int = to_value(&n).expect("int");
        let as_double = to_value(&(n as f64)).expect("double");
        prop_assert_eq!(canonical(&as_int), canonical(&as_double));
        prop_assert_eq!(canonical(&as_int), n.to_string());
        let text = format!("[{n}, {n}.0, {n}e0]");
        prop_assert_eq!(canonical(&parse_strict(&text).expect("parses")), format!("[{n},{n},{n}]"));
    }

    /// Doubles print as ECMAScript does, checked against a reference written
    /// from the specification (integral doubles in the 64-bit range excepted:
    /// those are written as the integer they are).
    #[test]
    fn doubles_match_the_ecmascript_reference(f in arb_finite_f64()) {
        prop_assert_eq!(canonical_double(f).expect("finite"), idem_reference(f));
        if f.fract() != 0.0 || f.abs() <= TWO_53 as f64 || f.abs() >= 18446744073709551616.0 {
            prop_assert_eq!(canonical_double(f).expect("finite"), ecmascript_reference(f));
        }
    }

    /// (4b) Every integer in the 64-bit range keeps its digits, parses back
    /// to itself, and two different ones never share bytes.
    #[test]
    fn integers_in_the_64_bit_range_are_exact(i in any::<i64>(), u in any::<u64>(), v in any::<u64>()) {
        prop_assert_eq!(canonical(&json!(i)), i.to_string());
        prop_assert_eq!(canonical(&json!(u)), u.to_string());
        prop_assert_eq!(parse_strict(&u.to_string()).expect("parses"), json!(u));
        prop_assert_eq!(parse_strict(&i.to_string()).expect("parses"), json!(i));
        prop_assert_eq!(canonical(&json!(u)) == canonical(&json!(v)), u == v);
        prop_assert_eq!(canonical(&to_value(&u).expect("u64")), u.to_string());
        // The nearest double is the integer it equals.
        let near = u as f64;
        prop_assert_eq!(canonical_double(near).expect("finite"), idem_reference(near));
    }

    /// JCS string escaping coincides with serde_json's (both follow the same
    /// minimal escaping), and member order is UTF-16 code-unit order.
    #[test]
    fn strings_and_member_order(members in prop::collection::btree_map(arb_string(), arb_string(), 0..8)) {
        let value = Value::Object(members.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect());
        let mut sorted: Vec<_> = members.iter().collect();
        sorted.sort_by_key(|(key, _)| key.encode_utf16().collect::<Vec<u16>>());
        let expected: Vec<String> = sorted
            .iter()
            .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).expect("str"), serde_json::to_string(v).expect("str")))
            .collect();
        prop_assert_eq!(canonical(&value), format!("{{{}}}", expected.join(",")));
    }

    /// to_value is the identity on finite Values, and canonicalisation
    /// distinguishes distinct values.
    #[test]
    fn to_value_round_trips_and_distinct_values_differ(a in arb_json(), b in arb_json()) {
        prop_assert_eq!(to_value(&a).expect("finite"), a.clone());
        let same_bytes = to_canonical_vec(&a).expect("canonical") == to_canonical_vec(&b).expect("canonical");
        prop_assert_eq!(same_bytes, same_value(&a, &b, 0));
    }
}
