//! Crash injection: a child process (`crash_child`) runs one idempotent call on a durable ledger
//! and is SIGKILLed at one of three points — after the claim, after the downstream effect but
//! before the record, after the record. The call is then retried from this process under each
//! stale-lease policy, and the downstream (a directory both processes share, see
//! `support/downstream.rs`) is counted.
//!
//! Promised, per backend (SQLite file, PostgreSQL, MariaDB) and per point × policy:
//! - duplicate effects at the downstream: 0 (takeover, because the downstream dedupes by the
//!   forwarded key — which must therefore be the same in the dead child and in the retry;
//!   reconcile and hold, because nothing is re-run when the effect happened);
//! - completed results lost: 0 (a kill after the record replays the child's result; a kill
//!   after the effect ends with the child's receipt, not a new one);
//! - operations stuck: 0 (every operation ends completed: `takeover` and `reconcile` by the
//!   retry itself, `hold` through the documented operator path `Idem::resolve`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::ledger::Resolution;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, Idem, Key, Recipe, Reconciled, StalePolicy, current_operation, ledger::State};
use serde_json::json;

use crate::support;
use crate::support::downstream::FileDownstream;
use crate::support::{RelError, scale, stored_ok, unique};

/// One tool, declared once, whose stale policy each run configures (as the child's does): one
/// declaration site, so one handle accepts all three.
const fn charge(stale: StalePolicy) -> Recipe {
    Recipe::new("rel_crash_charge", &["order_id"]).stale(stale)
}
static TAKEOVER: Recipe = charge(StalePolicy::Takeover);
static RECONCILE: Recipe = charge(StalePolicy::Reconcile);
static HOLD: Recipe = charge(StalePolicy::Hold);

const POINTS: [&str; 3] = ["claim", "effect", "record"];
const POLICIES: [StalePolicy; 3] = [StalePolicy::Takeover, StalePolicy::Reconcile, StalePolicy::Hold];
const LEASE_MS: u64 = 600;
/// Children alive at once.
const PARALLEL: usize = 4;

fn policy_name(policy: StalePolicy) -> &'static str {
    match policy {
        StalePolicy::Takeover => "takeover",
        StalePolicy::Reconcile => "reconcile",
        _ => "hold",
    }
}

fn recipe(policy: StalePolicy) -> &'static Recipe {
    match policy {
        StalePolicy::Takeover => &TAKEOVER,
        StalePolicy::Reconcile => &RECONCILE,
        _ => &HOLD,
    }
}

struct Context {
    url: String,
    dir: std::path::PathBuf,
    downstream: FileDownstream,
    idem: Idem,
    caller: Caller,
}

/// What one injected crash and its recovery came to.
#[derive(Debug, Default, Clone)]
struct Run {
    order: String,
    /// The result the child had when it was killed (effect and record points).
    child_receipt: Option<String>,
    /// The retry's answer before any operator action (`ok`, `replay`, or an idem code).
    first_answer: String,
    /// The operation's final result, after the documented way out.
    final_value: Option<String>,
    /// Its final state.
    final_state: Option<State>,
    /// Whether a last repeat replayed the final result.
    final_replayed: bool,
    /// Whether an operator had to resolve it.
    resolved_by_operator: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_injection_sqlite() {
    crash_injection("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_injection_postgres() {
    crash_injection("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_injection_mysql() {
    crash_injection("mysql").await;
}

async fn crash_injection(backend: &str) {
    let Some((url, ledger)) = support::connect(backend, "reliability_crash::crash_injection").await else { return };
    let dir = std::env::temp_dir().join(unique("idem-rel-downstream"));
    let downstream = FileDownstream::open(&dir).unwrap();
    let context = Arc::new(Context {
        url,
        dir,
        downstream,
        idem: idem_tests::builder(ledger).lease(Duration::from_millis(LEASE_MS)).build().unwrap(),
        // The child calls as subject `crash-child` of this tenant; retries come from the same caller.
        caller: Caller::new(unique("rel-crash-tenant"), "crash-child"),
    });
    let per_point = scale(5, 100);

    let semaphore = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for point in POINTS {
        for policy in POLICIES {
            for _ in 0..per_point {
                let (context, semaphore) = (Arc::clone(&context), Arc::clone(&semaphore));
                tasks.spawn(async move {
                    let _permit = semaphore.acquire().await.unwrap();
                    (point, policy, inject(&context, point, policy).await)
                });
            }
        }
    }
    let mut runs: BTreeMap<(&str, &str), Vec<Run>> = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (point, policy, run) = done.expect("a crash run panicked");
        runs.entry((point, policy_name(policy))).or_default().push(run);
    }

    // Count on the far side: the downstream's own records.
    let attempts = context.downstream.attempts_by_order().unwrap();
    let applied = context.downstream.applied_by_order().unwrap();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for point in POINTS {
        for policy in POLICIES {
            let name = policy_name(policy);
            let runs = &runs[&(point, name)];
            let (mut duplicates, mut lost, mut stuck, mut reexecuted, mut unknown, mut resolved) = (0, 0, 0, 0, 0, 0);
            for run in runs {
                let applied = applied.get(&run.order).copied().unwrap_or(0);
                let attempts = attempts.get(&run.order).copied().unwrap_or(0);
                duplicates += applied.saturating_sub(1);
                reexecuted += attempts.saturating_sub(1);
                // Lost: an operation that ends without its effect, or whose recorded or applied
                // result is not the one the caller gets now.
                let kept_child_result =
                    run.child_receipt.as_ref().is_none_or(|receipt| run.final_value.as_ref() == Some(receipt));
                let matches_downstream = run.final_value.is_some()
                    && run.order_receipt(&context.downstream).as_ref() == run.final_value.as_ref();
                if applied == 0 || !kept_child_result || !matches_downstream {
                    lost += 1;
                    failures.push(format!("{point}/{name}: lost {run:?} (applied {applied})"));
                }
                if run.final_state != Some(State::Completed) || !run.final_replayed {
                    stuck += 1;
                    failures.push(format!("{point}/{name}: stuck {run:?}"));
                }
                if run.first_answer == "outcome_unknown" {
                    unknown += 1;
                }
                if run.resolved_by_operator {
                    resolved += 1;
                }
                if applied > 1 {
                    failures.push(format!("{point}/{name}: {applied} effects for {}", run.order));
                }
            }
            // No policy may re-run the handler when the effect is known, except takeover after
            // the effect, where the downstream's dedupe absorbs it.
            let allowed_reexecutions =
                if policy == StalePolicy::Takeover && point == "effect" { runs.len() } else { 0 };
            if reexecuted > allowed_reexecutions {
                failures.push(format!("{point}/{name}: {reexecuted} re-executions (allowed {allowed_reexecutions})"));
            }
            rows.push(vec![
                backend.to_owned(),
                point.to_owned(),
                name.to_owned(),
                runs.len().to_string(),
                duplicates.to_string(),
                lost.to_string(),
                stuck.to_string(),
                reexecuted.to_string(),
                format!("{unknown} / {resolved}"),
            ]);
        }
    }
    support::print_table(
        &format!("crash injection, {backend}"),
        &[
            "backend",
            "kill point",
            "stale policy",
            "SIGKILLs",
            "duplicate effects",
            "results lost",
            "stuck",
            "re-executions (attempts − 1)",
            "unknown / operator-resolved",
        ],
        &rows,
    );
    let _ = std::fs::remove_dir_all(&context.dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

impl Run {
    /// The downstream's receipt for this run's operation.
    fn order_receipt(&self, downstream: &FileDownstream) -> Option<String> {
        downstream.receipt_of_order(&self.order).unwrap()
    }
}

fn key_of(idem: &Idem, caller: &Caller, order: &str) -> Key {
    idem.admin().key_of(&HOLD, caller, &json!({ "order_id": order })).unwrap()
}

/// A child that is SIGKILLed and reaped when dropped, so a failing test leaves no process behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a child, kills it at `point`, and recovers the operation under `policy`.
async fn inject(context: &Context, point: &'static str, policy: StalePolicy) -> Run {
    let order = unique("order");
    let mut run = Run { order: order.clone(), ..Run::default() };
    let child = Command::new(env!("CARGO_BIN_EXE_crash_child"))
        .args([
            context.url.as_str(),
            context.dir.to_str().unwrap(),
            context.caller.tenant(),
            order.as_str(),
            point,
            &LEASE_MS.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start crash_child");
    let mut child = Killed(child);
    let stdout = child.0.stdout.take().unwrap();
    let (lines, mut marker) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let line = tokio::time::timeout(Duration::from_secs(120), marker.recv()).await;
    let line = match line {
        Ok(Some(line)) => line,
        other => {
            drop(child);
            panic!("crash_child gave no marker at {point}: {other:?}");
        }
    };
    // The kill: SIGKILL, at the point the child is blocked in.
    child.0.kill().expect("SIGKILL the child");
    let status = child.0.wait().expect("reap the child");
    assert_eq!(status.signal(), Some(9), "the child must die by SIGKILL at {point}, not exit: {line}");
    let expected = format!("AT {point}");
    assert!(line.starts_with(&expected), "the child did not reach {point}: {line}");
    if point != "claim" {
        run.child_receipt = line.split(' ').nth(2).map(str::to_owned);
    }

    let idem = &context.idem;
    let caller = &context.caller;
    let reference = key_of(idem, caller, &order).reference().to_string();
    let arguments = json!({ "order_id": order, "amount_cents": 1250 });

    // What the kill left behind, and waiting out the dead child's lease.
    let status = idem.status(caller, &reference).await.unwrap().expect("the claim was recorded before the kill");
    if point == "record" {
        assert_eq!(status.state, State::Completed, "killed after the record");
    } else {
        assert_eq!(status.state, State::InProgress, "killed before the record");
        let expired = support::poll(Duration::from_secs(30), || async {
            let status = idem.status(caller, &reference).await.unwrap()?;
            status.lease_expired.then_some(())
        })
        .await;
        assert!(expired.is_some(), "the dead child's lease never expired");
    }

    let downstream = &context.downstream;
    let charge = || async {
        let operation = current_operation().expect("inside the handler");
        downstream.charge(&operation.idempotency_key(), &order).map_err(|e| RelError::Effect(e.to_string()))
    };
    let reconcile = |operation: idem_runtime::Operation| async move {
        match downstream.lookup(&operation.idempotency_key()) {
            Ok(Some(receipt)) => Reconciled::Happened(Ok(receipt)),
            Ok(None) => Reconciled::NothingHappened,
            Err(_) => Reconciled::StillUnknown,
        }
    };
    // A renewal the child sent just before it died could still land; then the retry is told
    // `in_flight` until that lease runs out too. Bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let retried = loop {
        let retried = match policy {
            StalePolicy::Reconcile => {
                idem.call_reconciling(recipe(policy), Some(caller), &arguments, reconcile, charge).await
            }
            _ => idem.call(recipe(policy), Some(caller), &arguments, charge).await,
        };
        match &retried {
            Err(error) if error.code() == "in_flight" && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => break retried,
        }
    };
    run.first_answer = match &retried {
        Ok(served) if served.replayed => "replay".to_owned(),
        Ok(_) => "ok".to_owned(),
        Err(error) => error.code().to_owned(),
    };
    if point == "record" {
        let served = retried.as_ref().expect("a completed operation replays");
        assert!(served.replayed, "killed after the record: the retry must replay, not run");
    }
    let value = match retried {
        Ok(served) => served.value,
        Err(RelError::Rejected { code, reference: Some(answered), .. }) if code == "outcome_unknown" => {
            assert_eq!(policy, StalePolicy::Hold, "only hold reports unknown here");
            assert_eq!(answered, reference);
            // The documented way out: status says unknown; the operator asks the downstream
            // and resolves; the repeat then replays or runs.
            let status = idem.status(caller, &reference).await.unwrap().expect("an unknown record");
            assert_eq!(status.state, State::Unknown);
            let resolution = match downstream.receipt_of_order(&order).unwrap() {
                Some(receipt) => Resolution::Completed(stored_ok(&receipt)),
                None => Resolution::NothingHappened,
            };
            idem.admin()
                .resolve(caller.tenant(), &status.address().to_string(), resolution)
                .await
                .expect("the operator resolves it");
            run.resolved_by_operator = true;
            idem.call(&HOLD, Some(caller), &arguments, charge).await.expect("after resolve the repeat completes").value
        }
        Err(error) => panic!("{point}/{}: unexpected answer {error:?}", policy_name(policy)),
    };
    run.final_value = Some(value.clone());
    let last = idem.call(recipe(policy), Some(caller), &arguments, charge).await;
    run.final_replayed = matches!(&last, Ok(served) if served.replayed && served.value == value);
    run.final_state = idem.status(caller, &reference).await.unwrap().map(|status| status.state);
    run
}

/// The child on its own, run to completion: the marker protocol and the shared downstream work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_completes_without_a_kill() {
    let url = support::sqlite_url();
    SeaOrmLedger::connect(&url).await.unwrap();
    let dir = std::env::temp_dir().join(unique("idem-rel-downstream"));
    let order = unique("order");
    let output = Command::new(env!("CARGO_BIN_EXE_crash_child"))
        .args([url.as_str(), dir.to_str().unwrap(), "rel-tenant", order.as_str(), "none", "200"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.starts_with("DONE rcpt-"), "{stdout}");
    let downstream = FileDownstream::open(&dir).unwrap();
    assert_eq!(downstream.applied_by_order().unwrap().get(&order), Some(&1));
    let _ = std::fs::remove_dir_all(&dir);
}
