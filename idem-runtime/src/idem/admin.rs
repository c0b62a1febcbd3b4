//! The operator's verbs as one family on [`Admin`] ([`Idem::admin`]): `inspect`, `resolve` (a
//! verdict on an operation whose outcome is unknown), `stats`, `sweep`; the startup checks
//! (`check_secret`, `register`) and the raw access (`ledger`, `namespace`, the clocks);
//! `pending` (`pending.rs`),
//! `spawn_sweeper` (`sweeper.rs`) and `key_of` (`arguments.rs`) live beside their concern.
//! Inspection and verdicts look under every secret still honoured, so a rotation hides nothing;
//! verdicts and the sweep act on time, so only on a settled clock.

use std::sync::Arc;

use crate::key::{Address, AddressError, Ref, RefError, TenantTag};
use crate::ledger::{Label, Ledger, LedgerError, LedgerStats, Resolution, State, StatusReport, open_label};
use crate::recipe::Recipe;
use crate::rejection::Rejection;
use crate::secret::SecretError;

use super::facts::ToolFacts;
use super::keyring::Check;
use super::time::{clamp, millis};
use super::{Idem, StoredValue};

/// A status or resolve request that could not be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// The ref is malformed.
    Ref(RefError),
    /// The operation's address is malformed (or a ref alone where a verdict needs the address).
    Address(AddressError),
    /// The ledger failed or refused.
    Ledger(LedgerError),
    /// The handle has no usable secret.
    Secret(SecretError),
    /// A "completed" verdict the operation's tool could not read back: nothing was stored.
    Misfit {
        /// The tool.
        tool: String,
        /// Where and how the verdict does not fit.
        reason: String,
        /// The result's shape on one line ([`ToolFacts::expected_shape`]).
        expected: String,
    },
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ref(error) => error.fmt(f),
            Self::Address(error) => error.fmt(f),
            Self::Ledger(error) => error.fmt(f),
            Self::Secret(error) => error.fmt(f),
            Self::Misfit { tool, reason, expected } => write!(
                f,
                "the verdict does not fit {tool}'s result, so no repeat could read it: {reason}. It expects \
                 {expected}. Nothing was stored: give the result as the tool returns it (`idem show` prints \
                 the shape)"
            ),
        }
    }
}

/// Transparent, as its message is: the wrapped error's own cause.
impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Ref(error) => error.source(),
            Self::Address(error) => error.source(),
            Self::Ledger(error) => error.source(),
            Self::Secret(error) => error.source(),
            Self::Misfit { .. } => None,
        }
    }
}

impl From<RefError> for StatusError {
    fn from(error: RefError) -> Self {
        Self::Ref(error)
    }
}

impl From<AddressError> for StatusError {
    fn from(error: AddressError) -> Self {
        Self::Address(error)
    }
}

impl From<LedgerError> for StatusError {
    fn from(error: LedgerError) -> Self {
        Self::Ledger(error)
    }
}

impl From<SecretError> for StatusError {
    fn from(error: SecretError) -> Self {
        Self::Secret(error)
    }
}

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

    /// Registers `recipe` with this handle, refusing a different recipe (declared elsewhere)
    /// with the same tool name in the same namespace: the two would share keys. Once two are
    /// seen, both are refused from then on, whichever came first — as on two handles of one
    /// ledger. Every call registers its recipe before anything else; call this at startup to
    /// find a clash before the first call does.
    ///
    /// # Errors
    /// [`Rejection::DuplicateTool`], naming both places.
    pub fn register(self, recipe: &Recipe) -> Result<(), Rejection> {
        self.idem.register(recipe)
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

/// What [`Admin::about`] tells of an operation beside its record.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct About {
    /// Its tool, tenant, subject and namespace.
    pub label: Option<Label>,
    /// What the ledger keeps of its tool.
    pub facts: Option<ToolFacts>,
}
