//! Child keys (issue 42, item 8): a handler that makes two requests to one downstream inside one
//! operation — create a customer, then charge — sends each its own key, derived from the
//! operation's key and a label, so the downstream (which dedupes on `Idempotency-Key`) acts on
//! both, and a second run of the operation sends the same two keys and is answered from its
//! record. The downstream here is a real axum server on a loopback port that replays its first
//! answer for a key it has seen and counts its effects per key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use idem_runtime::http::{Child, ForwardKeyLayer, forwarded_child_key};
use idem_runtime::{Caller, Recipe, StalePolicy, current_operation};
use serde_json::{Value, json};
use tower_layer::Layer;
use tower_service::Service;

/// What the downstream did: its first answer and its effects, per key it received.
#[derive(Default)]
struct Processor {
    answers: Mutex<HashMap<String, Value>>,
    effects: Mutex<HashMap<String, usize>>,
    /// Every request, in order: (path, key).
    seen: Mutex<Vec<(String, String)>>,
}

impl Processor {
    fn effects(&self) -> usize {
        self.effects.lock().unwrap().values().sum()
    }
}

/// A processor that dedupes on the key it receives, whatever the path (as a naive one does):
/// a key it has seen gets its first answer, marked replayed, and no effect.
async fn processor_handler(
    State(processor): State<Arc<Processor>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (HeaderMap, Json<Value>) {
    let key = headers.get("idempotency-key").and_then(|key| key.to_str().ok()).unwrap_or("").to_owned();
    processor.seen.lock().unwrap().push((uri.path().to_owned(), key.clone()));
    let mut out = HeaderMap::new();
    if let Some(answer) = processor.answers.lock().unwrap().get(&key) {
        out.insert("idempotent-replayed", "true".parse().unwrap());
        return (out, Json(answer.clone()));
    }
    let object = if uri.path() == "/customers" { "customer" } else { "charge" };
    let answer = json!({ "object": object, "key": key, "amount": body["amount"] });
    *processor.effects.lock().unwrap().entry(key.clone()).or_default() += 1;
    processor.answers.lock().unwrap().insert(key, answer.clone());
    (out, Json(answer))
}

/// The processor at a local port: its base URL and its record.
async fn processor() -> (String, Arc<Processor>) {
    let state = Arc::new(Processor::default());
    let app = axum::Router::new()
        .route("/customers", post(processor_handler))
        .route("/charges", post(processor_handler))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), state)
}

use crate::http_layer::Reqwest;

type Client = idem_runtime::http::ForwardKey<Reqwest>;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Failed(String);

impl idem_runtime::IdempotentError for Failed {
    fn classify(&self) -> idem_runtime::ErrorClass {
        idem_runtime::ErrorClass::Unknown
    }
    fn from_rejection(rejection: idem_runtime::Rejection) -> Self {
        Self(rejection.to_string())
    }
}

/// One POST of `body` to `url` through `client`, naming the child key `child` when given.
async fn post_json(
    client: &mut Client,
    url: String,
    child: Option<&'static str>,
    body: Value,
) -> Result<(Value, bool), Failed> {
    let mut request = axum::http::Request::post(url).header("content-type", "application/json");
    if let Some(label) = child {
        request = request.extension(Child::new(label));
    }
    let request = request.body(body.to_string()).unwrap();
    let response = client.call(request).await.map_err(|error| Failed(error.to_string()))?;
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.json().await.map_err(|error| Failed(error.to_string()))?;
    Ok((body, replayed))
}

/// What the checkout handler got back: the customer, the charge, and whether each was replayed.
type Checkout = ((Value, bool), (Value, bool));

/// The handler: create a customer, then charge them, both at the processor, each request
/// naming its child key.
async fn checkout(mut client: Client, base: String) -> Result<Checkout, Failed> {
    let customer =
        post_json(&mut client, format!("{base}/customers"), Some("customer"), json!({ "email": "a@example.com" }))
            .await?;
    let charge = post_json(&mut client, format!("{base}/charges"), Some("charge"), json!({ "amount": 4200 })).await?;
    Ok((customer, charge))
}

/// The child keys of the running operation, as the processor receives them (quoted).
fn children() -> (String, String) {
    let operation = current_operation().expect("inside the handler");
    (format!("\"{}\"", operation.child("customer")), format!("\"{}\"", operation.child("charge")))
}

static CHECKOUT: Recipe = Recipe::new("checkout", &["cart"]).stale(StalePolicy::Takeover);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", idem_runtime::ledger::Token::random().get())
}

/// Red before child keys (the handler could only send the operation's key on both POSTs): the
/// charge carried the customer's key and was answered with the customer's replay
/// (`{"object":"customer",…}`, one effect). Now each request names its child (`Child`) and the
/// processor acts on both, under the keys `Operation::child` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_posts_to_one_downstream_carry_two_keys() {
    let (base, processor) = processor().await;
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let client = ForwardKeyLayer.layer(Reqwest(reqwest::Client::new()));
    let alice = Caller::new("shop", "alice");
    let cart = json!({ "cart": unique("cart") });
    let served = idem
        .call(&CHECKOUT, Some(&alice), &cart, || {
            let (client, base) = (client.clone(), base.clone());
            async move { Ok::<_, Failed>((checkout(client, base).await?, children())) }
        })
        .await
        .unwrap();
    let (((customer, customer_replayed), (charge, charge_replayed)), (customer_key, charge_key)) = served.value;
    assert!(!customer_replayed, "{customer}");
    assert!(!charge_replayed, "the charge was answered from another request's record: {charge}");
    assert_eq!(customer["object"], "customer");
    assert_eq!(charge["object"], "charge", "{charge}");
    assert_eq!(processor.effects(), 2, "a customer and a charge at the processor");
    assert_eq!(customer["key"], customer_key, "the customer carried `operation.child(\"customer\")`");
    assert_eq!(charge["key"], charge_key, "the charge carried `operation.child(\"charge\")`");
    assert_ne!(customer_key, charge_key);
}

/// A second run of the operation — a takeover after its holder died with both requests sent,
/// then the same operation run again — sends the same two child keys: the processor answers
/// both from its record, and acts on nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_sends_the_same_child_keys_and_the_downstream_replays_both() {
    let (base, processor) = processor().await;
    let idem =
        idem_tests::builder(idem_runtime::MemoryLedger::new()).lease(Duration::from_millis(100)).build().unwrap();
    let client = ForwardKeyLayer.layer(Reqwest(reqwest::Client::new()));
    let alice = Caller::new("shop", "alice");
    let cart = json!({ "cart": unique("cart") });
    let holder = {
        let (idem, alice, cart, client, base) =
            (idem.clone(), alice.clone(), cart.clone(), client.clone(), base.clone());
        tokio::spawn(async move {
            idem.call(&CHECKOUT, Some(&alice), &cart, || async move {
                let done = checkout(client, base).await?;
                // Work after both requests, during which this holder dies.
                std::future::pending::<()>().await;
                Ok::<_, Failed>(done)
            })
            .await
        })
    };
    for _ in 0..200 {
        if processor.effects() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(processor.effects(), 2, "the first run created the customer and charged");
    holder.abort();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let again = idem.call(&CHECKOUT, Some(&alice), &cart, || checkout(client.clone(), base.clone())).await.unwrap();
    assert!(!again.replayed, "the takeover ran the handler again");
    let ((customer, customer_replayed), (charge, charge_replayed)) = again.value;
    assert!(customer_replayed && charge_replayed, "both answered from the processor's record: {customer} {charge}");
    assert_eq!((&customer["object"], &charge["object"]), (&json!("customer"), &json!("charge")));
    assert_eq!(processor.effects(), 2, "no new effect at the processor");
    let seen = processor.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0], seen[2], "the customer's key, the same in both runs");
    assert_eq!(seen[1], seen[3], "the charge's key, the same in both runs");
    assert_ne!(seen[0].1, seen[1].1);
    let effects = processor.effects.lock().unwrap();
    assert!(effects.values().all(|&n| n == 1), "one effect per key: {effects:?}");
}

/// `Operation::child` is what the rustdoc says: SHA-256 over a tag, the idempotency key and the
/// length-framed label, 64 hex digits; distinct per label and from the key; the same for the
/// same label; `forwarded_child_key` is it quoted. Outside an operation there is none, and a
/// `Child` request passes the layer unchanged.
#[tokio::test]
async fn child_keys_are_derived_as_documented() {
    use sha2::{Digest, Sha256};
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let alice = Caller::new("shop", "alice");
    let served = idem
        .call(&CHECKOUT, Some(&alice), &json!({ "cart": unique("cart") }), || async {
            let operation = current_operation().expect("inside the handler");
            let forwarded = forwarded_child_key("charge").map(|value| value.to_str().unwrap().to_owned());
            Ok::<_, Failed>((
                operation.idempotency_key(),
                operation.child("charge"),
                operation.child("charge"),
                operation.child("customer"),
                operation.child(""),
                forwarded,
            ))
        })
        .await
        .unwrap();
    let (parent, charge, again, customer, empty, forwarded) = served.value;
    let mut hasher = Sha256::new();
    hasher.update(b"idem/v2/child\0");
    hasher.update(parent.as_bytes());
    hasher.update(6u64.to_be_bytes());
    hasher.update(b"charge");
    let expected: String = hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(charge, expected);
    assert_eq!(charge, again, "deterministic");
    assert_eq!(charge.len(), 64);
    assert!(charge != customer && charge != parent && empty != parent && empty != charge);
    assert_eq!(forwarded, Some(format!("\"{charge}\"")));
    assert!(forwarded_child_key("charge").is_none(), "none outside an operation");

    // Outside an operation, a request naming a child passes the layer without a key.
    #[derive(Clone)]
    struct Echo;
    impl tower_service::Service<axum::http::Request<()>> for Echo {
        type Response = bool;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<bool, Self::Error>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: axum::http::Request<()>) -> Self::Future {
            std::future::ready(Ok(request.headers().contains_key("idempotency-key")))
        }
    }
    let request = axum::http::Request::post("http://processor.internal/charges")
        .extension(Child::new("charge"))
        .body(())
        .unwrap();
    assert!(!ForwardKeyLayer.layer(Echo).call(request).await.unwrap());
}

/// One run that sends one key twice to one origin is logged (WARN, naming the origin and the
/// key); children with two labels, one key to two origins, and one request per run are not.
#[tokio::test]
async fn one_key_twice_to_one_origin_is_logged() {
    const WARNING: &str = "one operation sent one Idempotency-Key twice to one origin";
    let log = idem_tests::CapturedLog::default();
    let _log = tracing::subscriber::set_default(log.subscriber());
    let (base, _processor) = processor().await;
    let port = base.rsplit(':').next().unwrap().to_owned();
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let client = ForwardKeyLayer.layer(Reqwest(reqwest::Client::new()));
    let alice = Caller::new("shop", "alice");

    // Children with distinct labels, and one child sent to two origins (two host names of one
    // server): no warning.
    let (key, children_logged) = idem
        .call(&CHECKOUT, Some(&alice), &json!({ "cart": unique("cart") }), || {
            let (mut client, base, port, log) = (client.clone(), base.clone(), port.clone(), log.clone());
            async move {
                checkout(client.clone(), base.clone()).await?;
                post_json(&mut client, format!("http://localhost:{port}/charges"), Some("charge"), json!({})).await?;
                Ok::<_, Failed>((current_operation().unwrap().idempotency_key(), log.text().matches(WARNING).count()))
            }
        })
        .await
        .unwrap()
        .value;
    assert_eq!(children_logged, 0, "{}", log.text());

    // The operation's own key twice to one origin (no children named): warned once, with the
    // origin and the key.
    let warned = idem
        .call(&CHECKOUT, Some(&alice), &json!({ "cart": unique("cart") }), || {
            let (mut client, base, log) = (client.clone(), base.clone(), log.clone());
            async move {
                post_json(&mut client, format!("{base}/customers"), None, json!({})).await?;
                let once = log.text().matches(WARNING).count();
                post_json(&mut client, format!("{base}/charges"), None, json!({})).await?;
                Ok::<_, Failed>((once, current_operation().unwrap().idempotency_key()))
            }
        })
        .await
        .unwrap()
        .value;
    let text = log.text();
    assert_eq!(warned.0, 0, "one request is not warned: {text}");
    assert_eq!(text.matches(WARNING).count(), 1, "{text}");
    let line = text.lines().find(|line| line.contains(WARNING)).unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("origin=http://127.0.0.1:{port}")), "{line}");
    assert!(line.contains(&warned.1), "the key: {line}");
    assert!(!line.contains(&key), "the other operation's key: {line}");
}
