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

use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, Value};

use self::codec::{Bundle, bundle_key, current_field, diff, encode};
use self::connect::{Conn, Target, failed, info_field, read};
use super::records::{Records, oldest_first};
use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    StatusReport, Token,
};
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};

/// How many times a step re-reads and tries again when another writer changed the hash between
/// its read and its write.
const ATTEMPTS: u32 = 64;

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

    /// The records of `reference`, and the version read.
    async fn load(&self, reference: Ref) -> Result<Bundle, LedgerError> {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = self.conn.clone().hgetall(self.key_of(reference)).await.map_err(failed)?;
        Bundle::decode(pairs)
    }

    /// The records of `reference`, confirmed on the replicas first when the ledger waits for
    /// them and `relied_on` says the caller will rely on what was read (a completed result it
    /// will be given).
    async fn load_relied_on(
        &self,
        reference: Ref,
        relied_on: impl Fn(&Records) -> bool,
    ) -> Result<Bundle, LedgerError> {
        let key = self.key_of(reference);
        for _ in 0..ATTEMPTS {
            let read = self.load(reference).await?;
            if self.wait.is_none() || !relied_on(&read.records) || self.confirm(&key, &read).await? {
                return Ok(read);
            }
        }
        Err(LedgerError::unavailable(format!(
            "the record of ref {reference} changed under {ATTEMPTS} attempts in a row; try again"
        )))
    }

    /// Runs `step` on the records of `reference` and writes what it changed, again from a fresh
    /// read if another writer came first. `step` answers its result and whether the caller
    /// relies on it (a won claim, a recorded result, a result to replay), which — when the
    /// ledger is told to wait for replicas — is answered only once they hold what it says:
    /// what this step wrote, or what it read.
    async fn update<T>(
        &self,
        reference: Ref,
        first: Option<Bundle>,
        mut step: impl FnMut(&mut Records) -> (T, bool),
    ) -> Result<T, LedgerError> {
        let key = self.key_of(reference);
        let mut read = match first {
            Some(bundle) => bundle,
            None => self.load(reference).await?,
        };
        for _ in 0..ATTEMPTS {
            let mut records = read.records.clone();
            let (answer, relied_on) = step(&mut records);
            let waits = relied_on && self.wait.is_some();
            if records == read.records {
                if !waits || self.confirm(&key, &read).await? {
                    return Ok(answer);
                }
                read = self.load(reference).await?;
                continue;
            }
            let (set, delete) = diff(&read.records, &records);
            let version = crate::bytes::hex(&crate::bytes::random::<8>());
            let mut swap = scripts::SWAP.on(&key);
            swap.arg(read.version.as_deref().unwrap_or_default())
                .arg(&version)
                .arg(records.needed_until())
                .arg(MARGIN_MS)
                .arg(set.len());
            for (field, value) in &set {
                swap.arg(field).arg(value);
            }
            for field in &delete {
                swap.arg(field);
            }
            let (swapped, acknowledged) = self.write(&key, &scripts::SWAP, swap, waits).await?;
            tracing::debug!(%reference, ?swapped, relied_on, "redis ledger: swap");
            if matches!(swapped, Value::Int(1)) {
                self.acknowledged(acknowledged)?;
                return Ok(answer);
            }
            // Another writer came first: the step again, on what it left. Never "the hash now
            // holds what this step would have written, so it is mine": another writer's result
            // can look exactly the same (another sweep's deletion, another operator's identical
            // verdict), and an answer that says who wrote — how many this sweep removed, whether
            // this release undid its claim — would be taken from it. This step's own write, sent
            // again by the client after its answer was lost, is recognised by the script itself,
            // by the version only this step wrote; a deletion leaves no version, so a lost
            // answer to one is answered as the step finds the hash (fewer counted swept, a
            // release fenced: nothing of its own left to undo), never as more than it did.
            read = self.load(reference).await?;
        }
        Err(LedgerError::unavailable(format!(
            "the record of ref {reference} changed under {ATTEMPTS} attempts in a row; try again"
        )))
    }

    /// Sends `script` (a write to `key`: `lua`'s `EVALSHA` and its arguments) to `key`'s
    /// primary; with `waits`, in one pipeline with the `WAIT` that asks its replicas — one
    /// connection, one node, so what the `WAIT` counts covers what the script wrote. (Sent
    /// apart, the `WAIT` could go out on a connection that had not written, or to another node
    /// while the primary's connection was down, and be answered at once: found by the failover
    /// run.) A node that does not know the script yet is given it, and asked again. Answers the
    /// script's value, and the `WAIT`'s when it was asked — to be judged by
    /// [`RedisLedger::acknowledged`] if the script wrote.
    async fn write(
        &self,
        key: &str,
        lua: &scripts::Lua,
        script: redis::Cmd,
        waits: bool,
    ) -> Result<(Value, Option<Value>), LedgerError> {
        for loaded in [false, true] {
            let (value, acknowledged) = match self.wait.filter(|_| waits) {
                None => (self.conn.clone().on_primary_of(key.as_bytes(), script.clone()).await, None),
                Some((replicas, timeout)) => {
                    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                    let mut pipeline = redis::pipe();
                    pipeline
                        .add_command(script.clone())
                        .add_command(redis::cmd("WAIT").arg(replicas).arg(millis).clone());
                    let values = self
                        .waiting_conn()
                        .await?
                        .pipeline_on_primary_of(key.as_bytes(), &pipeline)
                        .await
                        .map_err(failed)?;
                    let [value, acknowledged]: [Value; 2] = values.try_into().map_err(|values: Vec<Value>| {
                        LedgerError::corrupt(format!("Redis answered {} values to 2", values.len()))
                    })?;
                    (Ok(value), Some(acknowledged))
                }
            };
            if !loaded && no_script(&value) {
                self.conn.clone().on_primary_of(key.as_bytes(), lua.load()).await.map_err(failed)?;
                continue;
            }
            return Ok((scripted(value.map_err(failed)?)?, acknowledged));
        }
        Err(LedgerError::unavailable("Redis forgot the ledger's script as soon as it was given it; try again"))
    }

    /// The next of the connections the writes that wait for replicas take turns on (opened by
    /// the first).
    async fn waiting_conn(&self) -> Result<Conn, LedgerError> {
        let conns = self
            .waiting
            .conns
            .get_or_try_init(|| async {
                let mut conns = Vec::with_capacity(self.waiting.target.wait_connections);
                for _ in 0..self.waiting.target.wait_connections {
                    conns.push(Conn::open(&self.waiting.target).await?);
                }
                Ok(conns)
            })
            .await
            .map_err(|error| unreachable(&self.place, error))?;
        let turn = self.waiting.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(conns[turn % conns.len()].clone())
    }

    /// Whether the replicas acknowledged a write, from the `WAIT` [`RedisLedger::write`] sent
    /// after it (none asked: the ledger does not wait). Short of them, or unable to ask (the
    /// node stopped being a primary between the two), the write is on the primary and may be
    /// lost with it: ambiguous.
    fn acknowledged(&self, answer: Option<Value>) -> Result<(), LedgerError> {
        let (Some((replicas, timeout)), Some(answer)) = (self.wait, answer) else { return Ok(()) };
        let millis = timeout.as_millis();
        tracing::debug!(?answer, "redis ledger: WAIT");
        match answer {
            Value::Int(acknowledged) if acknowledged >= i64::from(replicas) => Ok(()),
            Value::Int(acknowledged) => Err(LedgerError::ambiguous(format!(
                "written on the primary but acknowledged by {acknowledged} of {replicas} replica(s) within {millis} ms"
            ))),
            Value::ServerError(error) => Err(LedgerError::ambiguous(format!(
                "written on the primary, whose replicas could not be asked: Redis: {error:?}"
            ))),
            other => Err(LedgerError::corrupt(format!("an answer from Redis to WAIT: {other:?}"))),
        }
    }

    /// Whether what `read` holds is on the replicas: the hash is touched on its version read
    /// and the replicas asked, in one pipeline. `false`: the hash changed since (read it again);
    /// an error: they do not have it yet (ambiguous), or Redis did not answer.
    async fn confirm(&self, key: &str, read: &Bundle) -> Result<bool, LedgerError> {
        let Some(version) = read.version.as_deref() else { return Ok(true) };
        let mut touch = scripts::TOUCH.on(key);
        touch.arg(version);
        let (touched, acknowledged) = self.write(key, &scripts::TOUCH, touch, true).await?;
        if !matches!(touched, Value::Int(1)) {
            return Ok(false);
        }
        self.acknowledged(acknowledged)?;
        Ok(true)
    }

    fn tool_key(&self, kind: &str, namespace: &str, tool: &str) -> String {
        format!("{}:{kind}:{}:{namespace}:{tool}", self.prefix, namespace.len())
    }
}

impl Ledger for RedisLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let reference = request.key.reference();
            let key = self.key_of(reference);
            let mut fresh = Records::default();
            let won = fresh.claim(request);
            let record = fresh.current.get(&request.key).map(encode).unwrap_or_default();
            let version = crate::bytes::hex(&crate::bytes::random::<8>());
            let mut create = scripts::CREATE.on(&key);
            create.arg(&version).arg(current_field(&request.key)).arg(record).arg(fresh.needed_until()).arg(MARGIN_MS);
            let (created, acknowledged) = self.write(&key, &scripts::CREATE, create, true).await?;
            let made = matches!(created, Value::Int(1));
            tracing::debug!(%reference, token = ?request.token, made, "redis ledger: claim");
            if made {
                self.acknowledged(acknowledged)?;
                return Ok(won);
            }
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = read(created)?;
            let first = Bundle::decode(pairs)?;
            let answer = self
                .update(reference, Some(first), |records| {
                    let claim = records.claim(request);
                    // A won claim, and a result the caller will be given, are relied on.
                    let relied_on = matches!(claim, Claim::Won { .. } | Claim::Replay { .. });
                    (claim, relied_on)
                })
                .await;
            let shown = match &answer {
                Ok(Claim::Won { .. }) => "won",
                Ok(Claim::InFlight { .. }) => "in flight",
                Ok(Claim::Replay { .. }) => "replay",
                Ok(Claim::Unknown) => "unknown",
                Ok(Claim::Conflict { .. }) => "conflict",
                Err(_) => "failed",
            };
            tracing::debug!(%reference, token = ?request.token, answer = shown, "redis ledger: claim answered");
            answer
        })
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            // The holder acts on the lease it is told it has: a renewal a failover could lose
            // would let a takeover run the call at the old lease's end while it still believes
            // it holds it.
            self.update(key.reference(), None, |records| {
                let renewed = records.renew(key, token, lease_until);
                let ok = renewed.is_ok();
                (renewed, ok)
            })
            .await?
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let done = self
                .update(key.reference(), None, |records| {
                    let done = records.complete(key, token, outcome.clone(), keep_until);
                    // Sent again after its answer was lost (a replica's acknowledgement that did not
                    // come in time, a connection cut): the record holds this very completion, which
                    // is done — once the replicas have it. Asked only of a completion refused: one
                    // the holder may still write (an unknown a repeat marked under `hold`) is written.
                    if matches!(done, Err(LedgerError::Fenced)) && records.settled_as(key, token, &outcome) {
                        return (Ok(()), true);
                    }
                    let ok = done.is_ok();
                    (done, ok)
                })
                .await;
            tracing::debug!(reference = %key.reference(), ?token, answer = ?done, "redis ledger: complete");
            done?
        })
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let done = self.update(key.reference(), None, |records| (records.release(key, token), false)).await;
            tracing::debug!(reference = %key.reference(), ?token, answer = ?done, "redis ledger: release");
            done?
        })
    }

    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let read = self.load_relied_on(key.reference(), |records| completed(records.lookup(key, now))).await?;
            Ok(read.records.lookup(key, now))
        })
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let read = self
                .load_relied_on(reference, |records| {
                    completed(records.clone().status(tenant, Some(subject), reference, now))
                })
                .await?;
            let mut records = read.records;
            Ok(records.status(tenant, Some(subject), reference, now))
        })
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            self.update(address.reference, None, |records| {
                let done = records.resolve(tenant, address, resolution.clone(), now, keep_until);
                let ok = done.is_ok();
                (done, ok)
            })
            .await?
        })
    }

    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let mut records = self.load(reference).await?.records;
            Ok(match window_end {
                Some(window_end) => records.inspect_at(tenant, Address { reference, window_end }, now),
                None => records.status(tenant, None, reference, now),
            })
        })
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        Box::pin(async move {
            let mut stats = LedgerStats::default();
            let mut size = 0;
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                for (_, bundle, bytes) in self.read_page(keys, true).await? {
                    bundle.records.count(now, &mut stats);
                    size += bytes;
                }
            }
            stats.size_bytes = Some(size);
            Ok(stats)
        })
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        Box::pin(async move {
            let mut found = Vec::new();
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                for (_, bundle, _) in self.read_page(keys, false).await? {
                    found.extend(bundle.records.pending(query, now));
                }
                // Only the oldest `limit` can make the page: keep no more while scanning.
                if found.len() > 2 * query.limit.max(64) {
                    oldest_first(&mut found, query.limit);
                }
            }
            oldest_first(&mut found, query.limit);
            Ok(found)
        })
    }

    fn keeps_labels(&self) -> bool {
        true
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(async move {
            let mut swept = 0;
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                // A page read at once; a write only where the ledger's rules delete something
                // (Redis's TTLs have usually been there first).
                for (reference, bundle, _) in self.read_page(keys, false).await? {
                    let room = limit - swept;
                    if bundle.records.clone().sweep(now, room) > 0 {
                        swept +=
                            self.update(reference, Some(bundle), |records| (records.sweep(now, room), false)).await?;
                    }
                    if swept >= limit {
                        return Ok(swept);
                    }
                }
            }
            Ok(swept)
        })
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        Box::pin(async move {
            let clock = format!("{}:clock", self.prefix);
            let time = self.conn.clone().on_primary_of(clock.as_bytes(), redis::cmd("TIME")).await.map_err(failed)?;
            let (seconds, micros): (u64, u64) = read(time)?;
            Ok(Some(seconds * 1000 + micros / 1000))
        })
    }

    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        Box::pin(async move {
            let key = format!("{}:secret:{version}", self.prefix);
            let kept: Option<Vec<u8>> = match check {
                // Relied on — a replica that keys with its secret has compared it with the value
                // kept — so waited for like a won claim, whoever kept it.
                Some(check) => {
                    let mut keep = scripts::KEEP_CHECK.on(&key);
                    keep.arg(&check[..]);
                    let (kept, acknowledged) = self.write(&key, &scripts::KEEP_CHECK, keep, true).await?;
                    self.acknowledged(acknowledged)?;
                    read(kept)?
                }
                None => self.conn.clone().get(&key).await.map_err(failed)?,
            };
            kept.map(|bytes| {
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                    LedgerError::corrupt(format!("the check value of secret version {version} is not 32 bytes"))
                })
            })
            .transpose()
        })
    }

    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        Box::pin(async move {
            // One hash, version → time: one slot, read whole.
            let key = format!("{}:secrets-live", self.prefix);
            let (version, until) = live.map_or((0, 0), |(version, until)| (version, until));
            // Relied on — a replica refuses to serve while another version's time is ahead — so
            // a time kept is waited for like a won claim.
            let mut keep = scripts::KEEP_LIVE.on(&key);
            keep.arg(version).arg(until);
            let (kept, acknowledged) = self.write(&key, &scripts::KEEP_LIVE, keep, live.is_some()).await?;
            self.acknowledged(acknowledged)?;
            let mut kept: Vec<(u32, u64)> = read(kept)?;
            kept.sort_unstable();
            Ok(kept)
        })
    }

    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("owners", namespace, tool);
            // Relied on — a handler serves the tool only if no other owner is answered — so
            // waited for like a won claim: this owner, and every other answered.
            let mut keep = scripts::KEEP_OWNER.on(&key);
            keep.arg(owner).arg(now);
            let (seen, acknowledged) = self.write(&key, &scripts::KEEP_OWNER, keep, true).await?;
            self.acknowledged(acknowledged)?;
            let seen: Vec<(String, u64)> = read(seen)?;
            let mut owners: Vec<String> =
                seen.into_iter().filter(|(_, at)| *at >= since).map(|(owner, _)| owner).collect();
            owners.sort();
            Ok(owners)
        })
    }

    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("facts", namespace, tool);
            let _: i64 = scripts::KEEP_FACTS
                .key(&key)
                .arg(now)
                .arg(facts)
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(failed)?;
            Ok(())
        })
    }

    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("facts", namespace, tool);
            self.conn.clone().hget(&key, "f").await.map_err(failed)
        })
    }
}

/// Whether a report gives a completed result — which a caller relies on.
fn completed(report: Option<StatusReport>) -> bool {
    report.is_some_and(|report| report.state == super::State::Completed)
}

/// A script's answer, or the server's refusal to run it where it was sent (a node that no
/// longer holds the slot, a cluster that is down): nothing was written.
fn scripted(value: Value) -> Result<Value, LedgerError> {
    match value {
        Value::ServerError(error) => Err(LedgerError::unavailable(format!("Redis refused the step: {error:?}"))),
        value => Ok(value),
    }
}

/// No connection to the Redis at `place` could be opened: nothing was sent.
fn unreachable(place: &str, error: redis::RedisError) -> LedgerError {
    LedgerError::unavailable(format!(
        "no Redis answers at {place}: {error}. Start it, or set IDEM_DATABASE_URL to one that runs"
    ))
    .with_source(error)
}

/// Whether a node answered that it does not know the script sent (`NOSCRIPT`): nothing ran.
fn no_script(answer: &redis::RedisResult<Value>) -> bool {
    let kind = match answer {
        Ok(Value::ServerError(error)) => error.kind(),
        Err(error) => match error.kind() {
            redis::ErrorKind::Server(kind) => Some(kind),
            _ => None,
        },
        Ok(_) => None,
    };
    kind == Some(redis::ServerErrorKind::NoScript)
}
