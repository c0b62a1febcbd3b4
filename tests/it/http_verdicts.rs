//! Issue 42, item 5: an operator's verdict on an HTTP operation fits what a retry reads. A
//! route's operations were kept with no result shape, so `resolve --completed` took any JSON:
//! `{"export":"done"}` made every retry a 500 `unreadable_result` for the verdict's retention,
//! and its correction was refused (the operation was completed). Now a route's recipe carries the
//! stored response's shape: a verdict of another shape is refused in words that name it, one
//! that fits is what the retry gets, and a misfit stored before is corrected. Through the
//! operator's verbs (`Idem::admin`, what the `idem` command runs), on every ledger; a real axum
//! server on a local port, a real client, a handler that counts its runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{Method, StatusCode};
use axum::routing::post;
use idem_runtime::admin::Resolution;
use idem_runtime::http::{IdempotencyLayer, Route};
use idem_runtime::ledger::{LedgerError, State, Token};
use idem_runtime::scope::TenantTag;
use idem_runtime::{Caller, Idem, StatusError};
use serde_json::{Value, json};

use crate::ledger_redis::every_ledger_and_redis;

/// The largest response the layer stores here: an export's answer is larger, so its operation is
/// recorded "outcome unknown" — what an operator settles.
const STORED_BYTES: usize = 1024;

/// The tenant of every caller ([`x_user`]).
const TENANT: &str = "shop";

/// Who makes a request: the `x-user` header, in tenant `shop`.
fn x_user(parts: &axum::http::request::Parts) -> Option<Caller> {
    let user = parts.headers.get("x-user")?.to_str().ok()?;
    Caller::try_new(TENANT, user).ok()
}

/// A service that exports on `POST /exports` (an answer too large to store), with the layer, on
/// `idem`, at a local port: its base URL and how many exports it ran.
async fn serve(idem: Idem) -> (String, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let export = post(move || {
        let runs = Arc::clone(&counted);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "x".repeat(8 * STORED_BYTES))
        }
    });
    let layer = IdempotencyLayer::new(idem, x_user)
        .namespace("exports")
        .route(Method::POST, "/exports", Route::new())
        .max_response_bytes(STORED_BYTES);
    let app = axum::Router::new().route("/exports", export).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), runs)
}

/// POSTs an export as alice under `key`.
async fn export(base: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/exports"))
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-user", "alice")
        .send()
        .await
        .unwrap()
}

/// The problem a refused retry is answered with, checked for its status and type.
async fn problem(response: reqwest::Response, status: u16, kind: &str) -> Value {
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:idem:problem:{kind}"), "{body}");
    body
}

/// An export whose outcome is unknown (its answer reached the client, too large to store), as
/// the operator finds it from the reference its retry quotes: its address.
async fn unknown_export(idem: &Idem, base: &str, key: &str, backend: &str) -> String {
    let first = export(base, key).await;
    assert_eq!((first.status().as_u16(), first.text().await.unwrap().len()), (201, 8 * STORED_BYTES), "{backend}");
    let retry = problem(export(base, key).await, 409, "outcome-unknown").await;
    let reference = retry["reference"].as_str().unwrap_or_else(|| panic!("{backend}: no reference: {retry}"));
    let report = idem.admin().inspect(TENANT, reference).await.unwrap().expect("the operator finds it");
    assert_eq!(report.state, State::Unknown, "{backend}");
    report.address().to_string()
}

/// A verdict as `idem resolve --completed JSON` gives it.
fn completed(value: &Value) -> Resolution {
    Resolution::completed(value).unwrap()
}

/// The response an operator found the export gave (in the downstream's own records).
fn found_response() -> Value {
    json!({
        "status": 201,
        "headers": [["content-type", "application/json"], ["location", "/exports/7"]],
        "text": "{\"export\":\"done\"}",
    })
}

/// The retry is answered with `found_response`, marked replayed.
async fn replays_the_found_response(response: reqwest::Response, backend: &str) {
    assert_eq!(response.status().as_u16(), 201, "{backend}");
    let headers = response.headers();
    assert_eq!(headers["idempotent-replayed"], "true", "{backend}");
    assert_eq!(headers["content-type"], "application/json", "{backend}");
    assert_eq!(headers["location"], "/exports/7", "{backend}");
    assert_eq!(response.text().await.unwrap(), r#"{"export":"done"}"#, "{backend}");
}

/// Before the fix the first verdict, `{"export":"done"}`, was stored, and every retry got 500
/// `unreadable_result`. Now it is refused in words that name the stored response's shape, as are
/// a status outside 100–599 and a body that is not base64; nothing is stored, and the verdict
/// of the right shape is what the retry receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_must_fit_the_stored_response_and_the_retry_gets_it() {
    for (backend, ledger) in every_ledger_and_redis("http_verdicts_fit").await {
        let idem = idem_tests::idem_shared(ledger);
        let (base, runs) = serve(idem.clone()).await;
        let key = format!("export-{}", Token::random().get());
        let address = unknown_export(&idem, &base, &key, backend).await;

        let misfit = idem.admin().resolve(TENANT, &address, completed(&json!({"export": "done"}))).await;
        let Err(misfit @ StatusError::Misfit { .. }) = misfit else {
            panic!("{backend}: a verdict of another shape was taken: {misfit:?}")
        };
        let words = misfit.to_string();
        assert!(words.contains("the verdict does not fit POST /exports's result"), "{backend}: {words}");
        assert!(words.contains(r#"lacks the member "status""#), "{backend}: {words}");
        assert!(
            words.contains(
                r#"It expects {"headers": [[string, string]], "status": integer from 100 to 599, "text": string}"#
            ),
            "{backend}: the shape is named: {words}"
        );
        for (verdict, why) in [
            (json!({"status": 700, "headers": [], "text": "done"}), "the result.status is 700 where at most 599"),
            (json!({"status": 201, "headers": [], "base64": "d*ne"}), "the result.base64 is not standard base64"),
            (json!({"status": 201, "headers": [["location"]], "text": ""}), "headers[0] has 1 items"),
        ] {
            let refused = idem.admin().resolve(TENANT, &address, completed(&verdict)).await;
            let Err(refused @ StatusError::Misfit { .. }) = refused else {
                panic!("{backend}: {verdict} was taken: {refused:?}")
            };
            assert!(refused.to_string().contains(why), "{backend}: {refused}");
        }
        // Nothing was stored: the retry is still told the outcome is unknown.
        problem(export(&base, &key).await, 409, "outcome-unknown").await;

        idem.admin().resolve(TENANT, &address, completed(&found_response())).await.unwrap();
        replays_the_found_response(export(&base, &key).await, backend).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the export ran once");
    }
}

/// A misfit stored before verdicts on routes were checked (written here through the ledger, as
/// the old path did) answers every retry 500 `unreadable_result`; before the fix its correction
/// was refused (the operation is completed). Now a verdict that fits replaces it, the retry gets
/// that, and a result a retry could read is never replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_misfit_is_corrected_by_a_verdict_that_fits() {
    for (backend, ledger) in every_ledger_and_redis("http_verdicts_correct").await {
        let idem = idem_tests::idem_shared(Arc::clone(&ledger));
        let (base, runs) = serve(idem.clone()).await;
        let key = format!("export-{}", Token::random().get());
        let address = unknown_export(&idem, &base, &key, backend).await;

        // The old, unchecked verdict.
        let now = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
        let tenant = TenantTag::of(&idem_tests::test_secret(), TENANT);
        let keep_until = now + u64::try_from(Duration::from_secs(3600).as_millis()).unwrap();
        let unchecked = completed(&json!({"export": "done"}));
        ledger.resolve(tenant, address.parse().unwrap(), unchecked, now, keep_until).await.unwrap();
        problem(export(&base, &key).await, 500, "unreadable_result").await;

        // Still refused as a verdict; the one that fits corrects it.
        let misfit = idem.admin().resolve(TENANT, &address, completed(&json!({"export": "done"}))).await;
        assert!(matches!(misfit, Err(StatusError::Misfit { .. })), "{backend}: {misfit:?}");
        let corrected = idem.admin().resolve(TENANT, &address, completed(&found_response())).await;
        corrected.unwrap_or_else(|error| panic!("{backend}: the correction was refused: {error}"));
        replays_the_found_response(export(&base, &key).await, backend).await;

        // A result a retry was answered with stays.
        let other = json!({"status": 200, "headers": [], "text": "another"});
        let again = idem.admin().resolve(TENANT, &address, completed(&other)).await;
        assert_eq!(
            again,
            Err(StatusError::Ledger(LedgerError::NotResolvable { state: State::Completed })),
            "{backend}"
        );
        replays_the_found_response(export(&base, &key).await, backend).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the export ran once");
    }
}
