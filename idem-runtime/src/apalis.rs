//! apalis jobs (feature `apalis`): [`IdemLayer`] runs each job through the one engine
//! ([`Idem::call`]), so a job pushed twice, or retried after its worker died mid-run, runs its
//! effect once and every repeat is answered with the first run's result.
//!
//! Guarantees: a job's key comes from its arguments by the recipe, or from the producer's
//! idempotency key (else the job's id) with [`IdemLayer::by_job_id`]; a repeat of a finished job
//! is acknowledged `Done` with the stored result without running the handler; a repeat that finds
//! the job running elsewhere fails (`Failed`, so apalis retries it later); a job whose worker died
//! mid-run is held (`hold`: it ends `Killed`, "outcome unknown") or run again under the same key
//! (`takeover`: forward the key, so the downstream dedupes); a conflict or a refusal retrying
//! cannot change ends the job (`Killed`). The handler's error is the job's, and by default means
//! nothing happened (apalis retries it, as without idem).
//!
//! ```no_run
//! use idem_runtime::apalis::IdemLayer;
//! use idem_runtime::{Caller, Idem, Recipe};
//! use tower_layer::Layer;
//!
//! static SEND_INVOICE: Recipe = Recipe::new("send_invoice", &["invoice_id"]);
//!
//! # fn build<S>(idem: Idem, handler: S) {
//! // The handler service (apalis's `task_fn(send_invoice)`), wrapped before the worker is built:
//! // `WorkerBuilder::new("invoices").backend(storage).build(guarded)`.
//! let guarded = IdemLayer::new(idem, &SEND_INVOICE, Caller::new("billing", "invoice-worker")).layer(handler);
//! # let _ = guarded; }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use apalis_core::error::{AbortError, BoxDynError};
use apalis_core::task::Task;
use apalis_core::task::status::Status;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tower_layer::Layer;
use tower_service::Service;

use crate::idem::Idem;
use crate::recipe::Recipe;
use crate::rejection::{ErrorClass, IdempotentError, Rejection};
use crate::scope::Caller;

/// How long a job that found its operation running elsewhere waits before it fails (and apalis
/// fetches it again): the wait bounds how often a queue polls a long job.
const IN_FLIGHT_PAUSE: Duration = Duration::from_secs(1);

/// What a job is keyed by.
#[derive(Clone, Copy, Debug)]
enum KeyBy {
    /// The job's arguments, by the recipe's key paths.
    Arguments,
    /// The producer's idempotency key, else the job's id, as `job`.
    JobId,
}

/// A tower layer for an apalis worker's handler: each job runs as one operation of `recipe`,
/// for `caller`.
///
/// Wrap the handler service with it (`IdemLayer::new(..).layer(task_fn(handler))`, then
/// `WorkerBuilder::build` that); given to `WorkerBuilder::layer` instead it works too, but apalis
/// then does not count the attempts of the jobs it answers without running the handler.
#[derive(Clone)]
pub struct IdemLayer {
    idem: Idem,
    recipe: &'static Recipe,
    caller: Caller,
    key: KeyBy,
    classify: fn(&BoxDynError) -> ErrorClass,
}

impl IdemLayer {
    /// Jobs keyed by their arguments (which must serialise to an object) through `recipe`'s key
    /// paths, for `caller` (the tenant and subject the worker acts for).
    #[must_use]
    pub fn new(idem: Idem, recipe: &'static Recipe, caller: Caller) -> Self {
        Self { idem, recipe, caller, key: KeyBy::Arguments, classify: |_| ErrorClass::NothingHappened }
    }

    /// Jobs keyed by the producer's idempotency key (`TaskBuilder::idempotency_key`), else by the
    /// job's id: a job retried, or pushed twice with one key, is one operation. The recipe keys
    /// on `job` (`Recipe::new(tool, &["job"])`); the arguments are still fingerprinted, so one
    /// key with other arguments is a conflict. (apalis-sqlite itself drops a second push with a
    /// key it holds, so on SQLite those never reach the layer.)
    #[must_use]
    pub const fn by_job_id(mut self) -> Self {
        self.key = KeyBy::JobId;
        self
    }

    /// What each handler error means for the operation: [`ErrorClass::Final`] stores it (as its
    /// message) and ends the job and every repeat with it (`Killed`); [`ErrorClass::Unknown`]
    /// ends the job and holds repeats until an operator settles the operation. By default every
    /// error means nothing happened (the job fails, and apalis retries it).
    #[must_use]
    pub const fn classify_errors(mut self, classify: fn(&BoxDynError) -> ErrorClass) -> Self {
        self.classify = classify;
        self
    }
}

impl<S> Layer<S> for IdemLayer {
    type Service = IdemService<S>;

    fn layer(&self, inner: S) -> IdemService<S> {
        IdemService { inner, layer: self.clone() }
    }
}

/// The service [`IdemLayer`] makes of a handler.
#[derive(Clone)]
pub struct IdemService<S> {
    inner: S,
    layer: IdemLayer,
}

/// How a run ended, as the engine stores it.
#[derive(Serialize, Deserialize)]
enum Failure {
    /// The handler's error: its message; this run's class of it and the error itself (only a
    /// final error is stored, so one read back is final).
    Handler {
        message: String,
        #[serde(skip)]
        class: Option<ErrorClass>,
        #[serde(skip)]
        error: Option<BoxDynError>,
    },
    #[serde(skip)]
    Refused(Rejection),
}

impl IdempotentError for Failure {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Handler { class, .. } => class.unwrap_or(ErrorClass::Final),
            Self::Refused(_) => ErrorClass::NothingHappened,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused(rejection)
    }
}

/// A stored error, replayed: its message.
#[derive(Debug)]
struct Replayed(String);

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (idem: the stored error of an earlier run of this job; nothing ran again)", self.0)
    }
}

impl std::error::Error for Replayed {}

impl<S, Args> Service<Task<Args>> for IdemService<S>
where
    S: Service<Task<Args>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Serialize + DeserializeOwned + Send + 'static,
    S::Error: Into<BoxDynError>,
    Args: Serialize + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxDynError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxDynError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, task: Task<Args>) -> Self::Future {
        // The ready service runs this job; a clone waits for the next (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let arguments = match arguments(&task, layer.key) {
                Ok(arguments) => arguments,
                Err(error) => {
                    tracing::error!(%error, "a job idem cannot key is ended without running");
                    task.raw_status().store(Status::Killed);
                    return Err(AbortError::new(error).into());
                }
            };
            let status = task.raw_status().clone();
            let classify = layer.classify;
            let served = layer
                .idem
                .call(layer.recipe, Some(&layer.caller), &arguments, || async move {
                    inner.call(task).await.map_err(|error| {
                        let error: BoxDynError = error.into();
                        let class = classify(&error);
                        let message = error.to_string();
                        Failure::Handler { message, class: Some(class), error: Some(error) }
                    })
                })
                .await;
            // Where the handler did not run, the status apalis acknowledges is set here (inside
            // apalis's lifecycle layer, it sets the same one from the result).
            match served {
                Ok(served) => {
                    if served.replayed {
                        status.store(Status::Done);
                    }
                    Ok(served.value)
                }
                // A final or unknown error ends the job here too: a retry would only be refused.
                Err(Failure::Handler {
                    error: Some(error),
                    class: Some(ErrorClass::Final | ErrorClass::Unknown),
                    ..
                }) => {
                    status.store(Status::Killed);
                    Err(AbortError::new(error).into())
                }
                Err(Failure::Handler { error: Some(error), .. }) => Err(error),
                Err(Failure::Handler { message, .. }) => {
                    status.store(Status::Killed);
                    Err(AbortError::new(Replayed(message)).into())
                }
                Err(Failure::Refused(rejection)) => {
                    if matches!(rejection, Rejection::InFlight { .. }) || rejection.retry_is_safe() {
                        tokio::time::sleep(IN_FLIGHT_PAUSE).await;
                        status.store(Status::Failed);
                        Err(rejection.to_string().into())
                    } else {
                        status.store(Status::Killed);
                        Err(AbortError::new(rejection.to_string()).into())
                    }
                }
            }
        })
    }
}

/// The arguments the recipe keys: the job's own, or its id beside them — in canonical form, so
/// what has none (NaN, a map with non-string keys) is refused as it is at every door.
fn arguments<Args: Serialize>(task: &Task<Args>, key: KeyBy) -> Result<Value, String> {
    let args = crate::canonical::to_value(&task.args).map_err(|error| format!("the job cannot be keyed: {error}"))?;
    match key {
        KeyBy::Arguments => Ok(args),
        KeyBy::JobId => {
            let context = task.ctx();
            let job = match (context.idempotency_key(), context.task_id()) {
                (Some(key), _) => key.to_owned(),
                (None, Some(id)) => id.to_string(),
                (None, None) => return Err("the job has neither an idempotency key nor an id to be keyed by".into()),
            };
            Ok(json!({ "job": job, "args": args }))
        }
    }
}
