//! Whether this build has the driver a location needs: a feature left off is named before
//! anything is created or dialled. sea-orm's own words for it ("has no supporting driver") would
//! read as a wrong URL, and for the default SQLite file as a directory problem.

use super::location::{Location, Origin};
use crate::ledger::LedgerError;

/// The kinds of SQL ledger this build can open, as a user would write them. (Not Redis: only
/// `ledger::connect` and `ledger::from_env` open it, and this SQL ledger's constructors never.)
fn compiled() -> Vec<&'static str> {
    [
        (cfg!(feature = "sqlite"), "a SQLite file"),
        (cfg!(feature = "postgres"), "postgres://…"),
        (cfg!(feature = "mysql"), "mysql://…"),
    ]
    .into_iter()
    .filter_map(|(compiled, kind)| compiled.then_some(kind))
    .collect()
}

/// When this build has no driver for `location`'s kind of database (its feature is off): the
/// error that says which feature to turn on, and what else this build can open.
pub(super) fn missing(location: &Location) -> Option<LedgerError> {
    let (kind, origin) = location.kind();
    let (name, feature) = match kind? {
        "sqlite" if !cfg!(feature = "sqlite") => ("SQLite", "sqlite"),
        "postgres" if !cfg!(feature = "postgres") => ("PostgreSQL", "postgres"),
        "mysql" if !cfg!(feature = "mysql") => ("MySQL", "mysql"),
        _ => return None,
    };
    let instead = match origin {
        Origin::Env | Origin::Default => "set IDEM_DATABASE_URL to",
        Origin::Code | Origin::Connection | Origin::Given => "give",
    };
    Some(LedgerError::unavailable(format!(
        "cannot open {location}: this build of idem-runtime has no {name} driver (its feature `{feature}` is off). \
         Add \"{feature}\" to idem-runtime's features in Cargo.toml, or {instead} a ledger this build has ({has})",
        has = compiled().join(", ")
    )))
}
