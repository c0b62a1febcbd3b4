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
//! read followed by a write — and refuses a completion from anyone but the current holder.

pub mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub mod sea;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::key::{Key, Ref, TenantTag};
use crate::recipe::StalePolicy;

/// A boxed, sendable future: keeps [`Ledger`] object-safe so `Arc<dyn Ledger>` can be chosen at
/// run time (by URL).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fencing token: identifies one holder of one claim. Random, so a holder whose record was
/// swept and claimed anew can never match its successor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Token(pub u64);

impl Token {
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
        let seed = *SEED.get_or_init(|| {
            let mut bytes = [0u8; 8];
            #[allow(clippy::expect_used)]
            getrandom::fill(&mut bytes).expect("the OS random number generator failed");
            u64::from_le_bytes(bytes)
        });
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
    /// The compact code a durable backend stores.
    #[must_use]
    pub const fn code(self) -> i16 {
        match self {
            Self::InProgress => 1,
            Self::Completed => 2,
            Self::Failed => 3,
            Self::Unknown => 4,
        }
    }

    /// The state a stored code stands for.
    #[must_use]
    pub const fn from_code(code: i16) -> Option<Self> {
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

/// One attempt to claim a key. Times are milliseconds since the Unix epoch, from the caller's
/// clock, so every backend compares the same numbers.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The operation's key.
    pub key: Key,
    /// The tenant, for scoped status lookups.
    pub tenant: TenantTag,
    /// The digest of all fingerprinted arguments.
    pub fingerprint: [u8; 32],
    /// Per-argument tags, to name differing arguments in a conflict.
    pub arg_tags: Vec<[u8; 4]>,
    /// The token this claimer will hold if it wins.
    pub token: Token,
    /// Now.
    pub now: u64,
    /// When the operation stops being "the same": first claim + window (or retention).
    pub expires_at: u64,
    /// When this claimer's lease runs out unless renewed.
    pub lease_until: u64,
    /// What to do with a stale in-progress record.
    pub stale: StalePolicy,
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

/// The answer to a claim.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Claim {
    /// The caller holds the claim with its request's token and must complete it.
    Won(Won),
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

/// An operator's (or reconcile function's) verdict on an unknown or stale record.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Resolution {
    /// It happened; store these bytes as its result.
    Completed(Vec<u8>),
    /// It did not happen; let the next repeat run.
    NothingHappened,
}

impl Resolution {
    /// "It happened, and this is its result": `value` encoded as the operation's handler would
    /// have stored it, so repeats replay it as the handler's `Ok` value.
    ///
    /// # Errors
    /// `value` cannot be serialised.
    pub fn completed<T: serde::Serialize>(value: &T) -> Result<Self, serde_json::Error> {
        let mut stored = serde_json::Map::new();
        stored.insert("ok".to_owned(), serde_json::to_value(value)?);
        serde_json::to_vec(&stored).map(Self::Completed)
    }
}

/// What a status lookup reports.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StatusReport {
    /// The operation's ref.
    pub reference: Ref,
    /// Its state.
    pub state: State,
    /// When it was first claimed.
    pub created_at: u64,
    /// When a repeat stops counting as the same operation.
    pub expires_at: u64,
    /// For an in-progress record: whether its lease has expired (its holder is presumed dead).
    pub lease_expired: bool,
    /// For a completed record: the stored result.
    pub result: Option<Vec<u8>>,
}

/// What a record stands for, seen by a claim at `request.now`: the one decision every backend
/// makes, here in one place so they cannot drift apart.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Absent, expired or failed: the claim takes it as a fresh operation.
    Fresh,
    /// In progress under a dead holder's lease, same arguments: the stale policy decides.
    Stale(StalePolicy),
    /// Someone else's live operation, a stored result, or a conflict: this is the answer.
    Answer(Claim),
}

/// The parts of a stored record a claim decides on.
pub(crate) struct RecordView<'a> {
    pub state: State,
    pub token: Token,
    pub expires_at: u64,
    pub lease_until: u64,
    pub fingerprint: &'a [u8],
    pub arg_tags: &'a [[u8; 4]],
    pub result: Option<&'a [u8]>,
}

impl RecordView<'_> {
    /// Past its window, with an outcome that is settled: completed, or failed without effect.
    ///
    /// An in-progress record never expires by its window — a dead holder's operation goes
    /// through the tool's stale policy, never a silent re-run — and neither does an unknown
    /// one: it waits for an operator's [`Ledger::resolve`].
    pub(crate) fn expired(&self, now: u64) -> bool {
        self.expires_at <= now && matches!(self.state, State::Completed | State::Failed)
    }

    /// The decision for `request`.
    pub(crate) fn judge(&self, request: &ClaimRequest) -> Verdict {
        let now = request.now;
        if self.expired(now) || self.state == State::Failed {
            return Verdict::Fresh;
        }
        if self.state == State::InProgress && self.token == request.token {
            // This very request won already: its answer was lost and it was sent again.
            return Verdict::Answer(Claim::Won(Won::Fresh));
        }
        if self.fingerprint != request.fingerprint {
            return Verdict::Answer(Claim::Conflict { arg_tags: self.arg_tags.to_vec() });
        }
        match self.state {
            State::Completed => Verdict::Answer(Claim::Replay { result: self.result.unwrap_or_default().to_vec() }),
            State::InProgress if self.lease_until > now => {
                Verdict::Answer(Claim::InFlight { lease_until: self.lease_until })
            }
            State::InProgress => Verdict::Stale(request.stale),
            State::Unknown | State::Failed => Verdict::Answer(Claim::Unknown),
        }
    }
}

/// How a stale lease taken by `policy` is reported to the new holder.
pub(crate) const fn won_stale(policy: StalePolicy) -> Won {
    match policy {
        StalePolicy::Reconcile => Won::Reconcile,
        _ => Won::Takeover,
    }
}

/// A ledger failure.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum LedgerError {
    /// The ledger could not be reached or refused the statement. Nothing was claimed.
    Unavailable {
        /// The backend's words, for operators.
        detail: String,
    },
    /// The caller no longer holds the claim (its lease was taken over); nothing was written.
    Fenced,
    /// No record for this ref in this tenant.
    NotFound,
    /// The record is in a state this operation does not apply to.
    NotResolvable {
        /// Its state.
        state: State,
    },
    /// A stored record could not be read back.
    Corrupt {
        /// What was wrong.
        detail: String,
    },
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable { detail } => write!(f, "the idempotency ledger is unavailable: {detail}"),
            Self::Fenced => f.write_str(
                "this claim was superseded (its lease expired and was taken over); the result was not recorded",
            ),
            Self::NotFound => f.write_str("no operation with this ref exists for this tenant"),
            Self::NotResolvable { state } => {
                write!(f, "the operation is {state}; only unknown or stale in-progress operations can be resolved")
            }
            Self::Corrupt { detail } => write!(f, "a ledger record could not be read: {detail}"),
        }
    }
}

impl std::error::Error for LedgerError {}

/// Where idempotency records live.
///
/// Implementations must make [`claim`](Ledger::claim) one atomic step (a single statement under a
/// unique constraint, or a lock held across the decision) and must refuse
/// [`complete`](Ledger::complete) and [`renew`](Ledger::renew) from anyone but the current token
/// holder. The `ledger_conformance` tests hold every implementation to the same behaviour.
pub trait Ledger: Send + Sync + 'static {
    /// Claims `request.key`, or reports the record that stands in the way. See [`Claim`].
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Extends a held lease to `lease_until`.
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Ends a held claim with `outcome`. [`LedgerError::Fenced`] if `token` no longer holds it.
    fn complete<'a>(&'a self, key: &'a Key, token: Token, outcome: Outcome) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The operation `reference` of `tenant`, if any. Never another tenant's.
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// Settles an unknown record, or an in-progress one whose lease has expired.
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Deletes at most `limit` settled (completed or failed) records whose window ended by `now`,
    /// returning how many. Call it repeatedly until it returns less than `limit`.
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>>;
}

impl<L: Ledger + ?Sized> Ledger for std::sync::Arc<L> {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        (**self).claim(request)
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).renew(key, token, lease_until)
    }
    fn complete<'a>(&'a self, key: &'a Key, token: Token, outcome: Outcome) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).complete(key, token, outcome)
    }
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        (**self).status(tenant, reference, now)
    }
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        (**self).resolve(tenant, reference, resolution, now)
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        (**self).sweep(now, limit)
    }
}
