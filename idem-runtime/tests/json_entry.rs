//! The JSON entry point (`Idem::call` with a `serde_json::Value`) and the arguments it is given:
//! key paths that are missing or null, integers beyond 2^53, and `null` next to absent.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::canonical::to_value;
use idem_runtime::{
    Caller, ErrorClass, HasIdem, Idem, IdempotentError, MemoryLedger, Recipe, Ref, Rejection, current_operation,
    idempotent,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ToolError {
    Rejected { code: String, message: String },
}

impl IdempotentError for ToolError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected { code: rejection.code().to_owned(), message: rejection.to_string() }
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// The far side of the boundary: counts effects, and dedupes on the key it is forwarded.
#[derive(Default)]
struct Downstream {
    effects: AtomicUsize,
    keys: std::sync::Mutex<Vec<String>>,
}

impl Downstream {
    async fn act(&self) -> Result<usize, ToolError> {
        let key = current_operation().expect("inside the handler").idempotency_key();
        let mut keys = self.keys.lock().unwrap();
        if !keys.contains(&key) {
            keys.push(key);
        }
        Ok(self.effects.fetch_add(1, Ordering::SeqCst) + 1)
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    fn distinct_keys(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

/// Calls `recipe` with `arguments` as alice; `Ok((reference, replayed))` or the refusal's code
/// and message.
async fn call(
    idem: &Idem,
    recipe: &Recipe,
    arguments: &Value,
    downstream: &Downstream,
) -> Result<(Ref, bool), (String, String)> {
    match idem.call(recipe, Some(&alice()), arguments, || downstream.act()).await {
        Ok(served) => Ok((served.reference, served.replayed)),
        Err(ToolError::Rejected { code, message }) => Err((code, message)),
    }
}

// ---------------------------------------------------------------------------------------------
// Integers beyond 2^53
// ---------------------------------------------------------------------------------------------

static SHIP: Recipe = Recipe::new("ship_order", &["order_id"]);

/// Snowflake ids near each other, and pairs where one is a double and its RFC 8785 spelling is
/// the other (2^60 prints as 1152921504606847000, which is itself a valid, different id).
const SNOWFLAKES: &[(u64, u64)] = &[
    ((1 << 53) + 1, (1 << 53) + 2),
    (1 << 60, 1_152_921_504_606_847_000),
    (1 << 63, 9_223_372_036_854_776_000),
    (u64::MAX, u64::MAX - 1),
    (1_790_403_215_662_043_137, 1_790_403_215_662_043_138),
];

#[tokio::test]
async fn distinct_snowflake_ids_are_distinct_operations_and_each_repeat_replays() {
    for &(a, b) in SNOWFLAKES {
        let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
        let first = call(&idem, &SHIP, &json!({ "order_id": a }), &downstream).await;
        let (first, replayed) = first.unwrap_or_else(|refused| panic!("order {a} refused: {refused:?}"));
        assert!(!replayed);
        let (second, replayed) = call(&idem, &SHIP, &json!({ "order_id": b }), &downstream).await.unwrap();
        assert!(!replayed, "order {b} was answered with order {a}'s result");
        assert_ne!(first, second, "{a} and {b} share a key");
        assert_eq!((downstream.effects(), downstream.distinct_keys()), (2, 2), "{a} / {b}");
        // Repeats of each replay, as the same number in other spellings too.
        for again in [json!({ "order_id": a }), serde_json::from_str(&format!(r#"{{"order_id": {a}}}"#)).unwrap()] {
            assert_eq!(call(&idem, &SHIP, &again, &downstream).await, Ok((first, true)), "{a}");
        }
        assert_eq!(call(&idem, &SHIP, &json!({ "order_id": b }), &downstream).await, Ok((second, true)));
        assert_eq!(downstream.effects(), 2);
    }
}

#[tokio::test]
async fn negative_integers_beyond_2_53_are_exact_too() {
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let ids = [i64::MIN, i64::MIN + 1, -(1 << 53) - 1, -(1 << 53) - 2];
    let mut refs = Vec::new();
    for id in ids {
        let (reference, replayed) = call(&idem, &SHIP, &json!({ "order_id": id }), &downstream)
            .await
            .unwrap_or_else(|refused| panic!("{id} refused: {refused:?}"));
        assert!(!replayed);
        refs.push(reference);
    }
    let distinct: std::collections::HashSet<Ref> = refs.into_iter().collect();
    assert_eq!(distinct.len(), ids.len());
    assert_eq!(downstream.effects(), ids.len());
}

#[tokio::test]
async fn a_big_integer_that_is_a_double_keeps_one_key_however_it_arrives() {
    // 2^60 as a u64, as an f64 (serde_json parses `1.152921504606846976e18` to one), and as the
    // integer text: one number, one operation.
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let as_int = json!({ "order_id": 1u64 << 60 });
    let as_double: Value = serde_json::from_str(r#"{"order_id": 1.152921504606846976e18}"#).unwrap();
    assert!(as_double["order_id"].is_f64());
    let (first, _) = call(&idem, &SHIP, &as_int, &downstream).await.unwrap();
    assert_eq!(call(&idem, &SHIP, &as_double, &downstream).await, Ok((first, true)));
    assert_eq!(downstream.effects(), 1);
}

static RECORD: Recipe = Recipe::new("record_reading", &["sensor"]);

#[tokio::test]
async fn nanosecond_timestamps_outside_the_key_are_fingerprinted_exactly() {
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let at = 1_700_000_000_123_456_789u64;
    let reading = |at: u64| json!({ "sensor": "s-1", "at_ns": at });
    let (first, _) =
        call(&idem, &RECORD, &reading(at), &downstream).await.unwrap_or_else(|refused| panic!("refused: {refused:?}"));
    assert_eq!(call(&idem, &RECORD, &reading(at), &downstream).await, Ok((first, true)));
    // One nanosecond later is a different argument: a conflict naming it, not a replay.
    let (code, message) = call(&idem, &RECORD, &reading(at + 1), &downstream).await.unwrap_err();
    assert_eq!(code, "conflict", "{message}");
    assert!(message.contains("at_ns"), "{message}");
    assert_eq!(downstream.effects(), 1);
}

#[test]
fn rust_integers_of_any_width_keep_their_digits() {
    // What `#[idempotent]` uses to turn typed arguments into values.
    for (value, digits) in [
        (to_value(&u64::MAX), "18446744073709551615"),
        (to_value(&i64::MIN), "-9223372036854775808"),
        (to_value(&u128::from(u64::MAX)), "18446744073709551615"),
        (to_value(&i128::from(i64::MIN + 1)), "-9223372036854775807"),
        (to_value(&((1u64 << 53) + 1)), "9007199254740993"),
    ] {
        let value = value.expect("an integer");
        let canonical = idem_runtime::canonical::to_canonical_vec(&value).expect("canonical");
        assert_eq!(String::from_utf8(canonical).unwrap(), digits);
    }
}

/// `Idem::call` takes any `Serialize` and canonicalises it as `#[idempotent]` does: a NaN or an
/// infinity is refused, never keyed as `null`; a struct and the same `Value` are one call.
#[tokio::test]
async fn typed_arguments_are_canonicalised_and_non_finite_numbers_refused() {
    #[derive(Serialize)]
    struct Reading {
        order_id: &'static str,
        celsius: f64,
    }
    let (idem, downstream, alice) = (Idem::new(MemoryLedger::new()), Downstream::default(), alice());
    for celsius in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let reading = Reading { order_id: "o-1", celsius };
        match idem.call(&SHIP, Some(&alice), &reading, || downstream.act()).await {
            Err(ToolError::Rejected { code, message }) => {
                assert_eq!(code, "invalid_arguments", "{message}");
                assert!(message.contains("celsius"), "{message}");
            }
            Ok(_) => panic!("{celsius} was keyed"),
        }
    }
    assert_eq!(downstream.effects(), 0);
    let reading = Reading { order_id: "o-1", celsius: 21.5 };
    let first = idem.call(&SHIP, Some(&alice), &reading, || downstream.act()).await.unwrap();
    let as_json = json!({ "celsius": 21.5, "order_id": "o-1" });
    let again = idem.call(&SHIP, Some(&alice), &as_json, || downstream.act()).await.unwrap();
    assert!(again.replayed && again.reference == first.reference);
    assert_eq!(downstream.effects(), 1);
}

// ---------------------------------------------------------------------------------------------
// Key paths that are missing or null
// ---------------------------------------------------------------------------------------------

static CHARGE: Recipe = Recipe::new("charge_card", &["order_id", "customer.id"]);

#[tokio::test]
async fn a_missing_or_null_key_path_is_refused_naming_it_and_nothing_runs() {
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let cases = [
        (json!({ "orderId": "o-1", "customer": { "id": 7 } }), "order_id"),
        (json!({ "order_id": null, "customer": { "id": 7 } }), "order_id"),
        (json!({ "order_id": "o-1", "customer": { "uid": 7 } }), "customer.id"),
        (json!({ "order_id": "o-1", "customer": { "id": null } }), "customer.id"),
        (json!({ "order_id": "o-1", "customer": null }), "customer.id"),
        (json!({ "order_id": "o-1", "customer": "c-7" }), "customer.id"),
        (json!({ "order_id": "o-1" }), "customer.id"),
    ];
    for (arguments, path) in &cases {
        let refused = call(&idem, &CHARGE, arguments, &downstream).await;
        let (code, message) = refused.expect_err(&format!("{arguments} was not refused"));
        assert_eq!(code, "invalid_arguments", "{arguments}: {message}");
        assert!(message.starts_with("nothing was executed"), "{message}");
        assert!(message.contains(&format!("`{path}`")), "{arguments}: {message}");
        assert!(message.contains("missing (or null)"), "{message}");
        assert!(message.contains("send it"), "the message must say what to do: {message}");
    }
    assert_eq!(downstream.effects(), 0, "no call may run under a key made of nulls");
    // A complete call still runs.
    let complete = json!({ "order_id": "o-1", "customer": { "id": 7 } });
    assert_eq!(call(&idem, &CHARGE, &complete, &downstream).await.map(|(_, replayed)| replayed), Ok(false));
    assert_eq!(downstream.effects(), 1);
}

#[tokio::test]
async fn two_calls_with_different_typos_do_not_share_a_key() {
    // Before: both hashed `order_id` as null, so the second was answered with the first's result.
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let first = call(&idem, &SHIP, &json!({ "orderid": "o-1" }), &downstream).await;
    let second = call(&idem, &SHIP, &json!({ "order": "o-2" }), &downstream).await;
    assert!(matches!(&first, Err((code, _)) if code == "invalid_arguments"), "{first:?}");
    assert!(matches!(&second, Err((code, _)) if code == "invalid_arguments"), "{second:?}");
    assert_eq!(downstream.effects(), 0);
}

static APPLY_COUPON: Recipe = Recipe::new("apply_coupon", &["order_id", "coupon"]).optional_keys(&["coupon"]);

#[tokio::test]
async fn a_recipe_may_declare_a_key_path_optional_and_then_absent_is_null() {
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let (without, replayed) = call(&idem, &APPLY_COUPON, &json!({ "order_id": "o-1" }), &downstream).await.unwrap();
    assert!(!replayed);
    // Absent and null are one value of an optional key path.
    let explicit_null = json!({ "order_id": "o-1", "coupon": null });
    assert_eq!(call(&idem, &APPLY_COUPON, &explicit_null, &downstream).await, Ok((without, true)));
    // A coupon is a different operation.
    let with = json!({ "order_id": "o-1", "coupon": "SPRING" });
    let (coupon, replayed) = call(&idem, &APPLY_COUPON, &with, &downstream).await.unwrap();
    assert!(!replayed);
    assert_ne!(coupon, without);
    assert_eq!(downstream.effects(), 2);
    // The other key path is still required.
    let (code, message) = call(&idem, &APPLY_COUPON, &json!({ "coupon": "SPRING" }), &downstream).await.unwrap_err();
    assert_eq!(code, "invalid_arguments");
    assert!(message.contains("`order_id`"), "{message}");
    assert_eq!(APPLY_COUPON.optional_key_paths(), &["coupon"]);
    assert_eq!(downstream.effects(), 2);
}

// ---------------------------------------------------------------------------------------------
// `null` next to absent
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_null_argument_and_an_absent_one_are_the_same_call() {
    // Some clients send `null` for optional parameters they do not set, others leave them out.
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let omitted = json!({ "order_id": "o-1" });
    let explicit = json!({ "order_id": "o-1", "note": null });
    let (first, _) = call(&idem, &SHIP, &explicit, &downstream).await.unwrap();
    assert_eq!(call(&idem, &SHIP, &omitted, &downstream).await, Ok((first, true)));
    assert_eq!(call(&idem, &SHIP, &explicit, &downstream).await, Ok((first, true)));
    // Setting it is a change, named.
    let (code, message) =
        call(&idem, &SHIP, &json!({ "order_id": "o-1", "note": "x" }), &downstream).await.unwrap_err();
    assert_eq!(code, "conflict");
    assert!(message.contains("differing: note"), "{message}");
    assert_eq!(downstream.effects(), 1);

    // The other way round: first without, then with an explicit null.
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let (first, _) = call(&idem, &SHIP, &omitted, &downstream).await.unwrap();
    assert_eq!(call(&idem, &SHIP, &explicit, &downstream).await, Ok((first, true)));
    assert_eq!(downstream.effects(), 1);
}

#[tokio::test]
async fn a_null_inside_an_argument_is_a_value() {
    // Only top-level arguments are optional parameters; inside a value, `null` is data (a JSON
    // merge patch clears a field with it), so `{"line2": null}` and `{}` differ.
    let (idem, downstream) = (Idem::new(MemoryLedger::new()), Downstream::default());
    let cleared = json!({ "order_id": "o-1", "address": { "line1": "Main St", "line2": null } });
    let (_, replayed) = call(&idem, &SHIP, &cleared, &downstream).await.unwrap();
    assert!(!replayed);
    let untouched = json!({ "order_id": "o-1", "address": { "line1": "Main St" } });
    let (code, message) = call(&idem, &SHIP, &untouched, &downstream).await.unwrap_err();
    assert_eq!(code, "conflict");
    assert!(message.contains("differing: address"), "{message}");
    assert_eq!(downstream.effects(), 1);
}

// ---------------------------------------------------------------------------------------------
// The `#[idempotent]` path: typed arguments
// ---------------------------------------------------------------------------------------------

struct Shop {
    idem: Idem,
    downstream: Downstream,
}

impl HasIdem for Shop {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[idem_runtime::audit_idempotent]
impl Shop {
    fn new() -> Self {
        Shop {
            idem: Idem::builder(MemoryLedger::new()).local_caller(alice()).build().unwrap(),
            downstream: Downstream::default(),
        }
    }

    /// `coupon` is a key field of type `Option`: `None` is a legitimate value there.
    #[idempotent(key = "order_id, coupon")]
    async fn redeem(&self, order_id: u64, coupon: Option<String>, note: Option<String>) -> Result<usize, ToolError> {
        let _ = (order_id, coupon, note);
        self.downstream.act().await
    }
}

#[tokio::test]
async fn typed_handlers_take_snowflake_ids_and_a_none_key_field() {
    let shop = Shop::new();
    let (a, b) = (1u64 << 60, 1_152_921_504_606_847_000u64);
    assert_eq!(shop.redeem(a, None, None).await, Ok(1), "a None key field and a snowflake id run");
    assert_eq!(shop.redeem(b, None, None).await, Ok(2), "a neighbouring id is another operation");
    assert_eq!(shop.redeem(a, None, None).await, Ok(1), "a repeat replays");
    assert_eq!(shop.redeem(a, Some("SPRING".into()), None).await, Ok(3));
    // A `None` that is not part of the key fingerprints like an absent argument.
    assert_eq!(shop.redeem(b, None, None).await, Ok(2));
    assert_eq!(shop.downstream.effects(), 3);
    assert_eq!(shop.downstream.distinct_keys(), 3);
}
