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

const MARKER: &str = "<!-- examples/tickets.rs -->";

/// The fenced ```rust block right after the marker comment.
fn readme_sample(readme: &str) -> Option<&str> {
    let after_marker = &readme[readme.find(MARKER)? + MARKER.len()..];
    let body = after_marker.trim_start_matches(['\r', '\n']).strip_prefix("```rust\n")?;
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
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    // target/<profile>/deps/readme_sample-<hash> → target/<profile>/examples/tickets
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile =
        exe.parent().and_then(std::path::Path::parent).expect("the test binary lives in target/<profile>/deps");
    let server = profile.join("examples").join(format!("tickets{}", std::env::consts::EXE_SUFFIX));
    assert!(
        server.is_file(),
        "the example server {} is missing: build it with `cargo build --example tickets` (`cargo test --workspace` \
         builds examples too), then run this test again",
        server.display()
    );
    let mut child = Command::new(&server)
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
        if method == "initialize" {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read the answer");
            let initialized = serde_json::json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
            writeln!(stdin, "{initialized}").expect("write the notification");
            return serde_json::from_str(&line).expect("a JSON-RPC answer");
        }
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the answer");
        serde_json::from_str(&line).expect("a JSON-RPC answer")
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
