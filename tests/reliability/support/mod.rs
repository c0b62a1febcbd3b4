//! Shared parts of the `reliability_*` tests (see `RELIABILITY.md`): the long/short switch,
//! backend URLs with the skip rule, an error type that keeps idem's answer code, and a table
//! printer for the figures.

#![allow(dead_code)]

pub mod downstream;

use std::time::Duration;

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{ErrorClass, IdempotentError, Rejection};
use serde::{Deserialize, Serialize};

/// `IDEM_RELIABILITY_LONG=1` selects the long form.
pub fn long() -> bool {
    std::env::var("IDEM_RELIABILITY_LONG").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// `short` normally, `long` under `IDEM_RELIABILITY_LONG=1`.
pub fn scale(short: usize, long: usize) -> usize {
    if self::long() { long } else { short }
}

/// A random name, so tests share the database and its table without meeting.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", idem_runtime::ledger::Token::random().get())
}

/// A fresh SQLite file URL in its own temporary directory.
pub fn sqlite_url() -> String {
    let dir = std::env::temp_dir().join(unique("idem-rel"));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display())
}

/// The URL of `backend` (`sqlite`: a fresh file; `postgres`, `mysql`: the suite's own database
/// on the server `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_MYSQL_URL` names, see
/// `idem_tests::databases`) and its migrated ledger, or `None` when the server cannot be reached
/// (reported skipped; a failure under `CI=true`).
pub async fn connect(backend: &str, test: &str) -> Option<(String, SeaOrmLedger)> {
    let (env, default) = match backend {
        "sqlite" => {
            let url = sqlite_url();
            let ledger = SeaOrmLedger::connect(&url).await.expect("open a SQLite file");
            return Some((url, ledger));
        }
        "postgres" => idem_tests::POSTGRES,
        "mysql" => idem_tests::MYSQL,
        other => panic!("unknown backend {other}"),
    };
    let url = idem_tests::suite_database(&format!("{test}::{backend}"), env, default).await?;
    let ledger = SeaOrmLedger::connect(&url).await.unwrap_or_else(|error| panic!("{test}: connect to {url}: {error}"));
    Some((url, ledger))
}

/// A handler error that keeps idem's answer (code, ref) when idem answered instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelError {
    /// The downstream failed before doing anything.
    Effect(String),
    /// idem answered without running the handler.
    Rejected { code: String, reference: Option<String>, message: String },
}

impl IdempotentError for RelError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected {
            code: rejection.code().to_owned(),
            reference: rejection.reference().map(|r| r.to_string()),
            message: rejection.to_string(),
        }
    }
}

impl RelError {
    /// idem's code, or `handler` for the handler's own error.
    pub fn code(&self) -> &str {
        match self {
            Self::Rejected { code, .. } => code,
            Self::Effect(_) => "handler",
        }
    }
}

/// The bytes idem stores for a successful result `value` — what an operator passes to
/// `Resolution::Completed` so a repeat replays `value`. (idem has no public encoder for it; see
/// RELIABILITY.md.)
pub fn stored_ok<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "ok": value })).expect("encode a stored result")
}

/// Polls `probe` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn poll<T, F, Fut>(limit: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(found) = probe().await {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints a markdown table of figures to stderr (visible with `--nocapture`).
pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    let mut out =
        format!("\n### {title} ({})\n\n| {} |\n|", if long() { "long run" } else { "short run" }, header.join(" | "));
    for _ in header {
        out.push_str("---|");
    }
    out.push('\n');
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    eprintln!("{out}");
}
