//! Choosing a ledger by its URL: `redis://…` and `redis+cluster://…` open the Redis ledger
//! (feature `redis`), anything else the SQL ledger (features `sqlite`, `postgres`, `mysql`).

use std::sync::Arc;

use super::{DATABASE_URL_ENV, Ledger, LedgerError};

/// Whether `url` names a Redis (or Valkey) server or cluster.
#[must_use]
pub fn is_redis_url(url: &str) -> bool {
    let scheme = url.trim().split_once("://").map_or("", |(scheme, _)| scheme);
    ["redis", "rediss", "valkey", "valkeys"].contains(&scheme.split('+').next().unwrap_or(""))
}

/// Connects to the ledger at `url`, whichever kind it names — `redis://host:port`,
/// `redis+cluster://host:port,…` (`RedisLedger::connect`, feature `redis`), or a SQL URL or
/// SQLite path (`SeaOrmLedger::connect`, features `sqlite`, `postgres`, `mysql`; it creates its
/// tables) — and logs one line naming it.
///
/// # Errors
/// As the ledger's own `connect`; a URL of a kind this build has no feature for says which
/// feature to turn on.
pub async fn connect(url: &str) -> Result<Arc<dyn Ledger>, LedgerError> {
    if is_redis_url(url) {
        #[cfg(feature = "redis")]
        return Ok(Arc::new(super::redis::RedisLedger::connect(url.trim()).await?));
        #[cfg(not(feature = "redis"))]
        return Err(missing("a Redis ledger", "redis"));
    }
    #[cfg(feature = "_sea")]
    return Ok(Arc::new(super::sea::SeaOrmLedger::connect(url).await?));
    #[cfg(not(feature = "_sea"))]
    Err(missing("a SQL ledger", "sqlite, postgres or mysql"))
}

/// Connects to the ledger [`DATABASE_URL_ENV`] names, as [`connect`] does; when it is unset,
/// to the SQL ledger's default SQLite file of `program`
/// (`SeaOrmLedger::from_env`: pass `env!("CARGO_PKG_NAME")`, so a renamed executable keeps its
/// ledger).
///
/// # Errors
/// As [`connect`]; the message names [`DATABASE_URL_ENV`].
pub async fn from_env(program: &str) -> Result<Arc<dyn Ledger>, LedgerError> {
    let url = std::env::var(DATABASE_URL_ENV).unwrap_or_default();
    if is_redis_url(&url) {
        return connect(&url).await;
    }
    #[cfg(feature = "_sea")]
    return Ok(Arc::new(super::sea::SeaOrmLedger::from_env(program).await?));
    #[cfg(not(feature = "_sea"))]
    {
        let _ = program;
        Err(missing("a SQL ledger", "sqlite, postgres or mysql"))
    }
}

#[cfg(any(not(feature = "redis"), not(feature = "_sea")))]
fn missing(what: &str, features: &str) -> LedgerError {
    LedgerError::unavailable(format!(
        "this build of idem has no {what}: turn on idem-runtime's feature {features}, or set {DATABASE_URL_ENV} to \
         a ledger of a kind it has"
    ))
}

#[cfg(test)]
mod tests {
    use super::is_redis_url;

    #[test]
    fn redis_urls_are_told_from_sql_ones() {
        for url in ["redis://h:6379", "redis+cluster://a:1,b:2", "valkey://h", "rediss://h"] {
            assert!(is_redis_url(url), "{url}");
        }
        for url in ["postgres://u@h/db", "sqlite:///x", "/var/lib/redis.sqlite3", "redis.db", ""] {
            assert!(!is_redis_url(url), "{url}");
        }
    }
}
