//! The handle: a thin, cloneable front over the ledger (wrapped once in its timeout), the
//! settings it was built with, and the runtime state each call shares — each piece in a room of
//! its own: the keyring, ledger time, coalescing, waiters and background work. Who serves which
//! operation is the ledger's catalogue, which every handle over the ledger shares.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::key::{Ref, SubjectTag, TenantTag};
use crate::ledger::{Catalogue, Clash, Handler, Ledger, StatusReport, Timeout};
use crate::recipe::Recipe;
use crate::rejection::IdempotentError;
use crate::scope::Caller;

use super::Operation;
use super::admin::Admin;
use super::arguments::CallArguments;
use super::background::BACKGROUND_JOBS;
use super::call::{Call, Ran, Reconciled, Served};
use super::drain::{Drain, Drained};
use super::keyring::Check;
use super::keyring::Secrets;
use super::owners::{Declared, owner_name};
use super::settings::{Builder, DEFAULT_NAMESPACE, Settings};
use super::status_error::StatusError;
use super::stored::Results;
use super::time::LedgerTime;
use super::wait::Waiting;

static INSTALLED: std::sync::RwLock<Option<Idem>> = std::sync::RwLock::new(None);

/// The handle that runs handlers under recipes: a ledger, a clock and the limits. Cheap to clone;
/// built once with [`Idem::builder`] (or [`Idem::new`] for the defaults), unchanged after.
#[derive(Clone)]
pub struct Idem {
    pub(super) inner: Arc<Inner>,
}

/// A handle held weakly (the sweeper's), so that it keeps no ledger connection open by itself.
pub(super) struct WeakIdem(std::sync::Weak<Inner>);

impl WeakIdem {
    /// The handle, while one of its clones lives.
    pub(super) fn upgrade(&self) -> Option<Idem> {
        self.0.upgrade().map(|inner| Idem { inner })
    }
}

/// What every clone of a handle shares: the ledger, the settings, and the runtime state.
pub(super) struct Inner {
    /// The ledger as given, wrapped in the ledger timeout: every statement goes through this.
    pub(super) ledger: Arc<dyn Ledger>,
    /// The ledger as given, for what is identified by the ledger (the tool-owner check).
    pub(super) untimed: Arc<dyn Ledger>,
    /// Fixed when the handle was built.
    pub(super) settings: Settings,
    /// The secrets in use, resolved and checked on first use.
    pub(super) secrets: Secrets,
    /// This handle's clock against the ledger's.
    pub(super) time: LedgerTime,
    /// Bounds the background ledger work (lost-claim releases, completion retries).
    pub(super) background: Arc<tokio::sync::Semaphore>,
    /// The operations this process waits on and the claims it holds (`wait`).
    pub(super) waiting: Arc<Waiting>,
    /// The claims this process is sending or holding, for coalescing identical calls.
    pub(super) claims: Arc<super::coalesce::Claims>,
    /// Who serves which operation, for a ledger that keeps no catalogue of its own
    /// ([`Ledger::catalogue`]).
    pub(super) catalogue: Catalogue,
    /// Whether it still takes calls, and how many are under way.
    pub(super) drain: Drain,
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings = &self.inner.settings;
        f.debug_struct("Idem")
            .field("lease", &settings.lease)
            .field("ledger_timeout", &settings.ledger_timeout)
            .field("retention", &settings.retention)
            .field("max_result_bytes", &settings.max_result_bytes)
            .field("namespace", &settings.namespace)
            .field("local_caller", &settings.local_caller)
            .finish_non_exhaustive()
    }
}

impl Idem {
    /// A handle on `ledger` with the system clock and the default lease, retention and limits
    /// (the same as `Idem::builder(ledger).build()`, which cannot fail with the defaults).
    #[must_use]
    pub fn new(ledger: impl Ledger) -> Self {
        Self::builder(ledger).build().expect("the default settings work together")
    }

    /// Gathers the settings of a handle on `ledger` — a ledger, or one already shared
    /// (`Arc<dyn Ledger>`, chosen at run time); [`Builder::build`] checks them together.
    pub fn builder(ledger: impl Ledger) -> Builder {
        Builder::new(ledger)
    }

    pub(super) fn from_settings(ledger: Arc<dyn Ledger>, settings: Settings) -> Self {
        if ledger.catalogue().is_none() {
            tracing::warn!(
                "this ledger keeps no catalogue (`Ledger::catalogue` answers None): each handle over it keeps its \
                 own, so two handlers of one owner name on two handles (two pinned to one `name`, two hand-built \
                 recipes of one tool) are not told apart. Keep an `idem_runtime::ledger::Catalogue` in the ledger \
                 and return it from `Ledger::catalogue`"
            );
        }
        let time = LedgerTime::default();
        Self {
            inner: Arc::new(Inner {
                // One place bounds every ledger statement: the ledger is wrapped in the timeout
                // once, and it tells the handle's time of each statement that lost its server.
                ledger: Arc::new(Timeout::new(Arc::clone(&ledger), settings.ledger_timeout, time.lost())),
                untimed: ledger,
                settings,
                secrets: Secrets::default(),
                time,
                background: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_JOBS)),
                waiting: Arc::default(),
                claims: Arc::default(),
                catalogue: Catalogue::default(),
                drain: Drain::default(),
            }),
        }
    }

    /// Runs `handler` as the operation `recipe` derives from `caller` and `arguments`, at most
    /// once per key, and answers repeats from the ledger. `caller` falls back to the one in
    /// scope ([`run_as`](super::run_as)) and then to the local caller; with none, the
    /// call is refused.
    ///
    /// `arguments` are the tool's arguments by name: anything that serialises to an object (a
    /// struct, a map, a `serde_json::Value` object). They are canonicalised here, as
    /// `#[idempotent]` does ([`crate::canonical::to_value`]): NaN, infinities and other values
    /// without a canonical form are refused (`invalid_arguments`), never keyed as `null`.
    ///
    /// # Errors
    /// The handler's own error, or `E::from_rejection` of why it did not run.
    pub async fn call<T, E, F, Fut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &(impl Serialize + ?Sized),
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.call_reconciling(recipe, caller, arguments, |_| async { Reconciled::StillUnknown }, handler).await
    }

    /// [`Idem::call`] for a recipe with the `reconcile` stale policy: when a claim finds a dead
    /// holder's lease, `reconcile` asks the downstream what happened (by the operation's
    /// idempotency key) before anything runs again.
    ///
    /// # Errors
    /// As [`Idem::call`].
    pub async fn call_reconciling<T, E, F, Fut, R, RFut>(
        &self,
        recipe: &Recipe,
        caller: Option<&Caller>,
        arguments: &(impl Serialize + ?Sized),
        reconcile: R,
        handler: F,
    ) -> Result<Served<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: IdempotentError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: FnOnce(Operation) -> RFut,
        RFut: Future<Output = Reconciled<T, E>>,
    {
        let arguments = CallArguments::of(recipe, arguments);
        // The handler is called where the engine runs it, as before: only its future is wrapped.
        let handler = || {
            let running = handler();
            async move { Ran::<T, E, std::convert::Infallible>::Outcome(running.await) }
        };
        match self.execute(Call { recipe, caller, fallback: true, arguments, reconcile, handler }).await {
            Ok(Served { value: Ran::Outcome(Ok(value)), replayed, reference }) => {
                Ok(Served { value, replayed, reference })
            }
            Ok(Served { value: Ran::Outcome(Err(error)), .. }) => Err(error),
            Ok(Served { value: Ran::Unrecorded(never), .. }) => match never {},
            Err(rejection) => Err(E::from_rejection(rejection)),
        }
    }

    /// The status of operation `reference`, if the caller may see it: its own operations, and
    /// those of its tenant made with `scope = "tenant"`. Never another subject's.
    ///
    /// # Errors
    /// A malformed ref, or the ledger's failure.
    pub async fn status(&self, caller: &Caller, reference: &str) -> Result<Option<StatusReport>, StatusError> {
        let reference = Ref::parse(reference)?;
        let keyring = self.keyring(Check::Keep).await?;
        let (now, _) = self.ledger_time().await?;
        for secret in keyring.all() {
            let tenant = TenantTag::of(secret, caller.tenant());
            let subject = SubjectTag::of(secret, caller.tenant(), caller.subject());
            let report = self.inner.ledger.status(tenant, subject, reference, now).await?;
            if let Some(mut report) = report {
                // An unopenable result is not shown (the error is logged); its state still is.
                report.result = report.result.and_then(|stored| self.results().open(stored, report.reference).ok());
                return Ok(Some(report));
            }
        }
        Ok(None)
    }

    /// The operator's verbs on this handle's ledger: see [`Admin`].
    #[must_use]
    pub fn admin(&self) -> Admin<'_> {
        Admin { idem: self }
    }

    /// Makes this the process-wide handle that `#[idempotent]` free functions run under
    /// (methods use [`HasIdem`](crate::HasIdem)). Replaces any handle installed before.
    pub fn install(&self) {
        let mut installed = INSTALLED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *installed = Some(self.clone());
    }

    /// The handle installed with [`Idem::install`], if any.
    #[must_use]
    pub fn installed() -> Option<Self> {
        INSTALLED.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Stops the handle gracefully, for a shutdown (on SIGTERM, before the process exits): new
    /// calls are refused from now on ([`Rejection::ShuttingDown`](crate::Rejection::ShuttingDown), safe to retry elsewhere), and
    /// this waits up to `deadline` for the calls under way to end and record their outcomes —
    /// keep serving meanwhile, so their answers reach their callers — including calls already
    /// answered whose outcome is still being recorded in the background (the ledger did not
    /// take it at once: a short outage). A call still running or recording at the deadline
    /// keeps its record in progress (counted in [`Drained::still_running`] and logged by
    /// reference), and its tool's stale policy decides once its lease lapses. Every clone of
    /// the handle is drained.
    pub async fn drain(&self, deadline: std::time::Duration) -> Drained {
        self.inner.drain.run(deadline).await
    }

    /// This handle, held weakly.
    pub(super) fn downgrade(&self) -> WeakIdem {
        WeakIdem(Arc::downgrade(&self.inner))
    }

    /// The stored-result format under this handle's seal and size limit.
    pub(super) fn results(&self) -> Results<'_> {
        let settings = &self.inner.settings;
        Results { seal: settings.seal.as_deref(), max_result_bytes: settings.max_result_bytes }
    }

    // What the runtime's own rooms and doors ask of a handle; the public ones are on `Admin`.

    /// The namespace `recipe`'s keys are derived in ([`Admin::namespace`]).
    pub(crate) fn namespace<'a>(&'a self, recipe: &'a Recipe) -> &'a str {
        self.inner.settings.namespace.as_deref().or(recipe.namespace_name()).unwrap_or(DEFAULT_NAMESPACE)
    }

    /// Declares the handler of `recipe` (named `owner` by `#[idempotent]`, else by the recipe)
    /// in the ledger's catalogue, and, for a route, the `layer` that protects it (two on one
    /// handle are refused; on two, they are one service served twice): every call
    /// does as soon as its arguments are read, and a layer when it is built; see [`Admin::register`].
    pub(crate) fn declare(
        &self,
        recipe: &Recipe,
        owner: Option<&str>,
        layer: Option<&Arc<()>>,
    ) -> Result<Declared, Clash> {
        // A layer is told apart from another on its handle: its clone of the handle keeps this
        // address its own while the layer lives.
        let layer = layer.map(|layer| (layer, Arc::as_ptr(&self.inner) as usize));
        let tool = recipe.tool();
        let owner = owner_name(owner.or(recipe.owner_path()), tool);
        let catalogue = self.catalogue();
        let handler = Handler { owner: &owner, site: recipe.site(), layer };
        // Every outcome's series exists from the tool's first call, at zero.
        let new = || {
            #[cfg(feature = "metrics")]
            super::metrics::first_call(tool);
        };
        let declaration = catalogue.declare(self.namespace(recipe), tool, handler, new)?;
        Ok(Declared { owner, declaration })
    }

    /// The catalogue [`Idem::declare`] declares in.
    pub(super) fn catalogue(&self) -> &Catalogue {
        self.inner.untimed.catalogue().unwrap_or(&self.inner.catalogue)
    }

    /// The configured local identity, if any (what an rmcp tool without a caller runs as).
    #[cfg(feature = "rmcp")]
    pub(crate) fn local_caller(&self) -> Option<&Caller> {
        self.inner.settings.local_caller.as_ref()
    }

    /// The ledger, wrapped in the ledger timeout ([`Admin::ledger`]).
    pub(crate) fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.inner.ledger
    }
}
