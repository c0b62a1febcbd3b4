//! Waiting for an operation in progress (`wait = "5s"`, [`Recipe::wait`](crate::Recipe::wait)):
//! a repeat that finds the operation in flight is answered by how it settles, if it settles in
//! time, and "in flight" only after that.
//!
//! The waiters of one operation in one process share a slot: one poller (a task) reads the
//! record with single [`Ledger::lookup`](crate::ledger::Ledger::lookup) statements, pausing 10 ms and
//! doubling up to 250 ms between them, and holds no connection, transaction or lock while it
//! pauses. When the holder runs in this process, the poller does not poll at all: the holder's
//! end wakes it, and one read follows. The poller acts on no time of its own: what a settled
//! record means is left to one claim, sent once for every waiter, so every waiter is answered
//! exactly as a repeat arriving then would be — the stored bytes as a replay, "outcome unknown",
//! or (the first call did nothing) a claim of its own. The poller leaves with the last waiter,
//! cancelled ones included.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::key::Key;
use crate::ledger::{Claim, ClaimRequest, LedgerError, State, Token, held};

use super::Idem;
use super::time::clamp;

/// The first pause between two reads of a record waited on; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two reads: a wait of a minute costs some 250 reads per operation
/// and process, however many repeats wait.
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// How a wait ended.
#[derive(Clone, Debug)]
pub(super) enum Waited {
    /// The operation completed: its stored bytes, as a repeat's claim was answered.
    Replay(Arc<[u8]>),
    /// Its outcome is unknown.
    Unknown,
    /// It ended without effect (or the record is gone, or nobody holds it any more, or another
    /// operation's arguments hold the key): claim again, as any repeat would.
    ClaimAgain,
    /// Still in progress at the deadline.
    InFlight,
    /// The ledger did not answer a read: the operation was in flight when last seen.
    Unavailable,
}

/// One operation waited on: a key and the arguments' fingerprint (waiters with other arguments
/// would be told of a conflict, not of this operation's result).
type SlotId = (Key, [u8; 32]);

/// The operations this handle's process waits on, and the claims it holds. Shared by every
/// clone of a handle (and by handles made from it with the `with_*` builders).
#[derive(Default)]
pub(super) struct Waiting {
    inner: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// One per operation waited on, removed by its poller when the last waiter has left.
    waited: HashMap<SlotId, Arc<Slot>>,
    /// How many claims of each key this process holds (a handler is running).
    held: HashMap<Key, usize>,
}

/// The waiters of one operation.
struct Slot {
    /// The answer, once the poller has one; each waiter holds a receiver.
    answer: watch::Sender<Option<Waited>>,
    /// Rung when this process's holder of the key has ended its claim.
    wake: Notify,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many operations are waited on (tests: a cancelled waiter leaves none behind).
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.lock().waited.len()
    }

    /// Marks `key` as held by this process until the guard drops — after the outcome is
    /// recorded, or on a panic or a cancelled call — which wakes its waiters.
    pub(super) fn hold(self: &Arc<Self>, key: Key) -> Holding {
        *self.lock().held.entry(key).or_default() += 1;
        Holding { waiting: Arc::clone(self), key }
    }

    fn held_here(&self, key: &Key) -> bool {
        self.lock().held.contains_key(key)
    }

    /// Removes the slot `id` if nobody waits on it any more; decided under the lock a new
    /// waiter joins under, so none is left without a poller.
    fn leave_if_unwatched(&self, id: &SlotId) -> bool {
        let mut slots = self.lock();
        let unwatched = slots.waited.get(id).is_none_or(|slot| slot.answer.receiver_count() == 0);
        if unwatched {
            slots.waited.remove(id);
        }
        unwatched
    }
}

/// A claim this process holds; see [`Waiting::hold`].
pub(super) struct Holding {
    waiting: Arc<Waiting>,
    key: Key,
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut slots = self.waiting.lock();
        if let Some(count) = slots.held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                slots.held.remove(&self.key);
            }
        }
        for ((key, _), slot) in &slots.waited {
            if *key == self.key {
                slot.wake.notify_one();
            }
        }
    }
}

impl Idem {
    /// Waits until `deadline` for the operation `request` found in flight to settle.
    pub(super) async fn wait_for(&self, request: &ClaimRequest, deadline: Instant) -> Waited {
        let mut answer = self.join(request);
        let settled = async {
            loop {
                if answer.changed().await.is_err() {
                    return Waited::InFlight;
                }
                if let Some(waited) = answer.borrow_and_update().clone() {
                    return waited;
                }
            }
        };
        tokio::time::timeout_at(deadline, settled).await.unwrap_or(Waited::InFlight)
    }

    /// A receiver of the answer for `request`'s operation: the slot's, or a new slot's with its
    /// poller started. It sees only answers published after it joined.
    fn join(&self, request: &ClaimRequest) -> watch::Receiver<Option<Waited>> {
        let waiting = &self.inner.waiting;
        let mut slots = waiting.lock();
        let id = (request.key, request.fingerprint);
        if let Some(slot) = slots.waited.get(&id) {
            return slot.answer.subscribe();
        }
        let (answer, receiver) = watch::channel(None);
        let slot = Arc::new(Slot { answer, wake: Notify::new() });
        slots.waited.insert(id, Arc::clone(&slot));
        tokio::spawn(self.clone().poll(slot, request.clone()));
        receiver
    }

    /// The slot's poller: reads the record until it settles, publishes what one claim says of
    /// it, and goes on for waiters who joined since, until none is left.
    async fn poll(self, slot: Arc<Slot>, request: ClaimRequest) {
        let waiting = Arc::clone(&self.inner.waiting);
        let id = (request.key, request.fingerprint);
        let mut pause = FIRST_PAUSE;
        loop {
            // A holder in this process wakes the slot when it ends: no reads until then.
            let local = waiting.held_here(&request.key);
            tokio::select! {
                () = slot.wake.notified() => {}
                () = tokio::time::sleep(pause), if !local => pause = (pause * 2).min(LONGEST_PAUSE),
                () = slot.answer.closed() => {}
            }
            if waiting.leave_if_unwatched(&id) {
                return;
            }
            if let Some(answer) = self.look(&request).await {
                slot.answer.send_replace(Some(answer));
                pause = FIRST_PAUSE;
            }
        }
    }

    /// One read of the record: `None` while somebody holds it. Once nobody does — its lease
    /// lapsed or was given back (a takeover that did nothing), on a clock that can be acted
    /// on — the waiters claim again, and the tool's stale policy answers them exactly as it
    /// answers a plain repeat arriving then (a takeover, a reconciliation, "outcome unknown").
    /// A holder in this process is alive however its lease reads (a plain repeat here is
    /// answered "in flight" by the process itself): its waiters wait for it to end.
    async fn look(&self, request: &ClaimRequest) -> Option<Waited> {
        let reference = request.key.reference();
        let found = match self.ledger_time().await {
            Ok((now, trusted)) => self.inner.ledger.lookup(&request.key, now).await.map(|found| (found, trusted)),
            Err(error) => Err(error),
        };
        let (found, trusted) = match found {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%reference, %error, "the ledger did not answer a waiter's read; answering in flight");
                return Some(Waited::Unavailable);
            }
        };
        match found {
            Some(report) if report.state == State::InProgress => {
                let nobody_holds = !held(!report.lease_expired, trusted) && !self.inner.waiting.held_here(&request.key);
                nobody_holds.then_some(Waited::ClaimAgain)
            }
            None => Some(Waited::ClaimAgain),
            Some(report) if report.state == State::Failed => Some(Waited::ClaimAgain),
            Some(_) => self.settle(request).await,
        }
    }

    /// The answer for every waiter of a settled operation: one claim, sent as a repeat
    /// arriving now would send it, so a waiter is answered exactly as that repeat — the
    /// same stored bytes, or a conflict if other arguments hold the key by now.
    async fn settle(&self, template: &ClaimRequest) -> Option<Waited> {
        let reference = template.key.reference();
        let Ok((now, clock_trusted)) = self.ledger_time().await else { return Some(Waited::Unavailable) };
        // Every time of the claim moved from the first waiter's `now` to this one.
        let shift = |at: u64| clamp(at.saturating_sub(template.now).saturating_add(now));
        let request = ClaimRequest {
            token: Token::random(),
            now,
            window_end: shift(template.window_end),
            expires_at: shift(template.expires_at),
            lease_until: shift(template.lease_until),
            clock_trusted,
            ..template.clone()
        };
        match self.inner.ledger.claim(&request).await {
            Ok(Claim::Replay { result }) => Some(Waited::Replay(result.into())),
            Ok(Claim::Unknown) => Some(Waited::Unknown),
            // Another operation with these arguments started meanwhile: wait for it.
            Ok(Claim::InFlight { .. }) => None,
            Ok(Claim::Conflict { .. }) => Some(Waited::ClaimAgain),
            Ok(Claim::Won { .. }) => {
                // The record expired or was superseded between the read and the claim: this
                // claim runs nothing, so it is given back (removed: it leaves no record), and each
                // waiter claims for itself.
                match self.inner.ledger.release(&request.key, request.token).await {
                    Ok(()) | Err(LedgerError::Fenced) => {}
                    Err(_) => self.release_lost_claim(&request),
                }
                Some(Waited::ClaimAgain)
            }
            Err(error) => {
                tracing::warn!(%reference, %error, "the ledger did not answer for the waiters; answering in flight");
                if error.is_ambiguous() {
                    self.release_lost_claim(&request);
                }
                Some(Waited::Unavailable)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection};

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Error(String);

    impl IdempotentError for Error {
        fn classify(&self) -> ErrorClass {
            ErrorClass::NothingHappened
        }
        fn from_rejection(rejection: Rejection) -> Self {
            Self(rejection.code().to_owned())
        }
    }

    static RECIPE: Recipe = Recipe::new("slow", &["id"]).wait(Duration::from_secs(30));

    /// A waiter whose future is dropped (a client that hung up) leaves no slot and no poller.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_waiter_leaves_no_slot_behind() {
        let idem = Idem::builder(MemoryLedger::new()).local_caller(Caller::new("acme", "alice")).build().unwrap();
        let args = serde_json::json!({ "id": 1 });
        let (started, release) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
        let holder = idem.call(&RECIPE, None, &args, || async {
            started.notify_one();
            release.notified().await;
            Ok::<_, Error>(1)
        });
        let waiter = async {
            started.notified().await;
            let mut repeat = Box::pin(idem.call(&RECIPE, None, &args, || async { Ok::<_, Error>(2) }));
            while idem.inner.waiting.slots() == 0 {
                tokio::select! {
                    _ = &mut repeat => panic!("the repeat was answered while the first call ran"),
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
            // Cancelled while it waits.
            drop(repeat);
            // The poller leaves once it sees the waiter gone (it is woken by the drop).
            for _ in 0..200 {
                if idem.inner.waiting.slots() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(idem.inner.waiting.slots(), 0, "a cancelled waiter left its slot behind");
            release.notify_one();
        };
        let (first, ()) = tokio::join!(holder, waiter);
        assert!(!first.unwrap().replayed);
    }
}
