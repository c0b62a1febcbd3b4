//! The conformance suite on the in-memory ledger.

use std::sync::Arc;

use idem_runtime::MemoryLedger;
use idem_runtime::ledger::Ledger;

async fn memory() -> Option<Arc<dyn Ledger>> {
    Some(Arc::new(MemoryLedger::new()))
}

idem_tests::ledger_conformance!(memory);

#[tokio::test]
async fn stats_count_exactly() {
    idem_tests::conformance::stats_count_exactly(Arc::new(MemoryLedger::new())).await;
}
