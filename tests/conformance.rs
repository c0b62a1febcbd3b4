//! The conformance suite: the record state machine of the guide (`docs/src/guarantees.md`), checked through the
//! [`Ledger`] trait alone so every backend is held to the same behaviour.
//!
//! Keys and tenants are random per case, so cases can share one database table and run in
//! parallel. Times are explicit milliseconds, far from the present, except in the sweep case,
//! which uses times near zero that no other case touches.

use std::sync::Arc;

use idem_runtime::ledger::{
    Claim, ClaimRequest, Ledger, LedgerError, Outcome, PendingQuery, PendingRecord, Resolution, State, Token, Won,
};
use idem_runtime::{Key, StalePolicy, key::Address, scope::SubjectTag, scope::TenantTag};

/// A base time for records, far in the future of the sweep case's times.
const T0: u64 = 1_900_000_000_000;
const WINDOW: u64 = 60_000;
const LEASE: u64 = 5_000;
/// How long an unsettled record is kept past its window.
const UNSETTLED: u64 = 1_000_000;
/// How long a settled result is kept past its settling, at least.
const GRACE: u64 = 30_000;
/// No grace: a completed record lives until its window ends.
const NO_GRACE: u64 = 0;

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    for chunk in bytes.chunks_mut(8) {
        let token = Token::random().get().to_le_bytes();
        chunk.copy_from_slice(&token[..chunk.len()]);
    }
    bytes
}

/// A fresh key, tenant and fingerprint, claimed at `now`.
fn request(now: u64) -> ClaimRequest {
    ClaimRequest {
        key: Key::from_bytes(random_bytes()),
        tenant: TenantTag::from_bytes(random_bytes()),
        subject: SubjectTag::from_bytes(random_bytes()),
        fingerprint: [7; 32],
        arg_tags: vec![[1, 1, 2, 2], [3, 3, 4, 4]],
        token: Token::random(),
        now,
        window_end: now + WINDOW,
        expires_at: now + WINDOW + UNSETTLED,
        lease_until: now + LEASE,
        stale: StalePolicy::Hold,
        clock_trusted: true,
        label: None,
    }
}

/// The same operation claimed again by another caller at `now`.
fn repeat(first: &ClaimRequest, now: u64) -> ClaimRequest {
    ClaimRequest {
        token: Token::random(),
        now,
        window_end: now + WINDOW,
        expires_at: now + WINDOW + UNSETTLED,
        lease_until: now + LEASE,
        ..first.clone()
    }
}

/// The address of the operation `request` starts (a fresh claim: its own window).
fn address(request: &ClaimRequest) -> Address {
    Address { reference: request.key.reference(), window_end: request.window_end }
}

async fn claim(ledger: &dyn Ledger, request: &ClaimRequest) -> Claim {
    ledger.claim(request).await.expect("claim")
}

async fn complete(ledger: &dyn Ledger, request: &ClaimRequest, outcome: Outcome) {
    ledger.complete(&request.key, request.token, outcome, NO_GRACE).await.expect("complete");
}

/// absent → in_progress: the first claim wins.
pub async fn absent_key_is_claimed(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    assert_eq!(claim(&*ledger, &first).await.won(), Some(Won::Fresh));
    let status = ledger.status(first.tenant, first.subject, first.key.reference(), T0).await.unwrap().expect("record");
    assert_eq!(status.state, State::InProgress);
    assert_eq!((status.created_at, status.window_end), (T0, T0 + WINDOW));
    assert!(!status.lease_expired);
}

/// The same claim sent again (its first answer was lost) is recognised as the one that won;
/// another caller's claim is still in flight.
pub async fn resent_claim_is_recognised_as_won(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    assert_eq!(claim(&*ledger, &first).await.won(), Some(Won::Fresh));
    assert_eq!(
        claim(&*ledger, &first).await,
        Claim::Won { attempt: Won::Fresh, window_end: T0 + WINDOW },
        "the same token again"
    );
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
    assert_eq!(ledger.complete(&first.key, again.token, Outcome::Failed, NO_GRACE).await, Err(LedgerError::Fenced));
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
    let status =
        ledger.status(first.tenant, first.subject, first.key.reference(), T0 + 2).await.unwrap().expect("record");
    assert_eq!((status.state, status.result), (State::Completed, Some(stored)));
    // Completing twice is refused: the claim has ended.
    assert_eq!(ledger.complete(&first.key, first.token, Outcome::Failed, NO_GRACE).await, Err(LedgerError::Fenced));
}

/// failed (nothing happened): the next repeat claims anew, and the old token is void.
pub async fn failed_is_claimed_again(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Failed).await;
    let status =
        ledger.status(first.tenant, first.subject, first.key.reference(), T0 + 1).await.unwrap().expect("record");
    assert_eq!(status.state, State::Failed);
    let again = repeat(&first, T0 + 10);
    assert_eq!(claim(&*ledger, &again).await.won(), Some(Won::Fresh));
    assert_eq!(
        ledger.complete(&first.key, first.token, Outcome::Completed(b"x".to_vec()), NO_GRACE).await,
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
    assert_eq!(claim(&*ledger, &other).await.won(), Some(Won::Fresh));
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
    assert_eq!(claim(&*ledger, &outside).await.won(), Some(Won::Fresh));
    let status = ledger
        .status(first.tenant, first.subject, first.key.reference(), T0 + WINDOW + 2)
        .await
        .unwrap()
        .expect("record");
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
    assert_eq!(claim(&*ledger, &second).await.won(), Some(Won::Takeover));
    // A third caller while the new holder's lease is live: in flight.
    assert!(matches!(claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await, Claim::InFlight { .. }));
    complete(&*ledger, &second, Outcome::Completed(b"new holder".to_vec())).await;
    let late = ledger.complete(&first.key, first.token, Outcome::Completed(b"late".to_vec()), NO_GRACE).await;
    assert_eq!(late, Err(LedgerError::Fenced));
    assert_eq!(ledger.renew(&first.key, first.token, T0 + 100_000).await, Err(LedgerError::Fenced));
    assert_eq!(
        claim(&*ledger, &repeat(&first, T0 + LEASE + 3)).await,
        Claim::Replay { result: b"new holder".to_vec() }
    );
    // The takeover kept the operation's window: it still expires from the first claim.
    let status = ledger
        .status(first.tenant, first.subject, first.key.reference(), T0 + LEASE + 4)
        .await
        .unwrap()
        .expect("record");
    assert_eq!((status.created_at, status.window_end), (T0, T0 + WINDOW));
}

/// reconcile: a stale lease is taken for reconciliation, fenced like a takeover.
pub async fn stale_lease_reconcile(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Reconcile, ..request(T0) };
    claim(&*ledger, &first).await;
    let second = repeat(&first, T0 + LEASE + 1);
    assert_eq!(claim(&*ledger, &second).await.won(), Some(Won::Reconcile));
    assert_eq!(ledger.complete(&first.key, first.token, Outcome::Failed, NO_GRACE).await, Err(LedgerError::Fenced));
    complete(&*ledger, &second, Outcome::Completed(b"reconciled".to_vec())).await;
    assert_eq!(
        claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await,
        Claim::Replay { result: b"reconciled".to_vec() }
    );
}

/// hold: a stale lease becomes unknown and nothing re-runs — but the holder may be alive and
/// late (a paused process, a slow downstream): its own completion is still recorded, and then
/// replayed. (Before issue 10 its completion was refused and the result lost for good.)
pub async fn stale_lease_hold_becomes_unknown(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    let status = ledger
        .status(first.tenant, first.subject, first.key.reference(), T0 + LEASE + 1)
        .await
        .unwrap()
        .expect("record");
    assert!(status.lease_expired, "status shows the dead holder before anyone repeats");
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 1)).await, Claim::Unknown);
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 2)).await, Claim::Unknown);
    let status = ledger
        .status(first.tenant, first.subject, first.key.reference(), T0 + LEASE + 3)
        .await
        .unwrap()
        .expect("record");
    assert_eq!(status.state, State::Unknown);
    assert_eq!(ledger.renew(&first.key, first.token, T0 + 100_000).await, Err(LedgerError::Fenced), "no revival");
    complete(&*ledger, &first, Outcome::Completed(b"late but done".to_vec())).await;
    assert_eq!(
        claim(&*ledger, &repeat(&first, T0 + LEASE + 4)).await,
        Claim::Replay { result: b"late but done".to_vec() }
    );
    // Another holder's token still completes nothing.
    let stranger = ledger.complete(&first.key, Token::random(), Outcome::Failed, NO_GRACE).await;
    assert_eq!(stranger, Err(LedgerError::Fenced));
}

/// An operator's verdict on an unknown record is never overwritten by the late holder.
pub async fn late_holder_never_overwrites_an_operators_verdict(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 1)).await, Claim::Unknown);
    let verdict = Resolution::Completed(b"operator".to_vec());
    ledger.resolve(first.tenant, address(&first), verdict, T0 + LEASE + 2, T0 + LEASE + 2).await.unwrap();
    let late = ledger.complete(&first.key, first.token, Outcome::Completed(b"late".to_vec()), NO_GRACE).await;
    assert_eq!(late, Err(LedgerError::Fenced));
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + LEASE + 3)).await, Claim::Replay { result: b"operator".to_vec() });
}

/// A re-sent claim (its first answer was lost) that had won a takeover is told it won a
/// takeover, with the operation's own window end — not a fresh operation with a new one.
pub async fn resent_takeover_claim_is_still_a_takeover(ledger: Arc<dyn Ledger>) {
    for (policy, how) in [(StalePolicy::Takeover, Won::Takeover), (StalePolicy::Reconcile, Won::Reconcile)] {
        let first = ClaimRequest { stale: policy, ..request(T0) };
        claim(&*ledger, &first).await;
        let second = repeat(&first, T0 + LEASE + 1);
        let won = Claim::Won { attempt: how, window_end: T0 + WINDOW };
        assert_eq!(claim(&*ledger, &second).await, won);
        assert_eq!(claim(&*ledger, &second).await, won, "re-sent: how it won, and the operation's window");
    }
}

/// A takeover is reported as one even when the request's own window end happens to equal the
/// operation's (the backends once inferred it from that equality).
pub async fn takeover_is_reported_even_with_an_equal_window_end(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    let second = ClaimRequest { window_end: first.window_end, ..repeat(&first, T0 + LEASE + 1) };
    assert_eq!(claim(&*ledger, &second).await.won(), Some(Won::Takeover));
}

/// A release undoes only what its claim did: a fresh claim is removed (nothing ran), a
/// takeover gives its lease back and the operation stays in progress, so its stale policy still
/// applies — with the operation's own window. A token that holds nothing releases nothing.
pub async fn release_undoes_only_its_own_claim(ledger: Arc<dyn Ledger>) {
    let fresh = request(T0);
    claim(&*ledger, &fresh).await;
    assert_eq!(ledger.release(&fresh.key, Token::random()).await, Err(LedgerError::Fenced));
    ledger.release(&fresh.key, fresh.token).await.expect("the holder releases");
    // Nothing ran, and nothing is left that reads as an outcome ("failed").
    let status = ledger.status(fresh.tenant, fresh.subject, fresh.key.reference(), T0 + 1).await.unwrap();
    assert_eq!(status, None, "a released fresh claim left a record");
    assert_eq!(claim(&*ledger, &repeat(&fresh, T0 + 2)).await.won(), Some(Won::Fresh));
    assert_eq!(ledger.release(&fresh.key, fresh.token).await, Err(LedgerError::Fenced), "nothing left to undo");

    let dead = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &dead).await;
    let taker = repeat(&dead, T0 + LEASE + 1);
    assert_eq!(claim(&*ledger, &taker).await.won(), Some(Won::Takeover));
    ledger.release(&taker.key, taker.token).await.expect("the taker releases");
    let status =
        ledger.status(dead.tenant, dead.subject, dead.key.reference(), T0 + LEASE + 2).await.unwrap().expect("record");
    assert_eq!((status.state, status.lease_expired), (State::InProgress, true), "maybe happened stays maybe");
    let next = repeat(&dead, T0 + LEASE + 3);
    assert_eq!(claim(&*ledger, &next).await, Claim::Won { attempt: Won::Takeover, window_end: T0 + WINDOW });

    let held = request(T0);
    claim(&*ledger, &held).await;
    complete(&*ledger, &held, Outcome::Completed(b"done".to_vec())).await;
    assert_eq!(ledger.release(&held.key, held.token).await, Err(LedgerError::Fenced), "a settled record stays");

    // A fresh claim whose lapsed lease `hold` turned unknown before the release landed: only
    // its own (never run) handler could have acted, so it is removed all the same.
    let orphan = request(T0);
    claim(&*ledger, &orphan).await;
    assert_eq!(claim(&*ledger, &repeat(&orphan, T0 + LEASE + 1)).await, Claim::Unknown);
    ledger.release(&orphan.key, orphan.token).await.expect("the orphan's claimer releases it");
    assert_eq!(claim(&*ledger, &repeat(&orphan, T0 + LEASE + 2)).await.won(), Some(Won::Fresh));
    // But an unknown record its holder recorded itself is never released by a stranger.
    let recorded = request(T0);
    claim(&*ledger, &recorded).await;
    complete(&*ledger, &recorded, Outcome::Unknown).await;
    assert_eq!(ledger.release(&recorded.key, Token::random()).await, Err(LedgerError::Fenced));
}

/// A claimer whose clock is not known to agree with the ledger's acts on no time: a lapsed
/// lease is answered "in flight", a record past its window is still the same operation.
pub async fn untrusted_clock_acts_on_no_time(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    let skewed = ClaimRequest { clock_trusted: false, ..repeat(&first, T0 + LEASE + 1) };
    assert!(matches!(claim(&*ledger, &skewed).await, Claim::InFlight { .. }), "no takeover on an untrusted clock");
    let held = request(T0);
    claim(&*ledger, &held).await;
    let skewed = ClaimRequest { clock_trusted: false, ..repeat(&held, T0 + LEASE + 1) };
    assert!(matches!(claim(&*ledger, &skewed).await, Claim::InFlight { .. }), "no flip to unknown either");
    complete(&*ledger, &held, Outcome::Completed(b"kept".to_vec())).await;
    let late = ClaimRequest { clock_trusted: false, ..repeat(&held, T0 + WINDOW + 1) };
    assert_eq!(claim(&*ledger, &late).await, Claim::Replay { result: b"kept".to_vec() }, "no early window end");
    assert_eq!(claim(&*ledger, &repeat(&held, T0 + WINDOW + 1)).await.won(), Some(Won::Fresh));
}

/// A result that settles after its window (a handler slower than its window) stays replayable
/// for the grace it was completed with; an operator's verdict likewise.
pub async fn late_result_stays_replayable_for_its_grace(ledger: Arc<dyn Ledger>) {
    let slow = ClaimRequest { lease_until: T0 + 2 * WINDOW, ..request(T0) };
    claim(&*ledger, &slow).await;
    let settled = T0 + WINDOW + 10_000;
    let outcome = Outcome::Completed(b"slow".to_vec());
    ledger.complete(&slow.key, slow.token, outcome, settled + GRACE).await.expect("complete");
    assert_eq!(claim(&*ledger, &repeat(&slow, settled + 1)).await, Claim::Replay { result: b"slow".to_vec() });
    let status = ledger.status(slow.tenant, slow.subject, slow.key.reference(), settled + GRACE - 1).await.unwrap();
    assert_eq!(status.map(|s| s.state), Some(State::Completed), "status finds it too");
    assert_eq!(claim(&*ledger, &repeat(&slow, settled + GRACE + 1)).await.won(), Some(Won::Fresh));

    let unknown = request(T0);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let next_day = T0 + WINDOW + 86_400_000;
    let verdict = Resolution::Completed(b"found".to_vec());
    let reference = unknown.key.reference();
    ledger.resolve(unknown.tenant, address(&unknown), verdict, next_day, next_day + GRACE).await.unwrap();
    let status = ledger
        .status(unknown.tenant, unknown.subject, reference, next_day + GRACE - 1)
        .await
        .unwrap()
        .expect("the verdict");
    assert_eq!((status.state, status.result), (State::Completed, Some(b"found".to_vec())));
}

/// Unsettled records do not lock their key forever: once the window ended, a repeat starts a new
/// operation (a new window, so a new forwarded key) and the old record stays for the operator —
/// its status, its resolution — until its unsettled retention passes.
pub async fn unsettled_past_its_window_is_superseded(ledger: Arc<dyn Ledger>) {
    let unknown = request(T0);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    assert_eq!(claim(&*ledger, &repeat(&unknown, T0 + WINDOW - 1)).await, Claim::Unknown, "inside its window");
    let after = T0 + WINDOW + 1;
    let next = repeat(&unknown, after);
    assert_eq!(claim(&*ledger, &next).await, Claim::Won { attempt: Won::Fresh, window_end: after + WINDOW });
    let reference = unknown.key.reference();
    let current =
        ledger.status(unknown.tenant, unknown.subject, reference, after + 1).await.unwrap().expect("the new operation");
    assert_eq!((current.state, current.superseded), (State::InProgress, false));
    // The operator can still settle the old one while the new one runs.
    let verdict = Resolution::Completed(b"it did happen".to_vec());
    ledger
        .resolve(unknown.tenant, address(&unknown), verdict, after + 2, after + 2)
        .await
        .expect("resolve the old one");
    complete(&*ledger, &next, Outcome::Completed(b"second".to_vec())).await;
    assert_eq!(claim(&*ledger, &repeat(&unknown, after + 3)).await, Claim::Replay { result: b"second".to_vec() });

    // A dead holder past its window, any policy: a new operation too.
    for stale in [StalePolicy::Hold, StalePolicy::Takeover, StalePolicy::Reconcile] {
        let dead = ClaimRequest { stale, ..request(T0) };
        claim(&*ledger, &dead).await;
        let next = repeat(&dead, T0 + WINDOW + 1);
        assert_eq!(claim(&*ledger, &next).await.won(), Some(Won::Fresh), "{stale:?}");
        let late = ledger.complete(&dead.key, dead.token, Outcome::Completed(b"late".to_vec()), NO_GRACE).await;
        assert_eq!(late, Ok(()), "the late holder records on its own, superseded record");
        let current = ledger.status(dead.tenant, dead.subject, dead.key.reference(), T0 + WINDOW + 2).await.unwrap();
        assert_eq!(current.map(|s| s.state), Some(State::InProgress), "the new operation is untouched");
    }
}

/// Keys sharing their first 8 bytes (their ref) in one tenant are told apart where the full key
/// is known.
pub async fn lookup_uses_the_full_key(ledger: Arc<dyn Ledger>) {
    let a = request(T0);
    let mut b_key = *a.key.as_bytes();
    b_key[31] ^= 0xff;
    let b = ClaimRequest { key: Key::from_bytes(b_key), token: Token::random(), ..a.clone() };
    claim(&*ledger, &a).await;
    complete(&*ledger, &a, Outcome::Completed(b"a".to_vec())).await;
    claim(&*ledger, &b).await;
    assert_eq!(a.key.reference(), b.key.reference());
    let found = ledger.lookup(&b.key, T0 + 1).await.unwrap().expect("b's record");
    assert_eq!((found.state, found.result), (State::InProgress, None));
    let found = ledger.lookup(&a.key, T0 + 1).await.unwrap().expect("a's record");
    assert_eq!(found.result, Some(b"a".to_vec()));
    // The report carries the full key, so an operator can be shown the key its handler forwarded.
    assert_eq!((found.key, found.idempotency_key()), (a.key, a.key.idempotency_key(found.window_end)));
    let missing = Key::from_bytes(random_bytes());
    assert_eq!(ledger.lookup(&missing, T0 + 1).await.unwrap(), None);
}

/// Many arguments are stored and named, not refused as a transient failure.
pub async fn many_arguments_are_stored(ledger: Arc<dyn Ledger>) {
    let tags: Vec<[u8; 4]> = (0..2_000u32).map(u32::to_be_bytes).collect();
    let first = ClaimRequest { arg_tags: tags.clone(), ..request(T0) };
    assert_eq!(claim(&*ledger, &first).await.won(), Some(Won::Fresh));
    let other = ClaimRequest { fingerprint: [8; 32], ..repeat(&first, T0 + 1) };
    assert_eq!(claim(&*ledger, &other).await, Claim::Conflict { arg_tags: tags });
}

/// renew: only the holder extends its lease; an extended lease keeps repeats in flight.
pub async fn renew_extends_only_the_holders_lease(ledger: Arc<dyn Ledger>) {
    let first = ClaimRequest { stale: StalePolicy::Takeover, ..request(T0) };
    claim(&*ledger, &first).await;
    ledger.renew(&first.key, first.token, T0 + 3 * LEASE).await.expect("holder renews");
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 2 * LEASE)).await, Claim::InFlight { lease_until: T0 + 3 * LEASE });
    assert_eq!(ledger.renew(&first.key, Token::random(), T0 + 9 * LEASE).await, Err(LedgerError::Fenced));
    assert_eq!(claim(&*ledger, &repeat(&first, T0 + 3 * LEASE + 1)).await.won(), Some(Won::Takeover));
}

/// status: by ref, in the caller's tenant only; another tenant learns nothing.
pub async fn status_is_scoped_to_the_tenant(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Completed(b"mine".to_vec())).await;
    let reference = first.key.reference();
    let own = ledger.status(first.tenant, first.subject, reference, T0 + 1).await.unwrap();
    assert_eq!(own.map(|s| (s.reference, s.state)), Some((reference, State::Completed)));
    let other_tenant = TenantTag::from_bytes(random_bytes());
    assert_eq!(ledger.status(other_tenant, first.subject, reference, T0 + 1).await.unwrap(), None);
    assert_eq!(
        ledger.resolve(other_tenant, address(&first), Resolution::NothingHappened, T0 + 1, T0 + 1).await,
        Err(LedgerError::NotFound)
    );
    let unknown_ref = Key::from_bytes(random_bytes()).reference();
    assert_eq!(ledger.status(first.tenant, first.subject, unknown_ref, T0 + 1).await.unwrap(), None);
    // Expired records are gone for status too.
    assert_eq!(ledger.status(first.tenant, first.subject, reference, T0 + WINDOW).await.unwrap(), None);
}

/// status: a record made under a subject is that subject's alone; one made tenant-wide
/// (`SubjectTag::TENANT`) is the whole tenant's — current and superseded records alike. The
/// operator's resolve stays tenant-wide.
pub async fn status_is_scoped_to_the_subject(ledger: Arc<dyn Ledger>) {
    let mine = request(T0);
    claim(&*ledger, &mine).await;
    complete(&*ledger, &mine, Outcome::Completed(b"mine".to_vec())).await;
    let colleague = SubjectTag::from_bytes(random_bytes());
    let reference = mine.key.reference();
    assert!(ledger.status(mine.tenant, mine.subject, reference, T0 + 1).await.unwrap().is_some());
    assert_eq!(ledger.status(mine.tenant, colleague, reference, T0 + 1).await.unwrap(), None, "a colleague's lookup");

    let shared = ClaimRequest { subject: SubjectTag::TENANT, ..request(T0) };
    claim(&*ledger, &shared).await;
    complete(&*ledger, &shared, Outcome::Completed(b"ours".to_vec())).await;
    let found = ledger.status(shared.tenant, colleague, shared.key.reference(), T0 + 1).await.unwrap();
    assert_eq!(found.and_then(|s| s.result), Some(b"ours".to_vec()), "tenant-wide records are the tenant's");

    // A superseded record keeps its subject.
    let unknown = request(T0);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let after = T0 + WINDOW + 1;
    assert_eq!(claim(&*ledger, &repeat(&unknown, after)).await.won(), Some(Won::Fresh));
    let reference = unknown.key.reference();
    assert!(ledger.status(unknown.tenant, unknown.subject, reference, after).await.unwrap().is_some());
    assert_eq!(ledger.status(unknown.tenant, colleague, reference, after).await.unwrap(), None);
    ledger.resolve(unknown.tenant, address(&unknown), Resolution::NothingHappened, after, after).await.unwrap();
}

/// inspect: the operator's lookup by ref within a tenant finds an operation whoever its subject
/// (current or superseded), never another tenant's, and not an expired one.
pub async fn inspect_finds_any_subjects_operation_in_the_tenant(ledger: Arc<dyn Ledger>) {
    let mine = request(T0);
    claim(&*ledger, &mine).await;
    complete(&*ledger, &mine, Outcome::Completed(b"mine".to_vec())).await;
    let reference = mine.key.reference();
    let found = ledger.inspect(mine.tenant, reference, None, T0 + 1).await.unwrap().expect("the tenant's operation");
    assert_eq!((found.state, found.result.as_deref(), found.superseded), (State::Completed, Some(&b"mine"[..]), false));
    let other = TenantTag::from_bytes(random_bytes());
    assert_eq!(ledger.inspect(other, reference, None, T0 + 1).await.unwrap(), None, "another tenant's lookup");
    assert_eq!(ledger.inspect(mine.tenant, reference, None, T0 + WINDOW + 1).await.unwrap(), None, "expired");

    // A superseded unknown operation, for the operator.
    let unknown = request(T0);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let after = T0 + WINDOW + 1;
    let newer = repeat(&unknown, after);
    assert_eq!(claim(&*ledger, &newer).await.won(), Some(Won::Fresh));
    let current = ledger.inspect(unknown.tenant, unknown.key.reference(), None, after).await.unwrap().expect("current");
    assert_eq!((current.state, current.superseded), (State::InProgress, false), "the current one first");
    complete(&*ledger, &newer, Outcome::Failed).await;
    let gone = after + WINDOW + 1;
    let old = ledger.inspect(unknown.tenant, unknown.key.reference(), None, gone).await.unwrap().expect("superseded");
    assert_eq!((old.state, old.superseded, old.created_at), (State::Unknown, true, T0), "then the superseded one");
    assert_eq!(ledger.inspect(other, unknown.key.reference(), None, gone).await.unwrap(), None);
    // By address: each operation of the key, whichever is current.
    let reference = unknown.key.reference();
    let at = |window_end| ledger.inspect(unknown.tenant, reference, Some(window_end), after + 1);
    assert_eq!(
        at(address(&unknown).window_end).await.unwrap().map(|r| (r.state, r.superseded)),
        Some((State::Unknown, true))
    );
    assert_eq!(
        at(address(&newer).window_end).await.unwrap().map(|r| (r.state, r.superseded)),
        Some((State::Failed, false))
    );
    assert_eq!(at(address(&newer).window_end + 1).await.unwrap(), None, "no operation at that address");
}

/// A verdict lands only on the operation its address names. The scenario: operation 1 ends
/// unknown under `hold`; its window passes; a repeat supersedes it and starts operation 2,
/// whose holder is alive but late (its lease lapsed). The operator, having checked the
/// downstream for operation 1, says "nothing happened" about operation 1's address: operation 1
/// is settled, operation 2 is untouched — its holder still records its result, and the next
/// repeat replays it rather than charging again. An address that names nothing is refused.
pub async fn a_verdict_lands_only_on_the_operation_it_names(ledger: Arc<dyn Ledger>) {
    let first = request(T0);
    claim(&*ledger, &first).await;
    complete(&*ledger, &first, Outcome::Unknown).await;
    let after = T0 + WINDOW + 1;
    let second = repeat(&first, after);
    assert_eq!(claim(&*ledger, &second).await.won(), Some(Won::Fresh));
    let late = after + LEASE + 1;
    let (one, two) = (address(&first), address(&second));
    assert_eq!(one.reference, two.reference, "one ref, two operations");
    assert_ne!(one, two, "two addresses");

    let nowhere = Address { window_end: two.window_end + 1, ..two };
    let refused = ledger.resolve(first.tenant, nowhere, Resolution::NothingHappened, late, late).await;
    assert_eq!(refused, Err(LedgerError::NotFound), "a verdict whose address matches nothing");
    ledger.resolve(first.tenant, one, Resolution::NothingHappened, late, late).await.expect("operation 1 settles");
    let settled = ledger.inspect(first.tenant, one.reference, Some(one.window_end), late).await.unwrap();
    assert_eq!(settled.map(|r| (r.state, r.superseded)), Some((State::Failed, true)), "operation 1 got the verdict");
    let running = ledger.inspect(first.tenant, two.reference, Some(two.window_end), late).await.unwrap();
    assert_eq!(running.map(|r| (r.state, r.lease_expired)), Some((State::InProgress, true)), "operation 2 untouched");
    // Operation 2's late holder records its result, and the next repeat replays it.
    ledger
        .complete(&second.key, second.token, Outcome::Completed(b"charged once".to_vec()), late + GRACE)
        .await
        .expect("the late holder records");
    assert_eq!(claim(&*ledger, &repeat(&first, late + 1)).await, Claim::Replay { result: b"charged once".to_vec() });
}

/// stats: records by state, the oldest unknown, what the sweep would delete — at least this
/// case's own records, on a ledger shared with the cases running beside it.
pub async fn stats_count_records_by_state(ledger: Arc<dyn Ledger>) {
    stats_case(ledger, false).await;
}

/// stats, exactly, on a ledger of this case's own (called by each backend's file that can make
/// one: memory, SQLite).
pub async fn stats_count_exactly(ledger: Arc<dyn Ledger>) {
    assert_eq!(ledger.stats(T0).await.unwrap().total(), 0, "an empty ledger");
    stats_case(ledger, true).await;
}

async fn stats_case(ledger: Arc<dyn Ledger>, fresh: bool) {
    let done = request(T0);
    claim(&*ledger, &done).await;
    complete(&*ledger, &done, Outcome::Completed(b"r".to_vec())).await;
    let failed = request(T0);
    claim(&*ledger, &failed).await;
    complete(&*ledger, &failed, Outcome::Failed).await;
    let unknown = request(T0 + 10);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let dead = request(T0 + 20);
    claim(&*ledger, &dead).await;
    let live = request(T0 + LEASE + 50);
    claim(&*ledger, &live).await;

    // Past the dead holder's lease, before any window ends.
    let now = T0 + LEASE + 100;
    let stats = ledger.stats(now).await.unwrap();
    assert!(stats.oldest_unknown.is_some_and(|oldest| oldest <= T0 + 10), "{stats:?}");
    if fresh {
        assert_eq!(
            (stats.in_progress, stats.stale, stats.completed, stats.failed, stats.unknown),
            (2, 1, 1, 1, 1),
            "{stats:?}"
        );
        assert_eq!((stats.superseded, stats.sweepable, stats.oldest_unknown), (0, 0, Some(T0 + 10)), "{stats:?}");
        assert_eq!(stats.total(), 5);
    } else {
        assert!(stats.in_progress >= 2 && stats.stale >= 1 && stats.completed >= 1, "{stats:?}");
        assert!(stats.failed >= 1 && stats.unknown >= 1, "{stats:?}");
    }

    // After every window: the completed and failed records are sweepable; the unknown one is
    // superseded by a new claim and kept for the operator.
    let later = T0 + 20 + WINDOW + 1;
    assert_eq!(claim(&*ledger, &repeat(&unknown, later)).await.won(), Some(Won::Fresh));
    let stats = ledger.stats(later).await.unwrap();
    if fresh {
        assert_eq!((stats.superseded, stats.superseded_unknown, stats.sweepable), (1, 1, 2), "{stats:?}");
        assert_eq!(stats.oldest_unknown, Some(T0 + 10), "the superseded unknown is still the oldest");
    } else {
        assert!(stats.superseded >= 1 && stats.superseded_unknown >= 1 && stats.sweepable >= 2, "{stats:?}");
    }
}

/// pending: the unsettled records of a tenant — unknown, in progress under a live or a lapsed
/// lease, superseded — oldest first, each with the label its claim carried; never a settled
/// record, never another tenant's; filtered by state and age; a page at a time.
pub async fn pending_lists_unsettled_operations_oldest_first(ledger: Arc<dyn Ledger>) {
    let tenant = TenantTag::from_bytes(random_bytes());
    let in_tenant =
        |at: u64, label: Option<&[u8]>| ClaimRequest { tenant, label: label.map(<[u8]>::to_vec), ..request(at) };
    let done = in_tenant(T0, Some(b"done"));
    claim(&*ledger, &done).await;
    complete(&*ledger, &done, Outcome::Completed(b"r".to_vec())).await;
    let failed = in_tenant(T0 + 1, Some(b"failed"));
    claim(&*ledger, &failed).await;
    complete(&*ledger, &failed, Outcome::Failed).await;
    let unknown = in_tenant(T0 + 10, Some(b"unknown one"));
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let elsewhere = request(T0 + 15);
    claim(&*ledger, &elsewhere).await;
    complete(&*ledger, &elsewhere, Outcome::Unknown).await;
    let dead = in_tenant(T0 + 20, Some(b"dead holder"));
    claim(&*ledger, &dead).await;
    let live = in_tenant(T0 + LEASE + 50, None);
    claim(&*ledger, &live).await;

    let now = T0 + LEASE + 100;
    let list = |query: PendingQuery, now: u64| {
        let ledger = Arc::clone(&ledger);
        async move { ledger.pending(&query, now).await.expect("pending") }
    };
    let of_tenant = |limit: usize| {
        let mut query = PendingQuery::new(limit);
        query.tenants = vec![tenant];
        query
    };
    let refs = |records: &[PendingRecord]| records.iter().map(|record| record.reference).collect::<Vec<_>>();
    let all = list(of_tenant(10), now).await;
    assert_eq!(refs(&all), [unknown.key.reference(), dead.key.reference(), live.key.reference()], "{all:#?}");
    let states: Vec<_> = all.iter().map(|record| (record.state, record.created_at, record.superseded)).collect();
    assert_eq!(
        states,
        [
            (State::Unknown, T0 + 10, false),
            (State::InProgress, T0 + 20, false),
            (State::InProgress, T0 + LEASE + 50, false)
        ]
    );
    let labels: Vec<_> = all.iter().map(|record| record.label.clone()).collect();
    assert_eq!(labels, [Some(b"unknown one".to_vec()), Some(b"dead holder".to_vec()), None]);
    assert!(all.iter().all(|record| record.tenant == tenant));
    let keys: Vec<_> = all.iter().map(|record| record.key).collect();
    assert_eq!(keys, [unknown.key, dead.key, live.key], "each record's full key");
    assert_eq!(all[1].lease_until, T0 + 20 + LEASE, "the dead holder's lease, to tell it from a live one");

    let mut only = of_tenant(10);
    only.state = Some(State::Unknown);
    assert_eq!(refs(&list(only.clone(), now).await), [unknown.key.reference()]);
    only.state = Some(State::InProgress);
    assert_eq!(refs(&list(only, now).await), [dead.key.reference(), live.key.reference()]);
    let mut old = of_tenant(10);
    old.claimed_by = T0 + 15;
    assert_eq!(refs(&list(old, now).await), [unknown.key.reference()], "claimed at or before");

    // A page at a time: the page after the second record.
    let first = list(of_tenant(2), now).await;
    assert_eq!(refs(&first), [unknown.key.reference(), dead.key.reference()]);
    let mut next = of_tenant(2);
    next.after = Some((first[1].created_at, first[1].reference));
    assert_eq!(refs(&list(next, now).await), [live.key.reference()]);

    // Every tenant: at least these four (a shared ledger holds other cases' records too).
    let everyone = list(PendingQuery::new(100_000), now).await;
    for wanted in [&unknown, &elsewhere, &dead, &live] {
        assert!(everyone.iter().any(|record| record.reference == wanted.key.reference()));
    }
    for settled in [&done, &failed] {
        assert!(everyone.iter().all(|record| record.reference != settled.key.reference()), "a settled record");
    }

    // Superseded after its window: the old unknown stays listed with its own label, beside the
    // new operation with the new claim's.
    let later = T0 + 10 + WINDOW + 1;
    let again = ClaimRequest { label: Some(b"second try".to_vec()), ..repeat(&unknown, later) };
    assert_eq!(claim(&*ledger, &again).await.won(), Some(Won::Fresh));
    let after = list(of_tenant(10), later).await;
    let find = |superseded: bool| {
        after
            .iter()
            .find(|record| record.reference == unknown.key.reference() && record.superseded == superseded)
            .unwrap_or_else(|| panic!("superseded: {superseded} in {after:#?}"))
    };
    assert_eq!((find(true).state, find(true).label.as_deref()), (State::Unknown, Some(&b"unknown one"[..])));
    assert_eq!((find(false).state, find(false).label.as_deref()), (State::InProgress, Some(&b"second try"[..])));
    assert_eq!(after.len(), 4, "the superseded, the dead holder, the once-live one, the new one: {after:#?}");
}

/// resolve: the operator path out of unknown, either way; live or finished records refuse it.
pub async fn resolve_settles_unknown(ledger: Arc<dyn Ledger>) {
    let happened = request(T0);
    claim(&*ledger, &happened).await;
    complete(&*ledger, &happened, Outcome::Unknown).await;
    ledger
        .resolve(happened.tenant, address(&happened), Resolution::Completed(b"found".to_vec()), T0 + 1, T0 + 1)
        .await
        .unwrap();
    assert_eq!(claim(&*ledger, &repeat(&happened, T0 + 2)).await, Claim::Replay { result: b"found".to_vec() });
    assert_eq!(
        ledger.resolve(happened.tenant, address(&happened), Resolution::NothingHappened, T0 + 3, T0 + 3).await,
        Err(LedgerError::NotResolvable { state: State::Completed })
    );

    let dead = request(T0);
    claim(&*ledger, &dead).await;
    assert_eq!(
        ledger.resolve(dead.tenant, address(&dead), Resolution::NothingHappened, T0 + 1, T0 + 1).await,
        Err(LedgerError::NotResolvable { state: State::InProgress }),
        "a live lease cannot be resolved from outside"
    );
    ledger
        .resolve(dead.tenant, address(&dead), Resolution::NothingHappened, T0 + LEASE + 1, T0 + LEASE + 1)
        .await
        .unwrap();
    assert_eq!(ledger.complete(&dead.key, dead.token, Outcome::Unknown, NO_GRACE).await, Err(LedgerError::Fenced));
    assert_eq!(claim(&*ledger, &repeat(&dead, T0 + LEASE + 2)).await.won(), Some(Won::Fresh));
}

/// Issue 28, item 8: a "nothing happened" verdict on an operation past its window stays readable
/// for the verdict's retention (`keep_until`), as a "completed" one does — it vanished at once.
pub async fn a_verdict_past_the_window_stays_readable(ledger: Arc<dyn Ledger>) {
    for resolution in [Resolution::NothingHappened, Resolution::Completed(b"found".to_vec())] {
        let lost = request(T0);
        claim(&*ledger, &lost).await;
        complete(&*ledger, &lost, Outcome::Unknown).await;
        let late = T0 + WINDOW + 10;
        ledger.resolve(lost.tenant, address(&lost), resolution.clone(), late, late + GRACE).await.unwrap();
        let read = ledger.inspect(lost.tenant, lost.key.reference(), Some(lost.window_end), late + 1).await.unwrap();
        let state = if resolution == Resolution::NothingHappened { State::Failed } else { State::Completed };
        assert_eq!(read.map(|report| report.state), Some(state), "{resolution:?}: readable after the verdict");
    }
}

/// A correction (`Resolution::Replace`): replaces a completed result only while it is still the
/// bytes the operator's check read, and nothing else — never an unsettled record, never a
/// result that changed meanwhile.
pub async fn a_correction_replaces_only_the_result_it_names(ledger: Arc<dyn Ledger>) {
    let done = request(T0);
    claim(&*ledger, &done).await;
    complete(&*ledger, &done, Outcome::Completed(b"misfit".to_vec())).await;
    let replace = |unreadable: &[u8], result: &[u8]| Resolution::Replace {
        unreadable: unreadable.to_vec(),
        result: result.to_vec(),
    };
    assert_eq!(
        ledger.resolve(done.tenant, address(&done), replace(b"other", b"right"), T0 + 1, T0 + 1).await,
        Err(LedgerError::NotResolvable { state: State::Completed }),
        "a result other than the one checked is never replaced"
    );
    ledger.resolve(done.tenant, address(&done), replace(b"misfit", b"right"), T0 + 1, T0 + 1).await.unwrap();
    assert_eq!(claim(&*ledger, &repeat(&done, T0 + 2)).await, Claim::Replay { result: b"right".to_vec() });
    assert_eq!(
        ledger.resolve(done.tenant, address(&done), replace(b"misfit", b"again"), T0 + 3, T0 + 3).await,
        Err(LedgerError::NotResolvable { state: State::Completed }),
        "a second correction of the same bytes finds them gone"
    );
    let unknown = request(T0);
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    assert_eq!(
        ledger.resolve(unknown.tenant, address(&unknown), replace(b"", b"right"), T0 + 1, T0 + 1).await,
        Err(LedgerError::NotResolvable { state: State::Unknown }),
        "an unsettled operation takes a verdict, not a correction"
    );
}

/// keep_tool_facts / tool_facts: what a server keeps of a tool for its operator reads back, and
/// a later write replaces an earlier one (a new build's result shape), never the other way round.
pub async fn tool_facts_keep_the_latest(ledger: Arc<dyn Ledger>) {
    let namespace = format!("conformance-{}", idem_runtime::ledger::Token::random().get());
    let facts = |tool| {
        let ledger = Arc::clone(&ledger);
        let namespace = namespace.clone();
        async move { ledger.tool_facts(&namespace, tool).await.unwrap() }
    };
    assert_eq!(facts("charge").await, None);
    ledger.keep_tool_facts(&namespace, "charge", r#"{"stale":"hold"}"#, T0).await.unwrap();
    assert_eq!(facts("charge").await.as_deref(), Some(r#"{"stale":"hold"}"#));
    ledger.keep_tool_facts(&namespace, "charge", r#"{"stale":"takeover"}"#, T0 + 10).await.unwrap();
    assert_eq!(facts("charge").await.as_deref(), Some(r#"{"stale":"takeover"}"#));
    ledger.keep_tool_facts(&namespace, "charge", r#"{"stale":"reconcile"}"#, T0 + 5).await.unwrap();
    assert_eq!(facts("charge").await.as_deref(), Some(r#"{"stale":"takeover"}"#), "an older build's facts do not win");
    assert_eq!(facts("refund").await, None, "per tool");
}

/// sweep: deletes expired records in bounded batches and never a record under a live lease.
pub async fn sweep_is_bounded_and_spares_live_leases(ledger: Arc<dyn Ledger>) {
    // Times near zero: no other case has records this old. Clear any left by an earlier run.
    let base = 1_000;
    while ledger.sweep(base + 100, 1000).await.unwrap() > 0 {}
    let mut expired = Vec::new();
    for i in 0..25 {
        let r = ClaimRequest {
            window_end: base + 10,
            expires_at: base + 10 + UNSETTLED,
            lease_until: base + 5,
            ..request(base + i % 3)
        };
        claim(&*ledger, &r).await;
        let outcome = if i % 2 == 0 { Outcome::Completed(b"old".to_vec()) } else { Outcome::Failed };
        complete(&*ledger, &r, outcome).await;
        expired.push(r);
    }
    // Past its window but its holder is alive (a long handler): not swept.
    let live = ClaimRequest {
        window_end: base + 10,
        expires_at: base + 10 + UNSETTLED,
        lease_until: base + 10 * UNSETTLED,
        ..request(base)
    };
    claim(&*ledger, &live).await;
    // Past its window with a dead holder, or unknown: not swept either until their unsettled
    // retention passes — they wait for a repeat or an operator first.
    let dead = ClaimRequest {
        window_end: base + 10,
        expires_at: base + 10 + UNSETTLED,
        lease_until: base + 5,
        ..request(base)
    };
    claim(&*ledger, &dead).await;
    let unknown = ClaimRequest { window_end: base + 10, expires_at: base + 10 + UNSETTLED, ..request(base) };
    claim(&*ledger, &unknown).await;
    complete(&*ledger, &unknown, Outcome::Unknown).await;
    let now = base + 100;
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 10);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 10);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 5);
    assert_eq!(ledger.sweep(now, 10).await.unwrap(), 0);
    for r in &expired {
        assert_eq!(ledger.status(r.tenant, r.subject, r.key.reference(), base).await.unwrap(), None, "swept");
    }
    let kept =
        ledger.status(live.tenant, live.subject, live.key.reference(), now).await.unwrap().expect("live lease kept");
    assert_eq!(kept.state, State::InProgress);
    complete(&*ledger, &live, Outcome::Completed(b"done".to_vec())).await;
    let kept =
        ledger.status(dead.tenant, dead.subject, dead.key.reference(), now).await.unwrap().expect("dead holder kept");
    assert!(kept.lease_expired);
    let kept = ledger
        .status(unknown.tenant, unknown.subject, unknown.key.reference(), now)
        .await
        .unwrap()
        .expect("unknown kept");
    assert_eq!(kept.state, State::Unknown);
    // Once their unsettled retention passed, they go too — the table stays bounded — but never a
    // record under a live lease.
    let later = base + 10 + UNSETTLED;
    let live_again = ClaimRequest {
        window_end: base + 10,
        expires_at: base + 10 + UNSETTLED,
        lease_until: later + 1_000_000,
        ..request(base)
    };
    claim(&*ledger, &live_again).await;
    let mut swept = 0;
    loop {
        let n = ledger.sweep(later, 1000).await.unwrap();
        swept += n;
        if n == 0 {
            break;
        }
    }
    assert_eq!(swept, 3, "the live holder's record, the dead holder's and the unknown one");
    assert_eq!(ledger.status(dead.tenant, dead.subject, dead.key.reference(), later).await.unwrap(), None);
    assert_eq!(ledger.status(unknown.tenant, unknown.subject, unknown.key.reference(), later).await.unwrap(), None);
    let kept = ledger.status(live_again.tenant, live_again.subject, live_again.key.reference(), later).await.unwrap();
    assert!(kept.is_some(), "a live lease is never swept");
    complete(&*ledger, &live_again, Outcome::Completed(b"done".to_vec())).await;
    while ledger.sweep(later + 1, 1000).await.unwrap() > 0 {}
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
            Ok(Claim::Won { attempt: Won::Fresh, .. }) => won += 1,
            Ok(Claim::InFlight { .. }) => in_flight += 1,
            other => panic!("unexpected answer to a concurrent claim: {other:?}"),
        }
    }
    assert_eq!((won, in_flight), (1, 199));
}
