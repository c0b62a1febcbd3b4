//! The background sweeper ([`Admin::spawn_sweeper`](super::Admin::spawn_sweeper)): [`Admin::sweep`](super::Admin::sweep) on a jittered schedule,
//! in bounded batches with a yield between them, that keeps going after a ledger error (logged,
//! with a growing pause) and stops when its [`Sweeper`] guard is dropped or stopped, or when
//! every clone of its handle is gone (it holds the handle weakly).
//!
//! Every replica may run one: a record is deleted by one statement of one sweeper (the deleted
//! counts add up to the records deleted, never more), and on PostgreSQL a sweep skips the rows
//! another sweep (or a claim) has locked instead of waiting for them (`FOR UPDATE SKIP LOCKED`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::ledger::LedgerError;

use super::Idem;

/// After this many failed sweeps in a row, the pause stops growing: at most this power of two
/// times the period.
const MAX_BACKOFF_DOUBLINGS: u32 = 3;

/// A background sweeper, from [`Admin::spawn_sweeper`](super::Admin::spawn_sweeper). It runs until this guard is dropped or
/// [`stop`](Sweeper::stop)ped, or until every clone of the handle it was spawned from is gone.
///
/// Dropping the guard asks the sweeper to stop and returns at once: a batch already sent to the
/// ledger still finishes (a statement in flight cannot be unsent), and no other starts. Await
/// [`stop`](Sweeper::stop) to know that it has finished.
#[derive(Debug)]
#[must_use = "the sweeper stops when this guard is dropped; keep it for as long as it should run"]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    counters: Arc<Counters>,
}

/// What a [`Sweeper`] has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweeperStats {
    /// Sweeps run to the end (until a batch came back short).
    pub sweeps: u64,
    /// Records this sweeper deleted, over all its sweeps (including a sweep cut short by an
    /// error or a stop).
    pub swept: u64,
    /// Sweeps that ended in a ledger error (each logged at `warn`).
    pub errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sweeps: AtomicU64,
    swept: AtomicU64,
    errors: AtomicU64,
    /// The text of the last failed sweep's error.
    last_error: std::sync::Mutex<Option<String>>,
}

impl Counters {
    fn snapshot(&self) -> SweeperStats {
        SweeperStats {
            sweeps: self.sweeps.load(Ordering::SeqCst),
            swept: self.swept.load(Ordering::SeqCst),
            errors: self.errors.load(Ordering::SeqCst),
        }
    }
}

impl Sweeper {
    /// What this sweeper has done so far.
    #[must_use]
    pub fn stats(&self) -> SweeperStats {
        self.counters.snapshot()
    }

    /// The error of the last sweep that failed, as it was logged (`None` if none has): kept
    /// after later sweeps succeed, to say why [`SweeperStats::errors`] grew. A health check
    /// watches that count over time, not this.
    #[must_use]
    pub fn last_error(&self) -> Option<String> {
        self.counters.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether the sweeper has stopped: stopped by [`stop`](Sweeper::stop), or its handle gone.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(tokio::task::JoinHandle::is_finished)
    }

    /// Stops the sweeper and waits until it has: when this returns, it deletes nothing more. A
    /// batch in flight is let finish (and counted). Returns what it did.
    pub async fn stop(mut self) -> SweeperStats {
        drop(self.stop.take());
        if let Some(task) = self.task.take() {
            // A panic in the sweeper (there is none to expect) ended it all the same.
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        // Dropping the sender is the signal; the task ends after the batch it is in.
        drop(self.stop.take());
    }
}

/// Starts a sweeper over the handle `upgrade` gives while one of its clones lives
/// ([`Admin::spawn_sweeper`](super::Admin::spawn_sweeper)).
pub(super) fn spawn(
    upgrade: impl Fn() -> Option<Idem> + Send + Sync + 'static,
    every: Duration,
    batch: usize,
    gauges: bool,
) -> Sweeper {
    assert!(!every.is_zero(), "a sweeper needs a period: give `spawn_sweeper` a non-zero `every`, such as 5 minutes");
    let (stop, stopped) = oneshot::channel();
    let counters = Arc::new(Counters::default());
    let run = Run { handle: Box::new(upgrade), every, batch: batch.max(1), counters: Arc::clone(&counters), gauges };
    let task = tokio::spawn(run.run(stopped));
    Sweeper { stop: Some(stop), task: Some(task), counters }
}

/// A sweeper's task.
struct Run {
    /// The handle, while one of its clones lives.
    handle: Box<dyn Fn() -> Option<Idem> + Send + Sync>,
    every: Duration,
    batch: usize,
    counters: Arc<Counters>,
    /// Whether each sweep is followed by a count that sets the ledger gauges.
    gauges: bool,
}

/// How one sweep ended.
enum Pass {
    /// A batch came back short: nothing more to delete now.
    Done(usize),
    /// The ledger failed after this many deletions.
    Failed(usize, LedgerError),
    /// Stopped (or the handle is gone) after this many deletions.
    Stopped(usize),
}

impl Run {
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let mut pause = random_below(self.every);
        let mut failures: u32 = 0;
        loop {
            tokio::select! {
                biased;
                _ = &mut stopped => return,
                () = tokio::time::sleep(pause) => {}
            }
            match self.sweep(&mut stopped).await {
                Pass::Done(swept) => {
                    failures = 0;
                    self.counters.sweeps.fetch_add(1, Ordering::SeqCst);
                    if swept > 0 {
                        tracing::info!(swept, "swept expired records");
                    }
                    if self.gauges {
                        self.count().await;
                    }
                }
                Pass::Failed(swept, error) => {
                    failures = failures.saturating_add(1);
                    self.counters.errors.fetch_add(1, Ordering::SeqCst);
                    *self.counters.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some(error.to_string());
                    let retry = self.every.saturating_mul(1 << failures.min(MAX_BACKOFF_DOUBLINGS));
                    tracing::warn!(swept, %error, retry_in_ms = retry.as_millis(), "a sweep failed; \
                        the sweeper tries again later (check the ledger if this repeats)");
                }
                Pass::Stopped(swept) => {
                    if swept > 0 {
                        tracing::info!(swept, "swept expired records, then stopped");
                    }
                    if (self.handle)().is_none() {
                        tracing::info!("the sweeper's handle is gone; the sweeper stops");
                    }
                    return;
                }
            }
            let period = self.every.saturating_mul(1 << failures.min(MAX_BACKOFF_DOUBLINGS));
            // A quarter either way: period * 3/4 + [0, period / 2).
            pause = (period / 4).saturating_mul(3).saturating_add(random_below(period / 2));
        }
    }

    /// Sets the ledger gauges from one count of the ledger.
    async fn count(&self) {
        let Some(idem) = (self.handle)() else { return };
        match idem.admin().stats().await {
            #[cfg(feature = "metrics")]
            Ok(stats) => super::metrics::ledger(&stats, idem.ledger_now()),
            #[cfg(not(feature = "metrics"))]
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "could not count the ledger for its gauges; they keep their last values")
            }
        }
    }

    /// One sweep: batches until one comes back short, a stop, or an error.
    async fn sweep(&self, stopped: &mut oneshot::Receiver<()>) -> Pass {
        let mut swept = 0;
        loop {
            if !matches!(stopped.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                return Pass::Stopped(swept);
            }
            // Hold the handle only for one batch.
            let Some(idem) = (self.handle)() else { return Pass::Stopped(swept) };
            match idem.admin().sweep_batch(self.batch).await {
                Ok(deleted) => {
                    swept += deleted;
                    self.counters.swept.fetch_add(u64::try_from(deleted).unwrap_or(u64::MAX), Ordering::SeqCst);
                    if deleted < self.batch {
                        return Pass::Done(swept);
                    }
                }
                Err(error) => return Pass::Failed(swept, error),
            }
            drop(idem);
            tokio::task::yield_now().await;
        }
    }
}

/// A random duration in `[0, bound)` (zero for a zero bound), for jitter.
fn random_below(bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    // No randomness: no jitter, which only costs the spread.
    crate::bytes::try_random().map_or(Duration::ZERO, |bytes| Duration::from_nanos(u64::from_le_bytes(bytes) % nanos))
}
