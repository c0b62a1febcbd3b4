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

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    StatusReport, Token,
};
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::secret::{Secret, SecretError};

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

impl Ledger for Timeout {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        self.bound(self.inner.claim(request))
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.bound(self.inner.renew(key, token, lease_until))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.bound(self.inner.complete(key, token, outcome, keep_until))
    }
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.bound(self.inner.release(key, token))
    }
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.bound(self.inner.lookup(key, now))
    }
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.bound(self.inner.status(tenant, subject, reference, now))
    }
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.bound(self.inner.resolve(tenant, address, resolution, now, keep_until))
    }
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.bound(self.inner.inspect(tenant, reference, window_end, now))
    }
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        self.bound(self.inner.stats(now))
    }
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        self.bound(self.inner.pending(query, now))
    }
    fn keeps_labels(&self) -> bool {
        self.inner.keeps_labels()
    }
    fn local(&self) -> bool {
        self.inner.local()
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        self.bound(self.inner.sweep(now, limit))
    }
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        self.bound(self.inner.now())
    }
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        self.bound(self.inner.tool_owners(namespace, tool, owner, now, since))
    }
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        self.bound(self.inner.secret_check(version, check))
    }
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        self.bound(self.inner.secret_versions(live))
    }
    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.bound(self.inner.keep_tool_facts(namespace, tool, facts, now))
    }
    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        self.bound(self.inner.tool_facts(namespace, tool))
    }
    fn default_secret(&self) -> Result<Secret, SecretError> {
        self.inner.default_secret()
    }
}
