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
//! - `POST /charges` `{card, amount_cents}` → 201 `{merchant, charge_id, card, amount_cents,
//!   reference}` (the reference is the request's key, as the client sent it, decoded);
//!   `tok_declined` → 402, stored and replayed like any answer.
//! - `GET /charges` → the merchant's charges, what really happened (read from the database,
//!   so across restarts and across processes sharing it).
//!
//! The merchant is the bearer token taken at its word (this demo serves loopback only).
//!
//! # Storage
//!
//! The ledger and the charges live in one database, `IDEM_DATABASE_URL` (a SQLite file path or
//! URL, `postgres://…`, `mysql://…`); unset, the SQLite file `idem/processor/ledger.sqlite3` in
//! your data directory (`~/.local/share` on Linux; the first log line names it). The charges are
//! the table `processor_charges`, created if missing; a charge's id is the database's, unique
//! across processes. Two processes on one PostgreSQL database are one processor: a key sent to
//! either is answered once. A shared database needs `IDEM_SECRET` (`version:hex`, the same in
//! every process); a SQLite file keeps its own secret beside it.
//!
//! # Idempotency policy
//!
//! Published here and in `--help`, as the draft "The Idempotency-Key HTTP Header Field" asks:
//!
//! - `POST /charges` requires an `Idempotency-Key` (a quoted string or a bare token, up to 255
//!   characters), kept per merchant: two merchants' identical keys are two requests.
//! - Window: **24 hours** from the first request. Within it the key names that one request: a
//!   retry gets its stored response with `Idempotent-Replayed: true`; the same key with another
//!   request (method, path, body) gets 422. After it, the key may name a new charge. A retry
//!   while the first request still runs waits up to 5 s for its response, then gets 409.
//! - Stored and replayed: every response the charge gives — 201 charged, 402 declined, a 500 —
//!   except those that mean nothing was charged, which reach the client and are not stored, so
//!   a retry under the same key runs again: 400, 405, 413, 415, 422 (a body that does not parse
//!   or has the wrong shape) and 503 (the charge could not be recorded).
//! - idem's own answers are never stored: 400 (no key, or a malformed one), 401 (no merchant),
//!   409 with `Retry-After` (the request still runs after the 5 s wait: retry after it), 409
//!   `outcome-unknown` (the process that held it died mid-charge: ask an operator, not a retry),
//!   413, 422, and 503 with `Retry-After` (stopping, or the database unreachable: retry).
//!
//! `--delay-ms N` makes each charge take N ms (above 5 s, a concurrent retry is answered 409
//! "in progress"). On SIGTERM or ctrl-c the processor drains: new requests get 503 (safe to
//! retry elsewhere), the charges under way finish and are recorded, then it exits 0.

use std::time::Duration;

use idem_examples::{Stopped, stop_requested};

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idem_runtime::http::{IdempotencyKey, IdempotencyLayer, Route};
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, Idem};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};
use serde::{Deserialize, Serialize};

/// This program's name, for good: its default ledger (and secret) is `idem/processor/` in the
/// user's data directory, and its operations are kept in this namespace of the ledger.
const PROGRAM: &str = "processor";

/// How long a key names one request.
const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How long a retry that finds its request still running waits for the response (then 409).
const WAIT: Duration = Duration::from_secs(5);

/// The statuses that mean nothing was charged: not stored, so a retry under the same key runs.
/// The framework's refusals (idem's default) and 503, a charge that could not be recorded.
const NOT_STORED: [StatusCode; 6] = [
    StatusCode::BAD_REQUEST,
    StatusCode::METHOD_NOT_ALLOWED,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    StatusCode::UNPROCESSABLE_ENTITY,
    StatusCode::SERVICE_UNAVAILABLE,
];

/// How often expired records are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(300);

/// How long a stopping processor waits for the charges under way (systemd and Kubernetes wait
/// 90 s and 30 s before they kill).
const DRAIN_DEADLINE: Duration = Duration::from_secs(25);

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    card: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Charge {
    merchant: String,
    charge_id: String,
    card: String,
    amount_cents: u64,
    /// The `Idempotency-Key` the charge was made under.
    reference: String,
}

/// The charges, in the table `processor_charges` of the ledger's database.
/// What became of a charge the database was asked to record.
enum Recorded {
    /// Recorded (now, or under this key before): its id.
    Charged(i64),
    /// Not recorded, and no charge under its key: nothing was charged.
    NotCharged(DbErr),
    /// The database failed, and could not say whether the charge was recorded.
    Unknown(DbErr),
}

#[derive(Clone)]
struct Charges {
    db: DatabaseConnection,
}

impl Charges {
    /// The table, created if missing.
    async fn open(db: DatabaseConnection) -> Result<Self, DbErr> {
        let id = match db.get_database_backend() {
            DbBackend::Postgres => "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            DbBackend::MySql => "id BIGINT AUTO_INCREMENT PRIMARY KEY",
            _ => "id INTEGER PRIMARY KEY AUTOINCREMENT",
        };
        // One charge per merchant and key, whatever reaches the database twice.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS processor_charges ({id}, merchant VARCHAR(255) NOT NULL, \
             reference VARCHAR(255) NOT NULL, card TEXT NOT NULL, amount_cents BIGINT NOT NULL, \
             UNIQUE (merchant, reference))"
        );
        if let Err(error) = db.execute_unprepared(&create).await {
            // Two processes starting together on PostgreSQL: one creates it, the other's
            // `IF NOT EXISTS` may still fail on the catalog. The table is there: fine.
            if db.execute_unprepared("SELECT 1 FROM processor_charges WHERE 1 = 0").await.is_err() {
                return Err(error);
            }
        }
        Ok(Self { db })
    }

    /// `sql` with `?` placeholders, for this database.
    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        let backend = self.db.get_database_backend();
        let sql = if backend == DbBackend::Postgres {
            let mut numbered = String::new();
            for (index, piece) in sql.split('?').enumerate() {
                if index > 0 {
                    numbered.push_str(&format!("${index}"));
                }
                numbered.push_str(piece);
            }
            numbered
        } else {
            sql.to_owned()
        };
        Statement::from_sql_and_values(backend, sql, values)
    }

    /// Records a charge under its key — or finds the one recorded under it, when the insert
    /// failed: its answer lost with a commit that happened, or the key already charged.
    async fn record(&self, merchant: &str, reference: &str, card: &str, amount_cents: i64) -> Recorded {
        let error = match self.insert(merchant, reference, card, amount_cents).await {
            Ok(id) => return Recorded::Charged(id),
            Err(error) => error,
        };
        let select = "SELECT id FROM processor_charges WHERE merchant = ? AND reference = ?";
        match self.db.query_one_raw(self.statement(select, vec![merchant.into(), reference.into()])).await {
            Ok(Some(row)) => row.try_get_by_index(0).map_or_else(|_| Recorded::Unknown(error), Recorded::Charged),
            Ok(None) => Recorded::NotCharged(error),
            Err(_) => Recorded::Unknown(error),
        }
    }

    /// Inserts a charge; its id, the database's.
    async fn insert(&self, merchant: &str, reference: &str, card: &str, amount_cents: i64) -> Result<i64, DbErr> {
        let insert = "INSERT INTO processor_charges (merchant, reference, card, amount_cents) VALUES (?, ?, ?, ?)";
        let values = vec![merchant.into(), reference.into(), card.into(), amount_cents.into()];
        if self.db.get_database_backend() == DbBackend::Postgres {
            let row = self.db.query_one_raw(self.statement(&format!("{insert} RETURNING id"), values)).await?;
            return row.ok_or_else(|| DbErr::RecordNotInserted)?.try_get_by_index(0);
        }
        let done = self.db.execute_raw(self.statement(insert, values)).await?;
        i64::try_from(done.last_insert_id()).map_err(|error| DbErr::Custom(error.to_string()))
    }

    /// The charges made for `merchant`, oldest first.
    async fn of(&self, merchant: &str) -> Result<Vec<Charge>, DbErr> {
        let select = "SELECT id, card, amount_cents, reference FROM processor_charges WHERE merchant = ? ORDER BY id";
        let rows = self.db.query_all_raw(self.statement(select, vec![merchant.into()])).await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.try_get_by_index(0)?;
                let cents: i64 = row.try_get_by_index(2)?;
                Ok(Charge {
                    merchant: merchant.to_owned(),
                    charge_id: format!("ch_{id}"),
                    card: row.try_get_by_index(1)?,
                    amount_cents: u64::try_from(cents).unwrap_or_default(),
                    reference: row.try_get_by_index(3)?,
                })
            })
            .collect()
    }
}

#[derive(Clone)]
struct Processor {
    charges: Charges,
    delay: Duration,
}

/// The merchant a request is made for: `Authorization: Bearer <merchant>`.
fn merchant(parts: &Parts) -> Option<Caller> {
    let token = parts.headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?;
    Caller::try_new(token.trim(), "api").ok()
}

fn problem(status: StatusCode, error: &str) -> (StatusCode, Json<serde_json::Value>) {
    (status, Json(serde_json::json!({ "error": error })))
}

async fn charge(
    State(processor): State<Processor>,
    key: IdempotencyKey,
    parts: Parts,
    Json(request): Json<ChargeRequest>,
) -> (StatusCode, Json<serde_json::Value>) {
    let merchant = merchant(&parts).map(|caller| caller.tenant().to_owned()).unwrap_or_default();
    let Ok(amount_cents) = i64::try_from(request.amount_cents) else {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "amount_cents is too large");
    };
    tracing::info!(%merchant, reference = key.as_str(), amount_cents, "charging");
    tokio::time::sleep(processor.delay).await;
    if request.card == "tok_declined" {
        return problem(StatusCode::PAYMENT_REQUIRED, "the card was declined");
    }
    match processor.charges.record(&merchant, key.as_str(), &request.card, amount_cents).await {
        Recorded::Charged(id) => {
            let charge = Charge {
                merchant,
                charge_id: format!("ch_{id}"),
                card: request.card,
                amount_cents: request.amount_cents,
                reference: key.as_str().to_owned(),
            };
            tracing::info!(charge_id = %charge.charge_id, reference = %charge.reference, "charged");
            (StatusCode::CREATED, Json(serde_json::to_value(charge).unwrap_or_default()))
        }
        Recorded::NotCharged(error) => {
            tracing::error!(%error, "the charge could not be recorded; nothing was charged");
            problem(StatusCode::SERVICE_UNAVAILABLE, "the charge could not be recorded; nothing was charged")
        }
        // Stored and replayed (a 500): a retry must not charge what may have been charged.
        Recorded::Unknown(error) => {
            tracing::error!(%error, "the database failed, and whether the charge was recorded is unknown");
            problem(StatusCode::INTERNAL_SERVER_ERROR, "whether the charge was recorded is unknown; ask the operator")
        }
    }
}

async fn list(State(processor): State<Processor>, parts: Parts) -> Result<Json<Vec<Charge>>, StatusCode> {
    let merchant = merchant(&parts).map(|caller| caller.tenant().to_owned()).unwrap_or_default();
    processor.charges.of(&merchant).await.map(Json).map_err(|error| {
        tracing::error!(%error, "the charges could not be read");
        StatusCode::SERVICE_UNAVAILABLE
    })
}

const USAGE: &str = "\
processor: a card processor behind idem's IdempotencyLayer (the Idempotency-Key header)

usage: processor [--http ADDR] [--delay-ms N]

  --http ADDR     serve at http://ADDR (loopback only; default 127.0.0.1:8940; port 0 picks one)
  --delay-ms N    each charge takes N ms (above 5 s, a concurrent retry gets 409 \"in progress\")
  -h, --help      print this and exit

  POST /charges {card, amount_cents}   charge (Authorization: Bearer <merchant>, Idempotency-Key)
  GET  /charges                        the merchant's charges

idempotency policy:
  key             Idempotency-Key on POST /charges, quoted or bare, up to 255 characters, per merchant
  window          24 hours from the first request: a retry gets the stored response with
                  Idempotent-Replayed: true; the same key with another request, 422; after the
                  window the key may name a new charge; a retry while the first request runs
                  waits up to 5 s for its response
  stored          every other response of a charge: 201 charged, 402 declined, a 500
  not stored      400, 405, 413, 415, 422 (a body that does not parse or fit) and 503 (the charge
                  could not be recorded): nothing was charged, a retry under the same key runs;
                  idem's own answers: 400 (no or bad key), 401 (no merchant), 409 + Retry-After
                  (still running after 5 s: retry after it), 409 outcome-unknown (its process died
                  mid-charge: ask an operator), 413, 422, 503 + Retry-After (stopping or the
                  database unreachable)
  on SIGTERM      new requests get 503; the charges under way finish and are recorded; exit 0

environment:
  IDEM_DATABASE_URL  the ledger and the charges (table processor_charges): a SQLite file path or
                     URL, postgres://… or mysql://… (one database for several processes);
                     unset: a SQLite file in your data directory (the first log line names it)
  IDEM_SECRET        the secret keys are derived under, version:hex, the same in every process
                     (required on PostgreSQL and MySQL; make one: IDEM_SECRET=1:$(openssl rand -hex 32))
  RUST_LOG           the log level (default info); logs go to stderr
";

struct Options {
    address: String,
    delay: Duration,
}

/// The options, or `None` when `--help` was asked for (and printed).
fn options() -> Result<Option<Options>, String> {
    let mut options = Options { address: "127.0.0.1:8940".to_owned(), delay: Duration::ZERO };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            "--http" => options.address = args.next().ok_or("--http needs an address, e.g. 127.0.0.1:8940")?,
            "--delay-ms" => {
                let ms = args.next().and_then(|ms| ms.parse().ok()).ok_or("--delay-ms needs a number")?;
                options.delay = Duration::from_millis(ms);
            }
            other => {
                return Err(format!("unknown argument `{other}`; use --http ADDR and --delay-ms N (--help says more)"));
            }
        }
    }
    Ok(Some(options))
}

#[tokio::main]
async fn main() -> Result<(), Stopped> {
    idem_examples::log_to_stderr();
    let Some(Options { address, delay }) = options()? else { return Ok(()) };
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&address).await?.collect();
    if resolved.is_empty() || resolved.iter().any(|socket| !socket.ip().is_loopback()) {
        return Err(format!("refusing to serve on {address}: the demo takes bearer tokens at their word").into());
    }
    let url = std::env::var(idem_runtime::ledger::DATABASE_URL_ENV).unwrap_or_default();
    if idem_runtime::ledger::is_redis_url(&url) {
        return Err("the processor keeps its charges in a SQL database beside its ledger: set IDEM_DATABASE_URL to a \
                    SQLite file, postgres://… or mysql://…, not Redis"
            .into());
    }
    let ledger = SeaOrmLedger::from_env(PROGRAM).await?;
    let db = ledger.connection().clone();
    // Keys are keyed with IDEM_SECRET, or on a SQLite file with a secret kept beside it; on
    // PostgreSQL or MySQL without IDEM_SECRET this stops here and says how to make one.
    let idem = Idem::builder(ledger).build()?;
    idem.admin().check_secret().await?;
    let charges = Charges::open(db)
        .await
        .map_err(|error| format!("cannot create the table processor_charges beside the ledger: {error}"))?;
    let _sweeper = idem.admin().spawn_sweeper(SWEEP_EVERY, 1000);
    let layer = IdempotencyLayer::new(idem.clone(), merchant).namespace(PROGRAM).route(
        axum::http::Method::POST,
        "/charges",
        Route::new().window(WINDOW).wait(WAIT).nothing_happened_on(&NOT_STORED),
    );
    let processor = Processor { charges, delay };
    let app = Router::new().route("/charges", post(charge).get(list)).layer(layer).with_state(processor);
    let listener = tokio::net::TcpListener::bind(resolved.as_slice()).await?;
    tracing::info!("serving on http://{}", listener.local_addr()?);
    // Stopped (SIGTERM, ctrl-c): new requests are refused with 503 while the charges under way
    // finish and are recorded; then the server stops accepting and exits.
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            stop_requested().await;
            tracing::info!("stopping: draining the charges under way (up to {DRAIN_DEADLINE:?})");
            let drained = idem.drain(DRAIN_DEADLINE).await;
            tracing::info!(still_running = drained.still_running, "stopped");
        })
        .await?;
    Ok(())
}
