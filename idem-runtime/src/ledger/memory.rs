//! An in-memory ledger: for tests and single-process tools that may forget on restart.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

#[cfg(test)]
use super::records::Record;
use super::records::Records;
use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    StatusReport, Token,
};
use crate::clock::Clock;
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};

/// The model check of the ledger protocol: it runs this ledger, so it lives beside its records.
#[cfg(test)]
#[path = "model/mod.rs"]
mod model;

/// What the ledger keeps beside its records.
#[derive(Debug, Default)]
struct Extras {
    /// The check value of each secret version seen.
    checks: HashMap<u32, [u8; 32]>,
    /// Until when operations keyed under each secret version may be repeated.
    live: BTreeMap<u32, u64>,
    /// When each handler was last seen serving each tool: (namespace, tool) → owner → time.
    owners: HashMap<(String, String), BTreeMap<String, u64>>,
    /// Each tool's facts and when they were written: (namespace, tool) → (time, facts).
    facts: HashMap<(String, String), (u64, String)>,
}

/// A [`Ledger`] in a mutex-guarded ordered map.
///
/// The claim decides and writes under one lock, which is what makes it atomic. Everything is lost
/// when the process exits: use a durable ledger wherever a restart can be followed by a repeat.
#[derive(Default)]
pub struct MemoryLedger {
    records: Mutex<Records>,
    extras: Mutex<Extras>,
    clock: Option<Arc<dyn Clock>>,
    /// Who serves what over this ledger in this process.
    catalogue: super::Catalogue,
}

impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger").field("records", &self.len()).finish_non_exhaustive()
    }
}

impl MemoryLedger {
    /// An empty ledger with no clock of its own: every handle sharing it is taken to share the
    /// process's clock.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty ledger that keeps `clock` as its own, the way a database server has one: handles
    /// sharing it measure their skew against it (tests of replicas with skewed clocks).
    #[must_use]
    pub fn with_clock(clock: impl Clock) -> Self {
        Self { clock: Some(Arc::new(clock)), ..Self::default() }
    }

    /// How many records are held (current and superseded), expired or not.
    #[must_use]
    pub fn len(&self) -> usize {
        let records = self.lock();
        records.current.len() + records.superseded.len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave a record half-written: every update below
        // assigns whole fields after all fallible work is done.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn extras(&self) -> MutexGuard<'_, Extras> {
        self.extras.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ledger for MemoryLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        let claim = self.lock().claim(request);
        Box::pin(async move { Ok(claim) })
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = self.lock().renew(key, token, lease_until);
        Box::pin(async move { result })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = self.lock().complete(key, token, outcome, keep_until);
        Box::pin(async move { result })
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = self.lock().release(key, token);
        Box::pin(async move { result })
    }

    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let report = self.lock().lookup(key, now);
        Box::pin(async move { Ok(report) })
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let report = self.lock().status(tenant, Some(subject), reference, now);
        Box::pin(async move { Ok(report) })
    }

    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let mut records = self.lock();
        let report = match window_end {
            Some(window_end) => records.inspect_at(tenant, Address { reference, window_end }, now),
            None => records.status(tenant, None, reference, now),
        };
        Box::pin(async move { Ok(report) })
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        let found = self.lock().pending(query, now);
        Box::pin(async move { Ok(found) })
    }

    fn local(&self) -> bool {
        true
    }

    /// Kept, as the durable ledgers keep them: an operator's verdict on an operation is checked
    /// against its tool's result shape, which only the label names.
    fn keeps_labels(&self) -> bool {
        true
    }

    fn catalogue(&self) -> Option<&super::Catalogue> {
        Some(&self.catalogue)
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        let mut stats = LedgerStats::default();
        self.lock().count(now, &mut stats);
        Box::pin(async move { Ok(stats) })
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = self.lock().resolve(tenant, address, resolution, now, keep_until);
        Box::pin(async move { result })
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        let swept = self.lock().sweep(now, limit);
        Box::pin(async move { Ok(swept) })
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        let now = self.clock.as_ref().map(|clock| clock.now_ms());
        Box::pin(async move { Ok(now) })
    }

    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        let mut extras = self.extras();
        let kept = match check {
            Some(check) => Some(*extras.checks.entry(version).or_insert(*check)),
            None => extras.checks.get(&version).copied(),
        };
        Box::pin(async move { Ok(kept) })
    }

    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        let mut extras = self.extras();
        if let Some((version, until)) = live
            && extras.checks.contains_key(&version)
        {
            let kept = extras.live.entry(version).or_insert(until);
            *kept = (*kept).max(until);
        }
        let versions = extras.checks.keys().map(|version| (*version, extras.live.get(version).copied().unwrap_or(0)));
        let mut versions: Vec<_> = versions.collect();
        versions.sort_unstable();
        Box::pin(async move { Ok(versions) })
    }

    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        let mut extras = self.extras();
        let owners = extras.owners.entry((namespace.to_owned(), tool.to_owned())).or_default();
        let seen = owners.entry(owner.to_owned()).or_insert(now);
        *seen = (*seen).max(now);
        let owners = owners.iter().filter(|(_, seen)| **seen >= since).map(|(owner, _)| owner.clone()).collect();
        Box::pin(async move { Ok(owners) })
    }

    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let mut extras = self.extras();
        let kept =
            extras.facts.entry((namespace.to_owned(), tool.to_owned())).or_insert_with(|| (now, facts.to_owned()));
        if kept.0 <= now {
            *kept = (now, facts.to_owned());
        }
        Box::pin(async { Ok(()) })
    }

    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        let extras = self.extras();
        let facts = extras.facts.get(&(namespace.to_owned(), tool.to_owned())).map(|(_, facts)| facts.clone());
        Box::pin(async move { Ok(facts) })
    }

    /// A random secret per process: the records die with it.
    fn default_secret(&self) -> Result<crate::secret::Secret, crate::secret::SecretError> {
        Ok(crate::secret::ephemeral())
    }
}
