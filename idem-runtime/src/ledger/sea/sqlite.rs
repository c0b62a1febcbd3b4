//! Everything SQLite-specific: the statement text a SQLite ledger sends, its schema and how a
//! connection to a SQLite file is configured.
//!
//! Parameters are `?`, taken in order; the claim numbers them (`?1`) to say they follow the
//! PostgreSQL claim's. `INSERT … ON CONFLICT DO NOTHING RETURNING` claims an absent key in one
//! statement (SQLite 3.35+); when it does not claim, the record in the way is read apart.

use super::statements::{AddColumn, Migration, Statements, Tables, Visible};
use super::statements::{completions, expired, lease_lapsed, resolvable, sweepable, tables};

pub(super) static STATEMENTS: Statements = Statements {
    claim: "INSERT INTO idem_records (key, tenant, state, token, attempt, created_at, window_end,
                expires_at, lease_until, fingerprint, arg_tags, result, subject, label)
            VALUES (?1, ?2, 1, ?3, 0, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10, ?11)
            ON CONFLICT (key) DO NOTHING
            RETURNING state",
    read: "SELECT state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint, arg_tags, \
           result FROM idem_records WHERE key = ?",
    take_fresh: "UPDATE idem_records SET state = 1, token = ?, attempt = 0, created_at = ?, window_end = ?, \
                 expires_at = ?, lease_until = ?, fingerprint = ?, arg_tags = ?, result = NULL, tenant = ?, \
                 subject = ?, label = ? WHERE key = ? AND token = ? AND state = ? AND lease_until = ?",
    take_unknown: "UPDATE idem_records SET state = 4 WHERE key = ? AND token = ? AND state = ? AND lease_until = ?",
    take_over: "UPDATE idem_records SET token = ?, attempt = ?, lease_until = ? \
                WHERE key = ? AND token = ? AND state = ? AND lease_until = ?",
    keep_superseded: "INSERT OR IGNORE INTO idem_superseded (key, window_end, tenant, state, token, attempt, \
                      created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject, label) \
                      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    renew: "UPDATE idem_records SET lease_until = CASE WHEN lease_until < ? THEN ? ELSE lease_until END \
            WHERE key = ? AND token = ? AND state = 1",
    withdraw: "DELETE FROM idem_records WHERE key = ? AND token = ? AND attempt = 0 AND state IN (1, 4)",
    release: "UPDATE idem_records SET lease_until = 0 WHERE key = ? AND token = ? AND attempt <> 0 AND state = 1",
    complete: completions!(
        completed: [" SET state = ?, result = ?, label = ?, \
                        expires_at = CASE WHEN window_end > ? THEN window_end ELSE ? END \
                        WHERE key = ? AND token = ? AND state IN (1, 4)"],
        failed: [" SET state = ?, result = ?, label = ?, expires_at = window_end \
                     WHERE key = ? AND token = ? AND state IN (1, 4)"],
        unknown: [" SET state = ?, result = ?, \
                      expires_at = CASE WHEN expires_at > ? THEN expires_at ELSE ? END \
                      WHERE key = ? AND token = ? AND state IN (1, 4)"]
    ),
    lookup: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
             WHERE key = ?",
    find: Visible {
        tenant: concat!(
            "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                 WHERE key >= ? AND key <= ? AND tenant = ? \
                 AND NOT ",
            expired!("?"),
            " ORDER BY key LIMIT 1"
        ),
        subject: concat!(
            "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                  WHERE key >= ? AND key <= ? AND tenant = ? AND subject IN (?, ?) \
                  AND NOT ",
            expired!("?"),
            " ORDER BY key LIMIT 1"
        ),
    },
    find_superseded: Visible {
        tenant: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                 WHERE key >= ? AND key <= ? AND tenant = ? ORDER BY window_end DESC LIMIT 1",
        subject: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                  WHERE key >= ? AND key <= ? AND tenant = ? AND subject IN (?, ?) ORDER BY window_end DESC LIMIT 1",
    },
    find_superseded_at: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label \
                         FROM idem_superseded WHERE key >= ? AND key <= ? AND tenant = ? \
                         AND window_end = ? LIMIT 1",
    resolve: tables!(
        ["UPDATE "],
        [
            " SET state = ?, result = ?, expires_at = ? \
                  WHERE key = ? AND window_end = ? AND tenant = ? AND ",
            resolvable!("?")
        ]
    ),
    replace: tables!(
        ["UPDATE "],
        [" SET result = ?, expires_at = MAX(expires_at, ?) \
                  WHERE key = ? AND window_end = ? AND tenant = ? AND state = 2 AND result = ?"]
    ),
    sweep: Tables {
        records: concat!(
            "DELETE FROM idem_records WHERE key IN (SELECT key FROM idem_records \
                  WHERE window_end <= ? AND ",
            sweepable!("?", "?"),
            " \
                  ORDER BY window_end LIMIT ?) \
                  AND window_end <= ? AND ",
            sweepable!("?", "?")
        ),
        superseded: concat!(
            "DELETE FROM idem_superseded WHERE (key, window_end) IN (SELECT key, window_end \
                     FROM idem_superseded WHERE ? > 0 AND ",
            sweepable!("?", "?"),
            " \
                     ORDER BY expires_at LIMIT ?) \
                     AND ? > 0 AND ",
            sweepable!("?", "?")
        ),
    },
    stats: tables!(
        [
            "SELECT state, COUNT(*), MIN(created_at), \
                  COUNT(CASE WHEN ",
            sweepable!("?", "?"),
            " THEN 1 END), \
                  COUNT(CASE WHEN ",
            lease_lapsed!("?"),
            " THEN 1 END) FROM "
        ],
        [" GROUP BY state"]
    ),
    size: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
    sweep_rechecks: true,
    now: "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    label_of: "SELECT label FROM idem_records WHERE key = ?",
    keep_check: "INSERT OR IGNORE INTO idem_secrets (version, check_value) VALUES (?, ?)",
    check_of: "SELECT check_value FROM idem_secrets WHERE version = ?",
    keep_live: "UPDATE idem_secrets SET live_until = CASE WHEN live_until < ? THEN ? ELSE live_until END WHERE version = ?",
    secret_versions: "SELECT version, live_until FROM idem_secrets ORDER BY version",
    keep_owner: "INSERT INTO idem_tools (namespace, tool, owner, seen_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (namespace, tool, owner) DO UPDATE SET seen_at = MAX(seen_at, excluded.seen_at)",
    owners_of: "SELECT owner FROM idem_tools WHERE namespace = ? AND tool = ? AND seen_at >= ? ORDER BY owner",
    all_owners: "SELECT namespace, tool, owner, seen_at FROM idem_tools ORDER BY namespace, tool, owner",
    forget_owners: "DELETE FROM idem_tools WHERE namespace = ? AND tool = ?",
    keep_facts: "INSERT INTO idem_tool_facts (namespace, tool, facts, seen_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (namespace, tool) DO UPDATE SET facts = excluded.facts, seen_at = excluded.seen_at \
                 WHERE idem_tool_facts.seen_at <= excluded.seen_at",
    facts_of: "SELECT facts FROM idem_tool_facts WHERE namespace = ? AND tool = ?",
    // No index serves it: an operator's occasional scan, not a call's path.
    pending: "SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, superseded FROM (\
             SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, 0 AS superseded FROM idem_records \
             WHERE state IN (?, ?) AND expires_at > ? AND (? = 1 OR tenant IN (?, ?)) AND created_at <= ? AND (created_at > ? OR (created_at = ? AND key > ?)) \
             UNION ALL \
             SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, 1 FROM idem_superseded \
             WHERE state IN (?, ?) AND expires_at > ? AND (? = 1 OR tenant IN (?, ?)) AND created_at <= ? AND (created_at > ? OR (created_at = ? AND key > ?)) \
             ) pending ORDER BY created_at, key LIMIT ?",
};

pub(super) static MIGRATION: Migration = Migration {
    lock: None,
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_secrets (
                version INTEGER PRIMARY KEY NOT NULL,
                check_value BLOB NOT NULL,
                live_until INTEGER NOT NULL DEFAULT 0
            )",
        "CREATE TABLE IF NOT EXISTS idem_tools (
                namespace TEXT NOT NULL,
                tool TEXT NOT NULL,
                owner TEXT NOT NULL,
                seen_at INTEGER NOT NULL,
                PRIMARY KEY (namespace, tool, owner)
            ) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS idem_tool_facts (
                namespace TEXT NOT NULL,
                tool TEXT NOT NULL,
                facts TEXT NOT NULL,
                seen_at INTEGER NOT NULL,
                PRIMARY KEY (namespace, tool)
            )",
        "CREATE TABLE IF NOT EXISTS idem_records (
                key BLOB PRIMARY KEY NOT NULL,
                tenant INTEGER NOT NULL,
                state INTEGER NOT NULL,
                attempt INTEGER NOT NULL DEFAULT 0,
                token INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                window_end INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                lease_until INTEGER NOT NULL,
                fingerprint BLOB NOT NULL,
                arg_tags BLOB NOT NULL,
                label BLOB,
                result BLOB,
                subject INTEGER NOT NULL DEFAULT 0
            ) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS idem_records_window_end ON idem_records (window_end)",
        "CREATE TABLE IF NOT EXISTS idem_superseded (
                key BLOB NOT NULL,
                window_end INTEGER NOT NULL,
                tenant INTEGER NOT NULL,
                state INTEGER NOT NULL,
                attempt INTEGER NOT NULL,
                token INTEGER NOT NULL,
                created_at INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                lease_until INTEGER NOT NULL,
                fingerprint BLOB NOT NULL,
                arg_tags BLOB NOT NULL,
                label BLOB,
                result BLOB,
                subject INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (key, window_end)
            ) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS idem_superseded_expires_at ON idem_superseded (expires_at)",
    ],
    add_live_until: AddColumn {
        probe: "SELECT live_until FROM idem_secrets WHERE 1 = 0",
        add: "ALTER TABLE idem_secrets ADD COLUMN live_until INTEGER NOT NULL DEFAULT 0",
    },
};

/// Whether `url` names an in-memory database rather than a file.
pub(super) fn in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// A file in WAL mode with `synchronous=FULL` — a claim lost to a power cut would be a
/// duplicate waiting to happen, so durability wins over the ~1 ms it costs — and a 10 s busy
/// timeout; an in-memory database on one connection that lives as long as the pool.
#[cfg(feature = "sqlite")]
pub(super) fn configure(options: &mut sea_orm::ConnectOptions, url: &str) {
    use std::time::Duration;

    use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
    let in_memory = in_memory(url);
    options.map_sqlx_sqlite_opts(move |opts| {
        let opts = opts.busy_timeout(Duration::from_secs(10)).foreign_keys(false);
        if in_memory { opts } else { opts.journal_mode(SqliteJournalMode::Wal).synchronous(SqliteSynchronous::Full) }
    });
    if in_memory {
        // Every pooled connection to `:memory:` would open its own empty database.
        options.max_connections(1).min_connections(1).idle_timeout(None).max_lifetime(None);
    }
}
