//! The shape of a backend's statement set: every statement a SQL ledger sends, named for what
//! it does. The text itself lives in one file per backend (`sqlite.rs`, `postgres.rs`,
//! `mysql.rs`), built at compile time from what is written once here: the record predicates
//! `judge.rs` defines, and one text for both tables (`tables!`, `completions!`). The ledger's
//! logic is shared and only picks a statement here, so no statement is rewritten at run time,
//! and a benchmark can send exactly the ledger's own.
//!
//! Parameters: PostgreSQL numbers them (`$1`), MySQL and SQLite take them in order (`?`); every
//! backend's statement takes the same values in the same order, as each field says.

// The record predicates `judge.rs` defines — `RecordView::expired`, `lease_expired`,
// `resolvable`, `sweepable` — in SQL over a row's columns, written once here for the three
// dialects and both tables (states: 1 in progress, 2 completed, 3 failed, 4 unknown, as
// `State::code` stores them). Each takes its time parameters as the dialect writes them (`"?"`,
// `"$4"`), so a statement stays one compile-time string. `tests::the_predicates_are_judges_on_every_backend`
// holds each to `RecordView` on SQLite, PostgreSQL and MySQL.

/// Settled and kept no longer (`RecordView::expired`).
macro_rules! expired {
    ($now:literal) => {
        concat!("(expires_at <= ", $now, " AND state IN (2, 3))")
    };
}

/// In progress under a lease run out (`RecordView::lease_expired`).
macro_rules! lease_lapsed {
    ($now:literal) => {
        concat!("(state = 1 AND lease_until <= ", $now, ")")
    };
}

/// What an operator may resolve (`RecordView::resolvable`).
macro_rules! resolvable {
    ($now:literal) => {
        concat!("(state = 4 OR ", $crate::ledger::sea::statements::lease_lapsed!($now), ")")
    };
}

/// What the sweep may delete (`RecordView::sweepable`): the time for the expiry, then for the
/// lease (one value, two parameters).
macro_rules! sweepable {
    ($expiry:literal, $lease:literal) => {
        concat!("(expires_at <= ", $expiry, " AND (state <> 1 OR lease_until <= ", $lease, "))")
    };
}

/// One statement for each table, written once: the pieces before and after the table's name.
macro_rules! tables {
    ([$($before:tt)*], [$($after:tt)*]) => {
        $crate::ledger::sea::statements::Tables {
            records: concat!($($before)*, "idem_records", $($after)*),
            superseded: concat!($($before)*, "idem_superseded", $($after)*),
        }
    };
}

/// The completions of a held claim on each table ([`Complete`]), each written once: the text
/// after `UPDATE <table>`.
macro_rules! completions {
    (completed: [$($completed:tt)*], failed: [$($failed:tt)*], unknown: [$($unknown:tt)*]) => {
        $crate::ledger::sea::statements::Tables {
            records: $crate::ledger::sea::statements::Complete {
                completed: concat!("UPDATE idem_records", $($completed)*),
                failed: concat!("UPDATE idem_records", $($failed)*),
                unknown: concat!("UPDATE idem_records", $($unknown)*),
            },
            superseded: $crate::ledger::sea::statements::Complete {
                completed: concat!("UPDATE idem_superseded", $($completed)*),
                failed: concat!("UPDATE idem_superseded", $($failed)*),
                unknown: concat!("UPDATE idem_superseded", $($unknown)*),
            },
        }
    };
}

pub(crate) use {completions, expired, lease_lapsed, resolvable, sweepable, tables};

/// Every statement a SQL ledger sends once its tables exist, on one backend.
#[derive(Debug)]
pub struct Statements {
    /// Claims an absent key: key, tenant, token, now, window end, expiry, lease, fingerprint,
    /// argument tags, subject. What it returns differs: on PostgreSQL `1` and the new row, or
    /// `0` and the row in the way; on SQLite a row only when it claimed; on MySQL nothing (a
    /// taken key is a duplicate-key error).
    pub claim: &'static str,
    /// The record of a key, as a claim reads it (`Row`): key.
    pub read: &'static str,
    /// The compare-and-set that takes a record as a new operation: token, now, window end,
    /// expiry, lease, fingerprint, argument tags, tenant, subject, then the version read (key,
    /// token, state, lease).
    pub take_fresh: &'static str,
    /// The compare-and-set that makes a stale record unknown (`hold`): the version read.
    pub take_unknown: &'static str,
    /// The compare-and-set that takes over a stale lease: token, attempt, lease, then the
    /// version read.
    pub take_over: &'static str,
    /// Keeps a superseded record aside, unless it already is: key, window end, tenant, state,
    /// token, attempt, created, expiry, lease, fingerprint, argument tags, result, subject.
    pub keep_superseded: &'static str,
    /// Extends the holder's lease, never shortening it: the lease twice, key, token.
    pub renew: &'static str,
    /// Removes a fresh claim that runs nothing: key, token. Nothing ran — also once `hold`
    /// turned its lapsed lease "unknown", which only its own unrun handler could have been.
    pub withdraw: &'static str,
    /// Gives a takeover's lease back, so the operation stays in progress and its stale policy
    /// applies: key, token.
    pub release: &'static str,
    /// Settles a held claim, on the current table or the superseded one.
    pub complete: Tables<Complete>,
    /// A record by key, as a status lookup reads it (`Found`): key.
    pub lookup: &'static str,
    /// The unexpired current record whose key starts with a reference.
    pub find: Visible,
    /// The newest superseded record whose key starts with a reference.
    pub find_superseded: Visible,
    /// The superseded record of a tenant at an operation's address: the key range (low, high),
    /// tenant, window end.
    pub find_superseded_at: &'static str,
    /// An operator's answer to an unsettled record: state, result, expiry, then key, window
    /// end, tenant, now.
    pub resolve: Tables<&'static str>,
    /// An operator's correction of a completed result no repeat could read: the new result,
    /// the verdict's expiry (kept if later), then key, window end, tenant, the stored result.
    pub replace: Tables<&'static str>,
    /// Deletes expired records, at most a limit: now three times and the limit, then (where
    /// [`Statements::sweep_rechecks`]) now three times again. `expires_at` is never before
    /// `window_end`: naming both lets the current table's sweep range-scan its `window_end`
    /// index (completion changes `expires_at`, so indexing it would cost every completion its
    /// HOT update). Where the database can, the subquery skips rows locked by another
    /// transaction (PostgreSQL's `FOR UPDATE SKIP LOCKED`), so sweeps on several replicas take
    /// disjoint batches rather than wait on one another.
    pub sweep: Tables<&'static str>,
    /// Counts a table's records by state, for [`crate::ledger::Ledger::stats`]: one row per
    /// state — state, count, oldest `created_at`, how many the sweep would delete, how many are
    /// in progress under a lapsed lease — given now three times.
    pub stats: Tables<&'static str>,
    /// The ledger's size on disk in bytes, one `BIGINT`: both tables and their indexes
    /// (PostgreSQL, MySQL), the database file (SQLite).
    pub size: &'static str,
    /// Whether the sweep selects its rows in a subquery and checks the condition again on the
    /// rows the `DELETE` locks, so a record claimed afresh between the subquery and the delete is
    /// spared (MySQL deletes with `ORDER BY … LIMIT` directly instead).
    pub sweep_rechecks: bool,
    /// The database server's clock, in milliseconds since the epoch.
    pub now: &'static str,
    /// The sealed label of a current record, read before a superseding claim replaces it: key.
    pub label_of: &'static str,
    /// Keeps a secret version's check value unless one is kept: version, check value.
    pub keep_check: &'static str,
    /// The check value kept for a secret version: version.
    pub check_of: &'static str,
    /// Keeps until when a secret version's operations may be repeated, unless a later time is
    /// kept: the time twice, version.
    pub keep_live: &'static str,
    /// Every secret version with until when its operations may be repeated.
    pub secret_versions: &'static str,
    /// Records a tool's owner as seen, keeping the later time: namespace, tool, owner, now.
    pub keep_owner: &'static str,
    /// A tool's owners seen since a time, in order: namespace, tool, since.
    pub owners_of: &'static str,
    /// Every tool's owners, for an operator (`idem tools`).
    pub all_owners: &'static str,
    /// Forgets a tool's owners (`idem tools forget`): namespace, tool.
    pub forget_owners: &'static str,
    /// Keeps a tool's facts unless newer ones are kept: namespace, tool, facts, now.
    pub keep_facts: &'static str,
    /// A tool's facts: namespace, tool.
    pub facts_of: &'static str,
    /// The unsettled records an operator looks at (`idem pending`), current and superseded,
    /// oldest first, with a flag saying which table each came from. For each table in turn:
    /// two states, now, whether every tenant (1) or only the two tenant tags that follow, the
    /// latest creation time, then the page's start — a creation time twice and a key; finally
    /// the limit.
    pub pending: &'static str,
}

/// One statement for each of the two tables.
#[derive(Debug)]
pub struct Tables<T> {
    /// `idem_records`: the current record of each key.
    pub records: T,
    /// `idem_superseded`: unsettled records a newer operation replaced.
    pub superseded: T,
}

/// The completion of a held claim (state `1` or `4`), by the state it settles in: state,
/// result, the emptied label (not for an unknown outcome, which keeps it for the operator), then
/// the time to keep it until twice (not for a failure), then key and token.
#[derive(Debug)]
pub struct Complete {
    /// A completed result: kept until its window ends or the time given, whichever is later.
    pub completed: &'static str,
    /// A failure: kept until its window ends.
    pub failed: &'static str,
    /// An unknown outcome: its unsettled expiry, unless the time given is later.
    pub unknown: &'static str,
}

/// A status read, by whom it must be visible to: the key range (low, high), tenant, then —
/// for a subject — the tenant-wide subject (0) and the subject; then, for the current table,
/// now.
#[derive(Debug)]
pub struct Visible {
    /// Any record of the tenant.
    pub tenant: &'static str,
    /// The subject's own records and the tenant-wide ones.
    pub subject: &'static str,
}

/// The statements [`super::SeaOrmLedger::migrate`] sends on one backend.
#[derive(Debug)]
pub(crate) struct Migration {
    /// Taken first in each migrating transaction, so replicas starting together take turns.
    pub(crate) lock: Option<&'static str>,
    /// The tables and their indexes, as of this version.
    pub(crate) schema: &'static [&'static str],
    /// Adds `idem_secrets.live_until` (issue 41) to a table made before it: 0 for the versions
    /// it holds, never counted as live.
    pub(crate) add_live_until: AddColumn,
}

/// Adding a column to a table made before it.
#[derive(Debug)]
pub(crate) struct AddColumn {
    /// Fails when the column is missing.
    pub(crate) probe: &'static str,
    /// Adds it.
    pub(crate) add: &'static str,
}

#[cfg(test)]
mod tests {
    use sea_orm::DbBackend;

    use super::Statements;
    use crate::ledger::judge::RecordView;
    use crate::ledger::{State, Token, Won};

    /// The statements every backend words alike but for its parameters and quoting, by name.
    fn alike(backend: DbBackend) -> Vec<(&'static str, &'static str)> {
        let s = Statements::of(backend);
        vec![
            ("read", s.read),
            ("take_fresh", s.take_fresh),
            ("take_unknown", s.take_unknown),
            ("take_over", s.take_over),
            ("renew", s.renew),
            ("withdraw", s.withdraw),
            ("release", s.release),
            ("complete.records.completed", s.complete.records.completed),
            ("complete.records.failed", s.complete.records.failed),
            ("complete.records.unknown", s.complete.records.unknown),
            ("complete.superseded.completed", s.complete.superseded.completed),
            ("complete.superseded.failed", s.complete.superseded.failed),
            ("complete.superseded.unknown", s.complete.superseded.unknown),
            ("lookup", s.lookup),
            ("find.tenant", s.find.tenant),
            ("find.subject", s.find.subject),
            ("find_superseded.tenant", s.find_superseded.tenant),
            ("find_superseded.subject", s.find_superseded.subject),
            ("find_superseded_at", s.find_superseded_at),
            ("resolve.records", s.resolve.records),
            ("resolve.superseded", s.resolve.superseded),
            ("stats.records", s.stats.records),
            ("stats.superseded", s.stats.superseded),
            ("label_of", s.label_of),
            ("check_of", s.check_of),
            ("keep_live", s.keep_live),
            ("secret_versions", s.secret_versions),
        ]
    }

    /// `text` with PostgreSQL's numbered parameters as `?`.
    fn unnumbered(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '$' {
                out.push('?');
                while chars.next_if(char::is_ascii_digit).is_some() {}
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The three files stay in step: a statement changed on one backend is changed on all.
    #[test]
    fn every_backend_says_the_same() {
        let sqlite = alike(DbBackend::Sqlite);
        for (backend, reword) in [
            (DbBackend::Postgres, unnumbered as fn(&str) -> String),
            (DbBackend::MySql, |text: &str| text.replace("`key`", "key")),
        ] {
            for ((name, text), (_, sqlite)) in alike(backend).into_iter().zip(&sqlite) {
                assert_eq!(reword(text), *sqlite, "{backend:?} {name}");
            }
        }
    }

    /// Each predicate as `backend` evaluates it over one row given as parameters: the time (for
    /// `sweepable` twice), then state, expiry and lease, in the order the backend binds them.
    fn predicates(backend: DbBackend) -> Vec<(&'static str, &'static str, u8, Judged)> {
        let expired = |view: &RecordView<'_>, now| view.expired(now);
        let lapsed = |view: &RecordView<'_>, now| view.lease_expired(now);
        let resolvable = |view: &RecordView<'_>, now| view.resolvable(now);
        let sweepable = |view: &RecordView<'_>, now| view.sweepable(now);
        match backend {
            DbBackend::Postgres => vec![
                ("expired", expired!("$1"), 1, expired),
                ("lease_lapsed", lease_lapsed!("$1"), 1, lapsed),
                ("resolvable", resolvable!("$1"), 1, resolvable),
                ("sweepable", sweepable!("$1", "$2"), 2, sweepable),
            ],
            _ => vec![
                ("expired", expired!("?"), 1, expired),
                ("lease_lapsed", lease_lapsed!("?"), 1, lapsed),
                ("resolvable", resolvable!("?"), 1, resolvable),
                ("sweepable", sweepable!("?", "?"), 2, sweepable),
            ],
        }
    }

    type Judged = fn(&RecordView<'_>, u64) -> bool;

    /// A connection to `backend`'s test server, or `None` (said) without one; under `CI=true` a
    /// missing server is a failure.
    async fn server(backend: DbBackend) -> Option<sea_orm::DatabaseConnection> {
        let (env, default) = match backend {
            DbBackend::Postgres => ("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"),
            DbBackend::MySql => ("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
            _ => ("", "sqlite::memory:"),
        };
        let url = std::env::var(env).unwrap_or_else(|_| default.to_owned());
        let mut options = sea_orm::ConnectOptions::new(url);
        options.connect_timeout(std::time::Duration::from_secs(5)).acquire_timeout(std::time::Duration::from_secs(5));
        match sea_orm::Database::connect(options).await {
            Ok(connection) => Some(connection),
            Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true" || ci == "1") => {
                panic!("{backend:?} at {env}: {error} (CI=true, so a missing server is a failure)")
            }
            Err(error) => {
                eprintln!(
                    "SKIPPED the_predicates_are_judges_on_every_backend on {backend:?}: no server at {env} ({error})"
                );
                None
            }
        }
    }

    /// The SQL predicates say what `RecordView` says, on every backend: each evaluated by the
    /// database over every state and an expiry and a lease before, at and after now.
    #[tokio::test]
    async fn the_predicates_are_judges_on_every_backend() {
        use sea_orm::{ConnectionTrait, Statement, Value};
        let backends = [
            #[cfg(feature = "sqlite")]
            DbBackend::Sqlite,
            #[cfg(feature = "postgres")]
            DbBackend::Postgres,
            #[cfg(feature = "mysql")]
            DbBackend::MySql,
        ];
        let now: u64 = 10;
        for backend in backends {
            let Some(db) = server(backend).await else { continue };
            for (name, predicate, times, judged) in predicates(backend) {
                let int = match backend {
                    DbBackend::MySql => "SIGNED",
                    DbBackend::Postgres => "BIGINT",
                    _ => "INTEGER",
                };
                let column = |n: u8| match backend {
                    DbBackend::Postgres => format!("CAST(${} AS {int})", times + n),
                    _ => format!("CAST(? AS {int})"),
                };
                let sql = format!(
                    "SELECT CAST(CASE WHEN {predicate} THEN 1 ELSE 0 END AS {int}) FROM (SELECT {} AS state, {} AS expires_at, {} AS \
                     lease_until) r",
                    column(1),
                    column(2),
                    column(3)
                );
                for state in [State::InProgress, State::Completed, State::Failed, State::Unknown] {
                    for expires_at in [now - 5, now, now + 5] {
                        for lease_until in [now - 5, now, now + 5] {
                            let mut values: Vec<Value> = vec![Value::BigInt(Some(now as i64)); usize::from(times)];
                            values.extend([
                                state.code().into(),
                                (expires_at as i64).into(),
                                (lease_until as i64).into(),
                            ]);
                            let values: Vec<Value> = values
                                .into_iter()
                                .map(|value| match value {
                                    Value::SmallInt(Some(code)) => Value::BigInt(Some(i64::from(code))),
                                    other => other,
                                })
                                .collect();
                            let row = db
                                .query_one_raw(Statement::from_sql_and_values(backend, &sql, values))
                                .await
                                .unwrap_or_else(|error| panic!("{backend:?} {name}: {error}\n{sql}"))
                                .expect("one row");
                            let said: i64 = row.try_get_by_index(0).expect("an integer");
                            let view = RecordView {
                                state,
                                token: Token::from_raw(1),
                                attempt: Won::Fresh,
                                window_end: 0,
                                expires_at,
                                lease_until,
                                fingerprint: &[],
                                arg_tags: &[],
                                result: None,
                            };
                            assert_eq!(
                                said == 1,
                                judged(&view, now),
                                "{backend:?} {name}: state {state:?}, expires {expires_at}, lease {lease_until}, now {now}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// PostgreSQL numbers its parameters in the order the values are bound: `$1` to `$n`.
    #[test]
    fn postgres_parameters_are_numbered_in_order() {
        for (name, text) in alike(DbBackend::Postgres) {
            let numbers: Vec<usize> = text
                .split('$')
                .skip(1)
                .map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap())
                .map(|digits| digits.parse().unwrap())
                .collect();
            let expected: Vec<usize> = (1..=numbers.len()).collect();
            assert_eq!(numbers, expected, "{name}");
        }
    }
}
