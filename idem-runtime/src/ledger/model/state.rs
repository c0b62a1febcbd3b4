//! The model's state: the record as hashable values, each client's phase, the ghost operations
//! and what the downstream saw; a ledger rebuilt from it, and the invariants a claim's answer
//! is checked against.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::super::{MemoryLedger, Record, Records};
use super::{LEASE, UNSETTLED, WINDOW, key, ready};
use crate::key::TenantTag;
use crate::ledger::{Claim, ClaimRequest, Ledger, State, Token, Won};
use crate::recipe::StalePolicy;

/// A stored record, as hashable values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Snap {
    state: i16,
    pub(super) token: u64,
    attempt: i16,
    created_at: u64,
    pub(super) window_end: u64,
    expires_at: u64,
    pub(super) lease_until: u64,
    result: Option<Vec<u8>>,
}

impl Snap {
    fn of(record: &Record) -> Self {
        Self {
            state: record.state.code(),
            token: record.token.0,
            attempt: record.attempt.code(),
            created_at: record.created_at,
            window_end: record.window_end,
            expires_at: record.expires_at,
            lease_until: record.lease_until,
            result: record.result.clone(),
        }
    }

    fn record(&self) -> Record {
        Record {
            tenant: TenantTag::from_bytes([7; 8]),
            subject: crate::key::SubjectTag::TENANT,
            fingerprint: [0; 32],
            arg_tags: Vec::new(),
            state: State::from_code(self.state).unwrap_or(State::Unknown),
            token: Token(self.token),
            attempt: Won::from_code(self.attempt).unwrap_or(Won::Fresh),
            created_at: self.created_at,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            result: self.result.clone(),
            label: None,
        }
    }

    pub(super) fn state(&self) -> State {
        State::from_code(self.state).unwrap_or(State::Unknown)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Phase {
    Idle,
    /// The claim committed (or not) but its answer was lost.
    /// Idem sends a claim at most twice (`resent`), then releases it.
    Lost {
        token: u64,
        lease_until: u64,
        resent: bool,
    },
    /// Holds the claim: `op` is the operation the record stood for when it won (ghost), and
    /// `window_end` the window the ledger's answer gave (which names the forwarded key).
    /// `finished`: the handler returned and its completion is being (re)sent.
    /// `lease_until`: the lease as this holder knows it (it acts only before then, as a handler
    /// asking `lease_lost()` does); `rerun`: it took over a stale lease.
    Holding {
        token: u64,
        op: u8,
        window_end: u64,
        reconcile: bool,
        acted: bool,
        finished: bool,
        lease_until: u64,
        rerun: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Op {
    /// The clock when it started, and its window.
    pub(super) created: u64,
    pub(super) window_end: u64,
    pub(super) effects: u8,
    pub(super) runs: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    pub(super) time: u64,
    pub(super) record: Option<Snap>,
    pub(super) superseded: Vec<(u64, Snap)>,
    /// The ghost operation the current record stands for.
    pub(super) op: u8,
    pub(super) ops: Vec<Op>,
    pub(super) clients: Vec<(Phase, u8)>,
    pub(super) next_token: u64,
    /// Which forwarded keys (window ends) the downstream has seen, and for which operation.
    pub(super) downstream: BTreeMap<u64, u8>,
    /// The stored result the ledger must replay, and until when.
    pub(super) completed: Option<(Vec<u8>, u64)>,
    /// Takeover tokens (a release of theirs must give the lease back).
    pub(super) takeovers: Vec<u64>,
    pub(super) violations: Vec<&'static str>,
}

impl Sys {
    pub(super) fn ledger(&self) -> MemoryLedger {
        let mut records = Records::default();
        if let Some(snap) = &self.record {
            records.current.insert(key(), snap.record());
        }
        for (window_end, snap) in &self.superseded {
            records.superseded.insert((key(), *window_end), snap.record());
        }
        MemoryLedger { records: Mutex::new(records), ..MemoryLedger::default() }
    }

    pub(super) fn store(&mut self, ledger: &MemoryLedger) {
        let records = ledger.lock();
        self.record = records.current.get(&key()).map(Snap::of);
        self.superseded = records.superseded.iter().map(|((_, w), r)| (*w, Snap::of(r))).collect();
    }

    pub(super) fn violate(&mut self, name: &'static str) {
        if !self.violations.contains(&name) {
            self.violations.push(name);
        }
    }

    fn request(&self, token: u64, policy: StalePolicy, sent_at: u64) -> ClaimRequest {
        let window_end = sent_at + WINDOW;
        ClaimRequest {
            key: key(),
            tenant: TenantTag::from_bytes([7; 8]),
            subject: crate::key::SubjectTag::TENANT,
            fingerprint: [0; 32],
            arg_tags: Vec::new(),
            token: Token(token),
            now: sent_at,
            window_end,
            expires_at: window_end + UNSETTLED,
            lease_until: sent_at + LEASE,
            stale: policy,
            clock_trusted: true,
            label: None,
        }
    }

    /// Sends a claim for client `c` with `token`; returns the answer, having checked it.
    /// A re-send carries the request as it was first `sent_at`; the ledger runs it now.
    pub(super) fn claim(&mut self, token: u64, policy: StalePolicy, sent_at: u64) -> Claim {
        let pre = self.record.clone();
        let ledger = self.ledger();
        let request = self.request(token, policy, sent_at);
        let answer = ready(ledger.claim(&request)).unwrap_or(Claim::Unknown);
        self.store(&ledger);
        let post = self.record.clone();
        let now = self.time;
        let stale_action = |pre: &Option<Snap>| {
            pre.as_ref()
                .map(|pre| (pre.state() == State::InProgress && pre.lease_until > now, sent_at >= pre.window_end))
        };
        match &answer {
            Claim::Won { .. } => {
                let post = post.unwrap_or_else(|| unreachable!("a won claim leaves a record"));
                let taken_from = pre.as_ref().filter(|pre| pre.token != token);
                // A new record (a new operation), not a takeover or a re-send of a won claim: there
                // was none, or it was settled, or it was superseded with a new window.
                let fresh = pre
                    .as_ref()
                    .is_none_or(|pre| pre.state() != State::InProgress || pre.window_end != post.window_end);
                if fresh {
                    if let Some((_, until)) = &self.completed
                        && now < *until
                    {
                        self.violate("completed_result_kept");
                    }
                    self.completed = None;
                    self.takeovers.retain(|t| *t != token);
                    self.ops.push(Op { created: now, window_end: post.window_end, effects: 0, runs: 0 });
                    self.op = u8::try_from(self.ops.len() - 1).unwrap_or(u8::MAX);
                } else if taken_from.is_some() {
                    self.takeovers.push(token);
                    if let Some((live, past_window)) = stale_action(&pre) {
                        if live {
                            self.violate("no_takeover_of_live_lease");
                        }
                        if past_window {
                            self.violate("unsettled_superseded_after_window");
                        }
                    }
                }
            }
            Claim::Replay { result } if self.completed.as_ref().is_none_or(|(bytes, _)| bytes != result) => {
                self.violate("replay_carries_stored_bytes");
            }
            Claim::Unknown => {
                if let Some((live, past_window)) = stale_action(&pre) {
                    if live {
                        self.violate("no_takeover_of_live_lease");
                    }
                    if past_window {
                        self.violate("unsettled_superseded_after_window");
                    }
                }
            }
            _ => {}
        }
        answer
    }

    pub(super) fn holding(&self, token: u64, lease_until: u64, answer: &Claim) -> Option<Phase> {
        match answer {
            Claim::Won { attempt, window_end } => Some(Phase::Holding {
                token,
                op: self.op,
                window_end: *window_end,
                reconcile: *attempt == Won::Reconcile,
                acted: false,
                finished: false,
                lease_until,
                rerun: *attempt != Won::Fresh,
            }),
            _ => None,
        }
    }
}
