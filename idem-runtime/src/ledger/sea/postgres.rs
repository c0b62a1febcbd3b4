//! Everything PostgreSQL-specific: the statement text a PostgreSQL ledger sends and its schema.
//!
//! Parameters are numbered (`$1`). The claim is one statement: `INSERT … ON CONFLICT (key) DO
//! NOTHING RETURNING` inside a CTE, with the existing row selected in the same statement when
//! the key is taken, so a repeat is answered from that read (no lock, no write). Migrations take
//! an advisory lock: replicas starting together would race `CREATE TABLE IF NOT EXISTS`, which
//! PostgreSQL can fail with a duplicate type name.

use super::statements::{AddColumn, Migration, Statements, Tables, Visible};
use super::statements::{completions, expired, lease_lapsed, resolvable, sweepable, tables};

pub(super) static STATEMENTS: Statements = Statements {
    claim: "WITH claimed AS (
            INSERT INTO idem_records (key, tenant, state, token, attempt, created_at, window_end, expires_at,
                                      lease_until, fingerprint, arg_tags, result, subject, label)
            VALUES ($1, $2, 1, $3, 0, $4, $5, $6, $7, $8, $9, NULL, $10, $11)
            ON CONFLICT (key) DO NOTHING
            RETURNING state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint,
                      arg_tags, result
        )
        SELECT 1::smallint AS claimed, state, token, attempt, created_at, window_end, expires_at, lease_until,
               fingerprint, arg_tags, result FROM claimed
        UNION ALL
        SELECT 0::smallint, state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint,
               arg_tags, result
        FROM idem_records WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM claimed)",
    read: "SELECT state, token, attempt, created_at, window_end, expires_at, lease_until, fingerprint, arg_tags, \
           result FROM idem_records WHERE key = $1",
    take_fresh: "UPDATE idem_records SET state = 1, token = $1, attempt = 0, created_at = $2, window_end = $3, \
                 expires_at = $4, lease_until = $5, fingerprint = $6, arg_tags = $7, result = NULL, tenant = $8, \
                 subject = $9, label = $10 WHERE key = $11 AND token = $12 AND state = $13 AND lease_until = $14",
    take_unknown: "UPDATE idem_records SET state = 4 WHERE key = $1 AND token = $2 AND state = $3 AND lease_until = $4",
    take_over: "UPDATE idem_records SET token = $1, attempt = $2, lease_until = $3 \
                WHERE key = $4 AND token = $5 AND state = $6 AND lease_until = $7",
    keep_superseded: "INSERT INTO idem_superseded (key, window_end, tenant, state, token, attempt, \
                      created_at, expires_at, lease_until, fingerprint, arg_tags, result, subject, label) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT DO NOTHING",
    renew: "UPDATE idem_records SET lease_until = CASE WHEN lease_until < $1 THEN $2 ELSE lease_until END \
            WHERE key = $3 AND token = $4 AND state = 1",
    withdraw: "DELETE FROM idem_records WHERE key = $1 AND token = $2 AND attempt = 0 AND state IN (1, 4)",
    release: "UPDATE idem_records SET lease_until = 0 WHERE key = $1 AND token = $2 AND attempt <> 0 AND state = 1",
    complete: completions!(
        completed: [" SET state = $1, result = $2, label = $3, \
                        expires_at = CASE WHEN window_end > $4 THEN window_end ELSE $5 END \
                        WHERE key = $6 AND token = $7 AND state IN (1, 4)"],
        failed: [" SET state = $1, result = $2, label = $3, expires_at = window_end \
                     WHERE key = $4 AND token = $5 AND state IN (1, 4)"],
        unknown: [" SET state = $1, result = $2, \
                      expires_at = CASE WHEN expires_at > $3 THEN expires_at ELSE $4 END \
                      WHERE key = $5 AND token = $6 AND state IN (1, 4)"]
    ),
    lookup: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
             WHERE key = $1",
    find: Visible {
        tenant: concat!(
            "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                 WHERE key >= $1 AND key <= $2 AND tenant = $3 \
                 AND NOT ",
            expired!("$4"),
            " ORDER BY key LIMIT 1"
        ),
        subject: concat!(
            "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_records \
                  WHERE key >= $1 AND key <= $2 AND tenant = $3 AND subject IN ($4, $5) \
                  AND NOT ",
            expired!("$6"),
            " ORDER BY key LIMIT 1"
        ),
    },
    find_superseded: Visible {
        tenant: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                 WHERE key >= $1 AND key <= $2 AND tenant = $3 ORDER BY window_end DESC LIMIT 1",
        subject: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label FROM idem_superseded \
                  WHERE key >= $1 AND key <= $2 AND tenant = $3 AND subject IN ($4, $5) \
                  ORDER BY window_end DESC LIMIT 1",
    },
    find_superseded_at: "SELECT key, state, created_at, window_end, expires_at, lease_until, result, label \
                         FROM idem_superseded WHERE key >= $1 AND key <= $2 AND tenant = $3 \
                         AND window_end = $4 LIMIT 1",
    resolve: tables!(
        ["UPDATE "],
        [
            " SET state = $1, result = $2, expires_at = $3 \
                  WHERE key = $4 AND window_end = $5 AND tenant = $6 \
                  AND ",
            resolvable!("$7")
        ]
    ),
    replace: tables!(
        ["UPDATE "],
        [" SET result = $1, expires_at = GREATEST(expires_at, $2) \
                  WHERE key = $3 AND window_end = $4 AND tenant = $5 AND state = 2 AND result = $6"]
    ),
    // The subquery locks the rows it picks and skips those another transaction holds (another
    // replica's sweep, a claim or renewal under way): concurrent sweeps take disjoint batches
    // instead of queueing behind one another's row locks, and a skipped row waits for the next
    // sweep. The outer condition still rechecks each row on its newest version.
    sweep: Tables {
        records: concat!(
            "DELETE FROM idem_records WHERE key IN (SELECT key FROM idem_records \
                  WHERE window_end <= $1 AND ",
            sweepable!("$2", "$3"),
            " \
                  ORDER BY window_end LIMIT $4 FOR UPDATE SKIP LOCKED) \
                  AND window_end <= $5 AND ",
            sweepable!("$6", "$7")
        ),
        superseded: concat!(
            "DELETE FROM idem_superseded WHERE (key, window_end) IN (SELECT key, window_end \
                     FROM idem_superseded WHERE $1 > 0 AND ",
            sweepable!("$2", "$3"),
            " \
                     ORDER BY expires_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
                     AND $5 > 0 AND ",
            sweepable!("$6", "$7")
        ),
    },
    stats: tables!(
        [
            "SELECT state, COUNT(*), MIN(created_at), \
                  COUNT(CASE WHEN ",
            sweepable!("$1", "$2"),
            " THEN 1 END), \
                  COUNT(CASE WHEN ",
            lease_lapsed!("$3"),
            " THEN 1 END) FROM "
        ],
        [" GROUP BY state"]
    ),
    size: "SELECT CAST(pg_total_relation_size('idem_records') + pg_total_relation_size('idem_superseded') \
                 AS BIGINT)",
    sweep_rechecks: true,
    now: "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    label_of: "SELECT label FROM idem_records WHERE key = $1",
    keep_check: "INSERT INTO idem_secrets (version, check_value) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING",
    check_of: "SELECT check_value FROM idem_secrets WHERE version = $1",
    keep_live: "UPDATE idem_secrets SET live_until = CASE WHEN live_until < $1 THEN $2 ELSE live_until END WHERE version = $3",
    secret_versions: "SELECT version, live_until FROM idem_secrets ORDER BY version",
    keep_owner: "INSERT INTO idem_tools (namespace, tool, owner, seen_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (namespace, tool, owner) DO UPDATE SET seen_at = GREATEST(idem_tools.seen_at, excluded.seen_at)",
    owners_of: "SELECT owner FROM idem_tools WHERE namespace = $1 AND tool = $2 AND seen_at >= $3 ORDER BY owner",
    all_owners: "SELECT namespace, tool, owner, seen_at FROM idem_tools ORDER BY namespace, tool, owner",
    forget_owners: "DELETE FROM idem_tools WHERE namespace = $1 AND tool = $2",
    keep_facts: "INSERT INTO idem_tool_facts (namespace, tool, facts, seen_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (namespace, tool) DO UPDATE SET facts = excluded.facts, seen_at = excluded.seen_at \
                 WHERE idem_tool_facts.seen_at <= excluded.seen_at",
    facts_of: "SELECT facts FROM idem_tool_facts WHERE namespace = $1 AND tool = $2",
    // No index serves it: an operator's occasional scan, not a call's path.
    pending: "SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, superseded FROM (\
             SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, 0::bigint AS superseded FROM idem_records \
             WHERE state IN ($1, $2) AND expires_at > $3 AND ($4 = 1 OR tenant IN ($5, $6)) AND created_at <= $7 AND (created_at > $8 OR (created_at = $9 AND key > $10)) \
             UNION ALL \
             SELECT key, tenant, state, created_at, window_end, expires_at, lease_until, label, 1::bigint FROM idem_superseded \
             WHERE state IN ($11, $12) AND expires_at > $13 AND ($14 = 1 OR tenant IN ($15, $16)) AND created_at <= $17 AND (created_at > $18 OR (created_at = $19 AND key > $20)) \
             ) pending ORDER BY created_at, key LIMIT $21",
};

pub(super) static MIGRATION: Migration = Migration {
    // `CREATE … IF NOT EXISTS` of what exists is a NOTICE, which the driver logs at INFO: five
    // lines of "already exists, skipping" on every start. Warnings only, for this transaction.
    lock: Some("SET LOCAL client_min_messages = warning; SELECT pg_advisory_xact_lock(7233960519474712933)"),
    schema: &[
        "CREATE TABLE IF NOT EXISTS idem_secrets (
                version bigint PRIMARY KEY,
                check_value bytea NOT NULL CHECK (octet_length(check_value) = 32),
                live_until bigint NOT NULL DEFAULT 0
            )",
        "CREATE TABLE IF NOT EXISTS idem_tools (
                namespace text NOT NULL,
                tool text NOT NULL,
                owner text NOT NULL,
                seen_at bigint NOT NULL,
                PRIMARY KEY (namespace, tool, owner)
            )",
        "CREATE TABLE IF NOT EXISTS idem_tool_facts (
                namespace text NOT NULL,
                tool text NOT NULL,
                facts text NOT NULL,
                seen_at bigint NOT NULL,
                PRIMARY KEY (namespace, tool)
            )",
        "CREATE TABLE IF NOT EXISTS idem_records (
                tenant bigint NOT NULL,
                token bigint NOT NULL,
                created_at bigint NOT NULL,
                window_end bigint NOT NULL,
                expires_at bigint NOT NULL,
                lease_until bigint NOT NULL,
                state smallint NOT NULL,
                attempt smallint NOT NULL DEFAULT 0,
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                fingerprint bytea NOT NULL,
                arg_tags bytea NOT NULL,
                label bytea,
                result bytea,
                subject bigint NOT NULL DEFAULT 0
            )",
        "CREATE INDEX IF NOT EXISTS idem_records_window_end ON idem_records (window_end)",
        "CREATE TABLE IF NOT EXISTS idem_superseded (
                tenant bigint NOT NULL,
                token bigint NOT NULL,
                created_at bigint NOT NULL,
                window_end bigint NOT NULL,
                expires_at bigint NOT NULL,
                lease_until bigint NOT NULL,
                state smallint NOT NULL,
                attempt smallint NOT NULL,
                key bytea NOT NULL CHECK (octet_length(key) = 32),
                fingerprint bytea NOT NULL,
                arg_tags bytea NOT NULL,
                label bytea,
                result bytea,
                subject bigint NOT NULL DEFAULT 0,
                PRIMARY KEY (key, window_end)
            )",
        "CREATE INDEX IF NOT EXISTS idem_superseded_expires_at ON idem_superseded (expires_at)",
    ],
    add_live_until: AddColumn {
        probe: "SELECT live_until FROM idem_secrets WHERE 1 = 0",
        add: "ALTER TABLE idem_secrets ADD COLUMN IF NOT EXISTS live_until bigint NOT NULL DEFAULT 0",
    },
};
