//! A ledger that wraps another — the handle's timeout, a test's tap, an `Arc` — written as a
//! [`Layer`]: one function every call passes through, and the [`Ledger`] contract forwarded once,
//! here, instead of restated by each wrapper.

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    StatusReport, Token,
};
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::secret::{Secret, SecretError};

/// Which [`Ledger`] method a call is, as a [`Layer`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// [`Ledger::claim`]
    Claim,
    /// [`Ledger::renew`]
    Renew,
    /// [`Ledger::complete`]
    Complete,
    /// [`Ledger::release`]
    Release,
    /// [`Ledger::lookup`]
    Lookup,
    /// [`Ledger::status`]
    Status,
    /// [`Ledger::inspect`]
    Inspect,
    /// [`Ledger::resolve`]
    Resolve,
    /// [`Ledger::stats`]
    Stats,
    /// [`Ledger::pending`]
    Pending,
    /// [`Ledger::sweep`]
    Sweep,
    /// [`Ledger::now`]
    Now,
    /// [`Ledger::secret_check`]
    SecretCheck,
    /// [`Ledger::secret_versions`]
    SecretVersions,
    /// [`Ledger::tool_owners`]
    ToolOwners,
    /// [`Ledger::keep_tool_facts`]
    KeepToolFacts,
    /// [`Ledger::tool_facts`]
    ToolFacts,
}

/// A ledger that wraps another and passes every call through [`Layer::pass`]: it is a
/// [`Ledger`] (every method forwarded to [`Layer::inner`] through `pass`; the answers that are
/// not calls — [`Ledger::keeps_labels`], [`Ledger::local`], [`Ledger::catalogue`], [`Ledger::default_secret`] — straight
/// from the ledger beneath).
pub trait Layer: Send + Sync + 'static {
    /// The ledger beneath.
    type Inner: Ledger + ?Sized;

    /// The ledger beneath.
    fn inner(&self) -> &Self::Inner;

    /// Passes one call on: `send` makes the call to the ledger beneath, not yet made — the layer
    /// decides whether and when (a test refusing or delaying it), and what to do with its answer
    /// (the timeout bounding it).
    fn pass<'a, R: Send + 'a>(
        &'a self,
        verb: Verb,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>>;

    /// The ledger's time as this layer reports it; by default as the ledger beneath said (a
    /// test shifts it to play a failover to a server with another clock).
    fn now_seen(&self, now: Option<u64>) -> Option<u64> {
        now
    }
}

/// An `Arc` of a ledger is that ledger.
impl<L: Ledger + ?Sized> Layer for std::sync::Arc<L> {
    type Inner = L;

    fn inner(&self) -> &L {
        self
    }

    fn pass<'a, R: Send + 'a>(
        &'a self,
        _verb: Verb,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>> {
        send()
    }
}

impl<W: Layer> Ledger for W {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        self.pass(Verb::Claim, move || self.inner().claim(request))
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.pass(Verb::Renew, move || self.inner().renew(key, token, lease_until))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.pass(Verb::Complete, move || self.inner().complete(key, token, outcome, keep_until))
    }
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.pass(Verb::Release, move || self.inner().release(key, token))
    }
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.pass(Verb::Lookup, move || self.inner().lookup(key, now))
    }
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.pass(Verb::Status, move || self.inner().status(tenant, subject, reference, now))
    }
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.pass(Verb::Resolve, move || self.inner().resolve(tenant, address, resolution, now, keep_until))
    }
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.pass(Verb::Inspect, move || self.inner().inspect(tenant, reference, window_end, now))
    }
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        self.pass(Verb::Stats, move || self.inner().stats(now))
    }
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        self.pass(Verb::Pending, move || self.inner().pending(query, now))
    }
    fn keeps_labels(&self) -> bool {
        self.inner().keeps_labels()
    }
    fn local(&self) -> bool {
        self.inner().local()
    }
    fn catalogue(&self) -> Option<&super::Catalogue> {
        self.inner().catalogue()
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        self.pass(Verb::Sweep, move || self.inner().sweep(now, limit))
    }
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        let seen = self.pass(Verb::Now, move || self.inner().now());
        Box::pin(async move { seen.await.map(|now| self.now_seen(now)) })
    }
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        self.pass(Verb::SecretCheck, move || self.inner().secret_check(version, check))
    }
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        self.pass(Verb::SecretVersions, move || self.inner().secret_versions(live))
    }
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        self.pass(Verb::ToolOwners, move || self.inner().tool_owners(namespace, tool, owner, now, since))
    }
    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.pass(Verb::KeepToolFacts, move || self.inner().keep_tool_facts(namespace, tool, facts, now))
    }
    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        self.pass(Verb::ToolFacts, move || self.inner().tool_facts(namespace, tool))
    }
    fn default_secret(&self) -> Result<Secret, SecretError> {
        self.inner().default_secret()
    }
}
