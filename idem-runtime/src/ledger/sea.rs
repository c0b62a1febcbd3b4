//! Durable ledgers through sea-orm: SQLite (the embedded default), PostgreSQL, MySQL/MariaDB.
//!
//! One table, `idem_records`, created by [`SeaOrmLedger::migrate`]:
//!
//! | column | type | why |
//! |---|---|---|
//! | `key` | 32 bytes, primary key | the operation's SHA-256 key; the unique constraint the claim rests on |
//! | `tenant` | bigint | 8-byte keyed tag of the tenant, so status lookups never cross tenants |
//! | `subject` | bigint | 8-byte keyed tag of the subject, or 0 for a record the whole tenant may see (`scope = "tenant"`), so status lookups never cross subjects |
//! | `state` | smallint | 1 in progress, 2 completed, 3 failed, 4 unknown |
//! | `token` | bigint | the holder's fencing token |
//! | `attempt` | smallint | how the holder won: 0 fresh, 1 takeover, 2 reconcile — what a re-sent claim is told, and what a release undoes |
//! | `created_at`, `window_end`, `expires_at`, `lease_until` | bigint, ms since the epoch | times come from Rust (on the ledger's clock as each replica measured it), so every backend compares the same numbers; `window_end` ends the operation (and is indexed for the sweep), `expires_at` ends the record |
//! | `fingerprint` | 32 bytes | keyed digest of all fingerprinted arguments |
//! | `arg_tags` | 4 bytes per argument | keyed tags that name the differing arguments of a conflict; without the secret they say nothing about the values |
//! | `result` | bytes, null until completed | the stored result, replayed byte for byte |
//!
//! No index covers a column that completion or renewal changes (the sweep's index is on
//! `window_end`, which only a new operation changes), so on PostgreSQL those updates can be HOT
//! updates.
//!
//! A second table, `idem_superseded`, keeps unsettled records (unknown, or in progress under a
//! dead holder) that a newer operation replaced after their window ended, for the operator,
//! until their retention passes.
//!
//! The claim per backend:
//! - **PostgreSQL**: one statement — `INSERT … ON CONFLICT (key) DO NOTHING RETURNING` inside a
//!   CTE, with the existing row selected in the same statement when the key is taken. A repeat is
//!   answered from that read (no lock, no write).
//! - **SQLite**: `INSERT … ON CONFLICT (key) DO NOTHING RETURNING`; when it does not claim, a
//!   second statement reads the record that stood in the way.
//! - **MySQL/MariaDB**: a plain `INSERT` claims an absent key (the primary key refuses a second);
//!   on a duplicate, the record is read.
//!
//! The record read is judged in Rust by the one decision function every backend shares. Only an
//! expired, failed, stale or superseded record is then taken, by a compare-and-set `UPDATE` whose
//! `WHERE` names the version read (token, state, lease); if anything changed meanwhile it matches
//! nothing and the claim starts over.
//!
//! Each claim commits on its own, before the handler runs, so a concurrent repeat is answered at
//! once instead of waiting on a row lock.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, QueryResult, Statement,
    TransactionTrait,
};

use super::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, Outcome, RecordView, Resolution, State, StatusReport, Token,
    Verdict, Won, settled_expiry, won_stale,
};
use crate::clock::Clock;
use crate::key::{Key, REF_HEX_LEN, Ref, SubjectTag, TenantTag};
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
#[derive(Clone)]
pub struct SeaOrmLedger {
    db: DatabaseConnection,
    /// A clock that stands in for the database server's (tests that simulate time).
    clock: Option<Arc<dyn Clock>>,
    /// Where a handle without a configured secret gets one.
    own_secret: OwnSecret,
}

/// The secret a SQL ledger offers a handle that has none configured.
#[derive(Clone, Debug)]
enum OwnSecret {
    /// A SQLite file: a secret kept in this file beside it, made on first use.
    File(std::path::PathBuf),
    /// An in-memory SQLite database: a random secret per process.
    Ephemeral,
    /// A shared database (or one whose file is unknown): none; it must be configured.
    Required(&'static str),
}

impl OwnSecret {
    fn of(backend: DbBackend, url: Option<&str>) -> Self {
        match (backend, url) {
            (DbBackend::Postgres, _) => Self::Required("a PostgreSQL ledger"),
            (DbBackend::MySql, _) => Self::Required("a MySQL ledger"),
            (_, Some(url)) if url.contains(":memory:") || url.contains("mode=memory") => Self::Ephemeral,
            (_, Some(url)) => {
                let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
                let path = path.split('?').next().unwrap_or_default();
                if path.is_empty() {
                    Self::Required("a SQLite ledger whose file is unknown")
                } else {
                    Self::File(std::path::PathBuf::from(format!("{path}.secret")))
                }
            }
            (_, None) => Self::Required("a SQLite ledger opened from a connection (its file is unknown)"),
        }
    }
}

impl std::fmt::Debug for SeaOrmLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaOrmLedger").field("backend", &self.db.get_database_backend()).finish_non_exhaustive()
    }
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
        let url = options.get_url().to_owned();
        let db = Database::connect(options).await.map_err(failed)?;
        let own_secret = OwnSecret::of(db.get_database_backend(), Some(&url));
        Ok(Self { db, clock: None, own_secret })
    }

    /// Wraps an existing sea-orm connection (pool). Run [`SeaOrmLedger::migrate`] once. Its
    /// file unknown, a SQLite ledger made this way has no default secret: configure one.
    #[must_use]
    pub fn from_connection(db: DatabaseConnection) -> Self {
        let own_secret = OwnSecret::of(db.get_database_backend(), None);
        Self { db, clock: None, own_secret }
    }

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

    /// Creates the tables and their indexes if they do not exist, and brings a table created by
    /// an earlier version up to date. Safe to run on every start, from every replica at once.
    ///
    /// # Errors
    /// The statements fail (permissions, an incompatible table of the same name).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let backend = self.db.get_database_backend();
        let txn = self.db.begin().await.map_err(failed)?;
        if backend == DbBackend::Postgres {
            // Replicas starting together would race `CREATE TABLE IF NOT EXISTS` (PostgreSQL can
            // fail one with a duplicate type name): serialise them on an advisory lock.
            txn.execute_unprepared("SELECT pg_advisory_xact_lock(7233960519474712933)").await.map_err(failed)?;
        }
        // The tables first; indexes once a table made by an earlier version has its new columns.
        let (indexes, tables): (Vec<&str>, Vec<&str>) =
            schema(backend).iter().partition(|statement| statement.contains(" INDEX IF "));
        for statement in tables {
            txn.execute_unprepared(statement).await.map_err(failed)?;
        }
        txn.commit().await.map_err(failed)?;
        self.upgrade().await?;
        for statement in indexes {
            self.db.execute_unprepared(statement).await.map_err(failed)?;
        }
        if backend == DbBackend::MySql {
            self.mysql_indexes().await?;
        }
        Ok(())
    }

    /// MySQL cannot say `CREATE INDEX IF NOT EXISTS`: the sweep's index moved from `expires_at`
    /// to `window_end` (so completions do not touch an indexed column); move it on a table made
    /// before that.
    async fn mysql_indexes(&self) -> Result<(), LedgerError> {
        let has = |name: &'static str| async move {
            let sql = "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
                       AND table_name = 'idem_records' AND index_name = ?";
            let statement = Statement::from_sql_and_values(DbBackend::MySql, sql, vec![name.into()]);
            let row = self.db.query_one_raw(statement).await.map_err(failed)?;
            let count = row.map(|row| row.try_get_by_index::<i64>(0)).transpose().map_err(corrupt)?;
            Ok::<_, LedgerError>(count.unwrap_or(0) > 0)
        };
        for (name, change) in [
            ("idem_records_window_end", "ALTER TABLE idem_records ADD INDEX idem_records_window_end (window_end)"),
            ("idem_records_expires_at", "ALTER TABLE idem_records DROP INDEX idem_records_expires_at"),
        ] {
            let wanted = name.ends_with("window_end");
            if has(name).await? != wanted && self.db.execute_unprepared(change).await.is_err() {
                // Another replica may have made the same change meanwhile.
                if has(name).await? != wanted {
                    return Err(LedgerError::Unavailable { detail: format!("could not migrate the index {name}") });
                }
            }
        }
        Ok(())
    }

    /// Adds what a table made by idem 0.1's first schema lacks: the `attempt` and `window_end`
    /// columns (the old `expires_at` was the window end; unsettled records get the default
    /// unsettled retention on top of it) and, on MySQL, an unbounded `arg_tags`.
    async fn upgrade(&self) -> Result<(), LedgerError> {
        let probe = sql(self.backend(), "SELECT attempt, window_end FROM idem_records WHERE 1 = 0");
        if self.db.execute_unprepared(&probe).await.is_err() {
            match self.add_columns().await {
                // Another replica may have upgraded the table meanwhile (MySQL and SQLite cannot
                // say `ADD COLUMN IF NOT EXISTS`): what counts is that the columns are there now.
                Err(_) if self.db.execute_unprepared(&probe).await.is_ok() => {}
                done => done?,
            }
        }
        for table in ["idem_records", "idem_superseded"] {
            self.add_subject(table).await?;
        }
        Ok(())
    }

    /// Adds the `subject` column (issue 11) to `table` if it lacks it. Records made before it
    /// get 0: visible to their whole tenant, as they were.
    async fn add_subject(&self, table: &str) -> Result<(), LedgerError> {
        let probe = format!("SELECT subject FROM {table} WHERE 1 = 0");
        if self.db.execute_unprepared(&probe).await.is_ok() {
            return Ok(());
        }
        let add = match self.backend() {
            DbBackend::Postgres => {
                format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS subject bigint NOT NULL DEFAULT 0")
            }
            DbBackend::MySql => format!("ALTER TABLE {table} ADD COLUMN subject BIGINT NOT NULL DEFAULT 0"),
            _ => format!("ALTER TABLE {table} ADD COLUMN subject INTEGER NOT NULL DEFAULT 0"),
        };
        match self.db.execute_unprepared(&add).await {
            Ok(_) => Ok(()),
            // Another replica added it meanwhile.
            Err(_) if self.db.execute_unprepared(&probe).await.is_ok() => Ok(()),
            Err(error) => Err(failed(error)),
        }
    }

    async fn add_columns(&self) -> Result<(), LedgerError> {
        let backend = self.backend();
        let txn = self.db.begin().await.map_err(failed)?;
        if backend == DbBackend::Postgres {
            txn.execute_unprepared("SELECT pg_advisory_xact_lock(7233960519474712933)").await.map_err(failed)?;
        }
        let statements: &[&str] = match backend {
            DbBackend::Postgres => &[
                "ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS attempt smallint NOT NULL DEFAULT 0",
                "ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS window_end bigint NOT NULL DEFAULT 0",
            ],
            DbBackend::MySql => &["ALTER TABLE idem_records ADD COLUMN attempt SMALLINT NOT NULL DEFAULT 0, \
                 ADD COLUMN window_end BIGINT NOT NULL DEFAULT 0, MODIFY arg_tags LONGBLOB NOT NULL"],
            _ => &[
                "ALTER TABLE idem_records ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE idem_records ADD COLUMN window_end INTEGER NOT NULL DEFAULT 0",
            ],
        };
        for statement in statements {
            txn.execute_unprepared(statement).await.map_err(failed)?;
        }
        let retention = i64::try_from(crate::idem::DEFAULT_UNSETTLED_RETENTION.as_millis()).unwrap_or(i64::MAX);
        let carry = format!(
            "UPDATE idem_records SET window_end = expires_at, expires_at = CASE WHEN state IN (1, 4) \
             THEN expires_at + {retention} ELSE expires_at END WHERE window_end = 0"
        );
        txn.execute_unprepared(&carry).await.map_err(failed)?;
        txn.commit().await.map_err(failed)
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
        let state = outcome.state();
        let result = match outcome {
            Outcome::Completed(bytes) => Some(bytes),
            Outcome::Failed | Outcome::Unknown => None,
        };
        for table in ["idem_records", "idem_superseded"] {
            let text = complete_sql(table, state);
            let mut values = vec![state_value(state), bytes_opt(result.clone())];
            if state != State::Failed {
                values.extend([millis(keep_until), millis(keep_until)]);
            }
            values.extend([key_value(key), token_value(token)]);
            let statement = Statement::from_sql_and_values(backend, sql(backend, &text), values);
            if conn.execute_raw(statement).await.map_err(failed)?.rows_affected() == 1 {
                return Ok(());
            }
        }
        Err(LedgerError::Fenced)
    }

    async fn claim_now(&self, request: &ClaimRequest) -> Result<Claim, LedgerError> {
        for attempt in 0..CLAIM_ATTEMPTS {
            if attempt >= 4 {
                tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(20)))).await;
            }
            let existing = match self.backend() {
                DbBackend::Postgres => self.insert_postgres(request).await?,
                DbBackend::MySql => self.insert_mysql(request).await?,
                _ => self.insert_sqlite(request).await?,
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
        Err(LedgerError::Unavailable { detail: "the claim did not settle under concurrent changes".to_owned() })
    }

    /// One statement: claim an absent key, or return the record in the way.
    async fn insert_postgres(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, POSTGRES_CLAIM, insert_values(request));
        let Some(row) = self.db.query_one_raw(statement).await.map_err(failed)? else { return Ok(Inserted::Gone) };
        let claimed: i16 = row.try_get_by_index(0).map_err(corrupt)?;
        if claimed == 1 { Ok(Inserted::Claimed) } else { Ok(Inserted::Existing(Row::read(&row, 1)?)) }
    }

    /// The insert; when it does not claim, a read of the record in the way.
    async fn insert_sqlite(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let statement = Statement::from_sql_and_values(DbBackend::Sqlite, SQLITE_CLAIM, insert_values(request));
        if self.db.query_one_raw(statement).await.map_err(failed)?.is_some() {
            return Ok(Inserted::Claimed);
        }
        Ok(self.read(&request.key).await?.map_or(Inserted::Gone, Inserted::Existing))
    }

    /// Insert to claim an absent key; on a duplicate, read.
    async fn insert_mysql(&self, request: &ClaimRequest) -> Result<Inserted, LedgerError> {
        let statement = Statement::from_sql_and_values(DbBackend::MySql, MYSQL_CLAIM, insert_values(request));
        match self.db.execute_raw(statement).await {
            Ok(_) => return Ok(Inserted::Claimed),
            Err(error) if is_duplicate(&error) => {}
            Err(error) => return Err(failed(error)),
        }
        Ok(self.read(&request.key).await?.map_or(Inserted::Gone, Inserted::Existing))
    }

    /// Takes the record `row` as read, if it is still that version; `None` if it changed.
    async fn take(&self, request: &ClaimRequest, row: &Row, take: &Take) -> Result<Option<Claim>, LedgerError> {
        let statement = take_statement(self.backend(), request, row, take);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        Ok((done.rows_affected() == 1).then(|| take.answer(request, row)))
    }

    /// Starts a new operation over an unsettled record past its window, keeping the old record
    /// aside for the operator — both or neither.
    async fn supersede(&self, request: &ClaimRequest, row: &Row) -> Result<Option<Claim>, LedgerError> {
        let backend = self.backend();
        let txn = self.db.begin().await.map_err(failed)?;
        // The compare-and-set first: on SQLite a transaction that writes first takes the write
        // lock at once instead of failing to upgrade a read.
        let done = txn.execute_raw(take_statement(backend, request, row, &Take::Fresh)).await.map_err(failed)?;
        if done.rows_affected() != 1 {
            txn.rollback().await.map_err(failed)?;
            return Ok(None);
        }
        let keep = match backend {
            DbBackend::Postgres => {
                "INSERT INTO idem_superseded (key, window_end, tenant, state, token, attempt, \
                 created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
            }
            DbBackend::MySql => {
                "INSERT IGNORE INTO idem_superseded (key, window_end, tenant, state, token, attempt, \
                 created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            }
            _ => {
                "INSERT OR IGNORE INTO idem_superseded (key, window_end, tenant, state, token, attempt, \
                 created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            }
        };
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
            sea_orm::Value::Bytes(Some(row.fingerprint.clone())),
            sea_orm::Value::Bytes(Some(tags_bytes(&row.arg_tags))),
            bytes_opt(row.result.clone()),
            subject_value(request.subject),
        ];
        txn.execute_raw(Statement::from_sql_and_values(backend, sql(backend, keep), values)).await.map_err(failed)?;
        txn.commit().await.map_err(failed)?;
        tracing::warn!(reference = %request.key.reference(), "an unsettled operation past its window was superseded; \
            it is kept for the operator");
        Ok(Some(Claim::Won { attempt: Won::Fresh, window_end: request.window_end }))
    }

    async fn read(&self, key: &Key) -> Result<Option<Row>, LedgerError> {
        let backend = self.backend();
        let sql = sql(backend, &format!("SELECT {ROW_COLUMNS} FROM idem_records WHERE key = ?"));
        let statement = Statement::from_sql_and_values(backend, sql, vec![key_value(key)]);
        let row = self.db.query_one_raw(statement).await.map_err(failed)?;
        row.map(|row| Row::read(&row, 0)).transpose()
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
        let done = self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(failed)?;
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::Fenced) }
    }

    async fn release_now(&self, key: &Key, token: Token) -> Result<(), LedgerError> {
        let backend = self.backend();
        // A fresh claim becomes failed (nothing ran) — also once `hold` turned its lapsed lease
        // "unknown", which only its own unrun handler could have been; a takeover only gives its
        // lease back, so the operation stays in progress and its stale policy applies.
        let sql = sql(
            backend,
            "UPDATE idem_records SET state = CASE WHEN attempt = 0 THEN 3 ELSE 1 END, \
             expires_at = CASE WHEN attempt = 0 THEN window_end ELSE expires_at END, \
             lease_until = CASE WHEN attempt = 0 THEN lease_until ELSE 0 END \
             WHERE key = ? AND token = ? AND (state = 1 OR (state = 4 AND attempt = 0))",
        );
        let values = vec![key_value(key), token_value(token)];
        let done = self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(failed)?;
        if done.rows_affected() == 1 { Ok(()) } else { Err(LedgerError::Fenced) }
    }

    async fn lookup_now(&self, key: &Key, now: u64) -> Result<Option<StatusReport>, LedgerError> {
        let backend = self.backend();
        let sql = sql(backend, &format!("SELECT {FOUND_COLUMNS} FROM idem_records WHERE key = ?"));
        let statement = Statement::from_sql_and_values(backend, sql, vec![key_value(key)]);
        let Some(row) = self.db.query_one_raw(statement).await.map_err(failed)? else { return Ok(None) };
        let found = Found::read(&row)?;
        Ok((!found.view().expired(now)).then(|| found.report(now, false)))
    }

    async fn status_now(
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
    async fn find(
        &self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
        now: u64,
    ) -> Result<Option<Found>, LedgerError> {
        let (visible, mut values) = visible_to(tenant, subject, reference);
        values.push(millis(now));
        let text = format!(
            "SELECT {FOUND_COLUMNS} FROM idem_records \
             WHERE {visible} AND NOT (expires_at <= ? AND state IN (2, 3)) ORDER BY key LIMIT 1"
        );
        self.found(&text, values).await
    }

    /// The newest superseded record of `tenant` whose key starts with `reference` (that
    /// `subject` may see, if given).
    async fn find_superseded(
        &self,
        tenant: TenantTag,
        subject: Option<SubjectTag>,
        reference: Ref,
    ) -> Result<Option<Found>, LedgerError> {
        let (visible, values) = visible_to(tenant, subject, reference);
        let text =
            format!("SELECT {FOUND_COLUMNS} FROM idem_superseded WHERE {visible} ORDER BY window_end DESC LIMIT 1");
        self.found(&text, values).await
    }

    /// The one record `text` (`?` placeholders, `FOUND_COLUMNS`) selects, if any.
    async fn found(&self, text: &str, values: Vec<sea_orm::Value>) -> Result<Option<Found>, LedgerError> {
        let backend = self.backend();
        let statement = Statement::from_sql_and_values(backend, sql(backend, text), values);
        let row = self.db.query_one_raw(statement).await.map_err(failed)?;
        row.map(|row| Found::read(&row)).transpose()
    }

    async fn resolve_now(
        &self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> Result<(), LedgerError> {
        let current = self.find(tenant, None, reference, now).await?;
        let (found, table) = match current {
            Some(found) if found.resolvable(now) => (found, "idem_records"),
            current => match (self.find_superseded(tenant, None, reference).await?, current) {
                (Some(old), _) if old.resolvable(now) => (old, "idem_superseded"),
                (_, Some(found)) | (Some(found), None) => {
                    return Err(LedgerError::NotResolvable { state: found.state });
                }
                (None, None) => return Err(LedgerError::NotFound),
            },
        };
        let backend = self.backend();
        let (state, result) = match resolution {
            Resolution::Completed(bytes) => (State::Completed, Some(bytes)),
            Resolution::NothingHappened => (State::Failed, None),
        };
        let expires_at = settled_expiry(state, found.window_end, found.expires_at, keep_until);
        let sql = sql(
            backend,
            &format!(
                "UPDATE {table} SET state = ?, result = ?, expires_at = ? \
                 WHERE key = ? AND window_end = ? AND tenant = ? AND (state = 4 OR (state = 1 AND lease_until <= ?))"
            ),
        );
        let values = vec![
            state_value(state),
            bytes_opt(result),
            millis(expires_at),
            key_value(&found.key),
            millis(found.window_end),
            tenant_value(tenant),
            millis(now),
        ];
        let done = self.db.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.map_err(failed)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // It changed meanwhile (its holder finished, another operator answered).
        match self.status_now(tenant, None, reference, now).await? {
            Some(report) => Err(LedgerError::NotResolvable { state: report.state }),
            None => Err(LedgerError::NotFound),
        }
    }

    async fn sweep_now(&self, now: u64, limit: usize) -> Result<usize, LedgerError> {
        let mut swept = 0;
        for table in ["idem_records", "idem_superseded"] {
            let room = limit.saturating_sub(swept);
            if room == 0 {
                break;
            }
            swept += self.sweep_table(table, now, room).await?;
        }
        if swept > 0 {
            tracing::debug!(swept, "swept expired records");
        }
        Ok(swept)
    }

    async fn sweep_table(&self, table: &str, now: u64, limit: usize) -> Result<usize, LedgerError> {
        let backend = self.backend();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // `expires_at` is never before `window_end`: naming both lets the current table's sweep
        // range-scan its `window_end` index (completion changes `expires_at`, so indexing it
        // would cost every completion its HOT update).
        let (doomed, order) = if table == "idem_records" {
            ("window_end <= ? AND expires_at <= ? AND (state <> 1 OR lease_until <= ?)", "window_end")
        } else {
            ("? > 0 AND expires_at <= ? AND (state <> 1 OR lease_until <= ?)", "expires_at")
        };
        // The outer condition is checked again on the row the DELETE locks, so a record claimed
        // afresh between the subquery and the delete is spared.
        let (text, values) = if backend == DbBackend::MySql {
            (
                format!("DELETE FROM {table} WHERE {doomed} ORDER BY {order} LIMIT ?"),
                vec![millis(now), millis(now), millis(now), sea_orm::Value::BigInt(Some(limit))],
            )
        } else {
            let (id, columns) =
                if table == "idem_records" { ("key", "key") } else { ("(key, window_end)", "key, window_end") };
            (
                format!(
                    "DELETE FROM {table} WHERE {id} IN (SELECT {columns} FROM {table} WHERE {doomed} \
                     ORDER BY {order} LIMIT ?) AND {doomed}"
                ),
                vec![
                    millis(now),
                    millis(now),
                    millis(now),
                    sea_orm::Value::BigInt(Some(limit)),
                    millis(now),
                    millis(now),
                    millis(now),
                ],
            )
        };
        let statement = Statement::from_sql_and_values(backend, sql(backend, &text), values);
        let done = self.db.execute_raw(statement).await.map_err(failed)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn now_ms(&self) -> Result<Option<u64>, LedgerError> {
        if let Some(clock) = &self.clock {
            return Ok(Some(clock.now_ms()));
        }
        let backend = self.backend();
        let text = match backend {
            DbBackend::Postgres => "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            DbBackend::MySql => "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            _ => "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        };
        let row = self.db.query_one_raw(Statement::from_string(backend, text)).await.map_err(failed)?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(to_u64(row.try_get_by_index::<i64>(0).map_err(corrupt)?)))
    }
}

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

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(self.resolve_now(tenant, reference, resolution, now, keep_until))
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(self.sweep_now(now, limit))
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        Box::pin(self.now_ms())
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
}

/// The compare-and-set `UPDATE` that takes `row` as read: its `WHERE` names the version read
/// (token, state, lease), so of two claimers that read the same version only one takes it.
fn take_statement(backend: DbBackend, request: &ClaimRequest, row: &Row, take: &Take) -> Statement {
    let (set, mut values) = match take {
        Take::Fresh => (
            "state = 1, token = ?, attempt = 0, created_at = ?, window_end = ?, expires_at = ?, lease_until = ?, \
             fingerprint = ?, arg_tags = ?, result = NULL, tenant = ?, subject = ?",
            vec![
                token_value(request.token),
                millis(request.now),
                millis(request.window_end),
                millis(request.expires_at),
                millis(request.lease_until),
                sea_orm::Value::Bytes(Some(request.fingerprint.to_vec())),
                sea_orm::Value::Bytes(Some(tags_bytes(&request.arg_tags))),
                tenant_value(request.tenant),
                subject_value(request.subject),
            ],
        ),
        Take::Unknown => ("state = 4", Vec::new()),
        Take::Over(attempt) => (
            "token = ?, attempt = ?, lease_until = ?",
            vec![token_value(request.token), attempt_value(*attempt), millis(request.lease_until)],
        ),
    };
    values.extend([key_value(&request.key), token_value(row.token), state_value(row.state), millis(row.lease_until)]);
    let text = format!("UPDATE idem_records SET {set} WHERE key = ? AND token = ? AND state = ? AND lease_until = ?");
    Statement::from_sql_and_values(backend, sql(backend, &text), values)
}

/// The completion's `UPDATE` on `table` for an outcome recorded as `state`: parameters state,
/// result, then `keep_until` twice unless `state` is failed, then key and token.
fn complete_sql(table: &str, state: State) -> String {
    let expires = match state {
        State::Completed => "CASE WHEN window_end > ? THEN window_end ELSE ? END",
        State::Failed => "window_end",
        State::InProgress | State::Unknown => "CASE WHEN expires_at > ? THEN expires_at ELSE ? END",
    };
    format!(
        "UPDATE {table} SET state = ?, result = ?, expires_at = {expires} \
         WHERE key = ? AND token = ? AND state IN (1, 4)"
    )
}

/// The PostgreSQL claim: `$1` key, `$2` tenant, `$3` token, `$4` now, `$5` window_end,
/// `$6` expires_at, `$7` lease_until, `$8` fingerprint, `$9` arg_tags, `$10` subject. Returns `1` and the new
/// row, or `0` and the row in the way.
#[doc(hidden)]
pub const POSTGRES_CLAIM: &str = "WITH claimed AS (
            INSERT INTO idem_records (key, tenant, state, token, attempt, created_at, window_end, expires_at,
                                      lease_until, fingerprint, arg_tags, result, subject)
            VALUES ($1, $2, 1, $3, 0, $4, $5, $6, $7, $8, $9, NULL, $10)
            ON CONFLICT (key) DO NOTHING
            RETURNING state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint,
                      arg_tags, result
        )
        SELECT 1::smallint AS claimed, state, token, attempt, created_at, window_end, expires_at, lease_until,
               fingerprint, arg_tags, result FROM claimed
        UNION ALL
        SELECT 0::smallint, state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint,
               arg_tags, result
        FROM idem_records WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)";

/// The SQLite claim of an absent key, parameters as [`POSTGRES_CLAIM`]'s (`?1`…`?10`); returns a
/// row only when it claimed.
#[doc(hidden)]
pub const SQLITE_CLAIM: &str = "INSERT INTO idem_records (key, tenant, state, token, attempt, created_at, window_end,
                expires_at, lease_until, fingerprint, arg_tags, result, subject)
            VALUES (?1, ?2, 1, ?3, 0, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10)
            ON CONFLICT (key) DO NOTHING
            RETURNING state";

/// The MySQL claim of an absent key, parameters as [`POSTGRES_CLAIM`]'s.
#[doc(hidden)]
pub const MYSQL_CLAIM: &str = "INSERT INTO idem_records (`key`, tenant, state, token, attempt, created_at, window_end,
                expires_at, lease_until, fingerprint, arg_tags, result, subject)
            VALUES (?, ?, 1, ?, 0, ?, ?, ?, ?, ?, ?, NULL, ?)";

/// The completion of a completed result: state, result, `keep_until` twice, key, token (`?`
/// placeholders; see [`sql_for`]).
#[doc(hidden)]
pub const COMPLETE: &str = "UPDATE idem_records SET state = ?, result = ?, \
     expires_at = CASE WHEN window_end > ? THEN window_end ELSE ? END \
     WHERE key = ? AND token = ? AND state IN (1, 4)";

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
                window_end bigint NOT NULL,
                expires_at bigint NOT NULL,
                lease_until bigint NOT NULL,
                state smallint NOT NULL,
                attempt smallint NOT NULL DEFAULT 0,
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                fingerprint bytea NOT NULL,
                arg_tags bytea NOT NULL,
                result bytea,
                subject bigint NOT NULL DEFAULT 0
            )",
            "CREATE INDEX IF NOT EXISTS idem_records_window_end ON idem_records (window_end)",
            "DROP INDEX IF EXISTS idem_records_expires_at",
            "CREATE TABLE IF NOT EXISTS idem_superseded (
                tenant bigint NOT NULL,
                token bigint NOT NULL,
                created_at bigint NOT NULL,
                window_end bigint NOT NULL,
                expires_at bigint NOT NULL,
                lease_until bigint NOT NULL,
                state smallint NOT NULL,
                attempt smallint NOT NULL,
                key bytea NOT NULL CHECK (octet_length(key) = 32),
                fingerprint bytea NOT NULL,
                arg_tags bytea NOT NULL,
                result bytea,
                subject bigint NOT NULL DEFAULT 0,
                PRIMARY KEY (key, window_end)
            )",
            "CREATE INDEX IF NOT EXISTS idem_superseded_expires_at ON idem_superseded (expires_at)",
        ],
        DbBackend::MySql => &[
            "CREATE TABLE IF NOT EXISTS idem_records (
                `key` BINARY(32) NOT NULL PRIMARY KEY,
                tenant BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                attempt SMALLINT NOT NULL DEFAULT 0,
                token BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                window_end BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                lease_until BIGINT NOT NULL,
                fingerprint BINARY(32) NOT NULL,
                arg_tags LONGBLOB NOT NULL,
                result LONGBLOB NULL,
                subject BIGINT NOT NULL DEFAULT 0,
                INDEX idem_records_window_end (window_end)
            ) ENGINE=InnoDB",
            "CREATE TABLE IF NOT EXISTS idem_superseded (
                `key` BINARY(32) NOT NULL,
                window_end BIGINT NOT NULL,
                tenant BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                attempt SMALLINT NOT NULL,
                token BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                lease_until BIGINT NOT NULL,
                fingerprint BINARY(32) NOT NULL,
                arg_tags LONGBLOB NOT NULL,
                result LONGBLOB NULL,
                subject BIGINT NOT NULL DEFAULT 0,
                PRIMARY KEY (`key`, window_end),
                INDEX idem_superseded_expires_at (expires_at)
            ) ENGINE=InnoDB",
        ],
        _ => &[
            "CREATE TABLE IF NOT EXISTS idem_records (
                key BLOB PRIMARY KEY NOT NULL,
                tenant INTEGER NOT NULL,
                state INTEGER NOT NULL,
                attempt INTEGER NOT NULL DEFAULT 0,
                token INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                window_end INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                lease_until INTEGER NOT NULL,
                fingerprint BLOB NOT NULL,
                arg_tags BLOB NOT NULL,
                result BLOB,
                subject INTEGER NOT NULL DEFAULT 0
            ) WITHOUT ROWID",
            "CREATE INDEX IF NOT EXISTS idem_records_window_end ON idem_records (window_end)",
            "DROP INDEX IF EXISTS idem_records_expires_at",
            "CREATE TABLE IF NOT EXISTS idem_superseded (
                key BLOB NOT NULL,
                window_end INTEGER NOT NULL,
                tenant INTEGER NOT NULL,
                state INTEGER NOT NULL,
                attempt INTEGER NOT NULL,
                token INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                lease_until INTEGER NOT NULL,
                fingerprint BLOB NOT NULL,
                arg_tags BLOB NOT NULL,
                result BLOB,
                subject INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (key, window_end)
            ) WITHOUT ROWID",
            "CREATE INDEX IF NOT EXISTS idem_superseded_expires_at ON idem_superseded (expires_at)",
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
const ROW_COLUMNS: &str =
    "state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint, arg_tags, result";

/// The columns a status lookup reads, in this order.
const FOUND_COLUMNS: &str = "key, state, created_at, window_end, expires_at, lease_until, result";

/// A record as a claim reads it.
struct Row {
    state: State,
    token: Token,
    attempt: Won,
    created_at: u64,
    window_end: u64,
    expires_at: u64,
    lease_until: u64,
    fingerprint: Vec<u8>,
    arg_tags: Vec<[u8; 4]>,
    result: Option<Vec<u8>>,
}

impl Row {
    fn read(row: &QueryResult, first: usize) -> Result<Self, LedgerError> {
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
}

/// A record as a status lookup reads it.
struct Found {
    key: Key,
    state: State,
    created_at: u64,
    window_end: u64,
    expires_at: u64,
    lease_until: u64,
    result: Option<Vec<u8>>,
}

impl Found {
    fn read(row: &QueryResult) -> Result<Self, LedgerError> {
        let key: Vec<u8> = row.try_get_by_index(0).map_err(corrupt)?;
        let key: [u8; 32] =
            key.try_into().map_err(|_| LedgerError::Corrupt { detail: "a key is not 32 bytes".into() })?;
        let int = |at: usize| row.try_get_by_index::<i64>(at).map_err(corrupt).map(to_u64);
        Ok(Self {
            key: Key::from_bytes(key),
            state: state_of(row.try_get_by_index::<i16>(1).map_err(corrupt)?)?,
            created_at: int(2)?,
            window_end: int(3)?,
            expires_at: int(4)?,
            lease_until: int(5)?,
            result: row.try_get_by_index::<Option<Vec<u8>>>(6).map_err(corrupt)?,
        })
    }

    fn view(&self) -> RecordView<'_> {
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

    fn resolvable(&self, now: u64) -> bool {
        self.view().resolvable(now)
    }

    fn report(self, now: u64, superseded: bool) -> StatusReport {
        StatusReport {
            reference: self.key.reference(),
            state: self.state,
            created_at: self.created_at,
            window_end: self.window_end,
            expires_at: self.expires_at,
            lease_expired: self.view().lease_expired(now),
            result: self.result,
            superseded,
        }
    }
}

/// The values of a claim's INSERT, in the order of [`POSTGRES_CLAIM`]'s parameters.
fn insert_values(request: &ClaimRequest) -> Vec<sea_orm::Value> {
    vec![
        key_value(&request.key),
        tenant_value(request.tenant),
        token_value(request.token),
        millis(request.now),
        millis(request.window_end),
        millis(request.expires_at),
        millis(request.lease_until),
        sea_orm::Value::Bytes(Some(request.fingerprint.to_vec())),
        sea_orm::Value::Bytes(Some(tags_bytes(&request.arg_tags))),
        subject_value(request.subject),
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

/// What a failed statement means for its caller: a connection that could not be had, or a
/// statement the server refused, wrote nothing ([`LedgerError::Unavailable`]); a statement whose
/// answer was lost on the way (I/O, protocol) may have committed ([`LedgerError::Ambiguous`]).
fn failed(error: DbErr) -> LedgerError {
    use sea_orm::sqlx::Error as Sqlx;
    let detail = error.to_string();
    match &error {
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(inner)) | DbErr::Query(sea_orm::RuntimeErr::SqlxError(inner))
            if matches!(
                **inner,
                Sqlx::Io(_) | Sqlx::Protocol(_) | Sqlx::Tls(_) | Sqlx::WorkerCrashed | Sqlx::Decode(_)
            ) =>
        {
            LedgerError::Ambiguous { detail }
        }
        _ => LedgerError::Unavailable { detail },
    }
}

fn corrupt(error: DbErr) -> LedgerError {
    LedgerError::Corrupt { detail: error.to_string() }
}

fn state_of(code: i16) -> Result<State, LedgerError> {
    State::from_code(code).ok_or_else(|| LedgerError::Corrupt { detail: format!("unknown record state {code}") })
}

fn attempt_of(code: i16) -> Result<Won, LedgerError> {
    Won::from_code(code).ok_or_else(|| LedgerError::Corrupt { detail: format!("unknown claim attempt {code}") })
}

fn state_value(state: State) -> sea_orm::Value {
    sea_orm::Value::SmallInt(Some(state.code()))
}

fn attempt_value(attempt: Won) -> sea_orm::Value {
    sea_orm::Value::SmallInt(Some(attempt.code()))
}

fn key_value(key: &Key) -> sea_orm::Value {
    sea_orm::Value::Bytes(Some(key.as_bytes().to_vec()))
}

fn tenant_value(tenant: TenantTag) -> sea_orm::Value {
    sea_orm::Value::BigInt(Some(i64::from_be_bytes(tenant.0)))
}

fn subject_value(subject: SubjectTag) -> sea_orm::Value {
    sea_orm::Value::BigInt(Some(i64::from_be_bytes(subject.0)))
}

/// The condition (and its values) of a status lookup: keys starting with `reference`, of
/// `tenant`, and — when a subject is given — the subject's own or tenant-wide (0).
fn visible_to(tenant: TenantTag, subject: Option<SubjectTag>, reference: Ref) -> (&'static str, Vec<sea_orm::Value>) {
    let (low, high) = ref_range(reference);
    let mut values = vec![sea_orm::Value::Bytes(Some(low)), sea_orm::Value::Bytes(Some(high)), tenant_value(tenant)];
    match subject {
        Some(subject) => {
            values.extend([subject_value(SubjectTag::TENANT), subject_value(subject)]);
            ("key >= ? AND key <= ? AND tenant = ? AND subject IN (?, ?)", values)
        }
        None => ("key >= ? AND key <= ? AND tenant = ?", values),
    }
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
