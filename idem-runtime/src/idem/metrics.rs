//! Metrics of every call through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`): what [`describe`] lists, fed from the same call points as
//! [`Hooks`](crate::hooks::Hooks) — but for `idem_secret_refusals_total`, counted where a call is
//! refused before it has a caller to report to the hooks.
//!
//! The facade records nothing until the program installs a recorder (an exporter): without one,
//! each update is a check of a global. With one, any backend works —
//! `metrics-exporter-prometheus` for a `/metrics` page, OpenTelemetry through a bridge crate,
//! StatsD, or `metrics-util`'s `DebuggingRecorder` in tests.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `idem_calls_total` | counter | `tool`, `outcome` | each call that reached the ledger, once, by how its claim was answered: `claimed`, `takeover`, `reconciled` (it ran), `replayed`, `unreadable_result` (a stored result the handler cannot read back: refused), `in_flight`, `conflict`, `unknown` (answered from the ledger), `ledger_unavailable` (nothing ran) |
//! | `idem_completions_total` | counter | `tool`, `outcome` | each outcome a won claim recorded: `completed`, `failed`, `unknown`, `given_back`, `superseded` ([`Completion`](crate::hooks::Completion)) |
//! | `idem_claim_duration_seconds` | histogram | `tool` | how long a claim took the ledger to answer (a resend included) |
//! | `idem_complete_duration_seconds` | histogram | `tool` | how long recording an outcome took (its quick retries included) |
//! | `idem_operations_in_progress` | gauge | `tool` | operations this process runs now (claims won, not yet recorded) |
//! | `idem_secret_refusals_total` | counter | `tool` | calls refused before their claim because this process has no usable secret: none configured, or not the one the ledger was keyed with (nothing executed; not counted in `idem_calls_total`) |
//! | `idem_ledger_unknown_operations` | gauge | — | operations whose outcome is unknown (current and superseded): each needs its operator |
//! | `idem_ledger_oldest_unknown_seconds` | gauge | — | how long ago the oldest of them was claimed (0 when there is none) |
//! | `idem_ledger_lapsed_leases` | gauge | — | operations in progress whose holder's lease lapsed (presumed dead) |
//! | `idem_ledger_sweep_backlog` | gauge | — | records past their retention that the sweep has not deleted yet |
//!
//! The `idem_ledger_*` gauges describe the whole ledger, not this process: they are refreshed by a
//! sweeper spawned with [`Admin::spawn_sweeper_with_gauges`](crate::admin::Admin::spawn_sweeper_with_gauges),
//! once per sweep, from one [`Admin::stats`](crate::admin::Admin::stats) (a scan of the ledger's
//! tables: run it on one replica, or at a period the database can afford).
//!
//! Every `{tool, outcome}` series of the two counters (and the tool's secret refusals) exists, at
//! zero, from a tool's first call on a handle ([`CALL_OUTCOMES`], [`COMPLETION_OUTCOMES`]). The durations are histograms: give
//! your exporter [`BUCKETS`] so they are exported with buckets rather than as summaries.
//!
//! Labels carry only tool names and fixed words — never refs, callers or arguments — so the
//! number of series stays bounded by the number of tools.

use std::time::Instant;

/// Each call's answer, by tool and `outcome`.
pub const CALLS: &str = "idem_calls_total";
/// Every `outcome` of [`CALLS`]: a fixed set, each series present (at zero) from a tool's first
/// call on a handle, so an alert on the first `ledger_unavailable` has a series to watch.
pub const CALL_OUTCOMES: [&str; 9] = [
    "claimed",
    "takeover",
    "reconciled",
    "replayed",
    "unreadable_result",
    "in_flight",
    "conflict",
    "unknown",
    "ledger_unavailable",
];
/// Every `outcome` of [`COMPLETIONS`], present at zero like [`CALL_OUTCOMES`].
pub const COMPLETION_OUTCOMES: [&str; 5] = ["completed", "failed", "unknown", "given_back", "superseded"];
/// Histogram buckets for the durations, in seconds, suited to ledger statements (half a
/// millisecond for an embedded SQLite claim to ten seconds, the default ledger timeout). Give
/// them to your exporter so the durations are histograms with buckets, aggregatable across
/// replicas — with `metrics-exporter-prometheus`:
/// `PrometheusBuilder::new().set_buckets_for_metric(Matcher::Prefix("idem_".into()), BUCKETS)`.
pub const BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Each recorded outcome of a won claim, by tool and `outcome`.
pub const COMPLETIONS: &str = "idem_completions_total";
/// How long claims take, in seconds, by tool.
pub const CLAIM_SECONDS: &str = "idem_claim_duration_seconds";
/// How long recording an outcome takes, in seconds, by tool.
pub const COMPLETE_SECONDS: &str = "idem_complete_duration_seconds";
/// Operations running in this process, by tool.
pub const IN_PROGRESS: &str = "idem_operations_in_progress";
/// Calls refused because this process has no usable secret, by tool.
pub const SECRET_REFUSALS: &str = "idem_secret_refusals_total";
/// The ledger's unknown operations (current and superseded).
pub const LEDGER_UNKNOWN: &str = "idem_ledger_unknown_operations";
/// How long ago the ledger's oldest unknown operation was claimed, in seconds.
pub const LEDGER_OLDEST_UNKNOWN_SECONDS: &str = "idem_ledger_oldest_unknown_seconds";
/// The ledger's operations in progress under a lapsed lease.
pub const LEDGER_LAPSED_LEASES: &str = "idem_ledger_lapsed_leases";
/// Records past their retention not swept yet.
pub const LEDGER_SWEEP_BACKLOG: &str = "idem_ledger_sweep_backlog";

/// Gives each metric its unit and help text in the installed recorder (exporters show them, as
/// Prometheus's `# HELP` lines). Call it once after installing the recorder; optional.
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        CALLS,
        Unit::Count,
        "Calls that reached the ledger, by tool and by how their claim was answered."
    );
    describe_counter!(COMPLETIONS, Unit::Count, "Outcomes recorded by calls that ran, by tool and outcome.");
    describe_histogram!(CLAIM_SECONDS, Unit::Seconds, "How long the ledger took to answer a claim.");
    describe_histogram!(COMPLETE_SECONDS, Unit::Seconds, "How long recording an outcome took.");
    describe_gauge!(IN_PROGRESS, Unit::Count, "Operations this process is running now.");
    describe_counter!(
        SECRET_REFUSALS,
        Unit::Count,
        "Calls refused because this process has no usable secret (none, or not the ledger's), by tool."
    );
    describe_gauge!(LEDGER_UNKNOWN, Unit::Count, "Operations in the ledger whose outcome is unknown.");
    describe_gauge!(
        LEDGER_OLDEST_UNKNOWN_SECONDS,
        Unit::Seconds,
        "How long ago the ledger's oldest unknown operation was claimed."
    );
    describe_gauge!(LEDGER_LAPSED_LEASES, Unit::Count, "Operations in progress whose holder's lease lapsed.");
    describe_gauge!(LEDGER_SWEEP_BACKLOG, Unit::Count, "Records past their retention not swept yet.");
}

/// The ledger gauges from one count of the ledger, taken at `now` (the ledger's clock).
#[allow(clippy::cast_precision_loss, reason = "gauges are floats; counts this large are not exact anyway")]
pub(super) fn ledger(stats: &crate::ledger::LedgerStats, now: u64) {
    let unknown = stats.unknown + stats.superseded_unknown;
    ::metrics::gauge!(LEDGER_UNKNOWN).set(unknown as f64);
    let oldest = stats.oldest_unknown.map_or(0, |at| now.saturating_sub(at));
    ::metrics::gauge!(LEDGER_OLDEST_UNKNOWN_SECONDS).set(oldest as f64 / 1000.0);
    ::metrics::gauge!(LEDGER_LAPSED_LEASES).set(stats.stale as f64);
    ::metrics::gauge!(LEDGER_SWEEP_BACKLOG).set(stats.sweepable as f64);
}

/// A tool's first call on a handle: every outcome's series, at zero.
pub(super) fn first_call(tool: &'static str) {
    for outcome in CALL_OUTCOMES {
        ::metrics::counter!(CALLS, "tool" => tool, "outcome" => outcome).increment(0);
    }
    for outcome in COMPLETION_OUTCOMES {
        ::metrics::counter!(COMPLETIONS, "tool" => tool, "outcome" => outcome).increment(0);
    }
    ::metrics::counter!(SECRET_REFUSALS, "tool" => tool).increment(0);
}

pub(super) fn call(tool: &'static str, outcome: &'static str) {
    ::metrics::counter!(CALLS, "tool" => tool, "outcome" => outcome).increment(1);
}

pub(super) fn secret_refused(tool: &'static str) {
    ::metrics::counter!(SECRET_REFUSALS, "tool" => tool).increment(1);
}

pub(super) fn completion(tool: &'static str, outcome: &'static str) {
    ::metrics::counter!(COMPLETIONS, "tool" => tool, "outcome" => outcome).increment(1);
}

/// The in-progress gauge, raised while this is held.
pub(super) struct Running(&'static str);

impl Running {
    pub(super) fn start(tool: &'static str) -> Self {
        ::metrics::gauge!(IN_PROGRESS, "tool" => tool).increment(1.0);
        Self(tool)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        ::metrics::gauge!(IN_PROGRESS, "tool" => self.0).decrement(1.0);
    }
}

/// A ledger statement's time, from its start.
pub(super) struct Timer(Instant);

impl Timer {
    pub(super) fn start() -> Self {
        Self(Instant::now())
    }

    pub(super) fn claimed(self, tool: &'static str) {
        ::metrics::histogram!(CLAIM_SECONDS, "tool" => tool).record(self.0.elapsed().as_secs_f64());
    }

    pub(super) fn completed(self, tool: &'static str) {
        ::metrics::histogram!(COMPLETE_SECONDS, "tool" => tool).record(self.0.elapsed().as_secs_f64());
    }
}
