//! The conformance suite on PostgreSQL: the suite's own database on the server `IDEM_TEST_POSTGRES_URL`
//! names (default the local one; see `idem_tests::databases`). Skipped, by name, when no server
//! answers — a failure under `CI=true`.

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
    let test = "ledger_postgres::a_restart_on_an_existing_ledger_logs_no_notices";
    let Some(url) = idem_tests::suite_database(test, "IDEM_TEST_POSTGRES_URL", DEFAULT_URL).await else { return };
    // The first start may create the tables; the second finds them.
    idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("connect to the suite's database");
    let captured = idem_tests::CapturedLog::default();
    let logging = tracing::subscriber::set_default(captured.subscriber());
    let again = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("connect again");
    drop(logging);
    let logged = captured.text();
    assert!(logged.contains("idem ledger: postgres"), "the line naming the ledger:\n{logged}");
    assert!(!logged.contains("already exists"), "notices at startup:\n{logged}");
    drop(again);
}
