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
    #[doc = include_str!("../docs/src/mcp-client.md")]
    pub mod mcp_client {}
    #[doc = include_str!("../docs/src/rig.md")]
    pub mod rig {}
    #[doc = include_str!("../docs/src/apalis.md")]
    pub mod apalis {}
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
pub mod databases;
pub mod owners;
pub mod raw;
pub mod tap;

pub use databases::{own_database, suite_database};

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

/// The PostgreSQL server the suite uses: the variable that names it and its default. The URL
/// names a server; the suite keeps its state in databases of its own there ([`databases`]).
pub const POSTGRES: (&str, &str) = ("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test");

/// The MariaDB/MySQL server the suite uses, as [`POSTGRES`].
pub const MYSQL: (&str, &str) = ("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");

/// Connects a durable ledger for a test to the suite's own database on the server the URL in
/// `url_env` (or `default_url`) names — made fresh, with the ledger's schema, once per process
/// ([`suite_database`]) — or reports it skipped (`None`) when the server is not reachable: a
/// failure instead under `CI=true`.
///
/// # Panics
/// The suite's database cannot be made, or a connection to it fails.
pub async fn durable(
    test: &str,
    url_env: &str,
    default_url: &str,
) -> Option<std::sync::Arc<dyn idem_runtime::ledger::Ledger>> {
    use idem_runtime::ledger::sea::SeaOrmLedger;
    let url = suite_database(test, url_env, default_url).await?;
    let db = sea_orm::Database::connect(SeaOrmLedger::connect_options(&url))
        .await
        .unwrap_or_else(|error| panic!("{test}: connect to the suite's database {url}: {error}"));
    Some(std::sync::Arc::new(SeaOrmLedger::from_connection(db)))
}

/// How long a test waits for something another task or process does — a handler to start, a
/// repeat to reach the ledger, a server to say where it listens — before it fails naming what it
/// waited for: far above any healthy wait, so it bounds a hang, not a speed.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Polls `done` every 5 ms until it holds.
///
/// # Panics
/// Naming `what`, once [`WAIT`] has passed without it.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waited {WAIT:?} for {what}, in vain");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Waits until `started` holds — the handler of the call `running` runs has begun.
///
/// # Panics
/// With the call's answer, if it ends first (refused: its handler will never start); naming
/// `what`, once [`WAIT`] has passed.
pub async fn wait_for_start<T: std::fmt::Debug>(
    what: &str,
    running: &mut tokio::task::JoinHandle<T>,
    mut started: impl FnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !started() {
        if running.is_finished() {
            let ended = running.await;
            panic!("{what}: the call ended before its handler started: {ended:?}");
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: the handler did not start within {WAIT:?}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// `future`'s output (a notification, a message, a task's end).
///
/// # Panics
/// Naming `what`, once [`WAIT`] has passed without it.
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future).await.unwrap_or_else(|_| panic!("waited {WAIT:?} for {what}, in vain"))
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

/// The text of a file of the workspace, by its path from the workspace's root (`ops/…`,
/// `README.md`).
///
/// # Panics
/// If it cannot be read, naming it.
#[must_use]
pub fn workspace_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A handle on `ledger` keyed with [`test_secret`] (PostgreSQL and MariaDB have no default).
#[must_use]
pub fn idem(ledger: impl idem_runtime::ledger::Ledger) -> idem_runtime::Idem {
    builder(ledger).build().unwrap()
}

/// The settings of a handle on `ledger` (a ledger, or a shared one) keyed with [`test_secret`].
pub fn builder(ledger: impl idem_runtime::ledger::Ledger) -> idem_runtime::settings::Builder {
    idem_runtime::Idem::builder(ledger).secret(test_secret())
}

/// A handle on a shared ledger keyed with [`test_secret`].
#[must_use]
pub fn idem_shared(ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger>) -> idem_runtime::Idem {
    builder(ledger).build().unwrap()
}

/// Every ledger a behaviour must hold on, by name: memory, a SQLite file of its own, and the
/// suite's own PostgreSQL and MariaDB databases ([`durable`]; each left out, reported skipped,
/// without its server — a failure under `CI=true`).
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
    for (name, (env, default)) in [("postgres", POSTGRES), ("mysql", MYSQL)] {
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
