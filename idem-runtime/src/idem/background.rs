//! Work beside a call and after it: the renewer that keeps a running handler's lease, the
//! release of a claim whose answer was lost, and the retries of a completion the ledger did not
//! take at once. Each handle runs at most [`BACKGROUND_JOBS`] releases and retries at once;
//! past that, a lost claim is left to run out its lease, and a result waits for its turn.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::key::Key;
use crate::ledger::{ClaimRequest, LedgerError, Token};

use super::Idem;
use super::ending::Ending;
use super::operation::LeaseState;
use super::time::{clamp, millis};

/// How many times a lost claim's release is tried.
const RELEASE_TRIES: u32 = 8;
/// How many background ledger jobs (releasing a lost claim, retrying a completion) one handle
/// runs at once; past this, a lost claim is left to its lease, and an answered call's result
/// waits for a turn (never dropped while it would still be tried).
pub(super) const BACKGROUND_JOBS: usize = 32;

impl Idem {
    /// Runs `future` (the handler, or a reconcile function) while a task of its own renews the
    /// claim's lease, so a long run keeps its claim — even a handler that blocks its thread —
    /// and a refused renewal shows in [`Operation::lease_lost`](super::Operation::lease_lost).
    /// A panic is caught and handed back.
    pub(super) async fn drive<F: Future>(
        &self,
        request: &ClaimRequest,
        lease: &Arc<LeaseState>,
        recorded: &Arc<AtomicBool>,
        future: F,
    ) -> std::thread::Result<F::Output> {
        let mut future = CatchUnwind(Box::pin(future));
        // A future that finishes on its first poll needs no renewals.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx))).await;
        if let std::task::Poll::Ready(output) = first {
            return output;
        }
        let renewal = self.clone().renew(request.key, request.token, Arc::clone(lease), Arc::clone(recorded));
        let _stop = AbortOnDrop(tokio::spawn(renewal));
        // Let the renewer start (and set its timer) before the handler goes on: a handler that
        // then blocks its thread would otherwise keep a task spawned on this thread from ever
        // starting.
        tokio::task::yield_now().await;
        future.await
    }

    /// Renews the lease every third of it until stopped, the handler recorded its result itself,
    /// or the ledger refuses (the claim is someone else's now).
    async fn renew(self, key: Key, token: Token, lease: Arc<LeaseState>, recorded: Arc<AtomicBool>) {
        let every = self.inner.settings.lease / 3;
        // The claim may have taken a while to answer: renew as soon as less than two thirds of
        // the lease is left, not a full third of a lease after the handler started.
        let left = lease.until.load(Ordering::SeqCst).saturating_sub(self.ledger_now());
        let mut pause =
            Duration::from_millis(left.saturating_sub(millis(self.inner.settings.lease * 2 / 3))).min(every);
        loop {
            tokio::time::sleep(pause).await;
            pause = every;
            if recorded.load(Ordering::SeqCst) {
                return;
            }
            // On a measurement taken after the last lost statement (see `time.rs`): the one the
            // calls keep fresh, or one taken now — a renewal stamped on a server that is gone
            // could read as lapsed already on the one that answers. If none can be had within a
            // sixth of the lease, on the last reading rather than not at all: a renewal only
            // extends the lease, and a lease left to lapse is the worse of the two.
            let measured = tokio::time::timeout(every / 2, self.ledger_time()).await;
            let until = match measured {
                Ok(Ok((now, _))) => clamp(now.saturating_add(millis(self.inner.settings.lease))),
                Ok(Err(_)) | Err(_) => {
                    tracing::warn!(reference = %key.reference(), "lease renewed on the last clock reading: \
                        the ledger's clock could not be read again");
                    self.keep_until(self.inner.settings.lease)
                }
            };
            match self.inner.ledger.renew(&key, token, until).await {
                Ok(()) => lease.until.fetch_max(until, Ordering::SeqCst),
                Err(LedgerError::Fenced) => {
                    tracing::warn!(reference = %key.reference(), "lease renewal refused: the claim is no longer ours");
                    lease.fenced.store(true, Ordering::SeqCst);
                    return;
                }
                Err(error) => {
                    tracing::warn!(reference = %key.reference(), %error, "lease renewal failed");
                    continue;
                }
            };
        }
    }

    /// The claim may have committed before its answer was lost. Undo it — fenced by our token,
    /// and only what it did: a fresh claim is removed, a takeover gives its lease back — so
    /// the retry the caller was told is safe runs instead of hearing "in flight" although
    /// nothing ran. In the background, at most [`RELEASE_TRIES`] times with growing pauses,
    /// stopping at the first answer; at most [`BACKGROUND_JOBS`] at once per handle, past which
    /// the claim is left to run out its lease.
    pub(super) fn release_lost_claim(&self, request: &ClaimRequest) {
        let (key, token) = (request.key, request.token);
        let Ok(permit) = Arc::clone(&self.inner.background).try_acquire_owned() else {
            tracing::warn!(reference = %key.reference(), "too much background work; a lost claim is left to its lease");
            return;
        };
        let idem = self.clone();
        let counted = self.inner.drain.background(key.reference(), "releasing a claim whose answer was lost");
        tokio::spawn(async move {
            let _permit = permit;
            let _counted = counted;
            // A few tries, spread over about a lease (and at least a few seconds, for a ledger
            // coming back from an outage).
            let mut pause = (idem.inner.settings.lease / 16).max(Duration::from_millis(20));
            for attempt in 1..=RELEASE_TRIES {
                match idem.inner.ledger.release(&key, token).await {
                    Ok(()) => {
                        tracing::info!(reference = %key.reference(), "released a claim whose answer was lost");
                        return;
                    }
                    // Nothing of ours to undo: the claim never committed, or is someone else's.
                    Err(LedgerError::Fenced) => return,
                    Err(error) if attempt == RELEASE_TRIES => {
                        tracing::warn!(reference = %key.reference(), %error, "could not release a lost claim; \
                            it runs out its lease");
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// Keeps trying to send `ending` after the caller has its answer, with growing pauses, until the lease would have run out twice
    /// over: a late result is still recorded under `hold` (its record went unknown, not to
    /// someone else), and a recorded result is what every repeat needs.
    pub(super) fn keep_recording(&self, request: &ClaimRequest, lease: &LeaseState, ending: Ending, recorded: bool) {
        let reference = request.key.reference();
        let (idem, request) = (self.clone(), request.clone());
        let until = lease.until.load(Ordering::SeqCst).saturating_add(millis(self.inner.settings.lease));
        // The caller has its answer: a drain waits for this recording as for the call itself.
        let counted = self.inner.drain.background(reference, "recording an answered call's outcome");
        let jobs = Arc::clone(&self.inner.background);
        tokio::spawn(async move {
            let _counted = counted;
            // A result the caller has is never dropped for want of a turn: past the jobs a
            // handle runs at once, it waits for one (as long as it would keep trying anyway),
            // so the ledger is not sent more at once while it is away.
            let turn = Duration::from_millis(until.saturating_sub(idem.ledger_now()));
            let Ok(Ok(_permit)) = tokio::time::timeout(turn, jobs.acquire_owned()).await else {
                tracing::error!(%reference, "gave up recording the outcome: too much background work until its \
                    lease would have run out twice over; its record stays in progress and its lease runs out into \
                    the tool's stale policy");
                return;
            };
            let mut pause = Duration::from_millis(500);
            while idem.ledger_now() < until {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                match ending.send(&idem, &request, recorded).await {
                    Ok(_) => return,
                    Err(LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. }) => {}
                    Err(error) => {
                        tracing::error!(reference = %request.key.reference(), %error, "could not record the outcome");
                        return;
                    }
                }
            }
            tracing::error!(reference = %request.key.reference(), "gave up recording the outcome; its record \
                stays in progress and its lease runs out into the tool's stale policy");
        });
    }
}

/// Aborts a spawned task when dropped (the renewer, when its handler finishes or is dropped).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Polls a future, turning a panic into an `Err` (like `futures`' `catch_unwind`).
struct CatchUnwind<F>(std::pin::Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}
