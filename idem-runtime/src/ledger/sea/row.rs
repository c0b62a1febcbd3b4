//! Between records and SQL values: how a claim and a status lookup decode the columns they
//! select, and how the ledger's types are bound as parameters (times as milliseconds, tags and
//! tokens as signed 64-bit integers, argument tags packed 4 bytes each).

use sea_orm::{QueryResult, Value};

use super::error::corrupt;
use crate::key::{Key, REF_HEX_LEN, Ref, SubjectTag, TenantTag};
use crate::ledger::{ClaimRequest, LedgerError, PendingRecord, RecordView, State, StatusReport, Token, Won};

/// A record as a claim reads it: the columns `state, token, attempt, created_at, window_end,
/// expires_at, lease_until, fingerprint, arg_tags, result`, in this order.
pub(super) struct Row {
    pub(super) state: State,
    pub(super) token: Token,
    pub(super) attempt: Won,
    pub(super) created_at: u64,
    pub(super) window_end: u64,
    pub(super) expires_at: u64,
    pub(super) lease_until: u64,
    pub(super) fingerprint: Vec<u8>,
    pub(super) arg_tags: Vec<[u8; 4]>,
    pub(super) result: Option<Vec<u8>>,
}

impl Row {
    /// Reads the columns from the `first`-th on.
    pub(super) fn read(row: &QueryResult, first: usize) -> Result<Self, LedgerError> {
        let int = |at: usize| row.try_get_by_index::<i64>(first + at).map_err(corrupt).map(to_u64);
        Ok(Self {
            state: state_of(row.try_get_by_index::<i16>(first).map_err(corrupt)?)?,
            token: Token(int(1)?),
            attempt: attempt_of(row.try_get_by_index::<i16>(first + 2).map_err(corrupt)?)?,
            created_at: int(3)?,
            window_end: int(4)?,
            expires_at: int(5)?,
            lease_until: int(6)?,
            fingerprint: row.try_get_by_index::<Vec<u8>>(first + 7).map_err(corrupt)?,
            arg_tags: tags_of(&row.try_get_by_index::<Vec<u8>>(first + 8).map_err(corrupt)?),
            result: row.try_get_by_index::<Option<Vec<u8>>>(first + 9).map_err(corrupt)?,
        })
    }

    pub(super) fn view(&self) -> RecordView<'_> {
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
}

/// A record as a status lookup reads it: the columns `key, state, created_at, window_end,
/// expires_at, lease_until, result`, in this order.
pub(super) struct Found {
    pub(super) key: Key,
    pub(super) state: State,
    pub(super) created_at: u64,
    pub(super) window_end: u64,
    pub(super) expires_at: u64,
    pub(super) lease_until: u64,
    pub(super) result: Option<Vec<u8>>,
    pub(super) label: Option<Vec<u8>>,
}

impl Found {
    pub(super) fn read(row: &QueryResult) -> Result<Self, LedgerError> {
        let key: Vec<u8> = row.try_get_by_index(0).map_err(corrupt)?;
        let key: [u8; 32] = key.try_into().map_err(|_| LedgerError::corrupt("a key is not 32 bytes"))?;
        let int = |at: usize| row.try_get_by_index::<i64>(at).map_err(corrupt).map(to_u64);
        Ok(Self {
            key: Key::from_bytes(key),
            state: state_of(row.try_get_by_index::<i16>(1).map_err(corrupt)?)?,
            created_at: int(2)?,
            window_end: int(3)?,
            expires_at: int(4)?,
            lease_until: int(5)?,
            result: row.try_get_by_index::<Option<Vec<u8>>>(6).map_err(corrupt)?,
            label: row.try_get_by_index::<Option<Vec<u8>>>(7).map_err(corrupt)?.filter(|label| !label.is_empty()),
        })
    }

    pub(super) fn view(&self) -> RecordView<'_> {
        RecordView {
            state: self.state,
            token: Token(0),
            attempt: Won::Fresh,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_until: self.lease_until,
            fingerprint: &[],
            arg_tags: &[],
            result: self.result.as_deref(),
        }
    }

    pub(super) fn resolvable(&self, now: u64) -> bool {
        self.view().resolvable(now)
    }

    pub(super) fn report(self, now: u64, superseded: bool) -> StatusReport {
        StatusReport {
            key: self.key,
            reference: self.key.reference(),
            state: self.state,
            created_at: self.created_at,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_expired: self.view().lease_expired(now),
            result: self.result,
            superseded,
            label: self.label,
        }
    }
}

/// The values of a claim's INSERT, in the order of [`super::Statements::claim`]'s parameters.
pub(super) fn insert_values(request: &ClaimRequest) -> Vec<Value> {
    vec![
        key_value(&request.key),
        tenant_value(request.tenant),
        token_value(request.token),
        millis(request.now),
        millis(request.window_end),
        millis(request.expires_at),
        millis(request.lease_until),
        Value::Bytes(Some(request.fingerprint.to_vec())),
        Value::Bytes(Some(tags_bytes(&request.arg_tags))),
        subject_value(request.subject),
        bytes_opt(request.label.clone()),
    ]
}

/// The values of a status read ([`super::statements::Visible`]): keys starting with
/// `reference`, of `tenant`, and — when a subject is given — the subject's own or tenant-wide
/// (0).
pub(super) fn visible_values(tenant: TenantTag, subject: Option<SubjectTag>, reference: Ref) -> Vec<Value> {
    let (low, high) = ref_range(reference);
    let mut values = vec![Value::Bytes(Some(low)), Value::Bytes(Some(high)), tenant_value(tenant)];
    if let Some(subject) = subject {
        values.extend([subject_value(SubjectTag::TENANT), subject_value(subject)]);
    }
    values
}

fn ref_range(reference: Ref) -> (Vec<u8>, Vec<u8>) {
    let mut low = reference.as_bytes().to_vec();
    let mut high = low.clone();
    low.resize(32, 0x00);
    high.resize(32, 0xff);
    debug_assert_eq!(reference.as_bytes().len(), REF_HEX_LEN / 2);
    (low, high)
}

/// A row of the `pending` statement: key, tenant, state, created, window end, expiry, lease,
/// label, and whether it came from the superseded table.
pub(super) fn pending(row: &QueryResult) -> Result<PendingRecord, LedgerError> {
    let key: Vec<u8> = row.try_get_by_index(0).map_err(corrupt)?;
    let key: [u8; 32] = key.try_into().map_err(|_| LedgerError::corrupt("a key is not 32 bytes"))?;
    let int = |at: usize| row.try_get_by_index::<i64>(at).map_err(corrupt);
    Ok(PendingRecord {
        key: Key::from_bytes(key),
        reference: Key::from_bytes(key).reference(),
        tenant: TenantTag::from_bytes(int(1)?.to_be_bytes()),
        state: state_of(row.try_get_by_index::<i16>(2).map_err(corrupt)?)?,
        created_at: to_u64(int(3)?),
        window_end: to_u64(int(4)?),
        expires_at: to_u64(int(5)?),
        lease_until: to_u64(int(6)?),
        // Emptied once settled (a superseded record settled by its late holder).
        label: row.try_get_by_index::<Option<Vec<u8>>>(7).map_err(corrupt)?.filter(|label| !label.is_empty()),
        superseded: int(8)? != 0,
    })
}

pub(super) fn state_of(code: i16) -> Result<State, LedgerError> {
    State::from_code(code).ok_or_else(|| LedgerError::corrupt(format!("unknown record state {code}")))
}

fn attempt_of(code: i16) -> Result<Won, LedgerError> {
    Won::from_code(code).ok_or_else(|| LedgerError::corrupt(format!("unknown claim attempt {code}")))
}

pub(super) fn state_value(state: State) -> Value {
    Value::SmallInt(Some(state.code()))
}

pub(super) fn attempt_value(attempt: Won) -> Value {
    Value::SmallInt(Some(attempt.code()))
}

pub(super) fn key_value(key: &Key) -> Value {
    Value::Bytes(Some(key.as_bytes().to_vec()))
}

pub(super) fn tenant_value(tenant: TenantTag) -> Value {
    Value::BigInt(Some(i64::from_be_bytes(*tenant.as_bytes())))
}

pub(super) fn subject_value(subject: SubjectTag) -> Value {
    Value::BigInt(Some(i64::from_be_bytes(*subject.as_bytes())))
}

pub(super) fn token_value(token: Token) -> Value {
    Value::BigInt(Some(i64::try_from(token.0).unwrap_or(i64::MAX)))
}

pub(super) fn bytes_opt(bytes: Option<Vec<u8>>) -> Value {
    Value::Bytes(bytes)
}

pub(super) fn millis(ms: u64) -> Value {
    Value::BigInt(Some(i64::try_from(ms).unwrap_or(i64::MAX)))
}

pub(super) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(super) fn tags_bytes(tags: &[[u8; 4]]) -> Vec<u8> {
    tags.concat()
}

fn tags_of(bytes: &[u8]) -> Vec<[u8; 4]> {
    bytes.chunks_exact(4).map(|chunk| [chunk[0], chunk[1], chunk[2], chunk[3]]).collect()
}
