//! A ledger that forwards every call to another, through a test's [`Tap`]: what the waiting,
//! sweeping and fencing tests and the benchmark count, fail or hang, written once — as a
//! [`Layer`], so the runtime forwards the ledger's methods and this file only gates them.

use std::sync::Arc;

use idem_runtime::ledger::{BoxFuture, Layer, Ledger, LedgerError};

/// Which ledger method a [`Tap`] sees: the runtime's own list of them.
pub use idem_runtime::ledger::Verb as Call;

/// What a [`Tap`] does with one call.
pub enum Pass {
    /// To the ledger beneath.
    Through,
    /// Refused with this error; the ledger beneath never sees it.
    Fail(LedgerError),
    /// Never answered (a paused replica, a cut connection).
    Hang,
    /// To the ledger beneath after this pause (a slow statement).
    After(std::time::Duration),
    /// To the ledger beneath, whose answer is then lost: the call fails with this error although
    /// the statement took effect (a connection cut after the commit).
    Lost(LedgerError),
}

/// A test's view of the calls a handle makes to its ledger.
pub trait Tap: Send + Sync + 'static {
    /// Before the call is made (when the method is called, as a ledger's own work starts).
    fn before(&self, _call: Call) -> Pass {
        Pass::Through
    }

    /// Once the ledger beneath has answered a call that went through.
    fn after(&self, _call: Call) {}

    /// Milliseconds added to the time [`Ledger::now`] answers (a server with another clock: a
    /// standby promoted in a failover).
    fn clock_shift(&self) -> i64 {
        0
    }
}

/// `inner`, every call through `tap`; everything else (`local`, `keeps_labels`, the default
/// secret) is `inner`'s. Dereferences to the tap, for its counters.
pub struct Tapped<T> {
    /// The ledger beneath.
    pub inner: Arc<dyn Ledger>,
    /// What the test sees and decides.
    pub tap: T,
}

impl<T: Tap> Tapped<T> {
    /// `inner` through `tap`.
    pub fn new(inner: Arc<dyn Ledger>, tap: T) -> Arc<Self> {
        Arc::new(Self { inner, tap })
    }

    fn gate<'a, R: Send + 'a>(
        &'a self,
        call: Call,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>> {
        match self.tap.before(call) {
            Pass::Through => {
                let answer = send();
                Box::pin(async move {
                    let answer = answer.await;
                    self.tap.after(call);
                    answer
                })
            }
            Pass::Fail(error) => Box::pin(async move { Err(error) }),
            Pass::Hang => Box::pin(std::future::pending()),
            Pass::After(pause) => Box::pin(async move {
                tokio::time::sleep(pause).await;
                let answer = send().await;
                self.tap.after(call);
                answer
            }),
            Pass::Lost(error) => Box::pin(async move {
                let _ = send().await;
                self.tap.after(call);
                Err(error)
            }),
        }
    }
}

impl<T> std::ops::Deref for Tapped<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.tap
    }
}

/// The runtime forwards every [`Ledger`] method through [`Layer::pass`]: here, the tap's gate.
impl<T: Tap> Layer for Tapped<T> {
    type Inner = dyn Ledger;

    fn inner(&self) -> &dyn Ledger {
        &*self.inner
    }

    fn pass<'a, R: Send + 'a>(
        &'a self,
        verb: Call,
        send: impl FnOnce() -> BoxFuture<'a, Result<R, LedgerError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<R, LedgerError>> {
        self.gate(verb, send)
    }

    fn now_seen(&self, now: Option<u64>) -> Option<u64> {
        now.map(|now| now.saturating_add_signed(self.tap.clock_shift()))
    }
}
