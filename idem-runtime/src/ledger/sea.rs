//! Durable ledgers through sea-orm: SQLite (the embedded default), PostgreSQL, MySQL/MariaDB.
//!
//! One table, `idem_records`, created by [`SeaOrmLedger::migrate`]:
//!
//! | column | type | why |
//! |---|---|---|
//! | `key` | 32 bytes, primary key | the operation's SHA-256 key; the unique constraint the claim rests on |
//! | `tenant` | bigint | 8-byte tag of the tenant, so status lookups never cross tenants |
//! | `state` | smallint | 1 in progress, 2 completed, 3 failed, 4 unknown |
//! | `token` | bigint | the holder's fencing token |
//! | `created_at`, `expires_at`, `lease_until` | bigint, ms since the epoch | times come from Rust, so every backend compares the same numbers; `expires_at` is indexed for the sweep |
//! | `fingerprint` | 32 bytes | digest of all fingerprinted arguments |
//! | `arg_tags` | 4 bytes per argument | names the differing arguments of a conflict, never values |
//! | `result` | bytes, null until completed | the stored result, replayed byte for byte |
//!
//! No index covers a column that completion or renewal changes, so on PostgreSQL those updates
//! can be HOT updates.
//!
//! The claim per backend:
//! - **PostgreSQL**: one statement — `INSERT … ON CONFLICT (key) DO NOTHING RETURNING` inside a
//!   CTE, with the existing row selected in the same statement when the key is taken. A repeat is
//!   answered from that read (no lock, no write); only an expired, failed or stale record costs a
//!   second, conditional `UPDATE … WHERE <claimable> RETURNING`.
//! - **SQLite**: the same upsert (`RETURNING`, SQLite ≥ 3.35); when it does not claim, a second
//!   statement reads the record that stood in the way.
//! - **MySQL/MariaDB**: a plain `INSERT` claims an absent key (the primary key refuses a second);
//!   on a duplicate, the record is read, and only a claimable one (expired, failed, stale) is
//!   taken in a short transaction holding its row lock (`SELECT … FOR UPDATE`).
//!
//! Each claim commits on its own, before the handler runs, so a concurrent repeat is answered at
//! once instead of waiting on a row lock.

use std::time::Duration;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, QueryResult, Statement,
    TransactionTrait,
};

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, Outcome, RecordView, Resolution, State, StatusReport, Token,
    Verdict, Won, won_stale,
};
use crate::key::{Key, REF_HEX_LEN, Ref, TenantTag};
use crate::recipe::StalePolicy;

/// The environment variable naming the ledger database.
pub const DATABASE_URL_ENV: &str = "IDEM_DATABASE_URL";

/// Where the ledger lives when [`DATABASE_URL_ENV`] is unset: a SQLite file under the current
/// directory.
pub const DEFAULT_SQLITE_URL: &str = "sqlite://.idem/ledger.sqlite3?mode=rwc";

/// How many times a claim re-runs when a concurrent change slipped between its statements
/// (it backs off a little from the fourth on, so a burst of churn can settle).
const CLAIM_ATTEMPTS: u32 = 64;

/// A [`Ledger`] on a relational database through sea-orm.
#[derive(Debug, Clone)]
pub struct SeaOrmLedger {
    db: DatabaseConnection,
}

impl SeaOrmLedger {
    /// Connects to `url` (`sqlite://path?mode=rwc`, `sqlite::memory:`, `postgres://…`,
    /// `mysql://…`) and creates the table if it is missing.
    ///
    /// SQLite files are opened in WAL mode with `synchronous=FULL` — a claim lost to a power cut
    /// would be a duplicate waiting to happen, so durability wins over the ~1 ms it costs — and a
    /// 10 s busy timeout.
    ///
    /// # Errors
    /// The database cannot be reached, or the table cannot be created.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        let ledger = Self::connect_without_migrating(url).await?;
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// Connects to [`DATABASE_URL_ENV`], or to the SQLite file [`DEFAULT_SQLITE_URL`] (creating
    /// its directory) when unset, and migrates.
    ///
    /// # Errors
    /// As [`SeaOrmLedger::connect`].
    pub async fn from_env() -> Result<Self, LedgerError> {
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::connect(url.trim()).await,
            _ => {
                std::fs::create_dir_all(".idem").map_err(|error| LedgerError::Unavailable {
                    detail: format!("cannot create the ledger directory `.idem`: {error}"),
                })?;
                Self::connect(DEFAULT_SQLITE_URL).await
            }
        }
    }

    /// Connects without touching the schema: for deployments that run [`SeaOrmLedger::migrate`]
    /// (or [`schema`]) from their own migration step.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn connect_without_migrating(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with(Self::options(url)).await
    }

    /// The connection options [`SeaOrmLedger::connect`] uses for `url`: no statement logging,
    /// 5 s connect and acquire timeouts, a ping only for connections idle 30 s, and for SQLite
    /// WAL, `synchronous=FULL` and a 10 s busy timeout. Adjust them (the pool size, say) and pass
    /// them to [`SeaOrmLedger::connect_with`].
    #[must_use]
    pub fn options(url: &str) -> ConnectOptions {
        let mut options = ConnectOptions::new(url.to_owned());
        options.sqlx_logging(false).connect_timeout(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(5));
        // A pooled connection is pinged only after it sat idle: saves a round trip per statement.
        options.test_before_acquire_if_idle_for(Duration::from_secs(30));
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            configure_sqlite(&mut options, url);
        }
        options
    }

    /// Connects with your own options (start from [`SeaOrmLedger::options`]); does not migrate.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn connect_with(options: ConnectOptions) -> Result<Self, LedgerError> {
        let db = Database::connect(options).await.map_err(unavailable)?;
        Ok(Self { db })
    }

    /// Wraps an existing sea-orm connection (pool). Run [`SeaOrmLedger::migrate`] once.
    #[must_use]
    pub fn from_connection(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// The connection pool.
    #[must_use]
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Creates the table and its index if they do not exist. Safe to run on every start.
    ///
    /// # Errors
    /// The statements fail (permissions, an incompatible table of the same name).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let backend = self.db.get_database_backend();
        let txn = self.db.begin().await.map_err(unavailable)?;
        if backend == DbBackend::Postgres {
            // Replicas starting together would race `CREATE TABLE IF NOT EXISTS` (PostgreSQL can
            // fail one with a duplicate type name): serialise them on an advisory lock.
            txn.execute_unprepared("SELECT pg_advisory_xact_lock(7233960519474712933)").await.map_err(unavailable)?;
        }
        for statement in schema(backend) {
            txn.execute_unprepared(statement).await.map_err(unavailable)?;
        }
        txn.commit().await.map_err(unavailable)
    }

    /// Ends a held claim on `conn` — a transaction of the handler's own, so its writes and the
    /// stored result commit (or roll back) together.
    ///
    /// # Errors
    /// [`LedgerError::Fenced`] if `token` no longer holds the claim; the database's failure.
    pub async fn complete_on<C: ConnectionTrait>(
        conn: &C,
        key: &Key,
        token: Token,
        outcome: Outcome,
    ) -> Result<(), LedgerError> {
        let backend = conn.get_database_backend();
        let (state, result) = match outcome {
            Outcome::Completed(bytes) => (State::Completed, Some(bytes)),
            Outcome::Failed => (State::Failed, None),
            Outcome::Unknown => (State::Unknown, None),
        };
        let sql =
            sql(backend, "UPDATE idem_records SET state = ?, result = ? WHERE key = ? AND token = ? AND state = 1");
        let values = vec![state_value(state), bytes_opt(result), key_value(key), token_value(token)];
        let done = conn.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(unavailable)?;
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::Fenced) }
    }

    async fn claim_now(&self, request: &ClaimRequest) -> Result<Claim, LedgerError> {
        for attempt in 0..CLAIM_ATTEMPTS {
            if attempt >= 4 {
                tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(20)))).await;
            }
            let answer = match self.db.get_database_backend() {
                DbBackend::Postgres => self.claim_postgres(request).await?,
                DbBackend::MySql => self.claim_mysql(request).await?,
                _ => self.claim_sqlite(request).await?,
            };
            if let Some(claim) = answer {
                return Ok(claim);
            }
            tracing::debug!(reference = %request.key.reference(), "claim raced a concurrent change; re-running");
        }
        Err(LedgerError::Unavailable { detail: "the claim did not settle under concurrent changes".to_owned() })
    }

    /// One statement: claim, or return the record in the way. `None` when the record changed
    /// between the statement's snapshot and its conflict check (re-run).
    async fn claim_postgres(&self, request: &ClaimRequest) -> Result<Option<Claim>, LedgerError> {
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, POSTGRES_CLAIM, insert_values(request));
        let Some(row) = self.db.query_one_raw(statement).await.map_err(unavailable)? else { return Ok(None) };
        let claimed: i16 = row.try_get_by_index(0).map_err(corrupt)?;
        let row = Row::read(&row, 1)?;
        if claimed == 1 {
            return Ok(Some(Claim::Won(Won::Fresh)));
        }
        if let Some(answer) = row.answer(request) {
            // A repeat: answered from a plain read, no lock, no write.
            return Ok(Some(answer));
        }
        // Expired, failed or stale: take it with a conditional update.
        let values = vec![
            key_value(&request.key),
            token_value(request.token),
            millis(request.now),
            millis(request.expires_at),
            millis(request.lease_until),
            sea_orm::Value::Bytes(Some(request.fingerprint.to_vec())),
            sea_orm::Value::Bytes(Some(tags_bytes(&request.arg_tags))),
            sea_orm::Value::Bool(Some(request.stale == StalePolicy::Hold)),
        ];
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, POSTGRES_RECLAIM, values);
        let row = self.db.query_one_raw(statement).await.map_err(unavailable)?;
        row.map(|row| Row::read(&row, 0).map(|row| row.won(request))).transpose()
    }

    /// The upsert; when it does not claim, a read of the record in the way.
    async fn claim_sqlite(&self, request: &ClaimRequest) -> Result<Option<Claim>, LedgerError> {
        let mut values = insert_values(request);
        values.push(sea_orm::Value::Bool(Some(request.stale == StalePolicy::Hold)));
        let statement = Statement::from_sql_and_values(DbBackend::Sqlite, SQLITE_CLAIM, values);
        if let Some(row) = self.db.query_one_raw(statement).await.map_err(unavailable)? {
            return Ok(Some(Row::read(&row, 0)?.won(request)));
        }
        Ok(self.read(request).await?.and_then(|row| row.answer(request)))
    }

    /// Insert to claim an absent key; on a duplicate, read; take a claimable record under its
    /// row lock.
    async fn claim_mysql(&self, request: &ClaimRequest) -> Result<Option<Claim>, LedgerError> {
        let statement = Statement::from_sql_and_values(DbBackend::MySql, MYSQL_CLAIM, insert_values(request));
        match self.db.execute_raw(statement).await {
            Ok(_) => return Ok(Some(Claim::Won(Won::Fresh))),
            Err(error) if is_duplicate(&error) => {}
            Err(error) => return Err(unavailable(error)),
        }
        let Some(row) = self.read(request).await? else { return Ok(None) };
        if let Some(answer) = row.answer(request) {
            return Ok(Some(answer));
        }
        let txn = self.db.begin().await.map_err(unavailable)?;
        let locked = read_on(&txn, request, " FOR UPDATE").await?;
        let claim = match locked.as_ref().map(|row| row.view().judge(request)) {
            None => None,
            Some(Verdict::Answer(claim)) => Some(claim),
            Some(Verdict::Fresh) => {
                let sql = "UPDATE idem_records SET state = 1, token = ?, created_at = ?, expires_at = ?, \
                           lease_until = ?, fingerprint = ?, arg_tags = ?, result = NULL WHERE `key` = ?";
                let values = vec![
                    token_value(request.token),
                    millis(request.now),
                    millis(request.expires_at),
                    millis(request.lease_until),
                    sea_orm::Value::Bytes(Some(request.fingerprint.to_vec())),
                    sea_orm::Value::Bytes(Some(tags_bytes(&request.arg_tags))),
                    key_value(&request.key),
                ];
                txn.execute_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, values))
                    .await
                    .map_err(unavailable)?;
                Some(Claim::Won(Won::Fresh))
            }
            Some(Verdict::Stale(StalePolicy::Hold)) => {
                let sql = "UPDATE idem_records SET state = 4 WHERE `key` = ?";
                let values = vec![key_value(&request.key)];
                txn.execute_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, values))
                    .await
                    .map_err(unavailable)?;
                Some(Claim::Unknown)
            }
            Some(Verdict::Stale(policy)) => {
                let sql = "UPDATE idem_records SET token = ?, lease_until = ? WHERE `key` = ?";
                let values = vec![token_value(request.token), millis(request.lease_until), key_value(&request.key)];
                txn.execute_raw(Statement::from_sql_and_values(DbBackend::MySql, sql, values))
                    .await
                    .map_err(unavailable)?;
                Some(Claim::Won(won_stale(policy)))
            }
        };
        txn.commit().await.map_err(unavailable)?;
        Ok(claim)
    }

    async fn read(&self, request: &ClaimRequest) -> Result<Option<Row>, LedgerError> {
        read_on(&self.db, request, "").await
    }

    fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    async fn renew_now(&self, key: &Key, token: Token, lease_until: u64) -> Result<(), LedgerError> {
        let backend = self.backend();
        let sql = sql(
            backend,
            "UPDATE idem_records SET lease_until = CASE WHEN lease_until < ? THEN ? ELSE lease_until END \
             WHERE key = ? AND token = ? AND state = 1",
        );
        let values = vec![millis(lease_until), millis(lease_until), key_value(key), token_value(token)];
        let done =
            self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(unavailable)?;
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::Fenced) }
    }

    async fn status_now(
        &self,
        tenant: TenantTag,
        reference: Ref,
        now: u64,
    ) -> Result<Option<StatusReport>, LedgerError> {
        let Some(row) = self.find(tenant, reference, now).await? else { return Ok(None) };
        Ok(Some(StatusReport {
            reference: row.key.reference(),
            state: row.state,
            created_at: row.created_at,
            expires_at: row.expires_at,
            lease_expired: row.state == State::InProgress && row.lease_until <= now,
            result: row.result,
        }))
    }

    /// The unexpired record of `tenant` whose key starts with `reference`.
    async fn find(&self, tenant: TenantTag, reference: Ref, now: u64) -> Result<Option<Found>, LedgerError> {
        let backend = self.backend();
        let sql = sql(
            backend,
            "SELECT key, state, created_at, expires_at, lease_until, result FROM idem_records \
             WHERE key >= ? AND key <= ? AND tenant = ? AND NOT (expires_at <= ? AND state IN (2, 3)) \
             LIMIT 1",
        );
        let (low, high) = ref_range(reference);
        let values = vec![
            sea_orm::Value::Bytes(Some(low)),
            sea_orm::Value::Bytes(Some(high)),
            tenant_value(tenant),
            millis(now),
        ];
        let row =
            self.db.query_one_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(unavailable)?;
        row.map(|row| Found::read(&row)).transpose()
    }

    async fn resolve_now(
        &self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
    ) -> Result<(), LedgerError> {
        let Some(found) = self.find(tenant, reference, now).await? else { return Err(LedgerError::NotFound) };
        let backend = self.backend();
        let (state, result) = match resolution {
            Resolution::Completed(bytes) => (State::Completed, Some(bytes)),
            Resolution::NothingHappened => (State::Failed, None),
        };
        let sql = sql(
            backend,
            "UPDATE idem_records SET state = ?, result = ? \
             WHERE key = ? AND tenant = ? AND (state = 4 OR (state = 1 AND lease_until <= ?))",
        );
        let values =
            vec![state_value(state), bytes_opt(result), key_value(&found.key), tenant_value(tenant), millis(now)];
        let done =
            self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(unavailable)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        let state = match self.find(tenant, reference, now).await? {
            Some(found) => found.state,
            None => return Err(LedgerError::NotFound),
        };
        Err(LedgerError::NotResolvable { state })
    }

    async fn sweep_now(&self, now: u64, limit: usize) -> Result<usize, LedgerError> {
        let backend = self.backend();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // The outer condition is checked again on the row the DELETE locks, so a record claimed
        // afresh between the subquery and the delete is spared.
        let (sql, values) = if backend == DbBackend::MySql {
            (
                "DELETE FROM idem_records WHERE expires_at <= ? AND state IN (2, 3) \
                 ORDER BY expires_at LIMIT ?"
                    .to_owned(),
                vec![millis(now), sea_orm::Value::BigInt(Some(limit))],
            )
        } else {
            (
                sql(
                    backend,
                    "DELETE FROM idem_records WHERE key IN (SELECT key FROM idem_records \
                     WHERE expires_at <= ? AND state IN (2, 3) ORDER BY expires_at LIMIT ?) \
                     AND expires_at <= ? AND state IN (2, 3)",
                ),
                vec![millis(now), sea_orm::Value::BigInt(Some(limit)), millis(now)],
            )
        };
        let done =
            self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(unavailable)?;
        let swept = usize::try_from(done.rows_affected()).unwrap_or(usize::MAX);
        if swept > 0 {
            tracing::debug!(swept, "swept expired records");
        }
        Ok(swept)
    }
}

impl Ledger for SeaOrmLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(self.claim_now(request))
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.renew_now(key, token, lease_until))
    }

    fn complete<'a>(&'a self, key: &'a Key, token: Token, outcome: Outcome) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(Self::complete_on(&self.db, key, token, outcome))
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(self.status_now(tenant, reference, now))
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.resolve_now(tenant, reference, resolution, now))
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(self.sweep_now(now, limit))
    }
}

/// The PostgreSQL claim: `$1` key, `$2` tenant, `$3` token, `$4` now, `$5` expires_at,
/// `$6` lease_until, `$7` fingerprint, `$8` arg_tags, `$9` whether the stale policy is `hold`.
#[doc(hidden)]
pub const POSTGRES_CLAIM: &str = "WITH claimed AS (
            INSERT INTO idem_records
                (key, tenant, state, token, created_at, expires_at, lease_until, fingerprint, arg_tags, result)
            VALUES ($1, $2, 1, $3, $4, $5, $6, $7, $8, NULL)
            ON CONFLICT (key) DO NOTHING
            RETURNING state, token, expires_at, lease_until, fingerprint, arg_tags, result
        )
        SELECT 1::smallint AS claimed, state, token, expires_at, lease_until, fingerprint, arg_tags, result FROM claimed
        UNION ALL
        SELECT 0::smallint, state, token, expires_at, lease_until, fingerprint, arg_tags, result
        FROM idem_records WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)";

/// The PostgreSQL re-claim of an existing record that was expired, failed or held by a dead
/// holder: `$1` key, `$2` token, `$3` now, `$4` expires_at, `$5` lease_until, `$6` fingerprint,
/// `$7` arg_tags, `$8` whether the stale policy is `hold`. Its `WHERE` is evaluated again on the
/// newest row version, so of two re-claimers only one can win.
#[doc(hidden)]
pub const POSTGRES_RECLAIM: &str = "UPDATE idem_records AS r SET
            state = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         THEN 1 WHEN $8 THEN 4 ELSE 1 END,
            token = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         OR NOT $8 THEN $2 ELSE r.token END,
            created_at = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         THEN $3 ELSE r.created_at END,
            expires_at = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         THEN $4 ELSE r.expires_at END,
            lease_until = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         OR NOT $8 THEN $5 ELSE r.lease_until END,
            fingerprint = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         THEN $6 ELSE r.fingerprint END,
            arg_tags = CASE WHEN (r.expires_at <= $3 AND r.state = 2) OR r.state = 3
                         THEN $7 ELSE r.arg_tags END,
            result = NULL
        WHERE r.key = $1
          AND ((r.expires_at <= $3 AND r.state = 2) OR r.state = 3
               OR (r.state = 1 AND r.lease_until <= $3 AND r.fingerprint = $6))
        RETURNING r.state, r.token, r.expires_at, r.lease_until, r.fingerprint, r.arg_tags, r.result";

/// The SQLite claim, with the parameters of [`POSTGRES_CLAIM`] as `?1`…`?9`.
#[doc(hidden)]
pub const SQLITE_CLAIM: &str = "INSERT INTO idem_records
                (key, tenant, state, token, created_at, expires_at, lease_until, fingerprint, arg_tags, result)
            VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7, ?8, NULL)
            ON CONFLICT (key) DO UPDATE SET
                state = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             THEN 1 WHEN ?9 THEN 4 ELSE 1 END,
                token = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             OR NOT ?9 THEN excluded.token ELSE token END,
                created_at = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             THEN excluded.created_at ELSE created_at END,
                expires_at = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             THEN excluded.expires_at ELSE expires_at END,
                lease_until = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             OR NOT ?9 THEN excluded.lease_until ELSE lease_until END,
                fingerprint = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             THEN excluded.fingerprint ELSE fingerprint END,
                arg_tags = CASE WHEN (expires_at <= ?4 AND state = 2) OR state = 3
                             THEN excluded.arg_tags ELSE arg_tags END,
                result = NULL
            WHERE (expires_at <= ?4 AND state = 2) OR state = 3
               OR (state = 1 AND lease_until <= ?4 AND fingerprint = excluded.fingerprint)
            RETURNING state, token, expires_at, lease_until, fingerprint, arg_tags, result";

/// The MySQL claim of an absent key, parameters as [`POSTGRES_CLAIM`]'s first eight.
#[doc(hidden)]
pub const MYSQL_CLAIM: &str = "INSERT INTO idem_records
                (`key`, tenant, state, token, created_at, expires_at, lease_until, fingerprint, arg_tags, result)
            VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, NULL)";

/// The completion: state, result, key, token (`?` placeholders; see [`sql_for`]).
#[doc(hidden)]
pub const COMPLETE: &str = "UPDATE idem_records SET state = ?, result = ? WHERE key = ? AND token = ? AND state = 1";

/// `text` with placeholders and quoting for `backend` (for benchmarks that replay idem's SQL).
#[doc(hidden)]
#[must_use]
pub fn sql_for(backend: DbBackend, text: &str) -> String {
    sql(backend, text)
}

/// The statements [`SeaOrmLedger::migrate`] runs for `backend`, for use in your own migrations.
#[must_use]
pub fn schema(backend: DbBackend) -> &'static [&'static str] {
    match backend {
        DbBackend::Postgres => &[
            "CREATE TABLE IF NOT EXISTS idem_records (
                tenant bigint NOT NULL,
                token bigint NOT NULL,
                created_at bigint NOT NULL,
                expires_at bigint NOT NULL,
                lease_until bigint NOT NULL,
                state smallint NOT NULL,
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                fingerprint bytea NOT NULL,
                arg_tags bytea NOT NULL,
                result bytea
            )",
            "CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at)",
        ],
        DbBackend::MySql => &["CREATE TABLE IF NOT EXISTS idem_records (
                `key` BINARY(32) NOT NULL PRIMARY KEY,
                tenant BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                token BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                lease_until BIGINT NOT NULL,
                fingerprint BINARY(32) NOT NULL,
                arg_tags VARBINARY(4096) NOT NULL,
                result LONGBLOB NULL,
                INDEX idem_records_expires_at (expires_at)
            ) ENGINE=InnoDB"],
        _ => &[
            "CREATE TABLE IF NOT EXISTS idem_records (
                key BLOB PRIMARY KEY NOT NULL,
                tenant INTEGER NOT NULL,
                state INTEGER NOT NULL,
                token INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                lease_until INTEGER NOT NULL,
                fingerprint BLOB NOT NULL,
                arg_tags BLOB NOT NULL,
                result BLOB
            ) WITHOUT ROWID",
            "CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at)",
        ],
    }
}

#[cfg(feature = "sqlite")]
fn configure_sqlite(options: &mut ConnectOptions, url: &str) {
    use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    options.map_sqlx_sqlite_opts(move |opts| {
        let opts = opts.busy_timeout(Duration::from_secs(10)).foreign_keys(false);
        if in_memory { opts } else { opts.journal_mode(SqliteJournalMode::Wal).synchronous(SqliteSynchronous::Full) }
    });
    if in_memory {
        // Every pooled connection to `:memory:` would open its own empty database.
        options.max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None);
    }
}

/// The columns a claim reads back, in this order.
const ROW_COLUMNS: &str = "state, token, expires_at, lease_until, fingerprint, arg_tags, result";

async fn read_on<C: ConnectionTrait>(conn: &C, request: &ClaimRequest, lock: &str) -> Result<Option<Row>, LedgerError> {
    let backend = conn.get_database_backend();
    let sql = sql(backend, &format!("SELECT {ROW_COLUMNS} FROM idem_records WHERE key = ?{lock}"));
    let statement = Statement::from_sql_and_values(backend, sql, vec![key_value(&request.key)]);
    let row = conn.query_one_raw(statement).await.map_err(unavailable)?;
    row.map(|row| Row::read(&row, 0)).transpose()
}

/// A record as a claim reads it.
struct Row {
    state: State,
    token: Token,
    expires_at: u64,
    lease_until: u64,
    fingerprint: Vec<u8>,
    arg_tags: Vec<[u8; 4]>,
    result: Option<Vec<u8>>,
}

impl Row {
    fn read(row: &QueryResult, first: usize) -> Result<Self, LedgerError> {
        Ok(Self {
            state: state_of(row.try_get_by_index::<i16>(first).map_err(corrupt)?)?,
            token: Token(to_u64(row.try_get_by_index::<i64>(first + 1).map_err(corrupt)?)),
            expires_at: to_u64(row.try_get_by_index::<i64>(first + 2).map_err(corrupt)?),
            lease_until: to_u64(row.try_get_by_index::<i64>(first + 3).map_err(corrupt)?),
            fingerprint: row.try_get_by_index::<Vec<u8>>(first + 4).map_err(corrupt)?,
            arg_tags: tags_of(&row.try_get_by_index::<Vec<u8>>(first + 5).map_err(corrupt)?),
            result: row.try_get_by_index::<Option<Vec<u8>>>(first + 6).map_err(corrupt)?,
        })
    }

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

    /// What the row the upsert wrote means for its claimer.
    fn won(&self, request: &ClaimRequest) -> Claim {
        if self.token != request.token {
            // A stale lease under `hold`: the record became unknown, and nobody holds it.
            return Claim::Unknown;
        }
        // A fresh claim writes the request's window; a takeover keeps the operation's own.
        if self.expires_at == request.expires_at {
            Claim::Won(Won::Fresh)
        } else {
            Claim::Won(won_stale(request.stale))
        }
    }

    /// The answer an existing record gives, or `None` if it is claimable after all (it changed
    /// since the claim's check: re-run the claim).
    fn answer(&self, request: &ClaimRequest) -> Option<Claim> {
        match self.view().judge(request) {
            Verdict::Answer(claim) => Some(claim),
            Verdict::Fresh | Verdict::Stale(_) => None,
        }
    }
}

/// A record as a status lookup reads it.
struct Found {
    key: Key,
    state: State,
    created_at: u64,
    expires_at: u64,
    lease_until: u64,
    result: Option<Vec<u8>>,
}

impl Found {
    fn read(row: &QueryResult) -> Result<Self, LedgerError> {
        let key: Vec<u8> = row.try_get_by_index(0).map_err(corrupt)?;
        let key: [u8; 32] =
            key.try_into().map_err(|_| LedgerError::Corrupt { detail: "a key is not 32 bytes".into() })?;
        Ok(Self {
            key: Key::from_bytes(key),
            state: state_of(row.try_get_by_index::<i16>(1).map_err(corrupt)?)?,
            created_at: to_u64(row.try_get_by_index::<i64>(2).map_err(corrupt)?),
            expires_at: to_u64(row.try_get_by_index::<i64>(3).map_err(corrupt)?),
            lease_until: to_u64(row.try_get_by_index::<i64>(4).map_err(corrupt)?),
            result: row.try_get_by_index::<Option<Vec<u8>>>(5).map_err(corrupt)?,
        })
    }
}

/// The values of a claim's INSERT, in column order after `state`.
fn insert_values(request: &ClaimRequest) -> Vec<sea_orm::Value> {
    vec![
        key_value(&request.key),
        tenant_value(request.tenant),
        token_value(request.token),
        millis(request.now),
        millis(request.expires_at),
        millis(request.lease_until),
        sea_orm::Value::Bytes(Some(request.fingerprint.to_vec())),
        sea_orm::Value::Bytes(Some(tags_bytes(&request.arg_tags))),
    ]
}

/// Rewrites `?` placeholders for `backend` and quotes the `key` column where it is reserved.
fn sql(backend: DbBackend, text: &str) -> String {
    match backend {
        DbBackend::Postgres => {
            let mut out = String::with_capacity(text.len() + 16);
            let mut n = 0;
            for c in text.chars() {
                if c == '?' {
                    n += 1;
                    out.push_str(&format!("${n}"));
                } else {
                    out.push(c);
                }
            }
            out
        }
        DbBackend::MySql => quote_key_mysql(text),
        _ => text.to_owned(),
    }
}

/// `key` is a reserved word in MySQL: quote the column wherever it appears as one.
fn quote_key_mysql(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let boundary_before =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b'`');
        if boundary_before && text[i..].starts_with("key") {
            let after = bytes.get(i + 3).copied();
            if after.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'`')) {
                out.push_str("`key`");
                i += 3;
                continue;
            }
        }
        out.push(char::from(bytes[i]));
        i += 1;
    }
    out
}

fn ref_range(reference: Ref) -> (Vec<u8>, Vec<u8>) {
    let mut low = reference.as_bytes().to_vec();
    let mut high = low.clone();
    low.resize(32, 0x00);
    high.resize(32, 0xff);
    debug_assert_eq!(reference.as_bytes().len(), REF_HEX_LEN / 2);
    (low, high)
}

fn is_duplicate(error: &DbErr) -> bool {
    matches!(error.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}

fn unavailable(error: DbErr) -> LedgerError {
    LedgerError::Unavailable { detail: error.to_string() }
}

fn corrupt(error: DbErr) -> LedgerError {
    LedgerError::Corrupt { detail: error.to_string() }
}

fn state_of(code: i16) -> Result<State, LedgerError> {
    State::from_code(code).ok_or_else(|| LedgerError::Corrupt { detail: format!("unknown record state {code}") })
}

fn state_value(state: State) -> sea_orm::Value {
    sea_orm::Value::SmallInt(Some(state.code()))
}

fn key_value(key: &Key) -> sea_orm::Value {
    sea_orm::Value::Bytes(Some(key.as_bytes().to_vec()))
}

fn tenant_value(tenant: TenantTag) -> sea_orm::Value {
    sea_orm::Value::BigInt(Some(i64::from_be_bytes(tenant.0)))
}

fn token_value(token: Token) -> sea_orm::Value {
    sea_orm::Value::BigInt(Some(i64::try_from(token.0).unwrap_or(i64::MAX)))
}

fn bytes_opt(bytes: Option<Vec<u8>>) -> sea_orm::Value {
    sea_orm::Value::Bytes(bytes)
}

fn millis(ms: u64) -> sea_orm::Value {
    sea_orm::Value::BigInt(Some(i64::try_from(ms).unwrap_or(i64::MAX)))
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn tags_bytes(tags: &[[u8; 4]]) -> Vec<u8> {
    tags.concat()
}

fn tags_of(bytes: &[u8]) -> Vec<[u8; 4]> {
    bytes.chunks_exact(4).map(|chunk| [chunk[0], chunk[1], chunk[2], chunk[3]]).collect()
}
