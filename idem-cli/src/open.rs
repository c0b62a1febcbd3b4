//! The ledger and the secret an operator's command works with, found as the servers find them:
//! a SQL or a Redis ledger as its URL says, `IDEM_SECRET` or the SQLite ledger's secret file;
//! neither is ever created.

use std::path::PathBuf;

use idem_runtime::ledger::redis::RedisLedger;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::{DATABASE_URL_ENV, ToolOwner, is_redis_url};
use idem_runtime::secret::{self, SECRET_ENV, Secret};
use idem_runtime::settings::Builder;
use idem_runtime::{Idem, ledger::Ledger, ledger::LedgerError};

use super::Failure;

/// The ledger an operator points at: a SQL one or a Redis one, as the URL says.
pub(super) enum Opened {
    Sql(SeaOrmLedger),
    Redis(RedisLedger),
}

impl Opened {
    pub(super) async fn open(url: &str) -> Result<Self, LedgerError> {
        if is_redis_url(url) {
            Ok(Self::Redis(RedisLedger::connect(url).await?))
        } else {
            Ok(Self::Sql(SeaOrmLedger::connect_existing(url).await?))
        }
    }

    pub(super) async fn holds_ledger(&self) -> Result<bool, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.holds_ledger().await,
            Self::Redis(ledger) => ledger.holds_ledger().await,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Self::Sql(ledger) => ledger.describe(),
            Self::Redis(ledger) => format!("idem ledger: redis at {}", ledger.place()),
        }
    }

    pub(super) async fn tool_owners_all(&self) -> Result<Vec<ToolOwner>, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.tool_owners_all().await,
            Self::Redis(ledger) => ledger.tool_owners_all().await,
        }
    }

    pub(super) async fn forget_tool_owners(&self, namespace: &str, tool: &str) -> Result<u64, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.forget_tool_owners(namespace, tool).await,
            Self::Redis(ledger) => ledger.forget_tool_owners(namespace, tool).await,
        }
    }

    pub(super) fn shared(&self) -> std::sync::Arc<dyn Ledger> {
        match self {
            Self::Sql(ledger) => std::sync::Arc::new(ledger.clone()),
            Self::Redis(ledger) => std::sync::Arc::new(ledger.clone()),
        }
    }
}

/// The SQLite file `url` names, if it names one; refuses a file that does not exist (the tool
/// never creates a ledger: a typo would show an empty one) and an in-memory database.
pub(super) fn sqlite_file(url: &str) -> Result<Option<PathBuf>, Failure> {
    if url.starts_with("postgres:")
        || url.starts_with("postgresql:")
        || url.starts_with("mysql:")
        || url.starts_with("mariadb:")
    {
        return Ok(None);
    }
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(Failure::new(format!(
            "{url} is an in-memory database, which only the process that opened it can see: \
             point {DATABASE_URL_ENV} at the servers' ledger"
        )));
    }
    let path = url.strip_prefix("sqlite:").map_or(url, |rest| rest.trim_start_matches("//"));
    let path = PathBuf::from(path.split('?').next().unwrap_or_default());
    if path.is_file() {
        Ok(Some(path))
    } else {
        Err(Failure::new(format!(
            "no ledger at {}: check {DATABASE_URL_ENV} or --database-url (idem does not create a ledger)",
            path.display()
        )))
    }
}

/// The handle keyed as the servers are: `IDEM_SECRET` (and the previous secrets still honoured),
/// or else the SQLite ledger's own secret file — which must exist: a new secret finds nothing.
pub(super) fn with_secret(idem: Builder, file: Option<&std::path::Path>) -> Result<Idem, Failure> {
    let (current, previous) = match secret::from_env() {
        Err(error) => return Err(Failure::new(format!("{error}: set {SECRET_ENV} to the servers' secret"))),
        Ok(Some(configured)) => configured,
        Ok(None) => {
            let Some(file) = file else {
                return Err(Failure::new(format!(
                    "no secret: set {SECRET_ENV} to the secret the servers use (a shared ledger keeps none); \
                     without it no operation can be found by its ref"
                )));
            };
            let path = PathBuf::from(format!("{}.secret", file.display()));
            if !path.is_file() {
                return Err(Failure::new(format!(
                    "no secret: set {SECRET_ENV} to the secret the servers use, or keep the SQLite ledger's \
                     secret file beside it ({} does not exist)",
                    path.display()
                )));
            }
            let secret: Secret = Secret::load_or_create(&path).map_err(|error| Failure::new(error.to_string()))?;
            (secret, Vec::new())
        }
    };
    built(previous.into_iter().fold(idem.secret(current), Builder::previous_secret))
}

/// The operator's handle, or what to change (a `--timeout` the lease cannot hold).
pub(super) fn built(idem: Builder) -> Result<Idem, Failure> {
    idem.build().map_err(|error| Failure::new(error.to_string()))
}
