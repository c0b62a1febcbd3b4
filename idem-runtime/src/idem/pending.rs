//! The operator's list of operations to look at: unsettled ones — unknown, or in progress
//! (under a live lease, or a lapsed one whose holder is presumed dead) — oldest first, a page at
//! a time, with whose they are and which tool made them, opened from their sealed labels. What
//! `idem pending` prints ([`Admin::pending`](super::Admin::pending) asks the ledger; this room
//! holds what it is asked with and answers).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::key::{Address, Key, Ref};
use crate::ledger::{Label, State};

/// Which unsettled operations [`Admin::pending`](super::Admin::pending) lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingFilter {
    pub(super) state: Option<State>,
    pub(super) tenant: Option<String>,
    pub(super) older_than: Option<Duration>,
    pub(super) after: Option<PendingCursor>,
    pub(super) limit: usize,
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

/// Where a page of [`Admin::pending`](super::Admin::pending) ended: `<created_at ms>-<ref>`, to pass back with
/// [`PendingFilter::after`] (or `idem pending --after`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingCursor {
    pub(super) created_at: u64,
    pub(super) reference: Ref,
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

/// One operation [`Admin::pending`](super::Admin::pending) lists.
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

/// A page of [`Admin::pending`](super::Admin::pending).
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
