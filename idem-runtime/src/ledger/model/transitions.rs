//! The transitions: the actions each state allows, and each one run on the real ledger with the
//! invariants it checks.

use std::collections::BTreeMap;

use stateright::{Model, Property};

use super::state::{Phase, Sys};
use super::{GRACE, LEASE, LedgerModel, key, ready};
use crate::key::TenantTag;
use crate::ledger::{Ledger, LedgerError, Outcome, Resolution, State, Token};
use crate::recipe::StalePolicy;

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
