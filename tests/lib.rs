//! Shared parts of the idem test suite: the ledger conformance suite every backend must pass.
//!
//! A backend's test file invokes [`ledger_conformance!`] with an async factory that returns a
//! fresh (or shared) ledger, or `None` when its server is not reachable on this machine — the
//! factory then prints that the test was skipped, and fails instead when `CI=true`.

pub mod conformance;

/// The guide's chapters (`docs/src/`): their Rust snippets compile and run as this crate's
/// doctests, so the guide cannot drift from the code.
#[allow(clippy::doc_lazy_continuation, reason = "markdown written for mdBook, whose list items continue unindented")]
pub mod guide {
    #[doc = include_str!("../docs/src/attribute.md")]
    pub mod attribute {}
    #[doc = include_str!("../docs/src/mcp.md")]
    pub mod mcp {}
    #[doc = include_str!("../docs/src/http.md")]
    pub mod http {}
    #[doc = include_str!("../docs/src/recipes.md")]
    pub mod recipes {}
    #[doc = include_str!("../docs/src/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/src/production.md")]
    pub mod production {}
    #[doc = include_str!("../docs/src/operations.md")]
    pub mod operations {}
    #[doc = include_str!("../docs/src/redis-ledger.md")]
    pub mod redis_ledger {}
}
pub mod owners;
pub mod tap;

/// Expands to one `#[tokio::test]` per conformance case, each calling `$make().await` for its
/// ledger (`Option<Arc<dyn Ledger>>`; `None` skips).
#[macro_export]
macro_rules! ledger_conformance {
    ($make:expr) => {
        $crate::ledger_conformance!(@cases $make;
            absent_key_is_claimed,
            resent_claim_is_recognised_as_won,
            live_lease_is_in_flight,
            completed_is_replayed_byte_for_byte,
            failed_is_claimed_again,
            unknown_is_reported_unknown,
            different_arguments_conflict,
            failed_record_takes_new_arguments,
            window_edge,
            stale_lease_takeover_fences_the_old_holder,
            stale_lease_reconcile,
            stale_lease_hold_becomes_unknown,
            late_holder_never_overwrites_an_operators_verdict,
            resent_takeover_claim_is_still_a_takeover,
            takeover_is_reported_even_with_an_equal_window_end,
            release_undoes_only_its_own_claim,
            untrusted_clock_acts_on_no_time,
            late_result_stays_replayable_for_its_grace,
            unsettled_past_its_window_is_superseded,
            lookup_uses_the_full_key,
            many_arguments_are_stored,
            renew_extends_only_the_holders_lease,
            status_is_scoped_to_the_tenant,
            status_is_scoped_to_the_subject,
            resolve_settles_unknown,
            a_correction_replaces_only_the_result_it_names,
            a_verdict_past_the_window_stays_readable,
            tool_facts_keep_the_latest,
            inspect_finds_any_subjects_operation_in_the_tenant,
            a_verdict_lands_only_on_the_operation_it_names,
            stats_count_records_by_state,
            pending_lists_unsettled_operations_oldest_first,
            sweep_is_bounded_and_spares_live_leases,
            two_hundred_concurrent_claims_one_winner
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(ledger) = ($make)().await else { return };
                $crate::conformance::$case(ledger).await;
            }
        )*
    };
}

/// Returns whether tests that need an external server must fail (rather than skip) when the
/// server is missing: under CI they must.
#[must_use]
pub fn servers_required() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true" || value == "1")
}

/// Reports a test skipped for want of a server, or panics under CI.
///
/// # Panics
/// Under `CI=true`: a missing server there is a failure, never a silent pass.
pub fn skip(test: &str, why: &str) {
    assert!(!servers_required(), "{test}: {why} (CI=true, so a missing server is a failure)");
    eprintln!("SKIPPED {test}: {why}");
}

/// Connects a durable ledger for a test, or reports it skipped (`None`) when the server is not
/// reachable — a failure instead under `CI=true`. Each database's schema is migrated once per
/// process (the PostgreSQL and MariaDB suites share one).
pub async fn durable(
    test: &str,
    url_env: &str,
    default_url: &str,
) -> Option<std::sync::Arc<dyn idem_runtime::ledger::Ledger>> {
    use idem_runtime::ledger::sea::SeaOrmLedger;
    static MIGRATED: tokio::sync::Mutex<std::collections::BTreeSet<String>> =
        tokio::sync::Mutex::const_new(std::collections::BTreeSet::new());
    let url = std::env::var(url_env).unwrap_or_else(|_| default_url.to_owned());
    match sea_orm::Database::connect(SeaOrmLedger::connect_options(&url)).await {
        Ok(db) => {
            let ledger = SeaOrmLedger::from_connection(db);
            let mut migrated = MIGRATED.lock().await;
            if !migrated.contains(&url) {
                ledger.migrate().await.expect("migrate the ledger schema");
                migrated.insert(url);
            }
            Some(std::sync::Arc::new(ledger))
        }
        Err(error) => {
            skip(test, &format!("cannot reach {url} ({error}); set {url_env} to run it"));
            None
        }
    }
}

/// The secret every test handle on a shared database keys with: fixed, so separate processes
/// (a crash test's child, a restarted server) and separate handles agree, as replicas must.
///
/// # Panics
/// Never: the bytes are long enough.
#[must_use]
pub fn test_secret() -> idem_runtime::secret::Secret {
    idem_runtime::secret::Secret::new(1, &[0x5e; 32]).expect("32 bytes")
}

/// A handle on `ledger` keyed with [`test_secret`] (PostgreSQL and MariaDB have no default).
#[must_use]
pub fn idem(ledger: impl idem_runtime::ledger::Ledger) -> idem_runtime::Idem {
    builder(ledger).build().unwrap()
}

/// The settings of a handle on `ledger` (a ledger, or a shared one) keyed with [`test_secret`].
pub fn builder(ledger: impl idem_runtime::ledger::Ledger) -> idem_runtime::Builder {
    idem_runtime::Idem::builder(ledger).secret(test_secret())
}

/// A handle on a shared ledger keyed with [`test_secret`].
#[must_use]
pub fn idem_shared(ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger>) -> idem_runtime::Idem {
    builder(ledger).build().unwrap()
}

/// A database of a test's own, `idem_<name>`, on the server the URL in `env` (or `default`)
/// names, with the ledger schema and empty tables; `None` (reported skipped; a failure under CI)
/// without a server.
///
/// # Panics
/// The database cannot be made or migrated.
pub async fn own_database(test: &str, env: &str, default: &str, name: &str) -> Option<String> {
    use sea_orm::ConnectionTrait;
    let base = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    let admin = match sea_orm::Database::connect(idem_runtime::ledger::sea::SeaOrmLedger::connect_options(&base)).await
    {
        Ok(admin) => admin,
        Err(error) => {
            skip(test, &format!("cannot reach {base} ({error}); set {env} to run it"));
            return None;
        }
    };
    let (prefix, _) = base.rsplit_once('/').expect("a database URL ends in /<database>");
    let name = format!("idem_{name}");
    let create = match admin.get_database_backend() {
        sea_orm::DbBackend::Postgres => format!("CREATE DATABASE {name}"),
        _ => format!("CREATE DATABASE IF NOT EXISTS {name}"),
    };
    if let Err(error) = admin.execute_unprepared(&create).await {
        // PostgreSQL has no IF NOT EXISTS for databases: an existing one (an earlier run) is fine.
        assert!(error.to_string().contains("already exists"), "create {name}: {error}");
    }
    let url = format!("{prefix}/{name}");
    let ledger =
        idem_runtime::ledger::sea::SeaOrmLedger::connect(&url).await.expect("connect to the test's own database");
    ledger.migrate().await.expect("migrate");
    let db = sea_orm::Database::connect(idem_runtime::ledger::sea::SeaOrmLedger::connect_options(&url))
        .await
        .expect("connect");
    db.execute_unprepared("DELETE FROM idem_records").await.expect("empty the table");
    db.execute_unprepared("DELETE FROM idem_superseded").await.expect("empty the table");
    Some(url)
}

/// Every ledger a behaviour must hold on, by name: memory, a SQLite file of its own, and the
/// PostgreSQL and MariaDB test databases (each left out, reported skipped, without its server —
/// a failure under `CI=true`).
///
/// # Panics
/// The SQLite file cannot be made.
pub async fn every_ledger(test: &str) -> Vec<(&'static str, std::sync::Arc<dyn idem_runtime::ledger::Ledger>)> {
    let dir = std::env::temp_dir().join(format!("idem-{test}-{}", idem_runtime::ledger::Token::random().get()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let sqlite = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
    let sqlite = idem_runtime::ledger::sea::SeaOrmLedger::connect(&sqlite).await.expect("open a SQLite file");
    let mut ledgers: Vec<(&'static str, std::sync::Arc<dyn idem_runtime::ledger::Ledger>)> = vec![
        ("memory", std::sync::Arc::new(idem_runtime::MemoryLedger::new())),
        ("sqlite", std::sync::Arc::new(sqlite)),
    ];
    let servers = [
        ("postgres", "IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"),
        ("mysql", "IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
    ];
    for (name, env, default) in servers {
        if let Some(ledger) = durable(&format!("{test}::{name}"), env, default).await {
            ledgers.push((name, ledger));
        }
    }
    ledgers
}

/// The path of an example binary of the workspace (`target/<profile>/examples/<name>`), which
/// `cargo test --workspace` builds; a panic that says how to build it when it is missing.
#[must_use]
pub fn example_binary(name: &str) -> std::path::PathBuf {
    // target/<profile>/deps/<test>-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile =
        exe.parent().and_then(std::path::Path::parent).expect("the test binary lives in target/<profile>/deps");
    let binary = profile.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the example binary {} is missing: build it with `cargo build --example {name}` (`cargo test --workspace` \
         builds examples too), then run this test again",
        binary.display()
    );
    binary
}

/// What a test's `tracing` subscriber writes, kept to be read back.
#[derive(Clone, Default)]
pub struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    /// A plain-text `fmt` subscriber writing here (INFO and above).
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish()
    }

    /// Everything written so far.
    ///
    /// # Panics
    /// If a writer panicked while holding it, or wrote bytes that are not UTF-8.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
