//! The conformance suite on PostgreSQL (`IDEM_TEST_POSTGRES_URL`, default the local `test`
//! database). Skipped, by name, when no server answers — a failure under `CI=true`.

use std::sync::Arc;

use idem_runtime::ledger::Ledger;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

async fn postgres() -> Option<Arc<dyn Ledger>> {
    // The test thread's name is the test's path, `ledger_postgres::<case>`.
    let test = std::thread::current().name().unwrap_or("ledger_postgres").to_owned();
    idem_tests::durable(&test, "IDEM_TEST_POSTGRES_URL", DEFAULT_URL).await
}

idem_tests::ledger_conformance!(postgres);

/// Issue 28, item 7: starting a replica on a ledger that exists logs no PostgreSQL notices
/// ("relation … already exists, skipping" came five times, at INFO, on every start).
#[tokio::test]
async fn a_restart_on_an_existing_ledger_logs_no_notices() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    // The first start may create the tables; the second finds them.
    if let Err(error) = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await {
        let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
        assert!(!ci, "ledger_postgres: no server at {url} (CI=true): {error}");
        return eprintln!("SKIPPED ledger_postgres::a_restart_on_an_existing_ledger_logs_no_notices: {error}");
    }
    let captured = idem_tests::CapturedLog::default();
    let logging = tracing::subscriber::set_default(captured.subscriber());
    let again = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("connect again");
    drop(logging);
    let logged = captured.text();
    assert!(logged.contains("idem ledger: postgres"), "the line naming the ledger:\n{logged}");
    assert!(!logged.contains("already exists"), "notices at startup:\n{logged}");
    drop(again);
}
