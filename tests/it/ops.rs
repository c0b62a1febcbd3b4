//! The operator's files under `ops/` (issue 45, item 4): every metric the Prometheus rules and the
//! Grafana dashboard name is one the code exports, and every `outcome` they match on is one it
//! reports — so a renamed metric or outcome fails here, not in a silent alert. promtool checks the
//! rules, runs their unit tests and parses the dashboard's queries (`scripts/check-ops.sh`, run
//! by `.ci/run`).

use std::collections::BTreeSet;

use idem_runtime::metrics;
use idem_tests::workspace_file as file;

/// Every metric name (`idem_…`, not a recording rule's `idem:…`) in `text`, a histogram's
/// `_bucket`, `_sum` and `_count` series named by the histogram.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find("idem_") {
        let start = at + found;
        let before = start.checked_sub(1).map(|i| bytes[i]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        at = end;
        let name = &text[start..end];
        // Part of a longer word (a path such as `idem_runtime::metrics`) is not a metric, nor is a
        // family written in prose (`idem_ledger_*`).
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            || text[end..].starts_with("::")
            || name.ends_with('_')
        {
            continue;
        }
        let name = ["_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix)).unwrap_or(name);
        names.insert(name.to_owned());
    }
    names
}

/// Every `outcome` value a matcher in `text` names (`outcome="x"`, `outcome=~"x|y"`).
fn outcomes(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("outcome=") {
        let rest = text[at + "outcome=".len()..].trim_start_matches('~');
        let rest = rest.trim_start_matches('\\').trim_start_matches('"');
        let end = rest.find(['"', '\\']).expect("a quoted outcome");
        found.extend(rest[..end].split('|').map(str::to_owned));
    }
    found
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let exported: BTreeSet<String> = [
        metrics::CALLS,
        metrics::COMPLETIONS,
        metrics::CLAIM_SECONDS,
        metrics::COMPLETE_SECONDS,
        metrics::IN_PROGRESS,
        metrics::SECRET_REFUSALS,
        metrics::LEDGER_UNKNOWN,
        metrics::LEDGER_OLDEST_UNKNOWN_SECONDS,
        metrics::LEDGER_LAPSED_LEASES,
        metrics::LEDGER_SWEEP_BACKLOG,
    ]
    .map(str::to_owned)
    .into();
    let reported: BTreeSet<String> = metrics::CALL_OUTCOMES
        .iter()
        .chain(&metrics::COMPLETION_OUTCOMES)
        .map(|outcome| (*outcome).to_owned())
        .collect();
    let mut named_anywhere = BTreeSet::new();
    for path in ["ops/prometheus/idem.rules.yml", "ops/grafana/idem.json"] {
        let text = file(path);
        let names = metric_names(&text);
        assert!(!names.is_empty(), "{path} names no metric");
        let unknown: Vec<_> = names.difference(&exported).collect();
        assert!(unknown.is_empty(), "{path} names metrics the code does not export: {unknown:?}");
        let unreported: Vec<_> = outcomes(&text).into_iter().filter(|outcome| !reported.contains(outcome)).collect();
        assert!(unreported.is_empty(), "{path} matches outcomes the code never reports: {unreported:?}");
        named_anywhere.extend(names);
    }
    // And each metric an operator acts on has an alert or a panel.
    let unwatched: Vec<_> = exported.difference(&named_anywhere).collect();
    assert!(unwatched.is_empty(), "exported but in no rule or panel: {unwatched:?}");
}

/// The scanner above finds names and outcomes where the files write them, and skips a crate path.
#[test]
fn the_scanner_reads_names_and_outcomes() {
    let text = r#"rate(idem_calls_total{outcome=~"conflict|in_flight"}[5m]) idem_claim_duration_seconds_bucket
        idem_runtime::metrics::BUCKETS x{outcome=\"claimed\"} idem:calls:rate5m the idem_ledger_* gauges"#;
    assert_eq!(metric_names(text), ["idem_calls_total", "idem_claim_duration_seconds"].map(str::to_owned).into());
    assert_eq!(outcomes(text), ["claimed", "conflict", "in_flight"].map(str::to_owned).into());
}
