//! The ledger: one record per operation, claimed atomically before the side effect.
//!
//! | state | reached by | a repeat call gets |
//! |---|---|---|
//! | absent / expired | — | a new claim: the handler runs |
//! | [`State::InProgress`] | a won claim (lease + fencing token) | "in flight" at once, no waiting |
//! | [`State::Completed`] | the handler's stored result | the stored bytes, as a replay |
//! | [`State::Failed`] | an error that guarantees nothing happened | a new claim |
//! | [`State::Unknown`] | an error whose outcome cannot be known, or a stale lease under `hold` | "outcome unknown" |
//!
//! Every backend implements [`Ledger::claim`] as one atomic step under a unique key — never a
//! read followed by an unconditional write — and refuses a completion from anyone but the
//! current holder.
//!
//! Times: a record's `window_end` ends the operation (a repeat after it is a new operation);
//! its `expires_at` ends the record (the sweep may delete it). A completed record lives until
//! its window ends or a grace after it settled, whichever is later; a failed one until its window
//! ends; an unsettled one (in progress under a dead holder, or unknown) until its window ends
//! plus a long unsettled retention. Once the window of an unsettled record has ended, a claim
//! starts a new operation and keeps the old record aside (superseded) for the operator.
//!
//! Re-sends: a claim whose answer was lost may be sent again with the same token; the ledger
//! answers it with how the first send won ([`Claim::Won`]'s `attempt` and the operation's
//! `window_end`), so a takeover stays a takeover. [`Ledger::release`] undoes a claim whose answer
//! never came, and only what that claim did.

mod catalogue;
mod claim;
mod error;
mod judge;
mod label;
mod layer;
pub mod memory;
mod open;
mod records;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod report;
#[cfg(feature = "_sea")]
// `_sea` is internal: name the features a user turns on.
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
pub mod sea;
mod timeout;

use std::future::Future;
use std::pin::Pin;

use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::secret::{Secret, SecretError};

pub use self::catalogue::Catalogue;
pub(crate) use self::catalogue::{Clash, Declaration, Handler, RECHECK};
pub use self::claim::{Claim, ClaimRequest, Outcome, Resolution, State, Token, Won};
pub use self::error::{ErrorSource, LedgerError};
pub(crate) use self::judge::{RecordView, Verdict, held, lease_lapsed, settled_expiry, superseded, won_stale};
pub use self::label::Label;
pub(crate) use self::label::{open as open_label, seal_remembered as seal_label};
pub use self::layer::{Layer, Verb};
pub use self::open::{connect, from_env, is_redis_url};
pub use self::report::{LedgerStats, PendingQuery, PendingRecord, StatusReport, ToolOwner};
pub(crate) use self::timeout::Timeout;

/// The environment variable naming the ledger: a SQL URL, a SQLite file's path, or a Redis URL.
pub const DATABASE_URL_ENV: &str = "IDEM_DATABASE_URL";

/// A boxed, sendable future: keeps [`Ledger`] object-safe so `Arc<dyn Ledger>` can be chosen at
/// run time (by URL).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where idempotency records live.
///
/// Implementations must make [`claim`](Ledger::claim) one atomic step (a single statement under a
/// unique constraint, a compare-and-set on the record read, or a lock held across the decision)
/// and must refuse [`complete`](Ledger::complete), [`renew`](Ledger::renew) and
/// [`release`](Ledger::release) from anyone but the current token holder. The
/// `ledger_conformance` tests hold every implementation to the same behaviour.
///
/// # Time
///
/// Every time a ledger is given or returns is a `u64` count of milliseconds since the Unix
/// epoch **on the ledger's clock** ([`Ledger::now`]: the database server's), never a
/// `SystemTime`. Ledger time exists so that leases and windows do not depend on each replica's
/// clock, and a `SystemTime` would invite exactly the mistake it avoids: reading the local clock.
/// An integer is also what the SQL backends store (a `BIGINT`, compared and shifted in the
/// statement itself), and what the simulation and the model check step. Durations are added
/// before the call (`now + lease`), so a backend only compares.
pub trait Ledger: Send + Sync + 'static {
    /// Claims `request.key`, or reports the record that stands in the way. See [`Claim`].
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Extends a held lease to `lease_until`.
    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Ends a held claim with `outcome`. The holder is `token` while the record is in progress —
    /// or unknown, when a `hold` policy flipped a late holder's lapsed lease: its result is then
    /// still recorded (an operator's verdict is never overwritten). A completed result is kept
    /// at least until `keep_until`, even past its window. [`LedgerError::Fenced`] if `token` no
    /// longer holds it.
    ///
    /// A holder whose unknown record was superseded by a newer operation after its window
    /// ended records its outcome on the superseded record (kept for the operator).
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Undoes a claim that runs nothing (its answer was lost, or it yielded to an operation
    /// found under a previous secret), and only what that claim did: a fresh claim is removed —
    /// nothing ran, and nothing is left that an operator or a status reader would take for an
    /// outcome; also if `hold` has meanwhile turned its lapsed lease "unknown", since only its
    /// own handler, which never ran, could have acted — and a takeover goes back to an
    /// in-progress record under a lapsed lease, so the tool's stale policy still applies to the
    /// operation.
    /// [`LedgerError::Fenced`] if `token` holds no in-progress claim (it never committed, or was
    /// superseded): there is nothing to undo.
    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The record of `key`, by its full key, if it is not expired at `now`.
    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// The operation `reference` of `tenant`, if any, that `subject` may see: its own, or one
    /// of its tenant's made tenant-wide ([`SubjectTag::TENANT`]). Never another tenant's or
    /// another subject's. The current record of its key, or else the newest superseded one.
    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// Settles the operation at `address` of `tenant` — the current record of its key if its
    /// window ends there, else the superseded one that does; never another operation of the same
    /// key — if it is unknown, or in progress under a lease that has expired. A completed verdict
    /// is kept at least until `keep_until`. [`LedgerError::NotFound`] if no operation of the
    /// tenant has that address.
    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The operation `reference` of `tenant`, whoever its subject — the operator's lookup, who
    /// knows the tenant but not necessarily the subject. Never another tenant's. With a
    /// `window_end`, the operation at that [`Address`] (current or superseded) or none; without,
    /// the current record of its key if it is not expired at `now`, or else the newest
    /// superseded one.
    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>>;

    /// How many records the ledger holds, by state, as of `now`: see [`LedgerStats`]. Counts
    /// every record, expired or not (the sweep has not deleted them yet).
    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>>;

    /// The unsettled records `query` asks for, as of `now`: oldest first (by `created_at`,
    /// then key), at most `query.limit`. What `idem pending` lists.
    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>>;

    /// Whether the ledger keeps the sealed [`Label`] a claim carries, so a handle seals one
    /// per claim only for a ledger that keeps it. The ledgers of this crate do (an operator's
    /// verdict is checked against the shape of the tool its label names); the default does not,
    /// and a claim's label is then `None`.
    fn keeps_labels(&self) -> bool {
        false
    }

    /// Whether the ledger answers in this process without a round trip (the memory ledger).
    /// A handle coalesces identical concurrent claims only on a ledger that is not local, where
    /// each would cost a statement (and, on SQLite, a turn at the writer's lock).
    fn local(&self) -> bool {
        false
    }

    /// The [`Catalogue`] of who serves which operation over this ledger in this process, which
    /// every handle over the ledger shares: a second handler of one operation on another handle
    /// is refused at once. The ledgers of this crate keep one (clones of a ledger share it); the
    /// default keeps none, and each handle then keeps its own and learns of another handle's
    /// handlers from [`Ledger::tool_owners`], as another process does.
    fn catalogue(&self) -> Option<&Catalogue> {
        None
    }

    /// Deletes at most `limit` records whose retention ended by `now` — settled records past
    /// their window (or grace), unsettled ones past their unsettled retention, never a record
    /// under a live lease — returning how many. Call it repeatedly until it returns less than
    /// `limit`.
    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>>;

    /// The ledger's own clock, in milliseconds since the Unix epoch, or `None` if it keeps
    /// none. Replicas measure their skew against it and state every time on it, so leases and
    /// windows do not depend on every replica's clock agreeing.
    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>>;

    /// The check value the ledger keeps for secret `version` ([`Secret::check_value`]), if
    /// any — keeping `check` first when it keeps none and `check` is given, atomically, so the
    /// first replica to use a version sets it and every other compares against it. A reader
    /// (the operator's CLI) passes `None` and keeps nothing.
    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>>;

    /// The secret versions whose operations may still be repeated, each with the time until
    /// which they may be (ledger time) — keeping first, when `live` is given as
    /// `(version, until)`, that operations keyed under `version` may be repeated until `until`
    /// (the later of it and the time kept wins, atomically; for a version whose check value
    /// [`Ledger::secret_check`] keeps). A serving handle keeps its current version's time ahead
    /// of every record it may make; a handle that honours a version of this list neither as its
    /// secret nor as a previous one refuses to serve while that version's time is ahead
    /// ([`SecretError::Rekeying`]): its repeats would run again. A version whose time was never
    /// kept is listed with 0, or not at all.
    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>>;

    /// Records that the handler `owner` serves `tool` in `namespace`, seen at `now` (keeping the
    /// later time if it was seen before), and returns every owner recorded for that tool seen
    /// at or after `since` — this one included — in order. Two owners mean two different
    /// handlers answer to one tool name on this ledger, and would share operations: a handle
    /// refuses both ([`Rejection::DuplicateTool`](crate::Rejection::DuplicateTool)).
    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>>;

    /// Keeps what operators are shown of `tool` in `namespace` — its facts (JSON: the result's
    /// shape, the stale policy), written by the handles that serve it at its first call — as
    /// seen at `now`: a later write replaces an earlier one (a new build's facts win), an
    /// earlier one changes nothing. The default keeps none: verdicts on such a ledger are not
    /// checked against the result's shape.
    fn keep_tool_facts<'a>(
        &'a self,
        _namespace: &'a str,
        _tool: &'a str,
        _facts: &'a str,
        _now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async { Ok(()) })
    }

    /// The facts kept for `tool` in `namespace` ([`Ledger::keep_tool_facts`]), if any.
    fn tool_facts<'a>(
        &'a self,
        _namespace: &'a str,
        _tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        Box::pin(async { Ok(None) })
    }

    /// The secret a handle on this ledger keys with when none is configured (in code or in
    /// `IDEM_SECRET`). The default refuses: a ledger that replicas share needs one secret given
    /// to all of them. [`MemoryLedger`](memory::MemoryLedger) uses a random secret per process
    /// (it forgets everything on restart anyway); the SQLite default keeps one beside its file.
    ///
    /// # Errors
    /// No secret can be had without configuration.
    fn default_secret(&self) -> Result<Secret, SecretError> {
        Err(SecretError::Required { ledger: "this ledger (it names no default secret)".to_owned() })
    }
}
