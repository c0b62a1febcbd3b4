//! Fencing under real concurrency, through the `Ledger` API on every durable backend (and
//! memory): a holder whose lease lapsed and was taken over can never overwrite its successor.
//!
//! - `completions_race_after_takeover`: A claims with a short lease; the lease lapses; B takes
//!   over; A's and B's completions then race on two tasks (and A's renewal with them). Always:
//!   B's result is stored, A gets `Fenced`, A's renewal gets `Fenced`.
//! - `takeover_races_the_late_completion`: A's lease has lapsed; A's late completion races B's
//!   takeover claim (and B's completion if it won). Either A completed first and B is answered
//!   with A's stored result (a replay), or B took over first and A is fenced — never both
//!   "succeeding", which would be two executions with one stored result.
//! - `late_holder_through_idem`: the same through `Idem::call` on two handles (two "replicas")
//!   sharing the ledger; A is paused — its renewals never reach the ledger — so its 300 ms lease
//!   lapses, and B takes over (`stale = "takeover"`). B's result is stored and replayed; A's late
//!   result never overwrites it. (A skewed clock no longer fakes a lapsed lease: each replica
//!   states its times on the ledger's clock.)

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_runtime::ledger::{Claim, ClaimRequest, Ledger, LedgerError, Outcome, State, Token, Won};
use idem_runtime::{
    Caller, Key, MemoryLedger, Recipe, StalePolicy, clock::Clock, clock::SystemClock, scope::TenantTag,
};
use idem_tests::tap::{Call, Pass, Tap, Tapped};
use serde_json::json;

use crate::support;
use crate::support::scale;
use crate::support::{RelError, unique};

macro_rules! on_every_ledger {
    ($($case:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("memory").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("sqlite").await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("postgres").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $case() { super::$case("mysql").await } )* }
    };
}

on_every_ledger!(completions_race_after_takeover, takeover_races_the_late_completion, late_holder_through_idem);

async fn ledger(backend: &str, test: &str) -> Option<Arc<dyn Ledger>> {
    if backend == "memory" {
        return Some(Arc::new(MemoryLedger::new()));
    }
    let (_, ledger) = support::connect(backend, test).await?;
    Some(Arc::new(ledger))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&Token::random().get().to_le_bytes()[..chunk.len()]);
    }
    bytes
}

/// A's claim at `now` with a 50 ms lease, and B's takeover claim 100 ms later (A's lease lapsed).
/// Times are real (so no sweep elsewhere deletes the record: it expires in an hour).
fn requests() -> (ClaimRequest, ClaimRequest) {
    let now = SystemClock.now_ms();
    let a = ClaimRequest {
        key: Key::from_bytes(random_bytes()),
        tenant: TenantTag::from_bytes(random_bytes()),
        subject: idem_runtime::scope::SubjectTag::TENANT,
        fingerprint: [3; 32],
        arg_tags: vec![[1, 2, 3, 4]],
        token: Token::random(),
        now,
        window_end: now + 3_600_000,
        expires_at: now + 3_600_000,
        lease_until: now + 50,
        stale: StalePolicy::Takeover,
        clock_trusted: true,
        label: None,
    };
    let b = ClaimRequest {
        token: Token::random(),
        now: now + 100,
        window_end: now + 100 + 3_600_000,
        expires_at: now + 100 + 3_600_000,
        lease_until: now + 100 + 60_000,
        ..a.clone()
    };
    (a, b)
}

async fn stored(ledger: &dyn Ledger, request: &ClaimRequest) -> (State, Option<Vec<u8>>) {
    let status = ledger
        .status(request.tenant, request.subject, request.key.reference(), request.now + 1)
        .await
        .unwrap()
        .unwrap();
    (status.state, status.result)
}

async fn completions_race_after_takeover(backend: &str) {
    let Some(ledger) = ledger(backend, "reliability_fencing::completions_race_after_takeover").await else { return };
    let rounds = scale(50, 1_000);
    let (mut b_stored, mut a_fenced, mut violations) = (0, 0, Vec::new());
    for round in 0..rounds {
        let (a, b) = requests();
        assert_eq!(ledger.claim(&a).await.unwrap().won(), Some(Won::Fresh));
        assert_eq!(ledger.claim(&b).await.unwrap().won(), Some(Won::Takeover), "A's lease lapsed");
        let barrier = Arc::new(tokio::sync::Barrier::new(3));
        let spawn_complete = |request: ClaimRequest, bytes: &'static [u8]| {
            let (ledger, barrier) = (Arc::clone(&ledger), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                ledger.complete(&request.key, request.token, Outcome::Completed(bytes.to_vec()), 0).await
            })
        };
        // Alternate who is spawned first, so neither always starts ahead.
        let (late_a, late_b) = if round % 2 == 0 {
            let late_a = spawn_complete(a.clone(), b"\"A\"");
            (late_a, spawn_complete(b.clone(), b"\"B\""))
        } else {
            let late_b = spawn_complete(b.clone(), b"\"B\"");
            (spawn_complete(a.clone(), b"\"A\""), late_b)
        };
        let renew = {
            let (ledger, barrier, a) = (Arc::clone(&ledger), Arc::clone(&barrier), a.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                ledger.renew(&a.key, a.token, a.now + 120_000).await
            })
        };
        let (late_a, late_b, renew) = (late_a.await.unwrap(), late_b.await.unwrap(), renew.await.unwrap());
        let record = stored(&*ledger, &b).await;
        if late_a == Err(LedgerError::Fenced) && renew == Err(LedgerError::Fenced) {
            a_fenced += 1;
        } else {
            violations.push(format!("round {round}: A complete {late_a:?}, A renew {renew:?}"));
        }
        if late_b.is_ok() && record == (State::Completed, Some(b"\"B\"".to_vec())) {
            b_stored += 1;
        } else {
            violations.push(format!("round {round}: B complete {late_b:?}, stored {record:?}"));
        }
    }
    support::print_table(
        &format!("fencing: completions race after a takeover, {backend}"),
        &["backend", "rounds", "B's result stored", "A fenced (complete and renew)", "violations"],
        &[vec![
            backend.to_owned(),
            rounds.to_string(),
            b_stored.to_string(),
            a_fenced.to_string(),
            violations.len().to_string(),
        ]],
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

async fn takeover_races_the_late_completion(backend: &str) {
    let Some(ledger) = ledger(backend, "reliability_fencing::takeover_races_the_late_completion").await else { return };
    let rounds = scale(50, 1_000);
    let (mut a_first, mut b_first, mut violations) = (0, 0, Vec::new());
    for round in 0..rounds {
        let (a, b) = requests();
        assert_eq!(ledger.claim(&a).await.unwrap().won(), Some(Won::Fresh));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        // On odd rounds A starts a few milliseconds late, so both orders are exercised on every
        // backend (a takeover claim takes more statements than a completion on some).
        let delay = std::time::Duration::from_millis(if round % 2 == 1 { (round as u64 / 2) % 5 } else { 0 });
        let late_a = {
            let (ledger, barrier, a) = (Arc::clone(&ledger), Arc::clone(&barrier), a.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                tokio::time::sleep(delay).await;
                ledger.complete(&a.key, a.token, Outcome::Completed(b"\"A\"".to_vec()), 0).await
            })
        };
        let takeover = {
            let (ledger, barrier, b) = (Arc::clone(&ledger), Arc::clone(&barrier), b.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let claim = ledger.claim(&b).await.unwrap();
                let completed = if claim.won() == Some(Won::Takeover) {
                    Some(ledger.complete(&b.key, b.token, Outcome::Completed(b"\"B\"".to_vec()), 0).await)
                } else {
                    None
                };
                (claim, completed)
            })
        };
        let (late_a, (claim, completed)) = (late_a.await.unwrap(), takeover.await.unwrap());
        let record = stored(&*ledger, &b).await;
        match (&late_a, &claim, &completed) {
            (Ok(()), Claim::Replay { result }, None)
                if result == b"\"A\"" && record == (State::Completed, Some(b"\"A\"".to_vec())) =>
            {
                a_first += 1;
            }
            (Err(LedgerError::Fenced), Claim::Won { attempt: Won::Takeover, .. }, Some(Ok(())))
                if record == (State::Completed, Some(b"\"B\"".to_vec())) =>
            {
                b_first += 1;
            }
            _ => violations
                .push(format!("round {round}: A {late_a:?}, B {claim:?} then {completed:?}, stored {record:?}")),
        }
    }
    support::print_table(
        &format!("fencing: takeover races a late completion, {backend}"),
        &["backend", "rounds", "A completed first (B replayed A)", "B took over first (A fenced)", "violations"],
        &[vec![
            backend.to_owned(),
            rounds.to_string(),
            a_first.to_string(),
            b_first.to_string(),
            violations.len().to_string(),
        ]],
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

static TAKEOVER: Recipe = Recipe::new("rel_fencing_charge", &["order_id"]).stale(StalePolicy::Takeover);

async fn late_holder_through_idem(backend: &str) {
    let Some(ledger) = ledger(backend, "reliability_fencing::late_holder_through_idem").await else { return };
    let rounds = scale(10, 200);
    let (mut b_stored, mut a_answers, mut violations) = (0, BTreeMap::new(), Vec::new());
    for round in 0..rounds {
        let paused: Arc<dyn Ledger> = Tapped::new(Arc::clone(&ledger), Paused);
        let replica_a = idem_tests::builder(paused).lease(std::time::Duration::from_millis(300)).build().unwrap();
        let replica_b = idem_tests::idem_shared(Arc::clone(&ledger));
        let caller = Caller::new(unique("rel-fence-tenant"), "agent");
        let arguments = json!({ "order_id": unique("order") });
        let (claimed_tx, claimed) = tokio::sync::oneshot::channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let a = {
            let (caller, arguments, release) = (caller.clone(), arguments.clone(), Arc::clone(&release));
            tokio::spawn(async move {
                replica_a
                    .call(&TAKEOVER, Some(&caller), &arguments, || async move {
                        claimed_tx.send(()).unwrap();
                        release.notified().await;
                        Ok::<_, RelError>("A".to_owned())
                    })
                    .await
            })
        };
        claimed.await.unwrap();
        // A's renewal timer fires, but its renewals never land: its lease lapses.
        tokio::time::sleep(std::time::Duration::from_millis(if round % 2 == 1 { 450 } else { 350 })).await;
        let b = replica_b.call(&TAKEOVER, Some(&caller), &arguments, || async { Ok::<_, RelError>("B".to_owned()) });
        let b = b.await;
        release.notify_one();
        let a = a.await.unwrap();
        let again =
            replica_b.call(&TAKEOVER, Some(&caller), &arguments, || async { Ok::<_, RelError>("C".to_owned()) });
        let again = again.await;
        let a_answer = match &a {
            Ok(served) => format!("Ok({:?}, replayed: {})", served.value, served.replayed),
            Err(error) => error.code().to_owned(),
        };
        *a_answers.entry(a_answer).or_insert(0usize) += 1;
        match (&b, &again, &a) {
            // The late holder's caller is answered with the operation's one recorded result.
            (Ok(b), Ok(again), Ok(a))
                if b.value == "B"
                    && !b.replayed
                    && again.value == "B"
                    && again.replayed
                    && a.value == "B"
                    && a.replayed =>
            {
                b_stored += 1;
            }
            _ => violations.push(format!("round {round}: B {b:?}, repeat {again:?}, A {a:?}")),
        }
    }
    support::print_table(
        &format!("fencing through Idem: a late holder after a takeover, {backend}"),
        &["backend", "rounds", "B's result stored and replayed", "what A's caller got", "violations"],
        &[vec![
            backend.to_owned(),
            rounds.to_string(),
            b_stored.to_string(),
            format!("{a_answers:?}"),
            violations.len().to_string(),
        ]],
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// A replica that is paused (a [`Tapped`] ledger): its lease renewals never reach the ledger
/// (they hang), everything else does.
struct Paused;

impl Tap for Paused {
    fn before(&self, call: Call) -> Pass {
        if call == Call::Renew { Pass::Hang } else { Pass::Through }
    }
}
