//! The one decision over a found record ([`RecordView::judge`]) and the rules it applies — when
//! an operation is still held, when it is superseded, how long a settled record is kept — here
//! in one place, so no backend and no caller re-derives them.

use super::{Claim, ClaimRequest, State, Token, Won};
use crate::recipe::StalePolicy;

/// What a record stands for, seen by a claim at `request.now`: the one decision every backend
/// makes, here in one place so they cannot drift apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Absent, expired or failed: the claim takes it as a fresh operation.
    Fresh,
    /// Unsettled (unknown, or in progress under a dead holder) and past its window: a new
    /// operation starts, and the old record is kept aside for the operator.
    Supersede,
    /// In progress under a dead holder's lease, same arguments: the stale policy decides.
    Stale(StalePolicy),
    /// Someone else's live operation, a stored result, or a conflict: this is the answer.
    Answer(Claim),
}

/// The parts of a stored record a claim decides on.
pub(crate) struct RecordView<'a> {
    pub state: State,
    pub token: Token,
    pub attempt: Won,
    pub window_end: u64,
    pub expires_at: u64,
    pub lease_until: u64,
    pub fingerprint: &'a [u8],
    pub arg_tags: &'a [[u8; 4]],
    pub result: Option<&'a [u8]>,
}

impl RecordView<'_> {
    /// Settled (completed, or failed without effect) and kept no longer: the sweep may delete it
    /// and a claim treats it as absent.
    ///
    /// An in-progress record never expires this way — a dead holder's operation goes through
    /// the tool's stale policy, or is superseded once its window ended — and neither does an
    /// unknown one.
    pub(crate) fn expired(&self, now: u64) -> bool {
        self.expires_at <= now && matches!(self.state, State::Completed | State::Failed)
    }

    /// In progress under a lease that has run out by `now`: its holder is presumed dead.
    pub(crate) fn lease_expired(&self, now: u64) -> bool {
        lease_lapsed(self.state, self.lease_until, now)
    }

    /// Unknown, or in progress under a lapsed lease: what an operator may resolve at `now`.
    pub(crate) fn resolvable(&self, now: u64) -> bool {
        self.state == State::Unknown || self.lease_expired(now)
    }

    /// Whether the sweep may delete it at `now`: settled and expired, or unsettled with no live
    /// holder and past its (long) unsettled retention.
    pub(crate) fn sweepable(&self, now: u64) -> bool {
        self.expires_at <= now && (self.state != State::InProgress || self.lease_until <= now)
    }

    /// The decision for `request`.
    pub(crate) fn judge(&self, request: &ClaimRequest) -> Verdict {
        let now = request.now;
        let trusted = request.clock_trusted;
        if self.state == State::Failed || trusted && self.expired(now) {
            return Verdict::Fresh;
        }
        if self.state == State::InProgress && self.token == request.token {
            // This very request won already: its answer was lost and it was sent again. Report
            // how it won then — a takeover must not turn into a fresh operation on a re-send.
            return Verdict::Answer(Claim::Won { attempt: self.attempt, window_end: self.window_end });
        }
        let live = lease_live(self.state, self.lease_until, now);
        if superseded(self.state, live, self.window_end, now, trusted) {
            return Verdict::Supersede;
        }
        if self.fingerprint != request.fingerprint {
            return Verdict::Answer(Claim::Conflict { arg_tags: self.arg_tags.to_vec() });
        }
        match self.state {
            State::Completed => Verdict::Answer(Claim::Replay { result: self.result.unwrap_or_default().to_vec() }),
            State::InProgress if held(live, trusted) => {
                Verdict::Answer(Claim::InFlight { lease_until: self.lease_until })
            }
            State::InProgress => Verdict::Stale(request.stale),
            State::Unknown | State::Failed => Verdict::Answer(Claim::Unknown),
        }
    }
}

/// Whether the operation is in progress under a lease that runs past `now`: its holder may act.
fn lease_live(state: State, lease_until: u64, now: u64) -> bool {
    state == State::InProgress && lease_until > now
}

/// Whether the operation is in progress under a lease that has run out by `now`: its holder is
/// presumed dead.
pub(crate) fn lease_lapsed(state: State, lease_until: u64, now: u64) -> bool {
    state == State::InProgress && lease_until <= now
}

/// Whether an operation in progress is still held by its holder: its lease is live, or this
/// clock cannot be trusted to say it lapsed. The one rule a claim ([`RecordView::judge`]: "in
/// flight") and a waiter (it waits while the operation is held) apply.
pub(crate) const fn held(lease_live: bool, clock_trusted: bool) -> bool {
    lease_live || !clock_trusted
}

/// Whether an unsettled operation (in progress or unknown) is over at `now`, so a new claim of
/// its key supersedes it: nobody holds it, its window has ended, and this clock can be trusted.
/// The one rule a claim ([`RecordView::judge`]) and the look-up under a previous secret apply.
pub(crate) fn superseded(state: State, lease_live: bool, window_end: u64, now: u64, clock_trusted: bool) -> bool {
    let unsettled = matches!(state, State::InProgress | State::Unknown);
    unsettled && !(state == State::InProgress && lease_live) && clock_trusted && window_end <= now
}

/// How a stale lease taken by `policy` is reported to the new holder.
pub(crate) const fn won_stale(policy: StalePolicy) -> Won {
    match policy {
        StalePolicy::Reconcile => Won::Reconcile,
        _ => Won::Takeover,
    }
}

/// When a record that settles at `now` as `state` may be swept: a completed or failed one stays
/// at least until `keep_until` even if its window ended meanwhile (a slow handler, an operator's
/// verdict the next day: it stays readable for the verdict retention), and otherwise until its
/// window ends; an unknown one as claimed. A failed record in its window does not stand in a
/// repeat's way, so keeping it longer runs nothing twice.
pub(crate) fn settled_expiry(state: State, window_end: u64, expires_at: u64, keep_until: u64) -> u64 {
    match state {
        State::Completed | State::Failed => window_end.max(keep_until),
        State::InProgress | State::Unknown => expires_at.max(keep_until),
    }
}
