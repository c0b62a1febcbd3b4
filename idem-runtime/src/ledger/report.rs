//! What the ledger reports of its records: an operation's status, the counts by state, the
//! unsettled operations an operator pages through, and the handlers recorded per tool.

use super::State;
#[cfg(doc)]
use super::{Label, Ledger};
use crate::key::{Address, Key, Ref, TenantTag};

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
