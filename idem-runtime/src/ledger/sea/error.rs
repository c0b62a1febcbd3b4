//! What a failed statement means for the ledger's caller: nothing written, maybe written, or a
//! record that cannot be read.

use sea_orm::DbErr;

use crate::ledger::LedgerError;

/// Whether `error` is the unique key refusing a second record.
pub(super) fn is_duplicate(error: &DbErr) -> bool {
    matches!(error.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}

/// Whether `error` is the server choosing this statement as a deadlock's victim: InnoDB's
/// `ER_LOCK_DEADLOCK` (SQLSTATE `40001`, which MariaDB and MySQL also give a serialization
/// failure) or PostgreSQL's `40P01`. The statement was rolled back whole, and nothing else was in
/// its transaction where the callers of this run it on its own: running it again is safe.
pub(super) fn is_deadlock(error: &DbErr) -> bool {
    match error {
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(inner)) | DbErr::Query(sea_orm::RuntimeErr::SqlxError(inner)) => {
            match &**inner {
                sea_orm::sqlx::Error::Database(server) => matches!(server.code().as_deref(), Some("40001" | "40P01")),
                _ => false,
            }
        }
        _ => false,
    }
}

/// What a failed statement means for its caller: a connection that could not be had, or a
/// statement the server refused, wrote nothing ([`LedgerError::Unavailable`]); a statement whose
/// answer was lost on the way (I/O, protocol) may have committed ([`LedgerError::Ambiguous`]).
pub(super) fn failed(error: DbErr) -> LedgerError {
    use sea_orm::sqlx::Error as Sqlx;
    let detail = error.to_string();
    let failure = match &error {
        DbErr::Exec(sea_orm::RuntimeErr::SqlxError(inner)) | DbErr::Query(sea_orm::RuntimeErr::SqlxError(inner))
            if matches!(
                **inner,
                Sqlx::Io(_) | Sqlx::Protocol(_) | Sqlx::Tls(_) | Sqlx::WorkerCrashed | Sqlx::Decode(_)
            ) =>
        {
            LedgerError::ambiguous(detail)
        }
        _ => LedgerError::unavailable(detail),
    };
    failure.with_source(error)
}

/// A value that cannot be read back as what it should be.
pub(super) fn corrupt(error: DbErr) -> LedgerError {
    LedgerError::corrupt(error.to_string()).with_source(error)
}

/// A failed statement in a handler's own transaction (`Operation::complete_in`) reads as the
/// ledger's would: nothing written, or maybe written.
impl From<DbErr> for LedgerError {
    fn from(error: DbErr) -> Self {
        failed(error)
    }
}
