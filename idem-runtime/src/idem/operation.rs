//! What a handler sees while it runs: its [`Operation`] (the key to forward downstream and its
//! child keys, the fencing token, whether the lease is still held) and its caller, both
//! task-local. A handler runs as its caller, so operations nested in it are that caller's too.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::key::{Key, Ref};
#[cfg(feature = "_sea")]
use crate::ledger::LedgerError;
use crate::ledger::{Token, Won};
use crate::rejection::Rejection;
use crate::scope::Caller;

use super::Idem;
use super::request_state::Binding;

tokio::task_local! {
    static OPERATION: Operation;
    static CALLER: Caller;
    /// What this run of the handler sent through `ForwardKeyLayer` (see [`note_sent`]).
    #[cfg(feature = "http-tower")]
    static SENT: Sent;
}

/// The (origin, key) pairs one run of a handler sent, newest last: at most [`Sent::MAX`], so a
/// handler that sends many requests keeps a bounded record, dropped when the run ends.
#[cfg(feature = "http-tower")]
#[derive(Debug, Default)]
struct Sent(std::sync::Mutex<std::collections::VecDeque<(String, String)>>);

#[cfg(feature = "http-tower")]
impl Sent {
    /// How many pairs one run remembers (the oldest is forgotten first).
    const MAX: usize = 64;
}

/// The operation a handler is running as: read it with [`current_operation`] and forward
/// [`Operation::idempotency_key`] to the system that owns the side effect (an
/// `Idempotency-Key` header, a processor's reference field). Only that system can close the
/// window between the effect and the record.
#[derive(Debug, Clone)]
pub struct Operation {
    pub(super) key: Key,
    pub(super) tool: &'static str,
    pub(super) attempt: Won,
    pub(super) token: Token,
    /// When the operation's window ends; with the key, it names this operation downstream.
    pub(super) window_end: u64,
    /// The handle it runs under (its clock, limits and grace).
    pub(super) idem: Idem,
    /// What the renewer knows of the lease.
    pub(super) lease: Arc<LeaseState>,
    /// Set once the handler recorded the result in its own transaction.
    #[cfg_attr(
        not(feature = "_sea"),
        expect(dead_code, reason = "only `complete_in`, on a SQL backend, records in the handler's transaction")
    )]
    pub(super) recorded: Arc<AtomicBool>,
    /// What a `requestState` this operation sends is sealed to.
    #[cfg_attr(not(feature = "rmcp"), expect(dead_code, reason = "only rmcp tools ask for input"))]
    pub(super) binding: Arc<Binding>,
}

/// The lease as the renewer last saw it.
#[derive(Debug)]
pub(super) struct LeaseState {
    /// Until when the ledger confirmed the lease (ledger time).
    pub(super) until: AtomicU64,
    /// The ledger refused a renewal: the claim was taken over or settled by someone else.
    pub(super) fenced: AtomicBool,
}

impl Operation {
    /// The operation's key in the ledger — **never forward this**: it is the same in every
    /// window, so a downstream that dedupes on it would answer a new operation (after the window
    /// ended) with an old one's result. Forward [`Operation::idempotency_key`] instead. For
    /// operators and tests that look the record up ([`Ledger::lookup`](crate::ledger::Ledger::lookup)).
    #[must_use]
    pub const fn ledger_key(&self) -> &Key {
        &self.key
    }

    /// The key to forward to the system that owns the side effect (an `Idempotency-Key`
    /// header, a processor's reference field): 64 hex digits naming this operation in this
    /// window. A takeover of a dead holder's claim forwards the same value, so the downstream
    /// can dedupe it; a new operation after the window ended forwards a new one, so a
    /// downstream that keeps keys longer than the window does not replay an older operation.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        self.key.idempotency_key(self.window_end)
    }

    /// A child key: the key to forward on one of several requests this operation sends to one
    /// downstream — `operation.child("customer")` on the request that creates the customer,
    /// `operation.child("charge")` on the charge — so the downstream, which dedupes on the key
    /// it receives, acts on each of them once instead of answering the second with the first
    /// one's record. With the `http` feature, `idem_runtime::http::Child` names it on a tower
    /// client's request and `ForwardKeyLayer` sends it; `forwarded_child_key` is its header value.
    ///
    /// Derived, never stored: 64 lower-case hex digits,
    /// `hex(SHA-256("idem/v2/child\0" ‖ K ‖ len(label) as u64, big-endian ‖ label))`
    /// where `K` is [`Operation::idempotency_key`] as its 64 ASCII hex digits and `label` is
    /// UTF-8. So it is:
    /// - the same in every run of this operation — a takeover, a reconcile's second run, the
    ///   same operation re-run — since they share the idempotency key: the downstream answers a
    ///   second run's requests from its record;
    /// - distinct per label (its length is hashed before it, so the framing is unambiguous),
    ///   distinct from the idempotency key itself, and new in a new window;
    /// - safe to show: it reveals nothing the idempotency key (already shown in logs and by
    ///   `idem show`) does not, and an operator can recompute it from that key and the label.
    ///
    /// Use one label per request kind and keep labels fixed in code (`"charge"`, or
    /// `format!("refund-{line}")` for a line the arguments name): a label that changes between
    /// runs (a timestamp, a random id) defeats the downstream's dedupe.
    #[must_use]
    pub fn child(&self, label: &str) -> String {
        child_key(&self.idempotency_key(), label)
    }

    /// The short ref callers are given.
    #[must_use]
    pub fn reference(&self) -> Ref {
        self.key.reference()
    }

    /// The tool's name.
    #[must_use]
    pub const fn tool(&self) -> &'static str {
        self.tool
    }

    /// The fencing token this run holds the claim with.
    #[must_use]
    pub const fn token(&self) -> Token {
        self.token
    }

    /// When this operation's window ends (milliseconds since the Unix epoch, ledger time).
    #[must_use]
    pub const fn window_end(&self) -> u64 {
        self.window_end
    }

    /// Whether this run may no longer hold its claim: a renewal was refused (another replica
    /// took the operation over, or an operator settled it), or no renewal has been confirmed
    /// for the whole lease (the ledger is unreachable, or this process was paused). Ask before
    /// an effect that the downstream cannot dedupe: if it is `true`, return an error that says
    /// nothing happened instead of acting.
    #[must_use]
    pub fn lease_lost(&self) -> bool {
        self.lease.fenced.load(Ordering::SeqCst) || self.idem.ledger_now() >= self.lease.until.load(Ordering::SeqCst)
    }

    /// Stores `value` as this operation's result on `conn` — a transaction of the handler's own
    /// — so the handler's writes and the stored result commit or roll back together. The
    /// handler then returns `Ok(value)` as usual; if its transaction rolled back, idem records
    /// the returned result itself.
    ///
    /// ```no_run
    /// # use idem_runtime::{current_operation, ledger::LedgerError};
    /// # use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
    /// # async fn handler(db: &DatabaseConnection) -> Result<String, LedgerError> {
    /// let operation = current_operation().expect("inside an idempotent handler");
    /// let txn = db.begin().await?; // a `DbErr` converts into a `LedgerError`
    /// txn.execute_unprepared("INSERT INTO orders (id) VALUES ('o-1')").await.ok();
    /// let receipt = "order o-1 placed".to_owned();
    /// operation.complete_in(&txn, &receipt).await?;
    /// txn.commit().await?;
    /// Ok(receipt)
    /// # }
    /// ```
    ///
    /// # Errors
    /// The result cannot be serialised or exceeds the size limit, the claim was superseded
    /// ([`LedgerError::Fenced`]), or the statement failed.
    #[cfg(feature = "_sea")]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
    pub async fn complete_in<C, T>(&self, conn: &C, value: &T) -> Result<(), LedgerError>
    where
        C: sea_orm::ConnectionTrait,
        T: serde::Serialize,
    {
        let bytes =
            self.idem.results().encode::<T, ()>(Ok(value)).map_err(|error| LedgerError::corrupt(error.to_string()))?;
        let keep_until = self.idem.keep_until(self.idem.inner.settings.grace);
        let outcome = crate::ledger::Outcome::Completed(bytes);
        crate::ledger::sea::SeaOrmLedger::complete_on(conn, &self.key, self.token, outcome, keep_until).await?;
        self.recorded.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// What a `requestState` this operation sends is sealed to (multi-round-trip requests).
    #[cfg(feature = "rmcp")]
    pub(crate) fn binding(&self) -> &Binding {
        &self.binding
    }

    /// Notes that the handler running in this task sent `key` to `origin`: whether it had already
    /// sent that key there in this run (`None` outside a handler). The record is this run's alone
    /// and bounded ([`Sent::MAX`] pairs, the oldest forgotten first).
    #[cfg(feature = "http-tower")]
    pub(crate) fn note_sent(origin: &str, key: &str) -> Option<bool> {
        SENT.try_with(|sent| {
            let mut sent = sent.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if sent.iter().any(|(o, k)| o == origin && k == key) {
                return true;
            }
            if sent.len() == Sent::MAX {
                sent.pop_front();
            }
            sent.push_back((origin.to_owned(), key.to_owned()));
            false
        })
        .ok()
    }

    /// Whether this run took over a dead holder's claim: the downstream may already have seen
    /// this operation's idempotency key, and must dedupe by it.
    #[must_use]
    pub fn is_takeover(&self) -> bool {
        self.attempt != Won::Fresh
    }
}

/// The operation the current handler runs as, or `None` outside an idempotent handler.
///
/// Task-local: a task the handler spawns does not inherit it; pass the key along instead.
#[must_use]
pub fn current_operation() -> Option<Operation> {
    OPERATION.try_with(Clone::clone).ok()
}

/// The child key of `parent` (an idempotency key as forwarded) for `label`: see
/// [`Operation::child`].
fn child_key(parent: &str, label: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"idem/v2/child\0");
    hasher.update(parent.as_bytes());
    hasher.update((label.len() as u64).to_be_bytes());
    hasher.update(label.as_bytes());
    crate::bytes::hex(&hasher.finalize())
}

/// Runs `future` with `caller` as the authenticated caller of every idempotent call inside it
/// that is not given one explicitly. Transports (your middleware) call this; every idempotent
/// handler runs this way as its own caller, so operations nested in it are its caller's.
pub async fn run_as<F: Future>(caller: Caller, future: F) -> F::Output {
    CALLER.scope(caller, future).await
}

/// The caller in scope: the caller of the idempotent handler running now (nested operations and
/// anything else the handler calls act for it), or the one given to [`run_as`].
#[must_use]
pub fn current_caller() -> Option<Caller> {
    CALLER.try_with(Clone::clone).ok()
}

/// `future` run as `operation` of `caller`: both in scope for everything it calls.
pub(super) fn running_as<F: Future>(
    operation: Operation,
    caller: Caller,
    future: F,
) -> impl Future<Output = F::Output> {
    #[cfg(feature = "http-tower")]
    let future = SENT.scope(Sent::default(), future);
    CALLER.scope(caller, OPERATION.scope(operation, future))
}

/// `future` run with `caller` in scope, as a reconcile function runs.
pub(super) fn acting_for<F: Future>(caller: Caller, future: F) -> impl Future<Output = F::Output> {
    CALLER.scope(caller, future)
}

/// The caller of a call: the one given, else (with `fallback`) the one in scope ([`run_as`], an
/// outer idempotent handler's), else the handle's local identity; none: refused.
pub(super) fn caller_of<'c>(
    idem: &Idem,
    caller: Option<&'c Caller>,
    fallback: bool,
) -> Result<Cow<'c, Caller>, Rejection> {
    match caller {
        Some(caller) => Ok(Cow::Borrowed(caller)),
        None if !fallback => Err(Rejection::NoCaller),
        None => current_caller()
            .or_else(|| idem.inner.settings.local_caller.clone())
            .map(Cow::Owned)
            .ok_or(Rejection::NoCaller),
    }
}
