//! The conformance suite on SQLite: a file (WAL, a pool of connections) and `sqlite::memory:`.

use std::sync::Arc;

use idem_runtime::ledger::Ledger;
use idem_runtime::ledger::sea::SeaOrmLedger;

/// One database file per test binary run, shared by its cases (as a server's ledger would be).
async fn file() -> Option<Arc<dyn Ledger>> {
    static LEDGER: tokio::sync::OnceCell<SeaOrmLedger> = tokio::sync::OnceCell::const_new();
    let ledger = LEDGER
        .get_or_init(|| async {
            let dir = std::env::temp_dir().join(format!("idem-sqlite-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
            SeaOrmLedger::connect(&url).await.expect("open the SQLite file")
        })
        .await;
    Some(Arc::new(ledger.clone()))
}

async fn memory() -> Option<Arc<dyn Ledger>> {
    Some(Arc::new(SeaOrmLedger::connect("sqlite::memory:").await.expect("open sqlite::memory:")))
}

mod sqlite_file {
    idem_tests::ledger_conformance!(super::file);
}

mod sqlite_memory {
    idem_tests::ledger_conformance!(super::memory);
}

/// A ledger of its own (a fresh file), so its counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_exactly() {
    let dir = std::env::temp_dir().join(format!("idem-sqlite-stats-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let ledger = SeaOrmLedger::connect(&url).await.expect("open the SQLite file");
    idem_tests::conformance::stats_count_exactly(Arc::new(ledger)).await;
    idem_tests::conformance::stats_count_exactly(memory().await.unwrap()).await;
}
