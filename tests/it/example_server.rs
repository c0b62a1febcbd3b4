//! The example server's first minute as an operator meets it (issue 28, item 6): `--help` is help,
//! not an error; a startup failure is said in words with what to set, never in Rust's debug
//! syntax (`Required { ledger: … }`, `In { place: …, error: TooShort { … } }`).

use std::process::{Command, Output};

fn server(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(idem_tests::example_binary("mcp_server"));
    command.args(args).env_remove("IDEM_SECRET").env_remove("IDEM_SECRET_PREVIOUS").env("RUST_LOG", "off");
    for (name, value) in env {
        command.env(name, value);
    }
    command.stdin(std::process::Stdio::null()).output().expect("run the example server")
}

#[test]
fn help_is_help() {
    let output = server(&[], &["--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    for word in ["usage:", "--http", "--processor-delay-ms", "--metrics", "IDEM_DATABASE_URL", "IDEM_SECRET"] {
        assert!(text.contains(word), "{word} in:\n{text}");
    }
}

#[test]
fn a_startup_failure_says_what_to_set() {
    let dir = std::env::temp_dir().join(format!("idem-example-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("ledger.sqlite3").display().to_string();
    let malformed = server(
        &[
            ("IDEM_DATABASE_URL", &ledger),
            ("IDEM_SECRET", &format!("1:{}", "ab".repeat(32))),
            ("IDEM_SECRET_PREVIOUS", "2:abcd"),
        ],
        &[],
    );
    let unknown_flag = server(&[("IDEM_DATABASE_URL", &ledger)], &["--frobnicate"]);
    std::fs::remove_dir_all(&dir).ok();
    for (what, output, words) in [
        ("a malformed previous secret", &malformed, "IDEM_SECRET_PREVIOUS"),
        ("an unknown flag", &unknown_flag, "--help"),
    ] {
        let text = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{what}: {text}");
        assert!(text.contains(words), "{what}: {words} in {text}");
        assert!(!text.contains(" { ") && !text.contains("\"),"), "{what}: Rust debug syntax in {text}");
    }
}

/// On a shared database without a secret, the error names `IDEM_SECRET` and how to make one.
#[tokio::test]
async fn a_missing_secret_on_a_shared_ledger_says_how_to_set_it() {
    let test = "example_server::a_missing_secret_on_a_shared_ledger_says_how_to_set_it";
    let (env, default) = idem_tests::POSTGRES;
    let Some(url) = idem_tests::suite_database(test, env, default).await else { return };
    let output = server(&[("IDEM_DATABASE_URL", &url)], &[]);
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("IDEM_SECRET=1:") && text.contains("openssl rand -hex 32"), "{text}");
    assert!(!text.contains("Required {"), "Rust debug syntax: {text}");
}

/// A line-delimited MCP client over a spawned server's stdin and stdout (read on a thread of
/// its own, so a server that never answers fails the test instead of hanging it).
struct Stdio {
    child: std::process::Child,
    input: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Stdio {
    fn start(ledger: &str, args: &[&str]) -> Self {
        Self::start_with(ledger, args, &[])
    }

    /// As [`Stdio::start`], with `env` set too.
    fn start_with(ledger: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        use std::process::Stdio as Pipe;
        let mut child = Command::new(idem_tests::example_binary("mcp_server"))
            .args(args)
            .env("IDEM_DATABASE_URL", ledger)
            .env_remove("IDEM_SECRET")
            .env_remove("IDEM_SECRET_PREVIOUS")
            .envs(env.iter().copied())
            .env("RUST_LOG", "off")
            .stdin(Pipe::piped())
            .stdout(Pipe::piped())
            .stderr(Pipe::null())
            .spawn()
            .expect("start the example server");
        let input = child.stdin.take().expect("its stdin");
        let output = std::io::BufReader::new(child.stdout.take().expect("its stdout"));
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in output.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let mut client = Self { child, input, lines };
        client.send(
            0,
            "initialize",
            &serde_json::json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "idem-test", "version": "0.0.0" }
            }),
        );
        assert!(client.answer(0).get("result").is_some(), "initialized");
        client.write(&serde_json::json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        client
    }

    fn write(&mut self, message: &serde_json::Value) {
        use std::io::Write;
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.input.write_all(&line).unwrap();
        self.input.flush().unwrap();
    }

    fn send(&mut self, id: u64, method: &str, params: &serde_json::Value) {
        self.write(&serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
    }

    /// The answer to request `id`; `None` if the server closed its stdout first.
    fn answer(&mut self, id: u64) -> serde_json::Value {
        self.try_answer(id).unwrap_or_else(|| panic!("the server closed its stdout before answering request {id}"))
    }

    /// The answer to request `id`; `None` if the server closed its stdout first, or said
    /// nothing for 20 s.
    fn try_answer(&mut self, id: u64) -> Option<serde_json::Value> {
        while let Ok(line) = self.lines.recv_timeout(std::time::Duration::from_secs(20)) {
            let message: serde_json::Value = serde_json::from_str(&line).ok()?;
            if message["id"].as_u64() == Some(id) {
                return Some(message);
            }
        }
        None
    }
}

/// Issue 28, item 2: SIGTERM — what systemd and Kubernetes send on every rolling restart —
/// while a charge is running. The server drains: the running charge finishes, its caller gets
/// its receipt, the process exits cleanly, and after the restart a repeat is replayed from the
/// ledger. (Before, the process died within the charge and left its record "in progress" for an
/// operator to resolve.)
#[cfg(unix)]
#[test]
fn sigterm_mid_charge_leaves_the_charge_completed_and_replayable() {
    let dir = std::env::temp_dir().join(format!("idem-drain-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("ledger.sqlite3").display().to_string();
    let charge =
        serde_json::json!({ "name": "charge_card", "arguments": { "card": "tok_visa", "amount_cents": 4200 } });

    let mut first = Stdio::start(&ledger, &["--processor-delay-ms", "1500"]);
    first.send(1, "tools/call", &charge);
    // The charge is under way (the processor takes 1.5 s): stop the server now.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let killed = Command::new("kill").args(["-TERM", &first.child.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let answered = first.try_answer(1);
    drop(first.input);
    let exited = first.child.wait().expect("the server exits");

    let mut second = Stdio::start(&ledger, &[]);
    second.send(1, "tools/call", &charge);
    let repeat = second.answer(1);
    drop(second.input);
    let _ = second.child.wait();
    std::fs::remove_dir_all(&dir).ok();

    let answered = answered.expect("the running charge was answered before the server stopped");
    assert_eq!(answered["result"]["isError"], serde_json::json!(false), "{answered}");
    assert!(exited.success(), "a drained server exits cleanly: {exited:?}");
    let outcome = &repeat["result"]["_meta"]["dev.idem/outcome"];
    assert_eq!(outcome["replayed"], serde_json::json!(true), "the repeat after the restart is replayed: {repeat}");
    assert_eq!(repeat["result"]["structuredContent"], answered["result"]["structuredContent"], "the same receipt");
}

/// Issue 31: the payments example on the Redis ledger (`IDEM_DATABASE_URL=redis://…`, under a
/// prefix of the test's own). A repeat is replayed — also by a second server process, so the
/// record lives in Redis, not in the process; without `IDEM_SECRET` the server says to set it.
#[test]
fn the_payments_example_runs_on_the_redis_ledger() {
    let redis = std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let url = format!("{redis}?prefix=example-{}", idem_runtime::ledger::Token::random().get());
    let no_secret = server(&[("IDEM_DATABASE_URL", &url)], &[]);
    let text = String::from_utf8_lossy(&no_secret.stderr);
    if text.contains("no Redis answers") {
        let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
        assert!(!ci, "example_server: no Redis at {url} (CI=true): {text}");
        return eprintln!("SKIPPED example_server::the_payments_example_runs_on_the_redis_ledger: {text}");
    }
    assert_eq!(no_secret.status.code(), Some(1), "{text}");
    assert!(text.contains("IDEM_SECRET=1:"), "{text}");

    let secret = [("IDEM_SECRET", "1:5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e")];
    let charge = serde_json::json!({ "name": "charge_card", "arguments": { "card": "tok_visa", "amount_cents": 990 } });
    let mut first = Stdio::start_with(&url, &[], &secret);
    first.send(1, "tools/call", &charge);
    let ran = first.answer(1);
    first.send(2, "tools/call", &charge);
    let again = first.answer(2);
    drop(first.input);
    let _ = first.child.wait();
    let mut second = Stdio::start_with(&url, &[], &secret);
    second.send(1, "tools/call", &charge);
    let elsewhere = second.answer(1);
    drop(second.input);
    let _ = second.child.wait();

    assert_eq!(ran["result"]["isError"], serde_json::json!(false), "{ran}");
    assert_eq!(ran["result"]["_meta"]["dev.idem/outcome"]["replayed"], serde_json::json!(false), "{ran}");
    for repeat in [&again, &elsewhere] {
        assert_eq!(repeat["result"]["_meta"]["dev.idem/outcome"]["replayed"], serde_json::json!(true), "{repeat}");
        assert_eq!(repeat["result"]["structuredContent"], ran["result"]["structuredContent"], "the same receipt");
    }
}

/// The processor example (issue 29): a card processor behind `IdempotencyLayer`, as a process. A
/// retry with the same key is the first answer, marked, and one charge; the same key with another
/// body is 422; no key is 400; another merchant's identical request is its own charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processor_example_charges_once_per_key() {
    // Its ledger and charges in a file of the test's own (by default they would outlive it).
    let dir = std::env::temp_dir().join(format!("idem-processor-{}", idem_runtime::ledger::Token::random().get()));
    let mut child = Command::new(idem_tests::example_binary("processor"))
        .args(["--http", "127.0.0.1:0"])
        .env("IDEM_DATABASE_URL", dir.join("processor.sqlite3"))
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the processor");
    let base = served_at(&mut child, "serving on ");
    let client = reqwest::Client::new();
    let charge = |merchant: &str, key: Option<&str>, amount: u64| {
        let mut request = client
            .post(format!("{base}/charges"))
            .header("authorization", format!("Bearer {merchant}"))
            .json(&serde_json::json!({ "card": "tok_visa", "amount_cents": amount }));
        if let Some(key) = key {
            request = request.header("idempotency-key", format!("\"{key}\""));
        }
        request.send()
    };
    let first = charge("acme", Some("order-42"), 4200).await.unwrap();
    assert_eq!(first.status(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    assert_eq!((first["charge_id"].as_str(), first["reference"].as_str()), (Some("ch_1"), Some("order-42")));
    let retry = charge("acme", Some("order-42"), 4200).await.unwrap();
    assert_eq!((retry.status().as_u16(), retry.headers()["idempotent-replayed"].to_str().unwrap()), (201, "true"));
    assert_eq!(retry.json::<serde_json::Value>().await.unwrap(), first);
    assert_eq!(charge("acme", Some("order-42"), 9900).await.unwrap().status(), 422);
    assert_eq!(charge("acme", None, 4200).await.unwrap().status(), 400);
    assert_eq!(charge("globex", Some("order-42"), 4200).await.unwrap().status(), 201);
    let listed: serde_json::Value = client
        .get(format!("{base}/charges"))
        .header("authorization", "Bearer acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "acme was charged once: {listed}");
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// The address a process's log names (`… serving … http://ADDR…`, the word after `marker`), its
/// log read (and the rest of it drained) on a thread of its own.
///
/// # Panics
/// The process ends, or [`idem_tests::WAIT`] passes, before it logs `marker`.
fn served_at(child: &mut std::process::Child, marker: &str) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("the process's stderr, piped");
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let deadline = std::time::Instant::now() + idem_tests::WAIT;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(line) => {
                if let Some((_, rest)) = line.split_once(marker) {
                    return rest.split_whitespace().next().unwrap_or_default().to_owned();
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("the process logged no `{marker}` within {:?}", idem_tests::WAIT)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the process ended ({:?}) without logging `{marker}`", child.try_wait())
            }
        }
    }
}

/// One MCP tool call over streamable HTTP (a session of its own): the call's `result`.
async fn mcp_call(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> serde_json::Value {
    let post = |body: serde_json::Value, session: Option<&str>| {
        let mut request = client
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {token}"))
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let hello = serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "idem-test", "version": "0" } } });
    let answer = post(hello, None).await.unwrap();
    let session = answer.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    answer.bytes().await.unwrap();
    post(serde_json::json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }), Some(&session)).await.unwrap();
    let call = serde_json::json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "name": tool, "arguments": arguments } });
    let body = post(call, Some(&session)).await.unwrap().text().await.unwrap();
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<serde_json::Value>(data.trim()).ok())
        .find(|message| message["id"] == 2)
        .map(|message| message["result"].clone())
        .unwrap_or_else(|| panic!("no answer in {body}"))
}

/// Issue 29, item 3: the payments example charges through the processor example when given its
/// URL, forwarding each operation's key as `Idempotency-Key` — the processor's record of the
/// charge carries the key the MCP receipt names; a repeat is replayed and charges nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_example_charges_through_the_processor_example() {
    let dir = std::env::temp_dir().join(format!("idem-payments-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut processor = Command::new(idem_tests::example_binary("processor"))
        .args(["--http", "127.0.0.1:0"])
        .env("IDEM_DATABASE_URL", dir.join("processor.sqlite3"))
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the processor");
    let processor_url = served_at(&mut processor, "serving on ");
    let mut payments = Command::new(idem_tests::example_binary("mcp_server"))
        .args(["--http", "127.0.0.1:0", "--processor", &processor_url])
        .env("IDEM_DATABASE_URL", dir.join("ledger.sqlite3"))
        .env_remove("IDEM_SECRET")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the payments example");
    let mcp = served_at(&mut payments, "serving streamable HTTP at ");
    let client = reqwest::Client::new();
    let charge = serde_json::json!({ "card": "tok_visa", "amount_cents": 4200 });
    let first = mcp_call(&client, &mcp, "acme:alice", "charge_card", charge.clone()).await;
    let receipt = &first["structuredContent"];
    let reference = receipt["reference"].as_str().expect("a receipt").to_owned();
    assert_eq!(reference.len(), 64, "the forwarded idempotency key: {first}");
    let again = mcp_call(&client, &mcp, "acme:alice", "charge_card", charge).await;
    assert_eq!(&again["structuredContent"], receipt, "the repeat is replayed: {again}");
    let charges: serde_json::Value =
        client.get(format!("{processor_url}/charges")).bearer_auth("acme").send().await.unwrap().json().await.unwrap();
    assert_eq!(charges.as_array().map(Vec::len), Some(1), "one charge at the processor: {charges}");
    assert_eq!(charges[0]["reference"], reference, "under the key the MCP operation forwarded");
    for mut child in [payments, processor] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}
