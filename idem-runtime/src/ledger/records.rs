//! A set of records and every ledger operation on it, as plain in-process code: the memory
//! ledger keeps all its records in one such set behind a mutex; the Redis ledger loads the set
//! of one reference (every record under one hash tag), runs the same operation on it, and
//! writes back what changed in one compare-and-set. The rules themselves are `judge.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::{
    Claim, ClaimRequest, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, RecordView, Resolution, State,
    StatusReport, Token, Verdict, Won, settled_expiry, won_stale,
};
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::recipe::StalePolicy;

/// One stored record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) tenant: TenantTag,
    pub(crate) subject: SubjectTag,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) arg_tags: Vec<[u8; 4]>,
    pub(crate) state: State,
    pub(crate) token: Token,
    pub(crate) attempt: Won,
    pub(crate) created_at: u64,
    pub(crate) window_end: u64,
    pub(crate) expires_at: u64,
    pub(crate) lease_until: u64,
    pub(crate) result: Option<Vec<u8>>,
    /// The sealed label, kept while unsettled.
    pub(crate) label: Option<Vec<u8>>,
}

impl Record {
    pub(crate) fn view(&self) -> RecordView<'_> {
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

    /// The latest time anything may still need this record: its expiry, or its holder's lease
    /// if that runs longer. A backend that deletes records by itself (Redis's TTLs) keeps each
    /// at least this long.
    #[cfg(feature = "redis")]
    pub(crate) fn needed_until(&self) -> u64 {
        if self.state == State::InProgress { self.expires_at.max(self.lease_until) } else { self.expires_at }
    }
}

/// The current records by key (hashed by its first bytes), and the superseded ones.
pub(crate) type Current = HashMap<Key, Record, BuildHasherDefault<KeyHasher>>;

/// Records, and the ledger operations on them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Records {
    /// By key, hashed by its first bytes (a key is a keyed MAC: nobody can choose one to collide).
    /// Looked up by ref (a prefix) only on the status and operator paths, by a scan.
    pub(crate) current: Current,
    /// Unsettled records a newer operation superseded after their window, by key and window end.
    pub(crate) superseded: BTreeMap<(Key, u64), Record>,
}

impl Records {
    /// Every record, current then superseded, with whether it was superseded.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&Key, &Record, bool)> {
        let current = self.current.iter().map(|(key, record)| (key, record, false));
        current.chain(self.superseded.iter().map(|((key, _), record)| (key, record, true)))
    }

    /// See [`Ledger::claim`](super::Ledger::claim).
    pub(crate) fn claim(&mut self, request: &ClaimRequest) -> Claim {
        let Self { current, superseded } = self;
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

    /// See [`Ledger::renew`](super::Ledger::renew).
    pub(crate) fn renew(&mut self, key: &Key, token: Token, lease_until: u64) -> Result<(), LedgerError> {
        match self.current.get_mut(key) {
            Some(record) if record.token == token && record.state == State::InProgress => {
                record.lease_until = record.lease_until.max(lease_until);
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        }
    }

    /// See [`Ledger::complete`](super::Ledger::complete).
    pub(crate) fn complete(
        &mut self,
        key: &Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        let Self { current, superseded } = self;
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
        let record = record.ok_or(LedgerError::Fenced)?;
        record.settle(state, result, keep_until);
        // Settled: nobody needs to be told whose it was any more.
        if state != State::Unknown {
            record.label = None;
        }
        Ok(())
    }

    /// Whether a record of `key` — current, or superseded — already holds what
    /// [`Records::complete`] would write for `token` and a settled `outcome` (completed or
    /// failed): the completion was sent before, took effect, and its answer was lost. (A ledger
    /// whose writes are not durable when they are answered, Redis waiting for its replicas, must
    /// recognise it and wait again.) A token is one claim's, so no other holder's completion
    /// looks the same; an operator's verdict on the claim keeps its token, but also its label,
    /// which a holder's settled completion clears — so an identical verdict is not taken for it
    /// (on a ledger that keeps labels, for a claim sent with one).
    #[cfg(feature = "redis")]
    pub(crate) fn settled_as(&self, key: &Key, token: Token, outcome: &Outcome) -> bool {
        let result = match outcome {
            Outcome::Completed(bytes) => Some(bytes),
            Outcome::Failed | Outcome::Unknown => None,
        };
        let same = |record: &Record| {
            record.token == token
                && record.state == outcome.state()
                && record.result.as_ref() == result
                && record.label.is_none()
        };
        self.current.get(key).is_some_and(same)
            || self.superseded.range((*key, 0)..=(*key, u64::MAX)).any(|(_, record)| same(record))
    }

    /// See [`Ledger::release`](super::Ledger::release).
    pub(crate) fn release(&mut self, key: &Key, token: Token) -> Result<(), LedgerError> {
        match self.current.get_mut(key) {
            // A fresh claim is removed: nothing ran, and nothing is left that reads as an
            // outcome — also once `hold` turned its lapsed lease "unknown", which only its own
            // unrun handler could have been.
            Some(record)
                if record.token == token
                    && record.attempt == Won::Fresh
                    && record.state != State::Completed
                    && record.state != State::Failed =>
            {
                self.current.remove(key);
                Ok(())
            }
            Some(record) if record.token == token && record.state == State::InProgress => {
                record.lease_until = 0;
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        }
    }

    /// See [`Ledger::lookup`](super::Ledger::lookup).
    pub(crate) fn lookup(&self, key: &Key, now: u64) -> Option<StatusReport> {
        self.current.get(key).filter(|record| !record.view().expired(now)).map(|record| record.report(key, now, false))
    }

    /// See [`Ledger::status`](super::Ledger::status) (`subject` given) and
    /// [`Ledger::inspect`](super::Ledger::inspect) without a window end (`subject` `None`).
    pub(crate) fn status(
        &mut self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
        now: u64,
    ) -> Option<StatusReport> {
        let Self { current, superseded } = self;
        let current = Self::find(current, tenant, subject, reference).filter(|(_, record)| !record.view().expired(now));
        match current {
            Some((key, record)) => Some(record.report(key, now, false)),
            None => Self::find_superseded(superseded, tenant, subject, reference)
                .map(|((key, _), r)| r.report(key, now, true)),
        }
    }

    /// See [`Ledger::inspect`](super::Ledger::inspect) with a window end.
    pub(crate) fn inspect_at(&mut self, tenant: TenantTag, address: Address, now: u64) -> Option<StatusReport> {
        let Self { current, superseded } = self;
        Self::at(current, superseded, tenant, address, now)
            .map(|(key, record, superseded)| record.report(&key, now, superseded))
    }

    /// See [`Ledger::resolve`](super::Ledger::resolve).
    pub(crate) fn resolve(
        &mut self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        let Self { current, superseded } = self;
        match (Self::at(current, superseded, tenant, address, now), resolution) {
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
        }
    }

    /// The records `query` asks for as of `now`, oldest first, at most `query.limit`: see
    /// [`Ledger::pending`](super::Ledger::pending).
    pub(crate) fn pending(&self, query: &PendingQuery, now: u64) -> Vec<PendingRecord> {
        let mut found: Vec<PendingRecord> = self
            .all()
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
        oldest_first(&mut found, query.limit);
        found
    }

    /// Adds these records to `stats`, as of `now`: see [`Ledger::stats`](super::Ledger::stats).
    pub(crate) fn count(&self, now: u64, stats: &mut LedgerStats) {
        for (_, record, superseded) in self.all() {
            if record.state == State::Unknown {
                stats.oldest_unknown =
                    Some(stats.oldest_unknown.map_or(record.created_at, |o| o.min(record.created_at)));
            }
            stats.sweepable += u64::from(record.view().sweepable(now));
            if superseded {
                stats.superseded += 1;
                stats.superseded_unknown += u64::from(record.state == State::Unknown);
                continue;
            }
            match record.state {
                State::InProgress => stats.in_progress += 1,
                State::Completed => stats.completed += 1,
                State::Failed => stats.failed += 1,
                State::Unknown => stats.unknown += 1,
            }
            stats.stale += u64::from(record.view().lease_expired(now));
        }
    }

    /// Deletes at most `limit` records the sweep may delete at `now`; returns how many.
    pub(crate) fn sweep(&mut self, now: u64, limit: usize) -> usize {
        let doomed: Vec<Key> = self
            .current
            .iter()
            .filter(|(_, record)| record.view().sweepable(now))
            .map(|(key, _)| *key)
            .take(limit)
            .collect();
        for key in &doomed {
            self.current.remove(key);
        }
        let room = limit - doomed.len();
        let old: Vec<(Key, u64)> = self
            .superseded
            .iter()
            .filter(|(_, record)| record.view().sweepable(now))
            .map(|(id, _)| *id)
            .take(room)
            .collect();
        for id in &old {
            self.superseded.remove(id);
        }
        doomed.len() + old.len()
    }

    /// The latest time any record here may still be needed ([`Record::needed_until`]).
    #[cfg(feature = "redis")]
    pub(crate) fn needed_until(&self) -> u64 {
        self.all().map(|(_, record, _)| record.needed_until()).max().unwrap_or(0)
    }

    /// The current record of `tenant` whose key starts with `reference` (that `subject` may
    /// see, if given); of two (a ref is 64 bits: never, in practice), the lower key.
    fn find(
        current: &mut Current,
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
        current: &'r mut Current,
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

/// Orders pending records oldest first (by creation, then key), drops copies of one record, and
/// keeps the first `limit`.
pub(crate) fn oldest_first(found: &mut Vec<PendingRecord>, limit: usize) {
    found.sort_by(|a, b| {
        (a.created_at, a.key.as_bytes(), a.window_end).cmp(&(b.created_at, b.key.as_bytes(), b.window_end))
    });
    // A scan may return a record twice (Redis's `SCAN` while it rehashes): the copies are now
    // side by side.
    found.dedup();
    found.truncate(limit);
}

/// Hashes a [`Key`] by its first eight bytes: a key is already a uniform MAC output.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A record a scan met twice (Redis's `SCAN` while it rehashes) is listed once; two records
    /// of one key (a current and a superseded one) both stay.
    #[test]
    fn oldest_first_lists_each_record_once() {
        let record = |key: u8, created_at: u64, window_end: u64| PendingRecord {
            key: Key::from_bytes([key; 32]),
            reference: Key::from_bytes([key; 32]).reference(),
            tenant: TenantTag::from_bytes([1; 8]),
            state: State::InProgress,
            created_at,
            window_end,
            expires_at: window_end + 10,
            lease_until: created_at + 5,
            superseded: false,
            label: None,
        };
        let mut found = vec![record(2, 5, 50), record(1, 9, 90), record(2, 5, 40), record(2, 5, 50), record(3, 1, 10)];
        oldest_first(&mut found, 10);
        let listed: Vec<(u64, u64)> = found.iter().map(|record| (record.created_at, record.window_end)).collect();
        assert_eq!(listed, [(1, 10), (5, 40), (5, 50), (9, 90)]);
        oldest_first(&mut found, 2);
        assert_eq!(found.len(), 2);
    }
}
