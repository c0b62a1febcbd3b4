//! The conformance suite on MySQL or MariaDB: the suite's own database on the server
//! `IDEM_TEST_MYSQL_URL` names (default the local one; see `idem_tests::databases`). Skipped, by
//! name, when no server answers — a failure under `CI=true`.

use std::sync::Arc;

use idem_runtime::ledger::Ledger;

const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

async fn mysql() -> Option<Arc<dyn Ledger>> {
    // The test thread's name is the test's path, `ledger_mysql::<case>`.
    let test = std::thread::current().name().unwrap_or("ledger_mysql").to_owned();
    idem_tests::durable(&test, "IDEM_TEST_MYSQL_URL", DEFAULT_URL).await
}

idem_tests::ledger_conformance!(mysql);
