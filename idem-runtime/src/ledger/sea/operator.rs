//! What a SQL ledger answers beyond a call's claim, renewal and completion: an operation's status
//! for its caller, the operator's reads (`inspect`, `pending`, `stats`) and verdicts, the secrets'
//! check values, the handlers that own each tool, and the sweep.

use sea_orm::{ConnectionTrait, Statement, Value};

use super::error::{corrupt, failed, is_deadlock};
use super::row::{Found, bytes_opt, key_value, millis, state_value, tenant_value, to_u64, visible_values};
use crate::key::{Address, Ref, SubjectTag, TenantTag};
use crate::ledger::{
    LedgerError, LedgerStats, PendingQuery, PendingRecord, Resolution, State, StatusReport, settled_expiry,
};

use super::{SeaOrmLedger, ToolOwner, row, visible_to};

/// How many times a sweep statement chosen as a deadlock's victim runs again before its error is
/// the sweep's.
const SWEEP_DEADLOCK_RETRIES: u32 = 4;

impl SeaOrmLedger {
    pub(super) async fn status_now(
        &self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
        now: u64,
    ) -> Result<Option<StatusReport>, LedgerError> {
        if let Some(found) = self.find(tenant, subject, reference, now).await? {
            return Ok(Some(found.report(now, false)));
        }
        Ok(self.find_superseded(tenant, subject, reference).await?.map(|found| found.report(now, true)))
    }

    /// The unexpired current record of `tenant` whose key starts with `reference` (that
    /// `subject` may see, if given).
    pub(super) async fn find(
        &self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
        now: u64,
    ) -> Result<Option<Found>, LedgerError> {
        let mut values = visible_values(tenant, subject, reference);
        values.push(millis(now));
        self.found(visible_to(&self.statements().find, subject), values).await
    }

    /// The newest superseded record of `tenant` whose key starts with `reference` (that
    /// `subject` may see, if given).
    pub(super) async fn find_superseded(
        &self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
    ) -> Result<Option<Found>, LedgerError> {
        let values = visible_values(tenant, subject, reference);
        self.found(visible_to(&self.statements().find_superseded, subject), values).await
    }

    /// The one record `text` (a status read) selects, if any.
    pub(super) async fn found(&self, text: &str, values: Vec<Value>) -> Result<Option<Found>, LedgerError> {
        let statement = Statement::from_sql_and_values(self.backend(), text, values);
        let row = self.db.query_one_raw(statement).await.map_err(failed)?;
        row.map(|row| Found::read(&row)).transpose()
    }

    /// The operation of `tenant` at `address`: the current record of its key if its window ends
    /// there (and it is visible at `now`), else the superseded one that does — and whether it
    /// was superseded.
    pub(super) async fn at(
        &self,
        tenant: TenantTag,
        address: Address,
        now: u64,
    ) -> Result<Option<(Found, bool)>, LedgerError> {
        let current = self.find(tenant, None, address.reference, now).await?;
        if let Some(found) = current.filter(|found| found.window_end == address.window_end) {
            return Ok(Some((found, false)));
        }
        let mut values = visible_values(tenant, None, address.reference);
        values.push(millis(address.window_end));
        Ok(self.found(self.statements().find_superseded_at, values).await?.map(|found| (found, true)))
    }

    pub(super) async fn inspect_now(
        &self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> Result<Option<StatusReport>, LedgerError> {
        match window_end {
            Some(window_end) => {
                let found = self.at(tenant, Address { reference, window_end }, now).await?;
                Ok(found.map(|(found, superseded)| found.report(now, superseded)))
            }
            None => self.status_now(tenant, None, reference, now).await,
        }
    }

    pub(super) async fn resolve_now(
        &self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        let resolve = &self.statements().resolve;
        let Some((found, superseded)) = self.at(tenant, address, now).await? else { return Err(LedgerError::NotFound) };
        let (state, result) = match resolution {
            Resolution::Completed(bytes) => (State::Completed, Some(bytes)),
            Resolution::NothingHappened => (State::Failed, None),
            Resolution::Replace { unreadable, result } => {
                return self.replace_now(tenant, (found, superseded), &unreadable, result, keep_until).await;
            }
        };
        if !found.resolvable(now) {
            return Err(LedgerError::NotResolvable { state: found.state });
        }
        let text = if superseded { resolve.superseded } else { resolve.records };
        let expires_at = settled_expiry(state, found.window_end, found.expires_at, keep_until);
        let values = vec![
            state_value(state),
            bytes_opt(result),
            millis(expires_at),
            key_value(&found.key),
            millis(found.window_end),
            tenant_value(tenant),
            millis(now),
        ];
        let statement = Statement::from_sql_and_values(self.backend(), text, values);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // It changed meanwhile (its holder finished, another operator answered).
        match self.at(tenant, address, now).await? {
            Some((found, _)) => Err(LedgerError::NotResolvable { state: found.state }),
            None => Err(LedgerError::NotFound),
        }
    }

    pub(super) async fn secret_check_now(
        &self,
        version: u32,
        check: Option<&[u8; 32]>,
    ) -> Result<Option<[u8; 32]>, LedgerError> {
        let version = Value::BigInt(Some(i64::from(version)));
        if let Some(check) = check {
            let values = vec![version.clone(), Value::Bytes(Some(check.to_vec()))];
            let keep = Statement::from_sql_and_values(self.backend(), self.statements().keep_check, values);
            self.db.execute_raw(keep).await.map_err(failed)?;
        }
        let read = Statement::from_sql_and_values(self.backend(), self.statements().check_of, vec![version]);
        let Some(row) = self.db.query_one_raw(read).await.map_err(failed)? else { return Ok(None) };
        let kept = row.try_get_by_index::<Vec<u8>>(0).map_err(corrupt)?;
        kept.try_into().map(Some).map_err(|_| LedgerError::corrupt("a secret's check value is not 32 bytes"))
    }

    pub(super) async fn secret_versions_now(&self, live: Option<(u32, u64)>) -> Result<Vec<(u32, u64)>, LedgerError> {
        if let Some((version, until)) = live {
            self.keep_live(version, until).await?;
        }
        let read = Statement::from_string(self.backend(), self.statements().secret_versions);
        let rows = self.db.query_all_raw(read).await.map_err(failed)?;
        rows.iter()
            .map(|row| {
                let version = row.try_get_by_index::<i64>(0).map_err(corrupt)?;
                let until = row.try_get_by_index::<i64>(1).map_err(corrupt)?;
                let version =
                    u32::try_from(version).map_err(|_| LedgerError::corrupt("a secret version is out of range"))?;
                Ok((version, u64::try_from(until).unwrap_or(0)))
            })
            .collect()
    }

    /// Keeps that operations keyed under secret `version` may be repeated until `until`, unless
    /// a later time is kept.
    pub(super) async fn keep_live(&self, version: u32, until: u64) -> Result<(), LedgerError> {
        let values = vec![millis(until), millis(until), Value::BigInt(Some(i64::from(version)))];
        let keep = Statement::from_sql_and_values(self.backend(), self.statements().keep_live, values);
        self.db.execute_raw(keep).await.map_err(failed)?;
        Ok(())
    }

    /// Every handler recorded as serving a tool, with when it was last seen (`idem tools`).
    ///
    /// # Errors
    /// The database failed.
    pub async fn tool_owners_all(&self) -> Result<Vec<ToolOwner>, LedgerError> {
        let read = Statement::from_string(self.backend(), self.statements().all_owners);
        let rows = self.db.query_all_raw(read).await.map_err(failed)?;
        rows.iter()
            .map(|row| {
                Ok(ToolOwner {
                    namespace: row.try_get_by_index(0).map_err(corrupt)?,
                    tool: row.try_get_by_index(1).map_err(corrupt)?,
                    owner: row.try_get_by_index(2).map_err(corrupt)?,
                    seen_at: u64::try_from(row.try_get_by_index::<i64>(3).map_err(corrupt)?).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Forgets every handler recorded as serving `tool` in `namespace`, returning how many
    /// (`idem tools forget`): after a handler was moved or renamed in code, so its new name is
    /// not refused as a second handler. A server still running it records it again.
    ///
    /// # Errors
    /// The database failed.
    pub async fn forget_tool_owners(&self, namespace: &str, tool: &str) -> Result<u64, LedgerError> {
        let text = |text: &str| Value::String(Some(text.to_owned()));
        let values = vec![text(namespace), text(tool)];
        let forget = Statement::from_sql_and_values(self.backend(), self.statements().forget_owners, values);
        Ok(self.db.execute_raw(forget).await.map_err(failed)?.rows_affected())
    }

    /// [`Resolution::Replace`]: the completed record's result, if it is still `unreadable`.
    async fn replace_now(
        &self,
        tenant: TenantTag,
        (found, superseded): (Found, bool),
        unreadable: &[u8],
        result: Vec<u8>,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        if found.state != State::Completed || found.result.as_deref() != Some(unreadable) {
            return Err(LedgerError::NotResolvable { state: found.state });
        }
        let replace = &self.statements().replace;
        let text = if superseded { replace.superseded } else { replace.records };
        let values = vec![
            Value::Bytes(Some(result)),
            millis(keep_until),
            key_value(&found.key),
            millis(found.window_end),
            tenant_value(tenant),
            Value::Bytes(Some(unreadable.to_vec())),
        ];
        let statement = Statement::from_sql_and_values(self.backend(), text, values);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        // Nothing replaced: another operator corrected it first.
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::NotResolvable { state: State::Completed }) }
    }

    pub(super) async fn keep_tool_facts_now(
        &self,
        namespace: &str,
        tool: &str,
        facts: &str,
        now: u64,
    ) -> Result<(), LedgerError> {
        let text = |text: &str| Value::String(Some(text.to_owned()));
        let values = vec![text(namespace), text(tool), text(facts), millis(now)];
        let statement = Statement::from_sql_and_values(self.backend(), self.statements().keep_facts, values);
        self.db.execute_raw(statement).await.map_err(failed).map(drop)
    }

    pub(super) async fn tool_facts_now(&self, namespace: &str, tool: &str) -> Result<Option<String>, LedgerError> {
        let text = |text: &str| Value::String(Some(text.to_owned()));
        let values = vec![text(namespace), text(tool)];
        let read = Statement::from_sql_and_values(self.backend(), self.statements().facts_of, values);
        let row = self.db.query_one_raw(read).await.map_err(failed)?;
        row.map(|row| row.try_get_by_index::<String>(0).map_err(corrupt)).transpose()
    }

    pub(super) async fn tool_owners_now(
        &self,
        namespace: &str,
        tool: &str,
        owner: &str,
        now: u64,
        since: u64,
    ) -> Result<Vec<String>, LedgerError> {
        let text = |text: &str| Value::String(Some(text.to_owned()));
        let values = vec![text(namespace), text(tool), text(owner), millis(now)];
        let keep = Statement::from_sql_and_values(self.backend(), self.statements().keep_owner, values);
        self.db.execute_raw(keep).await.map_err(failed)?;
        let values = vec![text(namespace), text(tool), millis(since)];
        let read = Statement::from_sql_and_values(self.backend(), self.statements().owners_of, values);
        let rows = self.db.query_all_raw(read).await.map_err(failed)?;
        rows.iter().map(|row| row.try_get_by_index::<String>(0).map_err(corrupt)).collect()
    }

    pub(super) async fn sweep_now(&self, now: u64, limit: usize) -> Result<usize, LedgerError> {
        let sweep = &self.statements().sweep;
        let mut swept = 0;
        for text in [sweep.records, sweep.superseded] {
            let room = limit.saturating_sub(swept);
            if room == 0 {
                break;
            }
            swept += self.sweep_table(text, now, room).await?;
        }
        if swept > 0 {
            tracing::debug!(swept, "swept expired records");
        }
        Ok(swept)
    }

    pub(super) async fn sweep_table(&self, text: &str, now: u64, limit: usize) -> Result<usize, LedgerError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut values = vec![millis(now), millis(now), millis(now), Value::BigInt(Some(limit))];
        if self.statements().sweep_rechecks {
            values.extend([millis(now), millis(now), millis(now)]);
        }
        // MariaDB's `DELETE … ORDER BY … LIMIT` cannot skip locked rows: two replicas' sweeps (or a
        // sweep and a claim) that lock rows in different orders can deadlock, and InnoDB rolls one
        // statement back. That is no failure of the ledger: the rolled-back statement deleted
        // nothing and runs again after a short random pause (a few times; then the error is the
        // sweep's). `it::sweeper::mysql_sweep_chosen_as_a_deadlock_victim_runs_again` makes one.
        let mut attempts = 0;
        loop {
            let statement = Statement::from_sql_and_values(self.backend(), text, values.clone());
            match self.db.execute_raw(statement).await {
                Ok(done) => return Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX)),
                Err(error) if is_deadlock(&error) && attempts < SWEEP_DEADLOCK_RETRIES => {
                    attempts += 1;
                    tracing::info!(%error, attempts, "a sweep was a deadlock's victim; it runs again");
                    let pause = crate::bytes::try_random().map_or(5, |[byte]: [u8; 1]| 1 + u64::from(byte % 20));
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                Err(error) => return Err(failed(error)),
            }
        }
    }

    pub(super) async fn stats_now(&self, now: u64) -> Result<LedgerStats, LedgerError> {
        let texts = &self.statements().stats;
        let mut stats = LedgerStats::default();
        for (text, superseded) in [(texts.records, false), (texts.superseded, true)] {
            let values = vec![millis(now), millis(now), millis(now)];
            let statement = Statement::from_sql_and_values(self.backend(), text, values);
            for row in self.db.query_all_raw(statement).await.map_err(failed)? {
                let int = |at: usize| row.try_get_by_index::<i64>(at).map_err(corrupt).map(to_u64);
                let state = row::state_of(row.try_get_by_index::<i16>(0).map_err(corrupt)?)?;
                let (count, oldest, sweepable, stale) = (int(1)?, int(2)?, int(3)?, int(4)?);
                stats.sweepable += sweepable;
                if state == State::Unknown {
                    stats.oldest_unknown = Some(stats.oldest_unknown.map_or(oldest, |known| known.min(oldest)));
                }
                if superseded {
                    stats.superseded += count;
                    stats.superseded_unknown += if state == State::Unknown { count } else { 0 };
                    continue;
                }
                stats.stale += stale;
                match state {
                    State::InProgress => stats.in_progress += count,
                    State::Completed => stats.completed += count,
                    State::Failed => stats.failed += count,
                    State::Unknown => stats.unknown += count,
                }
            }
        }
        let statement = Statement::from_string(self.backend(), self.statements().size);
        let size = self.db.query_one_raw(statement).await.map_err(failed)?;
        stats.size_bytes = size.map(|row| row.try_get_by_index::<i64>(0).map_err(corrupt).map(to_u64)).transpose()?;
        Ok(stats)
    }

    pub(super) async fn pending_now(&self, query: &PendingQuery, now: u64) -> Result<Vec<PendingRecord>, LedgerError> {
        let (low, high) = match query.state {
            Some(state) => (state, state),
            None => (State::InProgress, State::Unknown),
        };
        if !query.wants(low) || !query.wants(high) {
            return Ok(Vec::new());
        }
        let every = i64::from(query.tenants.is_empty());
        // Two tenant slots: the tenant under the current secret and the previous one.
        let tenant = |at: usize| {
            let tag = query.tenants.get(at).or_else(|| query.tenants.first());
            tag.map_or(Value::BigInt(Some(0)), |tag| tenant_value(*tag))
        };
        let (after_at, after_key) = query.after.map_or((-1, Vec::new()), |(at, reference)| {
            let mut high = [0xff; 32];
            high[..reference.as_bytes().len()].copy_from_slice(reference.as_bytes());
            (i64::try_from(at).unwrap_or(i64::MAX), high.to_vec())
        });
        let mut values = Vec::with_capacity(21);
        for _table in 0..2 {
            values.extend([
                state_value(low),
                state_value(high),
                millis(now),
                Value::BigInt(Some(every)),
                tenant(0),
                tenant(1),
                millis(query.claimed_by),
                Value::BigInt(Some(after_at)),
                Value::BigInt(Some(after_at)),
                Value::Bytes(Some(after_key.clone())),
            ]);
        }
        values.push(Value::BigInt(Some(i64::try_from(query.limit).unwrap_or(i64::MAX))));
        let statement = Statement::from_sql_and_values(self.backend(), self.statements().pending, values);
        let rows = self.db.query_all_raw(statement).await.map_err(failed)?;
        rows.iter().map(row::pending).collect()
    }
}
