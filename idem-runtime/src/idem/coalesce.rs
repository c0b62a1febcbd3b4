//! One claim per operation at a time from this process: a storm of identical calls costs the
//! ledger one statement, not one per call.
//!
//! The first call of an operation (a key and the arguments' fingerprint) to reach the ledger
//! sends its claim; identical calls arriving meanwhile wait for that answer instead of sending
//! their own — which, on SQLite, would each queue for the single writer's lock, and elsewhere for
//! a pooled connection. Then:
//! - the claim was won: the holder runs in this process, so every identical call until its
//!   outcome is recorded is answered "in flight" at once, with no statement;
//! - it was answered (a replay, "in flight", "outcome unknown", a conflict): every waiter gets
//!   the same answer, as each would have got it from the ledger at that moment — the answer is
//!   the ledger's, for the same key and the same arguments. An "in flight" answer (another
//!   replica holds the operation) is also given, for [`IN_FLIGHT_REUSE`] after it arrived, to
//!   identical calls that come meanwhile: a storm that reaches this replica while another runs
//!   the operation costs the ledger one read per that much time, not one per call;
//! - it failed (the ledger did not answer), or the call was cancelled: each waiter claims on its
//!   own, exactly as without coalescing.
//!
//! A call with other arguments under the same key is never coalesced: it goes to the ledger,
//! which tells it of the conflict. Only ledgers that answer over a round trip are coalesced
//! ([`Ledger::local`](crate::ledger::Ledger::local) is false); the memory ledger already answers under
//! one lock. Nothing here decides who runs: the ledger's atomic claim still does, and a call of
//! another process (another replica) is never told anything from here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::key::Key;
use crate::ledger::{Claim, ClaimRequest};

/// How long an "in flight" answer from the ledger answers identical calls of this process
/// without a statement. It is the only answer given from memory after it arrived, and how stale
/// it can be: a repeat may be told "in flight" up to this long after the other replica recorded
/// the outcome (it asks again, and gets the replay). Anything else goes to the ledger.
pub(crate) const IN_FLIGHT_REUSE: Duration = Duration::from_millis(10);

/// The claims this process is sending or holding, by key. Shared by every clone of a handle.
#[derive(Default)]
pub(super) struct Claims {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_key: HashMap<Key, Entry>,
    /// Keys whose entry keeps an "in flight" answer, with when it stops, oldest first.
    reused: VecDeque<(Instant, Key)>,
}

struct Entry {
    /// The arguments' fingerprint of the call that claims (or holds) the key.
    fingerprint: [u8; 32],
    /// When that claim's lease runs out unless renewed (what "in flight" reports).
    lease_until: u64,
    /// `None` while its claim is on its way; then how it went.
    outcome: watch::Sender<Option<Shared>>,
    /// For an "in flight" answer kept for identical calls: until when.
    reused_until: Option<Instant>,
}

impl Entries {
    /// Drops the kept "in flight" answers whose time is up.
    fn forget_stale(&mut self, now: Instant) {
        while let Some(&(until, key)) = self.reused.front() {
            if until > now {
                break;
            }
            self.reused.pop_front();
            if self.by_key.get(&key).is_some_and(|entry| entry.reused_until == Some(until)) {
                self.by_key.remove(&key);
            }
        }
    }
}

/// How the first call's claim went, as the identical calls waiting on it see it. Each answer
/// carries the version of the secret its operation is keyed under: during a rotation the first
/// call may find the operation under a previous secret, and every call it answers must name
/// that operation (its ref, its argument tags), not the key it gave back.
#[derive(Clone, Debug)]
enum Shared {
    /// Won: the holder runs here until its guard drops.
    Held(u32),
    /// Answered by the ledger: the same answer for every identical call.
    Answered(Claim, u32),
    /// No answer to share: each claims on its own.
    Alone,
}

/// What a call does about its claim.
pub(super) enum Begin {
    /// Send it, and tell the calls that wait on it how it went ([`Pending`]).
    Claim(Pending),
    /// Identical to a claim this process sent: its answer, with no statement of its own, and
    /// the version of the secret the answering operation is keyed under.
    Answered(Claim, u32),
    /// Send it on its own (another call's arguments hold the key here, or nothing to share).
    Alone,
}

impl Claims {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the call that would send `request` proceeds; waits for an identical claim on its way
    /// — for at most `patience`, after which it claims on its own (a first call kept alive but
    /// no longer polled never wedges the calls that joined it).
    pub(super) async fn begin(self: &Arc<Self>, request: &ClaimRequest, patience: Duration) -> Begin {
        let mut outcome = {
            let mut entries = self.lock();
            // No clock read on a call's path unless an "in flight" answer is kept.
            if !entries.reused.is_empty() {
                entries.forget_stale(Instant::now());
            }
            match entries.by_key.get(&request.key) {
                None => {
                    let (outcome, _) = watch::channel(None);
                    let entry = Entry {
                        fingerprint: request.fingerprint,
                        lease_until: request.lease_until,
                        outcome,
                        reused_until: None,
                    };
                    entries.by_key.insert(request.key, entry);
                    return Begin::Claim(Pending { claims: Arc::clone(self), key: request.key, published: false });
                }
                Some(entry) if entry.fingerprint != request.fingerprint => return Begin::Alone,
                Some(entry) => match &*entry.outcome.borrow() {
                    Some(Shared::Held(version)) => {
                        return Begin::Answered(Claim::InFlight { lease_until: entry.lease_until }, *version);
                    }
                    Some(Shared::Answered(claim @ Claim::InFlight { .. }, version)) => {
                        return Begin::Answered(claim.clone(), *version);
                    }
                    _ => entry.outcome.subscribe(),
                },
            }
        };
        let lease_until = request.lease_until;
        // The sender lives as long as the entry; a dropped one (the entry went) shares nothing.
        let shared = async { outcome.wait_for(Option::is_some).await.map(|seen| seen.clone()) };
        match tokio::time::timeout(patience, shared).await {
            Ok(Ok(Some(Shared::Held(version)))) => Begin::Answered(Claim::InFlight { lease_until }, version),
            Ok(Ok(Some(Shared::Answered(claim, version)))) => Begin::Answered(claim, version),
            _ => Begin::Alone,
        }
    }
}

/// The claim of the first of identical calls, on its way. Dropped without [`Pending::won`] or
/// [`Pending::answered`] (an error, a cancelled call), its waiters claim on their own.
pub(super) struct Pending {
    claims: Arc<Claims>,
    key: Key,
    published: bool,
}

impl Pending {
    /// The claim was won, of an operation keyed under secret `version`: identical calls are
    /// answered "in flight" until the returned guard drops (once the outcome is recorded, or the
    /// call ends otherwise).
    pub(super) fn won(mut self, version: u32) -> Held {
        self.publish(Shared::Held(version), false);
        Held { claims: Arc::clone(&self.claims), key: self.key }
    }

    /// The claim was answered by an operation keyed under secret `version`: the identical calls
    /// waiting get `claim` too; later ones ask the ledger again — after [`IN_FLIGHT_REUSE`], if
    /// the answer was "in flight".
    pub(super) fn answered(mut self, claim: &Claim, version: u32) {
        self.published = true;
        let mut entries = self.claims.lock();
        let Some(entry) = entries.by_key.get_mut(&self.key) else { return };
        entry.outcome.send_replace(Some(Shared::Answered(claim.clone(), version)));
        if matches!(claim, Claim::InFlight { .. }) {
            let until = Instant::now() + IN_FLIGHT_REUSE;
            entry.reused_until = Some(until);
            entries.reused.push_back((until, self.key));
        } else {
            entries.by_key.remove(&self.key);
        }
    }

    fn publish(&mut self, shared: Shared, remove: bool) {
        self.published = true;
        let mut entries = self.claims.lock();
        if let Some(entry) = entries.by_key.get(&self.key) {
            entry.outcome.send_replace(Some(shared));
        }
        if remove {
            entries.by_key.remove(&self.key);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.published {
            self.publish(Shared::Alone, true);
        }
    }
}

/// A claim this process holds: identical calls are answered "in flight" while it lives.
pub(super) struct Held {
    claims: Arc<Claims>,
    key: Key,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.claims.lock().by_key.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Token;
    use crate::recipe::StalePolicy;
    use crate::{scope::SubjectTag, scope::TenantTag};

    const PATIENCE: Duration = Duration::from_secs(10);

    fn request(key: u8, fingerprint: u8) -> ClaimRequest {
        ClaimRequest {
            key: Key::from_bytes([key; 32]),
            tenant: TenantTag::from_bytes([1; 8]),
            subject: SubjectTag::TENANT,
            fingerprint: [fingerprint; 32],
            arg_tags: Vec::new(),
            token: Token::random(),
            now: 1,
            window_end: 2,
            expires_at: 3,
            lease_until: 4,
            stale: StalePolicy::Hold,
            clock_trusted: true,
            label: None,
        }
    }

    #[tokio::test]
    async fn identical_calls_share_the_first_claims_answer() {
        let claims = Arc::new(Claims::default());
        let Begin::Claim(pending) = claims.begin(&request(1, 1), PATIENCE).await else { panic!("the first claims") };
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let claims = Arc::clone(&claims);
                tokio::spawn(async move { claims.begin(&request(1, 1), PATIENCE).await })
            })
            .collect();
        // Other arguments under the same key go to the ledger on their own (a conflict there).
        assert!(matches!(claims.begin(&request(1, 2), PATIENCE).await, Begin::Alone));
        tokio::task::yield_now().await;
        pending.answered(&Claim::Replay { result: b"r".to_vec() }, 1);
        for waiter in waiters {
            match waiter.await.unwrap() {
                Begin::Answered(Claim::Replay { result }, 1) => assert_eq!(result, b"r"),
                _ => panic!("a waiter gets the replay"),
            }
        }
        assert!(
            matches!(claims.begin(&request(1, 1), PATIENCE).await, Begin::Claim(_)),
            "a later call asks the ledger"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_in_flight_answer_from_the_ledger_answers_identical_calls_for_a_moment() {
        let claims = Arc::new(Claims::default());
        let Begin::Claim(pending) = claims.begin(&request(4, 1), PATIENCE).await else { panic!("the first claims") };
        pending.answered(&Claim::InFlight { lease_until: 9 }, 1);
        // Identical calls meanwhile: the same answer, no claim of their own.
        tokio::time::advance(IN_FLIGHT_REUSE / 2).await;
        assert!(matches!(
            claims.begin(&request(4, 1), PATIENCE).await,
            Begin::Answered(Claim::InFlight { lease_until: 9 }, 1)
        ));
        // Other arguments under the key still go to the ledger (a conflict there).
        assert!(matches!(claims.begin(&request(4, 2), PATIENCE).await, Begin::Alone));
        // Any other answer is never kept.
        let Begin::Claim(other) = claims.begin(&request(5, 1), PATIENCE).await else { panic!("another key claims") };
        other.answered(&Claim::Replay { result: b"r".to_vec() }, 1);
        assert!(matches!(claims.begin(&request(5, 1), PATIENCE).await, Begin::Claim(_)), "a replay is asked for again");
        // Past the moment: the ledger is asked again, and nothing is left behind.
        tokio::time::advance(IN_FLIGHT_REUSE).await;
        let Begin::Claim(again) = claims.begin(&request(4, 1), PATIENCE).await else {
            panic!("the ledger is asked again")
        };
        again.answered(&Claim::InFlight { lease_until: 10 }, 1);
        tokio::time::advance(IN_FLIGHT_REUSE * 2).await;
        claims.lock().forget_stale(Instant::now());
        let entries = claims.lock();
        assert!(entries.by_key.is_empty() && entries.reused.is_empty(), "nothing left behind");
    }

    #[tokio::test]
    async fn a_won_claim_answers_identical_calls_in_flight_until_it_is_done() {
        let claims = Arc::new(Claims::default());
        let Begin::Claim(pending) = claims.begin(&request(2, 1), PATIENCE).await else { panic!("the first claims") };
        let held = pending.won(1);
        assert!(matches!(
            claims.begin(&request(2, 1), PATIENCE).await,
            Begin::Answered(Claim::InFlight { lease_until: 4 }, 1)
        ));
        drop(held);
        assert!(
            matches!(claims.begin(&request(2, 1), PATIENCE).await, Begin::Claim(_)),
            "done: the ledger decides again"
        );
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_claim_leaves_each_waiter_to_claim_alone() {
        let claims = Arc::new(Claims::default());
        let Begin::Claim(pending) = claims.begin(&request(3, 1), PATIENCE).await else { panic!("the first claims") };
        let waiter = {
            let claims = Arc::clone(&claims);
            tokio::spawn(async move { claims.begin(&request(3, 1), PATIENCE).await })
        };
        tokio::task::yield_now().await;
        drop(pending);
        assert!(matches!(waiter.await.unwrap(), Begin::Alone));
        assert!(claims.lock().by_key.is_empty(), "nothing left behind");
    }
}
