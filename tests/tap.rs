//! A ledger that forwards every call to another, through a test's [`Tap`]: what the waiting,
//! sweeping and fencing tests and the benchmark count, fail or hang, written once.

use std::sync::Arc;

use idem_runtime::ledger::{
    BoxFuture, Claim, ClaimRequest, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution, StatusReport, Token,
};
use idem_runtime::{
    Key, Ref, key::Address, ledger::Ledger, ledger::LedgerError, scope::SubjectTag, scope::TenantTag, secret::Secret,
    secret::SecretError,
};

/// Which ledger method a [`Tap`] sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
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
    /// [`Ledger::secret_check`] and [`Ledger::secret_versions`]
    SecretCheck,
    /// [`Ledger::tool_owners`]
    ToolOwners,
    /// [`Ledger::keep_tool_facts`] and [`Ledger::tool_facts`]
    ToolFacts,
}

/// What a [`Tap`] does with one call.
pub enum Pass {
    /// To the ledger beneath.
    Through,
    /// Refused with this error; the ledger beneath never sees it.
    Fail(LedgerError),
    /// Never answered (a paused replica, a cut connection).
    Hang,
    /// To the ledger beneath after this pause (a slow statement).
    After(std::time::Duration),
    /// To the ledger beneath, whose answer is then lost: the call fails with this error although
    /// the statement took effect (a connection cut after the commit).
    Lost(LedgerError),
}

/// A test's view of the calls a handle makes to its ledger.
pub trait Tap: Send + Sync + 'static {
    /// Before the call is made (when the method is called, as a ledger's own work starts).
    fn before(&self, _call: Call) -> Pass {
        Pass::Through
    }

    /// Once the ledger beneath has answered a call that went through.
    fn after(&self, _call: Call) {}

    /// Milliseconds added to the time [`Ledger::now`] answers (a server with another clock: a
    /// standby promoted in a failover).
    fn clock_shift(&self) -> i64 {
        0
    }
}

/// `inner`, every call through `tap`; everything else (`local`, `keeps_labels`, the default
/// secret) is `inner`'s. Dereferences to the tap, for its counters.
pub struct Tapped<T> {
    /// The ledger beneath.
    pub inner: Arc<dyn Ledger>,
    /// What the test sees and decides.
    pub tap: T,
}

impl<T: Tap> Tapped<T> {
    /// `inner` through `tap`.
    pub fn new(inner: Arc<dyn Ledger>, tap: T) -> Arc<Self> {
        Arc::new(Self { inner, tap })
    }

    fn gate<'a, R: Send + 'a>(
        &'a self,
        call: Call,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>> {
        match self.tap.before(call) {
            Pass::Through => {
                let answer = send();
                Box::pin(async move {
                    let answer = answer.await;
                    self.tap.after(call);
                    answer
                })
            }
            Pass::Fail(error) => Box::pin(async move { Err(error) }),
            Pass::Hang => Box::pin(std::future::pending()),
            Pass::After(pause) => Box::pin(async move {
                tokio::time::sleep(pause).await;
                let answer = send().await;
                self.tap.after(call);
                answer
            }),
            Pass::Lost(error) => Box::pin(async move {
                let _ = send().await;
                self.tap.after(call);
                Err(error)
            }),
        }
    }
}

impl<T> std::ops::Deref for Tapped<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.tap
    }
}

impl<T: Tap> Ledger for Tapped<T> {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        self.gate(Call::Claim, move || self.inner.claim(request))
    }
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.gate(Call::Renew, move || self.inner.renew(key, token, lease_until))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.gate(Call::Complete, move || self.inner.complete(key, token, outcome, keep_until))
    }
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.gate(Call::Release, move || self.inner.release(key, token))
    }
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.gate(Call::Lookup, move || self.inner.lookup(key, now))
    }
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.gate(Call::Status, move || self.inner.status(tenant, subject, reference, now))
    }
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        self.gate(Call::Inspect, move || self.inner.inspect(tenant, reference, window_end, now))
    }
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.gate(Call::Resolve, move || self.inner.resolve(tenant, address, resolution, now, keep_until))
    }
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        self.gate(Call::Stats, move || self.inner.stats(now))
    }
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        self.gate(Call::Pending, move || self.inner.pending(query, now))
    }
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        self.gate(Call::Sweep, move || self.inner.sweep(now, limit))
    }
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        let shifted = self.gate(Call::Now, move || self.inner.now());
        Box::pin(async move {
            let now = shifted.await?;
            Ok(now.map(|now| now.saturating_add_signed(self.tap.clock_shift())))
        })
    }
    fn keeps_labels(&self) -> bool {
        self.inner.keeps_labels()
    }
    fn local(&self) -> bool {
        self.inner.local()
    }
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        self.gate(Call::SecretCheck, move || self.inner.secret_check(version, check))
    }
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        self.gate(Call::SecretCheck, move || self.inner.secret_versions(live))
    }
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        self.gate(Call::ToolOwners, move || self.inner.tool_owners(namespace, tool, owner, now, since))
    }
    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.gate(Call::ToolFacts, move || self.inner.keep_tool_facts(namespace, tool, facts, now))
    }
    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        self.gate(Call::ToolFacts, move || self.inner.tool_facts(namespace, tool))
    }
    fn default_secret(&self) -> Result<Secret, SecretError> {
        self.inner.default_secret()
    }
}
