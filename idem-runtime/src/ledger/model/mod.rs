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

mod state;
mod transitions;

use std::task::{Context, Poll, Waker};

use stateright::{Checker, Model};

use crate::key::Key;
use crate::recipe::StalePolicy;

const LEASE: u64 = 2;
const WINDOW: u64 = 4;
const GRACE: u64 = 2;
const UNSETTLED: u64 = 4;

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
