//! The conformance suite: the record state machine of `DESIGN.md`, checked through the
//! [`Ledger`] trait alone so every backend is held to the same behaviour.
//!
//! Keys and tenants are random per case, so cases can share one database table and run in
//! parallel. Times are explicit milliseconds, far from the present, except in the sweep case,
//! which uses times near zero that no other case touches.

use std::sync::Arc;

use idem_runtime::ledger::{Claim, ClaimRequest, Ledger, LedgerError, Outcome, Resolution, State, Token, Won};
use idem_runtime::{Key, StalePolicy, TenantTag};

/// A base time for records, far in the future of the sweep case's times.
const T0: u64 = 1_900_000_000_000;
const WINDOW: u64 = 60_000;
const LEASE: u64 = 5_000;

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    for chunk in bytes.chunks_mut(8) {
        let token = Token::random().0.to_le_bytes();
        chunk.copy_from_slice(&token[..chunk.len()]);
    }
    bytes
}

/// A fresh key, tenant and fingerprint, claimed at `now`.
fn request(now: u64) -> ClaimRequest {
    ClaimRequest {
        key: Key::from_bytes(random_bytes()),
        tenant: TenantTag(random_bytes()),
        fingerprint: [7; 32],
        arg_tags: vec![[1, 1, 2, 2], [3, 3, 4, 4]],
        token: Token::random(),
        now,
        expires_at: now + WINDOW,
        lease_until: now + LEASE,
        stale: StalePolicy::Hold,
    }
}

/// The same operation claimed again by another caller at `now`.
fn repeat(first: &ClaimRequest, now: u64) -> ClaimRequest {
    ClaimRequest { token: Token::random(), now, expires_at: now + WINDOW, lease_until: now + LEASE, ..first.clone() }
}

async fn claim(ledger: &dyn Ledger, request: &ClaimRequest) -> Claim {
    ledger.claim(request).await.expect("claim")
}

async fn complete(ledger: &dyn Ledger, request: &ClaimRequest, outcome: Outcome) {
    ledger.complete(&request.key, request.token, outcome).await.expect("complete");
}

/// absent → in_progress: the first claim wins.
pub async fn absent_key_is_claimed(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    assert_eq!(claim(&*ledger, &first).await, Claim::Won(Won::Fresh));
    let status = ledger.status(first.tenant, first.key.reference(), T0).await.unwrap().expect("record");
    assert_eq!(status.state, State::InProgress);
    assert_eq!((status.created_at, status.expires_at), (T0, T0 + WINDOW));
    assert!(!status.lease_expired);
}

/// The same claim sent again (its first answer was lost) is recognised as the one that won;
/// another caller's claim is still in flight.
pub async fn resent_claim_is_recognised_as_won(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    assert_eq!(claim(&*ledger, &first).await, Claim::Won(Won::Fresh));
    assert_eq!(claim(&*ledger, &first).await, Claim::Won(Won::Fresh), "the same token again");
    assert!(matches!(claim(&*ledger, &repeat(&first, T0 + 1)).await, Claim::InFlight { .. }));
    complete(&*ledger, &first, Outcome::Completed(b"once".to_vec())).await;
    assert_eq!(claim(&*ledger, &first).await, Claim::Replay { result: b"once".to_vec() }, "settled: a replay");
}

/// in_progress with a live lease: a repeat is told "in flight" at once.
pub async fn live_lease_is_in_flight(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    let again = repeat(&first, T0 + LEASE - 1);
    assert_eq!(claim(&*ledger, &again).await, Claim::InFlight { lease_until: T0 + LEASE });
    // The loser's token holds nothing.
    assert_eq!(ledger.complete(&first.key, again.token, Outcome::Failed).await, Err(LedgerError::Fenced));
}

/// completed: every repeat gets the stored bytes, byte for byte.
pub async fn completed_is_replayed_byte_for_byte(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    let stored = br#"{"ok":{"receipt":"r-1","amount":1250}}"#.to_vec();
    complete(&*ledger, &first, Outcome::Completed(stored.clone())).await;
    for at in [T0 + 1, T0 + LEASE + 1, T0 + WINDOW - 1] {
        assert_eq!(claim(&*ledger, &repeat(&first, at)).await, Claim::Replay { result: stored.clone() });
    }
    let status = ledger.status(first.tenant, first.key.reference(), T0 + 2).await.unwrap().expect("record");
    assert_eq!((status.state, status.result), (State::Completed, Some(stored)));
    // Completing twice is refused: the claim has ended.
    assert_eq!(ledger.complete(&first.key, first.token, Outcome::Failed).await, Err(LedgerError::Fenced));
}

/// failed (nothing happened): the next repeat claims anew, and the old token is void.
pub async fn failed_is_claimed_again(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Failed).await;
    let status = ledger.status(first.tenant, first.key.reference(), T0 + 1).await.unwrap().expect("record");
    assert_eq!(status.state, State::Failed);
    let again = repeat(&first, T0 + 10);
    assert_eq!(claim(&*ledger, &again).await, Claim::Won(Won::Fresh));
    assert_eq!(
        ledger.complete(&first.key, first.token, Outcome::Completed(b"x".to_vec())).await,
        Err(LedgerError::Fenced)
    );
    complete(&*ledger, &again, Outcome::Completed(b"second".to_vec())).await;
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 20)).await, Claim::Replay { result: b"second".to_vec() });
}

/// unknown: repeats are told the outcome is unknown, not run.
pub async fn unknown_is_reported_unknown(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Unknown).await;
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 1)).await, Claim::Unknown);
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE * 3)).await, Claim::Unknown);
}

/// Same key, different fingerprint: a conflict in every state but failed, with the stored tags.
pub async fn different_arguments_conflict(ledger: Arc<dyn Ledger>) {
    for outcome in [None, Some(Outcome::Completed(b"r".to_vec())), Some(Outcome::Unknown)] {
        let first = request(T0);
        claim(&*ledger, &first).await;
        if let Some(outcome) = outcome {
            complete(&*ledger, &first, outcome).await;
        }
        let other = ClaimRequest { fingerprint: [8; 32], arg_tags: vec![[9, 9, 9, 9]], ..repeat(&first, T0 + 1) };
        assert_eq!(claim(&*ledger, &other).await, Claim::Conflict { arg_tags: first.arg_tags.clone() });
    }
    // A dead holder's operation with other arguments is still that operation: no takeover.
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    let other = ClaimRequest { fingerprint: [8; 32], ..repeat(&first, T0 + LEASE + 1) };
    assert_eq!(claim(&*ledger, &other).await, Claim::Conflict { arg_tags: first.arg_tags.clone() });
}

/// A failed operation left nothing behind, so a repeat with other arguments simply runs.
pub async fn failed_record_takes_new_arguments(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Failed).await;
    let other = ClaimRequest { fingerprint: [8; 32], ..repeat(&first, T0 + 1) };
    assert_eq!(claim(&*ledger, &other).await, Claim::Won(Won::Fresh));
    complete(&*ledger, &other, Outcome::Completed(b"new".to_vec())).await;
    let back = repeat(&first, T0 + 2);
    assert!(matches!(claim(&*ledger, &back).await, Claim::Conflict { .. }));
}

/// The window is measured from the first claim: at window − 1 ms a repeat is the same operation,
/// at window + 1 ms it is a new one.
pub async fn window_edge(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Completed(b"first".to_vec())).await;
    let inside = repeat(&first, T0 + WINDOW - 1);
    assert_eq!(claim(&*ledger, &inside).await, Claim::Replay { result: b"first".to_vec() });
    let outside = repeat(&first, T0 + WINDOW + 1);
    assert_eq!(claim(&*ledger, &outside).await, Claim::Won(Won::Fresh));
    let status = ledger.status(first.tenant, first.key.reference(), T0 + WINDOW + 2).await.unwrap().expect("record");
    assert_eq!((status.state, status.created_at), (State::InProgress, T0 + WINDOW + 1));
    // The new operation's window starts at its own claim, not at a clock bucket.
    let later = repeat(&first, T0 + WINDOW + 1 + LEASE - 1);
    assert!(matches!(claim(&*ledger, &later).await, Claim::InFlight { .. }));
}

/// takeover: a stale lease is taken by a new token; the superseded holder's completion is
/// refused and overwrites nothing.
pub async fn stale_lease_takeover_fences_the_old_holder(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    let second = repeat(&first, T0 + LEASE + 1);
    assert_eq!(claim(&*ledger, &second).await, Claim::Won(Won::Takeover));
    // A third caller while the new holder's lease is live: in flight.
    assert!(matches!(claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await, Claim::InFlight { .. }));
    complete(&*ledger, &second, Outcome::Completed(b"new holder".to_vec())).await;
    let late = ledger.complete(&first.key, first.token, Outcome::Completed(b"late".to_vec())).await;
    assert_eq!(late, Err(LedgerError::Fenced));
    assert_eq!(ledger.renew(&first.key, first.token, T0 + 100_000).await, Err(LedgerError::Fenced));
    assert_eq!(
        claim(&*ledger, &repeat(&first, T0 + LEASE + 3)).await,
        Claim::Replay { result: b"new holder".to_vec() }
    );
    // The takeover kept the operation's window: it still expires from the first claim.
    let status = ledger.status(first.tenant, first.key.reference(), T0 + LEASE + 4).await.unwrap().expect("record");
    assert_eq!((status.created_at, status.expires_at), (T0, T0 + WINDOW));
}

/// reconcile: a stale lease is taken for reconciliation, fenced like a takeover.
pub async fn stale_lease_reconcile(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Reconcile, ..request(T0) };
    claim(&*ledger, &first).await;
    let second = repeat(&first, T0 + LEASE + 1);
    assert_eq!(claim(&*ledger, &second).await, Claim::Won(Won::Reconcile));
    assert_eq!(ledger.complete(&first.key, first.token, Outcome::Failed).await, Err(LedgerError::Fenced));
    complete(&*ledger, &second, Outcome::Completed(b"reconciled".to_vec())).await;
    assert_eq!(
        claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await,
        Claim::Replay { result: b"reconciled".to_vec() }
    );
}

/// hold: a stale lease becomes unknown; nothing re-runs, and the dead holder cannot complete.
pub async fn stale_lease_hold_becomes_unknown(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    let status = ledger.status(first.tenant, first.key.reference(), T0 + LEASE + 1).await.unwrap().expect("record");
    assert!(status.lease_expired, "status shows the dead holder before anyone repeats");
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 1)).await, Claim::Unknown);
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await, Claim::Unknown);
    let status = ledger.status(first.tenant, first.key.reference(), T0 + LEASE + 3).await.unwrap().expect("record");
    assert_eq!(status.state, State::Unknown);
    assert_eq!(ledger.complete(&first.key, first.token, Outcome::Failed).await, Err(LedgerError::Fenced));
}

/// A dead holder's lease found after the window ended still goes through the stale policy: no
/// silent re-run as a fresh operation.
pub async fn stale_lease_past_its_window_follows_the_policy(ledger: Arc<dyn Ledger>) {
    let held = ClaimRequest { expires_at: T0 + 10, lease_until: T0 + 5, ..request(T0) };
    claim(&*ledger, &held).await;
    assert_eq!(claim(&*ledger, &repeat(&held, T0 + WINDOW * 2)).await, Claim::Unknown, "hold: unknown, not fresh");
    assert_eq!(claim(&*ledger, &repeat(&held, T0 + WINDOW * 3)).await, Claim::Unknown, "and it stays unknown");
    let taken = ClaimRequest { stale: StalePolicy::Takeover, expires_at: T0 + 10, lease_until: T0 + 5, ..request(T0) };
    claim(&*ledger, &taken).await;
    let again = repeat(&taken, T0 + WINDOW * 2);
    assert_eq!(claim(&*ledger, &again).await, Claim::Won(Won::Takeover), "takeover is reported as one");
    complete(&*ledger, &again, Outcome::Completed(b"ok".to_vec())).await;
}

/// renew: only the holder extends its lease; an extended lease keeps repeats in flight.
pub async fn renew_extends_only_the_holders_lease(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    ledger.renew(&first.key, first.token, T0 + 3 * LEASE).await.expect("holder renews");
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 2 * LEASE)).await, Claim::InFlight { lease_until: T0 + 3 * LEASE });
    assert_eq!(ledger.renew(&first.key, Token::random(), T0 + 9 * LEASE).await, Err(LedgerError::Fenced));
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 3 * LEASE + 1)).await, Claim::Won(Won::Takeover));
}

/// status: by ref, in the caller's tenant only; another tenant learns nothing.
pub async fn status_is_scoped_to_the_tenant(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Completed(b"mine".to_vec())).await;
    let reference = first.key.reference();
    let own = ledger.status(first.tenant, reference, T0 + 1).await.unwrap();
    assert_eq!(own.map(|s| (s.reference, s.state)), Some((reference, State::Completed)));
    let other_tenant = TenantTag(random_bytes());
    assert_eq!(ledger.status(other_tenant, reference, T0 + 1).await.unwrap(), None);
    assert_eq!(
        ledger.resolve(other_tenant, reference, Resolution::NothingHappened, T0 + 1).await,
        Err(LedgerError::NotFound)
    );
    let unknown_ref = Key::from_bytes(random_bytes()).reference();
    assert_eq!(ledger.status(first.tenant, unknown_ref, T0 + 1).await.unwrap(), None);
    // Expired records are gone for status too.
    assert_eq!(ledger.status(first.tenant, reference, T0 + WINDOW).await.unwrap(), None);
}

/// resolve: the operator path out of unknown, either way; live or finished records refuse it.
pub async fn resolve_settles_unknown(ledger: Arc<dyn Ledger>) {
    let happened = request(T0);
    claim(&*ledger, &happened).await;
    complete(&*ledger, &happened, Outcome::Unknown).await;
    let reference = happened.key.reference();
    ledger.resolve(happened.tenant, reference, Resolution::Completed(b"found".to_vec()), T0 + 1).await.unwrap();
    assert_eq!(claim(&*ledger, &repeat(&happened, T0 + 2)).await, Claim::Replay { result: b"found".to_vec() });
    assert_eq!(
        ledger.resolve(happened.tenant, reference, Resolution::NothingHappened, T0 + 3).await,
        Err(LedgerError::NotResolvable { state: State::Completed })
    );

    let dead = request(T0);
    claim(&*ledger, &dead).await;
    let reference = dead.key.reference();
    assert_eq!(
        ledger.resolve(dead.tenant, reference, Resolution::NothingHappened, T0 + 1).await,
        Err(LedgerError::NotResolvable { state: State::InProgress }),
        "a live lease cannot be resolved from outside"
    );
    ledger.resolve(dead.tenant, reference, Resolution::NothingHappened, T0 + LEASE + 1).await.unwrap();
    assert_eq!(ledger.complete(&dead.key, dead.token, Outcome::Unknown).await, Err(LedgerError::Fenced));
    assert_eq!(claim(&*ledger, &repeat(&dead, T0 + LEASE + 2)).await, Claim::Won(Won::Fresh));
}

/// sweep: deletes expired records in bounded batches and never a record under a live lease.
pub async fn sweep_is_bounded_and_spares_live_leases(ledger: Arc<dyn Ledger>) {
    // Times near zero: no other case has records this old. Clear any left by an earlier run.
    let base = 1_000;
    while ledger.sweep(base + 100, 1000).await.unwrap() > 0 {}
    let mut expired = Vec::new();
    for i in 0..25 {
        let r = ClaimRequest { expires_at: base + 10, lease_until: base + 5, ..request(base + i % 3) };
        claim(&*ledger, &r).await;
        let outcome = if i % 2 == 0 { Outcome::Completed(b"old".to_vec()) } else { Outcome::Failed };
        complete(&*ledger, &r, outcome).await;
        expired.push(r);
    }
    // Past its window but its holder is alive (a long handler): not swept.
    let live = ClaimRequest { expires_at: base + 10, lease_until: base + 1_000_000, ..request(base) };
    claim(&*ledger, &live).await;
    // Past its window with a dead holder, or unknown: not swept either — they wait for the
    // stale policy or an operator, never vanish.
    let dead = ClaimRequest { expires_at: base + 10, lease_until: base + 5, ..request(base) };
    claim(&*ledger, &dead).await;
    let unknown = ClaimRequest { expires_at: base + 10, ..request(base) };
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let now = base + 100;
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 10);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 10);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 5);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 0);
    for r in &expired {
        assert_eq!(ledger.status(r.tenant, r.key.reference(), base).await.unwrap(), None, "swept");
    }
    let kept = ledger.status(live.tenant, live.key.reference(), now).await.unwrap().expect("live lease kept");
    assert_eq!(kept.state, State::InProgress);
    complete(&*ledger, &live, Outcome::Completed(b"done".to_vec())).await;
    let kept = ledger.status(dead.tenant, dead.key.reference(), now).await.unwrap().expect("dead holder kept");
    assert!(kept.lease_expired);
    let kept = ledger.status(unknown.tenant, unknown.key.reference(), now).await.unwrap().expect("unknown kept");
    assert_eq!(kept.state, State::Unknown);
    // Settle them, so a later run's sweep finds nothing of this one's.
    ledger.resolve(dead.tenant, dead.key.reference(), Resolution::NothingHappened, now).await.unwrap();
    ledger.resolve(unknown.tenant, unknown.key.reference(), Resolution::NothingHappened, now).await.unwrap();
    while ledger.sweep(now, 1000).await.unwrap() > 0 {}
}

/// 200 concurrent claims of one key on a multi-threaded runtime: exactly one wins, every other
/// caller is told "in flight", and no error reaches anyone.
pub async fn two_hundred_concurrent_claims_one_winner(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (ledger, barrier, mine) = (Arc::clone(&ledger), Arc::clone(&barrier), repeat(&first, T0 + 1));
            tokio::spawn(async move {
                barrier.wait().await;
                ledger.claim(&mine).await
            })
        })
        .collect();
    let (mut won, mut in_flight) = (0, 0);
    for task in tasks {
        match task.await.expect("task") {
            Ok(Claim::Won(Won::Fresh)) => won += 1,
            Ok(Claim::InFlight { .. }) => in_flight += 1,
            other => panic!("unexpected answer to a concurrent claim: {other:?}"),
        }
    }
    assert_eq!((won, in_flight), (1, 199));
}
