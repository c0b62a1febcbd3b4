//! Metrics (feature `metrics`) through the facade's test recorder, `metrics-util`'s
//! `DebuggingRecorder`, set for this test's thread only (a current-thread runtime: every task
//! of the call runs on it): the counters after a fresh call, a replay, a conflict, an
//! in-flight repeat and an unreadable stored result; the latency histograms; the in-progress gauge while a handler runs.

use std::collections::BTreeMap;

use idem_runtime::ledger::Token;
use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, MemoryLedger, Recipe, Rejection};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

static SHIP: Recipe = Recipe::new("ship", &["parcel"]);

#[derive(Debug, Serialize, Deserialize)]
struct Error(String);

impl IdempotentError for Error {
    fn classify(&self) -> ErrorClass {
        ErrorClass::NothingHappened
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.code().to_owned())
    }
}

/// Every metric so far as `name{label=value,…}` (labels sorted) → its value. A snapshot drains
/// the recorder's counters and histograms, so each is added to what the earlier ones read.
fn read(snapshotter: &Snapshotter, totals: &mut BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let value = match value {
            DebugValue::Counter(n) => Value::Counter(n),
            DebugValue::Gauge(value) => Value::Gauge(value.into_inner()),
            DebugValue::Histogram(values) => Value::Histogram(values.len() as u64),
        };
        match (totals.get_mut(&name), value) {
            (Some(Value::Counter(total)), Value::Counter(n)) | (Some(Value::Histogram(total)), Value::Histogram(n)) => {
                *total += n;
            }
            (Some(Value::Gauge(total)), Value::Gauge(change)) => *total += change,
            (_, value) => {
                totals.insert(name, value);
            }
        }
    }
    totals.clone()
}

/// A metric's value; a histogram's, how many samples it holds.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(u64),
}

fn counter(metrics: &BTreeMap<String, Value>, name: &str) -> u64 {
    match metrics.get(name) {
        Some(Value::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
    }
}

fn gauge(metrics: &BTreeMap<String, Value>, name: &str) -> f64 {
    match metrics.get(name) {
        Some(Value::Gauge(value)) => *value,
        other => panic!("{name} is not a gauge: {other:?}"),
    }
}

fn samples(metrics: &BTreeMap<String, Value>, name: &str) -> u64 {
    match metrics.get(name) {
        Some(Value::Histogram(n)) => *n,
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

fn calls(outcome: &str) -> String {
    format!("idem_calls_total{{outcome={outcome},tool=ship}}")
}

#[tokio::test(flavor = "current_thread")]
async fn counters_after_a_fresh_call_a_replay_a_conflict_and_an_in_flight_repeat() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = ::metrics::set_default_local_recorder(&recorder);
    let mut totals = BTreeMap::new();
    idem_runtime::metrics::describe();

    let idem = Idem::new(MemoryLedger::new());
    let alice = Caller::new("acme", "alice");
    let parcel = format!("p-{}", Token::random().get());
    let args = json!({ "parcel": parcel, "to": "Berlin" });
    let ship = || async { Ok::<_, Error>("shipped".to_owned()) };

    idem.call(&SHIP, Some(&alice), &args, ship).await.unwrap();
    let m = read(&snapshotter, &mut totals);
    assert_eq!(counter(&m, &calls("claimed")), 1, "{m:?}");
    assert_eq!(counter(&m, "idem_completions_total{outcome=completed,tool=ship}"), 1, "{m:?}");
    assert_eq!(samples(&m, "idem_claim_duration_seconds{tool=ship}"), 1);
    assert_eq!(samples(&m, "idem_complete_duration_seconds{tool=ship}"), 1);
    assert!(gauge(&m, "idem_operations_in_progress{tool=ship}").abs() < f64::EPSILON, "nothing runs now");

    assert!(idem.call(&SHIP, Some(&alice), &args, ship).await.unwrap().replayed);
    let elsewhere = json!({ "parcel": parcel, "to": "Paris" });
    let conflict = idem.call(&SHIP, Some(&alice), &elsewhere, ship).await;
    assert!(matches!(conflict, Err(Error(code)) if code == "conflict"));
    let m = read(&snapshotter, &mut totals);
    assert_eq!(
        [calls("claimed"), calls("replayed"), calls("conflict"), calls("in_flight")].map(|name| counter(&m, &name)),
        [1, 1, 1, 0],
        "{m:?}"
    );
    assert_eq!(samples(&m, "idem_claim_duration_seconds{tool=ship}"), 3, "every claim is timed");
    assert_eq!(samples(&m, "idem_complete_duration_seconds{tool=ship}"), 1, "one outcome was recorded");

    // A second parcel whose handler waits: the gauge shows it running, and a repeat meanwhile
    // is counted in flight.
    let (started, release) = (Notify::new(), Notify::new());
    let args = json!({ "parcel": format!("{parcel}-2") });
    let first = idem.call(&SHIP, Some(&alice), &args, || async {
        started.notify_one();
        release.notified().await;
        Ok::<_, Error>("shipped".to_owned())
    });
    let repeat = async {
        idem_tests::within("the first call's handler to start", started.notified()).await;
        let during = read(&snapshotter, &mut totals);
        let repeat = idem.call(&SHIP, Some(&alice), &args, ship).await;
        release.notify_one();
        (during, repeat)
    };
    let (first, (during, repeat)) = tokio::join!(first, repeat);
    first.unwrap();
    assert!(matches!(repeat, Err(Error(code)) if code == "in_flight"));
    assert!((gauge(&during, "idem_operations_in_progress{tool=ship}") - 1.0).abs() < f64::EPSILON, "{during:?}");
    let m = read(&snapshotter, &mut totals);
    assert_eq!(
        [calls("claimed"), calls("replayed"), calls("conflict"), calls("in_flight")].map(|name| counter(&m, &name)),
        [2, 1, 1, 1],
        "{m:?}"
    );
    assert_eq!(counter(&m, "idem_completions_total{outcome=completed,tool=ship}"), 2);
    assert!(gauge(&m, "idem_operations_in_progress{tool=ship}").abs() < f64::EPSILON, "nothing runs now");

    // Issue 28, item 1: a stored result the handler cannot read back (here: another type) is
    // refused and counted as `unreadable_result` — not as a replay, as it was.
    let first = json!({ "parcel": parcel, "to": "Berlin" });
    let unreadable = idem.call(&SHIP, Some(&alice), &first, || async { Ok::<u64, Error>(1) }).await;
    assert!(matches!(&unreadable, Err(Error(code)) if code == "unreadable_result"), "{unreadable:?}");
    let m = read(&snapshotter, &mut totals);
    assert_eq!([calls("replayed"), calls("unreadable_result")].map(|name| counter(&m, &name)), [1, 1], "{m:?}");
}

/// Issue 28, item 5: what a Prometheus user alerts on. Latencies are histograms with buckets
/// (`_bucket` lines, aggregatable across replicas), configured with `metrics::BUCKETS` as the
/// example server does; and every `{tool, outcome}` series exists at zero from a tool's first
/// call, so `increase(idem_calls_total{outcome="ledger_unavailable"}[5m])` sees the first failure.
#[tokio::test(flavor = "current_thread")]
async fn a_prometheus_scrape_has_buckets_and_every_outcome_at_zero() {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("idem_".to_owned()), idem_runtime::metrics::BUCKETS)
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    let _local = ::metrics::set_default_local_recorder(&recorder);
    idem_runtime::metrics::describe();
    let idem = Idem::new(MemoryLedger::new());
    let alice = Caller::new("acme", "alice");
    let args = json!({ "parcel": format!("p-{}", Token::random().get()) });
    idem.call(&SHIP, Some(&alice), &args, || async { Ok::<_, Error>("shipped".to_owned()) }).await.unwrap();
    let scrape = handle.render();
    assert!(scrape.contains("idem_claim_duration_seconds_bucket{tool=\"ship\",le=\"0.001\"}"), "{scrape}");
    assert!(scrape.contains("idem_complete_duration_seconds_bucket{"), "{scrape}");
    for outcome in idem_runtime::metrics::CALL_OUTCOMES {
        let series = format!("idem_calls_total{{tool=\"ship\",outcome=\"{outcome}\"}}");
        assert!(scrape.contains(&series), "{series} in:\n{scrape}");
    }
    assert!(scrape.contains("idem_calls_total{tool=\"ship\",outcome=\"ledger_unavailable\"} 0"), "{scrape}");
    for outcome in idem_runtime::metrics::COMPLETION_OUTCOMES {
        let series = format!("idem_completions_total{{tool=\"ship\",outcome=\"{outcome}\"}}");
        assert!(scrape.contains(&series), "{series} in:\n{scrape}");
    }
}

/// Issue 28, item 5: the ledger gauges an operator alerts on (unknown operations, the oldest
/// one's age, lapsed leases, the sweep backlog), refreshed by the sweeper that carries them.
#[tokio::test(flavor = "current_thread")]
async fn the_sweeper_carries_the_ledger_gauges() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = ::metrics::set_default_local_recorder(&recorder);
    let mut totals = BTreeMap::new();
    let idem = Idem::new(MemoryLedger::new());
    let alice = Caller::new("acme", "alice");
    let unknown = idem
        .call(&SHIP, Some(&alice), &json!({ "parcel": "lost" }), || async {
            Err::<String, _>(Unknowable("the carrier did not answer".to_owned()))
        })
        .await;
    assert!(unknown.is_err());
    let sweeper = idem.admin().spawn_sweeper_with_gauges(std::time::Duration::from_millis(20), 100);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let stats = sweeper.stop().await;
    assert!(stats.sweeps >= 1, "{stats:?}");
    let m = read(&snapshotter, &mut totals);
    assert!((gauge(&m, "idem_ledger_unknown_operations{}") - 1.0).abs() < f64::EPSILON, "{m:?}");
    assert!(gauge(&m, "idem_ledger_oldest_unknown_seconds{}") >= 0.0, "{m:?}");
    assert!(gauge(&m, "idem_ledger_lapsed_leases{}").abs() < f64::EPSILON, "{m:?}");
    assert!(gauge(&m, "idem_ledger_sweep_backlog{}").abs() < f64::EPSILON, "{m:?}");
}

#[derive(Debug, Serialize, Deserialize)]
struct Unknowable(String);

impl IdempotentError for Unknowable {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Unknown
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self(rejection.code().to_owned())
    }
}

/// Issue 45, item 4: a replica keyed with another secret than the ledger's refuses every call
/// before its claim — counted in `idem_secret_refusals_total` (what `IdemSecretUnusable` alerts
/// on), not as a call answered by the ledger — and the series exists at zero from a tool's first
/// call, so the alert's `increase` sees the first refusal.
#[tokio::test(flavor = "current_thread")]
async fn a_replica_with_another_secret_counts_its_refusals() {
    use idem_runtime::secret::Secret;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = ::metrics::set_default_local_recorder(&recorder);
    let mut totals = BTreeMap::new();
    let ledger: std::sync::Arc<dyn idem_runtime::ledger::Ledger> = std::sync::Arc::new(MemoryLedger::new());
    let alice = Caller::new("acme", "alice");
    let ship = || async { Ok::<_, Error>("shipped".to_owned()) };
    let keyed =
        Idem::builder(std::sync::Arc::clone(&ledger)).secret(Secret::new(1, &[0x31; 32]).unwrap()).build().unwrap();
    keyed.call(&SHIP, Some(&alice), &json!({ "parcel": "p-1" }), ship).await.unwrap();
    let m = read(&snapshotter, &mut totals);
    assert_eq!(counter(&m, "idem_secret_refusals_total{tool=ship}"), 0, "{m:?}");
    assert!(m.contains_key("idem_secret_refusals_total{tool=ship}"), "the series exists at zero: {m:?}");

    let other = Idem::builder(ledger).secret(Secret::new(1, &[0x32; 32]).unwrap()).build().unwrap();
    let refused = other.call(&SHIP, Some(&alice), &json!({ "parcel": "p-2" }), ship).await;
    assert!(matches!(&refused, Err(Error(code)) if code == "ledger_unavailable"), "{refused:?}");
    let m = read(&snapshotter, &mut totals);
    assert_eq!(counter(&m, "idem_secret_refusals_total{tool=ship}"), 1, "{m:?}");
    assert_eq!(counter(&m, &calls("claimed")), 1, "only the first replica's call was claimed: {m:?}");
    assert_eq!(counter(&m, &calls("ledger_unavailable")), 0, "{m:?}");
}
