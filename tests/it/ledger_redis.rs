//! The conformance suite on Redis: standalone (`IDEM_TEST_REDIS_URL`, default the local server
//! on 6379) and a Redis Cluster of three primaries and three replicas
//! (`IDEM_TEST_REDIS_CLUSTER_URL`, default the one `scripts/redis-cluster.sh up` starts, which
//! `.ci/run` does). Skipped, by name, when no server answers — a failure under `CI=true`.

use std::sync::Arc;

use idem_runtime::ledger::Ledger;
use idem_runtime::ledger::redis::RedisLedger;

const STANDALONE: &str = "redis://127.0.0.1:6379";
const CLUSTER: &str = "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

/// A ledger on the Redis `env` (or `default`) names, or `None` (reported skipped; a failure
/// under CI) when none answers.
pub(crate) async fn redis(env: &str, default: &str) -> Option<RedisLedger> {
    let test = std::thread::current().name().unwrap_or("ledger_redis").to_owned();
    let url = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    match RedisLedger::connect(&url).await {
        Ok(ledger) => Some(ledger),
        Err(error) => {
            idem_tests::skip(&test, &format!("{error}; set {env} to run it"));
            None
        }
    }
}

mod standalone {
    use super::*;

    async fn standalone() -> Option<Arc<dyn Ledger>> {
        Some(Arc::new(redis("IDEM_TEST_REDIS_URL", STANDALONE).await?))
    }

    idem_tests::ledger_conformance!(standalone);

    /// Exactly, under a prefix of the test's own.
    #[tokio::test]
    async fn stats_count_exactly() {
        let Some(ledger) = redis("IDEM_TEST_REDIS_URL", STANDALONE).await else { return };
        let prefix = format!("idem-test-{}", idem_runtime::ledger::Token::random().get());
        idem_tests::conformance::stats_count_exactly(Arc::new(ledger.with_prefix(&prefix))).await;
    }
}

mod cluster {
    use super::*;

    async fn cluster() -> Option<Arc<dyn Ledger>> {
        Some(Arc::new(redis("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await?))
    }

    idem_tests::ledger_conformance!(cluster);

    /// Exactly, under a prefix of the test's own: the count visits every primary.
    #[tokio::test]
    async fn stats_count_exactly() {
        let Some(ledger) = redis("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await else { return };
        let prefix = format!("idem-test-{}", idem_runtime::ledger::Token::random().get());
        idem_tests::conformance::stats_count_exactly(Arc::new(ledger.with_prefix(&prefix))).await;
    }
}
