//! The operator's list of operations to look at: unsettled ones — unknown, or in progress
//! (under a live lease, or a lapsed one whose holder is presumed dead) — oldest first, a page at
//! a time, with whose they are and which tool made them, opened from their sealed labels. What
//! `idem pending` prints.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::key::{Address, Key, Ref, TenantTag};
use crate::ledger::{Label, PendingQuery, State, lease_lapsed, open_label};

use super::Admin;
use super::admin::StatusError;
use super::keyring::Check;
use super::time::millis;

/// Which unsettled operations [`Admin::pending`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingFilter {
    state: Option<State>,
    tenant: Option<String>,
    older_than: Option<Duration>,
    after: Option<PendingCursor>,
    limit: usize,
}

impl PendingFilter {
    /// Unknown and in-progress operations of every tenant, `limit` per page (at least 1).
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self { state: None, tenant: None, older_than: None, after: None, limit: limit.max(1) }
    }

    /// Only operations in `state` ([`State::Unknown`] or [`State::InProgress`]; a settled state
    /// lists nothing).
    #[must_use]
    pub const fn state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// Only operations of `tenant`.
    #[must_use]
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only operations first claimed at least `age` ago.
    #[must_use]
    pub const fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// The page after the one that gave `cursor` as its [`PendingPage::next`].
    #[must_use]
    pub const fn after(mut self, cursor: PendingCursor) -> Self {
        self.after = Some(cursor);
        self
    }
}

/// Where a page of [`Admin::pending`] ended: `<created_at ms>-<ref>`, to pass back with
/// [`PendingFilter::after`] (or `idem pending --after`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingCursor {
    created_at: u64,
    reference: Ref,
}

impl fmt::Display for PendingCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.created_at, self.reference)
    }
}

/// A cursor that is not one [`PendingPage::next`] gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorError(String);

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a page cursor: pass back the `next` a page printed (like 1764633600000-3f2a9c1e0b7d4e65)",
            self.0
        )
    }
}

impl std::error::Error for CursorError {}

impl FromStr for PendingCursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || CursorError(text.to_owned());
        let (at, reference) = text.trim().split_once('-').ok_or_else(invalid)?;
        Ok(Self {
            created_at: at.parse().map_err(|_| invalid())?,
            reference: Ref::parse(reference).map_err(|_| invalid())?,
        })
    }
}

/// One operation [`Admin::pending`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingOperation {
    /// Its key in the ledger (never forwarded: see [`PendingOperation::idempotency_key`]).
    pub key: Key,
    /// Its ref (see [`PendingOperation::address`] for what names it alone).
    pub reference: Ref,
    /// In progress or unknown.
    pub state: State,
    /// When it was first claimed, in milliseconds since the epoch on the ledger's clock.
    pub created_at: u64,
    /// When its window ends (a repeat after it starts a new operation).
    pub window_end: u64,
    /// When the sweep may delete it.
    pub expires_at: u64,
    /// When its holder's lease runs out unless renewed (an in-progress operation).
    pub lease_until: u64,
    /// In progress under a lease that has run out: its holder is presumed dead.
    pub lease_expired: bool,
    /// A newer operation with the same key replaced it after its window; kept for the operator.
    pub superseded: bool,
    /// Its tool, tenant and subject; `None` for a record made before labels were kept, or
    /// sealed under a secret this handle no longer honours.
    pub label: Option<Label>,
}

impl PendingOperation {
    /// Its address: what `idem show` and `idem resolve` take, and no other operation has.
    #[must_use]
    pub const fn address(&self) -> Address {
        Address { reference: self.reference, window_end: self.window_end }
    }

    /// The key its handler forwarded downstream: what the system that owns the side effect
    /// stores, and what an operator checks it for.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        self.key.idempotency_key(self.window_end)
    }
}

/// A page of [`Admin::pending`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingPage {
    /// The operations, oldest first.
    pub operations: Vec<PendingOperation>,
    /// The cursor of the next page, if this one was full.
    pub next: Option<PendingCursor>,
    /// The ledger's clock when it was read: what ages are measured from.
    pub now: u64,
}

impl Admin<'_> {
    /// The unsettled operations an operator should look at — unknown, or in progress (alive,
    /// or under a lapsed lease) — current and superseded, not yet past their retention, oldest
    /// first: what `idem pending` prints. Each names its tool, tenant and subject when its
    /// record keeps a label (durable ledgers do, from this version on).
    ///
    /// For operators only, like [`Admin::inspect`]: it crosses tenants.
    ///
    /// A tenant filter looks under the current secret and the newest previous one.
    ///
    /// # Errors
    /// No usable secret (with a tenant filter), or the ledger's failure.
    pub async fn pending(self, filter: &PendingFilter) -> Result<PendingPage, StatusError> {
        let keyring = self.idem.keyring(Check::Compare).await?;
        let (now, _) = self.idem.ledger_time().await?;
        let mut query = PendingQuery::new(filter.limit);
        query.state = filter.state;
        if let Some(tenant) = &filter.tenant {
            query.tenants = keyring.all().take(2).map(|secret| TenantTag::of(secret, tenant)).collect();
        }
        if let Some(age) = filter.older_than {
            query.claimed_by = now.saturating_sub(millis(age));
        }
        query.after = filter.after.map(|cursor| (cursor.created_at, cursor.reference));
        let records = self.idem.inner.ledger.pending(&query, now).await?;
        let next = (records.len() >= filter.limit)
            .then(|| {
                records.last().map(|last| PendingCursor { created_at: last.created_at, reference: last.reference })
            })
            .flatten();
        let operations = records
            .into_iter()
            .map(|record| PendingOperation {
                key: record.key,
                reference: record.reference,
                state: record.state,
                created_at: record.created_at,
                window_end: record.window_end,
                expires_at: record.expires_at,
                lease_until: record.lease_until,
                lease_expired: lease_lapsed(record.state, record.lease_until, now),
                superseded: record.superseded,
                label: record.label.as_deref().and_then(|sealed| open_label(keyring.all(), sealed)),
            })
            .collect();
        Ok(PendingPage { operations, next, now })
    }
}
