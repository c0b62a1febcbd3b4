//! Storms on every durable backend (SQLite file, PostgreSQL, MariaDB):
//! - `identical`: 1,000 concurrent identical calls → exactly one execution (counted by the
//!   handler and by the downstream), every other answer `in_flight` or a replay, no other error;
//! - `many_keys`: calls over 100 keys with random repeats, 32 at a time → effects at the
//!   downstream = distinct operations, every other answer a replay or `in_flight`, no other
//!   error. 2,000 calls in the short run, 10,000 in the long run (`IDEM_RELIABILITY_LONG=1`);
//! - `after_a_crash`: 1,000 concurrent identical calls on an operation whose holder died (its
//!   lease lapsed): `takeover` runs the handler once, `reconcile` asks the downstream once and
//!   runs once, `hold` runs nothing and answers every call "outcome unknown";
//! - `failing_identical`: 1,000 concurrent identical calls whose handler fails with "nothing
//!   happened" (so the record keeps flipping between in progress and failed): every answer is
//!   the handler's own error or `in_flight` — the claim always settles, never
//!   `ledger_unavailable`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{Caller, Recipe, Reconciled, StalePolicy, current_operation};
use serde_json::json;

use crate::support;
use crate::support::{RelError, scale, unique};

static STORM: Recipe = Recipe::new("rel_storm_charge", &["order_id"]);

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_backend!(identical, many_keys, after_a_crash);

mod failing {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::failing_identical("sqlite").await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::failing_identical("postgres").await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mysql() {
        super::failing_identical("mysql").await;
    }
}

/// Answers by kind: `fresh`, `replay`, or idem's code; and the first message of each error kind.
#[derive(Default)]
struct Answers(Mutex<BTreeMap<String, usize>>, Mutex<BTreeMap<String, String>>);

impl Answers {
    fn add(&self, result: &Result<idem_runtime::Served<String>, RelError>) {
        let kind = match result {
            Ok(served) if served.replayed => "replay".to_owned(),
            Ok(_) => "fresh".to_owned(),
            Err(error) => {
                self.1.lock().unwrap().entry(error.code().to_owned()).or_insert_with(|| format!("{error:?}"));
                error.code().to_owned()
            }
        };
        *self.0.lock().unwrap().entry(kind).or_default() += 1;
    }
    /// The first message seen for each error kind other than the expected ones.
    fn examples(&self) -> String {
        let others = self.others();
        let examples = self.1.lock().unwrap();
        others
            .keys()
            .filter(|kind| *kind != "handler")
            .filter_map(|kind| examples.get(kind))
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    }
    fn get(&self, kind: &str) -> usize {
        self.0.lock().unwrap().get(kind).copied().unwrap_or(0)
    }
    fn others(&self) -> BTreeMap<String, usize> {
        let mut all = self.0.lock().unwrap().clone();
        for kind in ["fresh", "replay", "in_flight"] {
            all.remove(kind);
        }
        all
    }
}

async fn identical(backend: &str) {
    let Some((_, ledger)) = support::connect(backend, "reliability_storm::identical").await else { return };
    let idem = idem_tests::idem(ledger);
    let rounds = scale(1, 3);
    let callers = 1_000;
    let mut rows = Vec::new();
    for _ in 0..rounds {
        let caller = Caller::new(unique("rel-storm-tenant"), "agent");
        let arguments = Arc::new(json!({ "order_id": unique("order"), "amount_cents": 4200 }));
        let (executions, effects) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let answers = Arc::new(Answers::default());
        let barrier = Arc::new(tokio::sync::Barrier::new(callers));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..callers {
            let (idem, caller, arguments) = (idem.clone(), caller.clone(), Arc::clone(&arguments));
            let (executions, effects, answers, barrier) =
                (Arc::clone(&executions), Arc::clone(&effects), Arc::clone(&answers), Arc::clone(&barrier));
            tasks.spawn(async move {
                barrier.wait().await;
                let result = idem
                    .call(&STORM, Some(&caller), &arguments, || async {
                        executions.fetch_add(1, Ordering::SeqCst);
                        // The downstream: does not dedupe, so a second run would be a second effect.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        effects.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, RelError>(format!("rcpt-{}", current_operation().unwrap().reference()))
                    })
                    .await;
                answers.add(&result);
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let (executions, effects) = (executions.load(Ordering::SeqCst), effects.load(Ordering::SeqCst));
        rows.push(vec![
            backend.to_owned(),
            callers.to_string(),
            executions.to_string(),
            effects.to_string(),
            answers.get("fresh").to_string(),
            answers.get("in_flight").to_string(),
            answers.get("replay").to_string(),
            format!("{:?}", answers.others()),
        ]);
        assert_eq!((executions, effects, answers.get("fresh")), (1, 1, 1), "{backend}: exactly one execution");
        assert_eq!(answers.get("in_flight") + answers.get("replay"), callers - 1);
        assert!(
            answers.others().is_empty(),
            "{backend}: no other answer: {:?}: {}",
            answers.others(),
            answers.examples()
        );
    }
    support::print_table(
        &format!("storm: 1,000 concurrent identical calls, {backend}"),
        &["backend", "calls", "executions", "effects", "fresh", "in_flight", "replay", "other answers"],
        &rows,
    );
}

/// A small xorshift generator seeded from the OS: random repeats, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn many_keys(backend: &str) {
    let Some((_, ledger)) = support::connect(backend, "reliability_storm::many_keys").await else { return };
    let idem = idem_tests::idem(ledger);
    let (calls, keys, workers) = (scale(2_000, 10_000), 100usize, 32usize);
    let seed = idem_runtime::ledger::Token::random().get() | 1;
    let mut rng = Rng(seed);
    let prefix = unique("order");
    let plan: Arc<Vec<String>> = Arc::new(
        (0..calls).map(|_| format!("{prefix}-{}", usize::try_from(rng.next() % keys as u64).unwrap())).collect(),
    );
    let distinct = plan.iter().collect::<std::collections::BTreeSet<_>>().len();
    let caller = Caller::new(unique("rel-storm-tenant"), "agent");
    let effects: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let answers = Arc::new(Answers::default());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (idem, caller, plan, effects, answers, next) = (
            idem.clone(),
            caller.clone(),
            Arc::clone(&plan),
            Arc::clone(&effects),
            Arc::clone(&answers),
            Arc::clone(&next),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(order) = plan.get(i) else { break };
                let arguments = json!({ "order_id": order, "amount_cents": 100 });
                let result = idem
                    .call(&STORM, Some(&caller), &arguments, || async {
                        *effects.lock().unwrap().entry(order.clone()).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, RelError>(format!("rcpt-{order}"))
                    })
                    .await;
                if let Ok(served) = &result {
                    assert_eq!(served.value, format!("rcpt-{order}"), "the operation's own result");
                }
                answers.add(&result);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let effects = effects.lock().unwrap().clone();
    let total: usize = effects.values().sum();
    let duplicated = effects.values().filter(|n| **n > 1).count();
    support::print_table(
        &format!("storm: {calls} calls over {keys} keys, {workers} at a time, {backend}"),
        &[
            "backend",
            "calls",
            "distinct ops",
            "effects",
            "keys with >1 effect",
            "fresh",
            "replay",
            "in_flight",
            "other",
        ],
        &[vec![
            backend.to_owned(),
            calls.to_string(),
            distinct.to_string(),
            total.to_string(),
            duplicated.to_string(),
            answers.get("fresh").to_string(),
            answers.get("replay").to_string(),
            answers.get("in_flight").to_string(),
            format!("{:?} (seed {seed})", answers.others()),
        ]],
    );
    assert_eq!((total, effects.len(), duplicated), (distinct, distinct, 0), "{backend}: one effect per operation");
    assert_eq!(answers.get("fresh"), distinct);
    assert_eq!(answers.get("fresh") + answers.get("replay") + answers.get("in_flight"), calls);
    assert!(answers.others().is_empty(), "{backend}: no other answer: {:?}: {}", answers.others(), answers.examples());
}

// Tools of their own: three recipes of one name on one ledger would be three handlers sharing
// keys, refused as `duplicate_tool` on any handle (issue 41, item 6).
static TAKEOVER: Recipe = Recipe::new("rel_storm_charge_takeover", &["order_id"]).stale(StalePolicy::Takeover);
static RECONCILE: Recipe = Recipe::new("rel_storm_charge_reconcile", &["order_id"]).stale(StalePolicy::Reconcile);

async fn after_a_crash(backend: &str) {
    let Some((_, ledger)) = support::connect(backend, "reliability_storm::after_a_crash").await else { return };
    let ledger: Arc<dyn idem_runtime::ledger::Ledger> = Arc::new(ledger);
    let callers = 1_000;
    let mut rows = Vec::new();
    for (name, recipe) in [("takeover", &TAKEOVER), ("reconcile", &RECONCILE), ("hold", &STORM)] {
        let caller = Caller::new(unique("rel-storm-tenant"), "agent");
        let arguments = Arc::new(json!({ "order_id": unique("order"), "amount_cents": 4200 }));
        // A holder that died: claimed with a short lease, never completed, never renewed. (Its
        // clock is the ledger's: a replica whose clock is off is corrected, so a skewed clock no
        // longer fakes a dead holder.)
        let past = idem_tests::builder(Arc::clone(&ledger)).lease(Duration::from_millis(200)).build().unwrap();
        let (claimed_tx, claimed) = tokio::sync::oneshot::channel();
        let dead = {
            let (caller, arguments) = (caller.clone(), Arc::clone(&arguments));
            tokio::spawn(async move {
                past.call(recipe, Some(&caller), &arguments, || async move {
                    claimed_tx.send(()).unwrap();
                    std::future::pending::<Result<String, RelError>>().await
                })
                .await
            })
        };
        if claimed.await.is_err() {
            panic!("{name}: the holder's call ended before its handler ran: {:?}", dead.await);
        }
        dead.abort();
        assert!(dead.await.unwrap_err().is_cancelled());
        tokio::time::sleep(Duration::from_millis(300)).await;

        let idem = idem_tests::idem_shared(Arc::clone(&ledger));
        let (executions, reconciles) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let answers = Arc::new(Answers::default());
        let barrier = Arc::new(tokio::sync::Barrier::new(callers));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..callers {
            let (idem, caller, arguments) = (idem.clone(), caller.clone(), Arc::clone(&arguments));
            let (executions, reconciles, answers, barrier) =
                (Arc::clone(&executions), Arc::clone(&reconciles), Arc::clone(&answers), Arc::clone(&barrier));
            tasks.spawn(async move {
                barrier.wait().await;
                let result = idem
                    .call_reconciling(
                        recipe,
                        Some(&caller),
                        &arguments,
                        |_| async {
                            reconciles.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            Reconciled::NothingHappened
                        },
                        || async {
                            executions.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, RelError>("charged".to_owned())
                        },
                    )
                    .await;
                answers.add(&result);
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let (executions, reconciles) = (executions.load(Ordering::SeqCst), reconciles.load(Ordering::SeqCst));
        let mut others = answers.others();
        let unknown = others.remove("outcome_unknown").unwrap_or(0);
        rows.push(vec![
            backend.to_owned(),
            name.to_owned(),
            callers.to_string(),
            executions.to_string(),
            reconciles.to_string(),
            answers.get("fresh").to_string(),
            answers.get("in_flight").to_string(),
            answers.get("replay").to_string(),
            unknown.to_string(),
            format!("{others:?}"),
        ]);
        match name {
            "hold" => assert_eq!((executions, reconciles, unknown), (0, 0, callers), "{backend}/hold"),
            _ => {
                let expected_reconciles = usize::from(name == "reconcile");
                assert_eq!(
                    (executions, reconciles, answers.get("fresh")),
                    (1, expected_reconciles, 1),
                    "{backend}/{name}"
                );
                assert_eq!(answers.get("in_flight") + answers.get("replay"), callers - 1, "{backend}/{name}");
                assert_eq!(unknown, 0);
            }
        }
        assert!(others.is_empty(), "{backend}/{name}: {others:?}: {}", answers.examples());
    }
    support::print_table(
        &format!("storm on a dead holder's operation: 1,000 concurrent identical calls, {backend}"),
        &[
            "backend",
            "stale policy",
            "calls",
            "executions",
            "reconciles",
            "fresh",
            "in_flight",
            "replay",
            "outcome_unknown",
            "other",
        ],
        &rows,
    );
}

async fn failing_identical(backend: &str) {
    let Some((_, ledger)) = support::connect(backend, "reliability_storm::failing_identical").await else { return };
    let idem = idem_tests::idem(ledger);
    let callers = 1_000;
    let caller = Caller::new(unique("rel-storm-tenant"), "agent");
    let arguments = Arc::new(json!({ "order_id": unique("order"), "amount_cents": 4200 }));
    let executions = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Answers::default());
    let barrier = Arc::new(tokio::sync::Barrier::new(callers));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (idem, caller, arguments) = (idem.clone(), caller.clone(), Arc::clone(&arguments));
        let (executions, answers, barrier) = (Arc::clone(&executions), Arc::clone(&answers), Arc::clone(&barrier));
        tasks.spawn(async move {
            barrier.wait().await;
            let result = idem
                .call(&STORM, Some(&caller), &arguments, || async {
                    executions.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Err::<String, _>(RelError::Effect("refused before any effect".to_owned()))
                })
                .await;
            answers.add(&result);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let executions = executions.load(Ordering::SeqCst);
    let mut others = answers.others();
    let own_errors = others.remove("handler").unwrap_or(0);
    support::print_table(
        &format!("storm of identical calls that fail with nothing happened, {backend}"),
        &["backend", "calls", "executions (each a new attempt)", "handler errors", "in_flight", "other"],
        &[vec![
            backend.to_owned(),
            callers.to_string(),
            executions.to_string(),
            own_errors.to_string(),
            answers.get("in_flight").to_string(),
            format!("{others:?}"),
        ]],
    );
    assert!(others.is_empty(), "{backend}: the claim must always settle: {others:?}: {}", answers.examples());
    assert_eq!(own_errors, executions, "{backend}: every run answered its own caller");
    assert_eq!(own_errors + answers.get("in_flight"), callers, "{backend}");
}
