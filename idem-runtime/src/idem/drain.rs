//! A graceful stop: [`Idem::drain`](super::Idem::drain) closes the handle to new calls (each is
//! refused with [`Rejection::ShuttingDown`](crate::Rejection::ShuttingDown), safe to retry
//! elsewhere) and waits, up to a deadline, for the calls already past that point — their
//! claims, handlers and recorded outcomes — to end. A call still running at the deadline is
//! left as it is: its record stays in progress, and once its lease lapses the tool's stale
//! policy decides (a takeover forwards the same key; `hold` reports "outcome unknown"), which
//! keeps "maybe happened" true.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::rejection::Rejection;

/// Whether the handle still takes calls, and how many are under way.
#[derive(Default)]
pub(super) struct Drain {
    closed: AtomicBool,
    running: AtomicUsize,
    ended: Notify,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Calls still under way at the deadline (0: every call ended and recorded its outcome).
    pub still_running: usize,
}

/// A call under way: counted until dropped.
pub(super) struct Underway<'a>(&'a Drain);

impl Drop for Underway<'_> {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ended.notify_waiters();
        }
    }
}

impl Drain {
    /// A call starts, unless the handle is draining.
    pub(super) fn enter(&self) -> Result<Underway<'_>, Rejection> {
        self.running.fetch_add(1, Ordering::AcqRel);
        let underway = Underway(self);
        // Checked after counting, so a drain that closes meanwhile waits for this call.
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejection::ShuttingDown);
        }
        Ok(underway)
    }

    /// Closes to new calls and waits up to `deadline` for those under way.
    pub(super) async fn run(&self, deadline: Duration) -> Drained {
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
        let still_running = if waited.is_ok() { 0 } else { self.running.load(Ordering::Acquire) };
        if still_running > 0 {
            tracing::warn!(
                still_running,
                "drained until the deadline: calls still running keep their records in progress, and their tools' \
                 stale policy decides once their leases lapse"
            );
        } else {
            tracing::info!("drained: every call under way ended and recorded its outcome");
        }
        Drained { still_running }
    }
}
