//! The operator's verbs as one family on [`Admin`] ([`Idem::admin`]): `inspect`, `resolve` (a
//! verdict on an operation whose outcome is unknown), `stats`, `sweep`; the startup checks
//! (`check_secret`, `register`), the raw access (`ledger`, `namespace`, the clocks), `key_of`,
//! `pending` and `spawn_sweeper` — every method of `Admin` is here; the types and the work
//! behind the last two are in `pending.rs` and `sweeper.rs`.
//! Inspection and verdicts look under every secret still honoured, so a rotation hides nothing;
//! verdicts and the sweep act on time, so only on a settled clock.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::key::{Address, Key, Ref, TenantTag};
use crate::ledger::{
    Label, Ledger, LedgerError, LedgerStats, PendingQuery, Resolution, State, StatusReport, lease_lapsed, open_label,
};
use crate::recipe::Recipe;
use crate::rejection::Rejection;
use crate::scope::Caller;
use crate::secret::SecretError;

use super::arguments::{CallArguments, scope_of};
use super::facts::ToolFacts;
use super::keyring::{Check, no_secret};
use super::pending::{PendingCursor, PendingFilter, PendingOperation, PendingPage};
use super::status_error::StatusError;
use super::sweeper::{self, Sweeper};
use super::time::{clamp, millis};
use super::{Idem, StoredValue};

/// The operator's verbs: look at an operation, settle one whose outcome is unknown, count,
/// list what is unsettled, sweep — what the `idem` command runs — and a server's startup checks
/// ([`Admin::check_secret`], [`Admin::register`]). They cross callers (an operator
/// knows the tenant, not necessarily the subject): never expose them to callers, who see only
/// their own operations through [`Idem::status`]. Made by [`Idem::admin`].
#[derive(Clone, Copy, Debug)]
pub struct Admin<'a> {
    pub(super) idem: &'a Idem,
}

impl Admin<'_> {
    /// The operator's view of an operation of `tenant`, whoever its subject: what the
    /// `idem show` command prints. Never another tenant's. `operation` is its address
    /// (`<ref>@<window end>`), or a ref alone for the current operation of its key (else the
    /// newest superseded one).
    ///
    /// # Errors
    /// A malformed ref or address, no usable secret, or the ledger's failure.
    pub async fn inspect(self, tenant: &str, operation: &str) -> Result<Option<StatusReport>, StatusError> {
        let (reference, window_end) = match operation.parse::<Address>() {
            Ok(address) => (address.reference, Some(address.window_end)),
            Err(_) if !operation.contains('@') => (Ref::parse(operation)?, None),
            Err(error) => return Err(error.into()),
        };
        let keyring = self.idem.keyring(Check::Compare).await?;
        let (now, _) = self.idem.ledger_time().await?;
        for secret in keyring.all() {
            let report =
                self.idem.inner.ledger.inspect(TenantTag::of(secret, tenant), reference, window_end, now).await?;
            if let Some(mut report) = report {
                report.result =
                    report.result.and_then(|stored| self.idem.results().open(stored, report.reference).ok());
                return Ok(Some(report));
            }
        }
        Ok(None)
    }

    /// Settles an unknown (or dead-holder) operation of `tenant`, named by its address
    /// (`<ref>@<window end>`, [`StatusReport::address`]): the operator's way out of "outcome
    /// unknown", what the `idem resolve` command does. The verdict lands on that operation only —
    /// never on a newer one of the same key. It stays readable (and a completed one replayable)
    /// for the verdict retention at least.
    ///
    /// A "completed" verdict must fit the tool's result shape, when its handles declared one
    /// ([`Admin::about`]; an HTTP route's is its stored response): one that does not is refused
    /// before anything is stored ([`StatusError::Misfit`], [`ToolFacts::check`]). A completed
    /// operation whose stored result no repeat could read ([`ToolFacts::readable`]: an earlier
    /// verdict, stored before the shape was known) has answered no repeat — each was refused as
    /// unreadable — so a fitting "completed" verdict replaces it, on the condition that the
    /// ledger still holds those bytes ([`Resolution::Replace`]). A result a repeat could read is
    /// never replaced.
    ///
    /// # Errors
    /// A malformed address (a ref alone included), no operation at that address, one that
    /// is not unknown, or a verdict that does not fit.
    pub async fn resolve(self, tenant: &str, address: &str, resolution: Resolution) -> Result<(), StatusError> {
        let address: Address = address.parse()?;
        let keyring = self.idem.keyring(Check::Compare).await?;
        // A resolve acts on time (is the holder's lease over?): only on a settled clock.
        let now = self.idem.trusted_time().await?;
        let keep_until = clamp(now.saturating_add(millis(self.idem.inner.settings.verdict_retention)));
        let results = self.idem.results();
        let mut answer = Err(LedgerError::NotFound);
        for secret in keyring.all() {
            let tenant = TenantTag::of(secret, tenant);
            let ledger = &self.idem.inner.ledger;
            let Some(report) = ledger.inspect(tenant, address.reference, Some(address.window_end), now).await? else {
                continue;
            };
            let resolution = match &resolution {
                Resolution::Completed(plain) => {
                    let about = self.about(&report).await;
                    if let (Some(facts), Some(label)) = (&about.facts, &about.label) {
                        let misfit = |reason| StatusError::Misfit {
                            tool: label.tool.clone(),
                            reason,
                            expected: facts.expected_shape().unwrap_or_default(),
                        };
                        facts.check(&StoredValue::ok(plain).unwrap_or_default()).map_err(misfit)?;
                    }
                    let sealed =
                        results.seal(plain.clone()).map_err(|error| LedgerError::corrupt(error.to_string()))?;
                    match (&report.state, &report.result, &about.facts) {
                        // A completed operation whose result no repeat could read: replaced.
                        (State::Completed, Some(stored), Some(facts))
                            if results
                                .open(stored.clone(), report.reference)
                                .ok()
                                .and_then(|plain| StoredValue::ok(&plain))
                                .is_some_and(|value| facts.readable(&value).is_err()) =>
                        {
                            Resolution::Replace { unreadable: stored.clone(), result: sealed }
                        }
                        _ => Resolution::Completed(sealed),
                    }
                }
                other => other.clone(),
            };
            answer = ledger.resolve(tenant, address, resolution, now, keep_until).await;
            break;
        }
        Ok(answer?)
    }

    /// Who and what an operation was — its tool, tenant, subject and namespace, opened from its
    /// sealed label — and what the ledger keeps of its tool ([`ToolFacts`]: the result's shape,
    /// the stale policy). Either is `None` where the ledger keeps none (a ledger of another
    /// crate may keep no labels; a tool's facts are kept from its first call by a handle of this
    /// version).
    pub async fn about(self, report: &StatusReport) -> About {
        let mut about = About::default();
        let Ok(keyring) = self.idem.keyring(Check::Compare).await else { return about };
        about.label = report.label.as_deref().and_then(|sealed| open_label(keyring.all(), sealed));
        if let Some(label) = &about.label {
            let settings = &self.idem.inner.settings;
            let namespace = label
                .namespace
                .as_deref()
                .or(settings.namespace.as_deref())
                .unwrap_or(super::settings::DEFAULT_NAMESPACE);
            // A ledger made before tools' facts were kept has no such table: no facts.
            let kept = self.idem.inner.ledger.tool_facts(namespace, &label.tool).await;
            about.facts = kept.ok().flatten().as_deref().and_then(ToolFacts::from_json);
        }
        about
    }

    /// How many records the ledger holds, by state (see [`LedgerStats`]): what the
    /// `idem stats` command prints.
    ///
    /// # Errors
    /// The ledger's failure.
    pub async fn stats(self) -> Result<LedgerStats, LedgerError> {
        let (now, _) = self.idem.ledger_time().await?;
        self.idem.inner.ledger.stats(now).await
    }

    /// Deletes expired records, `batch` at a time (a `batch` of 0 counts as 1), until none are
    /// left; returns how many. To sweep on a schedule, on every replica, see
    /// [`Admin::spawn_sweeper`].
    ///
    /// # Errors
    /// The ledger's failure; records deleted before it stay deleted.
    pub async fn sweep(self, batch: usize) -> Result<usize, LedgerError> {
        self.sweep_with(batch, |_| {}).await
    }

    /// [`Admin::sweep`], calling `progress` with the running total after every batch — for a
    /// progress indicator on a long sweep (`idem sweep` shows one on a terminal).
    ///
    /// # Errors
    /// The ledger's failure; records deleted before it stay deleted.
    pub async fn sweep_with(self, batch: usize, mut progress: impl FnMut(usize) + Send) -> Result<usize, LedgerError> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            let swept = self.sweep_batch(batch).await?;
            total += swept;
            progress(total);
            if swept < batch {
                tracing::debug!(swept = total, "sweep done");
                return Ok(total);
            }
        }
    }

    /// Deletes at most `batch` expired records, on a settled clock and within the ledger timeout.
    pub(super) async fn sweep_batch(self, batch: usize) -> Result<usize, LedgerError> {
        // A sweep deletes by time: only on a settled clock.
        let now = self.idem.trusted_time().await?;
        self.idem.inner.ledger.sweep(now, batch).await
    }
}

/// A server's startup checks, and the raw access operators and tests reach for.
impl<'a> Admin<'a> {
    /// Whether this handle has a secret to key operations with, and whether it is the one the
    /// ledger has seen under its version; call it at startup
    /// (`idem.admin().check_secret().await?`) so a missing, malformed or mismatched secret stops
    /// the server instead of refusing every call. The first replica to use a version keeps its
    /// check value in the ledger; every other compares with it.
    ///
    /// # Errors
    /// No secret is configured and the ledger has no default (PostgreSQL, MySQL), or a
    /// configured one is malformed, or the SQLite default's secret file cannot be used, or its
    /// bytes differ from those the ledger has seen under its version
    /// ([`SecretError::Mismatch`]), or the ledger did not answer ([`SecretError::Unchecked`]).
    pub async fn check_secret(self) -> Result<(), SecretError> {
        self.idem.keyring(Check::Keep).await.map(|_| ())
    }

    /// Declares `recipe`'s handler in the catalogue of this handle's ledger, refusing a
    /// different handler (another owner, or a recipe declared elsewhere) with the same tool name
    /// in the same namespace: the two would share keys. Once two are seen, both are refused from
    /// then on, whichever came first — on every handle over a ledger that keeps a catalogue (the
    /// ledgers of this crate do; see [`Ledger::catalogue`]). Every call declares its handler as
    /// soon as its arguments are read, before its secret, caller or claim; call this at startup
    /// to find a clash before the first call does.
    ///
    /// # Errors
    /// [`Rejection::DuplicateTool`], naming both places.
    pub fn register(self, recipe: &Recipe) -> Result<(), Rejection> {
        let refusal = |clash| super::owners::refusal(self.idem.namespace(recipe), recipe.tool(), clash);
        self.idem.declare(recipe, None, None).map(drop).map_err(refusal)
    }

    /// The namespace `recipe`'s keys are derived in: the handle's
    /// ([`Builder::namespace`](super::Builder::namespace)), else the recipe's, else the default.
    #[must_use]
    pub fn namespace(self, recipe: &'a Recipe) -> &'a str {
        self.idem.namespace(recipe)
    }

    /// The ledger, wrapped in the handle's ledger timeout: raw access, past every check a call
    /// makes.
    #[must_use]
    pub fn ledger(self) -> &'a Arc<dyn Ledger> {
        self.idem.ledger()
    }

    /// Now, by this handle's clock.
    #[must_use]
    pub fn now_ms(self) -> u64 {
        self.idem.now_ms()
    }

    /// Now on the ledger's clock, as last measured (this handle's clock corrected by the
    /// measured skew; uncorrected before the first measurement).
    #[must_use]
    pub fn ledger_now(self) -> u64 {
        self.idem.ledger_now()
    }
}

impl Admin<'_> {
    /// The key a call of `recipe` by `caller` with `arguments` (as given to [`Idem::call`](super::Idem::call)) has
    /// under the handle's current secret: what the handler would see as
    /// [`Operation::ledger_key`](super::Operation::ledger_key), and whose [`Key::reference`] the
    /// caller would be given. For operators and tests; a secret-less derivation does not exist.
    ///
    /// # Errors
    /// As [`Idem::call`](super::Idem::call) refuses: no secret, invalid arguments, a missing `within` argument.
    pub fn key_of(
        self,
        recipe: &Recipe,
        caller: &Caller,
        arguments: &(impl Serialize + ?Sized),
    ) -> Result<Key, Rejection> {
        let keyring = self.idem.configured_keyring().map_err(|error| no_secret(&error))?;
        let arguments = CallArguments::of(recipe, arguments)?;
        let scope = scope_of(recipe, caller, &arguments)?;
        arguments.key(&keyring.current, self.idem.namespace(recipe), &scope, recipe.tool())
    }

    /// The unsettled operations an operator should look at — unknown, or in progress (alive,
    /// or under a lapsed lease) — current and superseded, not yet past their retention, oldest
    /// first: what `idem pending` prints. Each names its tool, tenant and subject when its
    /// record keeps a label (durable ledgers do, from this version on).
    ///
    /// For operators only, like [`Admin::inspect`]: it crosses tenants.
    ///
    /// A tenant filter looks under the current secret and the newest previous one.
    ///
    /// # Errors
    /// No usable secret (with a tenant filter), or the ledger's failure.
    pub async fn pending(self, filter: &PendingFilter) -> Result<PendingPage, StatusError> {
        let keyring = self.idem.keyring(Check::Compare).await?;
        let (now, _) = self.idem.ledger_time().await?;
        let mut query = PendingQuery::new(filter.limit);
        query.state = filter.state;
        if let Some(tenant) = &filter.tenant {
            query.tenants = keyring.all().take(2).map(|secret| TenantTag::of(secret, tenant)).collect();
        }
        if let Some(age) = filter.older_than {
            query.claimed_by = now.saturating_sub(millis(age));
        }
        query.after = filter.after.map(|cursor| (cursor.created_at, cursor.reference));
        let records = self.idem.inner.ledger.pending(&query, now).await?;
        let next = (records.len() >= filter.limit)
            .then(|| {
                records.last().map(|last| PendingCursor { created_at: last.created_at, reference: last.reference })
            })
            .flatten();
        let operations = records
            .into_iter()
            .map(|record| PendingOperation {
                key: record.key,
                reference: record.reference,
                state: record.state,
                created_at: record.created_at,
                window_end: record.window_end,
                expires_at: record.expires_at,
                lease_until: record.lease_until,
                lease_expired: lease_lapsed(record.state, record.lease_until, now),
                superseded: record.superseded,
                label: record.label.as_deref().and_then(|sealed| open_label(keyring.all(), sealed)),
            })
            .collect();
        Ok(PendingPage { operations, next, now })
    }

    /// Starts a background task that deletes expired records every `every` (jittered by up to a
    /// quarter either way, and the first sweep at a random point of the first period, so
    /// replicas started together do not sweep in lockstep), `batch` records per ledger statement
    /// (a `batch` of 0 counts as 1), yielding between batches, until a batch comes back short.
    /// A sweep that deleted something logs it at `info`; a ledger error is logged at `warn` and
    /// the next sweep waits twice as long (up to eight periods), back to `every` after a sweep
    /// that succeeds.
    ///
    /// It runs until the returned guard is dropped or [`Sweeper::stop`]ped. It holds this
    /// handle weakly: once every clone of the handle is gone, it stops too (at its next batch),
    /// so it never keeps a ledger's connections open by itself.
    ///
    /// Safe on every replica: each record is deleted by one sweep statement only, a live lease
    /// is never deleted, and on PostgreSQL a sweep skips rows another one has locked rather than
    /// queueing behind it. One sweeper per process is enough.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use idem_runtime::{Idem, MemoryLedger};
    ///
    /// let idem = Idem::new(MemoryLedger::new());
    /// // Every five minutes, a thousand records per statement.
    /// let sweeper = idem.admin().spawn_sweeper(Duration::from_secs(300), 1000);
    /// // ... serve ...
    /// let stats = sweeper.stop().await;
    /// assert_eq!(stats.errors, 0);
    /// # }
    /// ```
    ///
    /// # Panics
    /// If `every` is zero (the sweeper would never pause), or if called outside a Tokio runtime.
    pub fn spawn_sweeper(self, every: Duration, batch: usize) -> Sweeper {
        self.spawn_sweeping(every, batch, false)
    }

    /// [`Admin::spawn_sweeper`], and after each sweep the ledger gauges (`idem_ledger_unknown_operations`,
    /// `idem_ledger_oldest_unknown_seconds`, `idem_ledger_lapsed_leases`,
    /// `idem_ledger_sweep_backlog`: see [`metrics`](crate::metrics)) set from one
    /// [`Admin::stats`] — what an operator alerts on without a cron job running `idem stats`.
    /// The count scans the ledger's tables once per sweep: run it on one replica (the gauges
    /// describe the whole ledger), at a period the database can afford. A count that fails is
    /// logged at `warn` and leaves the gauges as they were.
    ///
    /// # Panics
    /// As [`Admin::spawn_sweeper`].
    #[cfg(feature = "metrics")]
    pub fn spawn_sweeper_with_gauges(self, every: Duration, batch: usize) -> Sweeper {
        self.spawn_sweeping(every, batch, true)
    }

    fn spawn_sweeping(self, every: Duration, batch: usize, gauges: bool) -> Sweeper {
        let handle = self.idem.downgrade();
        sweeper::spawn(move || handle.upgrade(), every, batch, gauges)
    }
}

/// What [`Admin::about`] tells of an operation beside its record.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct About {
    /// Its tool, tenant, subject and namespace.
    pub label: Option<Label>,
    /// What the ledger keeps of its tool.
    pub facts: Option<ToolFacts>,
}
