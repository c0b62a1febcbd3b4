//! The schema and its migration: creating the tables and indexes if they do not exist — safe to
//! run on every start, from every replica at once.

use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

use super::SeaOrmLedger;
use super::error::failed;
use super::statements::Migration;
use crate::ledger::LedgerError;

impl SeaOrmLedger {
    /// Creates the tables and their indexes if they do not exist. Safe to run on every start,
    /// from every replica at once.
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
        txn.commit().await.map_err(failed)
    }
}

/// The statements [`SeaOrmLedger::migrate`] runs for `backend`, for use in your own migrations.
#[must_use]
pub fn schema(backend: DbBackend) -> &'static [&'static str] {
    Migration::of(backend).schema
}
