//! What each command prints: a text table or lines for a person, one JSON object for a script
//! (`--json`), and times as an operator reads them.

use comfy_table::{Table, presets};
use idem_runtime::ledger::ToolOwner;
use idem_runtime::{
    admin::About, admin::PendingOperation, admin::PendingPage, admin::ToolFacts, ledger::LedgerStats, ledger::State,
    ledger::StatusReport,
};
use serde_json::{Value, json};

use super::Target;

/// `idem tools`: a table of namespace, tool, handler and when it was last seen; two handlers
/// of one tool are marked.
pub(super) fn tools_text(owners: &[ToolOwner], now: u64) -> String {
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

pub(super) fn tools_json(owners: &[ToolOwner]) -> Value {
    let owners: Vec<Value> = owners
        .iter()
        .map(|owner| {
            json!({ "namespace": owner.namespace, "tool": owner.tool, "handler": owner.owner, "seen_at": owner.seen_at })
        })
        .collect();
    json!({ "tools": owners })
}

pub(super) fn stats_json(stats: &LedgerStats) -> Value {
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

pub(super) fn stats_text(stats: &LedgerStats, now: u64) -> String {
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

pub(super) fn pending_json(page: &PendingPage) -> Value {
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

pub(super) fn pending_text(page: &PendingPage) -> String {
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

pub(super) fn report_json(report: &StatusReport, about: &About, tenant: &str) -> Value {
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

pub(super) fn report_text(report: &StatusReport, about: &About, target: &Target, now: u64) -> String {
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
