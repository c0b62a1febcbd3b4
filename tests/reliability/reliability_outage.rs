//! Ledger outage on PostgreSQL (and, for the proxy cut, MariaDB), in the middle of a load.
//!
//! Eight tasks call distinct operations through a real `SeaOrmLedger` while the ledger is taken
//! away from under them, two ways:
//! - `proxy_cut`: the pool reaches PostgreSQL through a small TCP proxy in this process; the
//!   proxy is cut (every live connection shut down mid-statement, new ones refused) for a few
//!   hundred milliseconds, several times;
//! - `terminate`: another connection runs `pg_terminate_backend` on every backend whose
//!   `application_name` is the pool's, every few tens of milliseconds.
//!
//! Promised, and counted on the far side (the handler's own log and the downstream):
//! - no handler runs without a claim: every key a handler started with has a ledger record;
//! - every caller is told the truth: an answer is either the result, or `ledger_unavailable`
//!   from a call whose handler did not run — no other answer, ever;
//! - after recovery, retrying every call completes it, the effect count at the downstream equals
//!   the number of distinct operations, and a retry of a call that had succeeded returns the
//!   same result.
//!
//! A call whose completion failed after its effect returned its result to its caller, but its
//! record stays `in_progress` until the lease runs out. This test uses `stale = "takeover"` with
//! a downstream that dedupes by the forwarded key, so the retry waits out the lease (answered
//! `in_flight` meanwhile), takes over, re-runs the handler, and the downstream hands back the
//! first receipt: the effect stays single and the caller sees the same result. The number of
//! such calls is printed; under `hold` they would become "outcome unknown" for an operator.
//!
//! `lost_claim_answer_*` follow a claim whose answer is lost on the wire, and
//! `a_silent_ledger_is_answered_within_a_bound` a ledger that never answers (see RELIABILITY.md).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::ledger::Resolution;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::{Caller, Idem, Key, Recipe, StalePolicy, current_operation, ledger::State};
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use serde_json::{Value, json};

use crate::support;
use crate::support::{RelError, scale, unique};

static CHARGE: Recipe = Recipe::new("rel_outage_charge", &["order_id"]).stale(StalePolicy::Takeover);
static CHARGE_HOLD: Recipe = Recipe::new("rel_outage_charge", &["order_id"]);

const TASKS: usize = 8;
const LEASE: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------------
// A TCP proxy that can be cut, or made to swallow the server's answers.
// ---------------------------------------------------------------------------------------------

struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    /// When set, bytes from the server are read and dropped (the request arrives, the answer
    /// never does).
    blackhole: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let blackhole = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, blackhole2, live2) = (Arc::clone(&up), Arc::clone(&blackhole), Arc::clone(&live));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                {
                    let mut live = live2.lock().unwrap();
                    live.push(client.try_clone().unwrap());
                    live.push(server.try_clone().unwrap());
                }
                let (c_read, s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(c_read, s_write, None));
                let drop_answers = Arc::clone(&blackhole2);
                std::thread::spawn(move || pump(server, client, Some(drop_answers)));
            }
        });
        Self { port, up, blackhole, live }
    }

    /// Shuts down every live connection and refuses new ones until [`Proxy::restore`].
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for stream in self.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.blackhole.store(false, Ordering::SeqCst);
        self.up.store(true, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, drop_when: Option<Arc<AtomicBool>>) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if drop_when.as_ref().is_some_and(|flag| flag.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// `url` with its host and port replaced by `127.0.0.1:port`, and the address it named.
fn through(url: &str, port: u16) -> (String, SocketAddr) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let (credentials, host) = authority.rsplit_once('@').map_or(("", authority), |(c, h)| (c, h));
    let default_port = if scheme.starts_with("mysql") { 3306 } else { 5432 };
    let host = if host.contains(':') { host.to_owned() } else { format!("{host}:{default_port}") };
    let target = host.to_socket_addrs().expect("resolve the database host").next().expect("an address");
    let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
    (format!("{scheme}://{at}127.0.0.1:{port}/{path}"), target)
}

fn with_application_name(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

// ---------------------------------------------------------------------------------------------
// The load and its far side.
// ---------------------------------------------------------------------------------------------

/// The downstream: dedupes by the forwarded key; counts raw attempts.
#[derive(Default)]
struct Downstream {
    applied: Mutex<HashMap<String, (String, String)>>,
    attempts: AtomicUsize,
    sequence: AtomicUsize,
}

impl Downstream {
    fn charge(&self, key: &str, order: &str) -> String {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let mut applied = self.applied.lock().unwrap();
        let n = self.sequence.fetch_add(1, Ordering::SeqCst);
        applied.entry(key.to_owned()).or_insert_with(|| (order.to_owned(), format!("rcpt-{order}-{n}"))).1.clone()
    }
}

#[derive(Default)]
struct Tally {
    /// (order, key) for every handler start.
    started: Mutex<Vec<(String, String)>>,
    /// Results the load got, by order.
    succeeded: Mutex<BTreeMap<String, String>>,
    /// Orders answered `ledger_unavailable`.
    unavailable: Mutex<BTreeSet<String>>,
    /// `ledger_unavailable` answers from calls whose handler had started (must stay empty).
    lied: Mutex<Vec<String>>,
    /// Any other answer (must stay empty).
    unexpected: Mutex<Vec<String>>,
}

fn key_of(idem: &Idem, caller: &Caller, order: &str) -> Key {
    idem.admin().key_of(&CHARGE, caller, &json!({ "order_id": order })).unwrap()
}

/// One call of the load; `true` when it was answered `ledger_unavailable`.
async fn call_once(idem: &Idem, caller: &Caller, order: &str, downstream: &Downstream, tally: &Tally) -> bool {
    let started = AtomicBool::new(false);
    let arguments = json!({ "order_id": order, "amount_cents": 990 });
    let result = idem
        .call(&CHARGE, Some(caller), &arguments, || async {
            started.store(true, Ordering::SeqCst);
            let operation = current_operation().unwrap();
            tally.started.lock().unwrap().push((order.to_owned(), operation.ledger_key().to_string()));
            // The downstream dedupes on what users forward.
            let receipt = downstream.charge(&operation.idempotency_key(), order);
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, RelError>(receipt)
        })
        .await;
    match result {
        Ok(served) => {
            tally.succeeded.lock().unwrap().insert(order.to_owned(), served.value);
            false
        }
        Err(error) if error.code() == "ledger_unavailable" => {
            if started.load(Ordering::SeqCst) {
                tally.lied.lock().unwrap().push(format!("{order}: {error:?}"));
            }
            tally.unavailable.lock().unwrap().insert(order.to_owned());
            true
        }
        Err(error) => {
            tally.unexpected.lock().unwrap().push(format!("{order}: {error:?}"));
            false
        }
    }
}

enum Fault {
    ProxyCut(Arc<Proxy>),
    Terminate { admin: sea_orm::DatabaseConnection, application_name: String },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outage_by_proxy_cut() {
    let test = "reliability_outage::outage_by_proxy_cut";
    let Some((url, _)) = support::connect("postgres", test).await else { return };
    let proxy = Arc::new(Proxy::start(through(&url, 1).1));
    let (proxied, _) = through(&url, proxy.port);
    outage(test, &proxied, Fault::ProxyCut(proxy)).await;
}

/// The same cut between the pool and MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outage_by_proxy_cut_mysql() {
    let test = "reliability_outage::outage_by_proxy_cut_mysql";
    let Some((url, _)) = support::connect("mysql", test).await else { return };
    let proxy = Arc::new(Proxy::start(through(&url, 1).1));
    let (proxied, _) = through(&url, proxy.port);
    outage(test, &proxied, Fault::ProxyCut(proxy)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outage_by_terminated_backends() {
    let test = "reliability_outage::outage_by_terminated_backends";
    let Some((url, _)) = support::connect("postgres", test).await else { return };
    let application_name = unique("idem_rel_outage").replace('-', "_");
    let admin = Database::connect(&url).await.unwrap();
    outage(test, &with_application_name(&url, &application_name), Fault::Terminate { admin, application_name }).await;
}

async fn outage(test: &str, url: &str, fault: Fault) {
    let ledger = SeaOrmLedger::connect(url).await.expect("connect through the fault");
    let idem = idem_tests::builder(ledger).lease(LEASE).build().unwrap();
    let caller = Caller::new(unique("rel-outage-tenant"), "loader");
    let (downstream, tally) = (Arc::new(Downstream::default()), Arc::new(Tally::default()));
    let faults_wanted = scale(3, 25);
    let min_ops_per_task = scale(20, 120);
    let faults_done = Arc::new(AtomicBool::new(false));

    let mut load = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (idem, caller, downstream, tally, faults_done) =
            (idem.clone(), caller.clone(), Arc::clone(&downstream), Arc::clone(&tally), Arc::clone(&faults_done));
        load.spawn(async move {
            let mut orders = Vec::new();
            while orders.len() < min_ops_per_task || !faults_done.load(Ordering::SeqCst) {
                let order = format!("o{task}-{}", orders.len());
                let refused = call_once(&idem, &caller, &order, &downstream, &tally).await;
                orders.push(order);
                // A caller told `ledger_unavailable` backs off a little, as a client would.
                tokio::time::sleep(Duration::from_millis(if refused { 15 } else { 3 })).await;
            }
            orders
        });
    }

    // The faults, while the load runs.
    let mut injected = 0usize;
    let mut terminated = 0usize;
    for round in 0..faults_wanted {
        tokio::time::sleep(Duration::from_millis(60 + 13 * (round as u64 % 5))).await;
        match &fault {
            Fault::ProxyCut(proxy) => {
                proxy.cut();
                // Mostly short gaps; every fourth (the second one first) outlasts idem's own
                // completion retries, so some completions fail after their effect.
                let gap = if round % 4 == 1 { 2_000 } else { 150 + 50 * (round as u64 % 4) };
                tokio::time::sleep(Duration::from_millis(gap)).await;
                proxy.restore();
            }
            Fault::Terminate { admin, application_name } => {
                let sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1";
                let rows = admin
                    .query_all_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        sql,
                        vec![application_name.clone().into()],
                    ))
                    .await
                    .unwrap();
                terminated += rows.len();
            }
        }
        injected += 1;
    }
    faults_done.store(true, Ordering::SeqCst);
    let mut orders = Vec::new();
    while let Some(task) = load.join_next().await {
        orders.extend(task.unwrap());
    }

    // After recovery. No handler without a claim: every started key has a record.
    let mut without_claim = 0;
    let started: Vec<(String, String)> = tally.started.lock().unwrap().clone();
    for (order, key) in &started {
        assert_eq!(*key, key_of(&idem, &caller, order).to_string(), "the forwarded key is the operation's");
        let reference = key_of(&idem, &caller, order).reference().to_string();
        let found = support::poll(Duration::from_secs(10), || async {
            idem.status(&caller, &reference).await.ok().map(|status| status.is_some())
        })
        .await;
        if found != Some(true) {
            without_claim += 1;
        }
    }
    // Completions lost after the effect: the caller got its result, the record is in progress.
    let succeeded = tally.succeeded.lock().unwrap().clone();
    let mut completion_lost = 0;
    for order in succeeded.keys() {
        let reference = key_of(&idem, &caller, order).reference().to_string();
        let state = support::poll(Duration::from_secs(10), || async {
            idem.status(&caller, &reference).await.ok().flatten().map(|status| status.state)
        })
        .await;
        if state == Some(State::InProgress) {
            completion_lost += 1;
        }
    }

    // Retry every call until it completes.
    let (mut in_flight_waits, mut unavailable_after_recovery, mut changed_results, mut not_completed) = (0, 0, 0, 0);
    let mut unexpected_after = Vec::new();
    for order in &orders {
        let arguments = json!({ "order_id": order, "amount_cents": 990 });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let value = loop {
            let result = idem
                .call(&CHARGE, Some(&caller), &arguments, || async {
                    let operation = current_operation().unwrap();
                    tally.started.lock().unwrap().push((order.clone(), operation.ledger_key().to_string()));
                    Ok::<_, RelError>(downstream.charge(&operation.idempotency_key(), order))
                })
                .await;
            match result {
                Ok(served) => break Some(served.value),
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    unexpected_after.push(format!("{order}: still {error:?}"));
                    break None;
                }
                Err(error) if error.code() == "in_flight" => in_flight_waits += 1,
                Err(error) if error.code() == "ledger_unavailable" => unavailable_after_recovery += 1,
                Err(error) => {
                    unexpected_after.push(format!("{order}: {error:?}"));
                    break None;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        match (value, succeeded.get(order)) {
            (Some(value), Some(first)) if value != *first => changed_results += 1,
            (None, _) => not_completed += 1,
            _ => {}
        }
        let reference = key_of(&idem, &caller, order).reference().to_string();
        if idem.status(&caller, &reference).await.unwrap().map(|s| s.state) != Some(State::Completed) {
            not_completed += 1;
        }
    }

    let applied = downstream.applied.lock().unwrap().clone();
    let mut per_order: BTreeMap<&str, usize> = BTreeMap::new();
    for (order, _) in applied.values() {
        *per_order.entry(order.as_str()).or_default() += 1;
    }
    let duplicates: usize = per_order.values().map(|n| n.saturating_sub(1)).sum();
    let attempts = downstream.attempts.load(Ordering::SeqCst);
    let (lied, unexpected) = (tally.lied.lock().unwrap().clone(), tally.unexpected.lock().unwrap().clone());
    let unavailable = tally.unavailable.lock().unwrap().len();
    let fault_name = match &fault {
        Fault::ProxyCut(_) => format!("proxy cut ×{injected}"),
        Fault::Terminate { .. } => format!("pg_terminate_backend ×{injected} ({terminated} backends)"),
    };
    support::print_table(
        &format!("ledger outage ({test})"),
        &[
            "fault",
            "operations",
            "ok in load",
            "ledger_unavailable in load",
            "other answers",
            "handler without claim",
            "unavailable but handler ran",
            "completion lost after effect",
            "retries: in_flight / unavailable",
            "effects (distinct ops)",
            "duplicates",
            "re-runs absorbed by dedupe",
            "changed results",
            "not completed",
        ],
        &[vec![
            fault_name,
            orders.len().to_string(),
            succeeded.len().to_string(),
            unavailable.to_string(),
            (unexpected.len() + unexpected_after.len()).to_string(),
            without_claim.to_string(),
            lied.len().to_string(),
            completion_lost.to_string(),
            format!("{in_flight_waits} / {unavailable_after_recovery}"),
            format!("{} ({})", applied.len(), orders.len()),
            duplicates.to_string(),
            attempts.saturating_sub(applied.len()).to_string(),
            changed_results.to_string(),
            not_completed.to_string(),
        ]],
    );
    assert!(unexpected.is_empty() && unexpected_after.is_empty(), "{unexpected:?} {unexpected_after:?}");
    assert!(lied.is_empty(), "told nothing was executed, but the handler ran: {lied:?}");
    assert_eq!(without_claim, 0, "a handler ran without a ledger record");
    assert_eq!((duplicates, applied.len(), per_order.len()), (0, orders.len(), orders.len()));
    assert_eq!((changed_results, not_completed), (0, 0));
    assert!(injected == faults_wanted && orders.len() >= TASKS * min_ops_per_task);
}

// ---------------------------------------------------------------------------------------------
// An acknowledgement lost on the wire.
// ---------------------------------------------------------------------------------------------

/// A claim whose answer is lost on the wire: the claim reaches PostgreSQL and commits, but its
/// answer is swallowed (the proxy drops what the server sends) until the connection is cut.
/// Returns the handle to retry with (a direct connection), the caller, the arguments, the ref,
/// and the handler's run counter; the lost call's own answer has been checked.
async fn lose_a_claim_answer(test: &str) -> Option<(Idem, Caller, Value, String, Arc<AtomicUsize>)> {
    let (url, direct) = support::connect("postgres", test).await?;
    let idem = idem_tests::builder(direct).lease(LEASE).build().unwrap();
    // The scenario needs the claim to reach the server whole, which holds only when the pool
    // hands the call its warmed connection (one whose statements are prepared: sqlx waits for
    // the answer to a first `Parse`, which the blackhole swallows). When it hands out another,
    // nothing reaches the server: set the scene again (it happened about one run in three
    // before issue 10 too).
    for _ in 0..5 {
        if let Some(lost) = try_to_lose_a_claim_answer(&url, &idem).await {
            return Some(lost);
        }
    }
    panic!("the lost claim never reached the server in five tries");
}

async fn try_to_lose_a_claim_answer(url: &str, idem: &Idem) -> Option<(Idem, Caller, Value, String, Arc<AtomicUsize>)> {
    let proxy = Arc::new(Proxy::start(through(url, 1).1));
    let (proxied, _) = through(url, proxy.port);
    // The ledger's clock is read locally: a clock read through the proxy (idem refreshes its
    // skew in the background every third of a lease) would take the warmed connection.
    let db = Database::connect(SeaOrmLedger::connect_options(&proxied)).await.unwrap();
    let ledger = SeaOrmLedger::from_connection(db).with_clock(idem_runtime::clock::SystemClock);
    let through_proxy = idem_tests::builder(ledger).lease(LEASE).build().unwrap();
    let caller = Caller::new(unique("rel-ack-tenant"), "loader");
    let runs = Arc::new(AtomicUsize::new(0));
    let order = unique("order");
    let arguments = json!({ "order_id": order, "amount_cents": 990 });

    // Warm the pooled connection: sqlx prepares a statement on first use and waits for that
    // answer before executing, so only a statement already prepared reaches the server whole.
    let warm = json!({ "order_id": unique("warm"), "amount_cents": 1 });
    through_proxy
        .call(&CHARGE_HOLD, Some(&caller), &warm, || async { Ok::<_, RelError>(String::new()) })
        .await
        .unwrap();
    proxy.blackhole.store(true, Ordering::SeqCst);
    let pending = {
        let (through_proxy, caller, runs, arguments) =
            (through_proxy.clone(), caller.clone(), Arc::clone(&runs), arguments.clone());
        tokio::spawn(async move {
            through_proxy
                .call(&CHARGE_HOLD, Some(&caller), &arguments, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, RelError>("ran".to_owned())
                })
                .await
        })
    };
    // The claim is committed on the server while its answer is being swallowed.
    let reference = key_of(idem, &caller, &order).reference().to_string();
    let committed = support::poll(Duration::from_secs(5), || async {
        idem.status(&caller, &reference).await.unwrap().map(|status| status.state)
    })
    .await;
    if committed.is_none() {
        proxy.cut();
        pending.abort();
        return None;
    }
    assert_eq!(committed, Some(State::InProgress), "the claim committed on the server");
    // The outage: the connection is cut and stays down for a moment (as outages do).
    proxy.cut();
    let answer = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("answered after the cut").unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.restore();
    let error = answer.expect_err("the claim's answer was lost");
    assert_eq!(error.code(), "ledger_unavailable", "{error:?}");
    let RelError::Rejected { message, .. } = &error else { unreachable!() };
    assert!(message.contains("nothing was executed") && message.contains("safe to retry"), "{message}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing was executed");
    Some((idem.clone(), caller, arguments, reference, runs))
}

/// After a lost claim answer the caller is told the truth (`ledger_unavailable`, nothing ran),
/// and the operation has a documented way to completion with exactly one run. Depending on
/// whether idem could release the orphan claim, that way is a plain retry, or (under the
/// default `hold`) `in_flight` until the lease runs out, then "outcome unknown" until
/// `Idem::resolve` — the path is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_claim_answer_tells_the_truth_and_has_a_way_out() {
    let test = "reliability_outage::lost_claim_answer_tells_the_truth_and_has_a_way_out";
    let Some((idem, caller, arguments, reference, runs)) = lose_a_claim_answer(test).await else { return };
    let mut path = vec!["ledger_unavailable (handler not run)".to_owned()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        assert!(tokio::time::Instant::now() < deadline, "no way out: {path:?}");
        let runs = Arc::clone(&runs);
        let retry = idem.call(&CHARGE_HOLD, Some(&caller), &arguments, move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, RelError>("ran".to_owned())
        });
        match retry.await {
            Ok(served) => break served,
            Err(error) if error.code() == "in_flight" => {
                if path.last().is_none_or(|last| last != "in_flight") {
                    path.push("in_flight".to_owned());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) if error.code() == "outcome_unknown" => {
                path.push("outcome_unknown -> Idem::resolve(NothingHappened)".to_owned());
                let address = idem.status(&caller, &reference).await.unwrap().expect("the unknown one").address();
                idem.admin().resolve(caller.tenant(), &address.to_string(), Resolution::NothingHappened).await.unwrap();
            }
            Err(error) => panic!("{path:?} then {error:?}"),
        }
    };
    path.push("retry ran".to_owned());
    assert_eq!((done.value.as_str(), done.replayed, runs.load(Ordering::SeqCst)), ("ran", false, 1));
    eprintln!("lost claim answer: {}", path.join(" -> "));
}

/// The stronger promise: a retry of a call that was told "nothing was executed, safe to retry"
/// completes once the ledger is back, without an operator, under the default `hold` policy.
/// Today the orphan claim (idem's release of it failed: the ledger was down) turns into
/// "outcome unknown" when its lease runs out, although nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_claim_answer_retry_needs_no_operator() {
    let test = "reliability_outage::lost_claim_answer_retry_needs_no_operator";
    let Some((idem, caller, arguments, _, runs)) = lose_a_claim_answer(test).await else { return };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let runs = Arc::clone(&runs);
        let retry = idem.call(&CHARGE_HOLD, Some(&caller), &arguments, move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, RelError>("ran".to_owned())
        });
        match retry.await {
            Ok(served) => break served,
            Err(error) if error.code() == "in_flight" && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("the retry the caller was told is safe got {error:?}"),
        }
    };
    assert_eq!((done.value.as_str(), runs.load(Ordering::SeqCst)), ("ran", 1));
}

/// A ledger that accepts the claim and never answers (a half-open connection, a partition after
/// the request left) keeps `Idem::call` waiting: there is no timeout on ledger statements, so the
/// caller is never told anything — contrary to "if the ledger cannot be reached, the caller is
/// told nothing was executed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ledger_is_answered_within_a_bound() {
    let test = "reliability_outage::a_silent_ledger_is_answered_within_a_bound";
    let Some((url, _)) = support::connect("postgres", test).await else { return };
    let proxy = Arc::new(Proxy::start(through(&url, 1).1));
    let (proxied, _) = through(&url, proxy.port);
    let idem = idem_tests::builder(SeaOrmLedger::connect(&proxied).await.unwrap()).lease(LEASE).build().unwrap();
    let caller = Caller::new(unique("rel-silent-tenant"), "loader");
    let warm = json!({ "order_id": unique("warm") });
    idem.call(&CHARGE, Some(&caller), &warm, || async { Ok::<_, RelError>(String::new()) }).await.unwrap();
    proxy.blackhole.store(true, Ordering::SeqCst);
    let arguments = json!({ "order_id": unique("o") });
    let call = idem.call(&CHARGE, Some(&caller), &arguments, || async { Ok::<_, RelError>("ran".to_owned()) });
    // Generous: ten times the pool's own connect and acquire timeouts (5 s).
    let answered = tokio::time::timeout(Duration::from_secs(50), call).await;
    proxy.cut();
    let answer = answered.expect("Idem::call must answer (ledger_unavailable) within a bound");
    assert_eq!(answer.unwrap_err().code(), "ledger_unavailable");
}
