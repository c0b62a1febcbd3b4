//! How a [`SeaOrmLedger`] comes to be: from a URL or a plain SQLite path, from pool options or
//! from the environment (each connects, migrates and logs one line naming the ledger), or around
//! a connection you opened (which does not migrate) — and which secret a handle without one
//! configured gets from it.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend};

use super::SeaOrmLedger;
use super::driver;
use super::error::failed;
use super::location::{DATABASE_URL_ENV, Found, Given, Location, Origin, default_path};
use crate::ledger::LedgerError;

impl SeaOrmLedger {
    /// Connects to `url` with [`SeaOrmLedger::connect_options`], and migrates: a URL
    /// (`sqlite://path?mode=rwc`, `sqlite::memory:`, `postgres://…`, `mysql://…`), or a plain
    /// path (`/var/lib/app/ledger.sqlite3`, `./ledger.db`): a SQLite file, created with its
    /// directory if missing.
    ///
    /// SQLite files are opened in WAL mode with `synchronous=FULL` — a claim lost to a power cut
    /// would be a duplicate waiting to happen, so durability wins over the ~1 ms it costs — and a
    /// 10 s busy timeout. Logs one line at INFO naming the ledger ([`SeaOrmLedger::describe`]).
    ///
    /// # Errors
    /// The database cannot be reached, or the tables cannot be created; the message names the
    /// file or the server (never a password) and says what to check.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::open(Given::parse(url), Origin::Code).await
    }

    /// Connects with your own pool options (start from [`SeaOrmLedger::connect_options`]), and
    /// migrates, as [`SeaOrmLedger::connect`] does.
    ///
    /// # Errors
    /// As [`SeaOrmLedger::connect`].
    pub async fn connect_with(options: ConnectOptions) -> Result<Self, LedgerError> {
        Self::open_with(options, Origin::Code).await
    }

    /// Connects to [`DATABASE_URL_ENV`] (a URL or a plain SQLite path, as
    /// [`SeaOrmLedger::connect`] takes), or, when it is unset, to the default SQLite file of
    /// `program` ([`SeaOrmLedger::default_path`], creating its directory), and migrates.
    ///
    /// `program` names your program for good: pass `env!("CARGO_PKG_NAME")`, your package's
    /// name, fixed when it is compiled — a renamed or moved executable keeps its ledger (and its
    /// secret), so its repeats are still answered. A new default ledger is logged at WARN,
    /// with where it is.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idem_runtime::ledger::LedgerError> {
    /// let ledger = idem_runtime::ledger::sea::SeaOrmLedger::from_env(env!("CARGO_PKG_NAME")).await?;
    /// # let _ = ledger; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`SeaOrmLedger::connect`]; the message names [`DATABASE_URL_ENV`] or the default.
    pub async fn from_env(program: &str) -> Result<Self, LedgerError> {
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::open(Given::parse(url.trim()), Origin::Env).await,
            _ => {
                let (path, found) = default_path(program)?;
                warn_of_the_old_default(&path);
                let ledger = Self::open(Given::Path(path.clone()), Origin::Default).await?;
                match found {
                    Found::Ledger => {}
                    Found::Earlier { instead_of } => tracing::info!(
                        "using the idem ledger at {}, where an earlier version kept the default by the executable's \
                         name; the default of {program} is now {} — move the ledger and its .secret file there \
                         together (or set IDEM_DATABASE_URL) to keep it whatever the executable is called",
                        path.display(),
                        instead_of.display()
                    ),
                    Found::Nothing => tracing::warn!(
                        "created a new idem ledger at {} (IDEM_DATABASE_URL unset: the default of {program}); its \
                         secret is made beside it on first use. No earlier operation is known to it: if this \
                         program kept its ledger elsewhere, set IDEM_DATABASE_URL to that file, or repeats of \
                         earlier operations run again",
                        path.display()
                    ),
                }
                Ok(ledger)
            }
        }
    }

    /// Where [`SeaOrmLedger::from_env`] keeps the ledger of `program` when [`DATABASE_URL_ENV`]
    /// is unset: `idem/<program>/ledger.sqlite3` under this user's data directory —
    /// `$XDG_DATA_HOME` or `~/.local/share` (Linux and other Unix), `~/Library/Application
    /// Support` (macOS), `%LOCALAPPDATA%` (Windows) — with its secret beside it
    /// (`ledger.sqlite3.secret`). A ledger kept where earlier versions put the default —
    /// `idem/<executable's name>/` — while none is at the program's place is that one.
    ///
    /// Per program, not per working directory: a desktop host starts a stdio server from
    /// wherever it likes (often `/`, or its own folder), and a ledger that moved with the working
    /// directory would forget every operation, so a repeat would run again. And per program, not
    /// per executable file: renaming the binary keeps it.
    ///
    /// # Errors
    /// The data directory's variable is unset (or not an absolute path), or `program` cannot
    /// name a directory; the message says to set [`DATABASE_URL_ENV`].
    pub fn default_path(program: &str) -> Result<std::path::PathBuf, LedgerError> {
        default_path(program).map(|(path, _)| path)
    }

    /// One line naming this ledger for an operator, never a password — what `connect`,
    /// `connect_with` and `from_env` log at INFO on connecting:
    /// `idem ledger: sqlite file /home/u/.local/share/idem/app/ledger.sqlite3 (IDEM_DATABASE_URL
    /// unset: the default)`, `idem ledger: postgres database app at db.internal:5432 (from
    /// IDEM_DATABASE_URL)`.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("idem ledger: {}", self.location)
    }

    /// Opens what was `given`, chosen by `origin`: a plain path gets its directory first.
    async fn open(given: Given, origin: Origin) -> Result<Self, LedgerError> {
        if let Some(refusal) = driver::missing(&Location::of_url(&given.url(), origin)) {
            return Err(refusal);
        }
        if let Given::Path(path) = &given {
            let dir = std::path::absolute(path).ok().and_then(|path| path.parent().map(std::path::Path::to_owned));
            if let Some(dir) = dir.filter(|dir| !dir.as_os_str().is_empty()) {
                std::fs::create_dir_all(&dir).map_err(|error| {
                    let detail = Location::of_path(path, origin)
                        .cannot(&format!("cannot create its directory {}: {error}", dir.display()), None);
                    LedgerError::unavailable(detail).with_source(error)
                })?;
            }
        }
        Self::open_with(Self::connect_options(&given.url()), origin).await
    }

    /// Connects with `options`, chosen by `origin`, migrates, and logs the line naming the ledger.
    async fn open_with(options: ConnectOptions, origin: Origin) -> Result<Self, LedgerError> {
        let url = options.get_url().to_owned();
        let location = Location::of_url(&url, origin);
        if let Some(refusal) = driver::missing(&location) {
            return Err(refusal);
        }
        let db = Database::connect(options).await.map_err(|error| location.refused(failed(error), Some(&url)))?;
        let own_secret = OwnSecret::of(db.get_database_backend(), Some(&url));
        let ledger = Self { db, clock: None, own_secret, location: Arc::new(location), catalogue: Arc::default() };
        ledger.migrate().await.map_err(|error| ledger.location.refused(error, Some(&url)))?;
        tracing::info!("{}", ledger.describe());
        Ok(ledger)
    }

    /// Connects to the ledger at `url` as it is, for an operator's tool: it never migrates and
    /// never creates a SQLite file, so a role with SELECT, UPDATE and DELETE on idem's tables is
    /// enough. Ask [`SeaOrmLedger::holds_ledger`] whether the database holds a ledger at all (a
    /// mistyped database name connects fine and holds none).
    ///
    /// # Errors
    /// The database cannot be reached (a SQLite file that does not exist included).
    pub async fn connect_existing(url: &str) -> Result<Self, LedgerError> {
        let given = Given::parse(url);
        let url = given.url().replace("mode=rwc", "mode=rw");
        let location = Location::of_url(&url, Origin::Given);
        if let Some(refusal) = driver::missing(&location) {
            return Err(refusal);
        }
        let options = Self::connect_options(&url);
        let db = Database::connect(options).await.map_err(|error| location.refused(failed(error), Some(&url)))?;
        let own_secret = OwnSecret::of(db.get_database_backend(), Some(&url));
        Ok(Self { db, clock: None, own_secret, location: Arc::new(location), catalogue: Arc::default() })
    }

    /// Whether this database holds an idem ledger (its tables exist), without creating anything.
    ///
    /// # Errors
    /// The database did not answer.
    pub async fn holds_ledger(&self) -> Result<bool, LedgerError> {
        use sea_orm::{ConnectionTrait, Statement};
        let backend = self.db.get_database_backend();
        for table in ["idem_records", "idem_superseded"] {
            let probe = Statement::from_string(backend, format!("SELECT 1 FROM {table} WHERE 1 = 0"));
            if self.db.query_one_raw(probe).await.is_err() {
                // The table is missing — or the database stopped answering: ask it something
                // every database answers, to tell the two apart.
                let alive = Statement::from_string(backend, "SELECT 1");
                self.db.query_one_raw(alive).await.map_err(failed)?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Wraps a sea-orm connection (pool) you opened, as it is: it does **not** migrate. Run
    /// [`SeaOrmLedger::migrate`] once, or apply [`super::schema`] from your own migration step.
    /// Open it with [`SeaOrmLedger::connect_options`] to get the settings
    /// [`SeaOrmLedger::connect`] uses. Its file unknown, a SQLite ledger made this way has no
    /// default secret: configure one.
    #[must_use]
    pub fn from_connection(db: DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        let own_secret = OwnSecret::of(backend, None);
        Self { db, clock: None, own_secret, location: Arc::new(Location::opened(backend)), catalogue: Arc::default() }
    }

    /// The connection options [`SeaOrmLedger::connect`] uses for `url` (a URL, or a plain
    /// SQLite path, which becomes `sqlite:<absolute path>?mode=rwc`): no statement logging,
    /// 5 s connect and acquire timeouts, a ping only for connections idle 30 s, and for SQLite
    /// WAL, `synchronous=FULL` and a 10 s busy timeout. Adjust them (the pool size, say) and pass
    /// them to [`SeaOrmLedger::connect_with`].
    #[must_use]
    pub fn connect_options(url: &str) -> ConnectOptions {
        let url = Given::parse(url).url();
        let mut options = ConnectOptions::new(url.clone());
        options.sqlx_logging(false).connect_timeout(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(5));
        // A pooled connection is pinged only after it sat idle: saves a round trip per statement.
        options.test_before_acquire_if_idle_for(Duration::from_secs(30));
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            super::sqlite::configure(&mut options, &url);
        }
        options
    }
}

/// The default used to be `.idem/ledger.sqlite3` under the working directory: a ledger left
/// there is not used any more, and its operations would run again if repeated — say so, and how
/// to keep it.
fn warn_of_the_old_default(default: &std::path::Path) {
    let old = std::path::Path::new(".idem").join("ledger.sqlite3");
    if old.is_file() {
        let old = std::path::absolute(&old).unwrap_or(old);
        tracing::warn!(
            "a ledger exists at {}, where idem kept its default before; the default is now {}. To keep using the \
             old one (its operations are not known to the new), set IDEM_DATABASE_URL={}",
            old.display(),
            default.display(),
            old.display()
        );
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    #[cfg(feature = "sqlite")]
    use std::sync::Mutex;

    use super::*;
    #[cfg(feature = "sqlite")]
    use crate::ledger::Ledger;

    /// A fresh directory under the system's temporary one.
    fn scratch() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("idem-connect-{}", crate::bytes::hex(&crate::bytes::random::<8>())));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// What a user is told after "the idempotency ledger is unavailable: ".
    async fn refusal(given: &str, origin: Origin) -> String {
        let error = SeaOrmLedger::open(Given::parse(given), origin).await.unwrap_err().to_string();
        error.strip_prefix("the idempotency ledger is unavailable: ").unwrap_or_else(|| panic!("{error}")).to_owned()
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_plain_path_is_a_sqlite_file_created_with_its_directory_and_its_secret_beside_it() {
        let dir = scratch();
        let path = dir.join("nested").join("ledger.db");
        let ledger = SeaOrmLedger::connect(path.to_str().unwrap()).await.unwrap();
        assert!(path.is_file());
        assert_eq!(ledger.describe(), format!("idem ledger: sqlite file {} (given in code)", path.display()));
        ledger.default_secret().unwrap();
        assert!(dir.join("nested").join("ledger.db.secret").is_file(), "the secret is kept beside the file");
        drop(ledger);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_file_that_cannot_be_opened_is_named_with_who_chose_it_and_what_to_do() {
        let dir = scratch();
        let blocker = dir.join("a-file");
        std::fs::write(&blocker, b"not a directory").unwrap();
        let under = blocker.join("sub").join("ledger.sqlite3");
        let cause = std::fs::create_dir_all(under.parent().unwrap()).unwrap_err();

        // A plain path (here the default): its directory cannot be created.
        let said = refusal(under.to_str().unwrap(), Origin::Default).await;
        assert_eq!(
            said,
            format!(
                "cannot open the SQLite file {} (IDEM_DATABASE_URL unset: the default): cannot create its directory \
                 {}: {cause}. Check that its directory exists (or can be created) and that this user may write \
                 there, or set IDEM_DATABASE_URL to a location this user may write (a plain file path will do)",
                under.display(),
                under.parent().unwrap().display(),
            )
        );

        // A URL: SQLite's own "unable to open database file", with the file and the variable.
        let url = format!("sqlite://{}?mode=rwc", under.display());
        let said = refusal(&url, Origin::Env).await;
        let (head, rest) = said.split_once(": ").unwrap();
        assert_eq!(head, format!("cannot open the SQLite file {} (from IDEM_DATABASE_URL)", under.display()));
        assert!(rest.contains("unable to open database file"), "{said}");
        assert!(
            said.ends_with(
                ". Check that its directory exists (or can be created) and that this user may write there, or \
                 set IDEM_DATABASE_URL to another location"
            ),
            "{said}"
        );

        // Given in code.
        let said = refusal(&url, Origin::Code).await;
        assert!(said.contains("(given in code)") && said.ends_with("or connect to another location"), "{said}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn an_unparsable_url_is_quoted_without_its_password() {
        let said = refusal("postgres://idem:hunter2@db internal:x/app", Origin::Env).await;
        assert!(!said.contains("hunter2"), "{said}");
        assert_eq!(
            said,
            "cannot connect to the postgres database app at db internal:x (from IDEM_DATABASE_URL: \
             postgres://idem:***@db internal:x/app): Connection Error: The connection string \
             'postgres://idem:***@db internal:x/app' cannot be parsed. Check that the server is running and reachable \
             there and that the user, password and database are right, or set IDEM_DATABASE_URL to another location"
        );
    }

    /// Collects what a `tracing_subscriber::fmt` layer writes.
    #[cfg(feature = "sqlite")]
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

    #[cfg(feature = "sqlite")]
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn connecting_logs_one_info_line_naming_the_ledger() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        // Another test's thread may have cached the log line's callsite as wanted by nobody
        // (before this subscriber existed): ask every callsite again.
        tracing::callsite::rebuild_interest_cache();
        let dir = scratch();
        let path = dir.join("ledger.sqlite3");
        let ledger = SeaOrmLedger::open(Given::Path(path.clone()), Origin::Default).await.unwrap();
        let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let line = format!("idem ledger: sqlite file {} (IDEM_DATABASE_URL unset: the default)", path.display());
        assert_eq!(logged, format!(" INFO {line}\n"));
        assert_eq!(ledger.describe(), line, "describe says what the log said");
        drop(ledger);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_connection_opened_by_the_application_is_described_by_its_backend() {
        let db = Database::connect(SeaOrmLedger::connect_options("sqlite::memory:")).await.unwrap();
        let ledger = SeaOrmLedger::from_connection(db);
        assert_eq!(ledger.describe(), "idem ledger: sqlite through a connection pool (opened by the application)");
        let memory = SeaOrmLedger::connect("sqlite::memory:").await.unwrap();
        assert_eq!(
            memory.describe(),
            "idem ledger: sqlite in memory (forgotten when the process exits) (given in code)"
        );
    }

    /// A build without SQLite (a PostgreSQL-only server, say) that is given a SQLite file — the
    /// default when IDEM_DATABASE_URL is unset — says which feature is off and what else it can
    /// open, and creates no directory; without it, sea-orm's "no supporting driver" came out as
    /// "cannot open the SQLite file …: check that its directory exists". Runs where `sqlite` is
    /// off (`scripts/check-features.sh`).
    #[cfg(not(feature = "sqlite"))]
    #[tokio::test]
    async fn a_sqlite_file_in_a_build_without_sqlite_says_which_feature_to_turn_on() {
        let dir = scratch();
        let path = dir.join("nested").join("ledger.sqlite3");
        let said = refusal(path.to_str().unwrap(), Origin::Default).await;
        assert!(
            said.starts_with(&format!(
                "cannot open sqlite file {} (IDEM_DATABASE_URL unset: the default): this build of idem-runtime has \
                 no SQLite driver (its feature `sqlite` is off). Add \"sqlite\" to idem-runtime's features in \
                 Cargo.toml, or set IDEM_DATABASE_URL to a ledger this build has (",
                path.display()
            )),
            "{said}"
        );
        assert!(!dir.join("nested").exists(), "nothing is created for a ledger this build cannot open");
        let said = refusal("sqlite::memory:", Origin::Code).await;
        assert!(said.contains("its feature `sqlite` is off") && said.contains(", or give a ledger this build has ("));
        let existing = SeaOrmLedger::connect_existing(path.to_str().unwrap()).await.unwrap_err().to_string();
        assert!(existing.contains("its feature `sqlite` is off"), "{existing}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The same for a server URL of a kind this build has no driver for.
    #[cfg(not(all(feature = "postgres", feature = "mysql")))]
    #[tokio::test]
    async fn a_server_url_in_a_build_without_its_driver_says_which_feature_to_turn_on() {
        let (url, feature) = if cfg!(feature = "postgres") {
            ("mysql://root:hunter2@127.0.0.1:3306/test", "mysql")
        } else {
            ("postgres://postgres:hunter2@127.0.0.1:5432/test", "postgres")
        };
        let said = refusal(url, Origin::Env).await;
        assert!(!said.contains("hunter2"), "{said}");
        assert!(
            said.contains("(from IDEM_DATABASE_URL): this build of idem-runtime has no ")
                && said.contains(&format!("(its feature `{feature}` is off)"))
                && said.contains("set IDEM_DATABASE_URL to a ledger this build has ("),
            "{said}"
        );
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_postgres_server_that_cannot_be_reached_is_named_without_its_password() {
        let url = "postgres://postgres:hunter2@127.0.0.1:1/ledgerdb";
        let said = refusal(url, Origin::Env).await;
        assert!(!said.contains("hunter2"), "{said}");
        let (head, _) = said.split_once("): ").unwrap();
        assert_eq!(
            head,
            "cannot connect to the postgres database ledgerdb at 127.0.0.1:1 (from IDEM_DATABASE_URL: \
             postgres://postgres:***@127.0.0.1:1/ledgerdb"
        );
        assert!(
            said.ends_with(
                ". Check that the server is running and reachable there and that the user, password and database \
                 are right, or set IDEM_DATABASE_URL to another location"
            ),
            "{said}"
        );
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn a_mysql_server_that_cannot_be_reached_is_named_without_its_password() {
        let said = refusal("mysql://root:hunter2@127.0.0.1:1/ledgerdb", Origin::Code).await;
        assert!(!said.contains("hunter2"), "{said}");
        assert!(
            said.starts_with(
                "cannot connect to the mysql database ledgerdb at 127.0.0.1:1 (given in code: \
                 mysql://root:***@127.0.0.1:1/ledgerdb): "
            ),
            "{said}"
        );
        assert!(said.ends_with("or connect to another location"), "{said}");
    }
}
