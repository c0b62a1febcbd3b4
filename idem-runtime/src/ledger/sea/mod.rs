//! Durable ledgers through sea-orm: SQLite (the embedded default), PostgreSQL, MySQL/MariaDB.
//!
//! This file holds the ledger's logic, shared by every backend: the claim, renewal, completion
//! and release. The operator's reads and the sweep are in `operator.rs`; each backend's statement
//! text is in its own file (`sqlite.rs`, `postgres.rs`, `mysql.rs`), picked by what it does
//! ([`statements::Statements`]). The tables and how each backend claims are described in the
//! guide's "How the SQL ledgers store and claim" (`docs/src/sql-ledger.md`).

mod connect;
mod driver;
mod error;
mod location;
mod migrate;
mod mysql;
mod operator;
mod postgres;
mod row;
mod sqlite;
#[doc(hidden)]
pub mod statements;

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value};

use self::connect::OwnSecret;
use self::error::{corrupt, failed, is_duplicate};
pub use self::location::DATABASE_URL_ENV;
use self::location::Location;
pub use self::migrate::schema;
use self::row::{
    Row, attempt_value, bytes_opt, insert_values, key_value, millis, state_value, subject_value, tags_bytes,
    tenant_value, to_u64, token_value,
};
use self::statements::{Statements, Visible};
use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    State, StatusReport, Token, Verdict, Won, won_stale,
};
use crate::clock::Clock;
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::recipe::StalePolicy;

/// How many times a claim re-runs when a concurrent change slipped between its statements
/// (it backs off a little from the fourth on, so a burst of churn can settle).
const CLAIM_ATTEMPTS: u32 = 64;

/// A [`Ledger`] on a relational database through sea-orm.
#[derive(Clone)]
pub struct SeaOrmLedger {
    db: DatabaseConnection,
    /// A clock that stands in for the database server's (tests that simulate time).
    clock: Option<Arc<dyn Clock>>,
    /// Where a handle without a configured secret gets one.
    own_secret: OwnSecret,
    /// Where it is and who chose it, for the startup line and errors (never a password).
    location: Arc<Location>,
    /// Who serves what over this ledger in this process (its clones share it).
    catalogue: Arc<super::Catalogue>,
}

impl std::fmt::Debug for SeaOrmLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaOrmLedger")
            .field("backend", &self.db.get_database_backend())
            .field("location", &self.location.to_string())
            .finish_non_exhaustive()
    }
}

impl SeaOrmLedger {
    /// The connection pool.
    #[must_use]
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }
    /// States every time on `clock` instead of the database server's (tests that simulate time).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Ends a held claim on `conn` — a transaction of the handler's own, so its writes and the
    /// stored result commit (or roll back) together. See [`Ledger::complete`].
    ///
    /// # Errors
    /// [`LedgerError::Fenced`] if `token` no longer holds the claim; the database's failure.
    pub async fn complete_on<C: ConnectionTrait>(
        conn: &C,
        key: &Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        let backend = conn.get_database_backend();
        let complete = &Statements::of(backend).complete;
        let state = outcome.state();
        let result = match outcome {
            Outcome::Completed(bytes) => Some(bytes),
            Outcome::Failed | Outcome::Unknown => None,
        };
        for table in [&complete.records, &complete.superseded] {
            let text = match state {
                State::Completed => table.completed,
                State::Failed => table.failed,
                State::InProgress | State::Unknown => table.unknown,
            };
            let mut values = vec![state_value(state), bytes_opt(result.clone())];
            if state != State::Unknown {
                // Settled: the label is emptied, not nulled — a row with no null needs no null
                // bitmap (8 bytes a row on PostgreSQL), and the empty value fills alignment
                // padding before the result.
                values.push(Value::Bytes(Some(Vec::new())));
            }
            if state != State::Failed {
                values.extend([millis(keep_until), millis(keep_until)]);
            }
            values.extend([key_value(key), token_value(token)]);
            let statement = Statement::from_sql_and_values(backend, text, values);
            if conn.execute_raw(statement).await.map_err(failed)?.rows_affected() == 1 {
                return Ok(());
            }
        }
        Err(LedgerError::Fenced)
    }

    fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// This ledger's statement set.
    fn statements(&self) -> &'static Statements {
        Statements::of(self.backend())
    }

    async fn claim_now(&self, request: &ClaimRequest) -> Result<Claim, LedgerError> {
        for attempt in 0..CLAIM_ATTEMPTS {
            if attempt >= 4 {
                tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(20)))).await;
            }
            let existing = match self.backend() {
                DbBackend::Postgres => self.insert_postgres(request).await?,
                // A read first: a repeat is answered by it alone, and on SQLite it never queues
                // for the single writer's lock (WAL readers do not block the writer, nor it
                // them). Only a key the read found absent is inserted.
                backend => match self.read(&request.key).await? {
                    Some(row) => Inserted::Existing(row),
                    None if backend == DbBackend::MySql => self.insert_mysql(request).await?,
                    None => self.insert_sqlite(request).await?,
                },
            };
            let row = match existing {
                Inserted::Claimed => return Ok(Claim::Won { attempt: Won::Fresh, window_end: request.window_end }),
                Inserted::Existing(row) => row,
                // The record vanished between the insert and the read (swept): start over.
                Inserted::Gone => continue,
            };
            let verdict = row.view().judge(request);
            let taken = match verdict {
                Verdict::Answer(claim) => return Ok(claim),
                Verdict::Fresh => self.take(request, &row, &Take::Fresh).await?,
                Verdict::Supersede => self.supersede(request, &row).await?,
                Verdict::Stale(StalePolicy::Hold) => self.take(request, &row, &Take::Unknown).await?,
                Verdict::Stale(policy) => self.take(request, &row, &Take::Over(won_stale(policy))).await?,
            };
            if let Some(claim) = taken {
                return Ok(claim);
            }
            tracing::debug!(reference = %request.key.reference(), "claim raced a concurrent change; re-running");
        }
        Err(LedgerError::unavailable("the claim did not settle under concurrent changes"))
    }

    /// One statement: claim an absent key, or return the record in the way.
    async fn insert_postgres(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let claim = postgres::STATEMENTS.claim;
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, claim, insert_values(request));
        let Some(row) = self.db.query_one_raw(statement).await.map_err(failed)? else { return Ok(Inserted::Gone) };
        let claimed: i16 = row.try_get_by_index(0).map_err(corrupt)?;
        if claimed == 1 { Ok(Inserted::Claimed) } else { Ok(Inserted::Existing(Row::read(&row, 1)?)) }
    }

    /// The insert; when it does not claim, a read of the record in the way.
    async fn insert_sqlite(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let claim = sqlite::STATEMENTS.claim;
        let statement = Statement::from_sql_and_values(DbBackend::Sqlite, claim, insert_values(request));
        if self.db.query_one_raw(statement).await.map_err(failed)?.is_some() {
            return Ok(Inserted::Claimed);
        }
        Ok(self.read(&request.key).await?.map_or(Inserted::Gone, Inserted::Existing))
    }

    /// Insert to claim an absent key; on a duplicate, read.
    async fn insert_mysql(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let claim = mysql::STATEMENTS.claim;
        let statement = Statement::from_sql_and_values(DbBackend::MySql, claim, insert_values(request));
        match self.db.execute_raw(statement).await {
            Ok(_) => return Ok(Inserted::Claimed),
            Err(error) if is_duplicate(&error) => {}
            Err(error) => return Err(failed(error)),
        }
        Ok(self.read(&request.key).await?.map_or(Inserted::Gone, Inserted::Existing))
    }

    /// Takes the record `row` as read, if it is still that version; `None` if it changed.
    async fn take(&self, request: &ClaimRequest, row: &Row, take: &Take) -> Result<Option<Claim>, LedgerError> {
        let statement = take.statement(self.backend(), request, row);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        Ok((done.rows_affected() == 1).then(|| take.answer(request, row)))
    }

    /// Starts a new operation over an unsettled record past its window, keeping the old record
    /// aside for the operator — both or neither.
    async fn supersede(&self, request: &ClaimRequest, row: &Row) -> Result<Option<Claim>, LedgerError> {
        let backend = self.backend();
        // The old operation's label, for the operator: read apart, as the claim's own read
        // leaves it out (a repeat has no use for it). The compare-and-set below fails if the
        // record changed since the claim read it, so a label read meanwhile is never kept.
        let label_of =
            Statement::from_sql_and_values(backend, self.statements().label_of, vec![key_value(&request.key)]);
        let label = match self.db.query_one_raw(label_of).await.map_err(failed)? {
            Some(found) => found.try_get_by_index::<Option<Vec<u8>>>(0).map_err(corrupt)?,
            None => return Ok(None),
        };
        let txn = self.db.begin().await.map_err(failed)?;
        // The compare-and-set first: on SQLite a transaction that writes first takes the write
        // lock at once instead of failing to upgrade a read.
        let done = txn.execute_raw(Take::Fresh.statement(backend, request, row)).await.map_err(failed)?;
        if done.rows_affected() != 1 {
            txn.rollback().await.map_err(failed)?;
            return Ok(None);
        }
        let values = vec![
            key_value(&request.key),
            millis(row.window_end),
            tenant_value(request.tenant),
            state_value(row.state),
            token_value(row.token),
            attempt_value(row.attempt),
            millis(row.created_at),
            millis(row.expires_at),
            millis(row.lease_until),
            Value::Bytes(Some(row.fingerprint.clone())),
            Value::Bytes(Some(tags_bytes(&row.arg_tags))),
            bytes_opt(row.result.clone()),
            subject_value(request.subject),
            bytes_opt(label),
        ];
        let keep = Statement::from_sql_and_values(backend, Statements::of(backend).keep_superseded, values);
        txn.execute_raw(keep).await.map_err(failed)?;
        txn.commit().await.map_err(failed)?;
        tracing::warn!(reference = %request.key.reference(), "an unsettled operation past its window was superseded; \
            it is kept for the operator");
        Ok(Some(Claim::Won { attempt: Won::Fresh, window_end: request.window_end }))
    }

    async fn read(&self, key: &Key) -> Result<Option<Row>, LedgerError> {
        let statement = Statement::from_sql_and_values(self.backend(), self.statements().read, vec![key_value(key)]);
        let row = self.db.query_one_raw(statement).await.map_err(failed)?;
        row.map(|row| Row::read(&row, 0)).transpose()
    }

    async fn renew_now(&self, key: &Key, token: Token, lease_until: u64) -> Result<(), LedgerError> {
        let values = vec![millis(lease_until), millis(lease_until), key_value(key), token_value(token)];
        let statement = Statement::from_sql_and_values(self.backend(), self.statements().renew, values);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::Fenced) }
    }

    async fn release_now(&self, key: &Key, token: Token) -> Result<(), LedgerError> {
        let statements = self.statements();
        for text in [statements.withdraw, statements.release] {
            let values = vec![key_value(key), token_value(token)];
            let statement = Statement::from_sql_and_values(self.backend(), text, values);
            if self.db.execute_raw(statement).await.map_err(failed)?.rows_affected() == 1 {
                return Ok(());
            }
        }
        Err(LedgerError::Fenced)
    }

    async fn lookup_now(&self, key: &Key, now: u64) -> Result<Option<StatusReport>, LedgerError> {
        let Some(found) = self.found(self.statements().lookup, vec![key_value(key)]).await? else { return Ok(None) };
        Ok((!found.view().expired(now)).then(|| found.report(now, false)))
    }

    async fn now_ms(&self) -> Result<Option<u64>, LedgerError> {
        if let Some(clock) = &self.clock {
            return Ok(Some(clock.now_ms()));
        }
        let statement = Statement::from_string(self.backend(), self.statements().now);
        let row = self.db.query_one_raw(statement).await.map_err(failed)?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(to_u64(row.try_get_by_index::<i64>(0).map_err(corrupt)?)))
    }
}

// Which backend's statements: here, above the three backends and the shapes they fill in, so
// `statements.rs` names no backend and no backend names another.
impl Statements {
    /// The statements of `backend`.
    #[must_use]
    pub fn of(backend: DbBackend) -> &'static Self {
        match backend {
            DbBackend::Postgres => &postgres::STATEMENTS,
            DbBackend::MySql => &mysql::STATEMENTS,
            _ => &sqlite::STATEMENTS,
        }
    }
}

impl statements::Migration {
    /// The migration of `backend`.
    pub(crate) fn of(backend: DbBackend) -> &'static Self {
        match backend {
            DbBackend::Postgres => &postgres::MIGRATION,
            DbBackend::MySql => &mysql::MIGRATION,
            _ => &sqlite::MIGRATION,
        }
    }
}

pub use crate::ledger::ToolOwner;

impl Ledger for SeaOrmLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(self.claim_now(request))
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.renew_now(key, token, lease_until))
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(Self::complete_on(&self.db, key, token, outcome, keep_until))
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.release_now(key, token))
    }

    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(self.lookup_now(key, now))
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(self.status_now(tenant, Some(subject), reference, now))
    }

    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(self.inspect_now(tenant, reference, window_end, now))
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        Box::pin(self.stats_now(now))
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        Box::pin(self.pending_now(query, now))
    }

    fn keeps_labels(&self) -> bool {
        true
    }

    fn catalogue(&self) -> Option<&super::Catalogue> {
        Some(&self.catalogue)
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.resolve_now(tenant, address, resolution, now, keep_until))
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(self.sweep_now(now, limit))
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        Box::pin(self.now_ms())
    }

    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(self.tool_owners_now(namespace, tool, owner, now, since))
    }

    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        Box::pin(self.secret_check_now(version, check))
    }

    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        Box::pin(self.secret_versions_now(live))
    }

    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.keep_tool_facts_now(namespace, tool, facts, now))
    }

    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        Box::pin(self.tool_facts_now(namespace, tool))
    }

    /// SQLite in a file: a secret generated once and kept beside the file as
    /// `<file>.secret`, readable by its owner only. SQLite in memory: a random one per process.
    /// PostgreSQL and MySQL: none — replicas share the ledger and must share a configured
    /// secret.
    fn default_secret(&self) -> Result<crate::secret::Secret, crate::secret::SecretError> {
        match &self.own_secret {
            OwnSecret::File(path) => crate::secret::Secret::load_or_create(path),
            OwnSecret::Ephemeral => Ok(crate::secret::ephemeral()),
            OwnSecret::Required(ledger) => Err(crate::secret::SecretError::Required { ledger: (*ledger).to_owned() }),
        }
    }
}

/// A status read's text for who must see the record: the subject given, or the whole tenant.
fn visible_to(texts: &Visible, subject: Option<SubjectTag>) -> &'static str {
    if subject.is_some() { texts.subject } else { texts.tenant }
}

/// What a claim's insert found.
enum Inserted {
    /// The key was absent: the insert claimed it.
    Claimed,
    /// This record stood in the way.
    Existing(Row),
    /// The record in the way vanished before it could be read.
    Gone,
}

/// How a claim takes a record it read.
enum Take {
    /// As a new operation (the record was expired, failed, or superseded).
    Fresh,
    /// A stale lease under `hold`: the record becomes unknown, nobody holds it.
    Unknown,
    /// A stale lease under `takeover` or `reconcile`: a new token in the same operation.
    Over(Won),
}

impl Take {
    fn answer(&self, request: &ClaimRequest, row: &Row) -> Claim {
        match self {
            Self::Fresh => Claim::Won { attempt: Won::Fresh, window_end: request.window_end },
            Self::Unknown => Claim::Unknown,
            Self::Over(attempt) => Claim::Won { attempt: *attempt, window_end: row.window_end },
        }
    }

    /// The compare-and-set `UPDATE` that takes `row` as read: its `WHERE` names the version read
    /// (token, state, lease), so of two claimers that read the same version only one takes it.
    fn statement(&self, backend: DbBackend, request: &ClaimRequest, row: &Row) -> Statement {
        let statements = Statements::of(backend);
        let (text, mut values) = match self {
            Self::Fresh => (
                statements.take_fresh,
                vec![
                    token_value(request.token),
                    millis(request.now),
                    millis(request.window_end),
                    millis(request.expires_at),
                    millis(request.lease_until),
                    Value::Bytes(Some(request.fingerprint.to_vec())),
                    Value::Bytes(Some(tags_bytes(&request.arg_tags))),
                    tenant_value(request.tenant),
                    subject_value(request.subject),
                    bytes_opt(request.label.clone()),
                ],
            ),
            Self::Unknown => (statements.take_unknown, Vec::new()),
            Self::Over(attempt) => (
                statements.take_over,
                vec![token_value(request.token), attempt_value(*attempt), millis(request.lease_until)],
            ),
        };
        values.extend([
            key_value(&request.key),
            token_value(row.token),
            state_value(row.state),
            millis(row.lease_until),
        ]);
        Statement::from_sql_and_values(backend, text, values)
    }
}
