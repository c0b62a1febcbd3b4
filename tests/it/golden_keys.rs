//! Golden keys (issue 44, item 2, first step): the ledger key, the forwarded idempotency key and
//! the fingerprint of one call of every recipe shape, pinned to the bytes this version derives.
//! A key that changes is a broken promise — every repeat of an operation made before the change
//! would run again — so work on how keys are derived (the canonical stream, the hashers) must
//! leave every value here as it is. The values were derived at commit 5502b59 (the key's code
//! — `key.rs`, `canonical/`, `scope.rs`, `secret.rs`, `idem/arguments.rs` — is the same since).
//!
//! Three doors derive keys: `Idem::call` (through `Admin::key_of`, the same derivation), the
//! `#[idempotent]` macro, and the HTTP layer; each has its case.

use std::time::Duration;

use axum::routing::post;
use http::{Method, Request};
use idem_runtime::canonical::Members;
use idem_runtime::http::{IdempotencyLayer, Route};
use idem_runtime::key::Fingerprint;
use idem_runtime::mcp::ToolError;
use idem_runtime::{Caller, Idem, MemoryLedger, Recipe, ScopeRule, current_operation, idempotent};
use serde_json::{Value, json};
use tower::ServiceExt;

/// A window end fixed for the forwarded keys (2023-11-14T22:13:20Z).
const WINDOW_END: u64 = 1_700_000_000_000;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn handle(namespace: Option<&str>) -> Idem {
    let builder = Idem::builder(MemoryLedger::new()).secret(idem_tests::test_secret());
    let builder = match namespace {
        Some(namespace) => builder.namespace(namespace),
        None => builder,
    };
    builder.build().unwrap()
}

/// One call's derived values: `ledger key / idempotency key / fingerprint digest / tags`.
fn derived(idem: &Idem, recipe: &Recipe, caller: &Caller, arguments: &Value) -> String {
    let key = idem.admin().key_of(recipe, caller, arguments).expect("a key");
    let members = Members::of_arguments(arguments).expect("members");
    let mut fingerprint = Fingerprint::of_members(&idem_tests::test_secret(), &members, recipe.ignore_paths());
    fingerprint.tag(&idem_tests::test_secret());
    let tags: Vec<String> = fingerprint.tags().iter().map(|tag| hex(tag)).collect();
    format!(
        "{} / {} / {} / {}",
        hex(key.as_bytes()),
        key.idempotency_key(WINDOW_END),
        hex(fingerprint.digest()),
        tags.join(",")
    )
}

static PLAIN: Recipe = Recipe::new("charge_card", &["order_id", "amount"]);
static NESTED: Recipe = Recipe::new("ship", &["customer.id"]);
static OPTIONAL: Recipe = Recipe::new("refund", &["order_id", "reason"]).optional_keys(&["reason"]);
static TENANT: Recipe = Recipe::new("settle", &["batch"]).scope(ScopeRule::Tenant);
static WITHIN: Recipe = Recipe::new("reply", &["message"]).scope(ScopeRule::Within("conversation_id"));
static NAMESPACED: Recipe = Recipe::new("charge_card", &["order_id", "amount"]).namespace("orders");
static IGNORING: Recipe = Recipe::new("note", &["order_id"]).ignore(&["trace_id"]).window(Duration::from_secs(15 * 60));
static VALUES: Recipe = Recipe::new("values", &["text", "float", "negative", "big", "flag", "list", "object"]);

#[test]
fn every_recipe_shape_keeps_its_key() {
    let idem = handle(None);
    let charge = json!({ "order_id": "o-1", "amount": 1250, "note": "first" });
    let cases: [(&str, &Idem, &Recipe, Caller, Value); 11] = [
        ("plain", &idem, &PLAIN, alice(), charge.clone()),
        ("plain, another caller", &idem, &PLAIN, Caller::new("acme", "bob"), charge.clone()),
        ("nested path", &idem, &NESTED, alice(), json!({ "customer": { "id": "c-9", "name": "Ada" }, "sku": "s" })),
        ("optional key absent", &idem, &OPTIONAL, alice(), json!({ "order_id": "o-2" })),
        ("optional key present", &idem, &OPTIONAL, alice(), json!({ "order_id": "o-2", "reason": "duplicate" })),
        ("tenant scope", &idem, &TENANT, alice(), json!({ "batch": 7 })),
        ("within scope", &idem, &WITHIN, alice(), json!({ "message": "hi", "conversation_id": "conv-3" })),
        ("recipe namespace", &idem, &NAMESPACED, alice(), charge.clone()),
        ("ignored argument, window", &idem, &IGNORING, alice(), json!({ "order_id": "o-4", "trace_id": "t-1" })),
        (
            "values",
            &idem,
            &VALUES,
            alice(),
            json!({
                "text": "Zoë 😀 \u{1}\"",
                "float": 12.5,
                "negative": -42,
                "big": u64::MAX,
                "flag": true,
                "list": [3, "b", null, [1.0e21]],
                "object": { "b": 1, "a": { "z": [], "é": {} } },
            }),
        ),
        ("handle namespace", &handle(Some("billing")), &PLAIN, alice(), charge),
    ];
    let found: Vec<String> = cases
        .iter()
        .map(|(name, idem, recipe, caller, arguments)| format!("{name}: {}", derived(idem, recipe, caller, arguments)))
        .collect();
    let expected: Vec<String> = GOLDEN.iter().map(|line| (*line).to_owned()).collect();
    assert_eq!(found, expected, "a key changed: every repeat of an operation made before would run again");
}

/// What `every_recipe_shape_keeps_its_key` derives, one line per case.
const GOLDEN: [&str; 11] = [
    "plain: 41f490fb120fcf669f8707a655a854701519571e80861c8f7314420cec2ed9b9 / a93e27909a948bed9690ac8522afaf3673d867dd318c2cdde67044b93a852e20 / a6aa31433a37ced4f072d430189ce0ed14626527451d9df669fa5f4b34287fd2 / 59fd5302,ca9b5b0b,d9912d7a",
    "plain, another caller: 30a9568240ae15ce3c12d65296ba6dd567e9f144eabc9718b25c7f04bc9b4ac7 / 95e2c88202ab75f6db406153034f720fc2de4919bfd2cfc06a91f685cf6a7d1f / a6aa31433a37ced4f072d430189ce0ed14626527451d9df669fa5f4b34287fd2 / 59fd5302,ca9b5b0b,d9912d7a",
    "nested path: 7017bd5967ac0cd225e04c24e817fd76843fe596c7bab68d75ad89237fdc83be / 70cefd896b3fc0f291145dcaf746e49afdab4e482bdcb385bf588baf4a210db5 / 72a2abe612242f4c7545c9d04e82714a07c1c3b4b63e129b648ed58211ff01f0 / b554ddf3,1922ca2f",
    "optional key absent: d37c0053752f1240ecebeb417c24b4328a24e0b04e1919a87c12e5e4a47d9c00 / 477e4eebc49fd8102f045ea0d8aa9faa7e839b3e4b80334a2b6f7783cc90c59d / fe1c3368876dd5b1758d9988f097bead96d6118e14317b88ff232e227b5f82fc / d9911ee3",
    "optional key present: 07eb621e922fb0a6f24b68a21e37c964b336c47ee79adf93ac5933f35d8d6021 / c8fb34fdd2384c236f2ca63060448c6f206ecc8463d7c98d967ab08f969561da / 8874845d8d5db07e6fe140b58b9996ef0f2fc6ee218aa0306e1ed5a87be4c875 / d9911ee3,66c7e5f0",
    "tenant scope: 44c082c659ed01a99ac5c9393d67f7665e3378d94f947abcccfc722ca2c4a447 / 466c271b6616fbe81b1bfee2fd2fdbd61fac4d36ebd037585ea10449513d273e / 6cfbd127dab299167e9fe3618d6ec84ab0b1791c85d819a62cf0662fd649b04b / 7675b811",
    "within scope: d9cf3775af1b1330729bb76af0bc689369ac332bd9070197606f7d1e6a4a7084 / 808c00c1c5c192e3e9c7ac13705062529d26ea8a7fc298b7545d40c99a4e71cd / 245641a44cb4640dc32c1bae1d1c82b4fb652e8ec6f514f77546d9ab46bee450 / 9fa7b1f7,e1a963e1",
    "recipe namespace: c9f2574d1f3b550f68786ab16e997e5d868ee943393d138ef13846549fbb471e / 355fe9c13ed75960242b5e7885c3c9d1116ca5a5d193213638732d774e7ce91b / a6aa31433a37ced4f072d430189ce0ed14626527451d9df669fa5f4b34287fd2 / 59fd5302,ca9b5b0b,d9912d7a",
    "ignored argument, window: a15b6e47592226cdd1282e25342b755c3ef2d4130a0f9233ff4c68df9ac17a68 / 263fb69ee15215eaaea25cea25c3a945f4fe85e2abe561b0825447ffce2614cc / 8d477bfde66d0f1592315435f4f8f464c38005fbb356d5ee4912468e6959d538 / d9914969",
    "values: 1365a043b7d7396a7048022a580c4468777704ec5e1f0ba221c5c8f2a96336ca / a4d1d73a55c541b4cd27b8dcd2fcbe2152f40603c8677147595c1d892870b1c9 / f28b684797bdb1ee4f00466049a8d0dd1b401c196c8b07336b3602c847721a6c / a1746cd9,91f15c83,91f0bf5f,55796691,934531d8,f321291c,c3ad5933",
    "handle namespace: c0c62dcf610c4ff41e6f69592c9669bf7af2ff13f39c9d9544a5f5ac9e4e87a9 / 7fc44e53f6c728aa6e548c08d87f266ba71a760ba6d7823067a1ffb8d31d8bfd / a6aa31433a37ced4f072d430189ce0ed14626527451d9df669fa5f4b34287fd2 / 59fd5302,ca9b5b0b,d9912d7a",
];

/// The key the `#[idempotent]` handler below ran under.
static SEEN_BY_THE_MACRO: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

#[idempotent(key = "order_id, amount", idem = idem)]
async fn golden_charge(idem: &Idem, order_id: String, amount: u64, note: String) -> Result<String, ToolError> {
    let operation = current_operation().expect("inside the operation");
    *SEEN_BY_THE_MACRO.lock().unwrap() = Some(hex(operation.ledger_key().as_bytes()));
    Ok(format!("{order_id} {amount} {note}"))
}

/// `#[idempotent]` derives the key of a handler's named arguments in the package's namespace
/// (`idem-tests`), under the caller in scope.
#[tokio::test]
async fn the_macros_key_is_kept() {
    let idem =
        Idem::builder(MemoryLedger::new()).secret(idem_tests::test_secret()).local_caller(alice()).build().unwrap();
    golden_charge(&idem, "o-1".to_owned(), 1250, "first".to_owned()).await.expect("it runs");
    let seen = SEEN_BY_THE_MACRO.lock().unwrap().clone().expect("the handler ran");
    assert_eq!(seen, "191ca08fd4dfaf2765c90b84e505938f4f945e15637faca4226f60bca8627d87", "the macro's key changed");
}

/// The HTTP layer derives a request's key from its route and the client's key, in the layer's
/// namespace, for the principal.
#[tokio::test]
async fn the_http_layers_key_is_kept() {
    let layer = IdempotencyLayer::new(handle(None), crate::http_layer::x_user).namespace("golden").route(
        Method::POST,
        "/payments",
        Route::new(),
    );
    let app = axum::Router::new()
        .route(
            "/payments",
            post(|| async { hex(current_operation().expect("inside the operation").ledger_key().as_bytes()) }),
        )
        .layer(layer);
    let request = Request::post("/payments")
        .header("x-user", "alice")
        .header("idempotency-key", "\"k-1\"")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"amount":5}"#))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&body),
        "9df3c89c4e65a2a4ad152288c8ed424876bdee60f57e238c82c44d5930831323",
        "the HTTP layer's key changed"
    );
}
