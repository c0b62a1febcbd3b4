//! A model check of the ledger protocol (issue 18, item 4), with `stateright`.
//!
//! The state is the one record of one key in the real [`MemoryLedger`] (and the records it
//! superseded), the clients' phases, a small clock, and what the downstream saw. Every transition
//! runs the real ledger — `claim` (and so `RecordView::judge`, the one decision function), `renew`,
//! `complete`, `release`, `resolve` — on a ledger rebuilt from the state, and reads the record
//! back. Answers can be lost (a claim or a completion that committed), leases lapse as the clock
//! ticks, holders crash, an operator resolves. The checker explores every interleaving up to the
//! bounds below and checks the invariants the simulation checks, by the same names.
//!
//! `IDEM_MODEL_CLIENTS`, `IDEM_MODEL_CLAIMS` and `IDEM_MODEL_TICKS` change the bounds (see [`BOUNDS`]);
//! `IDEM_MODEL_RERUN_MAY_FAIL` lets a run that took over end "nothing happened" (finding 2 in
//! RELIABILITY.md).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use stateright::{Checker, Model, Property};

use super::{MemoryLedger, Record, Records};
use crate::key::{Key, TenantTag};
use crate::ledger::{Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, State, Token, Won};
use crate::recipe::StalePolicy;

const LEASE: u64 = 2;
const WINDOW: u64 = 4;
const GRACE: u64 = 2;
const UNSETTLED: u64 = 4;

/// A stored record, as hashable values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Snap {
    state: i16,
    token: u64,
    attempt: i16,
    created_at: u64,
    window_end: u64,
    expires_at: u64,
    lease_until: u64,
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

    fn state(&self) -> State {
        State::from_code(self.state).unwrap_or(State::Unknown)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
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
struct Op {
    /// The clock when it started, and its window.
    created: u64,
    window_end: u64,
    effects: u8,
    runs: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    time: u64,
    record: Option<Snap>,
    superseded: Vec<(u64, Snap)>,
    /// The ghost operation the current record stands for.
    op: u8,
    ops: Vec<Op>,
    clients: Vec<(Phase, u8)>,
    next_token: u64,
    /// Which forwarded keys (window ends) the downstream has seen, and for which operation.
    downstream: BTreeMap<u64, u8>,
    /// The stored result the ledger must replay, and until when.
    completed: Option<(Vec<u8>, u64)>,
    /// Takeover tokens (a release of theirs must give the lease back).
    takeovers: Vec<u64>,
    violations: Vec<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Act {
    Tick,
    Claim(usize, bool),
    Resend(usize, bool),
    Release(usize),
    Reconcile(usize),
    Effect(usize),
    Renew(usize),
    Complete(usize, bool),
    Crash(usize),
    Resolve,
}

pub(crate) struct LedgerModel {
    pub clients: usize,
    pub ticks: u64,
    pub policy: StalePolicy,
    /// Claims each client makes at most (each with a new token; re-sends keep theirs).
    pub claims: u8,
    /// Whether a run that took over a stale lease may end "nothing happened" without acting.
    pub rerun_may_fail: bool,
}

fn key() -> Key {
    Key::from_bytes([7; 32])
}

fn ready<T>(future: crate::ledger::BoxFuture<'_, T>) -> T {
    let mut future = future;
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("the memory ledger answers on the first poll"),
    }
}

impl Sys {
    fn ledger(&self) -> MemoryLedger {
        let mut records = Records::default();
        if let Some(snap) = &self.record {
            records.current.insert(key(), snap.record());
        }
        for (window_end, snap) in &self.superseded {
            records.superseded.insert((key(), *window_end), snap.record());
        }
        MemoryLedger { records: Mutex::new(records), ..MemoryLedger::default() }
    }

    fn store(&mut self, ledger: &MemoryLedger) {
        let records = ledger.lock();
        self.record = records.current.get(&key()).map(Snap::of);
        self.superseded = records.superseded.iter().map(|((_, w), r)| (*w, Snap::of(r))).collect();
    }

    fn violate(&mut self, name: &'static str) {
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
    fn claim(&mut self, token: u64, policy: StalePolicy, sent_at: u64) -> Claim {
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

    fn holding(&self, token: u64, lease_until: u64, answer: &Claim) -> Option<Phase> {
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

impl Model for LedgerModel {
    type State = Sys;
    type Action = Act;

    fn init_states(&self) -> Vec<Sys> {
        vec![Sys {
            time: 1,
            record: None,
            superseded: Vec::new(),
            op: 0,
            ops: Vec::new(),
            clients: vec![(Phase::Idle, self.claims); self.clients],
            next_token: 1,
            downstream: BTreeMap::new(),
            completed: None,
            takeovers: Vec::new(),
            violations: Vec::new(),
        }]
    }

    fn actions(&self, state: &Sys, actions: &mut Vec<Act>) {
        if !state.violations.is_empty() {
            return;
        }
        if state.time < self.ticks {
            actions.push(Act::Tick);
        }
        if state.record.as_ref().is_some_and(|r| {
            r.state() == State::Unknown || r.state() == State::InProgress && r.lease_until <= state.time
        }) {
            actions.push(Act::Resolve);
        }
        for (c, (phase, left)) in state.clients.iter().enumerate() {
            match phase {
                Phase::Idle if *left > 0 => {
                    actions.push(Act::Claim(c, false));
                    actions.push(Act::Claim(c, true));
                }
                Phase::Idle => {}
                Phase::Lost { resent, .. } => {
                    if !resent {
                        actions.push(Act::Resend(c, false));
                        actions.push(Act::Resend(c, true));
                    }
                    actions.push(Act::Release(c));
                    actions.push(Act::Crash(c));
                }
                Phase::Holding { reconcile: true, .. } => {
                    actions.push(Act::Reconcile(c));
                    actions.push(Act::Crash(c));
                }
                Phase::Holding { acted, finished, lease_until, rerun, .. } => {
                    if !acted && !finished && state.time < *lease_until {
                        actions.push(Act::Effect(c));
                    }
                    if !finished {
                        actions.push(Act::Renew(c));
                    }
                    // A run that took over and did not act ends "nothing happened" too: the
                    // orchestration then gives the lease back instead of recording failed (model
                    // finding 1 in RELIABILITY.md, fixed). `IDEM_MODEL_RERUN_MAY_FAIL` models
                    // the old completion as failed.
                    let _ = rerun;
                    actions.push(Act::Complete(c, false));
                    actions.push(Act::Complete(c, true));
                    actions.push(Act::Crash(c));
                }
            }
        }
    }

    #[allow(clippy::too_many_lines)]
    fn next_state(&self, last: &Sys, action: Act) -> Option<Sys> {
        let mut s = last.clone();
        match action {
            Act::Tick => s.time += 1,
            Act::Claim(c, lost) => {
                let token = s.next_token;
                s.next_token += 1;
                s.clients[c].1 -= 1;
                let answer = s.claim(token, self.policy, s.time);
                let lease_until = s.time + LEASE;
                s.clients[c].0 = if lost {
                    Phase::Lost { token, lease_until, resent: false }
                } else {
                    s.holding(token, lease_until, &answer).unwrap_or(Phase::Idle)
                };
            }
            Act::Resend(c, lost) => {
                // A re-send is the same request: same time, same lease.
                let Phase::Lost { token, lease_until, resent: false } = s.clients[c].0 else { return None };
                let answer = s.claim(token, self.policy, lease_until - LEASE);
                s.clients[c].0 = if lost {
                    Phase::Lost { token, lease_until, resent: true }
                } else {
                    s.holding(token, lease_until, &answer).unwrap_or(Phase::Idle)
                };
            }
            Act::Release(c) => {
                let Phase::Lost { token, .. } = s.clients[c].0 else { return None };
                let ledger = s.ledger();
                let answer = ready(ledger.release(&key(), Token(token)));
                s.store(&ledger);
                if answer.is_ok()
                    && s.takeovers.contains(&token)
                    && s.record.as_ref().is_none_or(|r| r.state() != State::InProgress)
                {
                    s.violate("release_undoes_only_its_claim");
                }
                s.clients[c].0 = Phase::Idle;
            }
            Act::Reconcile(c) => {
                let Phase::Holding { token, op, window_end, lease_until, .. } = s.clients[c].0 else { return None };
                if let Some(seen) = s.downstream.get(&window_end).copied() {
                    // It happened: record the downstream's result as the handler's.
                    let ledger = s.ledger();
                    let keep_until = s.time + GRACE;
                    let bytes = vec![seen];
                    let pre = s.record.clone();
                    if ready(ledger.complete(&key(), Token(token), Outcome::Completed(bytes.clone()), keep_until))
                        .is_ok()
                        && pre.as_ref().is_some_and(|pre| pre.token == token)
                    {
                        s.completed = Some((bytes, pre.map_or(keep_until, |p| p.window_end.max(keep_until))));
                    }
                    s.store(&ledger);
                    s.clients[c].0 = Phase::Idle;
                } else {
                    s.clients[c].0 = Phase::Holding {
                        token,
                        op,
                        window_end,
                        reconcile: false,
                        acted: false,
                        finished: false,
                        lease_until,
                        rerun: true,
                    };
                }
            }
            Act::Effect(c) => {
                let Phase::Holding { token, op, window_end, reconcile, lease_until, rerun, .. } = s.clients[c].0 else {
                    return None;
                };
                let info = s.ops[usize::from(op)].clone();
                if window_end != info.window_end {
                    s.violate("forwarded_key_names_the_operation");
                }
                if self.policy == StalePolicy::Reconcile && rerun && info.effects > 0 {
                    s.violate("reconcile_never_reruns_after_happened");
                }
                if self.policy == StalePolicy::Hold && info.runs > 0 {
                    s.violate("hold_runs_once_until_resolved");
                }
                s.ops[usize::from(op)].runs += 1;
                if let std::collections::btree_map::Entry::Vacant(entry) = s.downstream.entry(window_end) {
                    entry.insert(op);
                    s.ops[usize::from(op)].effects += 1;
                    if s.ops[usize::from(op)].effects > 1 {
                        s.violate("at_most_one_effect_per_operation");
                    }
                    let this = s.ops[usize::from(op)].clone();
                    let overlapping = s.ops.iter().enumerate().any(|(i, other)| {
                        i != usize::from(op) && other.effects > 0 && {
                            let (early_end, late_start) = if other.created <= this.created {
                                (other.window_end, this.created)
                            } else {
                                (this.window_end, other.created)
                            };
                            late_start < early_end
                        }
                    });
                    if overlapping {
                        s.violate("no_second_effect_within_window");
                    }
                }
                s.clients[c].0 = Phase::Holding {
                    token,
                    op,
                    window_end,
                    reconcile,
                    acted: true,
                    finished: false,
                    lease_until,
                    rerun,
                };
            }
            Act::Renew(c) => {
                let Phase::Holding { token, op, window_end, reconcile, acted, finished, lease_until, rerun } =
                    s.clients[c].0
                else {
                    return None;
                };
                let ledger = s.ledger();
                let until = s.time + LEASE;
                let renewed = ready(ledger.renew(&key(), Token(token), until)).is_ok();
                s.store(&ledger);
                let lease_until = if renewed { lease_until.max(until) } else { lease_until };
                s.clients[c].0 =
                    Phase::Holding { token, op, window_end, reconcile, acted, finished, lease_until, rerun };
            }
            Act::Complete(c, lost) => {
                let Phase::Holding { token, op, acted, rerun, .. } = s.clients[c].0 else { return None };
                let ledger = s.ledger();
                let keep_until = s.time + GRACE;
                let pre = s.record.clone();
                let outcome = if acted { Outcome::Completed(vec![op]) } else { Outcome::Failed };
                // As the orchestration does: a run that took over and did nothing gives its lease
                // back rather than recording "failed" for an operation its predecessor may have
                // carried out.
                let answer = if !acted && rerun && !self.rerun_may_fail {
                    ready(ledger.release(&key(), Token(token)))
                } else {
                    ready(ledger.complete(&key(), Token(token), outcome.clone(), keep_until))
                };
                s.store(&ledger);
                let holds = pre.as_ref().is_some_and(|pre| pre.token == token);
                match answer {
                    Ok(()) if holds => {
                        if let Outcome::Completed(bytes) = outcome {
                            if s.completed.as_ref().is_some_and(|(old, _)| *old != bytes) {
                                s.violate("completed_result_never_changed");
                            }
                            let window_end = pre.map_or(0, |p| p.window_end);
                            s.completed = Some((bytes, window_end.max(keep_until)));
                        }
                    }
                    Ok(()) => {
                        let superseded = last.superseded.iter().any(|(_, r)| r.token == token);
                        if !superseded {
                            s.violate("superseded_holder_never_overwrites");
                        }
                    }
                    Err(LedgerError::Fenced) => {
                        if holds && pre.is_some_and(|p| matches!(p.state(), State::InProgress | State::Unknown)) {
                            s.violate("late_holder_result_recorded");
                        }
                    }
                    Err(_) => {}
                }
                s.clients[c].0 = if lost {
                    let Phase::Holding { token, op, window_end, reconcile, acted, lease_until, rerun, .. } =
                        s.clients[c].0
                    else {
                        return None;
                    };
                    Phase::Holding { token, op, window_end, reconcile, acted, finished: true, lease_until, rerun }
                } else {
                    Phase::Idle
                };
            }
            Act::Crash(c) => s.clients[c].0 = Phase::Idle,
            Act::Resolve => {
                let record = s.record.clone()?;
                let op = s.op;
                let seen = s.downstream.values().any(|o| *o == op);
                let running =
                    s.clients.iter().any(|(phase, _)| matches!(phase, Phase::Holding { op: o, .. } if *o == op));
                let resolution = if seen {
                    Resolution::Completed(vec![op])
                } else if running {
                    return None;
                } else {
                    Resolution::NothingHappened
                };
                let ledger = s.ledger();
                let keep_until = s.time + GRACE;
                let address = crate::key::Address { reference: key().reference(), window_end: record.window_end };
                let answer = ready(ledger.resolve(
                    TenantTag::from_bytes([7; 8]),
                    address,
                    resolution.clone(),
                    s.time,
                    keep_until,
                ));
                s.store(&ledger);
                if answer.is_ok()
                    && let Resolution::Completed(bytes) = resolution
                {
                    s.completed = Some((bytes, record.window_end.max(keep_until)));
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("every invariant holds", |_, s: &Sys| s.violations.is_empty()),
            Property::sometimes("a takeover or reconcile runs", |_, s: &Sys| !s.takeovers.is_empty()),
            Property::sometimes("a result is replayed after a completion", |_, s: &Sys| s.completed.is_some()),
        ]
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The bounds explored by default, each exhaustively: wide (two claims per client, four ticks:
/// re-sends, releases and takeovers between more claims) and deep (one claim each, six ticks:
/// windows end, late results settle, unsettled records are superseded).
const BOUNDS: [(u8, u64); 2] = [(2, 4), (1, 6)];

/// Explores the protocol under `policy` exhaustively within each bound (`IDEM_MODEL_CLAIMS` and
/// `IDEM_MODEL_TICKS` give one bound instead); returns the states explored and the first broken
/// invariant with the path to it.
pub(crate) fn check(policy: StalePolicy) -> (usize, Option<String>) {
    let bounds = match (std::env::var_os("IDEM_MODEL_CLAIMS"), std::env::var_os("IDEM_MODEL_TICKS")) {
        (None, None) => BOUNDS.to_vec(),
        _ => vec![(u8::try_from(env("IDEM_MODEL_CLAIMS", 2)).unwrap_or(2), env("IDEM_MODEL_TICKS", 4))],
    };
    let mut states = 0;
    for (claims, ticks) in bounds {
        let model = LedgerModel {
            clients: usize::try_from(env("IDEM_MODEL_CLIENTS", 2)).unwrap_or(2),
            ticks,
            policy,
            claims,
            rerun_may_fail: std::env::var_os("IDEM_MODEL_RERUN_MAY_FAIL").is_some(),
        };
        let checker = model.checker().threads(2).spawn_bfs().join();
        states += checker.unique_state_count();
        if let Some(path) = checker.discovery("every invariant holds") {
            let violations = path.last_state().violations.clone();
            return (states, Some(format!("{violations:?} after {:?}", path.into_actions())));
        }
    }
    (states, None)
}

#[test]
fn model_check_takeover() {
    let (states, broken) = check(StalePolicy::Takeover);
    eprintln!("takeover: {states} states explored");
    assert!(broken.is_none(), "takeover: {}", broken.unwrap_or_default());
}

#[test]
fn model_check_reconcile() {
    let (states, broken) = check(StalePolicy::Reconcile);
    eprintln!("reconcile: {states} states explored");
    assert!(broken.is_none(), "reconcile: {}", broken.unwrap_or_default());
}

#[test]
fn model_check_hold() {
    let (states, broken) = check(StalePolicy::Hold);
    eprintln!("hold: {states} states explored");
    assert!(broken.is_none(), "hold: {}", broken.unwrap_or_default());
}
