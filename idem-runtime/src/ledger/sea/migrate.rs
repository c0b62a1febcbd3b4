//! The schema and its migration: creating the tables and indexes if they do not exist, and
//! bringing a table made by an earlier version up to date — safe to run on every start, from
//! every replica at once.

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use super::SeaOrmLedger;
use super::error::{corrupt, failed};
use super::statements::{AddColumn, Migration};
use crate::ledger::LedgerError;

impl SeaOrmLedger {
    /// Creates the tables and their indexes if they do not exist, and brings a table made by an
    /// earlier version up to date. Safe to run on every start, from every replica at once.
    ///
    /// # Errors
    /// The statements fail (permissions, an incompatible table of the same name).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let backend = self.backend();
        let migration = Migration::of(backend);
        let txn = self.db.begin().await.map_err(failed)?;
        if let Some(lock) = migration.lock {
            txn.execute_unprepared(lock).await.map_err(failed)?;
        }
        for statement in migration.schema {
            txn.execute_unprepared(statement).await.map_err(failed)?;
        }
        txn.commit().await.map_err(failed)?;
        if self.add_column(&migration.add_live_until).await? {
            self.carry_live_until().await?;
        }
        Ok(())
    }

    /// Adds a column to a table that lacks it; whether this call added it.
    async fn add_column(&self, column: &AddColumn) -> Result<bool, LedgerError> {
        if self.db.execute_unprepared(column.probe).await.is_ok() {
            return Ok(false);
        }
        match self.db.execute_unprepared(column.add).await {
            Ok(_) => Ok(true),
            // Another replica added it meanwhile (MySQL and SQLite cannot say `ADD COLUMN IF NOT
            // EXISTS`): what counts is that it is there now.
            Err(_) if self.db.execute_unprepared(column.probe).await.is_ok() => Ok(false),
            Err(error) => Err(failed(error)),
        }
    }

    /// A ledger made before secret versions kept their time (issue 41) that knows exactly one
    /// version keyed every record it holds under it: that version's operations may be repeated
    /// as long as its records live. With several versions, which one keyed a record cannot be
    /// told, and none is counted live (a guess would stop servers configured right); the first
    /// serving handle keeps its own version's time from then on.
    async fn carry_live_until(&self) -> Result<(), LedgerError> {
        let backend = self.backend();
        let one = |text: &str| Statement::from_string(backend, text.to_owned());
        let versions =
            self.db.query_one_raw(one("SELECT COUNT(*), MAX(version) FROM idem_secrets")).await.map_err(failed)?;
        let Some(versions) = versions else { return Ok(()) };
        let count = versions.try_get_by_index::<i64>(0).map_err(corrupt)?;
        let version = versions.try_get_by_index::<Option<i64>>(1).map_err(corrupt)?;
        let (1, Some(version)) = (count, version) else { return Ok(()) };
        let mut until = 0;
        for table in ["idem_records", "idem_superseded"] {
            let latest =
                self.db.query_one_raw(one(&format!("SELECT MAX(expires_at) FROM {table}"))).await.map_err(failed)?;
            let latest = latest.map(|row| row.try_get_by_index::<Option<i64>>(0)).transpose().map_err(corrupt)?;
            until = until.max(latest.flatten().and_then(|latest| u64::try_from(latest).ok()).unwrap_or(0));
        }
        let version = u32::try_from(version).map_err(|_| LedgerError::corrupt("a secret version is out of range"))?;
        if until > 0 {
            tracing::info!(
                version,
                until,
                "idem ledger upgraded: operations keyed under its one secret version may be repeated until its last \
                 record expires"
            );
            self.keep_live(version, until).await?;
        }
        Ok(())
    }
}

/// The statements [`SeaOrmLedger::migrate`] runs for `backend`, for use in your own migrations.
#[must_use]
pub fn schema(backend: DbBackend) -> &'static [&'static str] {
    Migration::of(backend).schema
}
