//! The HTTP door (issue 29): `IdempotencyLayer` on a real axum server bound to a local port,
//! driven by a real HTTP client (reqwest), on every ledger (memory, SQLite, PostgreSQL,
//! MariaDB). Each rule of the IETF draft is a case below; the service behind the layer counts
//! what it really executed — the far side of the boundary.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::routing::post;
use idem_runtime::http::{IdempotencyLayer, Route};
use idem_runtime::ledger::Token;
use idem_runtime::{Caller, current_operation};
use serde_json::{Value, json};

/// What the service behind the layer really did.
#[derive(Default)]
struct Effects {
    charges: AtomicUsize,
    limited: AtomicUsize,
    failures: AtomicUsize,
    big: AtomicUsize,
}

async fn charge(
    State(effects): State<Arc<Effects>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> impl axum::response::IntoResponse {
    if headers.contains_key("x-slow") {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let n = effects.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let forwarded = current_operation().map(|operation| operation.idempotency_key());
    (
        StatusCode::CREATED,
        [("location", format!("/payments/ch_{n}")), ("x-trace", format!("run-{n}"))],
        Json(json!({ "charge": format!("ch_{n}"), "amount": body["amount"], "forwarded": forwarded })),
    )
}

/// Refuses its first request with 429 before doing anything, then charges.
async fn limited(State(effects): State<Arc<Effects>>) -> (StatusCode, &'static str) {
    if effects.limited.fetch_add(1, Ordering::SeqCst) == 0 {
        (StatusCode::TOO_MANY_REQUESTS, "slow down")
    } else {
        (StatusCode::CREATED, "done")
    }
}

/// A response larger than the layer stores.
async fn big(State(effects): State<Arc<Effects>>) -> (StatusCode, String) {
    effects.big.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "b".repeat(8 * 1024))
}

async fn fails(State(effects): State<Arc<Effects>>) -> (StatusCode, &'static str) {
    effects.failures.fetch_add(1, Ordering::SeqCst);
    (StatusCode::INTERNAL_SERVER_ERROR, "the processor broke after charging")
}

/// An axum server with the layer, on `idem`, at a local port: its base URL and its effects.
async fn serve(idem: idem_runtime::Idem) -> (String, Arc<Effects>) {
    let effects = Arc::new(Effects::default());
    let principal = |parts: &axum::http::request::Parts| {
        let user = parts.headers.get("x-user")?.to_str().ok()?;
        Caller::try_new("shop", user).ok()
    };
    let layer = IdempotencyLayer::new(idem, principal)
        .namespace("http-layer")
        .route(Method::POST, "/payments", Route::new().window(Duration::from_secs(600)))
        .route(Method::POST, "/limited", Route::new().nothing_happened_on(&[StatusCode::TOO_MANY_REQUESTS]))
        .route(Method::POST, "/fails", Route::new())
        .route(Method::POST, "/big", Route::new())
        .max_request_bytes(1024)
        .max_response_bytes(4096);
    let app = axum::Router::new()
        .route("/payments", post(charge).get(|| async { "a list" }))
        .route("/limited", post(limited))
        .route("/fails", post(fails))
        .route("/big", post(big))
        .layer(layer)
        .with_state(Arc::clone(&effects));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), effects)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Token::random().get())
}

/// The problem document of a refusal, checked for its media type and members.
async fn problem(response: reqwest::Response, status: u16, kind: &str) -> Value {
    assert_eq!(response.status().as_u16(), status);
    let media = response.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or_default();
    assert_eq!(media, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:idem:problem:{kind}"), "{body}");
    assert!(body["title"].is_string() && body["detail"].is_string() && body["status"] == status, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drafts_rules_on_every_ledger() {
    for (backend, ledger) in idem_tests::every_ledger("http_layer").await {
        let idem = idem_tests::idem_shared(ledger);
        let (base, effects) = serve(idem.clone()).await;
        let client = reqwest::Client::new();
        let payments = format!("{base}/payments");
        let charge = |key: Option<String>, user: Option<&str>, body: &str| {
            let mut request = client.post(&payments).header("content-type", "application/json").body(body.to_owned());
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            if let Some(user) = user {
                request = request.header("x-user", user);
            }
            request.send()
        };
        let quoted = |key: &str| Some(format!("\"{key}\""));

        // Refused before anything is claimed: a missing, malformed (spaces unquoted, a quote
        // left open), empty or too long key; no principal; a body over the limit.
        problem(charge(None, Some("alice"), r#"{"amount":100}"#).await.unwrap(), 400, "missing-idempotency-key").await;
        for bad in ["k unquoted".to_owned(), "\"\"".to_owned(), format!("\"{}\"", "k".repeat(256)), "\"42".to_owned()] {
            let response = charge(Some(bad), Some("alice"), r#"{"amount":100}"#).await.unwrap();
            problem(response, 400, "invalid-idempotency-key").await;
        }
        problem(charge(quoted(&unique("k")), None, r#"{"amount":100}"#).await.unwrap(), 401, "unauthenticated").await;
        let big = format!(r#"{{"amount":100,"memo":"{}"}}"#, "x".repeat(2048));
        problem(charge(quoted(&unique("k")), Some("alice"), &big).await.unwrap(), 413, "too-large").await;
        assert_eq!(effects.charges.load(Ordering::SeqCst), 0, "{backend}: nothing ran for a refused request");

        // The first request runs and is answered with everything the service said.
        let key = unique("k");
        let first = charge(quoted(&key), Some("alice"), r#"{"amount":100}"#).await.unwrap();
        assert_eq!(first.status(), 201, "{backend}");
        assert!(first.headers().get("idempotent-replayed").is_none());
        assert_eq!(first.headers()["x-trace"], "run-1");
        let first_body: Value = first.json().await.unwrap();
        assert!(first_body["forwarded"].as_str().is_some_and(|key| key.len() == 64), "{first_body}");

        // A repeat — the same JSON, spelled differently — gets the stored response, marked, with
        // the allow-listed headers only.
        let repeat = charge(quoted(&key), Some("alice"), r#"{ "amount" : 100 }"#).await.unwrap();
        assert_eq!(repeat.status(), 201, "{backend}");
        assert_eq!(repeat.headers()["idempotent-replayed"], "true");
        assert_eq!(repeat.headers()["location"], "/payments/ch_1");
        assert_eq!(repeat.headers()["content-type"], "application/json");
        assert!(repeat.headers().get("x-trace").is_none(), "not an allow-listed header");
        assert_eq!(repeat.json::<Value>().await.unwrap(), first_body);
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1, "{backend}: a repeat ran nothing");

        // The same key with another payload: 422, nothing run.
        let other = charge(quoted(&key), Some("alice"), r#"{"amount":200}"#).await.unwrap();
        problem(other, 422, "key-reused").await;
        // Another principal's identical request is its own operation.
        let bob = charge(quoted(&key), Some("bob"), r#"{"amount":100}"#).await.unwrap();
        assert_eq!(bob.status(), 201);
        assert!(bob.headers().get("idempotent-replayed").is_none());
        assert_eq!(effects.charges.load(Ordering::SeqCst), 2, "{backend}: bob's request ran once");

        // A storm of 100 identical requests: one execution; the others are told 409 (in
        // progress, with Retry-After) or, once it completed, get the replay.
        let storm = unique("storm");
        let requests = (0..100).map(|_| {
            client
                .post(&payments)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("\"{storm}\""))
                .header("x-user", "alice")
                .header("x-slow", "1")
                .body(r#"{"amount":7}"#)
                .send()
        });
        let answers = futures_join_all(requests).await;
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for answer in answers {
            let answer = answer.unwrap();
            if answer.status() == 409 {
                // The holder's remaining lease (issue 42, item 6), whole seconds, at least one.
                let seconds: u64 = answer.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                assert!(
                    (1..=idem_runtime::settings::DEFAULT_LEASE.as_secs()).contains(&seconds),
                    "{backend}: {seconds}"
                );
            }
            *statuses.entry(answer.status().as_u16()).or_default() += 1;
        }
        assert_eq!(
            effects.charges.load(Ordering::SeqCst),
            3,
            "{backend}: 100 identical requests, one run: {statuses:?}"
        );
        assert!(statuses.keys().all(|status| [201, 409].contains(status)), "{statuses:?}");

        // A 5xx after which the effect may have happened is stored and replayed, never re-run.
        let failing = |key: String| {
            client.post(format!("{base}/fails")).header("idempotency-key", key).header("x-user", "alice").send()
        };
        let key = format!("\"{}\"", unique("f"));
        assert_eq!(failing(key.clone()).await.unwrap().status(), 500);
        let replayed = failing(key).await.unwrap();
        assert_eq!(
            (replayed.status().as_u16(), &replayed.headers()["idempotent-replayed"]),
            (500, &"true".parse().unwrap())
        );
        assert_eq!(effects.failures.load(Ordering::SeqCst), 1, "{backend}: a stored 500 is not re-run");

        // A status the route declares "nothing happened" reaches the client, and the retry runs.
        let limited = |key: String| {
            client.post(format!("{base}/limited")).header("idempotency-key", key).header("x-user", "alice").send()
        };
        let key = format!("\"{}\"", unique("l"));
        assert_eq!(limited(key.clone()).await.unwrap().status(), 429);
        assert_eq!(limited(key.clone()).await.unwrap().status(), 201);
        assert_eq!(limited(key).await.unwrap().headers()["idempotent-replayed"], "true");
        assert_eq!(effects.limited.load(Ordering::SeqCst), 2, "{backend}: the 429 was not stored");

        // A response too large to store reaches its client whole; the operation is recorded
        // "outcome unknown", and the retry is told so rather than run again.
        let large = |key: String| {
            client.post(format!("{base}/big")).header("idempotency-key", key).header("x-user", "alice").send()
        };
        let key = format!("\"{}\"", unique("b"));
        let first = large(key.clone()).await.unwrap();
        assert_eq!((first.status().as_u16(), first.text().await.unwrap().len()), (201, 8 * 1024));
        problem(large(key).await.unwrap(), 409, "outcome-unknown").await;
        assert_eq!(effects.big.load(Ordering::SeqCst), 1, "{backend}: an unstored response is not re-run");

        // A method the layer does not protect passes through, key or not.
        let list = client.get(&payments).send().await.unwrap();
        assert_eq!((list.status().as_u16(), list.text().await.unwrap()), (200, "a list".to_owned()));

        // A draining server refuses new requests with 503 and Retry-After: nothing ran.
        idem.drain(Duration::from_secs(1)).await;
        let refused = charge(quoted(&unique("d")), Some("alice"), r#"{"amount":1}"#).await.unwrap();
        assert_eq!(refused.headers()["retry-after"], "1");
        problem(refused, 503, "unavailable").await;
        assert_eq!(effects.charges.load(Ordering::SeqCst), 3, "{backend}: nothing ran while draining");
    }
}

/// Every future, run concurrently.
async fn futures_join_all<F: std::future::Future + Send + 'static>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    outputs
}

/// A reqwest client as a tower service, under `ForwardKeyLayer`.
type ForwardingClient = idem_runtime::http::ForwardKey<Reqwest>;

/// A tower client service over reqwest: what `ForwardKeyLayer` wraps in these tests (and in
/// `child_keys`).
#[derive(Clone)]
pub(crate) struct Reqwest(pub(crate) reqwest::Client);

impl tower_service::Service<axum::http::Request<String>> for Reqwest {
    type Response = reqwest::Response;
    type Error = reqwest::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<reqwest::Response, reqwest::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<String>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.execute(reqwest::Request::try_from(request)?).await })
    }
}

/// Issue 29, item 3: a handler's outbound request carries its operation's key with no code of
/// its own (`ForwardKeyLayer`), so when a dead holder's operation is taken over and runs again,
/// the downstream — behind an `IdempotencyLayer` — replays its first response instead of charging
/// twice. The downstream counts its charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_forwards_the_same_key_and_the_downstream_replays() {
    use idem_runtime::http::ForwardKeyLayer;
    use idem_runtime::{Recipe, StalePolicy};
    use tower_layer::Layer;
    use tower_service::Service;

    static BOOK: Recipe = Recipe::new("book_trip", &["trip"]).stale(StalePolicy::Takeover);
    let (base, effects) = serve(idem_tests::idem(idem_runtime::MemoryLedger::new())).await;
    let upstream =
        idem_tests::builder(idem_runtime::MemoryLedger::new()).lease(Duration::from_millis(100)).build().unwrap();
    let client = ForwardKeyLayer.layer(Reqwest(reqwest::Client::new()));
    let alice = Caller::new("travel", "alice");
    let trip = json!({ "trip": unique("trip") });
    let book = |client: ForwardingClient, linger: bool| {
        let base = base.clone();
        async move {
            let mut client = client;
            let request = axum::http::Request::post(format!("{base}/payments"))
                .header("content-type", "application/json")
                .header("x-user", "travel-agent")
                .body(r#"{"amount":900}"#.to_owned())
                .unwrap();
            let response = client.call(request).await.map_err(|error| Failed(error.to_string()))?;
            let replayed = response.headers().contains_key("idempotent-replayed");
            let body: Value = response.json().await.map_err(|error| Failed(error.to_string()))?;
            if linger {
                // Work after the downstream call, during which this holder dies.
                std::future::pending::<()>().await;
            }
            Ok::<_, Failed>((body, replayed))
        }
    };
    let holder = {
        let (upstream, alice, trip, first) =
            (upstream.clone(), alice.clone(), trip.clone(), book(client.clone(), true));
        tokio::spawn(async move { upstream.call(&BOOK, Some(&alice), &trip, || first).await })
    };
    // The downstream charged once; then the holder dies before recording.
    for _ in 0..100 {
        if effects.charges.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.abort();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The repeat takes the lapsed lease over and runs the handler again, same forwarded key.
    let again = upstream.call(&BOOK, Some(&alice), &trip, || book(client.clone(), false)).await.unwrap();
    let (body, replayed) = again.value;
    assert!(replayed, "the downstream answered the takeover's request from its record: {body}");
    assert_eq!(body["charge"], "ch_1");
    assert_eq!(effects.charges.load(Ordering::SeqCst), 1, "one charge at the downstream");

    // Outside an operation, nothing is added: the downstream refuses the keyless request.
    let mut bare = client;
    let request = axum::http::Request::post(format!("{base}/payments"))
        .header("content-type", "application/json")
        .header("x-user", "travel-agent")
        .body(r#"{"amount":1}"#.to_owned())
        .unwrap();
    assert_eq!(bare.call(request).await.unwrap().status(), 400);
}

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

/// A client that gives up mid-request (a timeout, a dropped connection) does not strand the
/// operation: the layer runs the service to the end and records its response, so the client's
/// retry is answered from the record — not "in progress" until a lease lapses, and not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_gives_up_mid_request_finds_the_response_on_retry() {
    let (base, effects) = serve(idem_tests::idem(idem_runtime::MemoryLedger::new())).await;
    let client = reqwest::Client::new();
    let key = format!("\"{}\"", unique("gave-up"));
    let send = |slow: bool| {
        let mut request = client
            .post(format!("{base}/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", key.clone())
            .header("x-user", "alice")
            .body(r#"{"amount":300}"#);
        if slow {
            request = request.header("x-slow", "1");
        }
        request.send()
    };
    // The service takes 300 ms; the client hangs up after 50.
    assert!(tokio::time::timeout(Duration::from_millis(50), send(true)).await.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = send(false).await.unwrap();
    assert_eq!(retry.status(), 201, "the first request's response, recorded although its client left");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(effects.charges.load(Ordering::SeqCst), 1, "run once");
}

/// From a review of the layer running a request on its connection's task: a handler's panic that
/// a layer outside idem's catches (tower-http's `CatchPanicLayer`) leaves idem's future to be
/// dropped after the unwind, by whoever caught it. The work that panicked must not be spawned
/// and polled again: before the fix it was, and panicked a second time ("`async fn` resumed after
/// panicking") in a task of its own. The operation is recorded as unknown, as for any panic.
#[tokio::test]
async fn a_panic_caught_outside_the_layer_is_not_run_again() {
    static RESUMED: AtomicUsize = AtomicUsize::new(0);
    // Counts the second panic wherever it happens (a spawned task's panic is caught by Tokio,
    // after the hook has seen it), and leaves every panic to the hook before it.
    let previous = Arc::new(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("resumed after panicking") {
            RESUMED.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem, x_user).namespace("http-panic").route(Method::POST, "/boom", Route::new());
    async fn boom() -> StatusCode {
        panic!("the handler panics")
    }
    let app = axum::Router::new()
        .route("/boom", post(boom))
        .layer(layer)
        .layer(tower_http::catch_panic::CatchPanicLayer::new());
    let base = serve_router(app).await;
    let key = format!("\"{}\"", unique("boom"));
    let send = || {
        reqwest::Client::new()
            .post(format!("{base}/boom"))
            .header("content-type", "application/json")
            .header("idempotency-key", key.clone())
            .header("x-user", "alice")
            .body("{}")
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 500, "the panic was caught outside the layer");
    // A spawned rest of the work would run at once on this runtime; give it the time to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(RESUMED.load(Ordering::SeqCst), 0, "the work that panicked was polled again");
    // The panic was recorded as an unknown outcome (the effect may have happened): a retry is
    // told so, and the handler does not run again.
    let retry = send().await.unwrap();
    assert_eq!(retry.status(), 409, "{:?}", retry.headers());
    let body: Value = retry.json().await.unwrap();
    assert!(body["type"].as_str().is_some_and(|kind| kind.ends_with("outcome-unknown")), "{body}");
}

/// An axum router at a local port: its base URL.
pub(crate) async fn serve_router(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// Who makes a request in the tests below (and in `http_door`): the `x-user` header.
pub(crate) fn x_user(parts: &axum::http::request::Parts) -> Option<Caller> {
    let user = parts.headers.get("x-user")?.to_str().ok()?;
    Caller::try_new("shop", user).ok()
}

/// A handler that counts its runs and answers with the count.
fn counting(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move || {
        let runs = Arc::clone(&runs);
        async move { (StatusCode::CREATED, format!("run {}", runs.fetch_add(1, Ordering::SeqCst) + 1)) }
    })
}

/// POSTs `body` to `url` as alice under `key`.
async fn post_keyed(url: &str, key: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-user", "alice")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

/// Issue 42, item 3: `.route(POST, "/")` is the root route, protected with its own settings. The
/// layer protects only the named routes here (`methods(&[])`), so a template that never matches
/// leaves the root unprotected: before the fix, the second request with one key ran the handler
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_route_is_protected_where_the_router_sends_it() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(idem_tests::idem(idem_runtime::MemoryLedger::new()), x_user).methods(&[]).route(
        Method::POST,
        "/",
        Route::new(),
    );
    let base = serve_router(axum::Router::new().route("/", counting(&runs)).layer(layer)).await;
    let key = unique("root");
    let first = post_keyed(&format!("{base}/"), &key, "{}").await;
    assert_eq!(first.status(), 201);
    let again = post_keyed(&format!("{base}/"), &key, "{}").await;
    assert_eq!(again.status(), 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the root route ran once for one key");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), "run 1");
}

/// Issue 42, item 3: `{*rest}` matches one or more remaining segments, as axum's router does:
/// `/files/a/b` is the catch-all route's (before the fix, a catch-all was one segment, so
/// `/files/a/b` ran on every retry), and `/files/` is not (the router sends it nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_all_route_is_protected_on_every_path_it_matches() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(idem_tests::idem(idem_runtime::MemoryLedger::new()), x_user).methods(&[]).route(
        Method::POST,
        "/files/{*rest}",
        Route::new(),
    );
    let base = serve_router(axum::Router::new().route("/files/{*rest}", counting(&runs)).layer(layer)).await;
    for (path, expected_runs) in [("/files/a", 1), ("/files/a/b", 2), ("/files/a/b/", 3), ("/files/a//b", 4)] {
        let key = unique("rest");
        let first = post_keyed(&format!("{base}{path}"), &key, "{}").await;
        assert_eq!(first.status(), 201, "{path}");
        let again = post_keyed(&format!("{base}{path}"), &key, "{}").await;
        assert_eq!(again.status(), 201, "{path}");
        assert_eq!(runs.load(Ordering::SeqCst), expected_runs, "{path}: one run for one key");
        assert_eq!(again.headers().get("idempotent-replayed").map(|value| value.to_str().unwrap()), Some("true"));
    }
    // One key names one operation of the route: the same key at another path is another request.
    let key = unique("rest");
    assert_eq!(post_keyed(&format!("{base}/files/x/1"), &key, "{}").await.status(), 201);
    problem(post_keyed(&format!("{base}/files/x/2"), &key, "{}").await, 422, "key-reused").await;
}

/// Issue 42, item 3: a template the layer cannot match exactly as axum's router does is refused
/// when the layer is built, with words that say what to write (before the fix, each was accepted
/// and then never matched, or matched other paths than the router's).
#[test]
fn a_template_the_layer_cannot_match_is_refused_when_built() {
    let refusal = |template: &'static str| {
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            IdempotencyLayer::new(idem, x_user).route(Method::POST, template, Route::new())
        }));
        let payload = built.expect_err(template);
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_default()
    };
    for (template, advice) in [
        ("payments", "`/payments`"),
        ("", "`/`"),
        ("/payments/:id", "`{id}`"),
        ("/files/*rest", "`{*rest}`"),
        ("/files/{*rest}/meta", "at the end"),
        ("/payments/{id}.json", "`/payments/{id}`"),
        ("/payments/{}", "a name"),
        ("/payments/{id", "`}`"),
    ] {
        let refused = refusal(template);
        assert!(refused.contains(advice), "{template:?}: {refused}");
    }
    // Templates axum accepts are accepted.
    for template in ["/", "/payments/", "/payments/{id}", "/v{version}/pay", "/files/{*rest}", "/{{literal}}"] {
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let _ = IdempotencyLayer::new(idem, x_user).route(Method::POST, template, Route::new());
    }
}

/// Issue 42, item 4: two bodies that differ only in an integer beyond the 64-bit range were one
/// f64 to `serde_json::Value`, so the second was replayed the first's response instead of being
/// refused. The strict parser refuses such an integer (it cannot be kept exactly): 400, nothing
/// claimed, nothing run. Integers past 2^53 inside the 64-bit range keep their digits: 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_differ_past_what_a_double_holds_never_share_a_fingerprint() {
    let (base, effects) = serve(idem_tests::idem(idem_runtime::MemoryLedger::new())).await;
    let payments = format!("{base}/payments");
    let key = unique("account");
    let first = post_keyed(&payments, &key, r#"{"account":100000000000000000001,"amount":1}"#).await;
    let refused = problem(first, 400, "invalid-json").await;
    assert!(refused["detail"].as_str().unwrap().contains("account"), "{refused}");
    let second = post_keyed(&payments, &key, r#"{"account":100000000000000000002,"amount":1}"#).await;
    problem(second, 400, "invalid-json").await;
    assert_eq!(effects.charges.load(Ordering::SeqCst), 0, "nothing ran for a refused body");

    let key = unique("account");
    assert_eq!(post_keyed(&payments, &key, r#"{"account":9007199254740993,"amount":1}"#).await.status(), 201);
    problem(post_keyed(&payments, &key, r#"{"account":9007199254740995,"amount":1}"#).await, 422, "key-reused").await;
    // The same JSON spelled differently is still the same request.
    let again = post_keyed(&payments, &key, r#"{ "amount":1.0, "account":9007199254740993 }"#).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(effects.charges.load(Ordering::SeqCst), 1);
}

/// Issue 42, item 4: a JSON body with a member name twice was accepted (the last one won, while
/// a proxy or a log may have read the first): it is refused with 400, nothing run. A body that is
/// not JSON keeps being fingerprinted by its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_with_a_member_name_twice_is_refused() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(idem_tests::idem(idem_runtime::MemoryLedger::new()), x_user).route(
        Method::POST,
        "/upload",
        Route::new(),
    );
    let base = serve_router(axum::Router::new().route("/upload", counting(&runs)).layer(layer)).await;
    let upload = format!("{base}/upload");
    let refused =
        problem(post_keyed(&upload, &unique("dup"), r#"{"amount":1,"amount":1000}"#).await, 400, "invalid-json").await;
    assert!(refused["detail"].as_str().unwrap().contains("\"amount\""), "{refused}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran for a refused body");

    // Not JSON: its bytes, exactly (no parsing, no refusal).
    let text = |body: &'static str, key: &str| {
        reqwest::Client::new()
            .post(&upload)
            .header("content-type", "text/plain")
            .header("idempotency-key", format!("\"{key}\""))
            .header("x-user", "alice")
            .body(body)
            .send()
    };
    let key = unique("text");
    assert_eq!(text(r#"{"a":1,"a":2}"#, &key).await.unwrap().status(), 201);
    problem(text(r#"{"a":1, "a":2}"#, &key).await.unwrap(), 422, "key-reused").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 42, item 6: what an HTTP client is told is what an HTTP client can do. It has no status
/// tool and no "key arguments": it retries with the same key, uses a new key for a new request,
/// and quotes the operation's reference (a problem-details member) to the operator.
fn answered_in_http_words(problem: &Value) -> &str {
    let detail = problem["detail"].as_str().unwrap();
    for mcp in ["idem_status", "key argument", "tool"] {
        assert!(!detail.contains(mcp), "MCP words ({mcp}) in an HTTP answer: {problem}");
    }
    let reference = problem["reference"].as_str().unwrap_or_else(|| panic!("no `reference` member: {problem}"));
    assert!(!reference.is_empty() && detail.contains(reference), "{problem}");
    detail
}

/// Who makes a request in the item 6 tests: the `x-user` header.
fn item6_user(parts: &axum::http::request::Parts) -> Option<Caller> {
    Caller::try_new("shop", parts.headers.get("x-user")?.to_str().ok()?).ok()
}

/// POSTs `body` to `url` as alice under `key`.
async fn item6_post(url: &str, key: &str, body: &str) -> reqwest::Response {
    let client = reqwest::Client::new().post(url).header("content-type", "application/json");
    let request = client.header("idempotency-key", format!("\"{key}\"")).header("x-user", "alice");
    request.body(body.to_owned()).send().await.unwrap()
}

/// Issue 42, item 6: a retry while the first request runs is told, in `Retry-After` and in words,
/// when a retry can succeed — the holder's remaining lease (20 s here), not one second — and to
/// send it with the same key. Before the fix: `Retry-After: 1` and "call `idem_status`".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_it_runs_is_told_when_to_retry_in_http_words() {
    let lease = Duration::from_secs(20);
    let idem = idem_tests::builder(idem_runtime::MemoryLedger::new()).lease(lease).build().unwrap();
    let (entered, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let handler = {
        let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
        post(move || {
            let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
            async move {
                entered.notify_one();
                release.notified().await;
                (StatusCode::CREATED, "charged")
            }
        })
    };
    let layer = IdempotencyLayer::new(idem, item6_user).route(Method::POST, "/charge", Route::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let charge = format!("http://{}/charge", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/charge", handler).layer(layer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let key = unique("running");
    let first = tokio::spawn({
        let (charge, key) = (charge.clone(), key.clone());
        async move { item6_post(&charge, &key, r#"{"amount":5}"#).await.status() }
    });
    tokio::time::timeout(Duration::from_secs(10), entered.notified()).await.expect("the first request runs");
    let retry = item6_post(&charge, &key, r#"{"amount":5}"#).await;
    let retry_after = retry.headers().get("retry-after").map(|value| value.to_str().unwrap().to_owned());
    let body = problem(retry, 409, "in-progress").await;
    let seconds: u64 = retry_after.as_deref().unwrap_or_default().parse().unwrap_or(0);
    assert!((10..=lease.as_secs()).contains(&seconds), "Retry-After {retry_after:?}: the lease has ~20 s left");
    let detail = answered_in_http_words(&body).to_lowercase();
    assert!(detail.contains(&format!("retry after {seconds} seconds")), "{body}");
    assert!(detail.contains("same idempotency-key"), "{body}");
    release.notify_one();
    assert_eq!(first.await.unwrap(), 201);
    let replay = item6_post(&charge, &key, r#"{"amount":5}"#).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

/// Issue 42, item 6: the same key with another body is told to use a new key for a new request.
/// Before the fix: "change a key argument if this is a new operation", and no reference member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_is_told_to_use_a_new_key_in_http_words() {
    let (base, effects) = serve(idem_tests::idem(idem_runtime::MemoryLedger::new())).await;
    let payments = format!("{base}/payments");
    let key = unique("reused");
    assert_eq!(item6_post(&payments, &key, r#"{"amount":1}"#).await.status(), 201);
    let body = problem(item6_post(&payments, &key, r#"{"amount":2}"#).await, 422, "key-reused").await;
    let detail = answered_in_http_words(&body).to_lowercase();
    assert!(detail.contains("new idempotency-key for a new request"), "{body}");
    assert_eq!(effects.charges.load(Ordering::SeqCst), 1);
}

/// A seal that opens only what it sealed: a handle with it cannot read a response stored
/// without it.
struct Item6Seal;

impl idem_runtime::settings::ResultSeal for Item6Seal {
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String> {
        Ok([b"item6:".as_slice(), plain].concat())
    }
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, String> {
        sealed.strip_prefix(b"item6:").map(<[u8]>::to_vec).ok_or_else(|| "not sealed by this seal".to_owned())
    }
}

/// Issue 42, item 6: a stored response this server cannot read is a 500 that says nothing ran
/// again, not to retry, and which reference the operator corrects. Before the fix: "call
/// `idem_status`", and no reference member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_stored_response_is_told_in_http_words() {
    let ledger: Arc<dyn idem_runtime::ledger::Ledger> = Arc::new(idem_runtime::MemoryLedger::new());
    let key = unique("unreadable");
    let (stored, _) = serve(idem_tests::idem_shared(Arc::clone(&ledger))).await;
    assert_eq!(item6_post(&format!("{stored}/payments"), &key, r#"{"amount":3}"#).await.status(), 201);
    let sealed = idem_tests::builder(ledger).result_seal(Item6Seal).build().unwrap();
    let (base, effects) = serve(sealed).await;
    let response = item6_post(&format!("{base}/payments"), &key, r#"{"amount":3}"#).await;
    assert!(response.headers().get("retry-after").is_none());
    let body = problem(response, 500, "unreadable_result").await;
    let detail = answered_in_http_words(&body).to_lowercase();
    assert!(detail.contains("do not retry"), "{body}");
    assert_eq!(effects.charges.load(Ordering::SeqCst), 0, "nothing ran again");
}
