//! The probes: the repeats a host makes of a tool it believes idempotent — one after another,
//! several at once, after a lost answer — and, for a tool that advertises its key, the same key
//! with other arguments. Each compares answers after removing the declared replay markers, and
//! counts effects with the oracle when there is one.

use std::time::Duration;

use serde_json::{Map, Value};

use super::report::{Finding, Verdict};
use super::target::{Answer, Session, Target, call};

/// What tells an effect happened: a read-only tool's answer, or a command's output.
pub enum Oracle {
    Tool { name: String, arguments: Map<String, Value> },
    Command(String),
}

/// One reading of the oracle: a count when the output is one (a number, or a list's length),
/// and the output itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    count: Option<u64>,
    output: String,
}

/// How far the oracle moved between two readings.
enum Moved {
    By(u64),
    /// It changed, but it is not a count.
    Changed,
    Unchanged,
}

fn moved(before: &Reading, after: &Reading) -> Moved {
    match (before.count, after.count) {
        (Some(a), Some(b)) => Moved::By(b.saturating_sub(a)),
        _ if before.output == after.output => Moved::Unchanged,
        _ => Moved::Changed,
    }
}

impl Oracle {
    pub fn describe(&self) -> String {
        match self {
            Self::Tool { name, arguments } => format!("the tool {name} {}", Value::Object(arguments.clone())),
            Self::Command(command) => format!("the command `{command}`"),
        }
    }

    async fn read(&self, session: &Session) -> Result<Reading, String> {
        let output = match self {
            Self::Tool { name, arguments } => {
                let answer = call(&session.peer(), name, arguments).await?;
                if answer.get("isError") == Some(&Value::Bool(true)) {
                    return Err(format!("the oracle {name} answered an error: {}", text_of(&answer)));
                }
                match answer.get("structuredContent") {
                    Some(structured) if !structured.is_null() => structured.to_string(),
                    _ => text_of(&answer),
                }
            }
            Self::Command(command) => {
                let out = tokio::process::Command::new("sh")
                    .args(["-c", command])
                    .output()
                    .await
                    .map_err(|error| format!("the oracle command could not run: {error}"))?;
                if !out.status.success() {
                    return Err(format!("the oracle command failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
                }
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            }
        };
        Ok(Reading { count: count_of(&output), output })
    }
}

/// A count in an oracle's output: a number, a list's length, or the length of an object's one
/// list member.
fn count_of(output: &str) -> Option<u64> {
    if let Ok(number) = output.trim().parse::<u64>() {
        return Some(number);
    }
    match serde_json::from_str::<Value>(output).ok()? {
        Value::Number(number) => number.as_u64(),
        Value::Array(items) => Some(items.len() as u64),
        Value::Object(object) => {
            let mut lists = object.values().filter_map(Value::as_array);
            match (lists.next(), lists.next()) {
                (Some(list), None) => Some(list.len() as u64),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The text blocks of an answer, joined.
pub fn text_of(answer: &Value) -> String {
    let blocks = answer.get("content").and_then(Value::as_array).into_iter().flatten();
    blocks.filter_map(|block| block.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(" ")
}

/// The replay note idem adds to a replayed result (`idem_runtime::mcp::wire::replay_note`).
const IDEM_REPLAY_NOTE: &str = "(idem: this is the stored result of an earlier identical call";

/// An answer with its declared replay markers removed: `_meta` (idem's `dev.idem/outcome`
/// says fresh or replayed, and names the ref) and idem's replay note.
fn comparable(answer: &Value) -> Value {
    let mut answer = answer.clone();
    if let Some(object) = answer.as_object_mut() {
        object.remove("_meta");
        object.remove("resultType");
        if let Some(Value::Array(blocks)) = object.get_mut("content") {
            blocks.retain(|block| {
                !block.get("text").and_then(Value::as_str).is_some_and(|t| t.starts_with(IDEM_REPLAY_NOTE))
            });
        }
    }
    answer
}

fn is_error(answer: &Value) -> bool {
    answer.get("isError") == Some(&Value::Bool(true))
}

/// idem's refusal code (`_meta["dev.idem/outcome"].code`), if the answer is one.
fn idem_code(answer: &Value) -> Option<&str> {
    answer.get("_meta")?.get("dev.idem/outcome")?.get("code")?.as_str()
}

fn short(answer: &Value) -> String {
    let text = text_of(answer);
    let text = if text.is_empty() { comparable(answer).to_string() } else { text };
    let mut short: String = text.chars().take(90).collect();
    if text.chars().count() > 90 {
        short.push('…');
    }
    short
}

fn protocol_error(probe: &'static str, error: &str) -> Finding {
    Finding { probe, verdict: Verdict::CannotTell, evidence: format!("the call failed: {error}") }
}

/// What the probes share: where the server is, the tool, and the oracle.
pub struct Probe<'a> {
    pub target: &'a Target,
    pub session: &'a mut Session,
    pub tool: &'a str,
    pub oracle: Option<&'a Oracle>,
    pub concurrency: usize,
    pub cut_after: Duration,
    pub settle: Duration,
}

impl Probe<'_> {
    async fn reading(&self) -> Option<Result<Reading, String>> {
        match self.oracle {
            Some(oracle) => Some(oracle.read(self.session).await),
            None => None,
        }
    }

    /// The same call twice: the second answer must be the first's, and must not move the oracle.
    pub async fn sequential(&mut self, arguments: &Map<String, Value>) -> Finding {
        const PROBE: &str = "sequential_repeat";
        let peer = self.session.peer();
        let first = match call(&peer, self.tool, arguments).await {
            Ok(answer) => answer,
            Err(error) => return protocol_error(PROBE, &error),
        };
        let middle = self.reading().await;
        let second = match call(&peer, self.tool, arguments).await {
            Ok(answer) => answer,
            Err(error) => return protocol_error(PROBE, &error),
        };
        let after = self.reading().await;
        if is_error(&first) && is_error(&second) {
            return Finding {
                probe: PROBE,
                verdict: Verdict::CannotTell,
                evidence: format!(
                    "the tool refused the arguments both times ({}); give fixtures it accepts",
                    short(&first)
                ),
            };
        }
        if comparable(&first) != comparable(&second) {
            return Finding {
                probe: PROBE,
                verdict: Verdict::False,
                evidence: format!(
                    "the repeat answered differently: first “{}”, then “{}”",
                    short(&first),
                    short(&second)
                ),
            };
        }
        match (middle, after) {
            (Some(Ok(middle)), Some(Ok(after))) => match moved(&middle, &after) {
                Moved::By(0) | Moved::Unchanged => Finding {
                    probe: PROBE,
                    verdict: Verdict::Holds,
                    evidence: format!("same answer; the oracle did not move on the repeat ({})", middle.output_short()),
                },
                Moved::By(n) => Finding {
                    probe: PROBE,
                    verdict: Verdict::False,
                    evidence: format!("same answer, but the repeat moved the oracle by {n}: a second effect"),
                },
                Moved::Changed => Finding {
                    probe: PROBE,
                    verdict: Verdict::False,
                    evidence: "same answer, but the oracle changed on the repeat: a second effect".to_owned(),
                },
            },
            (Some(Err(error)), _) | (_, Some(Err(error))) => {
                Finding { probe: PROBE, verdict: Verdict::CannotTell, evidence: format!("same answer; {error}") }
            }
            _ => Finding {
                probe: PROBE,
                verdict: Verdict::Holds,
                evidence: "same answer (no oracle: a second effect behind the same answer would not show)".to_owned(),
            },
        }
    }

    /// `concurrency` identical calls at once: the successful answers must agree, and the oracle
    /// move by at most one.
    pub async fn concurrent(&mut self, arguments: &Map<String, Value>) -> Finding {
        const PROBE: &str = "concurrent_repeat";
        let before = self.reading().await;
        let peer = self.session.peer();
        let calls = (0..self.concurrency).map(|_| {
            let peer = peer.clone();
            let (tool, arguments) = (self.tool.to_owned(), arguments.clone());
            tokio::spawn(async move { call(&peer, &tool, &arguments).await })
        });
        let mut answers: Vec<Answer> = Vec::new();
        for handle in calls.collect::<Vec<_>>() {
            answers.push(handle.await.unwrap_or_else(|error| Err(error.to_string())));
        }
        let after = self.reading().await;
        let succeeded: Vec<&Value> = answers.iter().flatten().filter(|answer| !is_error(answer)).collect();
        let refused: Vec<String> = answers
            .iter()
            .flatten()
            .filter(|answer| is_error(answer))
            .map(|answer| idem_code(answer).map_or_else(|| short(answer), str::to_owned))
            .collect();
        let failed = answers.iter().filter(|answer| answer.is_err()).count();
        let tally =
            format!("{} answered, {} refused {:?}, {failed} failed", succeeded.len(), refused.len(), dedup(&refused));
        let Some(first) = succeeded.first() else {
            return Finding {
                probe: PROBE,
                verdict: Verdict::CannotTell,
                evidence: format!("no call succeeded: {tally}"),
            };
        };
        if let Some(other) = succeeded.iter().find(|answer| comparable(answer) != comparable(first)) {
            return Finding {
                probe: PROBE,
                verdict: Verdict::False,
                evidence: format!("{tally}; the answers differ: “{}” and “{}”", short(first), short(other)),
            };
        }
        let said = format!("{tally}; same answers");
        at_most_one(PROBE, before, after, &said, "", "it ran more than once")
    }

    /// A call whose answer is lost (the session is cut while it runs), repeated in a new
    /// session: it must give one answer, and the oracle move by at most one.
    pub async fn after_lost_answer(&mut self, arguments: &Map<String, Value>) -> Finding {
        const PROBE: &str = "repeat_after_lost_answer";
        let before = self.reading().await;
        let peer = self.session.peer();
        let (tool, args) = (self.tool.to_owned(), arguments.clone());
        let first = tokio::spawn(async move { call(&peer, &tool, &args).await });
        tokio::time::sleep(self.cut_after).await;
        let answered_first = first.is_finished();
        self.session.cut();
        first.abort();
        *self.session = match self.target.connect().await {
            Ok(session) => session,
            Err(error) => {
                return Finding {
                    probe: PROBE,
                    verdict: Verdict::CannotTell,
                    evidence: format!("no new session: {error}"),
                };
            }
        };
        let peer = self.session.peer();
        // The repeat: while the first is still held ("in flight"), ask again, as a host would.
        let deadline = tokio::time::Instant::now() + self.settle;
        let repeat = loop {
            match call(&peer, self.tool, arguments).await {
                Ok(answer) if idem_code(&answer) == Some("in_flight") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(answer) => break answer,
                Err(error) => return protocol_error(PROBE, &error),
            }
        };
        let again = match call(&peer, self.tool, arguments).await {
            Ok(answer) => answer,
            Err(error) => return protocol_error(PROBE, &error),
        };
        let after = self.reading().await;
        let how = if answered_first {
            format!("the first call answered within {} ms, before the cut; ", self.cut_after.as_millis())
        } else {
            format!("cut {} ms into the call; ", self.cut_after.as_millis())
        };
        if comparable(&repeat) != comparable(&again) {
            return Finding {
                probe: PROBE,
                verdict: Verdict::False,
                evidence: format!("{how}the repeats disagree: “{}”, then “{}”", short(&repeat), short(&again)),
            };
        }
        let said = match idem_code(&repeat) {
            Some(code) => format!("the repeat was refused `{code}`"),
            None if is_error(&repeat) => format!("the repeat answered an error “{}”", short(&repeat)),
            None => "the repeat answered and a further repeat agreed".to_owned(),
        };
        at_most_one(PROBE, before, after, &format!("{how}{said}"), " in all", "the lost call ran again")
    }

    /// The same key with another argument outside it (a tool that advertises its key): a
    /// conflict, not a replay of the first call and not a second operation.
    pub async fn different_arguments(&mut self, arguments: &Map<String, Value>, key: &[String]) -> Finding {
        const PROBE: &str = "different_arguments";
        let Some((member, varied)) = super::arguments::vary_outside(arguments, key) else {
            return Finding {
                probe: PROBE,
                verdict: Verdict::CannotTell,
                evidence: "every argument is part of the key: nothing to vary".to_owned(),
            };
        };
        let peer = self.session.peer();
        let first = match call(&peer, self.tool, arguments).await {
            Ok(answer) => answer,
            Err(error) => return protocol_error(PROBE, &error),
        };
        if is_error(&first) {
            return Finding {
                probe: PROBE,
                verdict: Verdict::CannotTell,
                evidence: format!("the first call was refused ({})", short(&first)),
            };
        }
        let other = match call(&peer, self.tool, &varied).await {
            Ok(answer) => answer,
            Err(error) => return protocol_error(PROBE, &error),
        };
        match idem_code(&other) {
            Some("conflict") => Finding {
                probe: PROBE,
                verdict: Verdict::Holds,
                evidence: format!("`{member}` changed under the same key: refused as a conflict"),
            },
            _ if comparable(&other) == comparable(&first) => Finding {
                probe: PROBE,
                verdict: Verdict::False,
                evidence: format!("`{member}` changed under the same key, and the first call's answer was replayed"),
            },
            _ if is_error(&other) => Finding {
                probe: PROBE,
                verdict: Verdict::CannotTell,
                evidence: format!("`{member}` changed: refused, but not as a conflict ({})", short(&other)),
            },
            _ => Finding {
                probe: PROBE,
                verdict: Verdict::False,
                evidence: format!(
                    "`{member}` changed under the same key, and it ran as another operation: “{}”",
                    short(&other)
                ),
            },
        }
    }
}

/// The oracle's verdict for a probe that allows at most one effect between `before` and `after`
/// (`said`: what the answers showed; `scope` follows the count; `twice`: what more than one means).
fn at_most_one(
    probe: &'static str,
    before: Option<Result<Reading, String>>,
    after: Option<Result<Reading, String>>,
    said: &str,
    scope: &str,
    twice: &str,
) -> Finding {
    let (verdict, evidence) = match (before, after) {
        (Some(Ok(before)), Some(Ok(after))) => match moved(&before, &after) {
            Moved::By(n) if n <= 1 => (Verdict::Holds, format!("{said}; the oracle moved by {n}{scope}")),
            Moved::By(n) => (Verdict::False, format!("{said}; but the oracle moved by {n}{scope}: {twice}")),
            Moved::Unchanged => (Verdict::Holds, format!("{said}; the oracle did not move")),
            Moved::Changed => (Verdict::CannotTell, format!("{said}; the oracle changed but is not a count")),
        },
        (Some(Err(error)), _) | (_, Some(Err(error))) => (Verdict::CannotTell, format!("{said}; {error}")),
        _ => (Verdict::CannotTell, format!("{said}; without an oracle a second run would not show")),
    };
    Finding { probe, verdict, evidence }
}

impl Reading {
    fn output_short(&self) -> String {
        self.count.map_or_else(|| "its output unchanged".to_owned(), |count| format!("count {count}"))
    }
}

fn dedup(items: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}
