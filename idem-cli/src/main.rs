//! `idem`: the operator's command-line tool for an idem ledger: `pending`, `show`, `resolve`,
//! `stats`, `sweep`, `tools` — and `idem probe`, which checks any MCP server's `idempotentHint`
//! against its behaviour (no ledger needed; see `probe/`).
//!
//! Pointed at the ledger by `IDEM_DATABASE_URL` (or `--database-url`) and, to find an operation
//! by its ref, at the servers' secret the way they find it: `IDEM_SECRET` (and
//! `IDEM_SECRET_PREVIOUS`), or else the secret file a SQLite ledger keeps beside itself.
//!
//! Exit status: 0 done; 1 the ledger, the URL or the secret failed; 2 a usage error; 3 no such
//! operation; 4 the operation cannot be resolved (it is settled, or its holder is alive).
//! `idem probe`: 0 no hint found false; 1 a hint is false; 2 a usage error or no server.

mod probe;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use idem_runtime::ledger::redis::RedisLedger;
use idem_runtime::ledger::sea::SeaOrmLedger;
use idem_runtime::ledger::{DATABASE_URL_ENV, ToolOwner, is_redis_url};
use idem_runtime::secret::{self, SECRET_ENV, Secret};
use idem_runtime::{
    Builder, Idem, StatusError, StatusReport, admin::About, admin::PendingCursor, admin::PendingFilter,
    admin::PendingOperation, admin::PendingPage, admin::ToolFacts, ledger::Ledger, ledger::LedgerError,
    ledger::LedgerStats, ledger::Resolution, ledger::State, recipe::parse_window, settings::DEFAULT_LEASE,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

/// The operator's tool for an idem ledger: pending, show, resolve, stats, sweep, tools.
#[derive(Parser, Debug)]
#[command(name = "idem", version)]
struct Cli {
    /// The ledger: a `postgres://`, `mysql://`, `sqlite:`, `redis://` or `redis+cluster://` URL, or a
    /// SQLite file's path.
    #[arg(long, global = true, env = DATABASE_URL_ENV, hide_env_values = true)]
    database_url: Option<String>,
    /// Print JSON (one object) instead of text, for scripts.
    #[arg(long, global = true)]
    json: bool,
    /// How long one statement may take (`idem pending` and `idem stats` scan whole tables:
    /// raise it on a large ledger).
    #[arg(long, global = true, value_name = "AGE", default_value = "10s", value_parser = parse_age)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checks an MCP server's `idempotentHint` claims against its behaviour: repeats each
    /// hinted tool's calls (one after another, at once, after a lost answer) and reports per
    /// tool whether the hint holds. It CALLS THE REAL TOOLS: use a sandbox or staging server.
    Probe(probe::ProbeArgs),
    /// Operations to look at: unknown, or in progress (a lapsed lease means its holder died),
    /// oldest first, a page at a time, with their tenant, subject and tool.
    Pending {
        /// Only this state.
        #[arg(long, value_enum)]
        state: Option<PendingState>,
        /// Only this tenant's operations.
        #[arg(long)]
        tenant: Option<String>,
        /// Only operations first claimed at least this long ago: 30s, 10m, 2h, 7d.
        #[arg(long, value_name = "AGE", value_parser = parse_age)]
        older_than: Option<Duration>,
        /// Operations per page.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..))]
        limit: u16,
        /// The next page: the cursor the page before printed.
        #[arg(long, value_name = "CURSOR")]
        after: Option<PendingCursor>,
    },
    /// Records by state, the oldest unknown operation, how many the sweep would delete, the size.
    Stats,
    /// Deletes expired records, a batch at a time, until none are left.
    Sweep {
        /// Records deleted per statement (at least 1).
        #[arg(long, default_value_t = 1000, value_parser = batch_size)]
        batch: usize,
    },
    /// One operation: its state, times and stored result, and the shape a --completed verdict
    /// must fit, with an example (or that nothing is checked, for a tool without a shape).
    Show(Target),
    /// Settles an operation whose outcome is unknown (or whose holder died), after you checked
    /// the downstream system. Refuses a settled one.
    Resolve {
        #[command(flatten)]
        target: Target,
        /// It happened: this JSON is its result, replayed to every repeat as the tool's answer
        /// (for an HTTP route, the response: {"status":201,"headers":[["location","/x/7"]],"text":"…"}).
        /// Checked against the tool's result shape (`idem show` prints it).
        #[arg(long, value_name = "JSON", conflicts_with = "nothing_happened")]
        completed: Option<String>,
        /// It did not happen: the next repeat runs the tool again.
        #[arg(long)]
        nothing_happened: bool,
    },
    /// The handler each tool is served by, as servers recorded it: two handlers under one tool
    /// name in one namespace are refused until one is renamed (or the old one forgotten).
    Tools {
        #[command(subcommand)]
        action: Option<ToolsAction>,
    },
}

#[derive(Subcommand, Debug)]
enum ToolsAction {
    /// Forgets the handlers recorded for a tool, after one was moved or renamed in code (so its
    /// new path is not refused as a second handler). Servers still running record theirs again
    /// at their next call.
    Forget {
        /// The namespace (the server's package name, or its `Idem::builder(…).namespace(…)`).
        namespace: String,
        /// The tool's name.
        tool: String,
    },
}

/// The state `idem pending --state` lists.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PendingState {
    /// The outcome is unknown: check the downstream system, then resolve.
    Unknown,
    /// Claimed and not settled: alive, or its holder died (a lapsed lease).
    InProgress,
}

fn parse_age(text: &str) -> Result<Duration, String> {
    parse_window(text).map_err(|error| error.to_string().replacen("invalid window", "invalid age", 1))
}

/// An operation: its address (as `idem pending` and `idem show` print it) and its tenant.
#[derive(Args, Debug)]
struct Target {
    /// The operation's address, `<ref>@<window end>`, as `idem pending` and `idem show` print
    /// it: no other operation has it. `show` also takes a ref alone (`ref` in the tool's answer
    /// or in `_meta["dev.idem/outcome"]`) for the current operation of its key.
    #[arg(value_name = "OPERATION")]
    reference: String,
    /// The tenant the operation was made in (the caller's tenant; `local` for a stdio server).
    #[arg(long)]
    tenant: String,
}

/// A failure, with what to do about it and the exit status it gives.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), code: 1 }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fail(&Failure::new(format!("cannot start: {error}")), cli.json),
    };
    if let Command::Probe(args) = &cli.command {
        return match runtime.block_on(probe::run(args, cli.json)) {
            Ok((out, any_false)) => {
                println!("{out}");
                if any_false { ExitCode::from(1) } else { ExitCode::SUCCESS }
            }
            Err(message) => fail(&Failure { message, code: 2 }, cli.json),
        };
    }
    match runtime.block_on(run(&cli)) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(failure) => fail(&failure, cli.json),
    }
}

fn fail(failure: &Failure, json: bool) -> ExitCode {
    if json {
        println!("{}", json!({ "error": failure.message, "exit": failure.code }));
    }
    eprintln!("idem: error: {}", failure.message);
    ExitCode::from(failure.code)
}

/// The ledger an operator points at: a SQL one or a Redis one, as the URL says.
enum Opened {
    Sql(SeaOrmLedger),
    Redis(RedisLedger),
}

impl Opened {
    async fn open(url: &str) -> Result<Self, LedgerError> {
        if is_redis_url(url) {
            Ok(Self::Redis(RedisLedger::connect(url).await?))
        } else {
            Ok(Self::Sql(SeaOrmLedger::connect_existing(url).await?))
        }
    }

    async fn holds_ledger(&self) -> Result<bool, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.holds_ledger().await,
            Self::Redis(ledger) => ledger.holds_ledger().await,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Sql(ledger) => ledger.describe(),
            Self::Redis(ledger) => format!("idem ledger: redis at {}", ledger.place()),
        }
    }

    async fn tool_owners_all(&self) -> Result<Vec<ToolOwner>, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.tool_owners_all().await,
            Self::Redis(ledger) => ledger.tool_owners_all().await,
        }
    }

    async fn forget_tool_owners(&self, namespace: &str, tool: &str) -> Result<u64, LedgerError> {
        match self {
            Self::Sql(ledger) => ledger.forget_tool_owners(namespace, tool).await,
            Self::Redis(ledger) => ledger.forget_tool_owners(namespace, tool).await,
        }
    }

    fn shared(&self) -> std::sync::Arc<dyn Ledger> {
        match self {
            Self::Sql(ledger) => std::sync::Arc::new(ledger.clone()),
            Self::Redis(ledger) => std::sync::Arc::new(ledger.clone()),
        }
    }
}

async fn run(cli: &Cli) -> Result<String, Failure> {
    let url = cli.database_url.as_deref().map(str::trim).filter(|url| !url.is_empty()).ok_or_else(|| {
        Failure::new(format!(
            "no ledger given: set {DATABASE_URL_ENV} (or pass --database-url) to the URL the servers use, \
             e.g. postgres://user@host/db, redis://host:6379 or the SQLite file's path"
        ))
    })?;
    let file = if is_redis_url(url) { None } else { sqlite_file(url)? };
    // As it is: the operator's tool never creates a ledger (nor its tables) where it finds none.
    let ledger = Opened::open(url)
        .await
        .map_err(|error| Failure::new(format!("{error} (check {DATABASE_URL_ENV} or --database-url)")))?;
    if !ledger.holds_ledger().await.map_err(ledger_failure)? {
        return Err(Failure {
            message: format!(
                "no idem ledger in this database ({}): point {DATABASE_URL_ENV} or --database-url at the database \
                 the servers use (a server creates its tables when it starts; this tool never does)",
                ledger.describe()
            ),
            code: 3,
        });
    }
    let now = ledger.shared().now().await.map_err(ledger_failure)?;
    let now = now.unwrap_or_else(local_now);
    // Every statement is bounded by `--timeout` (a handle's ledger timeout is at most half its
    // lease: the lease is set to fit).
    let operator = |ledger: &Opened| {
        let timeout = cli.timeout.max(Duration::from_millis(1));
        Idem::builder(ledger.shared()).lease((timeout * 2).max(DEFAULT_LEASE)).ledger_timeout(timeout)
    };
    match &cli.command {
        Command::Probe(_) => unreachable!("`idem probe` needs no ledger and is run before it is opened"),
        Command::Stats => {
            let idem = built(operator(&ledger))?;
            let stats = idem.admin().stats().await.map_err(ledger_failure)?;
            Ok(if cli.json { stats_json(&stats).to_string() } else { stats_text(&stats, now) })
        }
        Command::Pending { state, tenant, older_than, limit, after } => {
            let idem = with_secret(operator(&ledger), file.as_deref())?;
            let mut filter = PendingFilter::new(usize::from(*limit));
            if let Some(state) = state {
                filter = filter.state(match state {
                    PendingState::Unknown => State::Unknown,
                    PendingState::InProgress => State::InProgress,
                });
            }
            if let Some(tenant) = tenant {
                filter = filter.tenant(tenant);
            }
            if let Some(age) = older_than {
                filter = filter.older_than(*age);
            }
            if let Some(cursor) = after {
                filter = filter.after(*cursor);
            }
            let page = idem.admin().pending(&filter).await.map_err(status_failure)?;
            Ok(if cli.json { pending_json(&page).to_string() } else { pending_text(&page) })
        }
        Command::Sweep { batch } => {
            let idem = built(operator(&ledger))?;
            // A bar on a terminal only: a script's stderr stays clean.
            let bar = if std::io::stderr().is_terminal() && !cli.json {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{spinner} swept {pos} expired records ({per_sec}, {elapsed})")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.enable_steady_tick(Duration::from_millis(120));
                bar
            } else {
                ProgressBar::hidden()
            };
            let swept = idem.admin().sweep_with(*batch, |total| bar.set_position(total as u64)).await;
            bar.finish_and_clear();
            let swept = swept.map_err(ledger_failure)?;
            Ok(if cli.json { json!({ "swept": swept }).to_string() } else { format!("swept {swept} expired records") })
        }
        Command::Tools { action: None } => {
            let owners = ledger.tool_owners_all().await.map_err(ledger_failure)?;
            Ok(if cli.json { tools_json(&owners).to_string() } else { tools_text(&owners, now) })
        }
        Command::Tools { action: Some(ToolsAction::Forget { namespace, tool }) } => {
            let forgotten = ledger.forget_tool_owners(namespace, tool).await.map_err(ledger_failure)?;
            Ok(if cli.json {
                json!({ "namespace": namespace, "tool": tool, "forgotten": forgotten }).to_string()
            } else {
                format!("forgot {forgotten} handler(s) of tool {tool} in namespace {namespace}")
            })
        }
        Command::Show(target) => {
            let idem = with_secret(operator(&ledger), file.as_deref())?;
            let report = idem.admin().inspect(&target.tenant, &target.reference).await.map_err(status_failure)?;
            let report = report.ok_or_else(|| not_found(target))?;
            let about = idem.admin().about(&report).await;
            Ok(if cli.json {
                report_json(&report, &about, &target.tenant).to_string()
            } else {
                report_text(&report, &about, target, now)
            })
        }
        Command::Resolve { target, completed, nothing_happened } => {
            let resolution = match (completed, nothing_happened) {
                (Some(text), _) => {
                    let value: Value = serde_json::from_str(text).map_err(|error| Failure {
                        message: format!(
                            "--completed takes the operation's result as JSON (quote a string: '\"done\"'): {error}"
                        ),
                        code: 2,
                    })?;
                    Resolution::completed(&value).map_err(|error| Failure::new(error.to_string()))?
                }
                (None, true) => Resolution::NothingHappened,
                (None, false) => {
                    return Err(Failure {
                        message: "say what happened, after checking the downstream system: --completed JSON (it \
                                  happened; JSON becomes the result every repeat gets) or --nothing-happened (it did \
                                  not; the next repeat runs the tool again)"
                            .to_owned(),
                        code: 2,
                    });
                }
            };
            let idem = with_secret(operator(&ledger), file.as_deref())?;
            // What the verdict is checked against, and what it replaces: said after it lands.
            let before = idem.admin().inspect(&target.tenant, &target.reference).await.ok().flatten();
            let about = match &before {
                Some(report) => idem.admin().about(report).await,
                None => About::default(),
            };
            idem.admin().resolve(&target.tenant, &target.reference, resolution).await.map_err(|error| match error {
                StatusError::Misfit { .. } => Failure { message: error.to_string(), code: 2 },
                StatusError::Ledger(LedgerError::NotFound) => not_found(target),
                StatusError::Ledger(LedgerError::NotResolvable { state }) => Failure {
                    message: format!(
                        "operation {} of tenant {} is {state}: only an unknown operation, or one in progress whose \
                         holder's lease has lapsed, can be resolved; a settled record is never overwritten{}",
                        target.reference,
                        target.tenant,
                        if state == State::InProgress {
                            " (its holder's lease is still live: the holder may be running, or may have died less \
                             than a lease ago; wait until the lease lapses — `idem show` says when — then look again)"
                        } else {
                            ""
                        },
                    ),
                    code: 4,
                },
                other => status_failure(other),
            })?;
            let verdict = if *nothing_happened { "nothing_happened" } else { "completed" };
            let corrected = before.as_ref().is_some_and(|report| report.state == State::Completed);
            let checked = about.facts.as_ref().is_some_and(|facts| facts.result_schema.is_some());
            let unchecked = if *nothing_happened || checked {
                ""
            } else {
                "\nnote: its tool declared no result shape, so the verdict was not checked: make sure it is the \
                 tool's result as the tool returns it (a repeat that cannot read it is refused as unreadable)"
            };
            Ok(if cli.json {
                json!({
                    "operation": target.reference,
                    "ref": target.reference.split('@').next(),
                    "tenant": target.tenant,
                    "resolved": verdict,
                    "corrected": corrected,
                    "checked": checked || *nothing_happened,
                })
                .to_string()
            } else if *nothing_happened {
                format!(
                    "resolved {} (tenant {}): nothing happened; the next repeat runs the tool again",
                    target.reference, target.tenant
                )
            } else if corrected {
                format!(
                    "corrected {} (tenant {}): its stored result was one no repeat could read; repeats now replay \
                     this result{unchecked}",
                    target.reference, target.tenant
                )
            } else {
                format!(
                    "resolved {} (tenant {}): completed; repeats now replay this result{unchecked}",
                    target.reference, target.tenant
                )
            })
        }
    }
}

/// `idem tools`: a table of namespace, tool, handler and when it was last seen; two handlers
/// of one tool are marked.
fn tools_text(owners: &[ToolOwner], now: u64) -> String {
    if owners.is_empty() {
        return "no tool recorded yet: servers record each tool's handler at its first call".to_owned();
    }
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(["NAMESPACE", "TOOL", "HANDLER", "LAST SEEN", ""]);
    for owner in owners {
        let shared =
            owners.iter().filter(|other| other.namespace == owner.namespace && other.tool == owner.tool).count();
        table.add_row([
            owner.namespace.clone(),
            owner.tool.clone(),
            owner.owner.clone(),
            relative(owner.seen_at, now),
            if shared > 1 { "two handlers: refused".to_owned() } else { String::new() },
        ]);
    }
    table.to_string()
}

fn tools_json(owners: &[ToolOwner]) -> Value {
    let owners: Vec<Value> = owners
        .iter()
        .map(|owner| {
            json!({ "namespace": owner.namespace, "tool": owner.tool, "handler": owner.owner, "seen_at": owner.seen_at })
        })
        .collect();
    json!({ "tools": owners })
}

/// The SQLite file `url` names, if it names one; refuses a file that does not exist (the tool
/// never creates a ledger: a typo would show an empty one) and an in-memory database.
fn sqlite_file(url: &str) -> Result<Option<PathBuf>, Failure> {
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
fn with_secret(idem: Builder, file: Option<&std::path::Path>) -> Result<Idem, Failure> {
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
fn built(idem: Builder) -> Result<Idem, Failure> {
    idem.build().map_err(|error| Failure::new(error.to_string()))
}

/// `--batch`: at least one record per statement.
fn batch_size(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => {
            Err("a sweep deletes at least 1 record per statement: give --batch 1 or more (default 1000)".to_owned())
        }
        Ok(batch) => Ok(batch),
        Err(_) => Err(format!("`{text}` is not a number of records: give --batch 1 or more (default 1000)")),
    }
}

fn not_found(target: &Target) -> Failure {
    Failure {
        message: format!(
            "no operation {} in tenant {}: check the ref and the tenant, and that {SECRET_ENV} is the servers' \
             secret — after a rotation, give the secret it was made under in IDEM_SECRET_PREVIOUS (a record may also \
             have been swept after its retention)",
            target.reference, target.tenant
        ),
        code: 3,
    }
}

fn ledger_failure(error: LedgerError) -> Failure {
    Failure::new(error.to_string())
}

fn status_failure(error: StatusError) -> Failure {
    match error {
        StatusError::Ref(error) => {
            Failure { message: format!("{error} (copy the ref from the tool's answer)"), code: 2 }
        }
        StatusError::Address(error) => {
            Failure { message: format!("{error}; `idem show REF --tenant T` prints the address"), code: 2 }
        }
        StatusError::Secret(error) => Failure::new(format!("{error}: set {SECRET_ENV} to the servers' secret")),
        other => Failure::new(other.to_string()),
    }
}

fn stats_json(stats: &LedgerStats) -> Value {
    json!({
        "in_progress": stats.in_progress,
        "lapsed_leases": stats.stale,
        "completed": stats.completed,
        "failed": stats.failed,
        "unknown": stats.unknown,
        "superseded": stats.superseded,
        "superseded_unknown": stats.superseded_unknown,
        "sweepable": stats.sweepable,
        "total": stats.total(),
        "oldest_unknown_ms": stats.oldest_unknown,
        "size_bytes": stats.size_bytes,
    })
}

fn stats_text(stats: &LedgerStats, now: u64) -> String {
    let oldest = stats.oldest_unknown.map_or_else(String::new, |at| format!(" (oldest claimed {})", ago(at, now)));
    let size = stats.size_bytes.map_or_else(|| "unknown".to_owned(), |bytes| format!("{bytes} bytes"));
    [
        format!("in progress  {} ({} with a lapsed lease)", stats.in_progress, stats.stale),
        format!("completed    {}", stats.completed),
        format!("failed       {}", stats.failed),
        format!("unknown      {}{oldest}", stats.unknown),
        format!("superseded   {} ({} unknown)", stats.superseded, stats.superseded_unknown),
        format!("sweepable    {}", stats.sweepable),
        format!("size         {size}"),
    ]
    .join("\n")
}

/// The operation's state as a word, with its lease: what an operator decides on.
fn state_word(operation: &PendingOperation) -> &'static str {
    match (operation.state, operation.lease_expired) {
        (State::Unknown, _) => "unknown",
        (_, true) => "holder dead",
        _ => "running",
    }
}

fn pending_json(page: &PendingPage) -> Value {
    let operations: Vec<Value> = page
        .operations
        .iter()
        .map(|operation| {
            let label = operation.label.as_ref();
            json!({
                "address": operation.address().to_string(),
                "ref": operation.reference.to_string(),
                "idempotency_key": operation.idempotency_key(),
                "tenant": label.map(|label| &label.tenant),
                "subject": label.and_then(|label| label.subject.as_ref()),
                "tool": label.map(|label| &label.tool),
                "state": operation.state.as_str(),
                // A fact about the lease, whatever the state: `lease_until_ms` is in the past.
                "lease_expired": operation.lease_until <= page.now,
                // In progress under a lapsed lease: what `pending` prints as "holder dead".
                "holder_dead": operation.lease_expired,
                "superseded": operation.superseded,
                "created_at_ms": operation.created_at,
                "age_ms": page.now.saturating_sub(operation.created_at),
                "window_end_ms": operation.window_end,
                "lease_until_ms": operation.lease_until,
                "expires_at_ms": operation.expires_at,
            })
        })
        .collect();
    json!({ "operations": operations, "next": page.next.map(|cursor| cursor.to_string()) })
}

fn pending_text(page: &PendingPage) -> String {
    if page.operations.is_empty() {
        return "no pending operations".to_owned();
    }
    let mut table = Table::new();
    table.load_preset(presets::NOTHING).set_header([
        "OPERATION",
        "TENANT",
        "SUBJECT",
        "TOOL",
        "STATE",
        "AGE",
        "LEASE",
        "FORWARDED KEY",
    ]);
    for operation in &page.operations {
        let label = operation.label.as_ref();
        let unknown = || "?".to_owned();
        let lease = match operation.state {
            State::InProgress if operation.lease_expired => {
                format!("lapsed {}", relative(operation.lease_until, page.now))
            }
            State::InProgress => format!("live, {} left", span(operation.lease_until.saturating_sub(page.now))),
            _ => "-".to_owned(),
        };
        let state = if operation.superseded {
            format!("{} (superseded)", state_word(operation))
        } else {
            state_word(operation).to_owned()
        };
        table.add_row([
            operation.address().to_string(),
            label.map_or_else(unknown, |label| label.tenant.clone()),
            label.map_or_else(unknown, |label| label.subject.clone().unwrap_or_else(|| "(tenant)".to_owned())),
            label.map_or_else(unknown, |label| label.tool.clone()),
            state,
            span(page.now.saturating_sub(operation.created_at)),
            lease,
            operation.idempotency_key(),
        ]);
    }
    let mut lines = vec![table.trim_fmt()];
    if page.operations.iter().any(|operation| operation.label.is_none()) {
        lines.push(
            "? = not recorded (an operation made before idem kept labels, or under a secret no longer given)"
                .to_owned(),
        );
    }
    if let Some(next) = page.next {
        lines.push(format!("more: idem pending --after {next} (with the same filters)"));
    }
    lines.push(
        "next: idem show OPERATION --tenant T; check the downstream system for the FORWARDED KEY, then \
         idem resolve OPERATION --tenant T --completed JSON | --nothing-happened"
            .to_owned(),
    );
    lines.join("\n")
}

/// The stored result as JSON (it is `{"ok": value}` or `{"err": …}`), or its bytes as text.
fn result_value(report: &StatusReport) -> Value {
    report.result.as_deref().map_or(Value::Null, |bytes| {
        serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
    })
}

fn report_json(report: &StatusReport, about: &About, tenant: &str) -> Value {
    let label = about.label.as_ref();
    let facts = about.facts.as_ref();
    json!({
        "tool": label.map(|label| label.tool.as_str()),
        "subject": label.and_then(|label| label.subject.as_deref()),
        "namespace": label.and_then(|label| label.namespace.as_deref()),
        "result_schema": facts.and_then(|facts| facts.result_schema.as_ref()),
        "expected_shape": facts.and_then(ToolFacts::expected_shape),
        "example": facts.and_then(ToolFacts::example),
        "stale": facts.map(|facts| facts.stale.as_str()),
        "address": report.address().to_string(),
        "ref": report.reference.to_string(),
        "idempotency_key": report.idempotency_key(),
        "tenant": tenant,
        "state": report.state.as_str(),
        "created_at_ms": report.created_at,
        "window_end_ms": report.window_end,
        "expires_at_ms": report.expires_at,
        "lease_expired": report.lease_expired,
        "superseded": report.superseded,
        "result": result_value(report),
    })
}

fn report_text(report: &StatusReport, about: &About, target: &Target, now: u64) -> String {
    let label = about.label.as_ref();
    let facts = about.facts.as_ref();
    let mut lines = vec![
        format!("operation   {}", report.address()),
        format!("ref         {}", report.reference),
        format!("forwarded   {} (the idempotency key its handler forwarded downstream)", report.idempotency_key()),
        format!("tool        {}", label.map_or("(not recorded)", |label| label.tool.as_str())),
        format!("tenant      {}", target.tenant),
        format!(
            "subject     {}",
            label.map_or("(not recorded)", |label| label.subject.as_deref().unwrap_or("(the whole tenant)"))
        ),
        format!("state       {}", report.state),
        format!("created     {}", when(report.created_at, now)),
        format!("window end  {}", when(report.window_end, now)),
        format!("expires     {}", when(report.expires_at, now)),
    ];
    if report.state == State::InProgress {
        let lease = if report.lease_expired {
            "lapsed: the holder is presumed dead"
        } else {
            "live: the holder is running, or died less than a lease ago (wait, then look again)"
        };
        lines.push(format!("lease       {lease}"));
    }
    if report.superseded {
        lines.push("superseded  yes: a newer operation with the same key replaced it after its window".to_owned());
    }
    if report.result.is_some() {
        lines.push(format!("result      {}", result_value(report)));
    }
    // What a --completed verdict must fit, and one that does.
    match (facts.and_then(ToolFacts::expected_shape), facts.and_then(ToolFacts::example)) {
        (Some(shape), example) => {
            lines.push(format!("expects     {shape}"));
            if let Some(example) = example {
                lines.push(format!("example     {example} (a --completed verdict of this shape)"));
            }
        }
        (None, _) => lines.push(
            "expects     anything: nothing is checked — no result shape is kept for its tool (an MCP tool whose \
             result type has no JSON Schema), so a --completed verdict is stored as given: give it exactly as the \
             tool returns its result, or every repeat is refused as unreadable"
                .to_owned(),
        ),
    }
    // A stored result that does not fit is one no repeat could read: a verdict may replace it.
    let unreadable = report.state == State::Completed
        && facts.is_some_and(|facts| {
            let stored = result_value(report);
            stored.get("ok").is_some_and(|value| facts.readable(value).is_err())
        });
    if unreadable {
        lines.push(format!(
            "next        its result does not fit the shape, so every repeat is refused as unreadable; give the right \
             one: idem resolve {} --tenant {} --completed JSON",
            report.address(),
            target.tenant
        ));
    } else if report.state == State::InProgress && facts.is_some_and(|facts| facts.stale == "reconcile") {
        lines.push(format!(
            "next        its tool asks the downstream (stale = \"reconcile\") at the next repeat after the lease \
             lapses; if that cannot tell, the operation becomes unknown: then idem resolve {} --tenant {} \
             --completed JSON | --nothing-happened",
            report.address(),
            target.tenant
        ));
    } else if report.state == State::InProgress && facts.is_some_and(ToolFacts::recovers_by_itself) {
        let stale = facts.map_or("", |facts| facts.stale.as_str());
        lines.push(format!(
            "next        nothing to do: its tool recovers a dead holder's operation by itself (stale = \"{stale}\"); the \
             next repeat after the lease lapses takes it over"
        ));
    } else if report.state == State::Unknown || report.lease_expired {
        lines.push(format!(
            "next        check the downstream system for the forwarded key, then: idem resolve {} --tenant {} --completed JSON | --nothing-happened",
            report.address(), target.tenant
        ));
    }
    lines.join("\n")
}

/// `at` as a UTC date and time, and how long ago (or from now) it is.
fn when(at: u64, now: u64) -> String {
    format!("{} ({})", utc(at), relative(at, now))
}

/// How long ago (or from now) `at` is, then its date and time.
fn ago(at: u64, now: u64) -> String {
    format!("{}, at {}", relative(at, now), utc(at))
}

fn relative(at: u64, now: u64) -> String {
    if at <= now { format!("{} ago", span(now - at)) } else { format!("in {}", span(at - now)) }
}

fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (civil-from-days, proleptic
/// Gregorian).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

fn local_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}
