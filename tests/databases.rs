//! The suite's durable state, kept to itself (issue 41, item 5).
//!
//! `IDEM_TEST_POSTGRES_URL` and `IDEM_TEST_MYSQL_URL` name a *server* (through a database on it the
//! suite may connect to, `test` by default); the suite never keeps operations there. What a user,
//! an example or an earlier run left in that database — a check value of another secret under
//! version 1, another build's tool handlers — cannot fail it.
//!
//! Each test process holds a *slot* on each server for as long as it lives: slot `n` is a lock
//! (PostgreSQL: an advisory lock in the database the URL names; MariaDB/MySQL: `GET_LOCK`) taken
//! on a connection of its own, which a thread keeps open until the process exits. The first free
//! slot wins, so one run at a time uses slot 1 and runs side by side take 2, 3, …. On taking it,
//! the process drops every database of the slot (`idem_suite_<n>`, `idem_suite_<n>_<name>`) and
//! makes `idem_suite_<n>` anew with the ledger's schema: an earlier run's state, however it
//! ended, is gone, and a run beside it is never touched. The processes a test starts (a crash
//! test's child, the example server) are handed the URL, and so share the state of the test
//! that started them.

use std::collections::BTreeMap;

use idem_runtime::ledger::sea::SeaOrmLedger;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

/// The most test processes that may use one server at once.
const SLOTS: i32 = 16;

/// The advisory lock's first key on PostgreSQL (`idem` in ASCII); the slot is the second.
const LOCK_KEY: i32 = 0x6964_656d;

/// The slot this process holds on each server, by the URL up to its database name.
static HELD: tokio::sync::Mutex<BTreeMap<String, i32>> = tokio::sync::Mutex::const_new(BTreeMap::new());

/// A server URL taken apart: `<server>/<database><query>`.
struct Parts<'a> {
    server: &'a str,
    query: &'a str,
}

fn parts(url: &str) -> Parts<'_> {
    let (path, query) = url.find('?').map_or((url, ""), |at| url.split_at(at));
    let (server, _) = path.rsplit_once('/').expect("a database URL ends in /<database>");
    Parts { server, query }
}

/// Whether `url` names a PostgreSQL or MariaDB/MySQL server (the suite's own databases are made
/// there; any other URL is used as it is).
fn on_a_server(url: &str) -> bool {
    ["postgres://", "postgresql://", "mysql://", "mariadb://"].iter().any(|scheme| url.starts_with(scheme))
}

/// The name of the suite's database of slot `slot` (`name` empty) or of a test's own in it, kept
/// within the 63 bytes PostgreSQL allows.
fn database_name(slot: i32, name: &str) -> String {
    let full = if name.is_empty() { format!("idem_suite_{slot}") } else { format!("idem_suite_{slot}_{name}") };
    if full.len() <= 63 {
        return full;
    }
    // Long test names: a prefix, then a digest of the whole, so two long names stay apart.
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    full.hash(&mut hasher);
    format!("{}_{:016x}", &full[..46], hasher.finish())
}

/// The URL of the suite's own database on the server the URL in `env` (or `default`) names,
/// fresh for this process (see the module's notes); `None` (reported skipped; a failure under
/// CI) without a server.
///
/// # Panics
/// The slot's databases cannot be dropped or made, or every slot is taken.
pub async fn suite_database(test: &str, env: &str, default: &str) -> Option<String> {
    let base = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    if !on_a_server(&base) {
        return Some(base);
    }
    let slot = match slot(&base).await {
        Ok(slot) => slot,
        Err(error) => {
            crate::skip(test, &format!("cannot reach {base} ({error}); set {env} to run it"));
            return None;
        }
    };
    let Parts { server, query } = parts(&base);
    Some(format!("{server}/{}{query}", database_name(slot, "")))
}

/// The URL of a database of a test's own, in this process's slot on the server the URL in `env`
/// (or `default`) names, with the ledger's schema and every table empty; `None` (reported
/// skipped; a failure under CI) without a server.
///
/// # Panics
/// The database cannot be made, migrated or emptied.
pub async fn own_database(test: &str, env: &str, default: &str, name: &str) -> Option<String> {
    let base = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    let slot = match slot(&base).await {
        Ok(slot) => slot,
        Err(error) => {
            crate::skip(test, &format!("cannot reach {base} ({error}); set {env} to run it"));
            return None;
        }
    };
    let Parts { server, query } = parts(&base);
    let name = database_name(slot, name);
    let admin = sea_orm::Database::connect(SeaOrmLedger::connect_options(&base)).await.expect("connect to the server");
    let create = match admin.get_database_backend() {
        DbBackend::Postgres => format!("CREATE DATABASE \"{name}\""),
        _ => format!("CREATE DATABASE IF NOT EXISTS `{name}`"),
    };
    if let Err(error) = admin.execute_unprepared(&create).await {
        // PostgreSQL has no IF NOT EXISTS for databases: one this process made earlier is fine.
        assert!(error.to_string().contains("already exists"), "create {name}: {error}");
    }
    let _ = admin.close().await;
    let url = format!("{server}/{name}{query}");
    let ledger = SeaOrmLedger::connect(&url).await.expect("connect to the test's own database");
    ledger.migrate().await.expect("migrate");
    // Every table of the ledger's, whatever this build's schema holds (records, superseded
    // results, the secrets' check values, the tools' handlers and facts).
    let db = ledger.connection();
    let backend = db.get_database_backend();
    let list = match backend {
        DbBackend::Postgres => "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
        _ => "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()",
    };
    for row in db.query_all_raw(Statement::from_string(backend, list)).await.expect("list the tables") {
        let table: String = row.try_get_by_index(0).expect("a table's name");
        if table.starts_with("idem_") {
            db.execute_unprepared(&format!("DELETE FROM {table}")).await.expect("empty the table");
        }
    }
    let _ = ledger.connection().clone().close().await;
    Some(url)
}

/// This process's slot on the server `base` names: taken (and its databases made fresh) at the
/// first call, the same one after.
async fn slot(base: &str) -> Result<i32, String> {
    let mut held = HELD.lock().await;
    let server = parts(base).server.to_owned();
    if let Some(slot) = held.get(&server) {
        return Ok(*slot);
    }
    let slot = take_a_slot(base.to_owned()).await?;
    reset(base, slot).await;
    held.insert(server, slot);
    Ok(slot)
}

/// Takes the first free slot on the server `base` names, on a connection a thread of its own
/// keeps open (and alive: a ping a minute, under MariaDB's `wait_timeout`) while the process
/// lives.
async fn take_a_slot(base: String) -> Result<i32, String> {
    let (taken, slot) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("idem-suite-slot".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let mut lock = match Lock::take(&base).await {
                    Ok(lock) => lock,
                    Err(error) => {
                        let _ = taken.send(Err(error));
                        return;
                    }
                };
                let _ = taken.send(Ok(lock.slot));
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                    if let Err(error) = lock.ping().await {
                        eprintln!("idem-tests: lost the connection that holds slot {} on {base}: {error}", lock.slot);
                        return;
                    }
                }
            });
        })
        .expect("start the thread that holds the slot");
    slot.await.unwrap_or_else(|_| Err("the thread that takes a slot ended".to_owned()))
}

/// A slot's lock and the connection it lives on.
struct Lock {
    slot: i32,
    connection: Connection,
}

enum Connection {
    Postgres(sea_orm::sqlx::PgConnection),
    MySql(sea_orm::sqlx::MySqlConnection),
}

impl Lock {
    async fn take(base: &str) -> Result<Self, String> {
        use sea_orm::sqlx::{self, Connection as _};
        let mut connection = if base.starts_with("postgres") {
            Connection::Postgres(sqlx::PgConnection::connect(base).await.map_err(|error| error.to_string())?)
        } else {
            Connection::MySql(sqlx::MySqlConnection::connect(base).await.map_err(|error| error.to_string())?)
        };
        for slot in 1..=SLOTS {
            let taken = match &mut connection {
                Connection::Postgres(connection) => {
                    sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1, $2)")
                        .bind(LOCK_KEY)
                        .bind(slot)
                        .fetch_one(connection)
                        .await
                }
                Connection::MySql(connection) => sqlx::query_scalar::<_, Option<i64>>("SELECT GET_LOCK(?, 0)")
                    .bind(format!("idem_suite_{slot}"))
                    .fetch_one(connection)
                    .await
                    .map(|taken| taken == Some(1)),
            };
            if taken.map_err(|error| format!("take slot {slot}: {error}"))? {
                return Ok(Self { slot, connection });
            }
        }
        panic!("{SLOTS} test processes hold every slot of the suite on {base}: wait for one to end (or end it)");
    }

    async fn ping(&mut self) -> Result<(), String> {
        use sea_orm::sqlx::Connection as _;
        match &mut self.connection {
            Connection::Postgres(connection) => connection.ping().await,
            Connection::MySql(connection) => connection.ping().await,
        }
        .map_err(|error| error.to_string())
    }
}

/// Drops every database of `slot` on the server `base` names and makes the suite's anew, with
/// the ledger's schema.
async fn reset(base: &str, slot: i32) {
    let admin = sea_orm::Database::connect(SeaOrmLedger::connect_options(base)).await.expect("connect to the server");
    let backend = admin.get_database_backend();
    let list = match backend {
        DbBackend::Postgres => "SELECT datname::text FROM pg_database",
        _ => "SELECT CAST(SCHEMA_NAME AS CHAR) FROM information_schema.SCHEMATA",
    };
    let suite = database_name(slot, "");
    let own = format!("{suite}_");
    let rows = admin.query_all_raw(Statement::from_string(backend, list)).await.expect("list the databases");
    for row in rows {
        let name: String = row.try_get_by_index(0).expect("a database's name");
        if name != suite && !name.starts_with(&own) {
            continue;
        }
        // FORCE: a process an earlier run left behind (a child a failed test never reaped) may
        // still be connected.
        let drop = match backend {
            DbBackend::Postgres => format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
            _ => format!("DROP DATABASE IF EXISTS `{name}`"),
        };
        admin.execute_unprepared(&drop).await.unwrap_or_else(|error| panic!("drop {name}: {error}"));
    }
    let create = match backend {
        DbBackend::Postgres => format!("CREATE DATABASE \"{suite}\""),
        _ => format!("CREATE DATABASE `{suite}`"),
    };
    admin.execute_unprepared(&create).await.unwrap_or_else(|error| panic!("create {suite}: {error}"));
    let _ = admin.close().await;
    let Parts { server, query } = parts(base);
    let ledger =
        SeaOrmLedger::connect(&format!("{server}/{suite}{query}")).await.expect("connect to the suite's database");
    ledger.migrate().await.expect("migrate the suite's database");
    let _ = ledger.connection().clone().close().await;
}
