//! An in-memory ledger: for tests and single-process tools that may forget on restart.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, RecordView,
    Resolution, State, StatusReport, Token, Verdict, Won, settled_expiry, won_stale,
};
use crate::clock::Clock;
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::recipe::StalePolicy;

/// The model check of the ledger protocol: it runs this ledger, so it lives beside its records.
#[cfg(test)]
#[path = "model.rs"]
mod model;

#[derive(Clone, Debug)]
struct Record {
    tenant: TenantTag,
    subject: SubjectTag,
    fingerprint: [u8; 32],
    arg_tags: Vec<[u8; 4]>,
    state: State,
    token: Token,
    attempt: Won,
    created_at: u64,
    window_end: u64,
    expires_at: u64,
    lease_until: u64,
    result: Option<Vec<u8>>,
    /// The sealed label, kept while unsettled.
    label: Option<Vec<u8>>,
}

impl Record {
    fn view(&self) -> RecordView<'_> {
        RecordView {
            state: self.state,
            token: self.token,
            attempt: self.attempt,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            fingerprint: &self.fingerprint,
            arg_tags: &self.arg_tags,
            result: self.result.as_deref(),
        }
    }

    fn claimed(request: &ClaimRequest) -> Self {
        Self {
            tenant: request.tenant,
            subject: request.subject,
            fingerprint: request.fingerprint,
            arg_tags: request.arg_tags.clone(),
            state: State::InProgress,
            token: request.token,
            attempt: Won::Fresh,
            created_at: request.now,
            window_end: request.window_end,
            expires_at: request.expires_at,
            lease_until: request.lease_until,
            result: None,
            label: request.label.clone(),
        }
    }

    fn report(&self, key: &Key, now: u64, superseded: bool) -> StatusReport {
        StatusReport {
            key: *key,
            reference: key.reference(),
            state: self.state,
            created_at: self.created_at,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_expired: self.view().lease_expired(now),
            result: self.result.clone(),
            superseded,
            label: self.label.clone(),
        }
    }

    /// Settles the record as `state` with `result`.
    fn settle(&mut self, state: State, result: Option<Vec<u8>>, keep_until: u64) {
        self.expires_at = settled_expiry(state, self.window_end, self.expires_at, keep_until);
        self.state = state;
        self.result = result;
    }

    /// Whether a lookup by `tenant` (and `subject`, if given) may see it.
    fn visible(&self, tenant: TenantTag, subject: Option<SubjectTag>) -> bool {
        self.tenant == tenant
            && subject.is_none_or(|subject| self.subject == SubjectTag::TENANT || self.subject == subject)
    }

    /// Unknown, or in progress under a lapsed lease: what an operator may resolve.
    fn resolvable(&self, now: u64) -> bool {
        self.view().resolvable(now)
    }
}

#[derive(Debug, Default)]
struct Records {
    /// By key, hashed by its first bytes (a key is a keyed MAC: nobody can choose one to collide).
    /// Looked up by ref (a prefix) only on the status and operator paths, by a scan.
    current: HashMap<Key, Record, BuildHasherDefault<KeyHasher>>,
    /// Unsettled records a newer operation superseded after their window, by key and window end.
    superseded: BTreeMap<(Key, u64), Record>,
    /// The check value of each secret version seen.
    checks: HashMap<u32, [u8; 32]>,
    /// When each handler was last seen serving each tool: (namespace, tool) → owner → time.
    owners: HashMap<(String, String), std::collections::BTreeMap<String, u64>>,
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
    clock: Option<Arc<dyn Clock>>,
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
        Self { records: Mutex::default(), clock: Some(Arc::new(clock)) }
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

    fn claim_now(&self, request: &ClaimRequest) -> Claim {
        let mut records = self.lock();
        let Records { current, superseded, .. } = &mut *records;
        let Some(record) = current.get_mut(&request.key) else {
            current.insert(request.key, Record::claimed(request));
            return Claim::Won { attempt: Won::Fresh, window_end: request.window_end };
        };
        match record.view().judge(request) {
            Verdict::Fresh => {
                *record = Record::claimed(request);
                Claim::Won { attempt: Won::Fresh, window_end: request.window_end }
            }
            Verdict::Supersede => {
                let old = std::mem::replace(record, Record::claimed(request));
                superseded.insert((request.key, old.window_end), old);
                Claim::Won { attempt: Won::Fresh, window_end: request.window_end }
            }
            Verdict::Stale(StalePolicy::Hold) => {
                record.state = State::Unknown;
                Claim::Unknown
            }
            Verdict::Stale(policy) => {
                record.token = request.token;
                record.attempt = won_stale(policy);
                record.lease_until = request.lease_until;
                Claim::Won { attempt: record.attempt, window_end: record.window_end }
            }
            Verdict::Answer(claim) => claim,
        }
    }

    /// The current record of `tenant` whose key starts with `reference` (that `subject` may
    /// see, if given); of two (a ref is 64 bits: never, in practice), the lower key.
    fn find(
        current: &mut HashMap<Key, Record, BuildHasherDefault<KeyHasher>>,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
    ) -> Option<(&Key, &mut Record)> {
        current
            .iter_mut()
            .filter(|(key, record)| reference.matches(key) && record.visible(tenant, subject))
            .min_by_key(|(key, _)| **key)
    }

    /// The operation of `tenant` at `address` — the current record of its key if its window
    /// ends there (and it is not expired at `now`), else the superseded one that does — with
    /// its key and whether it was superseded.
    fn at<'r>(
        current: &'r mut HashMap<Key, Record, BuildHasherDefault<KeyHasher>>,
        superseded: &'r mut BTreeMap<(Key, u64), Record>,
        tenant: TenantTag,
        address: Address,
        now: u64,
    ) -> Option<(Key, &'r mut Record, bool)> {
        let current = Self::find(current, tenant, None, address.reference)
            .filter(|(_, record)| record.window_end == address.window_end && !record.view().expired(now));
        if let Some((key, record)) = current {
            return Some((*key, record, false));
        }
        superseded
            .range_mut((Key::from_bytes(low(address.reference)), 0)..)
            .take_while(|((key, _), _)| address.reference.matches(key))
            .find(|((_, window_end), record)| *window_end == address.window_end && record.visible(tenant, None))
            .map(|((key, _), record)| (*key, record, true))
    }

    /// The newest superseded record of `tenant` whose key starts with `reference` (that
    /// `subject` may see, if given).
    fn find_superseded(
        superseded: &mut BTreeMap<(Key, u64), Record>,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
    ) -> Option<(&(Key, u64), &mut Record)> {
        superseded
            .range_mut((Key::from_bytes(low(reference)), 0)..)
            .take_while(|((key, _), _)| reference.matches(key))
            .filter(|(_, record)| record.visible(tenant, subject))
            .last()
    }
}

/// Hashes a [`Key`] by its first eight bytes: a key is already a uniform MAC output.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]` hashes as its length, then its bytes: only the bytes are mixed in.
        let mut word = [0u8; 8];
        let take = bytes.len().min(8);
        word[..take].copy_from_slice(&bytes[..take]);
        self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
    }

    fn write_usize(&mut self, _length: usize) {}
}

/// The highest key starting with `reference`: a page that ended at `reference` goes on after it.
fn high_of(reference: Ref) -> [u8; 32] {
    let mut high = [0xff; 32];
    high[..reference.as_bytes().len()].copy_from_slice(reference.as_bytes());
    high
}

fn low(reference: Ref) -> [u8; 32] {
    let mut low = [0u8; 32];
    low[..reference.as_bytes().len()].copy_from_slice(reference.as_bytes());
    low
}

impl Ledger for MemoryLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        let claim = self.claim_now(request);
        Box::pin(async move { Ok(claim) })
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = match self.lock().current.get_mut(key) {
            Some(record) if record.token == token && record.state == State::InProgress => {
                record.lease_until = record.lease_until.max(lease_until);
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        };
        Box::pin(async move { result })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let mut records = self.lock();
        let Records { current, superseded, .. } = &mut *records;
        let holds =
            |record: &Record| record.token == token && matches!(record.state, State::InProgress | State::Unknown);
        let state = outcome.state();
        let result = match outcome {
            Outcome::Completed(bytes) => Some(bytes),
            Outcome::Failed | Outcome::Unknown => None,
        };
        let record = match current.get_mut(key) {
            Some(record) if holds(record) => Some(record),
            _ => superseded.range_mut((*key, 0)..=(*key, u64::MAX)).map(|(_, record)| record).find(|r| holds(r)),
        };
        let answer = match record {
            Some(record) => {
                record.settle(state, result, keep_until);
                // Settled: nobody needs to be told whose it was any more.
                if state != State::Unknown {
                    record.label = None;
                }
                Ok(())
            }
            None => Err(LedgerError::Fenced),
        };
        Box::pin(async move { answer })
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        let mut records = self.lock();
        let result = match records.current.get_mut(key) {
            // A fresh claim is removed: nothing ran, and nothing is left that reads as an
            // outcome — also once `hold` turned its lapsed lease "unknown", which only its own
            // unrun handler could have been.
            Some(record)
                if record.token == token
                    && record.attempt == Won::Fresh
                    && record.state != State::Completed
                    && record.state != State::Failed =>
            {
                records.current.remove(key);
                Ok(())
            }
            Some(record) if record.token == token && record.state == State::InProgress => {
                record.lease_until = 0;
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        };
        Box::pin(async move { result })
    }

    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let report = self
            .lock()
            .current
            .get(key)
            .filter(|record| !record.view().expired(now))
            .map(|record| record.report(key, now, false));
        Box::pin(async move { Ok(report) })
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let mut records = self.lock();
        let Records { current, superseded, .. } = &mut *records;
        let subject = Some(subject);
        let current = Self::find(current, tenant, subject, reference).filter(|(_, record)| !record.view().expired(now));
        let report = match current {
            Some((key, record)) => Some(record.report(key, now, false)),
            None => Self::find_superseded(superseded, tenant, subject, reference)
                .map(|((key, _), r)| r.report(key, now, true)),
        };
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
        let Records { current, superseded, .. } = &mut *records;
        let report = match window_end {
            Some(window_end) => {
                let address = Address { reference, window_end };
                Self::at(current, superseded, tenant, address, now)
                    .map(|(key, record, superseded)| record.report(&key, now, superseded))
            }
            None => {
                let current =
                    Self::find(current, tenant, None, reference).filter(|(_, record)| !record.view().expired(now));
                match current {
                    Some((key, record)) => Some(record.report(key, now, false)),
                    None => Self::find_superseded(superseded, tenant, None, reference)
                        .map(|((key, _), r)| r.report(key, now, true)),
                }
            }
        };
        Box::pin(async move { Ok(report) })
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        let records = self.lock();
        let current = records.current.iter().map(|(key, record)| (key, record, false));
        let superseded = records.superseded.iter().map(|((key, _), record)| (key, record, true));
        let mut found: Vec<PendingRecord> = current
            .chain(superseded)
            .filter(|(key, record, _)| {
                query.wants(record.state)
                    && record.expires_at > now
                    && (query.tenants.is_empty() || query.tenants.contains(&record.tenant))
                    && record.created_at <= query.claimed_by
                    && query.after.is_none_or(|(at, after)| {
                        record.created_at > at || record.created_at == at && key.as_bytes()[..] > high_of(after)[..]
                    })
            })
            .map(|(key, record, superseded)| PendingRecord {
                key: *key,
                reference: key.reference(),
                tenant: record.tenant,
                state: record.state,
                created_at: record.created_at,
                window_end: record.window_end,
                expires_at: record.expires_at,
                lease_until: record.lease_until,
                superseded,
                label: record.label.clone(),
            })
            .collect();
        drop(records);
        found.sort_by(|a, b| (a.created_at, a.reference.as_bytes()).cmp(&(b.created_at, b.reference.as_bytes())));
        found.truncate(query.limit);
        Box::pin(async move { Ok(found) })
    }

    fn local(&self) -> bool {
        true
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        let records = self.lock();
        let mut stats = LedgerStats::default();
        let mut oldest = |record: &Record| {
            if record.state == State::Unknown {
                stats.oldest_unknown =
                    Some(stats.oldest_unknown.map_or(record.created_at, |o| o.min(record.created_at)));
            }
        };
        for record in records.current.values().chain(records.superseded.values()) {
            oldest(record);
        }
        for record in records.current.values() {
            match record.state {
                State::InProgress => stats.in_progress += 1,
                State::Completed => stats.completed += 1,
                State::Failed => stats.failed += 1,
                State::Unknown => stats.unknown += 1,
            }
            stats.stale += u64::from(record.view().lease_expired(now));
            stats.sweepable += u64::from(record.view().sweepable(now));
        }
        for record in records.superseded.values() {
            stats.superseded += 1;
            stats.superseded_unknown += u64::from(record.state == State::Unknown);
            stats.sweepable += u64::from(record.view().sweepable(now));
        }
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
        let mut records = self.lock();
        let Records { current, superseded, .. } = &mut *records;
        let result = match (Self::at(current, superseded, tenant, address, now), resolution) {
            (None, _) => Err(LedgerError::NotFound),
            (Some((_, record, _)), Resolution::Replace { unreadable, result }) => {
                if record.state == State::Completed && record.result.as_deref() == Some(&unreadable[..]) {
                    record.result = Some(result);
                    record.expires_at = record.expires_at.max(keep_until);
                    Ok(())
                } else {
                    Err(LedgerError::NotResolvable { state: record.state })
                }
            }
            (Some((_, record, _)), _) if !record.resolvable(now) => {
                Err(LedgerError::NotResolvable { state: record.state })
            }
            (Some((_, record, _)), Resolution::Completed(bytes)) => {
                record.settle(State::Completed, Some(bytes), keep_until);
                Ok(())
            }
            (Some((_, record, _)), Resolution::NothingHappened) => {
                record.settle(State::Failed, None, keep_until);
                Ok(())
            }
        };
        Box::pin(async move { result })
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        let mut records = self.lock();
        let doomed: Vec<Key> = records
            .current
            .iter()
            .filter(|(_, record)| record.view().sweepable(now))
            .map(|(key, _)| *key)
            .take(limit)
            .collect();
        for key in &doomed {
            records.current.remove(key);
        }
        let room = limit - doomed.len();
        let old: Vec<(Key, u64)> = records
            .superseded
            .iter()
            .filter(|(_, record)| record.view().sweepable(now))
            .map(|(id, _)| *id)
            .take(room)
            .collect();
        for id in &old {
            records.superseded.remove(id);
        }
        let swept = doomed.len() + old.len();
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
        let mut records = self.lock();
        let kept = match check {
            Some(check) => Some(*records.checks.entry(version).or_insert(*check)),
            None => records.checks.get(&version).copied(),
        };
        Box::pin(async move { Ok(kept) })
    }

    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        let mut records = self.lock();
        let owners = records.owners.entry((namespace.to_owned(), tool.to_owned())).or_default();
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
        let mut records = self.lock();
        let kept =
            records.facts.entry((namespace.to_owned(), tool.to_owned())).or_insert_with(|| (now, facts.to_owned()));
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
        let records = self.lock();
        let facts = records.facts.get(&(namespace.to_owned(), tool.to_owned())).map(|(_, facts)| facts.clone());
        Box::pin(async move { Ok(facts) })
    }

    /// A random secret per process: the records die with it.
    fn default_secret(&self) -> Result<crate::secret::Secret, crate::secret::SecretError> {
        Ok(crate::secret::ephemeral())
    }
}
