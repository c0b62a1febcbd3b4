//! The processor example as a real HTTP service (issue 42, item 9), driven as processes: its
//! charges and its ledger are durable in one database — a SQLite file survives a SIGKILL and a
//! restart, and a SIGTERM drains the charge under way — and two processes on one PostgreSQL
//! database are one processor: a key sent to both is charged once. `--help` publishes the
//! idempotency policy.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The secret both processes on the shared database key with (`version:hex`).
const SECRET: &str = "1:5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// A running processor at a loopback port of its own, with its log: killed and reaped when
/// dropped, so no test path leaves it behind.
struct Processor {
    name: &'static str,
    child: Child,
    url: String,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// Every line read so far, for a failure's message.
    log: Vec<String>,
}

impl Processor {
    /// Starts the processor on `database` (`IDEM_DATABASE_URL`) with `args` and `env`.
    fn spawn(name: &'static str, database: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        let mut command = Command::new(idem_tests::example_binary("processor"));
        command
            .args(["--http", "127.0.0.1:0"])
            .args(args)
            .env("IDEM_DATABASE_URL", database)
            .env_remove("IDEM_SECRET")
            .env_remove("IDEM_SECRET_PREVIOUS")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (variable, value) in env {
            command.env(variable, value);
        }
        let mut child = command.spawn().unwrap_or_else(|error| panic!("start processor {name}: {error}"));
        let stderr = child.stderr.take().expect("stderr, piped");
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        Self { name, child, url: String::new(), lines, log: Vec::new() }
    }

    /// Waits until the processor says where it serves.
    async fn serving(mut self) -> Self {
        let line = self.logged(&["serving on "]).await;
        let (_, rest) = line.split_once("serving on ").expect("the marker");
        self.url = rest.split_whitespace().next().unwrap_or_default().to_owned();
        self
    }

    /// Starts the processor and waits until it serves.
    async fn start(name: &'static str, database: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(name, database, args, env).serving().await
    }

    /// The next log line holding every one of `words`.
    ///
    /// # Panics
    /// The process ends first, or [`idem_tests::WAIT`] passes: with its log.
    async fn logged(&mut self, words: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + idem_tests::WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.log.push(line.clone());
                    if words.iter().all(|word| line.contains(word)) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "processor {} ended ({:?}) without logging {words:?}; its log:\n{}",
                    self.name,
                    self.child.try_wait(),
                    self.log.join("\n")
                ),
                Err(_) => panic!(
                    "processor {} logged no {words:?} within {:?}; its log:\n{}",
                    self.name,
                    idem_tests::WAIT,
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Its whole log, once it has ended.
    ///
    /// # Panics
    /// Its log is not closed within [`idem_tests::WAIT`].
    async fn whole_log(&mut self) -> String {
        while let Some(line) = idem_tests::within("the end of the log", self.lines.recv()).await {
            self.log.push(line);
        }
        self.log.join("\n")
    }

    /// SIGTERM: what systemd and Kubernetes send.
    fn terminate(&self) {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("run kill");
        assert!(sent.success(), "kill -TERM {}: {sent:?}", self.child.id());
    }

    /// How the process ended.
    ///
    /// # Panics
    /// It has not ended within [`idem_tests::WAIT`].
    async fn exited(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + idem_tests::WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("the process's status") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "processor {} did not exit within {:?}; its log:\n{}",
                self.name,
                idem_tests::WAIT,
                self.log.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, and reaped.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One answer of the processor.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    body: Value,
}

/// `POST /charges` for `merchant` under the raw header value `key` (quoted or bare).
async fn charge(client: &reqwest::Client, url: &str, merchant: &str, key: &str, amount_cents: u64) -> Answer {
    let request = client
        .post(format!("{url}/charges"))
        .bearer_auth(merchant)
        .header("idempotency-key", key)
        .json(&serde_json::json!({ "card": "tok_visa", "amount_cents": amount_cents }))
        .send();
    let response = idem_tests::within(&format!("POST {url}/charges under {key}"), request)
        .await
        .unwrap_or_else(|error| panic!("POST {url}/charges under {key}: {error}"));
    let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let replayed = header("idempotent-replayed").is_some_and(|value| value == "true");
    let retry_after = header("retry-after").and_then(|value| value.parse().ok());
    let status = response.status().as_u16();
    let body = idem_tests::within("the response's body", response.json()).await.unwrap_or(Value::Null);
    Answer { status, replayed, retry_after, body }
}

/// `charge`, retried after `Retry-After` while the request is in progress elsewhere (409 with
/// `Retry-After`), until it is answered otherwise.
///
/// # Panics
/// Still in progress after [`idem_tests::WAIT`] and the last `Retry-After`.
async fn charge_until_answered(
    client: &reqwest::Client,
    url: &str,
    merchant: &str,
    key: &str,
    amount_cents: u64,
) -> Answer {
    let started = tokio::time::Instant::now();
    loop {
        let answer = charge(client, url, merchant, key, amount_cents).await;
        let (409, Some(seconds)) = (answer.status, answer.retry_after) else { return answer };
        assert!(
            started.elapsed() < idem_tests::WAIT,
            "{key} at {url} was still in progress after {:?}: {answer:?}",
            idem_tests::WAIT
        );
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    }
}

/// `GET /charges` for `merchant`.
async fn charges(client: &reqwest::Client, url: &str, merchant: &str) -> Vec<Value> {
    let request = client.get(format!("{url}/charges")).bearer_auth(merchant).send();
    let response = idem_tests::within(&format!("GET {url}/charges"), request).await.expect("GET /charges");
    assert_eq!(response.status(), 200, "GET {url}/charges");
    let listed: Value = idem_tests::within("the charges", response.json()).await.expect("a JSON list");
    listed.as_array().cloned().unwrap_or_else(|| panic!("not a list: {listed}"))
}

/// How many of `charges` were made under `reference`.
fn under(charges: &[Value], reference: &str) -> usize {
    charges.iter().filter(|charge| charge["reference"] == reference).count()
}

/// A merchant of this run's own, so nothing an earlier run or another test left is counted.
fn merchant() -> String {
    format!("m{}", idem_runtime::ledger::Token::random().get())
}

#[test]
fn help_publishes_the_options_and_the_idempotency_policy() {
    let run = |args: &[&str]| {
        Command::new(idem_tests::example_binary("processor"))
            .args(args)
            .env("RUST_LOG", "off")
            .env("IDEM_DATABASE_URL", "/nonexistent/never-opened.sqlite3")
            .stdin(Stdio::null())
            .output()
            .expect("run the processor")
    };
    let help = run(&["--help"]);
    assert_eq!(help.status.code(), Some(0), "{}", String::from_utf8_lossy(&help.stderr));
    let text = String::from_utf8_lossy(&help.stdout);
    for words in [
        "usage:",
        "--http ADDR",
        "--delay-ms N",
        "IDEM_DATABASE_URL",
        "IDEM_SECRET",
        "24 hours",
        "Idempotent-Replayed: true",
        "201 charged, 402 declined",
        "not stored",
        "503",
        "SIGTERM",
    ] {
        assert!(text.contains(words), "{words} in:\n{text}");
    }
    let unknown = run(&["--frobnicate"]);
    let text = String::from_utf8_lossy(&unknown.stderr);
    assert_eq!(unknown.status.code(), Some(1), "{text}");
    assert!(text.contains("--frobnicate") && text.contains("--help"), "{text}");
    assert!(!text.contains(" { ") && !text.contains("\"),"), "Rust debug syntax in {text}");
}

/// On a SQLite file: a charge survives a SIGKILL; a SIGTERM lets the charge under way finish,
/// answer and be recorded before the process exits 0; after a restart on the same file, retries
/// are the stored answers, replayed, and `GET /charges` shows one charge per key.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_survive_a_kill_a_drain_and_a_restart_on_a_sqlite_file() {
    let dir = std::env::temp_dir().join(format!("idem-processor-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let database = dir.join("processor.sqlite3").display().to_string();
    let client = reqwest::Client::new();
    let merchant = merchant();

    // A charge under a bare key, and one under a quoted key with an escape; then SIGKILL.
    let mut first = Processor::start("first", &database, &[], &[]).await;
    let charged = charge(&client, &first.url, &merchant, "order-42", 4200).await;
    assert_eq!((charged.status, charged.replayed), (201, false), "{charged:?}");
    assert_eq!(charged.body["reference"], "order-42", "the key, as the client sent it: {charged:?}");
    let escaped = charge(&client, &first.url, &merchant, r#""ord\"er-44""#, 4400).await;
    assert_eq!((escaped.status, escaped.body["reference"].as_str()), (201, Some(r#"ord"er-44"#)), "{escaped:?}");
    first.kill();

    // A slow charge under way when SIGTERM arrives: answered, recorded, and the process exits 0.
    let mut second = Processor::start("second", &database, &["--delay-ms", "1500"], &[]).await;
    let running = tokio::spawn({
        let (client, url, merchant) = (client.clone(), second.url.clone(), merchant.clone());
        async move { charge(&client, &url, &merchant, "\"order-43\"", 4300).await }
    });
    second.logged(&["charging", "order-43"]).await;
    second.terminate();
    let drained =
        idem_tests::within("the charge under way when SIGTERM came", running).await.expect("the request task");
    let exited = second.exited().await;
    assert_eq!((drained.status, drained.replayed), (201, false), "the charge under way was answered: {drained:?}");
    assert!(exited.success(), "a drained processor exits 0: {exited:?}; its log:\n{}", second.log.join("\n"));

    // Restarted on the same file: every retry is its stored answer, and each key charged once.
    let third = Processor::start("third", &database, &[], &[]).await;
    for (key, first) in [("order-42", &charged), ("\"order-42\"", &charged), ("order-43", &drained)] {
        let retry = charge(&client, &third.url, &merchant, key, first.body["amount_cents"].as_u64().unwrap()).await;
        assert_eq!((retry.status, retry.replayed), (201, true), "{key} after the restart: {retry:?}");
        assert_eq!(retry.body, first.body, "{key}: the first answer");
    }
    let conflict = charge(&client, &third.url, &merchant, "order-42", 9900).await;
    assert_eq!(conflict.status, 422, "the same key with another body: {conflict:?}");
    let listed = charges(&client, &third.url, &merchant).await;
    assert_eq!(listed.len(), 3, "three keys, three charges: {listed:?}");
    for reference in ["order-42", "order-43", r#"ord"er-44"#] {
        assert_eq!(under(&listed, reference), 1, "one charge under {reference}: {listed:?}");
    }
    drop(third);
    std::fs::remove_dir_all(&dir).ok();
}

/// Two processes on one PostgreSQL database are one processor: the same key sent to both, one
/// after the other and then at once, is charged once, and every other answer is that charge,
/// replayed (or, while it runs, a 409 whose `Retry-After` leads to the replay). Without
/// `IDEM_SECRET` the processor refuses to start on the shared database, saying how to set it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_postgres_database_charge_once_per_key() {
    let test = "processor_service::two_processes_on_one_postgres_database_charge_once_per_key";
    let (env, default) = idem_tests::POSTGRES;
    let Some(database) = idem_tests::suite_database(test, env, default).await else { return };

    let mut unkeyed = Processor::spawn("without a secret", &database, &[], &[]);
    let status = unkeyed.exited().await;
    let said = unkeyed.whole_log().await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("IDEM_SECRET=1:") && said.contains("openssl rand -hex 32"), "{said}");

    // Started together: both make sure of the charges' table at once.
    let secret = [("IDEM_SECRET", SECRET)];
    let (a, b) = (
        Processor::spawn("a", &database, &["--delay-ms", "300"], &secret),
        Processor::spawn("b", &database, &["--delay-ms", "300"], &secret),
    );
    let (a, b) = (a.serving().await, b.serving().await);
    let client = reqwest::Client::new();
    let merchant = merchant();

    // One after the other.
    let first = charge(&client, &a.url, &merchant, "order-1", 1000).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let second = charge_until_answered(&client, &b.url, &merchant, "\"order-1\"", 1000).await;
    assert_eq!((second.status, second.replayed), (201, true), "the other process replays: {second:?}");
    assert_eq!(second.body, first.body, "the first answer");

    // At once: four requests, two to each process.
    let urls = [&a.url, &b.url, &a.url, &b.url];
    let answers = futures_join(urls.map(|url| {
        let (client, url, merchant) = (client.clone(), url.clone(), merchant.clone());
        tokio::spawn(async move { charge_until_answered(&client, &url, &merchant, "order-2", 2000).await })
    }))
    .await;
    let fresh: Vec<&Answer> = answers.iter().filter(|answer| !answer.replayed).collect();
    assert_eq!(fresh.len(), 1, "one request charged, the others were replayed: {answers:?}");
    for answer in &answers {
        assert_eq!(answer.status, 201, "{answers:?}");
        assert_eq!(answer.body, fresh[0].body, "one charge's answer: {answers:?}");
    }

    let (from_a, from_b) = (charges(&client, &a.url, &merchant).await, charges(&client, &b.url, &merchant).await);
    assert_eq!(from_a, from_b, "both processes show what really happened");
    assert_eq!(from_a.len(), 2, "two keys, two charges: {from_a:?}");
    assert_eq!((under(&from_a, "order-1"), under(&from_a, "order-2")), (1, 1), "{from_a:?}");
    assert_ne!(from_a[0]["charge_id"], from_a[1]["charge_id"], "charge ids are unique across processes");
}

/// The outputs of `tasks`, in order.
///
/// # Panics
/// A task panicked (its panic is the failure), or one is not done within [`idem_tests::WAIT`].
async fn futures_join<T: Send + 'static, const N: usize>(tasks: [tokio::task::JoinHandle<T>; N]) -> Vec<T> {
    let mut outputs = Vec::with_capacity(N);
    for task in tasks {
        outputs.push(idem_tests::within("a concurrent request", task).await.expect("the request's task"));
    }
    outputs
}
