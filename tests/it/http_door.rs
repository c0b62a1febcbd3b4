//! The HTTP door's defaults and where it is built (issue 42, items 1, 2 and 7): two services on
//! one ledger, two layers on one handle, keys as clients send them, what is stored, what is
//! protected, what a replay carries, and the key a handler reads. Real axum servers on local
//! ports, a real client; each handler counts what it really did.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::http::{Method, StatusCode};
use axum::routing::post;
use idem_runtime::http::{IdempotencyKey, IdempotencyLayer, Route};
use idem_runtime::ledger::Token;
use serde_json::Value;

use crate::http_layer::{serve_router as serve, x_user};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Token::random().get())
}

/// A handler that counts its runs and answers with `name` and the count.
fn counting(name: &'static str, runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move || {
        let runs = Arc::clone(&runs);
        async move { (StatusCode::CREATED, format!("{name} run {}", runs.fetch_add(1, Ordering::SeqCst) + 1)) }
    })
}

/// POSTs `body` as alice with the `Idempotency-Key` header's value `key` exactly as given.
async fn post_raw(url: &str, key: Option<&str>, body: &str) -> reqwest::Response {
    let mut request =
        reqwest::Client::new().post(url).header("content-type", "application/json").header("x-user", "alice");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(body.to_owned()).send().await.unwrap()
}

fn replayed(response: &reqwest::Response) -> bool {
    response.headers().get("idempotent-replayed").is_some_and(|value| value == "true")
}

/// What building `app` panicked with, if it did.
fn panic_of(build: impl FnOnce()) -> Option<String> {
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).err()?;
    Some(
        panicked
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panicked.downcast_ref::<&str>().map(|text| (*text).to_owned()))
            .unwrap_or_default(),
    )
}

/// Item 1: an orders service and a refunds service on one database — two handles, the same
/// route, principal and key. Before the fix both were keyed in namespace `default` as `POST
/// /payments`: the refunds service never ran and answered the orders service's response, marked
/// replayed. Now a layer on a shared ledger without a namespace is refused when built, and with
/// one each service runs its own request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_on_one_ledger_never_share_an_operation() {
    for (backend, ledger) in idem_tests::every_ledger("http_door_two_services").await {
        if backend == "memory" {
            continue;
        }
        let refused = panic_of(|| {
            let idem = idem_tests::idem_shared(Arc::clone(&ledger));
            let layer = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/payments", Route::new());
            let _app: axum::Router = axum::Router::new().route("/payments", post(|| async { "paid" })).layer(layer);
        });
        let refused = refused.unwrap_or_else(|| panic!("{backend}: a layer without a namespace was built"));
        assert!(refused.contains(".namespace(\"orders\")") && refused.contains("share"), "{backend}: {refused}");

        let (orders_runs, refunds_runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut bases = Vec::new();
        for (service, runs) in [("orders", &orders_runs), ("refunds", &refunds_runs)] {
            let idem = idem_tests::idem_shared(Arc::clone(&ledger));
            let layer =
                IdempotencyLayer::new(idem, x_user).namespace(service).route(Method::POST, "/payments", Route::new());
            bases.push(serve(axum::Router::new().route("/payments", counting(service, runs)).layer(layer)).await);
        }
        let key = format!("\"{}\"", unique("k"));
        for base in &bases {
            let first = post_raw(&format!("{base}/payments"), Some(&key), "{}").await;
            assert_eq!(first.status(), 201, "{backend}");
            assert!(!replayed(&first), "{backend}: {base} answered another service's response");
            let again = post_raw(&format!("{base}/payments"), Some(&key), "{}").await;
            assert!(replayed(&again), "{backend}: a repeat to the same service is replayed");
        }
        let runs = (orders_runs.load(Ordering::SeqCst), refunds_runs.load(Ordering::SeqCst));
        assert_eq!(runs, (1, 1), "{backend}: each service ran its own request once");
    }
}

/// Item 2: a `/v1` and a `/v2` router, each with its own layer protecting `/payments`, on one
/// handle. Before the fix every v2 payment got 500 `duplicate_tool` with advice for MCP tools;
/// now the clash is refused when the app is built, in words that apply to routes, and with a
/// namespace each the v2 payment runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_on_one_handle_protecting_one_route_are_refused_when_built() {
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let refused = panic_of(|| {
        let v1 = IdempotencyLayer::new(idem.clone(), x_user).route(Method::POST, "/payments", Route::new());
        let v2 = IdempotencyLayer::new(idem.clone(), x_user).route(Method::POST, "/payments", Route::new());
        let _app: axum::Router = axum::Router::new()
            .nest("/v1", axum::Router::new().route("/payments", post(|| async { "v1" })).layer(v1))
            .nest("/v2", axum::Router::new().route("/payments", post(|| async { "v2" })).layer(v2));
    });
    let refused = refused.expect("two layers protecting one route on one handle were built");
    assert!(refused.contains("two IdempotencyLayers") && refused.contains(".namespace("), "{refused}");
    assert!(!refused.contains("#[idempotent") && !refused.contains("idem tools forget"), "{refused}");

    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let (v1_runs, v2_runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let v1 = IdempotencyLayer::new(idem.clone(), x_user).namespace("payments-v1").route(
        Method::POST,
        "/payments",
        Route::new(),
    );
    let v2 =
        IdempotencyLayer::new(idem, x_user).namespace("payments-v2").route(Method::POST, "/payments", Route::new());
    let base = serve(
        axum::Router::new()
            .nest("/v1", axum::Router::new().route("/payments", counting("v1", &v1_runs)).layer(v1))
            .nest("/v2", axum::Router::new().route("/payments", counting("v2", &v2_runs)).layer(v2)),
    )
    .await;
    let key = format!("\"{}\"", unique("k"));
    for version in ["v1", "v2"] {
        let first = post_raw(&format!("{base}/{version}/payments"), Some(&key), "{}").await;
        assert_eq!(first.status(), 201, "{version}: {}", first.text().await.unwrap());
        assert!(replayed(&post_raw(&format!("{base}/{version}/payments"), Some(&key), "{}").await), "{version}");
    }
    assert_eq!((v1_runs.load(Ordering::SeqCst), v2_runs.load(Ordering::SeqCst)), (1, 1));
}

/// Item 7, keys: a Stripe-style client sends a bare token. Before the fix it was refused 400
/// ("must be a quoted string"); now it is accepted and is the same key as its quoted form. A
/// layer built `strict_keys` still takes the draft's quoted String only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_token_key_is_the_same_key_as_its_quoted_form() {
    let runs = Arc::new(AtomicUsize::new(0));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem.clone(), x_user).route(Method::POST, "/charges", Route::new());
    let strict = IdempotencyLayer::new(idem, x_user).namespace("strict").strict_keys().route(
        Method::POST,
        "/strict",
        Route::new(),
    );
    let base = serve(
        axum::Router::new()
            .route("/charges", counting("charge", &runs))
            .layer(layer)
            .merge(axum::Router::new().route("/strict", counting("strict", &runs)).layer(strict)),
    )
    .await;
    let token = unique("4f1c");
    let bare = post_raw(&format!("{base}/charges"), Some(&token), "{}").await;
    assert_eq!(bare.status(), 201, "{}", bare.text().await.unwrap());
    let quoted = post_raw(&format!("{base}/charges"), Some(&format!("\"{token}\"")), "{}").await;
    assert!(replayed(&quoted), "the quoted form is the same key");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let refused = post_raw(&format!("{base}/strict"), Some(&token), "{}").await;
    assert_eq!(refused.status(), 400);
    let problem: Value = refused.json().await.unwrap();
    assert!(problem["detail"].as_str().unwrap().contains("quoted string only"), "{problem}");
    assert_eq!(post_raw(&format!("{base}/strict"), Some(&format!("\"{token}\"")), "{}").await.status(), 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the refused bare key ran nothing");
}

#[derive(serde::Deserialize)]
struct Charge {
    amount: u64,
}

/// Item 7, what is stored: axum's own refusals — 400 (a path parameter that does not parse), 415
/// (no JSON content type), 422 (a body of the wrong shape) — happen before the handler acts. Before the fix they were
/// stored: the corrected body under the same key was answered 422 "key reused". Now they reach
/// the client unstored, and the corrected request runs; a route may still store every status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_framework_refuses_is_not_stored_and_its_correction_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        post(move |Json(charge): Json<Charge>| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, format!("charged {}", charge.amount))
            }
        })
    };
    let for_order = {
        let runs = Arc::clone(&runs);
        post(move |axum::extract::Path(order): axum::extract::Path<u64>| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, format!("charged order {order}"))
            }
        })
    };
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem, x_user)
        .route(Method::POST, "/charges", Route::new())
        .route(Method::POST, "/orders/{id}/charge", Route::new())
        .route(Method::POST, "/kept", Route::new().nothing_happened_on(&[]));
    let base = serve(
        axum::Router::new()
            .route("/charges", handler.clone())
            .route("/orders/{id}/charge", for_order)
            .route("/kept", handler)
            .layer(layer),
    )
    .await;
    let (charges, order) = (format!("{base}/charges"), format!("{base}/orders/7/charge"));
    for (status, url, content_type, body, corrected_url, answer) in [
        (400, format!("{base}/orders/seven/charge"), "application/json", "{}", &order, "charged order 7"),
        (415, charges.clone(), "text/plain", r#"{"amount":5}"#, &charges, "charged 5"),
        (422, charges.clone(), "application/json", r#"{"amount":"five"}"#, &charges, "charged 5"),
    ] {
        let key = format!("\"{}\"", unique("k"));
        let refused = reqwest::Client::new()
            .post(&url)
            .header("content-type", content_type)
            .header("x-user", "alice")
            .header("idempotency-key", &key)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), status, "{url} {body}");
        let body = if corrected_url == &order { "{}" } else { r#"{"amount":5}"# };
        let corrected = post_raw(corrected_url, Some(&key), body).await;
        assert_eq!(corrected.status(), 201, "{status}: the corrected request under the same key runs");
        assert_eq!(corrected.text().await.unwrap(), answer);
        assert!(replayed(&post_raw(corrected_url, Some(&key), body).await), "then it is kept");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // A route that stores every status keeps the 422: the correction is another request.
    let key = unique("k");
    assert_eq!(post_raw(&format!("{base}/kept"), Some(&key), r#"{"amount":"five"}"#).await.status(), 422);
    let corrected = post_raw(&format!("{base}/kept"), Some(&key), r#"{"amount":5}"#).await;
    assert_eq!(corrected.status(), 422, "the same key with another body");
    let problem: Value = corrected.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:key-reused");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// Item 7, what is protected: only what was declared. Before the fix the layer protected every
/// POST and PATCH: an MCP endpoint merged under it answered "400 missing key" to its own POSTs,
/// a POST to a path no route matches got "400 missing key" instead of the router's 404, and a
/// keyed GET could be declared and replayed "paid" after a refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_was_declared_is_protected() {
    let (mcp, payments) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem.clone(), x_user).route(Method::POST, "/payments", Route::new());
    let base = serve(
        axum::Router::new()
            .route("/payments", counting("payment", &payments))
            .merge(axum::Router::new().route("/mcp", counting("mcp", &mcp)))
            .layer(layer),
    )
    .await;
    let unkeyed = post_raw(&format!("{base}/mcp"), None, "{}").await;
    assert_eq!(unkeyed.status(), 201, "an undeclared route passes through: {}", unkeyed.text().await.unwrap());
    assert_eq!(post_raw(&format!("{base}/nowhere"), None, "{}").await.status(), 404);
    assert_eq!(post_raw(&format!("{base}/nowhere"), Some("k"), "{}").await.status(), 404);
    assert_eq!(post_raw(&format!("{base}/payments"), None, "{}").await.status(), 400, "a declared route needs a key");
    assert_eq!((mcp.load(Ordering::SeqCst), payments.load(Ordering::SeqCst)), (1, 0));

    // Every route's POSTs, when asked for: a path no route matches still gets the router's 404,
    // and a method the route lacks its 405, stored nowhere.
    let all =
        IdempotencyLayer::new(idem_tests::idem(idem_runtime::MemoryLedger::new()), x_user).methods(&[Method::POST]);
    let base = serve(
        axum::Router::new()
            .route("/payments", counting("payment", &payments))
            .route("/report", axum::routing::get(|| async { "report" }))
            .layer(all),
    )
    .await;
    assert_eq!(post_raw(&format!("{base}/payments"), None, "{}").await.status(), 400);
    assert_eq!(post_raw(&format!("{base}/nowhere"), None, "{}").await.status(), 404);
    let key = unique("k");
    assert_eq!(post_raw(&format!("{base}/report"), Some(&key), "{}").await.status(), 405);
    assert_eq!(post_raw(&format!("{base}/report"), Some(&key), "{}").await.status(), 405);

    // A safe method, or nothing at all, is refused when the layer is built.
    for (what, build) in [
        (
            "GET",
            Box::new(|| drop(IdempotencyLayer::new(idem.clone(), x_user).route(Method::GET, "/orders", Route::new())))
                as Box<dyn FnOnce()>,
        ),
        ("HEAD", Box::new(|| drop(IdempotencyLayer::new(idem.clone(), x_user).methods(&[Method::POST, Method::HEAD])))),
        (
            "nothing",
            Box::new(|| {
                let _app: axum::Router = axum::Router::new()
                    .route("/payments", post(|| async { "paid" }))
                    .layer(IdempotencyLayer::new(idem.clone(), x_user));
            }),
        ),
    ] {
        let refused = panic_of(build).unwrap_or_else(|| panic!("{what}: built"));
        let words = if what == "nothing" { "protects nothing" } else { "safe method" };
        assert!(refused.contains(words), "{what}: {refused}");
    }
}

/// Item 7, replays: a compression layer inside the idempotency layer encodes the response. Before
/// the fix the gzip bytes were stored without `content-encoding`, and the retry got gzip labelled
/// `application/json`. Now the representation headers are stored with the body, and the replay is
/// byte for byte what the client got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_compression_is_what_the_client_got() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        post(move || {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Json(serde_json::json!({ "receipt": "r".repeat(4096) }))
            }
        })
    };
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/charges", Route::new());
    let app = axum::Router::new()
        .route("/charges", handler)
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(layer);
    let base = serve(app).await;
    let send = |key: String| {
        reqwest::Client::new()
            .post(format!("{base}/charges"))
            .header("accept-encoding", "gzip")
            .header("x-user", "alice")
            .header("idempotency-key", key)
            .send()
    };
    let key = unique("k");
    let first = send(key.clone()).await.unwrap();
    let retry = send(key).await.unwrap();
    assert!(replayed(&retry));
    for name in ["content-type", "content-encoding"] {
        assert_eq!(first.headers().get(name), retry.headers().get(name), "{name}");
    }
    assert_eq!(retry.headers()["content-encoding"], "gzip");
    assert_eq!(first.bytes().await.unwrap(), retry.bytes().await.unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Item 7, the key a handler reads: decoded, from one accessor. Before, the handler read the
/// header and trimmed the quotes by hand, keeping the escapes (`ord\"er`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_reads_the_clients_key_decoded() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        post(move |IdempotencyKey(key): IdempotencyKey| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(key);
                StatusCode::CREATED
            }
        })
    };
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/charges", Route::new());
    let base = serve(axum::Router::new().route("/charges", handler).layer(layer)).await;
    let quoted = format!("\"ord\\\"er {}\"", unique("k"));
    let bare = unique("ord_er");
    assert_eq!(post_raw(&format!("{base}/charges"), Some(&quoted), "{}").await.status(), 201);
    assert_eq!(post_raw(&format!("{base}/charges"), Some(&bare), "{}").await.status(), 201);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].starts_with("ord\"er ") && !seen[0].contains('\\'), "{seen:?}");
    assert_eq!(seen[1], bare);
}

/// Issue 43, item 5: a layer is a value — a clone configured further is a layer of its own, and
/// the one it was cloned from is unchanged. Before, configuring a clone panicked ("configured
/// before it is cloned").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_configured_after_a_clone_is_a_layer_of_its_own() {
    let runs = Arc::new(AtomicUsize::new(0));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let payments = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/payments", Route::new());
    let with_refunds = payments.clone().route(Method::POST, "/refunds", Route::new());
    assert!(format!("{payments:?}").contains("POST /payments") && !format!("{payments:?}").contains("/refunds"));
    assert!(format!("{with_refunds:?}").contains("POST /refunds"), "{with_refunds:?}");
    let base = serve(
        axum::Router::new()
            .route("/payments", counting("payment", &runs))
            .route("/refunds", counting("refund", &runs))
            .layer(with_refunds),
    )
    .await;
    let key = unique("k");
    for path in ["payments", "refunds"] {
        assert_eq!(post_raw(&format!("{base}/{path}"), Some(&key), "{}").await.status(), 201, "{path}");
        assert!(replayed(&post_raw(&format!("{base}/{path}"), Some(&key), "{}").await), "{path} is protected");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// One `/v1` and one `/v2` router made by one function, on one handle.
fn versioned_api(idem: &idem_runtime::Idem, name: &'static str, runs: &Arc<AtomicUsize>) -> axum::Router {
    let layer = IdempotencyLayer::new(idem.clone(), x_user).route(Method::POST, "/payments", Route::new());
    axum::Router::new().route("/payments", counting(name, runs)).layer(layer)
}

/// From the review of items 1 and 2: layers told apart only by where their routes were written
/// let two layers built by one function (`/v1` and `/v2` from one `api()`), a clone configured
/// further, or two `.methods(..)` layers share operations — v2 was answered "v1 run 1",
/// replayed. Now every layer is itself: a second one alive at once on one route is refused.
#[test]
fn two_layers_from_one_function_a_clone_or_two_methods_layers_are_refused_when_built() {
    let runs = Arc::new(AtomicUsize::new(0));
    let from_one_function = panic_of(|| {
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let _app: axum::Router = axum::Router::new()
            .nest("/v1", versioned_api(&idem, "v1", &runs))
            .nest("/v2", versioned_api(&idem, "v2", &runs));
    });
    let a_clone = panic_of(|| {
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let v1 = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/payments", Route::new());
        let v2 = v1.clone().max_response_bytes(4096);
        let _app: axum::Router = axum::Router::new()
            .nest("/v1", axum::Router::new().route("/payments", counting("v1", &runs)).layer(v1))
            .nest("/v2", axum::Router::new().route("/payments", counting("v2", &runs)).layer(v2));
    });
    let two_methods_layers = panic_of(|| {
        let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
        let public = IdempotencyLayer::new(idem.clone(), x_user).methods(&[Method::POST]);
        let admin = IdempotencyLayer::new(idem, x_user).methods(&[Method::POST]);
        let _app: axum::Router = axum::Router::new()
            .nest("/public", axum::Router::new().route("/items", counting("public", &runs)).layer(public))
            .nest("/admin", axum::Router::new().route("/items", counting("admin", &runs)).layer(admin));
    });
    for (what, refused) in [("one function", from_one_function), ("a clone", a_clone), ("methods", two_methods_layers)]
    {
        let refused = refused.unwrap_or_else(|| panic!("{what}: two layers on one route were built"));
        assert!(refused.contains("two IdempotencyLayers") && refused.contains(".namespace("), "{what}: {refused}");
    }
    // One layer applied to two routers (clones of it) is one layer: built, and one operation.
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let one = IdempotencyLayer::new(idem, x_user).route(Method::POST, "/payments", Route::new());
    let _app: axum::Router = axum::Router::new()
        .merge(axum::Router::new().route("/payments", counting("a", &runs)).layer(one.clone()))
        .nest("/again", axum::Router::new().route("/payments", counting("b", &runs)).layer(one));
}

/// From the review of item 3: inside a router, the layer protects the route the router matched.
/// Before, a template written in full inside a nested router (`/v1/payments`) was never matched
/// (it ran twice for one key), and an undeclared sibling (`/payments/export` beside
/// `/payments/{id}`) demanded a key. A non-ASCII `location` was dropped from the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_router_the_layer_protects_the_route_the_router_matched() {
    let (payments, exports, files) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let idem = idem_tests::idem(idem_runtime::MemoryLedger::new());
    let full =
        IdempotencyLayer::new(idem.clone(), x_user).namespace("full").route(Method::POST, "/v1/payments", Route::new());
    let files_runs = Arc::clone(&files);
    let upload = post(move || {
        let files = Arc::clone(&files_runs);
        async move {
            files.fetch_add(1, Ordering::SeqCst);
            let location = axum::http::HeaderValue::from_bytes("/files/café".as_bytes()).unwrap();
            (StatusCode::CREATED, [(axum::http::header::LOCATION, location)], "stored")
        }
    });
    let by_id = IdempotencyLayer::new(idem, x_user)
        .namespace("by-id")
        .route(Method::POST, "/payments/{id}", Route::new())
        .route(Method::POST, "/files", Route::new());
    let base = serve(
        axum::Router::new()
            .nest("/v1", axum::Router::new().route("/payments", counting("payment", &payments)).layer(full))
            .merge(
                axum::Router::new()
                    .route("/payments/{id}", counting("payment", &payments))
                    .route("/payments/export", counting("export", &exports))
                    .route("/files", upload)
                    .layer(by_id),
            ),
    )
    .await;
    let key = unique("k");
    assert_eq!(post_raw(&format!("{base}/v1/payments"), Some(&key), "{}").await.status(), 201);
    assert!(
        replayed(&post_raw(&format!("{base}/v1/payments"), Some(&key), "{}").await),
        "a full template is the route"
    );
    assert_eq!(payments.load(Ordering::SeqCst), 1);

    assert_eq!(post_raw(&format!("{base}/payments/export"), None, "{}").await.status(), 201, "undeclared: through");
    assert_eq!(post_raw(&format!("{base}/payments/7"), None, "{}").await.status(), 400, "declared: needs a key");
    assert_eq!(exports.load(Ordering::SeqCst), 1);

    let first = post_raw(&format!("{base}/files"), Some(&key), "{}").await;
    let retry = post_raw(&format!("{base}/files"), Some(&key), "{}").await;
    assert!(replayed(&retry));
    assert_eq!(first.headers().get("location"), retry.headers().get("location"), "the location, byte for byte");
    assert_eq!(retry.headers()["location"].as_bytes(), "/files/café".as_bytes());
    assert_eq!(files.load(Ordering::SeqCst), 1);
}
