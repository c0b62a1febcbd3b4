//! `idem probe` (issue 32) run as a user runs it — the `idem` binary — against three servers: a
//! small rmcp server in this file whose hints are false (a counter that moves on each call), the
//! payments example (every hint holds, idem makes it so), and a server nobody in this project
//! wrote, `@modelcontextprotocol/server-memory` from the npm registry, installed into a temporary
//! directory by the test.

use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::Value;

/// A server whose tools claim `idempotentHint` and are not idempotent: `bump` says the new count
/// (a repeat answers differently), `touch` says "done" each time (only an oracle sees the second
/// effect), `count` reads the counter.
#[derive(Clone)]
struct Counter {
    count: Arc<AtomicU64>,
    router: ToolRouter<Self>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Named {
    /// Anything.
    name: String,
}

#[tool_router]
impl Counter {
    #[tool(description = "Add one to the counter.", annotations(idempotent_hint = true, read_only_hint = false))]
    async fn bump(&self, Parameters(named): Parameters<Named>) -> String {
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{} bumped the count to {count}", named.name)
    }

    #[tool(
        description = "Add one to the counter, quietly.",
        annotations(idempotent_hint = true, read_only_hint = false)
    )]
    async fn touch(&self, Parameters(named): Parameters<Named>) -> String {
        self.count.fetch_add(1, Ordering::SeqCst);
        format!("{} touched it", named.name)
    }

    #[tool(description = "The counter.", annotations(read_only_hint = true))]
    async fn count(&self) -> String {
        self.count.load(Ordering::SeqCst).to_string()
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for Counter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Serves `Counter` over streamable HTTP on a free loopback port; its URL.
async fn serve_counter() -> String {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let counter = Counter { count: Arc::default(), router: Counter::tool_router() };
    let service = StreamableHttpService::new(
        move || Ok(counter.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Runs `idem probe` with `args` (off the runtime: the server answers meanwhile).
async fn probe(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idem")).arg("probe").args(args).output().expect("run idem probe")
    })
    .await
    .unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

fn findings(report: &Value, tool: &str) -> (String, Vec<(String, String)>) {
    let tool = report["tools"].as_array().unwrap().iter().find(|t| t["tool"] == tool).unwrap_or_else(|| {
        panic!("no report for {tool}: {report:#}");
    });
    let findings = tool["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["probe"].as_str().unwrap().to_owned(), f["verdict"].as_str().unwrap().to_owned()))
        .collect();
    (tool["verdict"].as_str().unwrap().to_owned(), findings)
}

/// A counter behind a true-claimed hint is reported false — by its answers (`bump`), and by the
/// oracle when its answers are the same (`touch`) — and the exit code fails a CI job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_false_hint_is_reported_false_and_fails_the_run() {
    let url = serve_counter().await;
    let output = probe(owned(&["--http", &url, "--generate", "--count-with", "count", "--json"])).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let report: Value = serde_json::from_slice(&output.stdout).expect("the report is JSON");
    let (verdict, bump) = findings(&report, "bump");
    assert_eq!(verdict, "false", "{report:#}");
    assert!(bump.contains(&("sequential_repeat".into(), "false".into())), "{bump:?}");
    assert!(bump.contains(&("concurrent_repeat".into(), "false".into())), "{bump:?}");
    let (verdict, touch) = findings(&report, "touch");
    assert_eq!(verdict, "false", "{report:#}");
    assert!(
        touch.contains(&("sequential_repeat".into(), "false".into())),
        "the oracle saw the second effect: {touch:?}"
    );
    matches_the_documented_schema(&report);
    let probed: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(|t| t["tool"].as_str()).collect();
    assert_eq!(probed, ["bump", "touch"], "only the tools that claim the hint: {report:#}");

    // Without an oracle, `touch` answers the same each time: the probe says what it cannot tell.
    let output = probe(owned(&["--http", &url, "--generate", "--tool", "touch"])).await;
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("cannot tell") && out.contains("without an oracle"), "{out}");
    assert!(out.contains("CALLS THE REAL TOOLS"), "the warning: {out}");

    // An oracle the server does not have is a usage error, before any tool is called.
    let output = probe(owned(&["--http", &url, "--generate", "--count-with", "counted"])).await;
    let out = text(&output);
    assert_eq!(output.status.code(), Some(2), "{out}");
    assert!(out.contains("no tool `counted` to count effects with"), "{out}");
}

/// The report has the members, and the verdicts, the JSON Schema in `docs/src/probe.md` says.
fn matches_the_documented_schema(report: &Value) {
    let page = include_str!("../../docs/src/probe.md");
    let from = page.find("## The report as JSON").expect("the guide's schema section");
    let block = &page[from..];
    let start = block.find("```json\n").expect("its JSON block") + "```json\n".len();
    let schema: Value = serde_json::from_str(&block[start..start + block[start..].find("```").unwrap()]).unwrap();
    let required = |schema: &Value| -> Vec<String> {
        schema["required"].as_array().unwrap().iter().map(|name| name.as_str().unwrap().to_owned()).collect()
    };
    let has = |value: &Value, schema: &Value| {
        for name in required(schema) {
            assert!(
                value.get(&name).is_some(),
                "the report lacks `{name}`, which the guide's schema requires: {value}"
            );
        }
    };
    has(report, &schema);
    let tool_schema = &schema["properties"]["tools"]["items"];
    let finding_schema = &tool_schema["properties"]["findings"]["items"];
    for tool in report["tools"].as_array().unwrap() {
        has(tool, tool_schema);
        assert!(tool_schema["properties"]["verdict"]["enum"].as_array().unwrap().contains(&tool["verdict"]));
        for finding in tool["findings"].as_array().unwrap() {
            has(finding, finding_schema);
            assert!(finding_schema["properties"]["probe"]["enum"].as_array().unwrap().contains(&finding["probe"]));
            assert!(finding_schema["properties"]["verdict"]["enum"].as_array().unwrap().contains(&finding["verdict"]));
        }
    }
}

/// The example binaries `cargo test --workspace` builds.
fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(std::path::Path::parent).unwrap();
    let binary = profile.join("examples").join(name);
    assert!(
        binary.is_file(),
        "{} is missing: build it with `cargo build --example {name}` (`cargo test --workspace` does)",
        binary.display()
    );
    binary
}

/// The payments example: every hint it claims holds — sequential, concurrent, after a lost
/// answer (the call is cut 150 ms into a 600 ms charge), and the same key with another
/// description is a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hint_of_the_payments_example_holds() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("idem-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = Command::new(example("mcp_server"))
        .args(["--http", "127.0.0.1:0", "--processor-delay-ms", "600"])
        .env("IDEM_DATABASE_URL", dir.join("ledger.sqlite3"))
        .env_remove("IDEM_SECRET")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the payments example");
    // Read on a thread of its own (the rest of the log drained there), so an example that never
    // says where it serves fails the test instead of hanging it.
    let (found, url) = std::sync::mpsc::channel();
    let log = std::io::BufReader::new(server.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            if let Some((_, url)) = line.split_once("serving streamable HTTP at ") {
                let _ = found.send(url.trim().to_owned());
            }
        }
    });
    let url = url
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the example logs where it serves within 30 s (it exited or hung instead)");
    let fixtures = dir.join("probe.json");
    std::fs::write(
        &fixtures,
        serde_json::json!({
            "charge_card": [{ "card": "tok_{unique}", "amount_cents": 1250, "description": "probe" }],
            "charge_card_confirmed": [{ "card": "tok_{unique}", "amount_cents": 1250 }],
            "create_shipment": [{ "order_id": "o-{unique}", "address": "1 Probe Street" }],
            "send_email": [{ "to": "{unique}@example.com", "subject": "probe", "body": "hello" }]
        })
        .to_string(),
    )
    .unwrap();
    let output = probe(owned(&[
        "--http",
        &url,
        "--header",
        "Authorization: Bearer acme:prober",
        "--fixtures",
        fixtures.to_str().unwrap(),
        "--count-with",
        "list_charges",
        "--json",
    ]))
    .await;
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("the report is JSON");
    for tool in ["charge_card", "charge_card_confirmed", "create_shipment", "send_email"] {
        let (verdict, findings) = findings(&report, tool);
        assert_eq!(verdict, "holds", "{tool}: {report:#}");
        assert!(findings.iter().all(|(_, verdict)| verdict != "false"), "{tool}: {findings:?}");
    }
    let (_, charge) = findings(&report, "charge_card");
    assert!(
        charge.contains(&("different_arguments".into(), "holds".into()))
            && charge.contains(&("repeat_after_lost_answer".into(), "holds".into())),
        "{report:#}"
    );
}

/// A server nobody in this project wrote: the reference memory server from the npm registry,
/// installed into a temporary directory here and spoken to over stdio (each session a new
/// process; the repeat after a lost answer SIGKILLs one). Its deletions claim `idempotentHint`,
/// and they hold. Needs Node and the npm registry: without them it says it skipped (a failure
/// under CI=true).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_server_from_npm_is_probed_over_stdio() {
    const PACKAGE: &str = "@modelcontextprotocol/server-memory@2026.8.31";
    let dir = std::env::temp_dir().join(format!("idem-probe-npm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let installed = Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .arg(PACKAGE)
        .output();
    let server = dir.join("node_modules/.bin/mcp-server-memory");
    if !installed.as_ref().is_ok_and(|out| out.status.success()) || !server.is_file() {
        let why = installed.map_or_else(|e| e.to_string(), |out| String::from_utf8_lossy(&out.stderr).into_owned());
        let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
        assert!(!ci, "cannot install {PACKAGE} with npm (CI=true): {why}");
        return eprintln!(
            "SKIPPED probe::a_reference_server_from_npm_is_probed_over_stdio: npm install {PACKAGE}: {why}"
        );
    }
    let fixtures = dir.join("probe.json");
    std::fs::write(
        &fixtures,
        serde_json::json!({
            "delete_entities": [{ "entityNames": ["probe-{unique}"] }],
            "delete_observations": [{ "deletions": [{ "entityName": "probe-{unique}", "observations": ["seen"] }] }],
            "delete_relations": [{ "relations": [{ "from": "a-{unique}", "to": "b", "relationType": "knows" }] }]
        })
        .to_string(),
    )
    .unwrap();
    let memory = format!("MEMORY_FILE_PATH={}", dir.join("memory.jsonl").display());
    let output = probe(owned(&[
        "--stdio",
        server.to_str().unwrap(),
        "--env",
        &memory,
        "--fixtures",
        fixtures.to_str().unwrap(),
        "--count-with",
        "read_graph",
    ]))
    .await;
    let out = text(&output);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{out}");
    assert_eq!(output.status.code(), Some(0), "{out}");
    for tool in ["delete_entities", "delete_observations", "delete_relations"] {
        assert!(out.contains(&format!("→ {tool}: hint holds")), "{tool}: {out}");
    }
    assert!(out.contains("not probed: read_graph (it is the oracle)"), "{out}");
}
