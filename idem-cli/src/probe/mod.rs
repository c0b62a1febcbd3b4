//! `idem probe`: checks any MCP server's `idempotentHint` against its behaviour. It connects
//! over stdio or streamable HTTP, lists the tools, and for each tool that claims the hint (or is
//! named with `--tool`) repeats calls the way hosts do — one after another, several at once,
//! after a lost answer — and, where the tool advertises an idem recipe, sends the same key with
//! other arguments. It calls the real tools: point it at a sandbox or a staging server.
//!
//! `target.rs` is the connection, `arguments.rs` the arguments each probe sends, `probes.rs` the
//! probes and the effect oracle, `report.rs` the verdicts and their rendering.

mod arguments;
mod probes;
mod report;
mod target;

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use serde_json::{Map, Value};

use self::arguments::Source;
use self::probes::{Oracle, Probe};
use self::report::{Report, Skipped, ToolReport, Verdict};
use self::target::Target;

/// `idem probe` options.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Start the server with this command line and speak to it over stdio (a new process per
    /// session; the repeat after a lost answer SIGKILLs one).
    #[arg(long, value_name = "COMMAND", conflicts_with = "http", required_unless_present = "http")]
    stdio: Option<String>,
    /// An environment variable for the stdio server, `NAME=value` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The stdio server's working directory.
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// The server's streamable HTTP endpoint (`http://host:port/mcp`).
    #[arg(long, value_name = "URL")]
    http: Option<String>,
    /// A header for every HTTP request, `Name: value` (repeatable); `Authorization: Bearer …`
    /// authenticates.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Probe this tool, whatever its hint says (repeatable); by default every tool that claims
    /// `idempotentHint: true`.
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// Arguments per tool: a JSON object `{"tool": [{…}, …]}`; `{unique}` in a string becomes a
    /// fresh token for each probe.
    #[arg(long, value_name = "FILE")]
    fixtures: Option<String>,
    /// Generate arguments from each tool's `inputSchema` when the fixtures have none.
    #[arg(long)]
    generate: bool,
    /// A read-only tool whose answer counts the effects (a number, or a list's length).
    #[arg(long, value_name = "TOOL", conflicts_with = "count_cmd")]
    count_with: Option<String>,
    /// The arguments of the `--count-with` tool, as a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    count_args: String,
    /// A shell command whose output counts (or shows) the effects.
    #[arg(long, value_name = "COMMAND")]
    count_cmd: Option<String>,
    /// Identical calls sent at once by the concurrent repeat.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(2..=256))]
    concurrency: u16,
    /// How long after sending a call its session is cut, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 150)]
    cut_after_ms: u64,
    /// How long a repeat after a lost answer may be told "in flight" before it counts.
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    settle_s: u64,
}

/// Exit status: 0 no hint was found false; 1 a hint is false; 2 a usage error or the server
/// could not be reached.
pub async fn run(args: &ProbeArgs, json: bool) -> Result<(String, bool), String> {
    let target = target_of(args)?;
    let fixtures = match &args.fixtures {
        Some(path) => arguments::read_fixtures(path)?,
        None => BTreeMap::new(),
    };
    let oracle = oracle_of(args)?;
    eprintln!(
        "idem probe: this CALLS THE REAL TOOLS of {} — several times each, at once, and with \
         connections cut mid-call. Point it at a sandbox or a staging server, never production.",
        target.describe()
    );
    let mut session = target.connect().await?;
    let tools = session.tools().await?;
    for named in &args.tools {
        if !tools.iter().any(|tool| tool.name == named.as_str()) {
            return Err(format!("the server lists no tool `{named}`"));
        }
    }
    if let Some(Oracle::Tool { name, .. }) = &oracle
        && !tools.iter().any(|tool| tool.name == name.as_str())
    {
        return Err(format!("the server lists no tool `{name}` to count effects with (--count-with)"));
    }
    let mut report = Report {
        server: target.describe(),
        oracle: oracle.as_ref().map(Oracle::describe),
        tools: Vec::new(),
        skipped: Vec::new(),
    };
    for tool in &tools {
        let name = tool.name.to_string();
        let hint = tool.annotations.as_ref().and_then(|a| a.idempotent_hint) == Some(true);
        if !(args.tools.contains(&name) || args.tools.is_empty() && hint) {
            continue;
        }
        if let Some(Oracle::Tool { name: oracle, .. }) = &oracle
            && *oracle == name
        {
            report.skipped.push(Skipped { tool: name, why: "it is the oracle".to_owned() });
            continue;
        }
        let source = match fixtures.get(&name) {
            Some(list) => Source::Fixtures(list.clone()),
            None if args.generate => Source::Generated(Value::Object((*tool.input_schema).clone())),
            None => {
                let why = "no arguments: add it to --fixtures, or pass --generate".to_owned();
                report.skipped.push(Skipped { tool: name, why });
                continue;
            }
        };
        let recipe = tool.meta.as_ref().and_then(|meta| meta.get("dev.idem/recipe")).cloned();
        let mut probe = Probe {
            target: &target,
            session: &mut session,
            tool: &name,
            oracle: oracle.as_ref(),
            concurrency: usize::from(args.concurrency),
            cut_after: Duration::from_millis(args.cut_after_ms),
            settle: Duration::from_secs(args.settle_s),
        };
        let mut findings = Vec::new();
        let mut turn = 0;
        let mut next = || {
            turn += 1;
            source.next(turn - 1)
        };
        let (first, fresh) = next();
        findings.push(probe.sequential(&first).await);
        findings.push(probe.concurrent(&next().0).await);
        findings.push(probe.after_lost_answer(&next().0).await);
        if let Some(key) = recipe.as_ref().and_then(|recipe| recipe.get("key")).and_then(Value::as_array) {
            let key: Vec<String> = key.iter().filter_map(Value::as_str).map(str::to_owned).collect();
            findings.push(probe.different_arguments(&next().0, &key).await);
        }
        if !fresh {
            for finding in &mut findings[1..] {
                finding.evidence.push_str(
                    " (the arguments hold no {unique}: this probe repeated an operation an earlier probe started)",
                );
            }
        }
        let mut tool_report =
            ToolReport { tool: name, hint_claimed: hint, recipe, findings, verdict: Verdict::CannotTell };
        tool_report.conclude();
        report.tools.push(tool_report);
    }
    let out =
        if json { serde_json::to_string_pretty(&report).map_err(|error| error.to_string())? } else { report.text() };
    Ok((out, report.any_false()))
}

fn target_of(args: &ProbeArgs) -> Result<Target, String> {
    if let Some(command) = &args.stdio {
        let mut words = shell_words(command)?.into_iter();
        let program = words.next().ok_or("--stdio needs a command, e.g. --stdio \"npx -y some-mcp-server\"")?;
        let env = args
            .env
            .iter()
            .map(|pair| {
                pair.split_once('=')
                    .map(|(name, value)| (name.to_owned(), value.to_owned()))
                    .ok_or_else(|| format!("--env {pair}: write NAME=value"))
            })
            .collect::<Result<_, _>>()?;
        return Ok(Target::Stdio { program, args: words.collect(), env, cwd: args.cwd.clone() });
    }
    let url = args.http.clone().ok_or("give the server: --stdio COMMAND or --http URL")?;
    let mut bearer = None;
    let mut headers = Vec::new();
    for header in &args.headers {
        let (name, value) = header.split_once(':').ok_or_else(|| format!("--header {header}: write `Name: value`"))?;
        let (name, value) = (name.trim(), value.trim());
        match value.strip_prefix("Bearer ") {
            Some(token) if name.eq_ignore_ascii_case("authorization") => bearer = Some(token.to_owned()),
            _ => headers.push((name.to_owned(), value.to_owned())),
        }
    }
    Ok(Target::Http { url, bearer, headers })
}

fn oracle_of(args: &ProbeArgs) -> Result<Option<Oracle>, String> {
    if let Some(command) = &args.count_cmd {
        return Ok(Some(Oracle::Command(command.clone())));
    }
    let Some(name) = &args.count_with else { return Ok(None) };
    let arguments: Map<String, Value> = serde_json::from_str(&args.count_args)
        .map_err(|error| format!("--count-args must be a JSON object: {error}"))?;
    Ok(Some(Oracle::Tool { name: name.clone(), arguments }))
}

/// Splits a command line as a POSIX shell would for plain words and quotes (no expansions).
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let (mut words, mut word, mut quote, mut started) = (Vec::new(), String::new(), None::<char>, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => word.extend(chars.next()),
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, '\\') => {
                word.extend(chars.next());
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("--stdio {line}: a quote is not closed"));
    }
    if started {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_command_line_splits_like_a_shell() {
        assert_eq!(
            super::shell_words(r#"node "my server.js" --flag='a b' x\ y"#).unwrap(),
            ["node", "my server.js", "--flag=a b", "x y"]
        );
        assert!(super::shell_words("node 'open").is_err());
    }
}
