//! A card processor as an HTTP service behind idem's `IdempotencyLayer`: the kind of downstream
//! an agent's payment tool calls, honouring the `Idempotency-Key` header it forwards.
//!
//! ```text
//! cargo run --example processor -- --http 127.0.0.1:8940
//! curl -X POST http://127.0.0.1:8940/charges -H 'authorization: Bearer acme' \
//!      -H 'idempotency-key: "order-42"' -H 'content-type: application/json' \
//!      -d '{"card":"tok_visa","amount_cents":4200}'
//! ```
//!
//! - `POST /charges` `{card, amount_cents}` → 201 `{charge_id, amount_cents, reference}` (the
//!   reference is the request's key); `tok_declined` → 402, stored and replayed like any answer.
//!   A retry with the same key gets the first answer with `Idempotent-Replayed: true`; the same
//!   key with another body, 422; no key, 400 — the draft's rules, from the layer.
//! - `GET /charges` → the merchant's charges, what really happened.
//!
//! The merchant is the bearer token taken at its word (this demo serves loopback only). Charges
//! live in memory, so the ledger does too: a restarted processor forgets both together.
//! `--delay-ms N` makes each charge take N ms (to see "in progress" answers).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idem_runtime::http::{IdempotencyLayer, Route};
use idem_runtime::{Caller, Idem, MemoryLedger};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    card: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Charge {
    merchant: String,
    charge_id: String,
    amount_cents: u64,
    /// The `Idempotency-Key` the charge was made under.
    reference: String,
}

#[derive(Clone)]
struct Processor {
    charges: Arc<Mutex<Vec<Charge>>>,
    delay: Duration,
}

/// The merchant a request is made for: `Authorization: Bearer <merchant>`.
fn merchant(parts: &Parts) -> Option<Caller> {
    let token = parts.headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?;
    Caller::try_new(token.trim(), "api").ok()
}

async fn charge(
    State(processor): State<Processor>,
    parts: Parts,
    Json(request): Json<ChargeRequest>,
) -> (StatusCode, Json<serde_json::Value>) {
    tokio::time::sleep(processor.delay).await;
    if request.card == "tok_declined" {
        return (StatusCode::PAYMENT_REQUIRED, Json(serde_json::json!({ "error": "the card was declined" })));
    }
    let merchant = merchant(&parts).map(|caller| caller.tenant().to_owned()).unwrap_or_default();
    let reference = parts
        .headers
        .get(idem_runtime::http::IDEMPOTENCY_KEY)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    let mut charges = processor.charges.lock().unwrap_or_else(PoisonError::into_inner);
    let charge = Charge {
        merchant,
        charge_id: format!("ch_{}", charges.len() + 1),
        amount_cents: request.amount_cents,
        reference,
    };
    charges.push(charge.clone());
    (StatusCode::CREATED, Json(serde_json::to_value(charge).unwrap_or_default()))
}

async fn list(State(processor): State<Processor>, parts: Parts) -> Json<Vec<Charge>> {
    let merchant = merchant(&parts).map(|caller| caller.tenant().to_owned()).unwrap_or_default();
    let charges = processor.charges.lock().unwrap_or_else(PoisonError::into_inner);
    Json(charges.iter().filter(|charge| charge.merchant == merchant).cloned().collect())
}

const USAGE: &str = "\
processor: a card processor behind idem's IdempotencyLayer (the Idempotency-Key header)

usage: processor [--http ADDR] [--delay-ms N]

  --http ADDR     serve at http://ADDR (loopback only; default 127.0.0.1:8940; port 0 picks one)
  --delay-ms N    each charge takes N ms
  -h, --help      print this and exit
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let (mut address, mut delay) = ("127.0.0.1:8940".to_owned(), Duration::ZERO);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            "--http" => address = args.next().ok_or("--http needs an address, e.g. 127.0.0.1:8940")?,
            "--delay-ms" => {
                let ms = args.next().and_then(|ms| ms.parse().ok()).ok_or("--delay-ms needs a number")?;
                delay = Duration::from_millis(ms);
            }
            other => return Err(format!("unknown argument `{other}`; --help lists the options").into()),
        }
    }
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&address).await?.collect();
    if resolved.is_empty() || resolved.iter().any(|socket| !socket.ip().is_loopback()) {
        return Err(format!("refusing to serve on {address}: the demo takes bearer tokens at their word").into());
    }
    let idem = Idem::new(MemoryLedger::new());
    let layer = IdempotencyLayer::new(idem, merchant).route(
        axum::http::Method::POST,
        "/charges",
        Route::new().window(Duration::from_secs(24 * 3600)),
    );
    let processor = Processor { charges: Arc::default(), delay };
    let app = Router::new().route("/charges", post(charge).get(list)).layer(layer).with_state(processor);
    let listener = tokio::net::TcpListener::bind(resolved.as_slice()).await?;
    tracing::info!("serving on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
