//! How one reference's records are kept in Redis: one hash per reference under the hash tag
//! `{<ref>}` — so every record a claim, a status lookup or an operator's verdict may touch is in
//! one slot, and one script sees them all — with a field per record (`c:<key>` for the current
//! record of a key, `s:<key>:<window end>` for a superseded one) and a field `v`, a random
//! version replaced on every write, which the compare-and-set checks.

use crate::bytes::{hex, unhex};
use crate::key::{Key, Ref, SubjectTag, TenantTag};
use crate::ledger::records::{Record, Records};
use crate::ledger::{LedgerError, State, Token, Won};

/// The first byte of every stored record: the layout below. A record of a layout this build does
/// not know is refused as corrupt, never guessed at.
const LAYOUT: u8 = 1;

/// The hash field holding the version.
pub(super) const VERSION: &[u8] = b"v";

/// The Redis key of the hash holding `reference`'s records.
pub(super) fn bundle_key(prefix: &str, reference: Ref) -> String {
    format!("{prefix}:r:{{{reference}}}")
}

/// The field of the current record of `key`.
pub(super) fn current_field(key: &Key) -> Vec<u8> {
    format!("c:{}", hex(key.as_bytes())).into_bytes()
}

/// The field of the record of `key` superseded with window end `window_end`.
fn superseded_field(key: &Key, window_end: u64) -> Vec<u8> {
    format!("s:{}:{window_end}", hex(key.as_bytes())).into_bytes()
}

/// One reference's records as stored, and the version they were read at (`None`: no hash).
#[derive(Debug, Default)]
pub(super) struct Bundle {
    pub(super) version: Option<Vec<u8>>,
    pub(super) records: Records,
}

impl Bundle {
    /// Reads the field–value pairs of a hash.
    pub(super) fn decode(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Self, LedgerError> {
        let mut bundle = Self::default();
        for (field, value) in pairs {
            if field == VERSION {
                bundle.version = Some(value);
                continue;
            }
            let text = std::str::from_utf8(&field).map_err(|_| bad("a field name"))?;
            let record = decode(&value)?;
            match text.split(':').collect::<Vec<_>>()[..] {
                ["c", key] => {
                    bundle.records.current.insert(key_of(key)?, record);
                }
                ["s", key, window_end] => {
                    let window_end = window_end.parse().map_err(|_| bad("a superseded field"))?;
                    bundle.records.superseded.insert((key_of(key)?, window_end), record);
                }
                _ => return Err(bad("a field name")),
            }
        }
        Ok(bundle)
    }
}

/// The fields a write sets, with their values.
pub(super) type Sets = Vec<(Vec<u8>, Vec<u8>)>;

/// What turns `old` into `new`: the fields to set (with their values) and the fields to delete.
pub(super) fn diff(old: &Records, new: &Records) -> (Sets, Vec<Vec<u8>>) {
    let mut set = Vec::new();
    let mut delete = Vec::new();
    for (key, record) in &new.current {
        if old.current.get(key) != Some(record) {
            set.push((current_field(key), encode(record)));
        }
    }
    for key in old.current.keys().filter(|key| !new.current.contains_key(*key)) {
        delete.push(current_field(key));
    }
    for ((key, window_end), record) in &new.superseded {
        if old.superseded.get(&(*key, *window_end)) != Some(record) {
            set.push((superseded_field(key, *window_end), encode(record)));
        }
    }
    for (key, window_end) in old.superseded.keys().filter(|id| !new.superseded.contains_key(*id)) {
        delete.push(superseded_field(key, *window_end));
    }
    (set, delete)
}

/// A record's bytes: the layout byte, state and attempt, token, the four times, tenant,
/// subject, fingerprint, the argument tags (a count, then four bytes each), then the result and
/// the label (each a presence byte, a length and the bytes). Integers big-endian.
pub(super) fn encode(record: &Record) -> Vec<u8> {
    let extra = record.result.as_ref().map_or(0, Vec::len) + record.label.as_ref().map_or(0, Vec::len);
    let mut out = Vec::with_capacity(100 + 4 * record.arg_tags.len() + extra);
    out.push(LAYOUT);
    out.push(u8::try_from(record.state.code()).unwrap_or(0));
    out.push(u8::try_from(record.attempt.code()).unwrap_or(0));
    out.extend_from_slice(&record.token.get().to_be_bytes());
    for time in [record.created_at, record.window_end, record.expires_at, record.lease_until] {
        out.extend_from_slice(&time.to_be_bytes());
    }
    out.extend_from_slice(record.tenant.as_bytes());
    out.extend_from_slice(record.subject.as_bytes());
    out.extend_from_slice(&record.fingerprint);
    // A tool has far fewer than 2^32 arguments; the count is what was stored.
    out.extend_from_slice(&u32::try_from(record.arg_tags.len()).unwrap_or(u32::MAX).to_be_bytes());
    for tag in &record.arg_tags {
        out.extend_from_slice(tag);
    }
    for part in [&record.result, &record.label] {
        match part {
            Some(bytes) => {
                out.push(1);
                out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
                out.extend_from_slice(bytes);
            }
            None => out.push(0),
        }
    }
    out
}

/// Reads what [`encode`] wrote.
pub(super) fn decode(bytes: &[u8]) -> Result<Record, LedgerError> {
    let mut input = Reader(bytes);
    if input.take::<1>()? != [LAYOUT] {
        return Err(bad("a record of an unknown layout (written by a newer idem?)"));
    }
    let state = State::from_code(i16::from(input.take::<1>()?[0])).ok_or_else(|| bad("a state"))?;
    let attempt = Won::from_code(i16::from(input.take::<1>()?[0])).ok_or_else(|| bad("an attempt"))?;
    let token = Token::from_raw(input.u64()?);
    let (created_at, window_end, expires_at, lease_until) = (input.u64()?, input.u64()?, input.u64()?, input.u64()?);
    let tenant = TenantTag::from_bytes(input.take()?);
    let subject = SubjectTag::from_bytes(input.take()?);
    let fingerprint = input.take()?;
    let count = input.u32()?;
    let mut arg_tags = Vec::new();
    for _ in 0..count {
        arg_tags.push(input.take()?);
    }
    let result = input.part()?;
    let label = input.part()?;
    if !input.0.is_empty() {
        return Err(bad("a record with bytes after its end"));
    }
    Ok(Record {
        tenant,
        subject,
        fingerprint,
        arg_tags,
        state,
        token,
        attempt,
        created_at,
        window_end,
        expires_at,
        lease_until,
        result,
        label,
    })
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], LedgerError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or_else(|| bad("a record cut short"))?;
        self.0 = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, LedgerError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn u32(&mut self) -> Result<u32, LedgerError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn part(&mut self) -> Result<Option<Vec<u8>>, LedgerError> {
        if self.take::<1>()?[0] == 0 {
            return Ok(None);
        }
        let len = usize::try_from(self.u32()?).map_err(|_| bad("a length"))?;
        if self.0.len() < len {
            return Err(bad("a record cut short"));
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(Some(bytes.to_vec()))
    }
}

fn key_of(text: &str) -> Result<Key, LedgerError> {
    unhex::<32>(text).map(Key::from_bytes).ok_or_else(|| bad("a key in a field name"))
}

fn bad(what: &str) -> LedgerError {
    LedgerError::corrupt(format!("the Redis ledger holds {what} this build cannot read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(result: Option<Vec<u8>>, label: Option<Vec<u8>>) -> Record {
        Record {
            tenant: TenantTag::from_bytes([1; 8]),
            subject: SubjectTag::from_bytes([2; 8]),
            fingerprint: [3; 32],
            arg_tags: vec![[4; 4], [5; 4]],
            state: State::Completed,
            token: Token::from_raw(6),
            attempt: Won::Takeover,
            created_at: 7,
            window_end: 8,
            expires_at: 9,
            lease_until: 10,
            result,
            label,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        for (result, label) in [(None, None), (Some(b"r".to_vec()), None), (Some(Vec::new()), Some(b"l".to_vec()))] {
            let record = record(result, label);
            assert_eq!(decode(&encode(&record)).unwrap(), record);
        }
    }

    #[test]
    fn a_cut_or_foreign_record_is_refused() {
        let bytes = encode(&record(Some(b"result".to_vec()), None));
        for end in 0..bytes.len() {
            assert!(decode(&bytes[..end]).is_err(), "cut at {end}");
        }
        let mut newer = bytes.clone();
        newer[0] = 2;
        assert!(decode(&newer).is_err());
        let mut longer = bytes;
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
