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
