//! One atomic step on one reference's hash: read it, run the records' operation, write back what
//! changed with a compare-and-set (again if another writer came between); a write sent with the
//! `WAIT` that asks the replicas, and what a read that is relied on confirms on them.

use redis::{AsyncCommands, Value};

use super::codec::{Bundle, diff};
use super::connect::{Conn, failed};
use super::{MARGIN_MS, RedisLedger, scripts, unreachable};
use crate::key::Ref;
use crate::ledger::LedgerError;
use crate::ledger::records::Records;

/// How many times a step re-reads and tries again when another writer changed the hash between
/// its read and its write.
const ATTEMPTS: u32 = 64;

impl RedisLedger {
    /// The records of `reference`, and the version read.
    pub(super) async fn load(&self, reference: Ref) -> Result<Bundle, LedgerError> {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = self.conn.clone().hgetall(self.key_of(reference)).await.map_err(failed)?;
        Bundle::decode(pairs)
    }

    /// The records of `reference`, confirmed on the replicas first when the ledger waits for
    /// them and `relied_on` says the caller will rely on what was read (a completed result it
    /// will be given).
    pub(super) async fn load_relied_on(
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
    pub(super) async fn update<T>(
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
    pub(super) async fn write(
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
    pub(super) fn acknowledged(&self, answer: Option<Value>) -> Result<(), LedgerError> {
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
}

/// A script's answer, or the server's refusal to run it where it was sent (a node that no
/// longer holds the slot, a cluster that is down): nothing was written.
fn scripted(value: Value) -> Result<Value, LedgerError> {
    match value {
        Value::ServerError(error) => Err(LedgerError::unavailable(format!("Redis refused the step: {error:?}"))),
        value => Ok(value),
    }
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
