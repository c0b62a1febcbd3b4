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

    /// Exactly, under a prefix of the test's own; and the memory its hashes take.
    #[tokio::test]
    async fn stats_count_exactly() {
        let Some(ledger) = redis("IDEM_TEST_REDIS_URL", STANDALONE).await else { return };
        let prefix = format!("idem-test-{}", idem_runtime::ledger::Token::random().get());
        let ledger = Arc::new(ledger.with_prefix(&prefix));
        idem_tests::conformance::stats_count_exactly(ledger.clone()).await;
        let size = ledger.stats(0).await.unwrap().size_bytes;
        assert!(size.is_some_and(|bytes| bytes > 0), "the hashes' memory on their nodes: {size:?}");
    }
}

mod cluster {
    use super::*;

    async fn cluster() -> Option<Arc<dyn Ledger>> {
        Some(Arc::new(redis("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await?))
    }

    idem_tests::ledger_conformance!(cluster);

    /// Exactly, under a prefix of the test's own: the count (and the memory) visits every primary.
    #[tokio::test]
    async fn stats_count_exactly() {
        let Some(ledger) = redis("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await else { return };
        let prefix = format!("idem-test-{}", idem_runtime::ledger::Token::random().get());
        let ledger = Arc::new(ledger.with_prefix(&prefix));
        idem_tests::conformance::stats_count_exactly(ledger.clone()).await;
        let size = ledger.stats(0).await.unwrap().size_bytes;
        assert!(size.is_some_and(|bytes| bytes > 0), "the hashes' memory on their nodes: {size:?}");
    }
}

/// A Redis that may evict keys under memory pressure is refused at startup, with what to set:
/// an evicted record would let a repeat run again. (A server of the test's own, on a free port,
/// so no other test meets its policy.)
#[tokio::test]
async fn an_evicting_server_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"])
        .stdout(std::process::Stdio::null())
        .spawn();
    let Ok(mut server) = started else {
        return idem_tests::skip("ledger_redis::an_evicting_server_is_refused", "no redis-server on this machine");
    };
    let url = format!("redis://127.0.0.1:{port}");
    let mut refused = None;
    for _ in 0..50 {
        match RedisLedger::connect(&url).await {
            Err(error) if error.to_string().contains("no Redis answers") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            answer => {
                refused = Some(answer);
                break;
            }
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let error = refused.expect("the server started").expect_err("an evicting server is refused").to_string();
    assert!(error.contains("volatile-lru") && error.contains("maxmemory-policy noeviction"), "{error}");
}

/// A result whose answer was lost — here because no replica acknowledged it in time — is sent
/// again by the handle; the ledger must recognise its own completion and wait for the replicas
/// again, never answer "fenced" (the handle would then stop recording a result that a failover
/// can still lose: found by the long failover run with `wait=1` and a lagging replica, where an
/// acknowledged result was lost and the charge ran again). Without `wait`, the same resend is
/// simply done.
#[tokio::test]
async fn a_completion_sent_again_is_recognised_and_waited_for_again() {
    use idem_runtime::ledger::{Claim, ClaimRequest, LedgerError, Outcome, State, Token};
    let Some(plain) = redis("IDEM_TEST_REDIS_URL", STANDALONE).await else { return };
    let prefix = format!("idem-test-{}", Token::random().get());
    let plain = plain.with_prefix(&prefix);
    // The machine's standalone Redis has no replica: every wait for one times out.
    let waiting = plain.clone().wait_for_replicas(1, std::time::Duration::from_millis(50));
    let now = plain.now().await.unwrap().unwrap();
    let request = ClaimRequest {
        key: idem_runtime::Key::from_bytes(Token::random().get().to_le_bytes().repeat(4).try_into().unwrap()),
        tenant: idem_runtime::scope::TenantTag::from_bytes([1; 8]),
        subject: idem_runtime::scope::SubjectTag::TENANT,
        fingerprint: [2; 32],
        arg_tags: Vec::new(),
        token: Token::random(),
        now,
        window_end: now + 60_000,
        expires_at: now + 120_000,
        lease_until: now + 10_000,
        stale: idem_runtime::StalePolicy::Takeover,
        clock_trusted: true,
        label: None,
    };
    assert!(matches!(plain.claim(&request).await.unwrap(), Claim::Won { .. }));
    let result = Outcome::Completed(b"charged".to_vec());
    for attempt in ["first", "again"] {
        let answer = waiting.complete(&request.key, request.token, result.clone(), now + 60_000).await;
        assert!(matches!(answer, Err(LedgerError::Ambiguous { .. })), "{attempt}: {answer:?}");
    }
    plain.complete(&request.key, request.token, result, now + 60_000).await.expect("recognised without wait");
    let report = plain.lookup(&request.key, now).await.unwrap().expect("the record");
    assert_eq!((report.state, report.result.as_deref()), (State::Completed, Some(&b"charged"[..])));
    // Another outcome under the same token is not this completion: refused.
    let other = plain.complete(&request.key, request.token, Outcome::Failed, now + 60_000).await;
    assert_eq!(other, Err(LedgerError::Fenced));
}
