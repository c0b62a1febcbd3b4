//! The ledger timeout as a layer: a [`Ledger`] that wraps a ledger and bounds every call it
//! forwards, the way tower's `Timeout` wraps a service. A handle wraps its ledger once, so no
//! call — a claim, a status read, an operator's sweep — can reach the ledger unbounded. Being
//! the one place every statement passes, it also counts the statements that found no server
//! (unavailable, or their answer lost): after one, the server that answers next may be another
//! machine (a failover), and the handle measures its clock again before acting on time.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{BoxFuture, Layer, Ledger, LedgerError, Verb};

/// `inner`, with every call answered within `limit`: a call that takes longer is
/// [`LedgerError::Ambiguous`] (its statement may still commit).
/// Each statement that failed unavailable or ambiguous adds one to `lost`.
pub(crate) struct Timeout {
    inner: Arc<dyn Ledger>,
    limit: Duration,
    lost: Arc<AtomicU64>,
}

impl Timeout {
    pub(crate) fn new(inner: Arc<dyn Ledger>, limit: Duration, lost: Arc<AtomicU64>) -> Self {
        Self { inner, limit, lost }
    }

    fn bound<'a, T: Send + 'a>(
        &self,
        call: impl Future<Output = Result<T, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, LedgerError>> {
        let (limit, lost) = (self.limit, Arc::clone(&self.lost));
        Box::pin(async move {
            let answer =
                match tokio::time::timeout(limit, call).await {
                    Ok(answer) => answer,
                    Err(elapsed) => Err(LedgerError::ambiguous(format!("no answer within {} ms", limit.as_millis()))
                        .with_source(elapsed)),
                };
            if let Err(LedgerError::Unavailable { .. } | LedgerError::Ambiguous { .. }) = &answer {
                lost.fetch_add(1, Ordering::AcqRel);
            }
            answer
        })
    }
}

impl Layer for Timeout {
    type Inner = dyn Ledger;

    fn inner(&self) -> &dyn Ledger {
        &*self.inner
    }

    fn pass<'a, R: Send + 'a>(
        &'a self,
        _verb: Verb,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>> {
        self.bound(send())
    }
}
