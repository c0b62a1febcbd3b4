//! Everything MySQL- and MariaDB-specific: the statement text a MySQL ledger sends, its schema
//! and the index changes MySQL cannot say idempotently.
//!
//! Parameters are `?`, taken in order. `key` is a reserved word in MySQL, so every statement
//! quotes the column. A plain `INSERT` claims an absent key (the primary key refuses a second);
//! on a duplicate, the record is read apart.

use super::statements::{AddColumn, Migration, Statements, Tables, Visible};
use super::statements::{completions, expired, lease_lapsed, resolvable, sweepable, tables};

pub(super) static STATEMENTS: Statements = Statements {
    claim: "INSERT INTO idem_records (`key`, tenant, state, token, attempt, created_at, window_end,
                expires_at, lease_until, fingerprint, arg_tags, result, subject, label)
            VALUES (?, ?, 1, ?, 0, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
    read: "SELECT state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint, arg_tags, \
           result FROM idem_records WHERE `key` = ?",
    take_fresh: "UPDATE idem_records SET state = 1, token = ?, attempt = 0, created_at = ?, window_end = ?, \
                 expires_at = ?, lease_until = ?, fingerprint = ?, arg_tags = ?, result = NULL, tenant = ?, \
                 subject = ?, label = ? WHERE `key` = ? AND token = ? AND state = ? AND lease_until = ?",
    take_unknown: "UPDATE idem_records SET state = 4 WHERE `key` = ? AND token = ? AND state = ? AND lease_until = ?",
    take_over: "UPDATE idem_records SET token = ?, attempt = ?, lease_until = ? \
                WHERE `key` = ? AND token = ? AND state = ? AND lease_until = ?",
    keep_superseded: "INSERT IGNORE INTO idem_superseded (`key`, window_end, tenant, state, token, attempt, \
                      created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject, label) \
                      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    renew: "UPDATE idem_records SET lease_until = CASE WHEN lease_until < ? THEN ? ELSE lease_until END \
            WHERE `key` = ? AND token = ? AND state = 1",
    withdraw: "DELETE FROM idem_records WHERE `key` = ? AND token = ? AND attempt = 0 AND state IN (1, 4)",
    release: "UPDATE idem_records SET lease_until = 0 WHERE `key` = ? AND token = ? AND attempt <> 0 AND state = 1",
    complete: completions!(
        completed: [" SET state = ?, result = ?, label = ?, \
                        expires_at = CASE WHEN window_end > ? THEN window_end ELSE ? END \
                        WHERE `key` = ? AND token = ? AND state IN (1, 4)"],
        failed: [" SET state = ?, result = ?, label = ?, expires_at = window_end \
                     WHERE `key` = ? AND token = ? AND state IN (1, 4)"],
        unknown: [" SET state = ?, result = ?, \
                      expires_at = CASE WHEN expires_at > ? THEN expires_at ELSE ? END \
                      WHERE `key` = ? AND token = ? AND state IN (1, 4)"]
    ),
    lookup: "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
             WHERE `key` = ?",
    find: Visible {
        tenant: concat!(
            "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                 WHERE `key` >= ? AND `key` <= ? AND tenant = ? \
                 AND NOT ",
            expired!("?"),
            " ORDER BY `key` LIMIT 1"
        ),
        subject: concat!(
            "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                  WHERE `key` >= ? AND `key` <= ? AND tenant = ? AND subject IN (?, ?) \
                  AND NOT ",
            expired!("?"),
            " ORDER BY `key` LIMIT 1"
        ),
    },
    find_superseded: Visible {
        tenant: "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                 WHERE `key` >= ? AND `key` <= ? AND tenant = ? ORDER BY window_end DESC LIMIT 1",
        subject: "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                  WHERE `key` >= ? AND `key` <= ? AND tenant = ? AND subject IN (?, ?) ORDER BY window_end DESC LIMIT 1",
    },
    find_superseded_at: "SELECT `key`, state, created_at, window_end, expires_at, lease_until, result, label \
                         FROM idem_superseded WHERE `key` >= ? AND `key` <= ? AND tenant = ? \
                         AND window_end = ? LIMIT 1",
    resolve: tables!(
        ["UPDATE "],
        [
            " SET state = ?, result = ?, expires_at = ? \
                  WHERE `key` = ? AND window_end = ? AND tenant = ? AND ",
            resolvable!("?")
        ]
    ),
    replace: tables!(
        ["UPDATE "],
        [" SET result = ?, expires_at = GREATEST(expires_at, ?) \
                  WHERE `key` = ? AND window_end = ? AND tenant = ? AND state = 2 AND result = ?"]
    ),
    sweep: Tables {
        records: concat!(
            "DELETE FROM idem_records \
                  WHERE window_end <= ? AND ",
            sweepable!("?", "?"),
            " \
                  ORDER BY window_end LIMIT ?"
        ),
        superseded: concat!(
            "DELETE FROM idem_superseded \
                     WHERE ? > 0 AND ",
            sweepable!("?", "?"),
            " \
                     ORDER BY expires_at LIMIT ?"
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
    size: "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name IN ('idem_records', 'idem_superseded')",
    sweep_rechecks: false,
    now: "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
    label_of: "SELECT label FROM idem_records WHERE `key` = ?",
    keep_check: "INSERT IGNORE INTO idem_secrets (version, check_value) VALUES (?, ?)",
    check_of: "SELECT check_value FROM idem_secrets WHERE version = ?",
    keep_live: "UPDATE idem_secrets SET live_until = CASE WHEN live_until < ? THEN ? ELSE live_until END WHERE version = ?",
    secret_versions: "SELECT version, live_until FROM idem_secrets ORDER BY version",
    keep_owner: "INSERT INTO idem_tools (namespace, tool, owner, seen_at) VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE seen_at = GREATEST(seen_at, VALUES(seen_at))",
    owners_of: "SELECT owner FROM idem_tools WHERE namespace = ? AND tool = ? AND seen_at >= ? ORDER BY owner",
    all_owners: "SELECT namespace, tool, owner, seen_at FROM idem_tools ORDER BY namespace, tool, owner",
    forget_owners: "DELETE FROM idem_tools WHERE namespace = ? AND tool = ?",
    // `facts` first: it compares the kept time before `seen_at` is updated.
    keep_facts: "INSERT INTO idem_tool_facts (namespace, tool, facts, seen_at) VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE facts = IF(VALUES(seen_at) >= seen_at, VALUES(facts), facts), \
                 seen_at = GREATEST(seen_at, VALUES(seen_at))",
    facts_of: "SELECT facts FROM idem_tool_facts WHERE namespace = ? AND tool = ?",
    // No index serves it: an operator's occasional scan, not a call's path.
    pending: "SELECT `key`, tenant, state, created_at, window_end, expires_at, lease_until, label, superseded FROM (\
             SELECT `key`, tenant, state, created_at, window_end, expires_at, lease_until, label, CAST(0 AS SIGNED) AS superseded FROM idem_records \
             WHERE state IN (?, ?) AND expires_at > ? AND (? = 1 OR tenant IN (?, ?)) AND created_at <= ? AND (created_at > ? OR (created_at = ? AND `key` > ?)) \
             UNION ALL \
             SELECT `key`, tenant, state, created_at, window_end, expires_at, lease_until, label, CAST(1 AS SIGNED) FROM idem_superseded \
             WHERE state IN (?, ?) AND expires_at > ? AND (? = 1 OR tenant IN (?, ?)) AND created_at <= ? AND (created_at > ? OR (created_at = ? AND `key` > ?)) \
             ) pending ORDER BY created_at, `key` LIMIT ?",
};

pub(super) static MIGRATION: Migration = Migration {
    lock: None,
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_secrets (
                version BIGINT NOT NULL PRIMARY KEY,
                check_value BINARY(32) NOT NULL,
                live_until BIGINT NOT NULL DEFAULT 0
            ) ENGINE=InnoDB",
        "CREATE TABLE IF NOT EXISTS idem_tools (
                namespace VARCHAR(191) NOT NULL,
                tool VARCHAR(191) NOT NULL,
                owner VARCHAR(255) NOT NULL,
                seen_at BIGINT NOT NULL,
                PRIMARY KEY (namespace, tool, owner)
            ) ENGINE=InnoDB",
        "CREATE TABLE IF NOT EXISTS idem_tool_facts (
                namespace VARCHAR(191) NOT NULL,
                tool VARCHAR(191) NOT NULL,
                facts MEDIUMTEXT NOT NULL,
                seen_at BIGINT NOT NULL,
                PRIMARY KEY (namespace, tool)
            ) ENGINE=InnoDB",
        "CREATE TABLE IF NOT EXISTS idem_records (
                `key` BINARY(32) NOT NULL PRIMARY KEY,
                tenant BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                attempt SMALLINT NOT NULL DEFAULT 0,
                token BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                window_end BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                lease_until BIGINT NOT NULL,
                fingerprint BINARY(32) NOT NULL,
                arg_tags LONGBLOB NOT NULL,
                label BLOB NULL,
                result LONGBLOB NULL,
                subject BIGINT NOT NULL DEFAULT 0,
                INDEX idem_records_window_end (window_end)
            ) ENGINE=InnoDB",
        "CREATE TABLE IF NOT EXISTS idem_superseded (
                `key` BINARY(32) NOT NULL,
                window_end BIGINT NOT NULL,
                tenant BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                attempt SMALLINT NOT NULL,
                token BIGINT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                lease_until BIGINT NOT NULL,
                fingerprint BINARY(32) NOT NULL,
                arg_tags LONGBLOB NOT NULL,
                label BLOB NULL,
                result LONGBLOB NULL,
                subject BIGINT NOT NULL DEFAULT 0,
                PRIMARY KEY (`key`, window_end),
                INDEX idem_superseded_expires_at (expires_at)
            ) ENGINE=InnoDB",
    ],
    add_live_until: AddColumn {
        probe: "SELECT live_until FROM idem_secrets WHERE 1 = 0",
        add: "ALTER TABLE idem_secrets ADD COLUMN live_until BIGINT NOT NULL DEFAULT 0",
    },
};
