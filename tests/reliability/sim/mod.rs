//! A deterministic simulation of idem's real orchestration ([`Idem`]) on its real ledgers.
//!
//! One seed drives everything: replicas (each an `Idem` handle with its own skewed clock) share
//! one ledger; clients repeat calls at random on random replicas; handlers forward
//! `idempotency_key()` to a downstream that dedupes by it and counts effects; every ledger call
//! passes an await point ([`ledger::SimLedger`]) where the seed delays it, refuses it, commits it
//! and loses its answer, or loses it before it commits; outages, crashes (a replica's calls
//! dropped mid-handler and its renewals stopped), slow handlers and an operator's verdicts come at
//! seeded times. The runtime is tokio's current-thread runtime with paused time: every task runs
//! on one thread in an order fixed by the program and the seed, and time moves only when every
//! task waits, straight to the next timer.

pub mod ledger;
pub mod world;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::ledger::memory::MemoryLedger;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{
    Caller, ErrorClass, Idem, IdempotentError, Recipe, Reconciled, Rejection, StalePolicy, clock::Clock,
};
use serde::{Deserialize, Serialize};

use self::ledger::{Backend, LedgerClock, SimLedger, Store};
use self::world::{Counts, EPOCH, RunState, Sim};

/// The lease; renewed every third of it.
pub const LEASE_MS: u64 = 3_000;
/// The ledger timeout (under half the lease).
pub const LEDGER_TIMEOUT_MS: u64 = 1_000;
/// How long clients keep calling, then how long the world runs on calmly for late work to settle.
const ACTIVE_MS: u64 = 120_000;
const QUIESCE_MS: u64 = 30_000;
const WINDOW: Duration = Duration::from_secs(20);
const GRACE: Duration = Duration::from_secs(10);

static RECIPES: [Recipe; 3] = [
    Recipe::new("charge_takeover", &["order_id"]).window(WINDOW).stale(StalePolicy::Takeover),
    Recipe::new("charge_reconcile", &["order_id"]).window(WINDOW).stale(StalePolicy::Reconcile),
    Recipe::new("charge_hold", &["order_id"]).window(WINDOW).stale(StalePolicy::Hold),
];

/// Which real ledger a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Memory,
    /// SQLite in a file (WAL), one file per seed.
    SqliteFile,
}

/// What one seed did.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    pub counts: Counts,
    pub trace: u64,
    pub log: Vec<String>,
}

/// A replica's clock: true time plus its skew.
#[derive(Clone, Debug)]
struct SkewedClock {
    start: tokio::time::Instant,
    skew: i64,
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        (EPOCH + elapsed).saturating_add_signed(self.skew)
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum SimError {
    /// idem answered without running the handler.
    Rejected(String),
    /// The handler found its lease lost and did not act (as `lease_lost()`'s docs ask).
    LeaseLost,
    /// The downstream timed out after acting.
    DownstreamTimeout,
}

impl IdempotentError for SimError {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Rejected(_) | Self::LeaseLost => ErrorClass::NothingHappened,
            Self::DownstreamTimeout => ErrorClass::Unknown,
        }
    }
    fn from_rejection(rejection: Rejection) -> Self {
        Self::Rejected(rejection.code().to_owned())
    }
}

struct Replica {
    idem: Idem,
    alive: Arc<AtomicBool>,
    tasks: Vec<tokio::task::AbortHandle>,
}

struct Cluster {
    sim: Sim,
    replicas: std::sync::Mutex<Vec<Replica>>,
    caller: Caller,
}

impl Cluster {
    fn replica(&self, sim: &Sim, index: usize) -> Replica {
        let alive = Arc::new(AtomicBool::new(true));
        let skew = {
            let mut w = sim.world();
            if w.rng.chance(500) {
                w.counts.skewed_replicas += 1;
                i64::try_from(w.rng.range(0, 12_000)).unwrap_or(0) - 6_000
            } else {
                0
            }
        };
        sim.world().record(format!("replica {index} skew {skew}"));
        let ledger =
            SimLedger { sim: sim.clone(), replica: index, alive: Arc::clone(&alive), measured: AtomicBool::new(false) };
        // Replicas share one secret, as a shared ledger requires (the wrapper keeps none).
        let idem = Idem::builder(ledger)
            .secret(idem_tests::test_secret())
            .clock(SkewedClock { start: sim.start(), skew })
            .lease(Duration::from_millis(LEASE_MS))
            .ledger_timeout(Duration::from_millis(LEDGER_TIMEOUT_MS))
            .settle_grace(GRACE)
            .unsettled_retention(Duration::from_secs(60))
            .verdict_retention(Duration::from_secs(60))
            .build()
            .unwrap();
        Replica { idem, alive, tasks: Vec::new() }
    }

    fn live(&self, index: usize) -> Option<Idem> {
        let replicas = self.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let replica = &replicas[index];
        replica.alive.load(Ordering::SeqCst).then(|| replica.idem.clone())
    }

    fn count(&self) -> usize {
        self.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    fn crash(&self, index: usize) {
        let mut replicas = self.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let replica = &mut replicas[index];
        replica.alive.store(false, Ordering::SeqCst);
        for task in replica.tasks.drain(..) {
            task.abort();
        }
        let mut w = self.sim.world();
        w.counts.crashes += 1;
        w.note(&("crash", index));
        let now = self.sim.now() - EPOCH;
        w.record(format!("{now} crash replica {index}"));
        for run in &mut w.runs {
            if run.replica == index && run.state == RunState::Running {
                run.state = RunState::Dead;
            }
        }
    }

    fn restart(&self, index: usize) {
        let fresh = self.replica(&self.sim, index);
        let now = self.sim.now() - EPOCH;
        self.sim.world().record(format!("{now} restart replica {index}"));
        self.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[index] = fresh;
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// One call of a client: on `replica`, for intent `intent`.
async fn call(cluster: Arc<Cluster>, replica: usize, idem: Idem, intent: usize, id: usize) {
    let sim = cluster.sim.clone();
    let recipe = &RECIPES[intent % RECIPES.len()];
    let arguments = serde_json::json!({ "order_id": format!("o-{}", intent / RECIPES.len()) });
    let (for_reconcile, for_handler) = (sim.clone(), sim.clone());
    let result = idem
        .call_reconciling(
            recipe,
            Some(&cluster.caller),
            &arguments,
            move |operation| async move {
                match for_reconcile.reconcile(id, &operation) {
                    Some(receipt) => Reconciled::Happened(Ok(receipt)),
                    None => Reconciled::NothingHappened,
                }
            },
            move || async move {
                let sim = for_handler;
                let operation = idem_runtime::current_operation().expect("inside a handler");
                let (run, work) = sim.handler_started(id, replica, &operation);
                sleep_ms(work.before_ms).await;
                if operation.lease_lost() {
                    sim.run_finished(run);
                    return Err(SimError::LeaseLost);
                }
                let receipt = sim.effect(run, &operation);
                sleep_ms(work.after_ms).await;
                sim.run_finished(run);
                if work.unknown {
                    sim.world().counts.handler_unknown += 1;
                    return Err(SimError::DownstreamTimeout);
                }
                sim.produced(id, &receipt);
                Ok(receipt)
            },
        )
        .await;
    match &result {
        Ok(served) if !served.replayed => sim.answered(id, Some(&served.value), None),
        Err(SimError::Rejected(code)) => sim.answered(id, None, Some(code)),
        _ => sim.answered(id, None, None),
    }
}

async fn client(cluster: Arc<Cluster>, intents: usize) {
    let sim = cluster.sim.clone();
    loop {
        let (pause, intent, replica) = {
            let mut w = sim.world();
            if w.stopping {
                return;
            }
            let pause = if w.rng.chance(300) { w.rng.range(0, 100) } else { w.rng.range(100, 3_000) };
            (pause, w.rng.range(0, intents as u64) as usize, w.rng.range(0, cluster.count() as u64) as usize)
        };
        sleep_ms(pause).await;
        let Some(idem) = cluster.live(replica) else { continue };
        let id = sim.new_call();
        let task = tokio::spawn(call(Arc::clone(&cluster), replica, idem, intent, id));
        cluster.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[replica]
            .tasks
            .push(task.abort_handle());
        // A crash aborts the call: to this client, a lost connection. It calls again later.
        let _ = task.await;
    }
}

async fn crasher(cluster: Arc<Cluster>) {
    let sim = cluster.sim.clone();
    loop {
        let (pause, replica, down) = {
            let mut w = sim.world();
            (w.rng.range(3_000, 30_000), w.rng.range(0, cluster.count() as u64) as usize, w.rng.range(500, 8_000))
        };
        sleep_ms(pause).await;
        if sim.world().stopping {
            return;
        }
        cluster.crash(replica);
        sleep_ms(down).await;
        cluster.restart(replica);
    }
}

async fn outages(sim: Sim) {
    loop {
        let (pause, length) = {
            let mut w = sim.world();
            (w.rng.range(5_000, 40_000), w.rng.range(200, 6_000))
        };
        sleep_ms(pause).await;
        let now = sim.now();
        let mut w = sim.world();
        if w.stopping {
            return;
        }
        w.counts.outages += 1;
        w.outage_until = now + length;
    }
}

/// An operator who checks the downstream and settles unknown and dead operations.
async fn operator(cluster: Arc<Cluster>) {
    let sim = cluster.sim.clone();
    loop {
        let (pause, replica) = {
            let mut w = sim.world();
            (w.rng.range(2_000, 10_000), w.rng.range(0, cluster.count() as u64) as usize)
        };
        sleep_ms(pause).await;
        let Some(idem) = cluster.live(replica) else { continue };
        let keys: Vec<_> = sim.world().keys.keys().copied().collect();
        for key in keys {
            if let Some((address, verdict)) = sim.verdict(key) {
                let _ = idem.admin().resolve(cluster.caller.tenant(), &address.to_string(), verdict).await;
            }
        }
        if sim.world().rng.chance(300) {
            let _ = idem.admin().sweep(8).await;
        }
    }
}

async fn simulate(sim: Sim) -> Report {
    let (replicas, clients, intents) = {
        let mut w = sim.world();
        (w.rng.range(2, 4) as usize, w.rng.range(2, 5) as usize, w.rng.range(3, 7) as usize)
    };
    let cluster = Arc::new(Cluster {
        sim: sim.clone(),
        replicas: std::sync::Mutex::new(Vec::new()),
        caller: Caller::new("acme", "agent"),
    });
    for index in 0..replicas {
        let replica = cluster.replica(&sim, index);
        cluster.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(replica);
    }
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(client(Arc::clone(&cluster), intents)));
    }
    tasks.push(tokio::spawn(crasher(Arc::clone(&cluster))));
    tasks.push(tokio::spawn(outages(sim.clone())));
    tasks.push(tokio::spawn(operator(Arc::clone(&cluster))));
    sleep_ms(ACTIVE_MS).await;
    {
        let mut w = sim.world();
        w.stopping = true;
        w.calm = true;
        w.outage_until = 0;
    }
    sleep_ms(QUIESCE_MS).await;
    for task in &tasks {
        task.abort();
    }
    // The replicas hold the world through their ledgers: drop them so nothing outlives the run.
    cluster.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    let w = sim.world();
    Report {
        seed: 0,
        violations: w.violations.clone(),
        counts: w.counts,
        trace: w.trace,
        log: w.log.clone().unwrap_or_default(),
    }
}

/// Runs one seed on `which` ledger, start to end, on a fresh runtime.
///
/// # Panics
/// If a runtime or the SQLite file cannot be made.
pub fn run_seed(seed: u64, which: Which) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let clock = LedgerClock::default();
    let mut sqlite = None;
    let store = match which {
        Which::Memory => {
            Store { inner: Arc::new(MemoryLedger::with_clock(clock.clone())), backend: Backend::Memory, clock }
        }
        Which::SqliteFile => {
            let io = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for SQLite");
            // One directory per run, not per seed: two tests of this process may run one seed at once.
            static RUNS: AtomicU64 = AtomicU64::new(0);
            let run = RUNS.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("idem-sim-{}-{seed}-{run}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a directory for the SQLite file");
            let url = format!("sqlite://{}?mode=rwc", dir.join("ledger.sqlite3").display());
            let ledger = io.block_on(SeaOrmLedger::connect(&url)).expect("open the SQLite ledger");
            let store = Store {
                inner: Arc::new(ledger.with_clock(clock.clone())),
                backend: Backend::Sqlite(io.handle().clone()),
                clock,
            };
            sqlite = Some((io, dir));
            store
        }
    };
    let report = runtime.block_on(async {
        let sim = Sim::new(store, seed);
        let mut report = simulate(sim).await;
        report.seed = seed;
        report
    });
    drop(runtime);
    if let Some((io, dir)) = sqlite {
        io.shutdown_background();
        let _ = std::fs::remove_dir_all(dir);
    }
    report
}
