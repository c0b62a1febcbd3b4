//! A payments sandbox MCP server whose side-effecting tools are safe to repeat.
//!
//! ```text
//! cargo run --example mcp_server                      # stdio (the caller is IDEM_LOCAL_CALLER, default local:user)
//! cargo run --example mcp_server -- --http 127.0.0.1:8931   # streamable HTTP at /mcp, bearer tokens `tenant:subject`
//! ```
//!
//! The demo bearer tokens take any `tenant:subject` at its word, so the server refuses to listen
//! on an address that is not loopback: replace `demo_tokens()` with real validation first.
//!
//! Options (`--help` lists them): `--processor-delay-ms N` makes the fake card processor slow (so
//! "in flight" can be seen); `--lease-ms N` sets how long a claim is held without renewal (how
//! soon a dead replica's operations are taken over or held); `--metrics ADDR` serves idem's metrics (feature `metrics`) in Prometheus's text format
//! at `http://ADDR/metrics` (port 0: any free port; the log names it). The ledger is `IDEM_DATABASE_URL` (a SQL or Redis URL, or a SQLite file path), by default the SQLite
//! file `idem/mcp_server/ledger.sqlite3` in your data directory (`~/.local/share` on Linux); the
//! first log line names it. Logs go to stderr (on stdio, stdout is the transport); `RUST_LOG`
//! sets the level (default `info`).
//!
//! Tools:
//! - `charge_card` — key `card, amount_cents`, window 15m; forwards its key to the processor as
//!   the charge's reference. The fake processor does not dedupe: `list_charges` shows every
//!   charge it really made. With `--processor URL` (the `processor` example, which honours the
//!   key), a charge whose replica died is run again under the same key (`reconcile`): the
//!   processor charges once; without it, the operation stays "outcome unknown".
//! - `create_shipment` — business key `order_id`; the carrier dedupes by the forwarded reference,
//!   so a dead holder's lease is taken over (`stale = "takeover"`).
//! - `send_email` — key `to, subject, body`, window 24h, scoped to the caller. A message has no
//!   business id and the email provider does not dedupe, so: the same message to the same
//!   recipient within a day is a repeat, not a new email; a lost process leaves the send
//!   "unknown" (`hold`) for an operator rather than risking a second email.
//! - `charge_card_confirmed` — like `charge_card`, but above 200.00 it first asks the user to
//!   confirm (a multi-round-trip request: `input_required` with an elicitation, answered by the
//!   client's continuation). Asking completes nothing; the confirmed continuation charges once,
//!   and every repeat of it, or of the original call, gets that receipt. A declined confirmation
//!   charges nothing. Each confirmation is accepted once (`single_use_state`).
//! - `list_charges` — read-only: what the processor really did for the caller's tenant.
//! - `idem_status` — read-only: an operation's state by ref, for its caller (or, for a
//!   tenant-scoped tool, its tenant).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_examples::{Stopped, stop_requested};
use idem_runtime::mcp::{self, Step, ToolError};
use idem_runtime::{Caller, HasIdem, Idem, audit_idempotent, current_operation, idempotent};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::InputResponses;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CancelTaskParams, GetTaskParams, GetTaskResult, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// This program's name, for good: its default ledger (and secret) is `idem/mcp_server/` in the user's
/// data directory whatever the executable file is called. A package of one program passes
/// `env!("CARGO_PKG_NAME")`; this package holds several examples, each with a ledger of its own.
const PROGRAM: &str = "mcp_server";

/// `charge_card_confirmed` asks the user to confirm a charge above this (200.00).
const CONFIRM_ABOVE_CENTS: u64 = 20_000;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Charge {
    /// A card token, e.g. `tok_visa`.
    card: String,
    /// The amount in cents.
    amount_cents: u64,
    /// A free-text description; part of the operation (a change is a conflict, not a new charge).
    description: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    /// The idempotency key the processor was given as its reference.
    reference: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Shipment {
    order_id: String,
    address: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct ShipmentReceipt {
    tracking_number: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Email {
    to: String,
    subject: String,
    body: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Sent {
    message_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct ChargeRecord {
    /// The tenant the charge was made for.
    tenant: String,
    charge_id: String,
    card: String,
    amount_cents: u64,
    reference: String,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Charges {
    charges: Vec<ChargeRecord>,
}

/// The fake downstream systems, in memory.
#[derive(Default)]
struct Downstream {
    charges: Mutex<Vec<ChargeRecord>>,
    shipments: Mutex<Vec<(String, String)>>,
    emails: Mutex<Vec<String>>,
}

#[derive(Clone)]
struct Payments {
    idem: Idem,
    downstream: Arc<Downstream>,
    processor_delay: Duration,
    /// A card processor over HTTP (`--processor URL`); without one, the fake in `downstream`.
    remote: Option<RemoteProcessor>,
    tool_router: ToolRouter<Self>,
}

/// A card processor over HTTP that honours `Idempotency-Key` (the `processor` example): each
/// charge carries its operation's key, so the processor answers a second attempt of one
/// operation from its own record instead of charging twice.
#[derive(Clone)]
struct RemoteProcessor {
    charges: String,
    client: reqwest::Client,
}

impl RemoteProcessor {
    fn new(base: &str) -> Self {
        Self { charges: format!("{}/charges", base.trim_end_matches('/')), client: reqwest::Client::new() }
    }

    /// Charges `charge` for `tenant` (the processor's merchant), under the running operation's key.
    async fn charge(&self, tenant: &str, charge: &Charge) -> Result<Json<Receipt>, ToolError> {
        let body = serde_json::json!({ "card": charge.card, "amount_cents": charge.amount_cents });
        let mut request = self.client.post(&self.charges).bearer_auth(tenant).json(&body);
        if let Some(key) = idem_runtime::http::forwarded_key() {
            request = request.header(idem_runtime::http::IDEMPOTENCY_KEY, key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            // Never sent: nothing was charged.
            Err(error) if error.is_connect() => {
                return Err(ToolError::nothing_happened(format!("the processor could not be reached: {error}")));
            }
            Err(error) => return Err(ToolError::unknown(format!("the processor did not answer: {error}"))),
        };
        let status = response.status();
        if response.headers().contains_key(idem_runtime::http::IDEMPOTENT_REPLAYED) {
            tracing::info!(%status, "the processor answered from its record: an earlier attempt of this operation made the charge");
        }
        match status.as_u16() {
            200 | 201 => response.json::<Receipt>().await.map(Json).map_err(|error| {
                ToolError::unknown(format!("the processor charged, but its receipt could not be read: {error}"))
            }),
            402 => Err(ToolError::final_answer("the card was declined: insufficient funds")),
            // In progress there, or its outcome unknown to it: not ours to guess.
            409 => Err(ToolError::unknown("the processor is still charging this operation, or cannot say")),
            // Refused before it acted (a bad request, a missing key): nothing was charged.
            400..=499 => Err(ToolError::nothing_happened(format!("the processor refused the charge ({status})"))),
            _ => Err(ToolError::unknown(format!("the processor failed ({status}); the charge may have been made"))),
        }
    }
}

impl HasIdem for Payments {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

fn forwarded_key() -> String {
    current_operation().map(|operation| operation.idempotency_key()).unwrap_or_default()
}

#[audit_idempotent]
#[tool_router]
impl Payments {
    fn new(idem: Idem, processor_delay: Duration) -> Self {
        let tool_router = Self::tool_router() + mcp::status_tool();
        Self { idem, downstream: Arc::default(), processor_delay, remote: None, tool_router }
    }

    #[idempotent(key = "card, amount_cents", window = "15m", reconcile = Self::reconcile_charge)]
    #[tool(description = "Charge a card. Safe to repeat: a repeat returns the original receipt.")]
    async fn charge_card(&self, Parameters(charge): Parameters<Charge>) -> Result<Json<Receipt>, ToolError> {
        self.charge_card_now(charge).await
    }

    /// A charge whose replica died before recording it: a processor over HTTP answers a second
    /// attempt of one operation from its own record (it honours the forwarded key), so the charge
    /// is run again under the same key — charged once, or its first receipt returned. The fake
    /// processor in memory cannot tell: the operation stays unknown, for an operator.
    async fn reconcile_charge(
        &self,
        _operation: idem_runtime::Operation,
    ) -> idem_runtime::Reconciled<Receipt, ToolError> {
        if self.remote.is_some() {
            idem_runtime::Reconciled::NothingHappened
        } else {
            idem_runtime::Reconciled::StillUnknown
        }
    }

    /// Charges go to the processor at `base` (`--processor URL`) instead of the fake one.
    fn with_processor(mut self, base: &str) -> Self {
        self.remote = Some(RemoteProcessor::new(base));
        self
    }

    /// The charge itself, under the calling tool's operation (whose key it forwards).
    async fn charge_card_now(&self, charge: Charge) -> Result<Json<Receipt>, ToolError> {
        if charge.amount_cents == 0 {
            return Err(ToolError::invalid("amount_cents must be positive"));
        }
        let reference = forwarded_key();
        // The operation's caller, in scope while the handler runs.
        let tenant = idem_runtime::current_caller().map(|caller| caller.tenant().to_owned()).unwrap_or_default();
        if let Some(remote) = &self.remote {
            return remote.charge(&tenant, &charge).await;
        }
        tokio::time::sleep(self.processor_delay).await;
        if charge.card == "tok_declined" {
            // The processor's answer to this operation: stored, and replayed to every repeat.
            return Err(ToolError::final_answer("the card was declined: insufficient funds"));
        }
        let mut charges = self.downstream.charges.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let charge_id = format!("ch_{}", charges.len() + 1);
        let _ = charge.description;
        charges.push(ChargeRecord {
            tenant,
            charge_id: charge_id.clone(),
            card: charge.card,
            amount_cents: charge.amount_cents,
            reference: reference.clone(),
        });
        Ok(Json(Receipt { charge_id, amount_cents: charge.amount_cents, reference }))
    }

    #[idempotent(key = "card, amount_cents", window = "15m", single_use_state = true)]
    #[tool(description = "Charge a card; above 200.00 the user is asked to confirm first. Safe to repeat: a \
                          repeat returns the original receipt.")]
    async fn charge_card_confirmed(
        &self,
        Parameters(charge): Parameters<Charge>,
        InputResponses(responses): InputResponses,
    ) -> Result<Step<Json<Receipt>>, ToolError> {
        if charge.amount_cents > CONFIRM_ABOVE_CENTS {
            match mcp::confirmed(responses.as_ref(), "confirm") {
                None => {
                    let (units, cents) = (charge.amount_cents / 100, charge.amount_cents % 100);
                    let message = format!("Charge {units}.{cents:02} to card {}?", charge.card);
                    return Ok(Step::InputRequired(mcp::confirm("confirm", message)));
                }
                Some(false) => {
                    return Err(ToolError::nothing_happened("the charge was not confirmed; nothing was charged"));
                }
                Some(true) => {}
            }
        }
        self.charge_card_now(charge).await.map(Step::Done)
    }

    // `task = true`: a client that declared the tasks extension and repeats this call while it
    // runs gets the operation's task (its `taskId` is the ref) to poll with `tasks/get`.
    #[idempotent(key = "order_id", stale = "takeover", task = true)]
    #[tool(description = "Create the shipment of an order (one per order).")]
    async fn create_shipment(
        &self,
        Parameters(shipment): Parameters<Shipment>,
    ) -> Result<Json<ShipmentReceipt>, ToolError> {
        // The carrier dedupes by the reference we forward: a takeover after a crash cannot ship twice.
        let reference = forwarded_key();
        // The carrier is as slow as the processor: a repeat meanwhile finds the shipment running.
        tokio::time::sleep(self.processor_delay).await;
        let mut shipments = self.downstream.shipments.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tracking_number = match shipments.iter().position(|(seen, _)| *seen == reference) {
            Some(index) => format!("TRK{index:06}"),
            None => {
                shipments.push((reference, shipment.address));
                format!("TRK{:06}", shipments.len() - 1)
            }
        };
        let _ = shipment.order_id;
        Ok(Json(ShipmentReceipt { tracking_number }))
    }

    #[idempotent(key = "to, subject, body", window = "24h")]
    #[tool(description = "Send an email. The same message to the same recipient within a day is sent once.")]
    async fn send_email(&self, Parameters(email): Parameters<Email>) -> Result<Json<Sent>, ToolError> {
        if !email.to.contains('@') {
            return Err(ToolError::invalid(format!("`{}` is not an email address", email.to)));
        }
        let mut emails = self.downstream.emails.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        emails.push(format!("{} / {} / {}", email.to, email.subject, email.body.len()));
        Ok(Json(Sent { message_id: format!("msg_{}", emails.len()) }))
    }

    #[tool(
        description = "List every charge the card processor really made for your tenant.",
        annotations(read_only_hint = true)
    )]
    async fn list_charges(&self, context: RequestContext<RoleServer>) -> Result<Json<Charges>, String> {
        let caller = mcp::request_caller(&self.idem, &context)
            .ok_or("the caller is not authenticated: send a bearer token and call again")?;
        let charges = self.downstream.charges.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let charges = charges.iter().filter(|charge| charge.tenant == caller.tenant()).cloned().collect();
        Ok(Json(Charges { charges }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        // `enable_tasks`: create_shipment may answer a repeat with a task, served below.
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build()).with_instructions(
            "A payments sandbox. charge_card, charge_card_confirmed, create_shipment and send_email are safe to \
             repeat; an answer that says 'in flight' names a ref to pass to idem_status instead of calling again.",
        )
    }

    // MCP tasks are idem's operations: `tasks/get` and `tasks/cancel` are answered from the ledger.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        mcp::tasks::get_task(&self.idem, &request, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        mcp::tasks::cancel_task(&self.idem, &request, &context).await
    }
}

struct Options {
    http: Option<String>,
    processor_delay: Duration,
    processor: Option<String>,
    lease: Option<Duration>,
    metrics: Option<String>,
}

/// The demo validator: a bearer token `tenant:subject` is taken at its word. Replace it with real
/// validation (a JWT check, a session lookup) before exposing the server.
fn demo_tokens() -> mcp::Validator {
    Arc::new(|token: &str| {
        let (tenant, subject) = token.split_once(':')?;
        Caller::try_new(tenant, subject).ok()
    })
}

/// How often expired records are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(300);

/// The background sweeper, running until the returned guard is dropped. With `--metrics`, each
/// sweep also sets the ledger gauges (unknown operations, the oldest one's age, lapsed leases,
/// the sweep backlog) from one count of the ledger.
fn sweeper(idem: &Idem, gauges: bool) -> idem_runtime::admin::Sweeper {
    if gauges {
        idem.admin().spawn_sweeper_with_gauges(SWEEP_EVERY, 1000)
    } else {
        idem.admin().spawn_sweeper(SWEEP_EVERY, 1000)
    }
}

/// How long a stopping server waits for the calls under way (systemd and Kubernetes wait 90 s
/// and 30 s before they kill).
const DRAIN_DEADLINE: Duration = Duration::from_secs(25);

/// Refuses new calls and waits for those under way, before the process exits.
async fn drain(idem: &Idem) {
    tracing::info!("stopping: draining the calls under way (up to {DRAIN_DEADLINE:?})");
    let drained = idem.drain(DRAIN_DEADLINE).await;
    tracing::info!(still_running = drained.still_running, still_recording = drained.still_recording, "stopped");
}

/// What `--help` prints.
const USAGE: &str = "\
mcp_server: a payments sandbox MCP server whose side-effecting tools are safe to repeat

usage: mcp_server [--http ADDR] [--processor URL] [--processor-delay-ms N] [--lease-ms N] [--metrics ADDR]

  (no flag)               serve on stdio, acting for IDEM_LOCAL_CALLER (tenant:subject, default local:user)
  --http ADDR             serve streamable HTTP at http://ADDR/mcp (loopback only; bearer tokens tenant:subject)
  --processor URL         charge through a card processor over HTTP (the `processor` example), forwarding
                          each operation's key as Idempotency-Key; without it, a fake processor in memory
  --processor-delay-ms N  make the fake card processor take N ms (to see \"in flight\" answers)
  --lease-ms N            how long a call's claim is held without renewal (default 30000): after a replica
                          dies, its operations wait this long before a repeat takes them over or holds them
  --metrics ADDR          serve idem's metrics in Prometheus's text format at http://ADDR/metrics
  -h, --help              print this and exit

environment:
  IDEM_DATABASE_URL       the ledger: a URL (postgres://, mysql://, sqlite://, redis://, redis+cluster://)
                          or a SQLite file path;
                          unset: a SQLite file in your data directory (the first log line names it)
  IDEM_SECRET             the secret keys are derived under, version:hex (required on PostgreSQL and MySQL)
  IDEM_SECRET_PREVIOUS    earlier secrets still honoured during a rotation, comma-separated
  RUST_LOG                the log level (default info); logs go to stderr
";

/// The options, or `None` when `--help` was asked for (and printed).
fn options() -> Result<Option<Options>, String> {
    let mut options =
        Options { http: None, processor_delay: Duration::ZERO, processor: None, lease: None, metrics: None };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            "--http" => options.http = Some(args.next().ok_or("--http needs an address, e.g. 127.0.0.1:8931")?),
            "--processor-delay-ms" => {
                let ms = args.next().and_then(|ms| ms.parse().ok()).ok_or("--processor-delay-ms needs a number")?;
                options.processor_delay = Duration::from_millis(ms);
            }
            "--processor" => {
                options.processor = Some(args.next().ok_or("--processor needs a URL, e.g. http://127.0.0.1:8940")?);
            }
            "--lease-ms" => {
                let ms = args.next().and_then(|ms| ms.parse().ok()).ok_or("--lease-ms needs a number")?;
                options.lease = Some(Duration::from_millis(ms));
            }
            "--metrics" => {
                options.metrics = Some(args.next().ok_or("--metrics needs an address, e.g. 127.0.0.1:9464")?);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; use --http ADDR, --processor URL, --processor-delay-ms N, --lease-ms N \
                     and --metrics ADDR (--help says more)"
                ));
            }
        }
    }
    Ok(Some(options))
}

/// `--metrics ADDR`: installs the Prometheus recorder, so idem's counters, histograms and gauge
/// (the `metrics` feature of idem-runtime) are recorded, and serves them at `/metrics`.
async fn serve_metrics(address: &str) -> Result<(), Box<dyn std::error::Error>> {
    // Buckets, so the durations are histograms (aggregatable across replicas), not summaries.
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Prefix("idem_".to_owned()),
            idem_runtime::metrics::BUCKETS,
        )?
        .install_recorder()?;
    idem_runtime::metrics::describe();
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!("metrics at http://{}/metrics", listener.local_addr()?);
    // The recorder drains its histograms' buckets on upkeep: run it now and then.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { handle.render() }));
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics page stopped");
        }
    });
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Stopped> {
    idem_examples::log_to_stderr();
    let Some(options) = options()? else { return Ok(()) };
    if let Some(address) = &options.metrics {
        serve_metrics(address).await?;
    }
    // A Redis URL opens the Redis ledger; any other, the SQL one.
    let ledger = idem_runtime::ledger::from_env(PROGRAM).await?;
    let local = std::env::var("IDEM_LOCAL_CALLER").unwrap_or_else(|_| "local:user".to_owned());
    let (tenant, subject) = local.split_once(':').ok_or("IDEM_LOCAL_CALLER must be `tenant:subject`")?;
    // Keys are keyed with IDEM_SECRET, or on the SQLite default with a secret kept beside the
    // ledger file; on PostgreSQL, MySQL or Redis without IDEM_SECRET this stops here and says how.
    let mut idem = Idem::builder(ledger);
    if let Some(lease) = options.lease {
        idem = idem.lease(lease);
    }
    let delay = options.processor_delay;
    match options.http {
        None => {
            // Nothing authenticates a request over stdio: the server acts for this caller.
            let idem = idem.local_caller(Caller::try_new(tenant, subject)?).build()?;
            idem.admin().check_secret().await?;
            let _sweeper = sweeper(&idem, options.metrics.is_some());
            let mut server = Payments::new(idem.clone(), delay);
            if let Some(processor) = &options.processor {
                server = server.with_processor(processor);
            }
            // Hinted tools backed by recipes, `idem_status` served, a local caller for stdio.
            mcp::check(&server, &server.tool_router, mcp::Transport::Stdio)?;
            tracing::info!("serving on stdio");
            // Served on a task of its own, so a stop is heard from the start (the handshake too).
            let mut serving = tokio::spawn(async move {
                server.serve(rmcp::transport::stdio()).await?.waiting().await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            });
            tokio::select! {
                ended = &mut serving => ended?.map_err(|error| Stopped(error))?,
                // Stopped (SIGTERM, ctrl-c): the server keeps answering while the calls under way
                // finish and record their outcomes; new ones are refused, safe to retry.
                () = stop_requested() => {
                    drain(&idem).await;
                    // The drained calls' answers are on their way to stdout: let the transport
                    // write them before the process exits.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        Some(address) => {
            use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
            // Any `tenant:subject` token is accepted: only this machine may reach that.
            let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&address).await?.collect();
            if resolved.is_empty() || resolved.iter().any(|socket| !socket.ip().is_loopback()) {
                return Err(format!(
                    "refusing to serve on {address}: it is not a loopback address, and this example's demo bearer \
                     tokens accept any `tenant:subject` at its word. Serve on 127.0.0.1 or [::1], or replace \
                     `demo_tokens()` with real token validation before exposing the server"
                )
                .into());
            }
            use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
            let idem = idem.build()?;
            idem.admin().check_secret().await?;
            let _sweeper = sweeper(&idem, options.metrics.is_some());
            // One server value for every request: the fake downstream is shared, as a real one would be.
            let mut server = Payments::new(idem.clone(), delay);
            if let Some(processor) = &options.processor {
                server = server.with_processor(processor);
            }
            mcp::check(&server, &server.tool_router, mcp::Transport::Http)?;
            let service = StreamableHttpService::new(
                move || Ok(server.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
            let app = axum::Router::new()
                .nest_service("/mcp", service)
                .layer(axum::middleware::from_fn_with_state(demo_tokens(), mcp::require_bearer));
            let listener = tokio::net::TcpListener::bind(resolved.as_slice()).await?;
            tracing::info!("serving streamable HTTP at http://{}/mcp", listener.local_addr()?);
            // Stopped (SIGTERM, ctrl-c): drained while still serving, then the server stops.
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    stop_requested().await;
                    drain(&idem).await;
                })
                .await?;
        }
    }
    Ok(())
}

/// A tool is an ordinary method: a unit test calls it with `ToolContext::local()` (as over
/// stdio) or `ToolContext::for_caller(..)` (as an authenticated HTTP request) in place of the
/// request rmcp would pass, and `into_result()` gives back the tool's own `Result`.
#[cfg(test)]
mod tests {
    use idem_runtime::MemoryLedger;
    use idem_runtime::mcp::ToolContext;
    use rmcp::model::InputRequiredResult;

    use super::*;

    fn server() -> Payments {
        let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap();
        let server = Payments::new(idem, Duration::ZERO);
        mcp::check(&server, &server.tool_router, mcp::Transport::Stdio).expect("ready to serve on stdio");
        server
    }

    fn charge(card: &str) -> Parameters<Charge> {
        Parameters(Charge { card: card.to_owned(), amount_cents: 1250, description: None })
    }

    fn processor_charges(server: &Payments) -> usize {
        server.downstream.charges.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    #[tokio::test]
    async fn a_repeated_charge_reaches_the_processor_once() {
        let server = server();
        let first = server.charge_card(ToolContext::local(), charge("tok_visa")).await.into_result().expect("charged");
        let again = server.charge_card(ToolContext::local(), charge("tok_visa")).await.into_result().expect("replayed");
        assert_eq!(again.0.charge_id, first.0.charge_id, "the repeat gets the first receipt");
        assert_eq!(processor_charges(&server), 1, "the processor charged once");
    }

    #[tokio::test]
    async fn a_unit_test_tells_a_replay_from_a_fresh_result() {
        let server = server();
        let first = server.charge_card(ToolContext::local(), charge("tok_visa")).await;
        let again = server.charge_card(ToolContext::local(), charge("tok_visa")).await;
        assert!(!first.replayed() && again.replayed(), "{again:?}");
        assert_eq!(first.reference(), again.reference(), "one operation");
        assert!(format!("{again:?}").contains("replayed: true"), "{again:?}");
        assert_eq!(processor_charges(&server), 1);
    }

    #[tokio::test]
    async fn a_declined_card_is_the_answer_to_every_repeat() {
        let server = server();
        let first = server.charge_card(ToolContext::local(), charge("tok_declined")).await.into_result();
        let again = server.charge_card(ToolContext::local(), charge("tok_declined")).await.into_result();
        let (Err(first), Err(again)) = (first, again) else { panic!("a declined card is an error") };
        assert_eq!(again, first, "the stored final answer is replayed");
        assert_eq!(processor_charges(&server), 0);
    }

    fn confirmed_charge(cents: u64) -> Parameters<Charge> {
        Parameters(Charge { card: "tok_visa".to_owned(), amount_cents: cents, description: None })
    }

    fn answer(action: &str) -> rmcp::model::InputResponses {
        let answer = serde_json::json!({ "action": action, "content": {} });
        rmcp::model::InputResponses::from([("confirm".to_owned(), answer)])
    }

    /// The continuation of `asked` answered with `action`, as rmcp would pass it: idem's context
    /// with the echoed state and the answer, and the tool's own `InputResponses`.
    async fn continue_with(
        server: &Payments,
        asked: &InputRequiredResult,
        action: &str,
    ) -> Result<Step<Json<Receipt>>, ToolError> {
        let state = asked.request_state.clone().expect("idem sends a requestState");
        let context = ToolContext::local().with_request_state(state).with_input_responses(answer(action));
        let responses = InputResponses(Some(answer(action)));
        server.charge_card_confirmed(context, confirmed_charge(24_000), responses).await.into_result()
    }

    async fn ask(server: &Payments) -> InputRequiredResult {
        let first = server.charge_card_confirmed(ToolContext::local(), confirmed_charge(24_000), InputResponses(None));
        match first.await.into_result() {
            Ok(Step::InputRequired(asked)) => asked,
            Ok(Step::Done(receipt)) => panic!("a charge above 200.00 asks first, not {:?}", receipt.0),
            other => panic!("a charge above 200.00 asks first: {:?}", other.err()),
        }
    }

    #[tokio::test]
    async fn a_large_charge_asks_first_and_charges_once_when_confirmed() {
        let server = server();
        let asked = ask(&server).await;
        assert_eq!(processor_charges(&server), 0, "asking charges nothing");
        let Ok(Step::Done(first)) = continue_with(&server, &asked, "accept").await else { panic!("charged") };
        let Ok(Step::Done(again)) = continue_with(&server, &asked, "accept").await else { panic!("replayed") };
        assert_eq!(again.0.charge_id, first.0.charge_id, "the repeated continuation gets the first receipt");
        let original =
            server.charge_card_confirmed(ToolContext::local(), confirmed_charge(24_000), InputResponses(None));
        let Ok(Step::Done(original)) = original.await.into_result() else { panic!("replayed, not asked again") };
        assert_eq!(original.0.charge_id, first.0.charge_id, "the original call after completion is a replay");
        assert_eq!(processor_charges(&server), 1, "the processor charged once");
    }

    #[tokio::test]
    async fn a_declined_charge_charges_nothing() {
        let server = server();
        let asked = ask(&server).await;
        let declined = continue_with(&server, &asked, "decline").await;
        assert!(declined.is_err_and(|error| error.to_string().contains("not confirmed")));
        assert_eq!(processor_charges(&server), 0);
    }

    #[tokio::test]
    async fn a_small_charge_is_not_asked() {
        let server = server();
        let charged = server.charge_card_confirmed(ToolContext::local(), confirmed_charge(1250), InputResponses(None));
        assert!(matches!(charged.await.into_result(), Ok(Step::Done(_))));
        assert_eq!(processor_charges(&server), 1);
    }

    #[tokio::test]
    async fn each_caller_has_its_own_operations() {
        let server = server();
        for tenant in ["acme", "globex"] {
            let caller = ToolContext::for_caller(Caller::new(tenant, "alice"));
            server.charge_card(caller, charge("tok_visa")).await.into_result().expect("charged");
        }
        assert_eq!(processor_charges(&server), 2, "the same arguments from two tenants are two charges");
    }
}
