//! A ledger on Redis or Valkey, standalone or Redis Cluster (feature `redis`): the ledger that
//! scales out.
//!
//! Every record of one reference lives in one hash under the hash tag `{<ref>}` (`codec.rs`), so
//! each atomic step touches one key in one slot. A step reads the hash, runs the same operation
//! the memory ledger runs on the records read (`records.rs`, which decides through
//! `RecordView::judge`), and writes back what changed with a compare-and-set on the hash's
//! version (`scripts.rs`) — again if another writer came between. A claim of a reference nobody
//! holds is one script that creates it. Records expire through Redis TTLs, set from their own
//! retention; [`Ledger::sweep`] deletes by the ledger's rules what the TTLs have not yet.
//! [`Ledger::now`] is the server's `TIME`. Operator reads that look across the ledger (pending,
//! stats, sweep) scan every primary.
//!
//! With `wait=N` in the URL ([`RedisLedger::wait_for_replicas`]), what a caller relies on — a
//! won claim, a renewed lease, a recorded result or verdict, a result it is replayed, a secret's
//! check value, a tool's owners — is answered only once `N` replicas hold it: the write goes out
//! in one pipeline with the `WAIT` that asks them (one connection to one node, so the `WAIT`
//! counts that write), and a read that is relied on first writes the version it read back to the
//! hash (`TOUCH`, which changes nothing but is replicated) in one pipeline with a `WAIT`.
//! Without `wait`, as soon as the primary has it.
//! What either promises through a failover is measured in RELIABILITY.md and stated in the
//! guide (`docs/src/redis-ledger.md`).

mod codec;
mod connect;
mod operator;
mod scripts;
mod step;
mod verbs;

use std::sync::Arc;
use std::time::Duration;

use self::codec::bundle_key;
use self::connect::{Conn, Target, failed, info_field, read};
#[cfg(doc)]
use super::Ledger;
use super::LedgerError;
use crate::key::Ref;

/// How long Redis keeps a record's hash at least after its last write, beyond the records' own
/// retention: the records' times are the ledger's clock as one node measured it, and another
/// node's clock decides the TTL.
const MARGIN_MS: u64 = 60_000;

/// A [`Ledger`] on Redis (standalone, or a Redis Cluster).
#[derive(Clone)]
pub struct RedisLedger {
    conn: Conn,
    /// The connections the writes that wait for replicas take turns on, opened at the first:
    /// a `WAIT` holds its connection until the replicas answer, so on `conn` alone every call's
    /// wait would queue behind the one before.
    waiting: Arc<Waiting>,
    prefix: Arc<str>,
    /// Replicas that must acknowledge a write before it is reported, and how long to wait.
    wait: Option<(u32, Duration)>,
    place: Arc<str>,
    cluster: bool,
    /// Who serves what over this ledger in this process (its clones share it).
    catalogue: Arc<crate::ledger::Catalogue>,
}

/// What [`RedisLedger`] needs to open the connections its waiting writes share, and them.
struct Waiting {
    target: Target,
    conns: tokio::sync::OnceCell<Vec<Conn>>,
    next: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger").field("place", &self.place).field("wait", &self.wait).finish_non_exhaustive()
    }
}

impl RedisLedger {
    /// Connects to the Redis at `url` — `redis://host:port[/db]` for one server,
    /// `redis+cluster://host:port[,host:port…]` (or `redis://host:port?cluster=true`) for a Redis
    /// Cluster — checks that no primary may evict records, and logs one line naming it.
    ///
    /// Parameters: `wait=N` ([`RedisLedger::wait_for_replicas`], with `wait_timeout_ms=M`,
    /// default 1000, and `wait_connections=K`, the connections the writes that wait take turns
    /// on, default 8) and `prefix=P` (the first part of every key, default `idem`).
    ///
    /// # Errors
    /// A URL that names no Redis; no server answering; a primary whose `maxmemory-policy` is
    /// not `noeviction` (an evicted record lets a repeat run again: the message says what to set).
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        let target = Target::parse(url)?;
        let conn = Conn::open(&target).await.map_err(|error| unreachable(&target.place, error))?;
        let timeout = Duration::from_millis(target.wait_timeout_ms);
        let mut ledger = Self {
            conn,
            waiting: Arc::new(Waiting { target: target.clone(), conns: tokio::sync::OnceCell::new(), next: 0.into() }),
            prefix: target.prefix.into(),
            wait: target.wait.map(|replicas| (replicas, timeout)),
            place: target.place.into(),
            cluster: target.cluster,
            catalogue: Arc::default(),
        };
        let described = ledger.check().await?;
        tracing::info!("{described}");
        Ok(ledger)
    }

    /// Reports a write only once `replicas` replicas acknowledged it (Redis's `WAIT`, up to
    /// `timeout`): a claim is then reported won, and a result recorded, only when it would
    /// survive the loss of its primary to a replica that has it. A write not acknowledged in
    /// time is an ambiguous failure (the call is refused or its recording retried, never
    /// reported done). Narrows the window in which a failover loses a write; Redis replication
    /// stays asynchronous, so it does not close it (the guide says what is measured).
    #[must_use]
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// Keeps every key under `prefix` (`<prefix>:r:{<ref>}`, …) instead of `idem`: several
    /// ledgers on one Redis, or a test's own.
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Where it is, for messages: the URL without its password.
    #[must_use]
    pub fn place(&self) -> &str {
        &self.place
    }

    /// Refuses a primary that may evict records; describes the ledger, and warns of a setting
    /// under which it keeps less than the guide's sentence promises.
    async fn check(&mut self) -> Result<String, LedgerError> {
        let primaries = self.conn.primaries().await.map_err(failed)?;
        let (mut append_only, mut fewest_replicas) = (0, u64::MAX);
        for node in &primaries {
            let info = redis::cmd("INFO").arg("memory").arg("persistence").arg("replication").clone();
            let info: String = read(self.conn.on_node(node, info).await.map_err(failed)?)?;
            let name = node.as_ref().map_or_else(|| self.place.to_string(), |(host, port)| format!("{host}:{port}"));
            let policy = info_field(&info, "maxmemory_policy").unwrap_or("unknown");
            if policy != "noeviction" {
                return Err(LedgerError::unavailable(format!(
                    "the Redis at {name} may evict keys under memory pressure (maxmemory-policy {policy}): an \
                     evicted record would let a repeat run again. Set `maxmemory-policy noeviction` (CONFIG SET \
                     maxmemory-policy noeviction, and in its configuration file), then start again"
                )));
            }
            append_only += usize::from(info_field(&info, "aof_enabled") == Some("1"));
            let replicas = info_field(&info, "connected_slaves").and_then(|n| n.parse().ok()).unwrap_or(0);
            fewest_replicas = fewest_replicas.min(replicas);
        }
        let fewest_replicas = if primaries.is_empty() { 0 } else { fewest_replicas };
        if append_only < primaries.len() {
            tracing::warn!(
                "idem ledger: {} of {} Redis primaries are not append-only (appendonly no): a restart of one loses \
                 the records it held, and repeats of those operations run again",
                primaries.len() - append_only,
                primaries.len()
            );
        }
        if let Some((wanted, _)) = self.wait.filter(|(wanted, _)| u64::from(*wanted) > fewest_replicas) {
            tracing::warn!(
                "idem ledger: each write waits for {wanted} replica(s), and a Redis primary has {fewest_replicas}: \
                 its writes are refused (nothing runs) until enough replicas are attached"
            );
        }
        let kind =
            if self.cluster { format!("cluster of {} primaries", primaries.len()) } else { "standalone".to_owned() };
        let wait = self.wait.map_or_else(
            || "writes not waited on".to_owned(),
            |(n, t)| format!("each write waits for {n} replica(s), up to {} ms", t.as_millis()),
        );
        Ok(format!(
            "idem ledger: redis at {} ({kind}, at least {fewest_replicas} replica(s) per primary, append-only on \
             {append_only} of {} primaries, noeviction; {wait})",
            self.place,
            primaries.len()
        ))
    }

    fn key_of(&self, reference: Ref) -> String {
        bundle_key(&self.prefix, reference)
    }

    fn tool_key(&self, kind: &str, namespace: &str, tool: &str) -> String {
        format!("{}:{kind}:{}:{namespace}:{tool}", self.prefix, namespace.len())
    }
}

/// No connection to the Redis at `place` could be opened: nothing was sent.
fn unreachable(place: &str, error: redis::RedisError) -> LedgerError {
    LedgerError::unavailable(format!(
        "no Redis answers at {place}: {error}. Start it, or set IDEM_DATABASE_URL to one that runs"
    ))
    .with_source(error)
}
