//! A graceful stop: [`Idem::drain`](super::Idem::drain) closes the handle to new calls (each is
//! refused with [`Rejection::ShuttingDown`](crate::Rejection::ShuttingDown), safe to retry
//! elsewhere) and waits, up to a deadline, for the calls already past that point — their
//! claims, handlers and recorded outcomes — to end, and for the work they left behind: an
//! answered call whose outcome is still being recorded in the background (the ledger did not
//! take it at once), and the release of a claim whose answer was lost. A call still running at
//! the deadline is left as it is: its record stays in progress, and once its lease lapses the
//! tool's stale policy decides (a takeover forwards the same key; `hold` reports "outcome
//! unknown"), which keeps "maybe happened" true.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::key::Ref;
use crate::rejection::Rejection;

/// Whether the handle still takes calls, and how many calls and background endings are under way.
#[derive(Default)]
pub(super) struct Drain(Arc<Shared>);

#[derive(Default)]
struct Shared {
    closed: AtomicBool,
    /// Calls under way plus background endings ([`Background`]).
    running: AtomicUsize,
    ended: Notify,
    /// The background endings under way, by number: what a drain that ends at its deadline
    /// names as left behind.
    background: Mutex<BTreeMap<u64, (Ref, &'static str)>>,
    numbered: AtomicU64,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Calls still under way at the deadline, counting answered calls whose outcome was still
    /// being recorded (0: every call ended and recorded its outcome).
    pub still_running: usize,
    /// Of those, the answered calls whose outcome was still being recorded (or whose lost claim
    /// was still being released) in the background.
    pub still_recording: usize,
}

/// A call under way: counted until dropped.
pub(super) struct Underway<'a>(&'a Shared);

impl Drop for Underway<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Work a call left to the background — recording its outcome, releasing its lost claim —
/// counted by the drain until dropped, like the call itself.
pub(super) struct Background {
    drain: Arc<Shared>,
    number: u64,
}

impl Drop for Background {
    fn drop(&mut self) {
        self.drain.background.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.number);
        self.drain.leave();
    }
}

impl Drain {
    /// A call starts, unless the handle is draining.
    pub(super) fn enter(&self) -> Result<Underway<'_>, Rejection> {
        let drain = &*self.0;
        drain.running.fetch_add(1, Ordering::AcqRel);
        let underway = Underway(drain);
        // Checked after counting, so a drain that closes meanwhile waits for this call.
        if drain.closed.load(Ordering::Acquire) {
            return Err(Rejection::ShuttingDown);
        }
        Ok(underway)
    }

    /// Work of `reference` (`what` it does) goes to the background: counted, also while the
    /// handle drains — it finishes a call that was already under way. Taken before the work is
    /// spawned, while the call that leaves it is still counted, so a drain never sees none.
    pub(super) fn background(&self, reference: Ref, what: &'static str) -> Background {
        let drain = &self.0;
        drain.running.fetch_add(1, Ordering::AcqRel);
        let number = drain.numbered.fetch_add(1, Ordering::Relaxed);
        drain.background.lock().unwrap_or_else(PoisonError::into_inner).insert(number, (reference, what));
        Background { drain: Arc::clone(drain), number }
    }

    /// Closes to new calls and waits up to `deadline` for those under way and the work they
    /// left to the background.
    pub(super) async fn run(&self, deadline: Duration) -> Drained {
        self.0.run(deadline).await
    }
}

impl Shared {
    fn leave(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ended.notify_waiters();
        }
    }

    async fn run(&self, deadline: Duration) -> Drained {
        self.closed.store(true, Ordering::Release);
        let waited = tokio::time::timeout(deadline, async {
            loop {
                let ended = self.ended.notified();
                if self.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        })
        .await;
        if waited.is_ok() {
            tracing::info!("drained: every call under way ended and recorded its outcome");
            return Drained { still_running: 0, still_recording: 0 };
        }
        let still_running = self.running.load(Ordering::Acquire);
        let left: Vec<String> = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|(reference, what)| format!("{reference} ({what})"))
            .collect();
        tracing::warn!(
            still_running,
            still_recording = left.len(),
            left_in_the_background = ?left,
            "drained until the deadline: calls still running keep their records in progress, and so do answered \
             calls whose outcome was still being recorded; their tools' stale policy decides once their leases lapse \
             (check them with `idem show <ref>`)"
        );
        Drained { still_running, still_recording: left.len() }
    }
}
