//! The ledger: one record per operation, claimed atomically before the side effect.
//!
//! | state | reached by | a repeat call gets |
//! |---|---|---|
//! | absent / expired | — | a new claim: the handler runs |
//! | [`State::InProgress`] | a won claim (lease + fencing token) | "in flight" at once, no waiting |
//! | [`State::Completed`] | the handler's stored result | the stored bytes, as a replay |
//! | [`State::Failed`] | an error that guarantees nothing happened | a new claim |
//! | [`State::Unknown`] | an error whose outcome cannot be known, or a stale lease under `hold` | "outcome unknown" |
//!
//! Every backend implements [`Ledger::claim`] as one atomic step under a unique key — never a
//! read followed by an unconditional write — and refuses a completion from anyone but the
//! current holder.
//!
//! Times: a record's `window_end` ends the operation (a repeat after it is a new operation);
//! its `expires_at` ends the record (the sweep may delete it). A completed record lives until
//! its window ends or a grace after it settled, whichever is later; a failed one until its window
//! ends; an unsettled one (in progress under a dead holder, or unknown) until its window ends
//! plus a long unsettled retention. Once the window of an unsettled record has ended, a claim
//! starts a new operation and keeps the old record aside (superseded) for the operator.
//!
//! Re-sends: a claim whose answer was lost may be sent again with the same token; the ledger
//! answers it with how the first send won ([`Claim::Won`]'s `attempt` and the operation's
//! `window_end`), so a takeover stays a takeover. [`Ledger::release`] undoes a claim whose answer
//! never came, and only what that claim did.

mod error;
mod judge;
mod label;
pub mod memory;
mod open;
mod records;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "_sea")]
// `_sea` is internal: name the features a user turns on.
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
pub mod sea;
mod timeout;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::recipe::StalePolicy;
use crate::secret::{Secret, SecretError};

pub use self::error::{ErrorSource, LedgerError};
pub(crate) use self::judge::{RecordView, Verdict, held, lease_lapsed, settled_expiry, superseded, won_stale};
pub use self::label::Label;
pub(crate) use self::label::{open as open_label, seal as seal_label};
pub use self::open::{connect, from_env, is_redis_url};
pub(crate) use self::timeout::Timeout;

/// The environment variable naming the ledger: a SQL URL, a SQLite file's path, or a Redis URL.
pub const DATABASE_URL_ENV: &str = "IDEM_DATABASE_URL";

/// A boxed, sendable future: keeps [`Ledger`] object-safe so `Arc<dyn Ledger>` can be chosen at
/// run time (by URL).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fencing token: identifies one holder of one claim. Random, so a holder whose record was
/// swept and claimed anew can never match its successor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Token(u64);

impl Token {
    /// The token a ledger stored as [`Token::get`]. Only a ledger reading its own record back
    /// has a reason to make one: a holder's token comes from its claim.
    #[must_use]
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The number a ledger stores. Below 2^63 for tokens made by [`Token::random`], so a SQL
    /// backend can keep it in a signed `BIGINT` unchanged.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// A fresh token: unpredictable across processes, never repeated within one.
    ///
    /// The process draws one 64-bit seed from the operating system; each token is a counter
    /// mixed with it through SplitMix64 (a bijection), so a process never hands out the same
    /// token twice and two processes collide with negligible probability — without a system
    /// call per claim.
    ///
    /// # Panics
    /// If the operating system has no randomness to give, which leaves nothing safe to do.
    #[must_use]
    pub fn random() -> Self {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEED: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| u64::from_le_bytes(crate::bytes::random()));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // Kept below 2^63 so SQL backends can store it in a signed BIGINT unchanged.
        Self(z >> 1)
    }
}

/// The state of a record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum State {
    /// Claimed; the holder is (or was, if its lease expired) running the handler.
    InProgress,
    /// The handler finished; its result is stored and replayed.
    Completed,
    /// The handler failed in a way that guarantees nothing happened; a repeat runs again.
    Failed,
    /// Nobody can say whether the effect happened; repeats are told to check, not retry.
    Unknown,
}

impl State {
    /// The compact code a durable backend stores (the SQL ledger's encoding, not public API).
    #[cfg(any(feature = "_sea", feature = "redis", test))]
    #[must_use]
    pub(crate) const fn code(self) -> i16 {
        match self {
            Self::InProgress => 1,
            Self::Completed => 2,
            Self::Failed => 3,
            Self::Unknown => 4,
        }
    }

    /// The state a stored code stands for.
    #[cfg(any(feature = "_sea", feature = "redis", test))]
    #[must_use]
    pub(crate) const fn from_code(code: i16) -> Option<Self> {
        match code {
            1 => Some(Self::InProgress),
            2 => Some(Self::Completed),
            3 => Some(Self::Failed),
            4 => Some(Self::Unknown),
            _ => None,
        }
    }

    /// A word for messages and status answers.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attempt to claim a key. Times are milliseconds since the Unix epoch, on the ledger's
/// clock as the claimer measured it (see [`Ledger::now`]), so every backend and every replica
/// compares the same numbers.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The operation's key.
    pub key: Key,
    /// The tenant, for scoped status lookups.
    pub tenant: TenantTag,
    /// The subject (or [`SubjectTag::TENANT`] for a tenant-wide record), for status lookups.
    pub subject: SubjectTag,
    /// The digest of all fingerprinted arguments.
    pub fingerprint: [u8; 32],
    /// Per-argument tags, to name differing arguments in a conflict.
    pub arg_tags: Vec<[u8; 4]>,
    /// The token this claimer will hold if it wins.
    pub token: Token,
    /// Now.
    pub now: u64,
    /// When the operation stops being "the same" if this claim starts it: now + window (or
    /// retention). A takeover keeps the operation's own.
    pub window_end: u64,
    /// When a record this claim starts may be swept if it never settles (in progress under a
    /// dead holder, or unknown): the window end plus the unsettled retention.
    pub expires_at: u64,
    /// When this claimer's lease runs out unless renewed.
    pub lease_until: u64,
    /// What to do with a stale in-progress record.
    pub stale: StalePolicy,
    /// Whether the claimer's clock is known to agree with the ledger's closely enough to act on
    /// time: to treat a lapsed lease as a dead holder, or an ended window as the end of the
    /// operation. When `false`, a stale lease is answered "in flight" and a record past its
    /// window is treated as still live — waiting is safe, acting early is not.
    pub clock_trusted: bool,
    /// The tool, tenant and subject sealed under the secret ([`Label`]), kept with the record
    /// while it is unsettled so an operator can tell whose operation is stuck (`idem pending`).
    /// `None` where the ledger keeps no labels ([`Ledger::keeps_labels`]).
    pub label: Option<Vec<u8>>,
}

/// How the claimer won.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Won {
    /// There was no live record: a first call, an expired record, or a failed one.
    Fresh,
    /// A stale lease was taken over (policy `takeover`): the handler runs again.
    Takeover,
    /// A stale lease was taken over for reconciliation (policy `reconcile`): ask the downstream
    /// before running anything.
    Reconcile,
}

impl Won {
    /// The compact code a durable backend stores in the record's `attempt` column.
    #[cfg(any(feature = "_sea", feature = "redis", test))]
    #[must_use]
    pub(crate) const fn code(self) -> i16 {
        match self {
            Self::Fresh => 0,
            Self::Takeover => 1,
            Self::Reconcile => 2,
        }
    }

    /// The attempt a stored code stands for.
    #[cfg(any(feature = "_sea", feature = "redis", test))]
    #[must_use]
    pub(crate) const fn from_code(code: i16) -> Option<Self> {
        match code {
            0 => Some(Self::Fresh),
            1 => Some(Self::Takeover),
            2 => Some(Self::Reconcile),
            _ => None,
        }
    }
}

/// The answer to a claim.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Claim {
    /// The caller holds the claim with its request's token and must complete it.
    Won {
        /// How it won. A re-sent claim (same token) is told how the first send won.
        attempt: Won,
        /// The operation's window end: the request's own for a fresh claim, the operation's
        /// for a takeover. With the key, it names the operation downstream.
        window_end: u64,
    },
    /// Another holder's lease is live.
    InFlight {
        /// When that lease runs out unless renewed.
        lease_until: u64,
    },
    /// The operation completed; here are its stored bytes.
    Replay {
        /// The stored result, byte for byte.
        result: Vec<u8>,
    },
    /// The outcome is unknown.
    Unknown,
    /// The same key with different arguments.
    Conflict {
        /// The stored per-argument tags.
        arg_tags: Vec<[u8; 4]>,
    },
}

impl Claim {
    /// How the claim was won, if it was.
    #[must_use]
    pub const fn won(&self) -> Option<Won> {
        match self {
            Self::Won { attempt, .. } => Some(*attempt),
            _ => None,
        }
    }
}

/// How a holder ends its claim.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// Finished; these bytes are replayed to every repeat.
    Completed(Vec<u8>),
    /// Nothing happened; the next repeat runs again.
    Failed,
    /// Nobody can tell whether the effect happened.
    Unknown,
}

impl Outcome {
    /// The state this outcome records.
    #[must_use]
    pub const fn state(&self) -> State {
        match self {
            Self::Completed(_) => State::Completed,
            Self::Failed => State::Failed,
            Self::Unknown => State::Unknown,
        }
    }
}

/// An operator's (or reconcile function's) verdict on an unknown or stale record.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Resolution {
    /// It happened; store these bytes as its result.
    Completed(Vec<u8>),
    /// It did not happen; let the next repeat run.
    NothingHappened,
    /// A correction: the operation is completed with `unreadable` as its stored result (compared
    /// byte for byte), which no repeat could read; store `result` instead. What
    /// [`Admin::resolve`](crate::admin::Admin::resolve) sends for a "completed" verdict on such
    /// an operation — never for one whose result a repeat may have been answered with.
    Replace {
        /// The stored result it replaces, as the ledger holds it.
        unreadable: Vec<u8>,
        /// The result to store.
        result: Vec<u8>,
    },
}

/// What a status lookup reports.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StatusReport {
    /// The operation's key in the ledger (never forwarded: see [`StatusReport::idempotency_key`]).
    pub key: Key,
    /// The operation's ref.
    pub reference: Ref,
    /// Its state.
    pub state: State,
    /// When it was first claimed.
    pub created_at: u64,
    /// When a repeat stops counting as the same operation.
    pub window_end: u64,
    /// When the record may be swept.
    pub expires_at: u64,
    /// For an in-progress record: whether its lease has expired (its holder is presumed dead).
    pub lease_expired: bool,
    /// For a completed record: the stored result.
    pub result: Option<Vec<u8>>,
    /// Whether this is an unsettled operation that a newer one with the same key superseded
    /// after its window ended: kept for the operator until its retention passes.
    pub superseded: bool,
    /// The sealed [`Label`] (who and what the operation was), on a ledger that keeps labels:
    /// [`Admin::about`](crate::admin::Admin::about) opens it.
    pub label: Option<Vec<u8>>,
}

impl StatusReport {
    /// The operation's address: what an operator's verdict names.
    #[must_use]
    pub const fn address(&self) -> Address {
        Address { reference: self.reference, window_end: self.window_end }
    }

    /// The key its handler forwarded downstream ([`Key::idempotency_key`]): what the system
    /// that owns the side effect stores, and what an operator checks it for.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        self.key.idempotency_key(self.window_end)
    }
}

/// What [`Ledger::stats`] counts: how many records the ledger holds, by state, and what an
/// operator watches for — unsettled operations, and whether the sweep keeps up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerStats {
    /// Current records in progress (under a live lease or not).
    pub in_progress: u64,
    /// Of those, the ones whose lease has lapsed: their holder is presumed dead.
    pub stale: u64,
    /// Current records completed (their results are replayed).
    pub completed: u64,
    /// Current records failed (nothing happened; a repeat runs again).
    pub failed: u64,
    /// Current records whose outcome is unknown: an operator must resolve them.
    pub unknown: u64,
    /// Unsettled records a newer operation superseded, kept aside for the operator.
    pub superseded: u64,
    /// Of those, the ones still unknown.
    pub superseded_unknown: u64,
    /// Records (current or superseded) the sweep would delete now: many means nobody sweeps.
    pub sweepable: u64,
    /// When the oldest unknown operation (current or superseded) was first claimed, in
    /// milliseconds since the epoch on the ledger's clock.
    pub oldest_unknown: Option<u64>,
    /// The ledger's tables on disk, with their indexes, in bytes: PostgreSQL and MySQL measure
    /// the two tables; SQLite the whole database file (which the ledger normally has to itself).
    /// `None` where the backend cannot tell (the memory ledger).
    pub size_bytes: Option<u64>,
}

impl LedgerStats {
    /// Every record held: current and superseded.
    #[must_use]
    pub const fn total(&self) -> u64 {
        self.in_progress + self.completed + self.failed + self.unknown + self.superseded
    }
}

/// Which unsettled operations [`Ledger::pending`] lists: in progress (under a live lease or
/// not) and unknown, current or superseded, not past their retention — oldest first, a page at
/// a time.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingQuery {
    /// Only this state ([`State::InProgress`] or [`State::Unknown`]); `None` for both.
    pub state: Option<State>,
    /// Only records with one of these tenant tags (the tenant under each secret still
    /// honoured); empty for every tenant.
    pub tenants: Vec<TenantTag>,
    /// Only records first claimed at or before this time.
    pub claimed_by: u64,
    /// The page after this one: the `(created_at, ref)` of the last record of the page before.
    pub after: Option<(u64, Ref)>,
    /// At most this many records.
    pub limit: usize,
}

impl PendingQuery {
    /// The first `limit` unsettled records, of every tenant, claimed at any time.
    #[must_use]
    pub const fn new(limit: usize) -> Self {
        Self { state: None, tenants: Vec::new(), claimed_by: u64::MAX, after: None, limit }
    }

    /// Whether `state` is one this query lists.
    #[must_use]
    pub fn wants(&self, state: State) -> bool {
        matches!(state, State::InProgress | State::Unknown) && self.state.is_none_or(|wanted| wanted == state)
    }
}

/// One record [`Ledger::pending`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingRecord {
    /// The operation's key in the ledger.
    pub key: Key,
    /// The operation's ref.
    pub reference: Ref,
    /// Its tenant's tag.
    pub tenant: TenantTag,
    /// Its state: in progress or unknown.
    pub state: State,
    /// When it was first claimed.
    pub created_at: u64,
    /// When its window ends.
    pub window_end: u64,
    /// When the sweep may delete it.
    pub expires_at: u64,
    /// When its holder's lease runs out (for an in-progress record).
    pub lease_until: u64,
    /// Whether a newer operation with the same key superseded it.
    pub superseded: bool,
    /// The sealed [`Label`], if the record has one.
    pub label: Option<Vec<u8>>,
}

/// A handler recorded as serving a tool, as an operator lists them (`idem tools`: the SQL
/// ledger's `tool_owners_all`, the Redis ledger's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOwner {
    /// The namespace of the tool's keys.
    pub namespace: String,
    /// The tool's name.
    pub tool: String,
    /// The handler: its path, or `name = "..."` for a pinned or hand-built recipe.
    pub owner: String,
    /// When a server last called it, in milliseconds since the Unix epoch (the ledger's clock).
    pub seen_at: u64,
}

/// Where idempotency records live.
///
/// Implementations must make [`claim`](Ledger::claim) one atomic step (a single statement under a
/// unique constraint, a compare-and-set on the record read, or a lock held across the decision)
/// and must refuse [`complete`](Ledger::complete), [`renew`](Ledger::renew) and
/// [`release`](Ledger::release) from anyone but the current token holder. The
/// `ledger_conformance` tests hold every implementation to the same behaviour.
///
/// # Time
///
/// Every time a ledger is given or returns is a `u64` count of milliseconds since the Unix
/// epoch **on the ledger's clock** ([`Ledger::now`]: the database server's), never a
/// `SystemTime`. Ledger time exists so that leases and windows do not depend on each replica's
/// clock, and a `SystemTime` would invite exactly the mistake it avoids: reading the local clock.
/// An integer is also what the SQL backends store (a `BIGINT`, compared and shifted in the
/// statement itself), and what the simulation and the model check step. Durations are added
/// before the call (`now + lease`), so a backend only compares.
pub trait Ledger: Send + Sync + 'static {
    /// Claims `request.key`, or reports the record that stands in the way. See [`Claim`].
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Extends a held lease to `lease_until`.
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Ends a held claim with `outcome`. The holder is `token` while the record is in progress —
    /// or unknown, when a `hold` policy flipped a late holder's lapsed lease: its result is then
    /// still recorded (an operator's verdict is never overwritten). A completed result is kept
    /// at least until `keep_until`, even past its window. [`LedgerError::Fenced`] if `token` no
    /// longer holds it.
    ///
    /// A holder whose unknown record was superseded by a newer operation after its window
    /// ended records its outcome on the superseded record (kept for the operator).
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Undoes a claim that runs nothing (its answer was lost, or it yielded to an operation
    /// found under a previous secret), and only what that claim did: a fresh claim is removed —
    /// nothing ran, and nothing is left that an operator or a status reader would take for an
    /// outcome; also if `hold` has meanwhile turned its lapsed lease "unknown", since only its
    /// own handler, which never ran, could have acted — and a takeover goes back to an
    /// in-progress record under a lapsed lease, so the tool's stale policy still applies to the
    /// operation.
    /// [`LedgerError::Fenced`] if `token` holds no in-progress claim (it never committed, or was
    /// superseded): there is nothing to undo.
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The record of `key`, by its full key, if it is not expired at `now`.
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// The operation `reference` of `tenant`, if any, that `subject` may see: its own, or one
    /// of its tenant's made tenant-wide ([`SubjectTag::TENANT`]). Never another tenant's or
    /// another subject's. The current record of its key, or else the newest superseded one.
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// Settles the operation at `address` of `tenant` — the current record of its key if its
    /// window ends there, else the superseded one that does; never another operation of the same
    /// key — if it is unknown, or in progress under a lease that has expired. A completed verdict
    /// is kept at least until `keep_until`. [`LedgerError::NotFound`] if no operation of the
    /// tenant has that address.
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The operation `reference` of `tenant`, whoever its subject — the operator's lookup, who
    /// knows the tenant but not necessarily the subject. Never another tenant's. With a
    /// `window_end`, the operation at that [`Address`] (current or superseded) or none; without,
    /// the current record of its key if it is not expired at `now`, or else the newest
    /// superseded one.
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// How many records the ledger holds, by state, as of `now`: see [`LedgerStats`]. Counts
    /// every record, expired or not (the sweep has not deleted them yet).
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>>;

    /// The unsettled records `query` asks for, as of `now`: oldest first (by `created_at`,
    /// then key), at most `query.limit`. What `idem pending` lists.
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>>;

    /// Whether the ledger keeps the sealed [`Label`] a claim carries, so a handle seals one
    /// per claim only for a ledger that keeps it. The ledgers of this crate do (an operator's
    /// verdict is checked against the shape of the tool its label names); the default does not,
    /// and a claim's label is then `None`.
    fn keeps_labels(&self) -> bool {
        false
    }

    /// Whether the ledger answers in this process without a round trip (the memory ledger).
    /// A handle coalesces identical concurrent claims only on a ledger that is not local, where
    /// each would cost a statement (and, on SQLite, a turn at the writer's lock).
    fn local(&self) -> bool {
        false
    }

    /// Deletes at most `limit` records whose retention ended by `now` — settled records past
    /// their window (or grace), unsettled ones past their unsettled retention, never a record
    /// under a live lease — returning how many. Call it repeatedly until it returns less than
    /// `limit`.
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>>;

    /// The ledger's own clock, in milliseconds since the Unix epoch, or `None` if it keeps
    /// none. Replicas measure their skew against it and state every time on it, so leases and
    /// windows do not depend on every replica's clock agreeing.
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>>;

    /// The check value the ledger keeps for secret `version` ([`Secret::check_value`]), if
    /// any — keeping `check` first when it keeps none and `check` is given, atomically, so the
    /// first replica to use a version sets it and every other compares against it. A reader
    /// (the operator's CLI) passes `None` and keeps nothing.
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>>;

    /// The secret versions whose operations may still be repeated, each with the time until
    /// which they may be (ledger time) — keeping first, when `live` is given as
    /// `(version, until)`, that operations keyed under `version` may be repeated until `until`
    /// (the later of it and the time kept wins, atomically; for a version whose check value
    /// [`Ledger::secret_check`] keeps). A serving handle keeps its current version's time ahead
    /// of every record it may make; a handle that honours a version of this list neither as its
    /// secret nor as a previous one refuses to serve while that version's time is ahead
    /// ([`SecretError::Rekeying`]): its repeats would run again. A version whose time was never
    /// kept is listed with 0, or not at all.
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>>;

    /// Records that the handler `owner` serves `tool` in `namespace`, seen at `now` (keeping the
    /// later time if it was seen before), and returns every owner recorded for that tool seen
    /// at or after `since` — this one included — in order. Two owners mean two different
    /// handlers answer to one tool name on this ledger, and would share operations: a handle
    /// refuses both ([`Rejection::DuplicateTool`](crate::Rejection::DuplicateTool)).
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>>;

    /// Keeps what operators are shown of `tool` in `namespace` — its facts (JSON: the result's
    /// shape, the stale policy), written by the handles that serve it at its first call — as
    /// seen at `now`: a later write replaces an earlier one (a new build's facts win), an
    /// earlier one changes nothing. The default keeps none: verdicts on such a ledger are not
    /// checked against the result's shape.
    fn keep_tool_facts<'a>(
        &'a self,
        _namespace: &'a str,
        _tool: &'a str,
        _facts: &'a str,
        _now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async { Ok(()) })
    }

    /// The facts kept for `tool` in `namespace` ([`Ledger::keep_tool_facts`]), if any.
    fn tool_facts<'a>(
        &'a self,
        _namespace: &'a str,
        _tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        Box::pin(async { Ok(None) })
    }

    /// The secret a handle on this ledger keys with when none is configured (in code or in
    /// `IDEM_SECRET`). The default refuses: a ledger that replicas share needs one secret given
    /// to all of them. [`MemoryLedger`](memory::MemoryLedger) uses a random secret per process
    /// (it forgets everything on restart anyway); the SQLite default keeps one beside its file.
    ///
    /// # Errors
    /// No secret can be had without configuration.
    fn default_secret(&self) -> Result<Secret, SecretError> {
        Err(SecretError::Required { ledger: "this ledger (it names no default secret)".to_owned() })
    }
}

impl<L: Ledger + ?Sized> Ledger for std::sync::Arc<L> {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        (**self).claim(request)
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).renew(key, token, lease_until)
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).complete(key, token, outcome, keep_until)
    }
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).release(key, token)
    }
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        (**self).lookup(key, now)
    }
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        (**self).status(tenant, subject, reference, now)
    }
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).resolve(tenant, address, resolution, now, keep_until)
    }
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        (**self).inspect(tenant, reference, window_end, now)
    }
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        (**self).stats(now)
    }
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        (**self).pending(query, now)
    }
    fn keeps_labels(&self) -> bool {
        (**self).keeps_labels()
    }
    fn local(&self) -> bool {
        (**self).local()
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        (**self).sweep(now, limit)
    }
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        (**self).now()
    }
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        (**self).secret_check(version, check)
    }
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        (**self).secret_versions(live)
    }
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        (**self).tool_owners(namespace, tool, owner, now, since)
    }
    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).keep_tool_facts(namespace, tool, facts, now)
    }
    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        (**self).tool_facts(namespace, tool)
    }
    fn default_secret(&self) -> Result<Secret, SecretError> {
        (**self).default_secret()
    }
}
