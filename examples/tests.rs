//! The examples' unit tests, and the README's rmcp sample: it is `examples/tickets.rs`, byte for
//! byte (the example is compiled and unit-tested, so this check is what keeps the README's server
//! compilable), and it serves over stdio as its reader runs it.

// The examples as modules, so their `#[cfg(test)]` tests run here; as `[[example]]`s they are
// built as programs (which `the_readme_server_serves_over_stdio` and `it::mcp_e2e` start).
#[allow(dead_code, reason = "their `main`s, and what only `main` uses")]
#[path = "mcp_server.rs"]
mod mcp_server;
#[allow(dead_code, reason = "its `main`, and what only `main` uses")]
#[path = "tickets.rs"]
mod tickets;

use std::path::Path;

const MARKER: &str = "<!-- examples/tickets.rs -->";

/// The fenced ```rust block right after the marker comment.
fn readme_sample(readme: &str) -> Option<&str> {
    fenced(readme, MARKER, "```rust\n")
}

/// The fenced block opened by `fence` right after `marker`.
fn fenced<'a>(readme: &'a str, marker: &str, fence: &str) -> Option<&'a str> {
    let after_marker = &readme[readme.find(marker)? + marker.len()..];
    let body = after_marker.trim_start_matches(['\r', '\n']).strip_prefix(fence)?;
    body.find("\n```\n").map(|end| &body[..=end])
}

#[test]
fn the_readme_rmcp_sample_is_the_tickets_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).expect("README.md is readable");
    let example = std::fs::read_to_string(format!("{root}/tickets.rs")).expect("examples/tickets.rs is readable");
    let sample = readme_sample(&readme).unwrap_or_else(|| panic!("README.md has no ```rust block after `{MARKER}`"));
    if sample != example {
        let line = sample.lines().zip(example.lines()).position(|(a, b)| a != b).map_or_else(
            || format!("the first {} lines agree; one is longer", sample.lines().count().min(example.lines().count())),
            |index| format!("line {} differs", index + 1),
        );
        panic!("README.md's rmcp sample and examples/tickets.rs differ ({line}): copy the example into the README");
    }
}

/// The README's server, run as its reader runs it (`cargo run --example tickets`): over stdio,
/// an agent's repeated `open_ticket` opens one ticket, and the repeat is a replay a model can see.
#[test]
fn the_readme_server_serves_over_stdio() {
    // target/<profile>/deps/examples-<hash> → target/<profile>/examples/tickets
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe.parent().and_then(Path::parent).expect("the test binary lives in target/<profile>/deps");
    let server = profile.join("examples").join(format!("tickets{}", std::env::consts::EXE_SUFFIX));
    assert!(
        server.is_file(),
        "the example server {} is missing: build it with `cargo build --example tickets` (`cargo test --workspace` \
         builds examples too), then run this test again",
        server.display()
    );
    serves_over_stdio(&server);
}

/// A fresh crate made of the README alone — its `[dependencies]` block (idem-runtime from this
/// checkout instead of the registry) and its server, verbatim — builds and serves. It builds in
/// a target folder of its own (`target/readme-crate`), so later runs are incremental.
#[test]
fn a_fresh_crate_from_the_readme_builds_and_serves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md is readable");
    let dependencies = fenced(&readme, "<!-- a fresh crate's dependencies -->", "```toml\n")
        .expect("README.md has a ```toml block after `<!-- a fresh crate's dependencies -->`");
    let published = r#"idem-runtime = { version = "0.1","#;
    assert!(dependencies.contains(published), "the README's dependencies name idem-runtime as `{published} …`");
    let local = format!(r#"idem-runtime = {{ path = {:?},"#, root.join("idem-runtime"));
    let dependencies = dependencies.replace(published, &local);
    let sample = readme_sample(&readme).expect("README.md has the tickets sample");

    let folder = root.join("target").join("readme-crate");
    let krate = folder.join("tickets-from-readme");
    std::fs::create_dir_all(krate.join("src")).expect("make the fresh crate's folder");
    let manifest = format!(
        "[package]\nname = \"tickets-from-readme\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         # Not a member of the idem workspace around it.\n[workspace]\n\n{dependencies}"
    );
    std::fs::write(krate.join("Cargo.toml"), manifest).expect("write its Cargo.toml");
    std::fs::write(krate.join("src").join("main.rs"), sample).expect("write its main.rs");
    // The versions this checkout is tested with, so the build needs nothing new.
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).expect("copy Cargo.lock");

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let built = std::process::Command::new(cargo)
        .args(["build", "--quiet"])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", folder.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo build in the fresh crate");
    assert!(
        built.status.success(),
        "the README's server does not build as a fresh crate ({}):\n{}",
        krate.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let server =
        folder.join("target").join("debug").join(format!("tickets-from-readme{}", std::env::consts::EXE_SUFFIX));
    serves_over_stdio(&server);
}

/// Starts `server` and speaks MCP to it over stdio: two identical `open_ticket` calls open one
/// ticket, the second answer is a replay that says so in its text, and `idem_status` is listed.
fn serves_over_stdio(server: &Path) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    let mut child = Command::new(server)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the tickets server");
    let mut stdin = child.stdin.take().expect("its stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("its stdout"));
    let mut request = |id: u64, method: &str, params: serde_json::Value| -> serde_json::Value {
        let message = serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        writeln!(stdin, "{message}").expect("write a request");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the answer");
        if method == "initialize" {
            let initialized = serde_json::json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
            writeln!(stdin, "{initialized}").expect("write the notification");
        }
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not a JSON-RPC answer ({error}): {line:?}"))
    };

    let init = request(
        1,
        "initialize",
        serde_json::json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "readme", "version": "0" } }),
    );
    assert!(init["result"]["capabilities"]["tools"].is_object(), "{init}");
    let listed = request(2, "tools/list", serde_json::json!({}));
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().expect("tools").iter().filter_map(|tool| tool["name"].as_str()).collect();
    assert!(names.contains(&"open_ticket") && names.contains(&"idem_status"), "{listed}");

    let open = serde_json::json!({ "name": "open_ticket", "arguments": { "project": "billing", "title": "Refund", "body": "Card charged twice" } });
    let first = request(3, "tools/call", open.clone());
    let again = request(4, "tools/call", open);
    assert_eq!(first["result"]["structuredContent"]["id"], 1, "{first}");
    assert_eq!(again["result"]["structuredContent"]["id"], 1, "the repeat replays ticket 1: {again}");
    let text = again["result"]["content"].to_string();
    assert!(text.contains("nothing was executed again"), "the replay says so to the model: {again}");
    let list = request(5, "tools/call", serde_json::json!({ "name": "list_tickets", "arguments": {} }));
    assert_eq!(list["result"]["structuredContent"]["tickets"].as_array().map(Vec::len), Some(1), "one ticket: {list}");

    drop(stdin);
    let status = child.wait().expect("the server exits when stdin closes");
    assert!(status.success(), "{status}");
}

/// `mcp_server --metrics 127.0.0.1:0`, spoken to over stdio: after a call and its repeat, its
/// `/metrics` page (Prometheus's text format) counts one claim and one replay of the tool, with
/// the help text `idem_runtime::metrics::describe` gave it, and times the claims.
#[test]
fn the_mcp_server_serves_its_metrics() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};

    // target/<profile>/deps/examples-<hash> → target/<profile>/examples/mcp_server
    let exe = std::env::current_exe().expect("this test's path");
    let profile = exe.parent().and_then(Path::parent).expect("the target profile folder");
    let server = profile.join("examples").join(format!("mcp_server{}", std::env::consts::EXE_SUFFIX));
    let folder = std::env::temp_dir().join(format!("idem-metrics-example-{}", std::process::id()));
    std::fs::create_dir_all(&folder).expect("a folder for the ledger");
    let mut child = Command::new(&server)
        .args(["--metrics", "127.0.0.1:0"])
        .env("IDEM_DATABASE_URL", folder.join("ledger.sqlite3"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("start {} ({error}): `cargo test` builds it", server.display()));

    // The log names the metrics page; the rest of it is passed on to this test's stderr.
    let (found, address) = std::sync::mpsc::channel();
    let log = BufReader::new(child.stderr.take().expect("its stderr"));
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Some(rest) = line.split("metrics at http://").nth(1) {
                let _ = found.send(rest.trim_end_matches("/metrics").to_owned());
            }
        }
    });
    let address = address.recv_timeout(std::time::Duration::from_secs(30)).expect(
        "the server logs where its metrics are within 30 s (it exited or hung instead: is it built? `cargo build \
         --example mcp_server`)",
    );

    let mut stdin = child.stdin.take().expect("its stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("its stdout"));
    let mut request = |id: u64, method: &str, params: serde_json::Value| -> serde_json::Value {
        let message = serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        writeln!(stdin, "{message}").expect("write a request");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the answer");
        if method == "initialize" {
            let initialized = serde_json::json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
            writeln!(stdin, "{initialized}").expect("write the notification");
        }
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not a JSON-RPC answer ({error}): {line:?}"))
    };
    let client = serde_json::json!({ "name": "metrics-test", "version": "0" });
    request(
        1,
        "initialize",
        serde_json::json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client }),
    );
    let order = format!("order-{}", std::process::id());
    let ship =
        serde_json::json!({ "name": "create_shipment", "arguments": { "order_id": order, "address": "1 Main St" } });
    let first = request(2, "tools/call", ship.clone());
    let again = request(3, "tools/call", ship);
    assert_eq!(first["result"]["structuredContent"], again["result"]["structuredContent"], "{first} {again}");

    let mut page = String::new();
    let mut connection = std::net::TcpStream::connect(&address).expect("connect to the metrics page");
    write!(connection, "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").expect("ask");
    connection.read_to_string(&mut page).expect("read the metrics page");
    let sample = |outcome: &str| {
        page.lines()
            .find(|line| {
                line.starts_with("idem_calls_total{")
                    && line.contains("tool=\"create_shipment\"")
                    && line.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|line| line.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(sample("claimed").as_deref(), Some("1"), "{page}");
    assert_eq!(sample("replayed").as_deref(), Some("1"), "{page}");
    assert!(page.contains("# HELP idem_calls_total"), "described: {page}");
    assert!(page.contains("idem_claim_duration_seconds"), "claims are timed: {page}");

    drop(stdin);
    let status = child.wait().expect("the server exits when stdin closes");
    assert!(status.success(), "{status}");
}
