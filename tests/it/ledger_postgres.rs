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
    use std::sync::Mutex;
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let url = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    // The first start may create the tables; the second finds them.
    if let Err(error) = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await {
        let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
        assert!(!ci, "ledger_postgres: no server at {url} (CI=true): {error}");
        return eprintln!("SKIPPED ledger_postgres::a_restart_on_an_existing_ledger_logs_no_notices: {error}");
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let logging = tracing::subscriber::set_default(subscriber);
    let again = idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("connect again");
    drop(logging);
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("idem ledger: postgres"), "the line naming the ledger:\n{logged}");
    assert!(!logged.contains("already exists"), "notices at startup:\n{logged}");
    drop(again);
}
