//! What a failed statement means for the ledger's caller: nothing written, maybe written, or a
//! record that cannot be read.

use sea_orm::DbErr;

use crate::ledger::LedgerError;

/// Whether `error` is the unique key refusing a second record.
pub(super) fn is_duplicate(error: &DbErr) -> bool {
    matches!(error.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}

/// What a failed statement means for its caller: a connection that could not be had, or a
/// statement the server refused, wrote nothing ([`LedgerError::Unavailable`]); a statement whose
/// answer was lost on the way (I/O, protocol) may have committed ([`LedgerError::Ambiguous`]).
pub(super) fn failed(error: DbErr) -> LedgerError {
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

/// A value that cannot be read back as what it should be.
pub(super) fn corrupt(error: DbErr) -> LedgerError {
    LedgerError::Corrupt { detail: error.to_string() }
}
