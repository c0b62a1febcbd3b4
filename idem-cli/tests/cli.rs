//! The `idem` command-line tool end to end: the binary spawned as a process against a ledger
//! that an `Idem` handle in this test filled with real operations (completed, unknown), output
//! asserted — `pending`, `show`, `resolve`, `stats`, `sweep`, `tools` — and its errors: a wrong URL, a missing secret,
//! an unknown ref, a settled record. On SQLite (a temporary file, its secret file beside it) and
//! PostgreSQL (a database of the test's own on the server `IDEM_TEST_POSTGRES_URL` names, default
//! the local one; skipped loudly when unreachable, a failure under `CI=true`).
//!
//! Alone: `cargo test -p idem-cli`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, Recipe, Ref, Rejection, current_operation, secret::Secret,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ToolError {
    /// The downstream timed out: the charge may or may not have happened.
    Timeout(String),
    Rejected(String),
}

impl IdempotentError for ToolError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Timeout(_) => ErrorClass::Unknown,
            Self::Rejected(_) => ErrorClass::NothingHappened,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected(rejection.to_string())
    }
}

static CHARGE: Recipe = Recipe::new("charge_card", &["order_id"]);

/// A completed operation and an unknown one, made by `idem` as `tenant`'s alice: their refs, and
/// the idempotency key the unknown one's handler forwarded downstream.
async fn operations(idem: &Idem, tenant: &str) -> (Ref, Unknown) {
    let alice = Caller::new(tenant, "alice");
    let done = idem
        .call(&CHARGE, Some(&alice), &json!({ "order_id": "A-1" }), || async {
            Ok::<_, ToolError>(json!({ "charge": "ch_1", "amount": 4200 }))
        })
        .await
        .expect("the first charge completes");
    let mut unknown = None;
    let answer = idem
        .call(&CHARGE, Some(&alice), &json!({ "order_id": "A-2" }), || async {
            unknown = current_operation()
                .map(|operation| Unknown { reference: operation.reference(), forwarded: operation.idempotency_key() });
            Err::<Value, _>(ToolError::Timeout("the processor did not answer".to_owned()))
        })
        .await;
    assert!(matches!(answer, Err(ToolError::Timeout(_))), "{answer:?}");
    (done.reference, unknown.expect("the handler ran"))
}

/// `idem ARGS` with `env` (and nothing of this process's idem variables).
fn idem(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args).env_remove("IDEM_DATABASE_URL").env_remove("IDEM_SECRET").env_remove("IDEM_SECRET_PREVIOUS");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("spawn idem")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Succeeded, and printed one JSON object.
fn ok_json(output: &Output) -> Value {
    assert!(output.status.success(), "{:?}\nstdout: {}\nstderr: {}", output.status, stdout(output), stderr(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", stdout(output)))
}

/// Failed with `code`, saying `words` on stderr.
fn failed(output: &Output, code: i32, words: &str) {
    assert_eq!(output.status.code(), Some(code), "stdout: {}\nstderr: {}", stdout(output), stderr(output));
    assert!(stderr(output).contains(words), "expected {words:?} in: {}", stderr(output));
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-cli-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Everything an operator does on one ledger, `env` pointing at it.
/// An operation whose outcome is unknown: its ref, and the key its handler forwarded.
struct Unknown {
    reference: Ref,
    forwarded: String,
}

fn session(env: &[(&str, &str)], tenant: &str, done: &Ref, unknown: &Unknown, shared: bool) {
    let forwarded = unknown.forwarded.clone();
    let (done, unknown) = (done.to_string(), unknown.reference.to_string());

    // stats: the two operations (a shared ledger may hold more).
    let stats = ok_json(&idem(env, &["stats", "--json"]));
    let count = |name: &str| stats[name].as_u64().unwrap_or_else(|| panic!("{name} in {stats}"));
    if shared {
        assert!(count("completed") >= 1 && count("unknown") >= 1, "{stats}");
    } else {
        assert_eq!(
            (count("completed"), count("unknown"), count("in_progress"), count("failed")),
            (1, 1, 0, 0),
            "{stats}"
        );
        assert_eq!(count("total"), 2, "{stats}");
    }
    assert!(stats["oldest_unknown_ms"].as_u64().is_some(), "{stats}");
    // Issue 28, item 7: the JSON names what the text says, "with a lapsed lease".
    assert!(stats["lapsed_leases"].as_u64().is_some() && stats.get("stale").is_none(), "{stats}");
    assert!(count("size_bytes") > 0, "{stats}");
    let text = idem(env, &["stats"]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(stdout(&text).contains("unknown      ") && stdout(&text).contains("oldest claimed"), "{}", stdout(&text));

    // show: the completed one and its stored result, the unknown one and what to do next.
    let shown = ok_json(&idem(env, &["show", &done, "--tenant", tenant, "--json"]));
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["ref"], done.as_str());
    // Its address: the ref and the window's end, what a verdict names.
    let done_at = shown["address"].as_str().expect("an address").to_owned();
    assert_eq!(done_at, format!("{done}@{}", shown["window_end_ms"]), "{shown}");
    assert_eq!(ok_json(&idem(env, &["show", &done_at, "--tenant", tenant, "--json"]))["state"], "completed");
    assert_eq!(shown["result"], json!({ "ok": { "charge": "ch_1", "amount": 4200 } }), "{shown}");
    let shown = idem(env, &["show", &unknown, "--tenant", tenant]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains("state       unknown") && text.contains("idem resolve"), "{text}");
    let unknown_at = ok_json(&idem(env, &["show", &unknown, "--tenant", tenant, "--json"]))["address"]
        .as_str()
        .expect("an address")
        .to_owned();
    assert!(text.contains(&format!("idem resolve {unknown_at} --tenant")), "the hint names the address: {text}");
    // The key the handler forwarded, which the downstream system stores: what the operator
    // checks the processor for (issue 28, item 3).
    assert!(text.contains(&format!("forwarded   {forwarded}")), "show prints the forwarded key: {text}");
    let shown_json = ok_json(&idem(env, &["show", &unknown, "--tenant", tenant, "--json"]));
    assert_eq!(shown_json["idempotency_key"], json!(forwarded), "{shown_json}");
    // An address no operation has: nothing (not the operation of the same ref).
    let elsewhere = format!("{unknown}@1");
    failed(&idem(env, &["show", &elsewhere, "--tenant", tenant]), 3, "no operation");

    // Not in another tenant: refs never cross tenants.
    failed(&idem(env, &["show", &unknown, "--tenant", "other-tenant"]), 3, "no operation");
    // A ref that exists nowhere, and one that is not a ref.
    failed(&idem(env, &["show", "0000000000000000", "--tenant", tenant]), 3, "check the ref and the tenant");
    // Issue 28, item 7: after a rotation, the operation may be under a previous secret.
    failed(&idem(env, &["show", "0000000000000000", "--tenant", tenant]), 3, "IDEM_SECRET_PREVIOUS");
    let malformed = idem(env, &["show", "not-a-ref", "--tenant", tenant]);
    assert_eq!(malformed.status.code(), Some(2), "{}", stderr(&malformed));

    // pending: the unknown operation, with whose it is and which tool made it; not the
    // completed one, not in another tenant, not in progress, not old enough.
    let pending = ok_json(&idem(env, &["pending", "--tenant", tenant, "--json"]));
    assert_eq!(pending["next"], Value::Null, "{pending}");
    let listed = pending["operations"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{pending}");
    let expected = [("address", json!(unknown_at)), ("tenant", json!(tenant)), ("subject", json!("alice"))];
    for (field, value) in expected.into_iter().chain([("tool", json!("charge_card")), ("state", json!("unknown"))]) {
        assert_eq!(listed[0][field], value, "{field} in {pending}");
    }
    assert!(listed[0]["age_ms"].as_u64().is_some() && listed[0]["created_at_ms"].as_u64().is_some(), "{pending}");
    assert_eq!(listed[0]["idempotency_key"], json!(forwarded), "{pending}");
    let text = idem(env, &["pending", "--tenant", tenant]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    for word in [
        unknown_at.as_str(),
        tenant,
        "alice",
        "charge_card",
        "unknown",
        "OPERATION",
        "TOOL",
        "idem resolve",
        &forwarded,
    ] {
        assert!(text.contains(word), "{word} in:\n{text}");
    }
    assert!(!text.contains(&done), "a completed operation is not pending:\n{text}");
    if !shared {
        let everyone = ok_json(&idem(env, &["pending", "--json"]));
        assert_eq!(everyone["operations"].as_array().map(Vec::len), Some(1), "{everyone}");
    }
    for filter in [&["--state", "in-progress"][..], &["--tenant", "other-tenant"][..], &["--older-than", "1d"][..]] {
        let mut args = vec!["pending", "--json"];
        if filter[0] != "--tenant" {
            args.extend(["--tenant", tenant]);
        }
        args.extend(filter);
        let none = ok_json(&idem(env, &args));
        assert_eq!(none["operations"], json!([]), "{filter:?}: {none}");
    }
    let only_unknown = ok_json(&idem(env, &["pending", "--tenant", tenant, "--state", "unknown", "--json"]));
    assert_eq!(only_unknown["operations"][0]["ref"], json!(unknown), "{only_unknown}");
    // A page at a time: a full page gives the cursor of the next, which is empty here.
    let page = ok_json(&idem(env, &["pending", "--tenant", tenant, "--limit", "1", "--json"]));
    let cursor = page["next"].as_str().unwrap_or_else(|| panic!("a full page has a next: {page}")).to_owned();
    let rest = ok_json(&idem(env, &["pending", "--tenant", tenant, "--limit", "1", "--after", &cursor, "--json"]));
    assert_eq!((&rest["operations"], &rest["next"]), (&json!([]), &Value::Null), "{rest}");
    let text = stdout(&idem(env, &["pending", "--tenant", tenant, "--limit", "1"]));
    assert!(text.contains(&format!("--after {cursor}")), "{text}");
    // Bad input: usage errors that say what to write.
    let bad = idem(env, &["pending", "--older-than", "ten minutes"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("invalid age") && stderr(&bad).contains("15m"), "{}", stderr(&bad));
    let bad = idem(env, &["pending", "--after", "page-two"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("not a page cursor"), "{}", stderr(&bad));

    // resolve: a ref alone is refused (it may name two operations), as is an address that names
    // none; a settled record is refused, the unknown one settled; a second verdict refused.
    failed(
        &idem(env, &["resolve", &unknown, "--tenant", tenant, "--nothing-happened"]),
        2,
        "not an operation's address",
    );
    failed(&idem(env, &["resolve", &elsewhere, "--tenant", tenant, "--nothing-happened"]), 3, "no operation");
    failed(&idem(env, &["resolve", &done_at, "--tenant", tenant, "--nothing-happened"]), 4, "is completed");
    failed(&idem(env, &["resolve", &unknown_at, "--tenant", tenant, "--completed", "{not json"]), 2, "as JSON");
    let usage = idem(env, &["resolve", &unknown_at, "--tenant", tenant]);
    assert_eq!(usage.status.code(), Some(2), "a verdict is required: {}", stderr(&usage));
    // Issue 28, item 7: it says which verdicts there are, not clap's "required arguments".
    assert!(
        stderr(&usage).contains("--completed JSON") && stderr(&usage).contains("--nothing-happened"),
        "{}",
        stderr(&usage)
    );
    let resolved = ok_json(&idem(
        env,
        &["resolve", &unknown_at, "--tenant", tenant, "--completed", r#"{"charge":"ch_2"}"#, "--json"],
    ));
    // A hand-built recipe declares no result shape: the verdict is not checked, and says so.
    assert_eq!(
        resolved,
        json!({
            "operation": unknown_at, "ref": unknown, "tenant": tenant, "resolved": "completed",
            "checked": false, "corrected": false,
        })
    );
    let shown = ok_json(&idem(env, &["show", &unknown, "--tenant", tenant, "--json"]));
    assert_eq!(
        (shown["state"].as_str(), &shown["result"]),
        (Some("completed"), &json!({ "ok": { "charge": "ch_2" } }))
    );
    failed(&idem(env, &["resolve", &unknown_at, "--tenant", tenant, "--nothing-happened"]), 4, "never overwritten");
    let after = ok_json(&idem(env, &["pending", "--tenant", tenant, "--json"]));
    assert_eq!(after["operations"], json!([]), "a resolved operation is no longer pending: {after}");

    // sweep: nothing has expired yet (the records' windows are open).
    if !shared {
        assert_eq!(ok_json(&idem(env, &["sweep", "--json"])), json!({ "swept": 0 }));
        assert_eq!(ok_json(&idem(env, &["stats", "--json"]))["unknown"], 0);
    }
    // Issue 28, item 7: a batch of nothing is a usage error, not a sweep that deletes nothing.
    let nothing = idem(env, &["sweep", "--batch", "0"]);
    assert_eq!(nothing.status.code(), Some(2), "{}", stderr(&nothing));
    assert!(stderr(&nothing).contains("at least 1"), "{}", stderr(&nothing));
    let swept = idem(env, &["sweep", "--batch", "10"]);
    assert!(swept.status.success() && stdout(&swept).contains("expired records"), "{}", stderr(&swept));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_session() {
    let dir = scratch();
    let file = dir.join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let idem_handle = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let (done, unknown) = operations(&idem_handle, "acme").await;
    assert!(Path::new(&format!("{}.secret", file.display())).is_file(), "the handle made its secret beside the file");

    // Both ways of naming the ledger: the URL in the environment, a plain path as a flag.
    session(&[("IDEM_DATABASE_URL", &url)], "acme", &done, &unknown, false);
    let by_path = ok_json(&idem(
        &[],
        &["--database-url", &file.display().to_string(), "show", &done.to_string(), "--tenant", "acme", "--json"],
    ));
    assert_eq!(by_path["state"], "completed");
}

#[test]
fn errors_say_what_to_do() {
    let dir = scratch();
    // No ledger named.
    failed(&idem(&[], &["stats"]), 1, "set IDEM_DATABASE_URL");
    // A file that does not exist: never created, never shown empty.
    let missing = dir.join("typo.sqlite3").display().to_string();
    failed(&idem(&[("IDEM_DATABASE_URL", &missing)], &["stats"]), 1, "no ledger at");
    assert!(!Path::new(&missing).exists(), "idem created a ledger at a wrong path");
    // A server that does not answer.
    let unreachable = idem(&[("IDEM_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")], &["stats"]);
    failed(&unreachable, 1, "check IDEM_DATABASE_URL");
    // Issue 28, item 7: the URL came from the environment, not from code.
    assert!(!stderr(&unreachable).contains("given in code"), "{}", stderr(&unreachable));
    // In --json mode the error is also an object on stdout.
    let output = idem(&[], &["stats", "--json"]);
    let error: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(error["exit"], 1);
    assert!(error["error"].as_str().unwrap().contains("IDEM_DATABASE_URL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_is_an_error_not_a_new_secret() {
    let dir = scratch();
    let file = dir.join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let idem_handle = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let (done, _) = operations(&idem_handle, "acme").await;
    let secret_file = PathBuf::from(format!("{}.secret", file.display()));
    std::fs::remove_file(&secret_file).unwrap();
    let env = [("IDEM_DATABASE_URL", url.as_str())];
    failed(&idem(&env, &["show", &done.to_string(), "--tenant", "acme"]), 1, "set IDEM_SECRET");
    assert!(!secret_file.exists(), "idem made a new secret, which finds nothing");
    // stats and sweep need none.
    assert_eq!(ok_json(&idem(&env, &["stats", "--json"]))["completed"], 1);
    // A wrong secret under the servers' version is told apart by the ledger's check value.
    let (_, wrong) = Secret::generate(1);
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", wrong.as_str())];
    failed(&idem(&env, &["show", &done.to_string(), "--tenant", "acme"]), 1, "seen under version 1");
    // A secret of a version the servers never used finds nothing, and says which to check.
    let (_, unseen) = Secret::generate(7);
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", unseen.as_str())];
    failed(&idem(&env, &["show", &done.to_string(), "--tenant", "acme"]), 3, "that IDEM_SECRET is the servers'");
    // A malformed one says so.
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", "nonsense")];
    failed(&idem(&env, &["show", &done.to_string(), "--tenant", "acme"]), 1, "IDEM_SECRET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session() {
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    let skip = |why: String| {
        assert!(!ci, "cli::postgres_session: {why} (CI=true, so a missing server is a failure)");
        eprintln!("SKIPPED cli::postgres_session: {why}");
    };
    let base = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    // A database of its own on the server the URL names (dropped when the test ends, passed or
    // failed): what a user, an example or another test left in that database — another secret
    // kept under version 1, operations under other versions — cannot change what the CLI shows.
    let own = match OwnDatabase::make(&base, "idem_cli_session").await {
        Ok(own) => own,
        Err(error) => return skip(format!("cannot reach {base}: {error}")),
    };
    let url = own.url.clone();
    let ledger = SeaOrmLedger::connect(&url).await.expect("connect to the test's own database");
    let (secret, text) = Secret::generate(1);
    let idem_handle = Idem::builder(ledger).secret(secret).build().unwrap();
    let tenant = format!("tenant-{}", idem_runtime::ledger::Token::random().get());
    let (done, unknown) = operations(&idem_handle, &tenant).await;
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", text.as_str())];
    session(&env, &tenant, &done, &unknown, true);
    // A shared ledger keeps no secret: without IDEM_SECRET, the tool says to set it.
    failed(&idem(&env[..1], &["show", &done.to_string(), "--tenant", &tenant]), 1, "set IDEM_SECRET");
}

/// A PostgreSQL database of a test's own, `<prefix>_<random>` on the server `base` names, dropped
/// (with any session still on it) when this is dropped — also when the test fails.
struct OwnDatabase {
    base: String,
    name: String,
    url: String,
}

impl OwnDatabase {
    async fn make(base: &str, prefix: &str) -> Result<Self, sea_orm::DbErr> {
        use sea_orm::ConnectionTrait;
        let admin = sea_orm::Database::connect(base).await?;
        let name = format!("{prefix}_{}", idem_runtime::ledger::Token::random().get() % 1_000_000_000_000);
        admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
        admin.close().await?;
        let (server, _) = base.rsplit_once('/').expect("a database URL ends in /<database>");
        Ok(Self { base: base.to_owned(), url: format!("{server}/{name}"), name })
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        use sea_orm::ConnectionTrait;
        let (base, name) = (self.base.clone(), self.name.clone());
        // A runtime of its own: drop may run on the test's runtime, which cannot be blocked on.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let admin = sea_orm::Database::connect(&base).await?;
                admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
                admin.close().await
            })
        });
        if let Ok(Err(error)) = dropped.join() {
            eprintln!("cli: could not drop the test's database {}: {error}", self.name);
        }
    }
}

/// Two handlers of one tool: the ticket tool's, and the same after it moved in code.
static OLD: Recipe = Recipe::new("open_ticket", &["title"]).owner("desk::Tickets::open");
static MOVED: Recipe = Recipe::new("open_ticket", &["title"]).owner("desk::api::Tickets::open");

/// acme's alice opens the printer ticket through `recipe`'s handler.
async fn open_ticket(idem: Idem, recipe: &'static Recipe) -> Result<idem_runtime::Served<Value>, ToolError> {
    let alice = Caller::new("acme", "alice");
    idem.call(recipe, Some(&alice), &json!({ "title": "printer" }), || async { Ok::<_, ToolError>(json!("T-1")) }).await
}

/// Issue 31: the same session on the Redis ledger (`IDEM_TEST_REDIS_URL`, default the local
/// server), under a prefix of the test's own; and `idem tools` there. A Redis without the prefix's
/// keys holds no ledger: refused, as an empty database is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_session() {
    use idem_runtime::ledger::redis::RedisLedger;
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    let server = std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let url = format!("{server}?prefix=cli-{}", idem_runtime::ledger::Token::random().get());
    let empty = [("IDEM_DATABASE_URL", url.as_str())];
    if let Err(error) = RedisLedger::connect(&url).await {
        assert!(!ci, "cli::redis_session: cannot reach {url}: {error} (CI=true, so a missing server is a failure)");
        return eprintln!("SKIPPED cli::redis_session: cannot reach {url}: {error}");
    }
    failed(&idem(&empty, &["stats"]), 3, "no idem ledger");

    let ledger = RedisLedger::connect(&url).await.unwrap();
    let (secret, text) = Secret::generate(7);
    let idem_handle = Idem::builder(ledger.clone()).secret(secret.clone()).build().unwrap();
    let tenant = format!("tenant-{}", idem_runtime::ledger::Token::random().get());
    let (done, unknown) = operations(&idem_handle, &tenant).await;
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", text.as_str())];
    session(&env, &tenant, &done, &unknown, false);

    // Two handlers of one tool: listed, and forgotten. Each handler runs in a process of its own
    // (its own connection): clones of one ledger are one ledger, whose catalogue refuses the
    // second handler in this process before the ledger records it.
    let call = open_ticket;
    let build = || async {
        let ledger = RedisLedger::connect(&url).await.unwrap();
        Idem::builder(ledger).secret(secret.clone()).build().unwrap()
    };
    call(build().await, &OLD).await.expect("the first handler runs");
    call(build().await, &MOVED).await.expect_err("a second handler is refused");
    let listed = ok_json(&idem(&env, &["tools", "--json"]));
    let tools = listed["tools"].as_array().expect("tools");
    let handlers: Vec<_> = tools.iter().filter(|t| t["tool"] == "open_ticket").map(|t| t["handler"].clone()).collect();
    assert_eq!(handlers, [json!("desk::Tickets::open"), json!("desk::api::Tickets::open")], "{listed}");
    let forgot = ok_json(&idem(&env, &["tools", "forget", "default", "open_ticket", "--json"]));
    assert_eq!(forgot["forgotten"], 2, "{forgot}");
    assert_eq!(call(build().await, &MOVED).await.expect("the moved handler runs").value, json!("T-1"));
}

/// `idem tools` lists the handler each tool is served by and marks two; `idem tools forget`
/// lets a handler moved in code serve its tool again (issue 26, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_lists_handlers_and_forgets_a_moved_one() {
    let dir = scratch();
    let file = dir.join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let call = open_ticket;
    let old = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    call(old.clone(), &OLD).await.expect("the first handler runs");
    // The moved handler, in a new process (its own connection): another path, refused.
    let moved = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let refused = call(moved, &MOVED).await.expect_err("a second handler is refused");
    assert!(format!("{refused:?}").contains("idem tools forget default open_ticket"), "{refused:?}");

    let env = [("IDEM_DATABASE_URL", url.as_str())];
    let listed = idem(&env, &["tools"]);
    let text = stdout(&listed);
    assert!(text.contains("desk::Tickets::open") && text.contains("desk::api::Tickets::open"), "{text}");
    assert!(text.contains("two handlers: refused"), "{text}");
    let listed = ok_json(&idem(&env, &["tools", "--json"]));
    assert_eq!(listed["tools"].as_array().map(Vec::len), Some(2), "{listed}");
    let forgot = ok_json(&idem(&env, &["tools", "forget", "default", "open_ticket", "--json"]));
    assert_eq!(forgot["forgotten"], 2, "{forgot}");

    // Once the old build is gone, the moved handler serves the tool (a restarted process).
    let moved = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    assert_eq!(call(moved, &MOVED).await.expect("the moved handler runs").value, json!("T-1"));
    let listed = ok_json(&idem(&env, &["tools", "--json"]));
    assert_eq!(listed["tools"][0]["handler"], "desk::api::Tickets::open", "{listed}");
}

/// Issue 28, item 4: pointed at a database that holds no idem ledger — a mistyped name — the CLI
/// says so and exits non-zero, and creates nothing there (it only reads and settles: an
/// operator's role needs no DDL rights).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_database_is_refused_and_left_empty() {
    use sea_orm::{ConnectionTrait, Database};
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    let server =
        std::env::var("IDEM_TEST_POSTGRES_SERVER").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let admin = match Database::connect(format!("{server}/postgres")).await {
        Ok(admin) => admin,
        Err(error) => {
            assert!(!ci, "cli::an_empty_database_is_refused_and_left_empty: cannot reach {server}: {error}");
            return eprintln!(
                "SKIPPED cli::an_empty_database_is_refused_and_left_empty: cannot reach {server}: {error}"
            );
        }
    };
    let name = format!("idem_cli_empty_{}", idem_runtime::ledger::Token::random().get() % 1_000_000_000);
    admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await.expect("create an empty database");
    let url = format!("{server}/{name}");
    let (_, secret) = Secret::generate(1);
    let env = [("IDEM_DATABASE_URL", url.as_str()), ("IDEM_SECRET", secret.as_str())];
    let commands = [
        &["stats"][..],
        &["pending", "--json"][..],
        &["sweep"][..],
        &["show", "0000000000000000", "--tenant", "acme"][..],
    ];
    let outputs: Vec<_> = commands.into_iter().map(|args| (args, idem(&env, args))).collect();
    let empty = Database::connect(&url).await.expect("the empty database");
    let tables = empty
        .query_one_raw(sea_orm::Statement::from_string(
            empty.get_database_backend(),
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        ))
        .await
        .expect("count the tables")
        .expect("a count")
        .try_get_by_index::<i64>(0)
        .expect("a number");
    empty.close().await.expect("close");
    // Dropped before anything is asserted, so a failure leaves no database behind.
    admin.execute_unprepared(&format!("DROP DATABASE {name}")).await.expect("drop the database");
    for (args, output) in outputs {
        assert_eq!(output.status.code(), Some(3), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains("no idem ledger in this database"), "{args:?}: {}", stderr(&output));
    }
    assert_eq!(tables, 0, "the CLI created tables in a database that held no ledger");
    // Issue 28, item 7: a database that does not exist is named so, without PostgreSQL's
    // source line ("… does not exist at line 948").
    let missing = idem(&[("IDEM_DATABASE_URL", &format!("{server}/{name}_missing"))], &["stats"]);
    failed(&missing, 1, &format!("database \"{name}_missing\" does not exist. Check that"));
    assert!(!stderr(&missing).contains(" at line "), "{}", stderr(&missing));
}

/// What the operator's verdict must look like, end to end: a charge's result is a typed receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

/// Runs on each call of [`charge_card`]: the downstream's count of charges, and whether the
/// next one times out.
static CHARGES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[idem_runtime::idempotent(key = "order_id", ignore = "time_out", idem = idem, caller = Caller::new("acme", "alice"))]
async fn charge_card(idem: &Idem, order_id: String, time_out: bool) -> Result<Receipt, ToolError> {
    let _ = (idem, &order_id);
    CHARGES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if time_out {
        return Err(ToolError::Timeout("the processor did not answer".to_owned()));
    }
    Ok(Receipt { charge_id: "ch_1".to_owned(), amount_cents: 4200 })
}

/// Issue 28, item 1: a "completed" verdict of the wrong shape bricked the operation (every
/// repeat refused as unreadable, no second verdict allowed, nothing showing the shape). Now
/// `show` prints the shape and the tool, a misfit verdict is refused with nothing stored, the
/// right one replays; and a misfit stored before the shape was known — which no repeat could
/// read — is corrected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_must_fit_the_result_and_a_misfit_one_can_be_corrected() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = scratch();
    let file = dir.join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let env = [("IDEM_DATABASE_URL", url.as_str())];
    let server = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let timed_out = charge_card(&server, "A-1".to_owned(), true).await;
    assert!(matches!(timed_out, Err(ToolError::Timeout(_))), "{timed_out:?}");
    let pending = ok_json(&idem(&env, &["pending", "--json"]));
    let address = pending["operations"][0]["address"].as_str().expect("the unknown charge").to_owned();

    let shown = idem(&env, &["show", &address, "--tenant", "acme"]);
    let text = stdout(&shown);
    assert!(text.contains("tool        charge_card") && text.contains("subject     alice"), "{text}");
    assert!(text.contains(r#"expects     {"amount_cents": integer, "charge_id": string}"#), "{text}");

    // The README's verdict, of another shape: refused, and nothing stored.
    let misfit = idem(&env, &["resolve", &address, "--tenant", "acme", "--completed", r#"{"charge":"ch_2"}"#]);
    failed(
        &misfit,
        2,
        r#"the verdict does not fit charge_card's result, so no repeat could read it: the result lacks the member "charge_id""#,
    );
    assert!(
        stderr(&misfit).contains(r#"It expects {"amount_cents": integer, "charge_id": string}"#),
        "{}",
        stderr(&misfit)
    );
    assert_eq!(ok_json(&idem(&env, &["show", &address, "--tenant", "acme", "--json"]))["state"], "unknown");

    // The right shape lands, and a repeat replays it without charging again.
    let right = r#"{"charge_id":"ch_2","amount_cents":4200}"#;
    let resolved = ok_json(&idem(&env, &["resolve", &address, "--tenant", "acme", "--completed", right, "--json"]));
    assert_eq!((resolved["resolved"].as_str(), resolved["checked"].as_bool()), (Some("completed"), Some(true)));
    let charges = CHARGES.load(SeqCst);
    let repeat = charge_card(&server, "A-1".to_owned(), false).await.expect("the verdict replays");
    assert_eq!(repeat, Receipt { charge_id: "ch_2".to_owned(), amount_cents: 4200 });
    assert_eq!(CHARGES.load(SeqCst), charges, "the repeat was answered from the verdict, not charged again");

    // A ledger from before shapes were kept: a misfit verdict goes in unchecked, and every
    // repeat is refused as unreadable...
    let timed_out = charge_card(&server, "A-2".to_owned(), true).await;
    assert!(matches!(timed_out, Err(ToolError::Timeout(_))), "{timed_out:?}");
    let pending = ok_json(&idem(&env, &["pending", "--json"]));
    let address = pending["operations"][0]["address"].as_str().expect("the second unknown charge").to_owned();
    let db = sea_orm::Database::connect(&url).await.unwrap();
    sea_orm::ConnectionTrait::execute_unprepared(&db, "DELETE FROM idem_tool_facts").await.unwrap();
    let unchecked = idem(&env, &["resolve", &address, "--tenant", "acme", "--completed", r#"{"charge":"ch_3"}"#]);
    assert!(unchecked.status.success(), "{}", stderr(&unchecked));
    assert!(
        stdout(&unchecked).contains("declared no result shape, so the verdict was not checked"),
        "{}",
        stdout(&unchecked)
    );
    let refused = charge_card(&server, "A-2".to_owned(), false).await.expect_err("an unreadable verdict");
    assert!(format!("{refused:?}").contains("its stored result cannot be read"), "{refused:?}");
    // ...until a server of this version starts (and keeps the shape): the operator sees the
    // misfit and corrects it, since no repeat was ever answered with it.
    let restarted = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    charge_card(&restarted, "A-1".to_owned(), false).await.expect("a replay, which keeps the tool's facts");
    let text = stdout(&idem(&env, &["show", &address, "--tenant", "acme"]));
    assert!(text.contains("its result does not fit the shape, so every repeat is refused as unreadable"), "{text}");
    let corrected = idem(&env, &["resolve", &address, "--tenant", "acme", "--completed", right]);
    assert!(stdout(&corrected).contains("corrected"), "{}\n{}", stdout(&corrected), stderr(&corrected));
    let charges = CHARGES.load(SeqCst);
    let repeat = charge_card(&restarted, "A-2".to_owned(), false).await.expect("the corrected verdict replays");
    assert_eq!(repeat.charge_id, "ch_2");
    assert_eq!(CHARGES.load(SeqCst), charges, "answered from the corrected verdict");
    // A readable verdict is never replaced: a repeat may have been answered with it.
    let again = idem(
        &env,
        &["resolve", &address, "--tenant", "acme", "--completed", r#"{"charge_id":"ch_9","amount_cents":1}"#],
    );
    failed(&again, 4, "a settled record is never overwritten");
}

/// Issue 28, item 7: right after a holder died and its `hold` tool flipped the operation to
/// "unknown", `pending --json` said `lease_expired: false` beside a `lease_until_ms` in the past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_json_says_a_lease_in_the_past_expired() {
    let dir = scratch();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let ledger = SeaOrmLedger::connect(&url).await.unwrap();
    let server = Idem::builder(ledger).lease(std::time::Duration::from_millis(60)).build().unwrap();
    let alice = Caller::new("acme", "alice");
    let args = json!({ "order_id": "K-1" });
    // The holder dies mid-call: its task is gone, its lease is never renewed.
    let holder = {
        let (server, alice, args) = (server.clone(), alice.clone(), args.clone());
        tokio::spawn(async move {
            server
                .call(&CHARGE, Some(&alice), &args, || async {
                    std::future::pending::<()>().await;
                    Ok::<Value, ToolError>(Value::Null)
                })
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    holder.abort();
    // Another replica repeats the call once the dead holder's lease has lapsed.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let other = Idem::builder(SeaOrmLedger::connect(&url).await.unwrap())
        .lease(std::time::Duration::from_millis(60))
        .build()
        .unwrap();
    let repeat = other.call(&CHARGE, Some(&alice), &args, || async { Ok::<Value, ToolError>(Value::Null) }).await;
    assert!(format!("{repeat:?}").contains("outcome unknown"), "{repeat:?}");
    let pending = ok_json(&idem(&[("IDEM_DATABASE_URL", &url)], &["pending", "--json"]));
    let operation = &pending["operations"][0];
    assert_eq!(operation["state"], "unknown", "{pending}");
    let now =
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    assert!(operation["lease_until_ms"].as_u64().unwrap() < now, "{pending}");
    assert_eq!(operation["lease_expired"], true, "{pending}");
    assert_eq!(operation["holder_dead"], false, "unknown, not in progress: nobody holds it: {pending}");
}

/// Issue 28, item 7: `show`'s "next" line told the operator to resolve even an operation of a
/// `takeover` tool, which recovers by itself once its dead holder's lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_says_a_takeover_tool_recovers_by_itself() {
    static SHIP: Recipe = Recipe::new("ship_parcel", &["parcel"]).stale(idem_runtime::StalePolicy::Takeover);
    let dir = scratch();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let server = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let holder = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .call(&SHIP, Some(&Caller::new("acme", "alice")), &json!({ "parcel": "P-1" }), || async {
                    std::future::pending::<()>().await;
                    Ok::<Value, ToolError>(Value::Null)
                })
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    holder.abort();
    let env = [("IDEM_DATABASE_URL", url.as_str())];
    let pending = ok_json(&idem(&env, &["pending", "--json"]));
    let address = pending["operations"][0]["address"].as_str().expect("the running operation").to_owned();
    let text = stdout(&idem(&env, &["show", &address, "--tenant", "acme"]));
    assert!(
        text.contains("next        nothing to do: its tool recovers a dead holder's operation by itself"),
        "{text}"
    );
    assert!(!text.contains("idem resolve"), "{text}");
}

/// POSTs to `path` at `address` as alice under `key`, over a plain HTTP/1.1 connection: the
/// status line of the answer.
async fn post_raw(address: std::net::SocketAddr, path: &str, key: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\nidempotency-key: \"{key}\"\r\nx-user: alice\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    );
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    });
    answer.await.unwrap().lines().next().unwrap_or_default().to_owned()
}

/// Issue 42, item 5: an HTTP route's operation was kept with no result shape — `show` said a
/// verdict is not checked, and `resolve --completed '{"export":"done"}'` made every retry a 500.
/// Now `show` prints the stored response's shape and an example verdict, a verdict of another
/// shape is refused naming it, and the example lands; for a tool without a shape, `show` says
/// plainly that nothing is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_an_http_routes_shape_and_an_example_verdict() {
    use idem_runtime::http::{IdempotencyLayer, Route};
    let dir = scratch();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let env = [("IDEM_DATABASE_URL", url.as_str())];
    let server = Idem::new(SeaOrmLedger::connect(&url).await.unwrap());
    let principal = |parts: &http::request::Parts| {
        let user = parts.headers.get("x-user")?.to_str().ok()?;
        Caller::try_new("shop", user).ok()
    };
    // An answer too large to store: the export's outcome is unknown.
    let layer = IdempotencyLayer::new(server.clone(), principal)
        .namespace("exports")
        .route(http::Method::POST, "/exports", Route::new())
        .max_response_bytes(16);
    let app = axum::Router::new().route("/exports", axum::routing::post(|| async { "x".repeat(64) })).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    assert_eq!(post_raw(address, "/exports", "e-1").await, "HTTP/1.1 200 OK");
    assert_eq!(post_raw(address, "/exports", "e-1").await, "HTTP/1.1 409 Conflict", "outcome unknown");
    let pending = ok_json(&idem(&env, &["pending", "--json", "--tenant", "shop"]));
    let address_of = pending["operations"][0]["address"].as_str().expect("the unknown export").to_owned();

    let text = stdout(&idem(&env, &["show", &address_of, "--tenant", "shop"]));
    assert!(text.contains("tool        POST /exports"), "{text}");
    let pair = r#""headers": [[string, string]], "status": integer from 100 to 599"#;
    let shape = format!(r#"expects     {{{pair}, "text": string}} | {{"base64": string (base64), {pair}}}"#);
    assert!(text.contains(&shape), "{text}");
    let example = r#"{"headers":[["content-type","application/json"]],"status":200,"text":"{\"ok\":true}"}"#;
    assert!(text.contains(&format!("example     {example}")), "{text}");
    let shown = ok_json(&idem(&env, &["show", &address_of, "--tenant", "shop", "--json"]));
    assert_eq!(shown["example"].to_string(), example);

    let misfit = idem(&env, &["resolve", &address_of, "--tenant", "shop", "--completed", r#"{"export":"done"}"#]);
    failed(&misfit, 2, r#"the verdict does not fit POST /exports's result"#);
    assert!(stderr(&misfit).contains(&format!("It expects {{{pair}, ")), "{}", stderr(&misfit));
    let resolved =
        ok_json(&idem(&env, &["resolve", &address_of, "--tenant", "shop", "--completed", example, "--json"]));
    assert_eq!((resolved["resolved"].as_str(), resolved["checked"].as_bool()), (Some("completed"), Some(true)));
    assert_eq!(post_raw(address, "/exports", "e-1").await, "HTTP/1.1 200 OK", "the verdict replays");

    // A tool whose result has no schema: nothing is checked, and `show` says so.
    let (_, unknown) = operations(&server, "acme").await;
    let text = stdout(&idem(&env, &["show", &unknown.reference.to_string(), "--tenant", "acme"]));
    assert!(text.contains("expects     anything: nothing is checked"), "{text}");
    assert!(!text.contains("example "), "{text}");
}
