//! What a call's path sends the ledger and is answered: the fencing token, a record's state, a
//! claim and how it was won or refused, how a holder ends it, and an operator's verdict.

use std::fmt;

#[cfg(doc)]
use super::{Label, Ledger};
use crate::key::{Key, SubjectTag, TenantTag};
use crate::recipe::StalePolicy;

/// A fencing token: identifies one holder of one claim. Random, so a holder whose record was
/// swept and claimed anew can never match its successor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Token(pub(super) u64);

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
