//! What idempotency costs, measured side by side in one run: `cargo bench -p idem-tests --bench ledger`.
//!
//! Every figure is a ratio against the cheapest way to do the same work, measured in the same
//! run on the same machine and pool: raw sqlx executing idem's own claim and completion
//! statements. Durable backends that do not answer are skipped and say so.
//! `IDEM_BENCH_OPS` sets the operations per measurement (default 2000); `IDEM_BENCH_ONLY=waiting`
//! runs only the measurement of 1,000 repeats waiting on one operation (`wait`), and
//! `IDEM_BENCH_ONLY=cpu` only the key derivation and the wrapped no-op (no database; `key` and
//! `noop` one of them, for a profiler);
//! `IDEM_BENCH_ONLY=storm` only the storms on the three databases; `IDEM_BENCH_ONLY=http` only the
//! HTTP layer (its overhead per request against the same axum handler without it, and a storm
//! of 1,000 identical requests), and with `IDEM_BENCH_HTTP_SERIES` (`bare`, `first`, `replay`,
//! `peer-first`, `peer-replay`) ten times `IDEM_BENCH_OPS` requests of that one series alone, for
//! a profiler or `perf stat`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::sea::statements::Statements;
use idem_runtime::ledger::{Ledger, Token};
use idem_runtime::{Caller, ErrorClass, Idem, IdempotentError, Key, MemoryLedger, Recipe, Rejection};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use sea_orm::sqlx;
use sea_orm::{ConnectionTrait, DbBackend};
use serde::{Deserialize, Serialize};
use serde_json::json;

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

static RECIPE: Recipe = Recipe::new("bench", &["order_id"]);
/// Repeats wait up to 30 s for an operation in progress (`wait = "30s"`).
static WAITING: Recipe = Recipe::new("bench_wait", &["order_id"]).wait(Duration::from_secs(30));

fn ops() -> usize {
    std::env::var("IDEM_BENCH_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

/// A 200-byte result once stored (`{"ok":"xxx…"}`).
fn payload() -> String {
    "x".repeat(200 - 9)
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index.min(samples.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Row {
    what: String,
    idem: String,
    baseline: String,
    ratio: String,
}

fn row(rows: &mut Vec<Row>, what: impl Into<String>, idem: String, baseline: String, ratio: f64) {
    rows.push(Row { what: what.into(), idem, baseline, ratio: format!("{ratio:.2}") });
}

/// One raw round trip that reads a record back: what a replay costs at the least.
async fn raw_read(db: &sea_orm::DatabaseConnection, key: Vec<u8>) {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let sql = "SELECT state, result FROM idem_records WHERE key = $1";
            sqlx::query(sql).bind(key).fetch_optional(db.get_postgres_connection_pool()).await.unwrap();
        }
        DbBackend::Sqlite => {
            let sql = "SELECT state, result FROM idem_records WHERE key = ?";
            sqlx::query(sql).bind(key).fetch_optional(db.get_sqlite_connection_pool()).await.unwrap();
        }
        _ => {
            let sql = "SELECT state, result FROM idem_records WHERE `key` = ?";
            sqlx::query(sql).bind(key).fetch_optional(db.get_mysql_connection_pool()).await.unwrap();
        }
    }
}

/// The p50 of 1,000 raw reads of absent keys spawned together behind a barrier on `db`'s pool,
/// each timed from the barrier as a storm's calls are.
async fn raw_crowd(db: &sea_orm::DatabaseConnection) -> Duration {
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let handles: Vec<_> = (0..1000)
        .map(|_| {
            let (db, barrier) = (db.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let start = Instant::now();
                raw_read(&db, idem_tests::raw::random_key()).await;
                start.elapsed()
            })
        })
        .collect();
    let mut took = Vec::with_capacity(handles.len());
    for handle in handles {
        took.push(handle.await.unwrap());
    }
    percentile(&mut took, 0.5)
}

fn caller() -> Caller {
    Caller::new("bench", "runner")
}

async fn idem_pair(idem: &Idem, id: u64, value: &str) {
    let args = json!({ "order_id": format!("{id}-{}", Token::random().get()), "amount": 1250, "note": "n" });
    idem.call(&RECIPE, Some(&caller()), &args, || async { Ok::<_, Error>(value.to_owned()) }).await.unwrap();
}

async fn latency(rows: &mut Vec<Row>, name: &str, ledger: &SeaOrmLedger) {
    let db = ledger.connection().clone();
    let backend = db.get_database_backend();
    // The ledger's own statements: its claim, and its completion of a completed result.
    let statements = Statements::of(backend);
    let idem = idem_tests::idem(ledger.clone());
    let value = payload();
    let n = ops();
    for i in 0..200 {
        idem_pair(&idem, i, &value).await;
        idem_tests::raw::pair(&db, statements, i).await;
    }
    // Interleave the two so drift on a shared machine hits both alike.
    let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n as u64 {
        let start = Instant::now();
        idem_pair(&idem, i, &value).await;
        ours.push(start.elapsed());
        let start = Instant::now();
        idem_tests::raw::pair(&db, statements, i).await;
        theirs.push(start.elapsed());
    }
    let (p50, r50) = (percentile(&mut ours, 0.5), percentile(&mut theirs, 0.5));
    let (p99, r99) = (percentile(&mut ours, 0.99), percentile(&mut theirs, 0.99));
    row(
        rows,
        format!("{name}: first call p50 (claim+complete)"),
        format!("{:.0} µs", micros(p50)),
        format!("{:.0} µs", micros(r50)),
        micros(p50) / micros(r50),
    );
    row(
        rows,
        format!("{name}: first call p99"),
        format!("{:.0} µs", micros(p99)),
        format!("{:.0} µs", micros(r99)),
        micros(p99) / micros(r99),
    );

    // A repeat (replay) against one raw read of the record.
    let args = json!({ "order_id": "replayed", "amount": 1250, "note": "n" });
    let first = idem.call(&RECIPE, Some(&caller()), &args, || async { Ok::<_, Error>(value.clone()) }).await.unwrap();
    let _ = first;
    let key = idem_tests::raw::random_key();
    let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let start = Instant::now();
        let served =
            idem.call(&RECIPE, Some(&caller()), &args, || async { Ok::<_, Error>(String::new()) }).await.unwrap();
        ours.push(start.elapsed());
        assert!(served.replayed);
        let start = Instant::now();
        raw_read(&db, key.clone()).await;
        theirs.push(start.elapsed());
    }
    let (p50, r50) = (percentile(&mut ours, 0.5), percentile(&mut theirs, 0.5));
    row(
        rows,
        format!("{name}: repeat p50 (replay vs one raw read)"),
        format!("{:.0} µs", micros(p50)),
        format!("{:.0} µs", micros(r50)),
        micros(p50) / micros(r50),
    );

    for tasks in [1usize, 32] {
        // Three alternating rounds, the best of each side: drift on a shared machine hits both.
        let per_task = (n / tasks / 2).max(20);
        let total = per_task * tasks;
        let (mut ours, mut theirs) = (0f64, 0f64);
        for round in 0..3 {
            let base = round * total;
            let start = Instant::now();
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let (idem, value) = (idem.clone(), value.clone());
                    tokio::spawn(async move {
                        for i in 0..per_task {
                            idem_pair(&idem, (base + t * per_task + i) as u64, &value).await;
                        }
                    })
                })
                .collect();
            for handle in handles {
                handle.await.unwrap();
            }
            ours = ours.max(total as f64 / start.elapsed().as_secs_f64());
            let start = Instant::now();
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let db = db.clone();
                    tokio::spawn(async move {
                        for i in 0..per_task {
                            idem_tests::raw::pair(&db, statements, (base + t * per_task + i) as u64).await;
                        }
                    })
                })
                .collect();
            for handle in handles {
                handle.await.unwrap();
            }
            theirs = theirs.max(total as f64 / start.elapsed().as_secs_f64());
        }
        row(
            rows,
            format!("{name}: throughput, {tasks} task(s), distinct keys (best of 3)"),
            format!("{ours:.0}/s"),
            format!("{theirs:.0}/s"),
            ours / theirs,
        );
    }
}

/// 1,000 concurrent identical calls: exactly one execution; in-flight answers next to a claim.
/// A storm of 1,000 identical calls: on one handle (the winner among them), and — given a second
/// handle on the same ledger with a pool of its own, as another replica — 999 repeats there while
/// the first call runs on the first. Every repeat must be answered "in flight" while the first
/// call runs, and the handler must run once. The baseline: one raw read of a record on the
/// repeats' pool (`read`), or for the memory ledger one uncontended first call.
async fn storm(
    rows: &mut Vec<Row>,
    name: &str,
    ledger: Arc<dyn Ledger>,
    replica: Option<(Arc<dyn Ledger>, &sea_orm::DatabaseConnection)>,
) {
    let idem = idem_tests::idem_shared(ledger);
    let baseline = match &replica {
        Some((_, db)) => {
            let mut reads = Vec::new();
            for _ in 0..200 {
                let start = Instant::now();
                raw_read(db, idem_tests::raw::random_key()).await;
                reads.push(start.elapsed());
            }
            (percentile(&mut reads, 0.5), "one raw read")
        }
        None => {
            let mut single = Vec::new();
            for i in 0..200 {
                let start = Instant::now();
                idem_pair(&idem, i, "x").await;
                single.push(start.elapsed());
            }
            (percentile(&mut single, 0.5), "first call")
        }
    };
    // What the machine does with a thousand database answers at once, with no idem at all: a
    // thousand raw reads spawned together on the same pool (the storm's floor on these cores).
    let crowd = match &replica {
        Some((_, db)) => Some(raw_crowd(db).await),
        None => None,
    };
    if let Some(crowd) = crowd {
        row(
            rows,
            format!("{name}: 1000 raw reads at once on one pool, p50 (no idem)"),
            format!("{:.0} µs", micros(crowd)),
            format!("{:.0} µs one raw read", micros(baseline.0)),
            micros(crowd) / micros(baseline.0),
        );
    }
    let other = replica.map(|(ledger, _)| idem_tests::idem_shared(ledger));
    // Warm handles, as a serving replica's are: each has read the ledger's clock once.
    for warm in std::iter::once(&idem).chain(other.as_ref()) {
        idem_pair(warm, Token::random().get(), "warm-up").await;
    }
    for (place, repeats) in [("one handle", Some(&idem)), ("another replica", other.as_ref())] {
        let Some(repeats) = repeats else { continue };
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let args = json!({ "order_id": format!("storm-{}", Token::random().get()) });
        let call = |idem: &Idem| {
            let (idem, runs, release, args) = (idem.clone(), Arc::clone(&runs), Arc::clone(&release), args.clone());
            async move {
                let start = Instant::now();
                let result = idem
                    .call(&RECIPE, Some(&caller()), &args, || async {
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        release.notified().await;
                        Ok::<_, Error>(())
                    })
                    .await;
                (result.is_err(), start.elapsed())
            }
        };
        let mut first = None;
        let storm = if std::ptr::eq(repeats, &idem) {
            1000
        } else {
            // The first call runs on its own replica before the storm reaches the other.
            first = Some(tokio::spawn(call(&idem)));
            while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            999
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(storm));
        let handles: Vec<_> = (0..storm)
            .map(|_| {
                let (barrier, call) = (Arc::clone(&barrier), call(repeats));
                tokio::spawn(async move {
                    barrier.wait().await;
                    call.await
                })
            })
            .collect();
        let mut in_flight = Vec::new();
        let mut pending = handles;
        while in_flight.len() < 999 {
            let mut still = Vec::new();
            for handle in pending {
                if handle.is_finished() {
                    let (refused, took) = handle.await.unwrap();
                    assert!(refused, "only the winner may finish first");
                    in_flight.push(took);
                } else {
                    still.push(handle);
                }
            }
            pending = still;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        release.notify_one();
        for handle in pending.into_iter().chain(first) {
            handle.await.unwrap();
        }
        let executions = runs.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(executions, 1, "{name}: the storm must execute exactly once");
        let (p50, p99) = (percentile(&mut in_flight, 0.5), percentile(&mut in_flight, 0.99));
        let (scale, what) = baseline;
        row(
            rows,
            format!("{name}: storm of 1000 on {place}, in-flight p50 (executions: {executions})"),
            format!("{:.0} µs", micros(p50)),
            format!("{:.0} µs {what}", micros(scale)),
            micros(p50) / micros(scale),
        );
        if let Some(crowd) = crowd {
            row(
                rows,
                format!("{name}: storm of 1000 on {place}, in-flight p50 vs 1000 raw reads at once"),
                format!("{:.0} µs", micros(p50)),
                format!("{:.0} µs raw crowd p50", micros(crowd)),
                micros(p50) / micros(crowd),
            );
        }
        row(
            rows,
            format!("{name}: storm of 1000 on {place}, in-flight p99"),
            format!("{:.0} µs", micros(p99)),
            String::new(),
            micros(p99) / micros(scale),
        );
    }
}

async fn bytes_per_row(rows: &mut Vec<Row>, url: &str) {
    let Ok(db) = sea_orm::Database::connect(SeaOrmLedger::connect_options(url)).await else { return };
    db.execute_unprepared("DROP SCHEMA IF EXISTS idem_bench_rows CASCADE").await.unwrap();
    db.execute_unprepared("CREATE SCHEMA idem_bench_rows").await.unwrap();
    let scoped =
        format!("{url}{}options=-c%20search_path%3Didem_bench_rows", if url.contains('?') { '&' } else { '?' });
    let ledger = SeaOrmLedger::connect(&scoped).await.unwrap();
    let idem = idem_tests::idem(ledger.clone());
    let value = payload();
    let n = 10_000;
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (idem, value) = (idem.clone(), value.clone());
            tokio::spawn(async move {
                for i in 0..n / 8 {
                    idem_pair(&idem, (t * n + i) as u64, &value).await;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let conn = ledger.connection();
    conn.execute_unprepared("VACUUM idem_bench_rows.idem_records").await.unwrap();
    let row_ = conn
        .query_one_raw(sea_orm::Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_relation_size('idem_bench_rows.idem_records')::bigint, \
             pg_relation_size('idem_bench_rows.idem_records_pkey')::bigint, \
             pg_relation_size('idem_bench_rows.idem_records_window_end')::bigint, \
             (SELECT count(*) FROM idem_bench_rows.idem_records)::bigint, \
             (SELECT avg(pg_column_size(r.*))::float8 FROM idem_bench_rows.idem_records r), \
             (SELECT n_tup_hot_upd::float8 / greatest(n_tup_upd, 1) FROM pg_stat_user_tables \
              WHERE schemaname = 'idem_bench_rows' AND relname = 'idem_records')",
        ))
        .await
        .unwrap()
        .unwrap();
    let heap: i64 = row_.try_get_by_index(0).unwrap();
    let pk: i64 = row_.try_get_by_index(1).unwrap();
    let exp: i64 = row_.try_get_by_index(2).unwrap();
    let count: i64 = row_.try_get_by_index(3).unwrap();
    let tuple: f64 = row_.try_get_by_index(4).unwrap();
    let hot: f64 = row_.try_get_by_index::<Option<f64>>(5).unwrap().unwrap_or(0.0);
    let per = |bytes: i64| bytes as f64 / count as f64;
    let total = per(heap + pk + exp);
    // Floor: the tuple plus its line pointer, packed into 8 KiB pages; one 48-byte PK entry and
    // one 16-byte window_end entry, each with a 4-byte line pointer, in full index pages.
    let heap_floor = 8192.0 / ((8192.0 - 24.0) / (tuple + 4.0)).floor();
    let floor = heap_floor + (48.0 + 4.0) * 8192.0 / 8152.0 + (16.0 + 4.0) * 8192.0 / 8152.0;
    row(
        rows,
        format!(
            "PostgreSQL bytes/row, 200-byte result (heap {:.0} + pkey {:.0} + window_end {:.0}; tuple {tuple:.0}; HOT {:.0}%)",
            per(heap),
            per(pk),
            per(exp),
            hot * 100.0
        ),
        format!("{total:.0} B"),
        format!("{floor:.0} B floor"),
        total / floor,
    );
    drop(conn.execute_unprepared("DROP SCHEMA IF EXISTS idem_bench_rows CASCADE").await);
}

#[derive(Serialize)]
struct Charge {
    order_id: String,
    card: String,
    amount_cents: u64,
    currency: String,
    description: Option<String>,
}

fn charge_args(i: u64) -> Charge {
    Charge {
        order_id: format!("order-{i}"),
        card: "tok_visa_4242".into(),
        amount_cents: 1250 + i,
        currency: "eur".into(),
        description: Some("two coffees and a croissant".into()),
    }
}

/// Nanoseconds per iteration of `f`, the best of fifty rounds of `n / 10` (the least disturbed:
/// on a shared machine short rounds are more often undisturbed).
fn nanos_per(n: u64, mut f: impl FnMut(u64)) -> f64 {
    let n = (n / 10).max(1);
    (0..50)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                f(i);
            }
            start.elapsed().as_secs_f64() * 1e9 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Nanoseconds per key of idem's key and fingerprint digest, as [`cpu`] measured them.
fn cpu(rows: &mut Vec<Row>) -> f64 {
    use idem_runtime::canonical;
    use sha2::{Digest, Sha256};
    let scope = idem_runtime::scope::Scope::caller(&caller());
    let secret = idem_tests::test_secret();
    let n = 20_000;
    // What `#[idempotent]` does per call: the arguments streamed to canonical members, the key
    // over two selected fields, the fingerprint's digest of all — and, for a claim that is sent
    // (not answered by an identical call's), one tag per argument.
    // Exactly what the engine derives (`Attempt::prepare`, and `complete_request` for the tags).
    static CHARGE: Recipe = Recipe::new("charge_card", &["order_id", "amount_cents"]);
    let derive_with = |tags: bool| {
        nanos_per(n, |i| {
            let args = charge_args(i);
            let derived = idem_runtime::__private::derive(&secret, "bench", &scope, &CHARGE, &args, tags).unwrap();
            std::hint::black_box(derived);
        })
    };
    let derive = derive_with(false);
    let tagged = derive_with(true);
    let plain = nanos_per(n, |i| {
        let bytes = serde_json::to_vec(&charge_args(i)).unwrap();
        std::hint::black_box(Sha256::digest(&bytes));
    });
    let canonical_bytes = canonical::to_canonical_vec(&canonical::to_value(&charge_args(1)).unwrap()).unwrap();
    let sha_only = nanos_per(n, |_| {
        std::hint::black_box(Sha256::digest(std::hint::black_box(&canonical_bytes)));
    });
    let build = nanos_per(n, |i| {
        std::hint::black_box(charge_args(i));
    });
    row(
        rows,
        "key + fingerprint digest, 5-field struct: every call (vs serde_json::to_vec + SHA-256)",
        format!("{:.0} ns", derive - build),
        format!("{:.0} ns", plain - build),
        (derive - build) / (plain - build),
    );
    row(
        rows,
        "key + fingerprint + 5 argument tags, a claim that is sent (vs the same baseline)",
        format!("{:.0} ns", tagged - build),
        format!("{:.0} ns", plain - build),
        (tagged - build) / (plain - build),
    );
    row(
        rows,
        "key + fingerprint (vs SHA-256 alone over the canonical bytes)",
        format!("{:.0} ns", derive - build),
        format!("{sha_only:.0} ns"),
        (derive - build) / sha_only,
    );
    derive - build
}

/// The Powertools release the bench installs: a pinned version, so that a run is repeatable.
const POWERTOOLS: &str = "aws-lambda-powertools==3.37.0";

/// Key derivation in AWS Lambda Powertools' idempotency utility, per key, beside idem's
/// (`idem_nanos`, from [`cpu`]): `benches/powertools_keys.py` run by the Python of a venv the
/// bench makes under cargo's target directory and installs Powertools into from PyPI (once; a
/// later run reuses it). Without Python or PyPI the rows say why they are missing.
fn powertools(rows: &mut Vec<Row>, idem_nanos: f64) {
    use std::process::Command;
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("powertools-venv");
    let python = venv.join("bin/python");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/powertools_keys.py");
    let run = |command: &mut Command| -> Result<String, String> {
        let output = command.output().map_err(|error| format!("{command:?}: {error}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("{command:?} failed: {}", stderr.lines().last().unwrap_or_default()));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let installed = || run(Command::new(&python).args(["-c", "import aws_lambda_powertools, boto3, jmespath"])).is_ok();
    let ready = if installed() {
        Ok(())
    } else {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .and_then(|_| {
                run(Command::new(venv.join("bin/pip")).args([
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    POWERTOOLS,
                    "boto3",
                    "jmespath",
                ]))
            })
            .map(drop)
    };
    let measured = ready.and_then(|()| run(Command::new(&python).arg(&script).arg((ops() * 10).to_string())));
    let output = match measured {
        Ok(output) => output,
        Err(why) => {
            println!("Powertools key derivation not measured: {why}");
            row(
                rows,
                format!("key derivation: {POWERTOOLS} not measured ({why})"),
                String::new(),
                String::new(),
                f64::NAN,
            );
            return;
        }
    };
    for line in output.lines() {
        let Some((what, nanos)) = line.rsplit_once(' ') else { continue };
        let Ok(nanos) = nanos.parse::<f64>() else { continue };
        let what = match what {
            "default" => "its defaults: the whole event, MD5",
            "key+validation" => "key by JMESPath over the two key fields + payload validation of the event, SHA-256",
            other => other,
        };
        row(
            rows,
            format!("key derivation per key, Powertools ({what}): ratio = how many times idem is faster"),
            format!("{idem_nanos:.0} ns idem"),
            format!("{nanos:.0} ns Powertools"),
            nanos / idem_nanos,
        );
    }
}

/// Where the key's time goes, part by part (each the best of fifty rounds, the arguments'
/// construction taken off): `IDEM_BENCH_ONLY=key-parts`, for whoever makes it faster.
fn key_parts(rows: &mut Vec<Row>) {
    use idem_runtime::canonical;
    use idem_runtime::key::Fingerprint;
    let scope = idem_runtime::scope::Scope::caller(&caller());
    let secret = idem_tests::test_secret();
    let n = 20_000;
    let build = nanos_per(n, |i| {
        std::hint::black_box(charge_args(i));
    });
    let members = nanos_per(n, |i| {
        std::hint::black_box(canonical::Members::of_arguments(&charge_args(i)).unwrap());
    });
    let selected = nanos_per(n, |i| {
        let args = charge_args(i);
        let mut selected = canonical::Members::new();
        selected.insert("order_id", &args.order_id).unwrap();
        selected.insert("amount_cents", &args.amount_cents).unwrap();
        std::hint::black_box(selected);
    });
    let all = canonical::Members::of_arguments(&charge_args(1)).unwrap();
    let mut chosen = canonical::Members::new();
    chosen.insert("order_id", "order-1").unwrap();
    chosen.insert("amount_cents", &1251u64).unwrap();
    let key = nanos_per(n, |_| {
        std::hint::black_box(Key::derive_members(&secret, "bench", &scope, "charge_card", &chosen).unwrap());
    });
    let digest = nanos_per(n, |_| {
        std::hint::black_box(Fingerprint::digest_of_members(&secret, &all, &[]));
    });
    let tags = nanos_per(n, |_| {
        let mut fingerprint = Fingerprint::digest_of_members(&secret, &all, &[]);
        fingerprint.tag(&secret);
        std::hint::black_box(fingerprint);
    }) - digest;
    for (what, nanos) in [
        ("the arguments' canonical members (of_arguments)", members - build),
        ("the key's two members (two inserts)", selected - build),
        ("the key's HMAC over its material (derive_members)", key),
        ("the fingerprint's digest (digest_of_members)", digest),
        ("the five argument tags (tag)", tags),
    ] {
        row(rows, format!("key part: {what}"), format!("{nanos:.0} ns"), String::new(), f64::NAN);
    }
}

async fn wrapped_noop(rows: &mut Vec<Row>) {
    // 20,000 calls a round by default (ten per `IDEM_BENCH_OPS`).
    let n = ops() as u64 * 10;
    let args: Vec<_> = (0..n).map(|i| json!({ "order_id": i, "amount": 1250 })).collect();
    let mut wrapped = f64::INFINITY;
    let mut bare = f64::INFINITY;
    for _ in 0..20 {
        let idem = idem_tests::idem(MemoryLedger::new());
        let start = Instant::now();
        for args in &args {
            idem.call(&RECIPE, Some(&caller()), args, || async { Ok::<_, Error>(()) }).await.unwrap();
        }
        wrapped = wrapped.min(start.elapsed().as_secs_f64() * 1e9 / n as f64);
        let start = Instant::now();
        for args in &args {
            std::hint::black_box(async { Ok::<_, Error>(std::hint::black_box(args)) }.await).unwrap();
        }
        bare = bare.min(start.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    row(
        rows,
        "wrapped no-op handler, memory ledger: added per call",
        format!("{:.0} ns", wrapped - bare),
        format!("{bare:.0} ns bare call"),
        wrapped / bare.max(1.0),
    );
}

/// The handler every HTTP series serves at `POST /pay`: it reads its arguments from the JSON body,
/// as a real handler does, waits `delay`, counts the charge and answers a small JSON receipt; and
/// the count.
fn charge_route(delay: Duration) -> (axum::routing::MethodRouter, Arc<std::sync::atomic::AtomicUsize>) {
    let charges = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&charges);
    let handler = move |axum::Json(charge): axum::Json<serde_json::Value>| {
        let counted = Arc::clone(&counted);
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            axum::Json(json!({ "charge": format!("ch_{n}"), "amount": charge["amount"] }))
        }
    };
    (axum::routing::post(handler), charges)
}

/// `GET /warm`, which no layer protects: it answers after 50 ms, so that 1,000 of them sent at
/// once open 1,000 connections, which the client keeps for the storm that follows.
fn warm_route() -> axum::routing::MethodRouter {
    axum::routing::get(|| tokio::time::sleep(Duration::from_millis(50)))
}

/// An axum server on a local port whose `POST /pay` answers a small JSON receipt after counting
/// the charge, with `IdempotencyLayer` on `idem` (or bare without one): its URL and its count.
async fn http_server(
    idem: Option<Idem>,
    delay: Duration,
    wait: Option<Duration>,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let (pay, charges) = charge_route(delay);
    let mut app = axum::Router::new().route("/pay", pay).route("/warm", warm_route());
    if let Some(idem) = idem {
        let principal = |_: &http::request::Parts| Some(caller());
        let layer = idem_runtime::http::IdempotencyLayer::new(idem, principal).namespace("bench").route(
            http::Method::POST,
            "/pay",
            match wait {
                Some(wait) => idem_runtime::http::Route::new().wait(wait),
                None => idem_runtime::http::Route::new(),
            },
        );
        app = app.layer(layer);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/pay"), charges)
}

/// How the peer, `axum-idempotent` 0.6, keys a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PeerMode {
    /// `use_idempotency_key_header`: the client's `Idempotency-Key` is the key (its README's
    /// payments example); nothing else of the request is looked at.
    KeyHeader,
    /// Its default: a BLAKE3 hash of the method, target, headers and body is the key.
    Hashing,
}

/// The same axum handler as [`http_server`]'s behind `axum-idempotent` 0.6 with its in-memory
/// session store (`ruts`' moka store), layered as its README says (cookies, sessions, then the
/// idempotency layer). It caches only for a request that carries a session, so `GET /session`
/// hands one out: its URL, the session cookie and the count.
async fn peer_server(mode: PeerMode, delay: Duration) -> (String, String, Arc<std::sync::atomic::AtomicUsize>) {
    let (pay, charges) = charge_route(delay);
    let store = Arc::new(ruts::store::moka::MokaStore::builder().build());
    let mut options = axum_idempotent::IdempotentOptions::default().expire_after(600);
    if mode == PeerMode::KeyHeader {
        options = options.use_idempotency_key_header(Some("idempotency-key"), true);
    }
    let cookie = ruts::CookieOptions::build().name("session").max_age(3600).path("/");
    // The idempotency layer on `/pay` only: `/session` carries no key.
    let app = axum::Router::new()
        .route("/pay", pay)
        .layer(axum_idempotent::IdempotentLayer::<ruts::store::moka::MokaStore>::new(options))
        .route("/warm", warm_route())
        .route(
            "/session",
            axum::routing::get(|session: ruts::Session<ruts::store::moka::MokaStore>| async move {
                session.set("client", &"bench", ruts::store::Ttl::new(3600).unwrap(), None).await.unwrap();
            }),
        )
        .layer(ruts::SessionLayer::new(store).with_cookie_options(cookie))
        .layer(tower_cookies::CookieManagerLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let response = reqwest::get(format!("http://{address}/session")).await.unwrap();
    let session = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok()?.split(';').next().map(str::to_owned))
        .find(|pair| pair.starts_with("session="))
        .expect("the peer's session layer set no session cookie");
    (format!("http://{address}/pay"), session, charges)
}

/// The HTTP layer: its overhead per request (a first request, and a replay) against the same
/// axum handler without it and beside the peer, `axum-idempotent` 0.6 (in both of its modes),
/// sequential over one keep-alive client, interleaved request by request; then 1,000 identical
/// requests at once through idem's layer and through the peer's.
async fn http_layer(rows: &mut Vec<Row>) {
    let n = ops();
    let client = reqwest::Client::new();
    let (bare, _) = http_server(None, Duration::ZERO, None).await;
    let (layered, _) = http_server(Some(idem_tests::idem(MemoryLedger::new())), Duration::ZERO, None).await;
    let (peer_key, peer_key_session, _) = peer_server(PeerMode::KeyHeader, Duration::ZERO).await;
    let (peer_hash, peer_hash_session, _) = peer_server(PeerMode::Hashing, Duration::ZERO).await;
    let send = |url: &str, key: Option<String>, session: Option<&str>| {
        let mut request = client.post(url).header("content-type", "application/json").body(r#"{"amount":1250}"#);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        if let Some(session) = session {
            request = request.header("cookie", session);
        }
        request.send()
    };
    // One sample of each, in turn: a first request, then its replay. The peer's hashing mode
    // keys on the whole request, so its first requests differ by a header.
    let mut times: [Vec<Duration>; 7] = Default::default();
    let mut timed = async |slot: usize, request: reqwest::RequestBuilder| {
        let start = Instant::now();
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.unwrap();
        times[slot].push(start.elapsed());
    };
    let post = |url: &str| client.post(url).header("content-type", "application/json").body(r#"{"amount":1250}"#);
    if let Ok(series) = std::env::var("IDEM_BENCH_HTTP_SERIES") {
        // One series alone, sequential: what a request of it costs the process (the same key
        // each time for a replay; a new one each time for a first request).
        let requests = n * 10;
        let start = Instant::now();
        for i in 0..requests {
            let request = match series.as_str() {
                "bare" => post(&bare),
                "first" => post(&layered).header("idempotency-key", format!("\"series-{i}\"")),
                "replay" => post(&layered).header("idempotency-key", "\"series\""),
                "peer-first" => post(&peer_key).header("idempotency-key", format!("series-{i}")),
                "peer-replay" => post(&peer_key).header("idempotency-key", "series"),
                other => panic!("IDEM_BENCH_HTTP_SERIES={other}: give bare, first, replay, peer-first or peer-replay"),
            };
            let request =
                if series.starts_with("peer") { request.header("cookie", &peer_key_session) } else { request };
            let response = request.send().await.unwrap();
            assert!(response.status().is_success(), "{series}: {}", response.status());
            response.bytes().await.unwrap();
        }
        let micros = start.elapsed().as_secs_f64() * 1e6 / requests as f64;
        println!("HTTP series {series}: {requests} requests, {micros:.1} µs a request");
        return;
    }
    for i in 0..n {
        timed(0, post(&bare)).await;
        // idem's layer: the key as a structured-field string, as the draft gives the header.
        for slot in [1, 2] {
            timed(slot, post(&layered).header("idempotency-key", format!("\"k-{i}\""))).await;
        }
        for slot in [3, 4] {
            let request = post(&peer_key).header("idempotency-key", format!("k-{i}"));
            timed(slot, request.header("cookie", &peer_key_session)).await;
        }
        for slot in [5, 6] {
            let request = post(&peer_hash).header("x-request", format!("r-{i}"));
            timed(slot, request.header("cookie", &peer_hash_session)).await;
        }
    }
    let [bare_times, first, replay, key_first, key_replay, hash_first, hash_replay] = &mut times;
    let bare_p50 = micros(percentile(bare_times, 0.5));
    for (what, samples) in [
        ("idem's layer, memory ledger: first request", first),
        ("idem's layer, memory ledger: replay", replay),
        ("axum-idempotent 0.6 (Idempotency-Key header, moka store): first request", key_first),
        ("axum-idempotent 0.6 (Idempotency-Key header, moka store): replay", key_replay),
        ("axum-idempotent 0.6 (request hash, moka store): first request", hash_first),
        ("axum-idempotent 0.6 (request hash, moka store): replay", hash_replay),
    ] {
        let p50 = micros(percentile(samples, 0.5));
        row(
            rows,
            format!("HTTP, {what} p50 (vs the same axum handler bare)"),
            format!("{p50:.0} µs"),
            format!("{bare_p50:.0} µs bare"),
            p50 / bare_p50.max(1.0),
        );
    }
    // A storm: 1,000 identical requests at once; the handler takes 50 ms. What every request was
    // answered, how many times the handler ran, and when the last answer came.
    let storm = async |url: &str, key: String, session: Option<&str>| {
        // The connections first (a thousand at once, kept by the client's pool), so that the
        // storm times the layer, not the opening of a thousand TCP connections.
        let warm = url.replace("/pay", "/warm");
        let warming: Vec<_> = (0..1000).map(|_| tokio::spawn(client.get(&warm).send())).collect();
        for request in warming {
            let response = request.await.unwrap().unwrap();
            assert!(response.status().is_success(), "warming up: {}", response.status());
            response.bytes().await.unwrap();
        }
        let start = Instant::now();
        let requests: Vec<_> = (0..1000)
            .map(|_| {
                let request = send(url, Some(key.clone()), session);
                tokio::spawn(async move { request.await.map(|response| response.status().as_u16()) })
            })
            .collect();
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for request in requests {
            if let Ok(Ok(status)) = request.await {
                *statuses.entry(status).or_default() += 1;
            }
        }
        (start.elapsed(), statuses)
    };
    let handler = Duration::from_millis(50);
    let (url, charges) = http_server(Some(idem_tests::idem(MemoryLedger::new())), handler, None).await;
    let (elapsed, statuses) = storm(&url, "\"storm\"".to_owned(), None).await;
    let executions = charges.load(std::sync::atomic::Ordering::SeqCst);
    storm_row(rows, "idem's layer, memory ledger", executions, &statuses, elapsed);
    // The route's `wait`: a repeat that finds the request in progress waits for its response.
    let wait = Some(Duration::from_secs(5));
    let (url, charges) = http_server(Some(idem_tests::idem(MemoryLedger::new())), handler, wait).await;
    let (elapsed, statuses) = storm(&url, "\"storm\"".to_owned(), None).await;
    let executions = charges.load(std::sync::atomic::Ordering::SeqCst);
    storm_row(rows, "idem's layer, memory ledger, wait = 5 s", executions, &statuses, elapsed);
    let (url, session, charges) = peer_server(PeerMode::KeyHeader, handler).await;
    let (elapsed, statuses) = storm(&url, "storm".to_owned(), Some(&session)).await;
    let executions = charges.load(std::sync::atomic::Ordering::SeqCst);
    storm_row(rows, "axum-idempotent 0.6 (Idempotency-Key header)", executions, &statuses, elapsed);
    // The floor: the same 1,000 requests to the handler with no layer, each run (at once, each
    // its 50 ms) — what answering a thousand requests at once costs this machine.
    let (url, charges) = http_server(None, handler, None).await;
    let (elapsed, statuses) = storm(&url, "\"storm\"".to_owned(), None).await;
    let executions = charges.load(std::sync::atomic::Ordering::SeqCst);
    storm_row(rows, "the same axum handler bare (no layer, the floor)", executions, &statuses, elapsed);
}

fn storm_row(
    rows: &mut Vec<Row>,
    what: &str,
    executions: usize,
    statuses: &std::collections::BTreeMap<u16, usize>,
    elapsed: Duration,
) {
    row(
        rows,
        format!(
            "HTTP, {what}: storm of 1000 identical requests, time to the last answer (executions: {executions}; statuses {statuses:?})"
        ),
        format!("{:.0} ms", elapsed.as_secs_f64() * 1e3),
        "50 ms handler".to_owned(),
        elapsed.as_secs_f64() / 0.05,
    );
}

/// Statements a first call and a repeat send, counted on the connection (sea-orm's metric callback).
async fn statements(rows: &mut Vec<Row>, name: &str, url: &str) {
    let Ok(_) = SeaOrmLedger::connect(url).await else { return };
    let Ok(mut db) = sea_orm::Database::connect(url).await else { return };
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    db.set_metric_callback(move |_| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let idem = idem_tests::idem(SeaOrmLedger::from_connection(db));
    // The handle reads the ledger's clock once per third of a lease, not per call: warm it.
    idem_pair(&idem, Token::random().get(), "warm-up").await;
    sent.store(0, std::sync::atomic::Ordering::SeqCst);
    let args = json!({ "order_id": format!("count-{}", Token::random().get()) });
    idem.call(&RECIPE, Some(&caller()), &args, || async { Ok::<_, Error>(()) }).await.unwrap();
    let first = sent.swap(0, std::sync::atomic::Ordering::SeqCst);
    idem.call(&RECIPE, Some(&caller()), &args, || async { Ok::<_, Error>(()) }).await.unwrap();
    let repeat = sent.swap(0, std::sync::atomic::Ordering::SeqCst);
    row(
        rows,
        format!("{name}: statements sent (counted on the connection), first call / repeat"),
        format!("{first} / {repeat}"),
        "repeat: 1 target".into(),
        repeat as f64,
    );
}

/// What a handle sends its ledger (a [`Tapped`] ledger): each claim answered, each read, the rest.
#[derive(Default)]
struct Calls {
    claims: std::sync::atomic::AtomicUsize,
    reads: std::sync::atomic::AtomicUsize,
    others: std::sync::atomic::AtomicUsize,
}

impl Calls {
    fn count(counter: &std::sync::atomic::AtomicUsize) {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn get(counter: &std::sync::atomic::AtomicUsize) -> usize {
        counter.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Tap for Calls {
    fn before(&self, call: Call) -> Pass {
        match call {
            Call::Claim => {}
            Call::Lookup => Self::count(&self.reads),
            _ => Self::count(&self.others),
        }
        Pass::Through
    }

    fn after(&self, call: Call) {
        if call == Call::Claim {
            Self::count(&self.claims);
        }
    }
}

/// 1,000 repeats waiting on one in-progress key (`wait`): what they send the ledger — their own
/// 1,000 claims, then what the wait costs, as ledger calls and as SQL statements on their
/// connection (sea-orm's metric callback) — and the time from the holder's handler returning
/// to the last answer. The holder runs on another connection and handle (another replica: the
/// waiters poll) or on theirs (the same process: its end wakes them).
async fn waiting(rows: &mut Vec<Row>, name: &str, url: &str) {
    use std::sync::atomic::Ordering::SeqCst;
    for local in [false, true] {
        let Ok(holder) = SeaOrmLedger::connect(url).await else { return };
        let Ok(mut db) = sea_orm::Database::connect(SeaOrmLedger::connect_options(url)).await else { return };
        let sql = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&sql);
        db.set_metric_callback(move |_| {
            counter.fetch_add(1, SeqCst);
        });
        let calls = Tapped::new(Arc::new(SeaOrmLedger::from_connection(db)), Calls::default());
        let waiters = idem_tests::idem_shared(calls.clone());
        let holder = if local { waiters.clone() } else { idem_tests::idem(holder) };
        for idem in [&waiters, &holder] {
            idem_pair(idem, Token::random().get(), "warm-up").await;
        }
        let release = Arc::new(tokio::sync::Notify::new());
        let args = json!({ "order_id": format!("wait-{}", Token::random().get()) });
        let first = {
            let (holder, release, args) = (holder.clone(), Arc::clone(&release), args.clone());
            tokio::spawn(async move {
                holder
                    .call(&WAITING, Some(&caller()), &args, || async {
                        release.notified().await;
                        Ok::<_, Error>(payload())
                    })
                    .await
                    .unwrap()
            })
        };
        // The holder's claim is in before the waiters start.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for counter in [&sql, &calls.claims, &calls.reads, &calls.others] {
            counter.store(0, SeqCst);
        }
        let handles: Vec<_> = (0..1000)
            .map(|_| {
                let (idem, args) = (waiters.clone(), args.clone());
                tokio::spawn(async move {
                    let served = idem
                        .call(&WAITING, Some(&caller()), &args, || async { Ok::<_, Error>(String::new()) })
                        .await
                        .unwrap();
                    assert!(served.replayed, "every waiter gets the replay");
                    Instant::now()
                })
            })
            .collect();
        // Every waiter has been answered "in flight" — by the ledger, or (its holder in this
        // process, or an identical claim already on its way) by the process — and waits.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let returned = Instant::now();
        release.notify_one();
        first.await.unwrap();
        let mut last = returned;
        for handle in handles {
            last = last.max(handle.await.unwrap());
        }
        let (claims, reads, others) = (Calls::get(&calls.claims), Calls::get(&calls.reads), Calls::get(&calls.others));
        let holder_is = if local { "same process" } else { "another replica" };
        row(
            rows,
            format!(
                "{name}: 1000 waiting repeats, holder in {holder_is}: ledger calls ({claims} claims, {reads} reads, \
                 {others} other; {} SQL statements)",
                sql.load(SeqCst)
            ),
            format!("{}", claims + reads + others),
            "1000 in-flight answers".into(),
            (claims + reads + others) as f64 / 1000.0,
        );
        row(
            rows,
            format!("{name}: 1000 waiting repeats, holder in {holder_is}: handler returns → last answer"),
            format!("{:.1} ms", (last - returned).as_secs_f64() * 1e3),
            String::new(),
            f64::NAN,
        );
    }
}

#[tokio::main]
async fn main() {
    let mut rows = Vec::new();
    // `IDEM_BENCH_ONLY=waiting` runs the waiting measurement alone, `cpu` the two without a database.
    let only = std::env::var("IDEM_BENCH_ONLY").ok();
    let all = only.is_none();
    if all || matches!(only.as_deref(), Some("cpu" | "key")) {
        let idem_nanos = cpu(&mut rows);
        powertools(&mut rows, idem_nanos);
    }
    if only.as_deref() == Some("key-parts") {
        key_parts(&mut rows);
    }
    if all || matches!(only.as_deref(), Some("cpu" | "noop")) {
        wrapped_noop(&mut rows).await;
    }
    if all || only.as_deref() == Some("http") {
        http_layer(&mut rows).await;
    }
    // The suite's own databases on the servers the URLs name (what else used `test` cannot
    // fail a run); a server that does not answer is reported skipped and left out.
    let (pg, my) = (idem_tests::POSTGRES, idem_tests::MYSQL);
    let pg_url = idem_tests::suite_database("bench::postgres", pg.0, pg.1).await.unwrap_or_else(|| pg.1.to_owned());
    let my_url = idem_tests::suite_database("bench::mysql", my.0, my.1).await.unwrap_or_else(|| my.1.to_owned());
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite_url = format!("sqlite://{}?mode=rwc", dir.join("bench.sqlite3").display());

    if all {
        storm(&mut rows, "memory", Arc::new(MemoryLedger::new()), None).await;
    }
    for (name, url) in
        [("SQLite (file, FULL)", sqlite_url.as_str()), ("PostgreSQL", pg_url.as_str()), ("MariaDB", my_url.as_str())]
    {
        let storms_only = only.as_deref() == Some("storm");
        if !all && only.as_deref() != Some("waiting") && !storms_only {
            break;
        }
        if !storms_only {
            waiting(&mut rows, name, url).await;
        }
        if !all && !storms_only {
            continue;
        }
        if !storms_only {
            statements(&mut rows, name, url).await;
        }
        match SeaOrmLedger::connect(url).await {
            Ok(ledger) => {
                if !storms_only {
                    latency(&mut rows, name, &ledger).await;
                }
                let replica = SeaOrmLedger::connect(url).await.unwrap();
                let db = replica.connection().clone();
                storm(&mut rows, name, Arc::new(ledger), Some((Arc::new(replica), &db))).await;
            }
            Err(error) => println!("SKIPPED {name}: {error}"),
        }
    }
    if all {
        bytes_per_row(&mut rows, &pg_url).await;
    }

    let width = rows.iter().map(|r| r.what.len()).max().unwrap_or(10);
    println!("\n| {:<width$} | {:>12} | {:>22} | {:>6} |", "measurement", "idem", "baseline", "ratio");
    println!("|{:-<w2$}|{:->14}|{:->24}|{:->8}|", "", "", "", "", w2 = width + 2);
    for r in &rows {
        println!("| {:<width$} | {:>12} | {:>22} | {:>6} |", r.what, r.idem, r.baseline, r.ratio);
    }
    let _ = std::fs::remove_dir_all(dir);
}
