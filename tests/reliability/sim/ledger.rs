//! The simulated ledger: the real one (memory, or SQLite in a file) behind a wrapper that is the
//! scheduler's await point. Every ledger call a replica makes passes through [`SimLedger`], which
//! asks the seeded world what happens to it — delivered, delayed, refused, committed with its
//! answer lost, or sent and never committed — and, after the real ledger answered, lets the world
//! compare the answer with what it knows (the invariants in `world.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use idem_runtime::ledger::{BoxFuture, Claim, ClaimRequest, Outcome, PendingQuery, PendingRecord, Resolution, Token};
use idem_runtime::{
    Key, Ref, clock::Clock, ledger::Ledger, ledger::LedgerError, ledger::LedgerStats, ledger::StatusReport,
    scope::SubjectTag, scope::TenantTag,
};

use super::world::{Fault, Kind, Sim};

/// The ledger's own clock (a database server's): the true simulated time, published by the
/// wrapper right before each call reaches the real ledger, so a ledger running on another thread
/// (SQLite's) reads the same time the simulation is at.
#[derive(Clone, Debug, Default)]
pub struct LedgerClock(pub Arc<AtomicU64>);

impl Clock for LedgerClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How calls reach the real ledger.
pub enum Backend {
    /// The memory ledger answers synchronously: its futures are ready on their first poll.
    Memory,
    /// SQLite runs on a runtime of its own (sqlx's worker thread and pool); the simulation's
    /// thread blocks until the statement is answered, so no simulated time passes meanwhile and
    /// the order of statements is the order the seed chose.
    Sqlite(tokio::runtime::Handle),
}

/// The real ledger, reached without faults: by the wrapper, and by the world's own reads.
pub struct Store {
    pub inner: Arc<dyn Ledger>,
    pub backend: Backend,
    pub clock: LedgerClock,
}

impl Store {
    /// Runs one call on the real ledger at true time `now`, to its end.
    pub fn run<T: Send + 'static>(&self, now: u64, make: impl FnOnce(Arc<dyn Ledger>) -> BoxFuture<'static, T>) -> T {
        self.clock.0.store(now, Ordering::SeqCst);
        let mut future = make(Arc::clone(&self.inner));
        match &self.backend {
            Backend::Memory => match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(value) => value,
                Poll::Pending => panic!("the memory ledger's futures are ready on their first poll"),
            },
            Backend::Sqlite(handle) => {
                let (tx, rx) = std::sync::mpsc::channel();
                handle.spawn(async move {
                    let _ = tx.send(future.await);
                });
                rx.recv().expect("the SQLite runtime answers every statement")
            }
        }
    }

    /// The current record of `key` at `now`, as the ledger reports it (no faults).
    pub fn lookup(&self, key: Key, now: u64) -> Option<StatusReport> {
        self.run(now, move |l| Box::pin(async move { l.lookup(&key, now).await.ok().flatten() }))
    }
}

/// One replica incarnation's view of the ledger. When the replica crashes, `alive` goes false:
/// its background work (renewals, completion retries, releases) reaches nothing any more.
pub struct SimLedger {
    pub sim: Sim,
    pub replica: usize,
    pub alive: Arc<AtomicBool>,
    /// Whether this replica has read the ledger's clock once. Faults may hit its first read too
    /// (a replica then refuses calls until it has read the clock: simulation finding 1, fixed);
    /// `IDEM_SIM_SPARE_FIRST_CLOCK_READ` spares the first read, as the harness did before.
    pub measured: AtomicBool,
}

impl SimLedger {
    fn crashed(&self) -> bool {
        !self.alive.load(Ordering::SeqCst)
    }

    /// The await point: the world decides what happens to this call; `exec` makes it on the real
    /// ledger and checks the answer.
    async fn call<T: Send + 'static>(
        &self,
        kind: Kind,
        exec: impl FnOnce(&Sim, u64) -> Result<T, LedgerError> + Send,
    ) -> Result<T, LedgerError> {
        let unavailable = |detail: &str| Err(LedgerError::unavailable(detail));
        if self.crashed() {
            return unavailable("the replica crashed");
        }
        let plan = self.sim.plan(kind, self.replica, self.measured.load(Ordering::SeqCst));
        if plan.before > 0 {
            tokio::time::sleep(Duration::from_millis(plan.before)).await;
        }
        if self.crashed() {
            return unavailable("the replica crashed");
        }
        let spared =
            kind == Kind::Now && !self.measured.load(Ordering::SeqCst) && !self.sim.world().refuse_first_clock_read;
        if !spared && self.sim.in_outage() {
            return unavailable("ledger outage");
        }
        let answer = match plan.fault {
            Fault::Refuse => return unavailable("connection refused"),
            Fault::LoseBeforeCommit => None,
            Fault::Deliver | Fault::LoseAfterCommit => Some(exec(&self.sim, self.sim.now())),
        };
        if plan.after > 0 {
            tokio::time::sleep(Duration::from_millis(plan.after)).await;
        }
        match (plan.fault, answer) {
            (Fault::Deliver, Some(answer)) if !self.crashed() => {
                if kind == Kind::Now && answer.is_ok() {
                    self.measured.store(true, Ordering::SeqCst);
                }
                answer
            }
            _ => Err(LedgerError::ambiguous("connection reset")),
        }
    }
}

impl Ledger for SimLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        let request = request.clone();
        Box::pin(self.call(Kind::Claim, move |sim, now| sim.claim(now, request)))
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        let key = *key;
        Box::pin(self.call(Kind::Renew, move |sim, now| sim.renew(now, key, token, lease_until)))
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let key = *key;
        Box::pin(self.call(Kind::Complete, move |sim, now| sim.complete(now, key, token, outcome, keep_until)))
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        let key = *key;
        Box::pin(self.call(Kind::Release, move |sim, now| sim.release(now, key, token)))
    }

    fn lookup<'a>(&'a self, key: &'a Key, at: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let key = *key;
        Box::pin(self.call(Kind::Read, move |sim, now| sim.read_lookup(now, key, at)))
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        at: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(self.call(Kind::Read, move |sim, now| {
            sim.store().run(now, move |l| Box::pin(async move { l.status(tenant, subject, reference, at).await }))
        }))
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: idem_runtime::key::Address,
        resolution: Resolution,
        at: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(
            self.call(Kind::Resolve, move |sim, now| sim.resolve(now, tenant, address, resolution, at, keep_until)),
        )
    }

    fn sweep(&self, at: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(self.call(Kind::Sweep, move |sim, now| {
            sim.store().run(now, move |l| Box::pin(async move { l.sweep(at, limit).await }))
        }))
    }

    /// Outside the fault plan: the simulation is of calls, and a handle checks its secret once.
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        let check = check.copied();
        let answer = self
            .sim
            .store()
            .run(self.sim.now(), move |l| Box::pin(async move { l.secret_check(version, check.as_ref()).await }));
        Box::pin(async move { answer })
    }

    /// Outside the fault plan, as the secret's check is.
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        let answer =
            self.sim.store().run(self.sim.now(), move |l| Box::pin(async move { l.secret_versions(live).await }));
        Box::pin(async move { answer })
    }

    /// The operator's reads, outside the fault plan: the simulation is of calls.
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        let answer = self
            .sim
            .store()
            .run(self.sim.now(), move |l| Box::pin(async move { l.inspect(tenant, reference, window_end, now).await }));
        Box::pin(async move { answer })
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        let answer = self.sim.store().run(self.sim.now(), move |l| Box::pin(async move { l.stats(now).await }));
        Box::pin(async move { answer })
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        let query = query.clone();
        let answer =
            self.sim.store().run(self.sim.now(), move |l| Box::pin(async move { l.pending(&query, now).await }));
        Box::pin(async move { answer })
    }

    /// Outside the fault plan too: a handle asks once per tool (and once a minute after).
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        let (namespace, tool, owner) = (namespace.to_owned(), tool.to_owned(), owner.to_owned());
        let answer = self.sim.store().run(self.sim.now(), move |l| {
            Box::pin(async move { l.tool_owners(&namespace, &tool, &owner, now, since).await })
        });
        Box::pin(async move { answer })
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        Box::pin(
            self.call(Kind::Now, move |sim, now| sim.store().run(now, move |l| Box::pin(async move { l.now().await }))),
        )
    }
}
