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

mod open;
mod output;
mod probe;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem_runtime::ledger::{DATABASE_URL_ENV, is_redis_url};
use idem_runtime::secret::SECRET_ENV;
use idem_runtime::{
    Idem, StatusError, admin::About, admin::PendingCursor, admin::PendingFilter, ledger::LedgerError,
    ledger::Resolution, ledger::State, recipe::parse_window, settings::DEFAULT_LEASE,
};
use indicatif::{ProgressBar, ProgressStyle};
use open::{Opened, built, sqlite_file, with_secret};
use output::{pending_json, pending_text, report_json, report_text, stats_json, stats_text, tools_json, tools_text};
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

fn local_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}
