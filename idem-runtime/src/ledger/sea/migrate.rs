//! The schema and its migration: creating the tables and indexes, and bringing a table made by
//! an earlier version up to date — safe to run on every start, from every replica at once.

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use super::error::{corrupt, failed};
use super::statements::{AddColumn, Migration};
use super::{SeaOrmLedger, mysql};
use crate::ledger::LedgerError;

impl SeaOrmLedger {
    /// Creates the tables and their indexes if they do not exist, and brings a table created by
    /// an earlier version up to date. Safe to run on every start, from every replica at once.
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
        // The tables first; indexes once a table made by an earlier version has its new columns.
        let (indexes, tables): (Vec<&str>, Vec<&str>) =
            migration.schema.iter().partition(|statement| statement.contains(" INDEX IF "));
        for statement in tables {
            txn.execute_unprepared(statement).await.map_err(failed)?;
        }
        txn.commit().await.map_err(failed)?;
        self.upgrade(migration).await?;
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
            let statement = Statement::from_sql_and_values(DbBackend::MySql, mysql::INDEX_COUNT, vec![name.into()]);
            let row = self.db.query_one_raw(statement).await.map_err(failed)?;
            let count = row.map(|row| row.try_get_by_index::<i64>(0)).transpose().map_err(corrupt)?;
            Ok::<_, LedgerError>(count.unwrap_or(0) > 0)
        };
        for (name, wanted, change) in mysql::INDEX_CHANGES {
            if has(name).await? != wanted && self.db.execute_unprepared(change).await.is_err() {
                // Another replica may have made the same change meanwhile.
                if has(name).await? != wanted {
                    return Err(LedgerError::unavailable(format!("could not migrate the index {name}")));
                }
            }
        }
        Ok(())
    }

    /// Adds what a table made by idem 0.1's first schema lacks: the `attempt` and `window_end`
    /// columns (the old `expires_at` was the window end; unsettled records get the default
    /// unsettled retention on top of it) and, on MySQL, an unbounded `arg_tags`.
    async fn upgrade(&self, migration: &Migration) -> Result<(), LedgerError> {
        let probe = migration.probe_upgrade;
        if self.db.execute_unprepared(probe).await.is_err() {
            match self.add_columns(migration).await {
                // Another replica may have upgraded the table meanwhile (MySQL and SQLite cannot
                // say `ADD COLUMN IF NOT EXISTS`): what counts is that the columns are there now.
                Err(_) if self.db.execute_unprepared(probe).await.is_ok() => {}
                done => done?,
            }
        }
        for table in [
            &migration.add_subject.records,
            &migration.add_subject.superseded,
            &migration.add_label.records,
            &migration.add_label.superseded,
        ] {
            self.add_column(table).await?;
        }
        Ok(())
    }

    /// Adds a column to a table if it lacks it: `subject` (issue 11; records made before it get
    /// 0, visible to their whole tenant as they were) and `label` (issue 17; none before it).
    async fn add_column(&self, table: &AddColumn) -> Result<(), LedgerError> {
        if self.db.execute_unprepared(table.probe).await.is_ok() {
            return Ok(());
        }
        match self.db.execute_unprepared(table.add).await {
            Ok(_) => Ok(()),
            // Another replica added it meanwhile.
            Err(_) if self.db.execute_unprepared(table.probe).await.is_ok() => Ok(()),
            Err(error) => Err(failed(error)),
        }
    }

    async fn add_columns(&self, migration: &Migration) -> Result<(), LedgerError> {
        let backend = self.backend();
        let txn = self.db.begin().await.map_err(failed)?;
        if let Some(lock) = migration.lock {
            txn.execute_unprepared(lock).await.map_err(failed)?;
        }
        for statement in migration.add_columns {
            txn.execute_unprepared(statement).await.map_err(failed)?;
        }
        let retention = i64::try_from(crate::idem::DEFAULT_UNSETTLED_RETENTION.as_millis()).unwrap_or(i64::MAX);
        let carry = Statement::from_sql_and_values(backend, migration.carry, vec![retention.into()]);
        txn.execute_raw(carry).await.map_err(failed)?;
        txn.commit().await.map_err(failed)
    }
}

/// The statements [`SeaOrmLedger::migrate`] runs for `backend`, for use in your own migrations.
#[must_use]
pub fn schema(backend: DbBackend) -> &'static [&'static str] {
    Migration::of(backend).schema
}
