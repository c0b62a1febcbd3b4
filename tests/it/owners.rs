//! Two different handlers never share an operation (issue 26, item 1): `Orders::create` and
//! `Invoices::create`, both keyed on `id`, on two handles over one ledger and in two processes
//! over one SQLite file and one PostgreSQL database. Once both have been seen, both are refused,
//! whichever came first; a handler pinned with `name = "..."` is another tool and runs.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::Caller;
use idem_runtime::ledger::Token;
use idem_tests::owners::{Invoices, Orders, Receipts, ServiceError};

/// A namespace of this run's own: the owners a shared database recorded in earlier runs (or
/// other tests) stay out of it.
fn fresh_namespace() -> String {
    format!("owners-{:016x}", Token::random().get())
}

fn refused(answer: &Result<String, ServiceError>) -> &str {
    match answer {
        Err(ServiceError::Refused { code, message }) if code == "duplicate_tool" => message,
        other => panic!("expected a duplicate_tool refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn two_handles_over_one_ledger_never_share_an_operation() {
    for (name, ledger) in idem_tests::every_ledger("two_handles_over_one_ledger_never_share_an_operation").await {
        let namespace = fresh_namespace();
        let handle = || {
            idem_tests::builder(ledger.clone())
                .namespace(namespace.clone())
                .local_caller(Caller::new("owners", "test"))
                .build()
                .unwrap()
        };
        let orders = Orders { idem: handle(), ran: AtomicUsize::new(0) };
        let invoices = Invoices { idem: handle(), ran: AtomicUsize::new(0) };
        let receipts = Receipts { idem: handle(), ran: AtomicUsize::new(0) };

        assert_eq!(orders.create("42".into()).await, Ok("order 42 #1".to_owned()), "{name}");
        // The invoice handler is another handler: it is refused, not handed the order's result.
        let answer = invoices.create("42".into()).await;
        let message = refused(&answer).to_owned();
        assert_eq!(invoices.ran.load(Ordering::SeqCst), 0, "{name}: the invoice handler never ran");
        for words in ["idem_tests::owners::Orders::create", "idem_tests::owners::Invoices::create", "name = \""] {
            assert!(message.contains(words), "{name}: the refusal names both handlers and the fix: {message}");
        }
        // And so is the first one from now on: the outcome does not hang on which came first.
        let answer = orders.create("43".into()).await;
        refused(&answer);
        assert_eq!(orders.ran.load(Ordering::SeqCst), 1, "{name}");
        // A handler pinned under another name is another tool.
        assert_eq!(receipts.create("42".into()).await, Ok("receipt 42 #1".to_owned()), "{name}");
    }
}

/// One `owners_child` process: its line of output.
fn child(url: &str, namespace: &str, service: &str, id: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_owners_child"))
        .args([url, namespace, service, id])
        .output()
        .expect("run owners_child");
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(!stdout.starts_with("ERROR"), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[tokio::test]
async fn two_processes_over_one_ledger_never_share_an_operation() {
    let dir = std::env::temp_dir().join(format!("idem-owners-{:016x}", Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let mut urls = vec![("sqlite", format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display()))];
    let postgres = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    if idem_tests::durable(
        "two_processes_over_one_ledger_never_share_an_operation",
        "IDEM_TEST_POSTGRES_URL",
        &postgres,
    )
    .await
    .is_some()
    {
        urls.push(("postgres", postgres));
    }
    for (name, url) in urls {
        let namespace = fresh_namespace();
        let first = child(&url, &namespace, "orders", "42");
        assert_eq!(first, "DONE order 42 #1 RAN 1", "{name}");
        // Another binary of the package (here: another process) with the other handler.
        let second = child(&url, &namespace, "invoices", "42");
        assert!(second.starts_with("REFUSED duplicate_tool") && second.ends_with("RAN 0"), "{name}: {second}");
        // A restarted orders process is refused too: both handlers, whichever started first.
        let third = child(&url, &namespace, "orders", "43");
        assert!(third.starts_with("REFUSED duplicate_tool") && third.ends_with("RAN 0"), "{name}: {third}");
    }
}
