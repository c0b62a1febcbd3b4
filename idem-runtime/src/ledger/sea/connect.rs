//! How a [`SeaOrmLedger`] comes to be: from a URL, from pool options or from the environment
//! (each connects and migrates), or around a connection you opened (which does not migrate) —
//! and which secret a handle without one configured gets from it.

use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend};

use super::SeaOrmLedger;
use super::error::failed;
use crate::ledger::LedgerError;

/// The environment variable naming the ledger database.
pub const DATABASE_URL_ENV: &str = "IDEM_DATABASE_URL";

/// Where the ledger lives when [`DATABASE_URL_ENV`] is unset: a SQLite file under the current
/// directory.
pub const DEFAULT_SQLITE_URL: &str = "sqlite://.idem/ledger.sqlite3?mode=rwc";

impl SeaOrmLedger {
    /// Connects to `url` (`sqlite://path?mode=rwc`, `sqlite::memory:`, `postgres://…`,
    /// `mysql://…`) with [`SeaOrmLedger::connect_options`], and migrates.
    ///
    /// SQLite files are opened in WAL mode with `synchronous=FULL` — a claim lost to a power cut
    /// would be a duplicate waiting to happen, so durability wins over the ~1 ms it costs — and a
    /// 10 s busy timeout.
    ///
    /// # Errors
    /// The database cannot be reached, or the tables cannot be created.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with(Self::connect_options(url)).await
    }

    /// Connects with your own pool options (start from [`SeaOrmLedger::connect_options`]), and
    /// migrates, as [`SeaOrmLedger::connect`] does.
    ///
    /// # Errors
    /// The database cannot be reached, or the tables cannot be created.
    pub async fn connect_with(options: ConnectOptions) -> Result<Self, LedgerError> {
        let url = options.get_url().to_owned();
        let db = Database::connect(options).await.map_err(failed)?;
        let own_secret = OwnSecret::of(db.get_database_backend(), Some(&url));
        let ledger = Self { db, clock: None, own_secret };
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
                std::fs::create_dir_all(".idem").map_err(|error| {
                    LedgerError::unavailable(format!("cannot create the ledger directory `.idem`: {error}"))
                        .with_source(error)
                })?;
                Self::connect(DEFAULT_SQLITE_URL).await
            }
        }
    }

    /// Wraps a sea-orm connection (pool) you opened, as it is: it does **not** migrate. Run
    /// [`SeaOrmLedger::migrate`] once, or apply [`super::schema`] from your own migration step.
    /// Open it with [`SeaOrmLedger::connect_options`] to get the settings
    /// [`SeaOrmLedger::connect`] uses. Its file unknown, a SQLite ledger made this way has no
    /// default secret: configure one.
    #[must_use]
    pub fn from_connection(db: DatabaseConnection) -> Self {
        let own_secret = OwnSecret::of(db.get_database_backend(), None);
        Self { db, clock: None, own_secret }
    }

    /// The connection options [`SeaOrmLedger::connect`] uses for `url`: no statement logging,
    /// 5 s connect and acquire timeouts, a ping only for connections idle 30 s, and for SQLite
    /// WAL, `synchronous=FULL` and a 10 s busy timeout. Adjust them (the pool size, say) and pass
    /// them to [`SeaOrmLedger::connect_with`].
    #[must_use]
    pub fn connect_options(url: &str) -> ConnectOptions {
        let mut options = ConnectOptions::new(url.to_owned());
        options.sqlx_logging(false).connect_timeout(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(5));
        // A pooled connection is pinged only after it sat idle: saves a round trip per statement.
        options.test_before_acquire_if_idle_for(Duration::from_secs(30));
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            super::sqlite::configure(&mut options, url);
        }
        options
    }
}

/// The secret a SQL ledger offers a handle that has none configured.
#[derive(Clone, Debug)]
pub(super) enum OwnSecret {
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
            (_, Some(url)) if super::sqlite::in_memory(url) => Self::Ephemeral,
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
