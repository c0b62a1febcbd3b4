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

/// A key prefix of the case's own: what a user or an example left under the default prefix
/// (`idem`) on the same server — another secret's check values, its records — neither fails the
/// suite nor is swept by it (issue 41, item 5).
fn own_prefix() -> String {
    format!("idem-test-{}", idem_runtime::ledger::Token::random().get())
}

/// Every ledger a call-path behaviour must hold on: [`idem_tests::every_ledger`]'s (memory,
/// SQLite, PostgreSQL, MariaDB) and the standalone Redis under a prefix of its own (each left
/// out, reported skipped, without its server — a failure under CI).
pub(crate) async fn every_ledger_and_redis(test: &str) -> Vec<(&'static str, Arc<dyn Ledger>)> {
    let mut ledgers = idem_tests::every_ledger(test).await;
    if let Some((redis, _)) = standalone_of_its_own().await {
        ledgers.push(("redis", Arc::new(redis)));
    }
    ledgers
}

/// The standalone server (`IDEM_TEST_REDIS_URL`) under a prefix of the test's own, and that
/// prefix; `None` (reported skipped; a failure under CI) when no server answers.
async fn standalone_of_its_own() -> Option<(RedisLedger, String)> {
    let prefix = own_prefix();
    Some((redis("IDEM_TEST_REDIS_URL", STANDALONE).await?.with_prefix(&prefix), prefix))
}

mod standalone {
    use super::*;

    async fn standalone() -> Option<Arc<dyn Ledger>> {
        Some(Arc::new(redis("IDEM_TEST_REDIS_URL", STANDALONE).await?.with_prefix(&own_prefix())))
    }

    idem_tests::ledger_conformance!(standalone);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_sweeps_report_only_what_they_removed() {
        super::concurrent_sweeps_report_only_what_they_removed("IDEM_TEST_REDIS_URL", STANDALONE).await;
    }

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
        Some(Arc::new(redis("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await?.with_prefix(&own_prefix())))
    }

    idem_tests::ledger_conformance!(cluster);

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_sweeps_report_only_what_they_removed() {
        super::concurrent_sweeps_report_only_what_they_removed("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER).await;
    }

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

/// A claim of a new random key, as a handle would send it at `now` (a minute's window, a 10 s
/// lease, stale holders taken over).
fn claim_request(now: u64) -> idem_runtime::ledger::ClaimRequest {
    use idem_runtime::ledger::Token;
    idem_runtime::ledger::ClaimRequest {
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
    }
}

/// Four sweeps at once — each on a ledger, and connections, of its own — over 400 records past
/// their retention report 400 removed between them, and none is left. A sweep whose
/// compare-and-set lost to another's took the hash it then read (the other's deletion, which
/// looks exactly like its own) for its own write, and counted it: four sweeps of 400 records
/// reported up to 1,600 (issue 41, item 4; red first).
async fn concurrent_sweeps_report_only_what_they_removed(env: &str, default: &str) {
    use idem_runtime::ledger::{Claim, Token};
    const RECORDS: usize = 400;
    let Some(first) = redis(env, default).await else { return };
    let prefix = format!("idem-test-{}", Token::random().get());
    let first = first.with_prefix(&prefix);
    let now = first.now().await.unwrap().unwrap();
    let requests: Vec<_> = (0..RECORDS).map(|_| claim_request(now)).collect();
    for request in &requests {
        assert!(matches!(first.claim(request).await.unwrap(), Claim::Won { .. }));
    }
    // Past every record's retention (two minutes) and lease; within the hashes' TTLs.
    let later = now + 600_000;
    let mut sweepers = Vec::new();
    for _ in 0..4 {
        sweepers.push(redis(env, default).await.expect("the ledger answered once").with_prefix(&prefix));
    }
    let start = Arc::new(tokio::sync::Barrier::new(sweepers.len()));
    let mut sweeps = tokio::task::JoinSet::new();
    for sweeper in sweepers {
        let start = Arc::clone(&start);
        sweeps.spawn(async move {
            start.wait().await;
            sweeper.sweep(later, 10_000).await.unwrap()
        });
    }
    let mut reported = Vec::new();
    while let Some(removed) = sweeps.join_next().await {
        reported.push(removed.unwrap());
    }
    assert_eq!(
        reported.iter().sum::<usize>(),
        RECORDS,
        "each record is counted by the one sweep that removed it: {reported:?}"
    );
    for request in &requests {
        assert_eq!(first.lookup(&request.key, now).await.unwrap(), None, "every record is gone");
    }
    assert_eq!(first.sweep(later, 10_000).await.unwrap(), 0, "nothing is left to sweep");
}

/// A primary and a replica of the test's own (no persistence, free ports), killed on drop.
struct Pair {
    primary: std::process::Child,
    replica: std::process::Child,
    ports: [u16; 2],
    url: String,
}

impl Pair {
    /// Starts both and waits until the replica is in sync; `None` (reported skipped) without a
    /// `redis-server` on this machine.
    async fn start(test: &str) -> Option<Self> {
        let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (primary_port, replica_port) = (port(), port());
        let server = |port: u16, extra: &[&str]| {
            // Its own directory: a primary writes the snapshot a replica syncs from there.
            let dir = std::env::temp_dir().join(format!("idem-redis-pair-{port}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(["--maxmemory-policy", "noeviction"])
                .args(extra)
                .stdout(std::process::Stdio::null())
                .spawn()
        };
        let Ok(primary) = server(primary_port, &[]) else {
            idem_tests::skip(test, "no redis-server on this machine");
            return None;
        };
        let replica = server(replica_port, &["--replicaof", "127.0.0.1", &primary_port.to_string()]).unwrap();
        let url = format!("redis://127.0.0.1:{primary_port}");
        let pair = Self { primary, replica, ports: [primary_port, replica_port], url };
        let client = redis::Client::open(pair.url.as_str()).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let info: String =
                    redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap_or_default();
                if info.contains("state=online") {
                    return Some(pair);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the replica never came in sync");
    }

    /// Stops (`-STOP`) or continues (`-CONT`) the replica: stopped, it stays connected as far
    /// as the primary knows, and acknowledges nothing new.
    fn signal_replica(&self, signal: &str) {
        let status = std::process::Command::new("kill").args([signal, &self.replica.id().to_string()]).status();
        assert!(status.is_ok_and(|status| status.success()), "kill {signal}");
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.signal_replica("-CONT");
        for child in [&mut self.primary, &mut self.replica] {
            let _ = child.kill();
            let _ = child.wait();
        }
        for port in &self.ports {
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("idem-redis-pair-{port}")));
        }
    }
}

/// With `wait=1`, nothing only the primary holds is reported won or replayed — whichever
/// connection asks. Found by the long failover run (a replica a second behind, `wait=1`): a
/// completion no replica had yet was replayed to repeats (a read was never waited on), and the
/// replica's acknowledgement of a claim was asked apart from the claim — the cluster client sent
/// that `WAIT` to another node while the dying primary's connection was down, which answered at
/// once, so a claim only that primary held was reported won and its handler ran. Each step that
/// is relied on now sends its write and the `WAIT` in one pipeline, and a read that is relied on
/// first writes its version back (`TOUCH`) in one pipeline with a `WAIT`. Here a second ledger
/// connection stands for the repeat's (and for a claim sent again on another connection).
#[tokio::test]
async fn nothing_only_the_primary_holds_is_reported_won_or_replayed() {
    use idem_runtime::ledger::{Claim, ClaimRequest, LedgerError, Outcome, Token};
    let test = "ledger_redis::nothing_only_the_primary_holds_is_reported_won_or_replayed";
    let Some(pair) = Pair::start(test).await else { return };
    // Long enough that the replica in step acknowledges on a loaded machine; each step the stopped
    // replica cannot acknowledge costs it once.
    let url = format!("{}?wait=1&wait_timeout_ms=2000", pair.url);
    let (first, second) = (RedisLedger::connect(&url).await.unwrap(), RedisLedger::connect(&url).await.unwrap());
    let now = first.now().await.unwrap().unwrap();
    let (done, held) = (claim_request(now), claim_request(now));
    let won = first.claim(&done).await;
    assert!(matches!(won, Ok(Claim::Won { .. })), "the replica in step acknowledges: {won:?}");

    pair.signal_replica("-STOP");
    // A claim, and a completion, only the primary holds.
    let answer = first.claim(&held).await;
    assert!(matches!(answer, Err(LedgerError::Ambiguous { .. })), "a claim the replica lacks: {answer:?}");
    let result = Outcome::Completed(b"charged".to_vec());
    let answer = first.complete(&done.key, done.token, result.clone(), now + 60_000).await;
    assert!(matches!(answer, Err(LedgerError::Ambiguous { .. })), "a result the replica lacks: {answer:?}");
    // Sent again on another connection, the claim is still not won; a repeat is not replayed
    // a result the replica may never get.
    let again = second.claim(&held).await;
    assert!(matches!(again, Err(LedgerError::Ambiguous { .. })), "the claim sent again: {again:?}");
    let repeat = ClaimRequest { token: Token::random(), ..done.clone() };
    let replayed = second.claim(&repeat).await;
    assert!(
        matches!(replayed, Err(LedgerError::Ambiguous { .. })),
        "a repeat of the unacknowledged result: {replayed:?}"
    );

    // Once the replica has them, both are what they are.
    pair.signal_replica("-CONT");
    let mut answers = (Err(LedgerError::Fenced), Err(LedgerError::Fenced));
    for _ in 0..50 {
        answers = (second.claim(&held).await, second.claim(&repeat).await);
        if answers.0.is_ok() && answers.1.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(matches!(answers.0, Ok(Claim::Won { .. })), "the claim, acknowledged: {:?}", answers.0);
    assert!(matches!(&answers.1, Ok(Claim::Replay { result }) if result == b"charged"), "{:?}", answers.1);

    // A node that lost the ledger's scripts (a restart, `SCRIPT FLUSH`) is given them again.
    let client = redis::Client::open(pair.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    let plain = RedisLedger::connect(&pair.url).await.unwrap();
    for ledger in [&plain, &second] {
        let won = ledger.claim(&claim_request(now)).await;
        assert!(matches!(won, Ok(Claim::Won { .. })), "after SCRIPT FLUSH: {won:?}");
        let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    }
}

/// A result whose answer was lost — here because no replica acknowledged it in time — is sent
/// again by the handle; the ledger must recognise its own completion and wait for the replicas
/// again, never answer "fenced" (the handle would then stop recording a result that a failover
/// can still lose: found by the long failover run with `wait=1` and a lagging replica, where an
/// acknowledged result was lost and the charge ran again). Without `wait`, the same resend is
/// simply done.
#[tokio::test]
async fn a_completion_sent_again_is_recognised_and_waited_for_again() {
    use idem_runtime::ledger::{Claim, LedgerError, Outcome, State};
    let Some((plain, _)) = standalone_of_its_own().await else { return };
    // The machine's standalone Redis has no replica: every wait for one times out.
    let waiting = plain.clone().wait_for_replicas(1, std::time::Duration::from_millis(50));
    let now = plain.now().await.unwrap().unwrap();
    let request = claim_request(now);
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

/// What a proxy does between two round trips of the connection it carries.
type Between = Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// A TCP proxy in front of the Redis at `upstream` (host:port) that, once `armed`, runs `between`
/// (to completion) just before it forwards the `nth` `EVALSHA` after arming (from 0): what another
/// caller does between a step's read and its compare-and-set, or between a claim's
/// read-and-judge (`CREATE` finding a record, the first) and its compare-and-set (the second).
/// Answers the proxy's port.
async fn between_proxy(
    upstream: String,
    nth: usize,
    between: Between,
    armed: Arc<std::sync::atomic::AtomicBool>,
) -> u16 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
            let (between, armed, seen) = (Arc::clone(&between), Arc::clone(&armed), Arc::clone(&seen));
            tokio::spawn(async move {
                let mut buffer = vec![0; 64 * 1024];
                loop {
                    let read = match client_read.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => read,
                    };
                    let chunk = &buffer[..read];
                    let evalsha = chunk.windows(7).any(|window| window.eq_ignore_ascii_case(b"EVALSHA"));
                    if armed.load(Ordering::SeqCst) && evalsha && seen.fetch_add(1, Ordering::SeqCst) == nth {
                        between().await;
                    }
                    if server_write.write_all(chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// The host:port of the standalone Redis the tests use, and a URL for it without parameters.
fn standalone_address() -> (String, String) {
    let url = std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| STANDALONE.to_owned());
    let upstream = url.trim_start_matches("redis://").split(['/', '?']).next().unwrap();
    let upstream = upstream.rsplit('@').next().unwrap().to_owned();
    (upstream, url.split('?').next().unwrap().to_owned())
}

/// A claim that read a record (an expired one, to be replaced) and then found the whole hash
/// gone — swept, expired by its TTL, or released by another caller between the two round trips
/// — writes its fresh record into a new hash. It used to be answered "won" with nothing
/// written: the compare-and-set on a missing hash counted its fields before adding the version,
/// took the one record for "none left" and deleted it, so the next repeat also won and ran
/// (found by review; red first).
#[tokio::test]
async fn a_claim_whose_hash_vanished_under_it_is_still_written() {
    use idem_runtime::ledger::{Claim, ClaimRequest, Outcome, State, Token};
    let Some((plain, prefix)) = standalone_of_its_own().await else { return };
    // An expired result under the key: a new claim of it replaces the record.
    let now = plain.now().await.unwrap().unwrap();
    let first = claim_request(now);
    assert!(matches!(plain.claim(&first).await.unwrap(), Claim::Won { .. }));
    plain.complete(&first.key, first.token, Outcome::Completed(b"old".to_vec()), now + 60_000).await.unwrap();
    let later = now + 300_000;
    let again = ClaimRequest { token: Token::random(), ..claim_request(later) };
    let again = ClaimRequest { key: first.key, fingerprint: first.fingerprint, ..again };

    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (upstream, url) = standalone_address();
    let doomed = format!("{prefix}:r:{{{}}}", first.key.reference());
    let side = redis::Client::open(url).unwrap();
    // The hash vanishes between the claim's two round trips.
    let vanish: Between = Arc::new(move || {
        let (side, doomed) = (side.clone(), doomed.clone());
        Box::pin(async move {
            let mut conn = side.get_multiplexed_async_connection().await.unwrap();
            let deleted: i64 = redis::cmd("DEL").arg(&doomed).query_async(&mut conn).await.unwrap();
            assert_eq!(deleted, 1, "the hash was there to vanish");
        })
    });
    let port = between_proxy(upstream, 1, vanish, Arc::clone(&armed)).await;
    let proxied = RedisLedger::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap().with_prefix(&prefix);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let won = proxied.claim(&again).await;
    assert!(matches!(won, Ok(Claim::Won { .. })), "the expired record is replaced: {won:?}");

    let report = plain.lookup(&again.key, later).await.unwrap();
    assert_eq!(report.map(|report| report.state), Some(State::InProgress), "the won claim's record is kept");
    let repeat = ClaimRequest { token: Token::random(), ..again.clone() };
    let answer = plain.claim(&repeat).await.unwrap();
    assert!(matches!(answer, Claim::InFlight { .. }), "a repeat of the won claim does not run too: {answer:?}");
}

/// With `wait=N`, a renewed lease is reported only once the replicas hold it: the holder acts
/// on the lease it was told it has (`Operation::lease_lost`), and a renewal lost with its
/// primary would let a takeover run the call again at the old lease's end while the holder still
/// believes it holds it (found by review; red first: the renewal was answered at once).
#[tokio::test]
async fn a_renewal_is_reported_once_the_replicas_hold_it() {
    use idem_runtime::ledger::{Claim, LedgerError};
    let test = "ledger_redis::a_renewal_is_reported_once_the_replicas_hold_it";
    let Some(pair) = Pair::start(test).await else { return };
    let ledger = RedisLedger::connect(&format!("{}?wait=1&wait_timeout_ms=2000", pair.url)).await.unwrap();
    let now = ledger.now().await.unwrap().unwrap();
    let held = claim_request(now);
    assert!(matches!(ledger.claim(&held).await, Ok(Claim::Won { .. })));
    pair.signal_replica("-STOP");
    let renewed = ledger.renew(&held.key, held.token, now + 20_000).await;
    assert!(matches!(renewed, Err(LedgerError::Ambiguous { .. })), "a renewal only the primary holds: {renewed:?}");
    pair.signal_replica("-CONT");
    let mut renewed = Err(LedgerError::Fenced);
    for _ in 0..50 {
        renewed = ledger.renew(&held.key, held.token, now + 20_000).await;
        if renewed.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(renewed, Ok(()), "the renewal, sent again once the replica is back");
}

/// A record kept "for ever" (a retention or window past what a TTL can say: times are clamped to
/// `i64::MAX` ms) is written whole and kept without a TTL, never half-written by a script that
/// failed at `PEXPIRE` after its `HSET` (found by review; red first: the claim failed as
/// unavailable and left an in-flight record nobody held).
#[tokio::test]
async fn a_record_kept_for_ever_is_written_without_a_ttl() {
    use idem_runtime::ledger::{Claim, ClaimRequest, Outcome, State};
    let Some((ledger, prefix)) = standalone_of_its_own().await else { return };
    let now = ledger.now().await.unwrap().unwrap();
    let forever = i64::MAX.unsigned_abs();
    let request = ClaimRequest { window_end: forever, expires_at: forever, ..claim_request(now) };
    let won = ledger.claim(&request).await;
    assert!(matches!(won, Ok(Claim::Won { .. })), "{won:?}");
    ledger.complete(&request.key, request.token, Outcome::Completed(b"kept".to_vec()), forever).await.unwrap();
    let report = ledger.lookup(&request.key, now).await.unwrap().expect("the record");
    assert_eq!((report.state, report.result.as_deref()), (State::Completed, Some(&b"kept"[..])));
    let client =
        redis::Client::open(std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| STANDALONE.to_owned())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}:r:{{{}}}", request.key.reference());
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(ttl, -1, "kept without a TTL (the sweep, not Redis, removes it)");
    let () = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
}

/// A release whose compare-and-set lost to another writer that left exactly what the release
/// would have — a sweep that removed the record, its retention over, between the release's read
/// and its write — is not answered as if it had released the claim itself: nothing of its own
/// was left to undo (fenced, as on every other ledger). It used to take the other's removal,
/// which looks the same, for its own write (issue 41, item 4; red first).
#[tokio::test]
async fn a_release_is_not_answered_by_another_writers_removal() {
    use idem_runtime::ledger::{Claim, LedgerError};
    let Some((plain, prefix)) = standalone_of_its_own().await else { return };
    let now = plain.now().await.unwrap().unwrap();
    let request = claim_request(now);
    assert!(matches!(plain.claim(&request).await.unwrap(), Claim::Won { .. }));

    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (upstream, _) = standalone_address();
    let sweeper = plain.clone();
    let sweep: Between = Arc::new(move || {
        let sweeper = sweeper.clone();
        Box::pin(async move { assert_eq!(sweeper.sweep(now + 600_000, 100).await.unwrap(), 1, "the sweep removes it") })
    });
    let port = between_proxy(upstream, 0, sweep, Arc::clone(&armed)).await;
    let proxied = RedisLedger::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap().with_prefix(&prefix);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let released = proxied.release(&request.key, request.token).await;
    assert_eq!(released, Err(LedgerError::Fenced), "the sweep removed it, not the release");
}

/// Two operators settle one operation with the same verdict at once: only the one whose
/// verdict was stored is told so; the other is told the operation is no longer resolvable, as
/// it would be a moment later. The second used to take the first's write, which looks exactly
/// like its own, for its own (issue 41, item 4; red first).
#[tokio::test]
async fn only_the_operator_whose_verdict_was_stored_is_told_so() {
    use idem_runtime::key::Address;
    use idem_runtime::ledger::{Claim, LedgerError, Resolution, State};
    let Some((plain, prefix)) = standalone_of_its_own().await else { return };
    let now = plain.now().await.unwrap().unwrap();
    let request = claim_request(now);
    assert!(matches!(plain.claim(&request).await.unwrap(), Claim::Won { .. }));
    // Its lease (ten seconds) has lapsed: an operator may settle it.
    let (later, keep_until) = (now + 20_000, now + 90_000);
    let address = Address { reference: request.key.reference(), window_end: request.window_end };

    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (upstream, _) = standalone_address();
    let other = plain.clone();
    let tenant = request.tenant;
    let first: Between = Arc::new(move || {
        let other = other.clone();
        Box::pin(async move {
            let stored = other.resolve(tenant, address, Resolution::NothingHappened, later, keep_until).await;
            assert_eq!(stored, Ok(()), "the first operator's verdict");
        })
    });
    let port = between_proxy(upstream, 0, first, Arc::clone(&armed)).await;
    let proxied = RedisLedger::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap().with_prefix(&prefix);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = proxied.resolve(tenant, address, Resolution::NothingHappened, later, keep_until).await;
    assert_eq!(second, Err(LedgerError::NotResolvable { state: State::Failed }), "the second operator's");
}

/// A holder's result is recognised as its own when sent again (its answer lost), but an
/// operator's verdict that stores the same outcome is not taken for it: the holder is fenced,
/// as on every other ledger, and its caller is given the verdict. (A holder's completion clears
/// the record's label; a verdict keeps it.) It used to be told its result was recorded (issue 41,
/// item 4; red first).
#[tokio::test]
async fn an_operators_verdict_is_not_taken_for_the_holders_result() {
    use idem_runtime::key::Address;
    use idem_runtime::ledger::{Claim, ClaimRequest, LedgerError, Outcome, Resolution};
    let Some((ledger, _)) = standalone_of_its_own().await else { return };
    let now = ledger.now().await.unwrap().unwrap();
    let (later, keep_until) = (now + 20_000, now + 90_000);
    for (verdict, outcome) in [
        (Resolution::NothingHappened, Outcome::Failed),
        (Resolution::Completed(b"charged".to_vec()), Outcome::Completed(b"charged".to_vec())),
    ] {
        let request = ClaimRequest { label: Some(b"sealed label".to_vec()), ..claim_request(now) };
        assert!(matches!(ledger.claim(&request).await.unwrap(), Claim::Won { .. }));
        let address = Address { reference: request.key.reference(), window_end: request.window_end };
        ledger.resolve(request.tenant, address, verdict.clone(), later, keep_until).await.unwrap();
        let late = ledger.complete(&request.key, request.token, outcome.clone(), keep_until).await;
        assert_eq!(late, Err(LedgerError::Fenced), "the holder, after the verdict {verdict:?}");
    }
}

/// An operation a repeat marked unknown under `hold` (its lease lapsed) and whose holder then
/// settles it "unknown" is kept as long as the holder asks, as on every other ledger: the
/// record already read "unknown" under the holder's token, which used to be taken for the
/// holder's own completion, and nothing was written (issue 41, item 4; red first).
#[tokio::test]
async fn a_holders_unknown_is_written_though_a_repeat_marked_it_unknown() {
    use idem_runtime::ledger::{Claim, ClaimRequest, Outcome, State, Token};
    let Some((ledger, _)) = standalone_of_its_own().await else { return };
    let now = ledger.now().await.unwrap().unwrap();
    let later = now + 20_000;
    let request = ClaimRequest { stale: idem_runtime::StalePolicy::Hold, ..claim_request(now) };
    assert!(matches!(ledger.claim(&request).await.unwrap(), Claim::Won { .. }));
    let repeat = ClaimRequest { token: Token::random(), now: later, ..request.clone() };
    assert_eq!(ledger.claim(&repeat).await.unwrap(), Claim::Unknown, "the lapsed lease, held");
    let kept = now + 900_000;
    ledger.complete(&request.key, request.token, Outcome::Unknown, kept).await.unwrap();
    let report = ledger.lookup(&request.key, later).await.unwrap().expect("the record");
    assert_eq!((report.state, report.expires_at), (State::Unknown, kept), "kept as long as its holder asked");
}

/// With `wait=N`, the check value a replica keeps for its secret, and the owner it records for
/// a tool, are answered only once the replicas hold them — with what was read: a replica
/// compares its secret, and a handler its tool's owners, against what it is answered, and a
/// failover that lost it would let another replica keep another secret, or another handler
/// the same tool, unseen (issue 41, item 4; red first: both were answered at once).
#[tokio::test]
async fn secret_checks_and_tool_owners_are_answered_once_the_replicas_hold_them() {
    use idem_runtime::ledger::LedgerError;
    let test = "ledger_redis::secret_checks_and_tool_owners_are_answered_once_the_replicas_hold_them";
    let Some(pair) = Pair::start(test).await else { return };
    let ledger = RedisLedger::connect(&format!("{}?wait=1&wait_timeout_ms=2000", pair.url)).await.unwrap();
    let now = ledger.now().await.unwrap().unwrap();
    let (check, other) = ([7; 32], [8; 32]);
    assert_eq!(ledger.secret_check(1, Some(&check)).await, Ok(Some(check)), "the replica in step");
    assert_eq!(ledger.tool_owners("ns", "charge", "a", now, 0).await, Ok(vec!["a".to_owned()]));

    pair.signal_replica("-STOP");
    let kept = ledger.secret_check(2, Some(&check)).await;
    assert!(matches!(kept, Err(LedgerError::Ambiguous { .. })), "a check value only the primary holds: {kept:?}");
    let read = ledger.secret_check(1, Some(&other)).await;
    assert!(matches!(read, Err(LedgerError::Ambiguous { .. })), "a check value read, unconfirmed: {read:?}");
    let owners = ledger.tool_owners("ns", "charge", "b", now, 0).await;
    assert!(matches!(owners, Err(LedgerError::Ambiguous { .. })), "an owner only the primary holds: {owners:?}");
    let live = ledger.secret_versions(Some((1, now + 60_000))).await;
    assert!(matches!(live, Err(LedgerError::Ambiguous { .. })), "a version's time only the primary holds: {live:?}");

    pair.signal_replica("-CONT");
    let mut answers = (Err(LedgerError::Fenced), Err(LedgerError::Fenced));
    for _ in 0..50 {
        answers = (ledger.secret_check(2, Some(&other)).await, ledger.tool_owners("ns", "charge", "b", now, 0).await);
        if answers.0.is_ok() && answers.1.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(answers.0, Ok(Some(check)), "the check value first kept, once the replica has it");
    assert_eq!(answers.1, Ok(vec!["a".to_owned(), "b".to_owned()]), "both owners, once the replica has them");
    assert_eq!(ledger.secret_versions(None).await, Ok(vec![(1, now + 60_000)]), "the version's time");
}
