//! Issue 46, item 3: an rmcp client that retries safely (`mcp::client::IdempotentClient`), with
//! the connection cut mid-call by a proxy between the client and the server (the request reaches
//! the server, the answer never comes back, and the proxy refuses that connection's path from then
//! on, as a dropped network would).
//!
//! - Against the payments example (`examples/mcp_server.rs`, over streamable HTTP): one charge at
//!   its processor, and the resent call is answered with the first one's stored result, marked a
//!   replay.
//! - The control, on a server in this test whose payouts are named by the client's key
//!   (`client_key = "required"`): a client that retries with a new key each time, as a plain retry
//!   loop does, pays twice; `IdempotentClient` pays once. A tool without the idempotent hint is
//!   sent once and answered `MaybeExecuted`, never resent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::mcp::client::{CallError, IdempotentClient, RetryPolicy, new_key};
use idem_runtime::{Caller, HasIdem, Idem, MemoryLedger, audit_idempotent, idempotent, mcp};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, JsonObject, MetaObject, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceExt, tool, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bytes of a request whose answer the proxy cuts.
const CUT_ON: &[u8] = b"\"tools/call\"";

/// A TCP proxy to `target`. Armed, it forwards the first request that carries `tools/call` and,
/// once the server answers on that connection, closes every connection it carries and stops
/// listening: the client's connection to the server is gone, and the call runs on the server
/// anyway.
struct Proxy {
    url: String,
    cut: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(target: std::net::SocketAddr, path: &str, armed: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}{path}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        // Once true, for good: every connection closes and the listener with them.
        let (stop, _) = tokio::sync::watch::channel(false);
        let cut_flag = Arc::clone(&cut);
        tokio::spawn(async move {
            let mut stopped = stop.subscribe();
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stopped.wait_for(|stopped| *stopped) => return,
                };
                let Ok((client, _)) = accepted else { return };
                if *stop.borrow() {
                    return;
                }
                let Ok(server) = TcpStream::connect(target).await else { return };
                let (stop, cut) = (stop.clone(), Arc::clone(&cut_flag));
                tokio::spawn(carry(client, server, armed, cut, stop));
            }
        });
        Self { url, cut }
    }
}

/// Carries one connection both ways until either side closes or the proxy cuts. Armed, it cuts
/// when the server first answers on the connection that carried a `tools/call`: the server has
/// taken the request, and its answer never reaches the client.
async fn carry(
    client: TcpStream,
    server: TcpStream,
    armed: bool,
    cut: Arc<AtomicBool>,
    stop: tokio::sync::watch::Sender<bool>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut stopped = stop.subscribe();
    let call_forwarded = AtomicBool::new(false);
    let upstream = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        // The last bytes of the previous read, so that a marker split across two reads is seen.
        let mut seen = Vec::new();
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 || server_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
            seen.extend_from_slice(&buffer[..read]);
            if armed && seen.windows(CUT_ON.len()).any(|window| window == CUT_ON) {
                call_forwarded.store(true, Ordering::SeqCst);
            }
            let keep = seen.len().saturating_sub(CUT_ON.len());
            seen.drain(..keep);
        }
    };
    let downstream = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = server_read.read(&mut buffer).await.unwrap_or(0);
            if read > 0 && call_forwarded.load(Ordering::SeqCst) {
                // The server took the call: drop the path, its answer with it.
                cut.store(true, Ordering::SeqCst);
                stop.send_replace(true);
                return;
            }
            if read == 0 || client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
        _ = stopped.wait_for(|stopped| *stopped) => {}
    }
}

type Client = RunningService<RoleClient, ()>;

/// Connects over streamable HTTP through a new proxy to `target`; the first proxy made for
/// `armed` cuts its first tool call.
async fn connect_through(
    target: std::net::SocketAddr,
    path: &str,
    token: &str,
    armed: &AtomicBool,
    cuts: &std::sync::Mutex<Vec<Arc<AtomicBool>>>,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let proxy = Proxy::start(target, path, armed.swap(false, Ordering::SeqCst)).await;
    cuts.lock().unwrap().push(Arc::clone(&proxy.cut));
    let mut config = StreamableHttpClientTransportConfig::with_uri(proxy.url.as_str()).auth_header(token.to_owned());
    config.retry_config = Arc::new(rmcp::transport::common::client_side_sse::NeverRetry::default());
    ().serve(StreamableHttpClientTransport::from_config(config)).await
}

fn arguments(value: Value) -> JsonObject {
    value.as_object().cloned().expect("arguments are an object")
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        in_flight_first: Duration::from_millis(100),
        in_flight_total: Duration::from_secs(30),
        attempt_timeout: Some(Duration::from_secs(20)),
        ..RetryPolicy::default()
    }
}

/// The payments example over streamable HTTP on a ledger of this test's own; its address.
struct Example {
    child: std::process::Child,
    address: std::net::SocketAddr,
    dir: std::path::PathBuf,
}

impl Example {
    fn start(delay_ms: u64) -> Self {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!("idem-mcp-client-{}-{}", std::process::id(), new_key()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = std::process::Command::new(idem_tests::example_binary("mcp_server"))
            .args(["--http", "127.0.0.1:0", "--processor-delay-ms", &delay_ms.to_string()])
            .env("IDEM_DATABASE_URL", dir.join("ledger.sqlite3"))
            .env_remove("IDEM_SECRET")
            .env_remove("IDEM_SECRET_PREVIOUS")
            .env("RUST_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the payments example");
        // Owned from here, so a failure below still stops the child and removes its files.
        let mut example = Self { child, address: ([127, 0, 0, 1], 0).into(), dir };
        let (found, url) = std::sync::mpsc::channel();
        let log = std::io::BufReader::new(example.child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in log.lines().map_while(Result::ok) {
                if let Some((_, url)) = line.split_once("serving streamable HTTP at http://") {
                    let _ = found.send(url.trim().trim_end_matches("/mcp").to_owned());
                }
            }
        });
        let address = url
            .recv_timeout(Duration::from_secs(30))
            .expect("the payments example logs where it serves within 30 s (it exited or hung instead)");
        example.address = address.parse().expect("a socket address");
        example
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The charges the example's processor made with `card`, asked straight (no proxy, no retries).
async fn charges_with(example: &Example, token: &str, card: &str) -> usize {
    let url = format!("http://{}/mcp", example.address);
    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token.to_owned());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("connect");
    let listed = client.call_tool(CallToolRequestParams::new("list_charges")).await.expect("list_charges");
    let body = listed.structured_content.expect("list_charges answers JSON");
    let _ = client.cancel().await;
    body["charges"].as_array().expect("charges").iter().filter(|charge| charge["card"] == json!(card)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_whose_connection_is_cut_mid_call_is_made_once_and_its_retry_is_a_replay() {
    let example = Example::start(1_500);
    let token = "acme:alice";
    let armed = AtomicBool::new(true);
    let cuts = std::sync::Mutex::new(Vec::new());
    let client =
        IdempotentClient::new(|| connect_through(example.address, "/mcp", token, &armed, &cuts)).with_policy(policy());
    let card = format!("tok_{}", new_key());

    let called = idem_tests::within(
        "the charge, resent after the cut",
        client.call("charge_card", arguments(json!({ "card": card, "amount_cents": 4200 }))),
    )
    .await
    .expect("the charge is answered");

    assert!(cuts.lock().unwrap()[0].load(Ordering::SeqCst), "the proxy cut the first call's connection");
    assert!(called.attempts >= 2, "the call was sent again after the cut: {called:?}");
    assert!(called.replayed, "the resent call got the first one's stored result, marked a replay: {called:?}");
    assert_eq!(
        called.result.structured_content.as_ref().and_then(|receipt| receipt.get("amount_cents")),
        Some(&json!(4200))
    );
    assert_eq!(charges_with(&example, token, &card).await, 1, "the processor charged once");
}

/// A payout service in this test: a payout is named by the client's key, so the same payout
/// twice is two payouts unless the client keeps its key across retries.
#[derive(Clone)]
struct Payouts {
    idem: Idem,
    paid: Arc<AtomicUsize>,
}

impl HasIdem for Payouts {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Payout {
    to: String,
    amount_cents: u64,
}

#[tool_router(server_handler)]
#[audit_idempotent]
impl Payouts {
    #[idempotent(key = "()", client_key = "required")]
    #[tool(description = "Pay out; each payout is named by the client's _meta idempotency-key")]
    async fn send_payout(&self, Parameters(payout): Parameters<Payout>) -> Result<String, mcp::ToolError> {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let n = self.paid.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("paid {} to {} (#{n})", payout.amount_cents, payout.to))
    }

    #[tool(description = "Pay out, with nothing to make a repeat safe")]
    async fn send_payout_unguarded(&self, Parameters(payout): Parameters<Payout>) -> String {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let n = self.paid.fetch_add(1, Ordering::SeqCst) + 1;
        format!("paid {} to {} (#{n})", payout.amount_cents, payout.to)
    }
}

/// Serves `Payouts` over streamable HTTP with the demo's `tenant:subject` bearer tokens.
async fn serve_payouts(paid: &Arc<AtomicUsize>) -> std::net::SocketAddr {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let server = Payouts { idem: idem_tests::idem(MemoryLedger::new()), paid: Arc::clone(paid) };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let tokens: mcp::Validator = Arc::new(|token: &str| {
        let (tenant, subject) = token.split_once(':')?;
        Caller::try_new(tenant, subject).ok()
    });
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(tokens, mcp::require_bearer));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_keeps_its_key_where_a_plain_retry_loop_pays_twice() {
    let paid = Arc::new(AtomicUsize::new(0));
    let address = serve_payouts(&paid).await;
    let token = "acme:alice";
    let payout = || arguments(json!({ "to": "bob", "amount_cents": 1000 }));

    // The control: a plain retry loop that names each attempt anew (a fresh key per send, as a
    // retry decorator around "make a key, call" does) pays twice after one cut.
    let armed = AtomicBool::new(true);
    let cuts = std::sync::Mutex::new(Vec::new());
    let mut plain_answer = None;
    for _ in 0..3 {
        let session = connect_through(address, "/mcp", token, &armed, &cuts).await.expect("connect");
        let mut params = CallToolRequestParams::new("send_payout").with_arguments(payout());
        let mut meta = MetaObject(JsonObject::new());
        meta.0.insert("idempotency-key".to_owned(), json!(new_key()));
        params.meta = Some(RequestMetaObject(meta));
        let sent = tokio::time::timeout(Duration::from_secs(20), session.call_tool(params)).await;
        if let Ok(Ok(result)) = sent {
            plain_answer = Some(result);
            break;
        }
    }
    assert!(plain_answer.is_some(), "the plain loop got an answer on a later send");
    idem_tests::wait_until("the cut payout to finish on the server", || paid.load(Ordering::SeqCst) >= 2).await;
    assert_eq!(paid.load(Ordering::SeqCst), 2, "without one key across retries, the payout is made twice");

    // The same cut under IdempotentClient: one key for the logical call, one payout.
    paid.store(0, Ordering::SeqCst);
    let armed = AtomicBool::new(true);
    let cuts = std::sync::Mutex::new(Vec::new());
    let client = IdempotentClient::new(|| connect_through(address, "/mcp", token, &armed, &cuts)).with_policy(policy());
    let called = idem_tests::within("the payout, resent after the cut", client.call("send_payout", payout()))
        .await
        .expect("the payout is answered");
    assert!(cuts.lock().unwrap()[0].load(Ordering::SeqCst), "the proxy cut the first call");
    assert!(called.attempts >= 2 && called.replayed, "resent under its key and answered from the record: {called:?}");
    assert_eq!(paid.load(Ordering::SeqCst), 1, "one key across the retries: one payout");

    // A tool without the idempotent hint: sent once, and the lost answer is said as such.
    paid.store(0, Ordering::SeqCst);
    let armed = AtomicBool::new(true);
    let cuts = std::sync::Mutex::new(Vec::new());
    let client = IdempotentClient::new(|| connect_through(address, "/mcp", token, &armed, &cuts)).with_policy(policy());
    let lost = idem_tests::within("the unguarded payout's lost answer", client.call("send_payout_unguarded", payout()))
        .await
        .expect_err("a lost answer of an unhinted tool is not resent");
    assert!(matches!(lost, CallError::MaybeExecuted { .. }), "{lost}");
    assert!(lost.to_string().contains("may have run"), "{lost}");
    assert_eq!(client.sends(), 1, "sent once");
    idem_tests::wait_until("the cut payout to finish on the server", || paid.load(Ordering::SeqCst) >= 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(paid.load(Ordering::SeqCst), 1, "paid once: nothing resent it");
}
