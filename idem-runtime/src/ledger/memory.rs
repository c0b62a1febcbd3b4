//! An in-memory ledger: for tests and single-process tools that may forget on restart.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, Outcome, RecordView, Resolution, State, StatusReport, Token,
    Verdict, Won, won_stale,
};
use crate::key::{Key, Ref, TenantTag};
use crate::recipe::StalePolicy;

#[derive(Clone, Debug)]
struct Record {
    tenant: TenantTag,
    fingerprint: [u8; 32],
    arg_tags: Vec<[u8; 4]>,
    state: State,
    token: Token,
    created_at: u64,
    expires_at: u64,
    lease_until: u64,
    result: Option<Vec<u8>>,
}

impl Record {
    fn view(&self) -> RecordView<'_> {
        RecordView {
            state: self.state,
            token: self.token,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            fingerprint: &self.fingerprint,
            arg_tags: &self.arg_tags,
            result: self.result.as_deref(),
        }
    }

    /// Past its window, and not protected by a live lease.
    fn expired(&self, now: u64) -> bool {
        self.view().expired(now)
    }

    fn live_lease(&self, now: u64) -> bool {
        self.state == State::InProgress && self.lease_until > now
    }

    fn claimed(request: &ClaimRequest) -> Self {
        Self {
            tenant: request.tenant,
            fingerprint: request.fingerprint,
            arg_tags: request.arg_tags.clone(),
            state: State::InProgress,
            token: request.token,
            created_at: request.now,
            expires_at: request.expires_at,
            lease_until: request.lease_until,
            result: None,
        }
    }
}

/// A [`Ledger`] in a mutex-guarded ordered map.
///
/// The claim decides and writes under one lock, which is what makes it atomic. Everything is lost
/// when the process exits: use a durable ledger wherever a restart can be followed by a repeat.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    records: Mutex<BTreeMap<Key, Record>>,
}

impl MemoryLedger {
    /// An empty ledger.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records are held, expired or not.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Key, Record>> {
        // A panic while holding the lock cannot leave a record half-written: every update below
        // assigns whole fields after all fallible work is done.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn claim_now(&self, request: &ClaimRequest) -> Claim {
        let mut records = self.lock();
        let Some(record) = records.get_mut(&request.key) else {
            records.insert(request.key, Record::claimed(request));
            return Claim::Won(Won::Fresh);
        };
        match record.view().judge(request) {
            Verdict::Fresh => {
                *record = Record::claimed(request);
                Claim::Won(Won::Fresh)
            }
            Verdict::Stale(StalePolicy::Hold) => {
                record.state = State::Unknown;
                Claim::Unknown
            }
            Verdict::Stale(policy) => {
                record.token = request.token;
                record.lease_until = request.lease_until;
                Claim::Won(won_stale(policy))
            }
            Verdict::Answer(claim) => claim,
        }
    }

    fn find(records: &mut BTreeMap<Key, Record>, tenant: TenantTag, reference: Ref) -> Option<(&Key, &mut Record)> {
        let mut low = [0u8; 32];
        low[..reference.as_bytes().len()].copy_from_slice(reference.as_bytes());
        records
            .range_mut(Key::from_bytes(low)..)
            .take_while(|(key, _)| reference.matches(key))
            .find(|(_, record)| record.tenant == tenant)
    }
}

impl Ledger for MemoryLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        let claim = self.claim_now(request);
        Box::pin(async move { Ok(claim) })
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = match self.lock().get_mut(key) {
            Some(record) if record.token == token && record.state == State::InProgress => {
                record.lease_until = record.lease_until.max(lease_until);
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        };
        Box::pin(async move { result })
    }

    fn complete<'a>(&'a self, key: &'a Key, token: Token, outcome: Outcome) -> BoxFuture<'a, Result<(), LedgerError>> {
        let result = match self.lock().get_mut(key) {
            Some(record) if record.token == token && record.state == State::InProgress => {
                let (state, result) = match outcome {
                    Outcome::Completed(bytes) => (State::Completed, Some(bytes)),
                    Outcome::Failed => (State::Failed, None),
                    Outcome::Unknown => (State::Unknown, None),
                };
                record.state = state;
                record.result = result;
                Ok(())
            }
            _ => Err(LedgerError::Fenced),
        };
        Box::pin(async move { result })
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let mut records = self.lock();
        let report = Self::find(&mut records, tenant, reference).filter(|(_, record)| !record.expired(now)).map(
            |(key, record)| StatusReport {
                reference: key.reference(),
                state: record.state,
                created_at: record.created_at,
                expires_at: record.expires_at,
                lease_expired: record.state == State::InProgress && record.lease_until <= now,
                result: record.result.clone(),
            },
        );
        Box::pin(async move { Ok(report) })
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let mut records = self.lock();
        let result = match Self::find(&mut records, tenant, reference) {
            None => Err(LedgerError::NotFound),
            Some((_, record)) if record.expired(now) => Err(LedgerError::NotFound),
            Some((_, record))
                if record.state == State::Unknown || !record.live_lease(now) && record.state == State::InProgress =>
            {
                match resolution {
                    Resolution::Completed(bytes) => {
                        record.state = State::Completed;
                        record.result = Some(bytes);
                    }
                    Resolution::NothingHappened => record.state = State::Failed,
                }
                Ok(())
            }
            Some((_, record)) => Err(LedgerError::NotResolvable { state: record.state }),
        };
        Box::pin(async move { result })
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        let mut records = self.lock();
        let doomed: Vec<Key> =
            records.iter().filter(|(_, record)| record.expired(now)).map(|(key, _)| *key).take(limit).collect();
        for key in &doomed {
            records.remove(key);
        }
        let swept = doomed.len();
        Box::pin(async move { Ok(swept) })
    }
}
