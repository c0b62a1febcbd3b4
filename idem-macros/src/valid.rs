//! Validate: turn the parsed [`Args`] into a [`Recipe`] the expansion can trust.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Expr, Ident, LitBool, LitStr, Path};

use crate::attr::{Args, Ctxt};

/// The longest window accepted, in seconds (366 days), as in `idem_runtime::parse_window`.
const MAX_WINDOW_SECS: u64 = 366 * 24 * 3600;
/// The longest wait accepted, in seconds, as `idem_runtime::MAX_WAIT`.
const MAX_WAIT_SECS: u64 = 60;

/// A dotted argument path from `key`, `ignore` or `within`, with every segment spanned at the
/// string literal it came from, so rustc's errors about it land on the attribute.
pub struct ArgPath {
    pub text: String,
    pub segments: Vec<Ident>,
    pub span: Span,
}

/// What to do with a stale lease.
pub enum Stale {
    Takeover,
    Hold,
    Reconcile(Path),
}

/// Whether a client's own key joins the operation's identity.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ClientKey {
    Ignored,
    Optional,
    Required,
}

/// A validated `#[idempotent]` attribute.
pub struct Recipe {
    pub keys: Vec<ArgPath>,
    pub window_secs: Option<u64>,
    pub ignore: Vec<ArgPath>,
    pub stale: Stale,
    pub tenant_scope: bool,
    /// `within = "arg"`: the caller's scope narrowed to a task or conversation id argument.
    pub within: Option<ArgPath>,
    /// `task = true`: the tool may run as an MCP task; with its span when written.
    pub task: (bool, Option<Span>),
    pub inherent: Option<LitStr>,
    pub name: Option<LitStr>,
    /// Whether a replayed answer carries a line of text saying so (rmcp tools); with its span
    /// when written, for "only on an rmcp tool".
    pub replay_note: (bool, Option<Span>),
    /// `wait = "5s"`: how long a repeat waits for the operation in progress, in seconds.
    pub wait_secs: Option<u64>,
    /// Input-response paths that join the key (rmcp tools), with the span of the option.
    pub input_key: (Vec<String>, Option<Span>),
    /// Whether a continuation's `requestState` is accepted once (rmcp tools), with its span.
    pub single_use_state: (bool, Option<Span>),
    /// `client_key = "optional" | "required"`: the client's `_meta["idempotency-key"]` joins the
    /// key (rmcp tools), with its span.
    pub client_key: (ClientKey, Option<Span>),
    pub idem: Option<Expr>,
    pub caller: Option<Expr>,
    pub krate: Path,
}

const NEEDS_RECIPE: &str = "`#[idempotent]` needs a key recipe: `key = \"order_id\"` names the arguments that \
                            make two calls the same operation; `key = \"()\"` makes the call itself the operation \
                            (once per caller and window, for a tool without arguments); a naturally idempotent tool \
                            (an absolute write by id) says why instead: `inherent = \"sets the status by id\"`";

pub fn validate(cx: &mut Ctxt, args: Args) -> Recipe {
    let inherent = args.inherent.get().cloned();
    if let Some(reason) = &inherent {
        if reason.value().trim().is_empty() {
            cx.error(reason.span(), "`inherent` needs a written reason why repeating this tool is harmless");
        }
        let ledger_options = [
            ("key", args.key.span()),
            ("window", args.window.span()),
            ("ignore", args.ignore.span()),
            ("stale", args.stale.span()),
            ("reconcile", args.reconcile.span()),
            ("scope", args.scope.span()),
            ("within", args.within.span()),
            ("task", args.task.span()),
            ("replay_note", args.replay_note.span()),
            ("wait", args.wait.span()),
            ("input_key", args.input_key.span()),
            ("single_use_state", args.single_use_state.span()),
            ("client_key", args.client_key.span()),
        ];
        for (option, span) in ledger_options {
            if let Some(span) = span {
                cx.error(
                    span,
                    format!("`{option}` has no effect on an `inherent` tool, which uses no ledger; remove one of them"),
                );
            }
        }
    } else if !args.key.given() && !args.inherent.given() {
        cx.error(Span::call_site(), NEEDS_RECIPE);
    }
    let keys = args.key.get().map(|lit| key_list(cx, lit)).unwrap_or_default();
    let ignore = args.ignore.get().map(|lit| path_list(cx, lit, "ignore")).unwrap_or_default();
    for ignored in &ignore {
        if ignored.segments.len() > 1 {
            cx.error(ignored.span, format!("`ignore` takes top-level argument names; `{}` is a path", ignored.text));
        }
        if keys.iter().any(|key| key.segments[0] == ignored.segments[0]) {
            cx.error(
                ignored.span,
                format!("`{}` is part of the key and cannot be ignored; remove it from `ignore`", ignored.text),
            );
        }
    }
    let window_secs = args.window.get().and_then(|lit| window(cx, lit));
    let wait_secs = args.wait.get().and_then(|lit| wait(cx, lit));
    let stale = stale(cx, &args);
    let tenant_scope = match args.scope.get() {
        None => false,
        Some(lit) => match lit.value().as_str() {
            "caller" => false,
            "tenant" => true,
            other => {
                cx.error(
                    lit.span(),
                    format!(
                        "unknown scope `{other}`; use `\"caller\"` (tenant and subject, the default) or \
                         `\"tenant\"`, and `within = \"argument\"` to narrow to a task or conversation id"
                    ),
                );
                false
            }
        },
    };
    let within = args.within.get().and_then(|lit| {
        let mut paths = path_list(cx, lit, "within");
        if paths.len() > 1 {
            cx.error(lit.span(), "`within` names one argument that carries the task or conversation id");
        }
        paths.pop()
    });
    if tenant_scope && let Some(within) = &within {
        cx.error(within.span, "`within` narrows the caller's scope and cannot combine with `scope = \"tenant\"`");
    }
    let krate = args.krate.get().cloned().unwrap_or_else(|| syn::parse_quote!(::idem_runtime));
    Recipe {
        keys,
        window_secs,
        ignore,
        stale,
        tenant_scope,
        within,
        task: (args.task.get().is_some_and(LitBool::value), args.task.span()),
        inherent,
        name: args.name.get().cloned(),
        replay_note: (args.replay_note.get().is_none_or(LitBool::value), args.replay_note.span()),
        wait_secs,
        input_key: (args.input_key.get().map(|lit| input_paths(cx, lit)).unwrap_or_default(), args.input_key.span()),
        single_use_state: (args.single_use_state.get().is_some_and(LitBool::value), args.single_use_state.span()),
        client_key: (client_key(cx, &args), args.client_key.span()),
        idem: args.idem.get().cloned(),
        caller: args.caller.get().cloned(),
        krate,
    }
}

/// Reads `client_key = "optional" | "required"`.
fn client_key(cx: &mut Ctxt, args: &Args) -> ClientKey {
    let Some(lit) = args.client_key.get() else { return ClientKey::Ignored };
    match lit.value().as_str() {
        "optional" => ClientKey::Optional,
        "required" => ClientKey::Required,
        other => {
            cx.error(
                lit.span(),
                format!(
                    "unknown `client_key` mode `{other}`; use `\"required\"` (every call must send \
                     `_meta[\"idempotency-key\"]`) or `\"optional\"` (a key the client sends joins the operation)"
                ),
            );
            ClientKey::Ignored
        }
    }
}

/// Parses `input_key = "pick.content.amount, size.content.value"`: each a dotted path into the
/// client's `inputResponses` — the input request's id, then fields of its response — checked for
/// shape only (the responses are JSON, not a Rust type).
fn input_paths(cx: &mut Ctxt, lit: &LitStr) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for entry in lit.value().split(',') {
        let path = entry.trim();
        if path.is_empty() || path.split('.').any(|segment| segment.is_empty() || segment.contains(char::is_whitespace))
        {
            cx.error(
                lit.span(),
                format!(
                    "`{path}` in `input_key` is not a dotted path into the input responses; write the input \
                     request's id and then the fields of its response, e.g. `input_key = \"pick.content.amount\"`"
                ),
            );
        } else if paths.iter().any(|seen| seen == path) {
            cx.error(lit.span(), format!("`{path}` appears twice in `input_key`; name each path once"));
        } else {
            paths.push(path.to_owned());
        }
    }
    paths
}

fn key_list(cx: &mut Ctxt, lit: &LitStr) -> Vec<ArgPath> {
    // `()`: no argument is part of the key — the call itself is the operation, once per caller
    // (the recipe's scope) and window. Every argument still counts in the fingerprint.
    if lit.value().trim() == "()" {
        return Vec::new();
    }
    if lit.value().trim().is_empty() {
        cx.error(
            lit.span(),
            "the key is empty; name the arguments that make two calls the same operation, e.g. \
             `key = \"order_id\"` or `key = \"card, amount_cents\"` — or, for a tool without arguments, \
             `key = \"()\"`: once per caller and window",
        );
        return Vec::new();
    }
    path_list(cx, lit, "key")
}

/// Parses `"a, b.c"` into paths, reporting empty entries, non-identifiers and duplicates.
fn path_list(cx: &mut Ctxt, lit: &LitStr, option: &str) -> Vec<ArgPath> {
    let span = lit.span();
    let mut paths: Vec<ArgPath> = Vec::new();
    for entry in lit.value().split(',') {
        let text = entry.trim();
        if text.is_empty() {
            cx.error(span, format!("`{option}` has an empty name; separate argument names with single commas"));
            continue;
        }
        let mut segments = Vec::new();
        for segment in text.split('.') {
            match field_name(segment, span) {
                Some(ident) => segments.push(ident),
                None => {
                    cx.error(
                        span,
                        format!(
                            "`{text}` in `{option}` is not an argument name or a dotted path of field names \
                             (like `customer.id`)"
                        ),
                    );
                    segments.clear();
                    break;
                }
            }
        }
        if segments.is_empty() {
            continue;
        }
        // The serialised name: serde writes `r#type` as `type`.
        let text = segments.iter().map(|segment| segment.unraw().to_string()).collect::<Vec<_>>().join(".");
        let text = text.as_str();
        if paths.iter().any(|path| path.text == text) {
            cx.error(span, format!("`{text}` appears twice in `{option}`; name each argument once"));
            continue;
        }
        paths.push(ArgPath { text: text.to_owned(), segments, span });
    }
    paths
}

/// A field or argument name from a key path, located at the literal: `order_id`, or a keyword
/// written plainly (`type`) or raw (`r#type`), which becomes the raw identifier `r#type`.
/// `None` for anything that cannot name a field (and never a panic: `Ident::new` would).
///
/// The name resolves at the macro's mixed site, not at the literal: a misspelt field is then
/// reported at the literal ("no field `titel` on type `Ticket`") without rustc's "a field with a
/// similar name exists" fix, which would replace the whole literal with the bare field name
/// (`key = title`, dropping the quotes and the other names). Stable Rust cannot point into a
/// string literal (`Literal::subspan` is unstable), so no span makes that fix correct; the
/// price is that rustc then lists no available fields either (it lists only fields it may
/// suggest at the access's span).
fn field_name(segment: &str, literal: Span) -> Option<Ident> {
    let span = Span::mixed_site().located_at(literal);
    if segment.trim() != segment {
        return None;
    }
    let name = segment.strip_prefix("r#").unwrap_or(segment);
    if matches!(name, "" | "self" | "Self" | "super" | "crate" | "_") {
        return None;
    }
    if let Ok(mut ident) = syn::parse_str::<Ident>(name) {
        ident.set_span(span);
        return Some(ident);
    }
    let raw = syn::parse_str::<Ident>(&format!("r#{name}")).ok()?;
    Some(Ident::new_raw(&raw.unraw().to_string(), span))
}

/// `"<whole number><unit>"` as a count and the unit's seconds, as `window` is written.
fn count_and_unit(text: &str) -> Option<(u64, u64)> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    Some((digits.parse::<u64>().ok()?, unit_secs))
}

fn window(cx: &mut Ctxt, lit: &LitStr) -> Option<u64> {
    let text = lit.value();
    let accepted = "write a positive whole number followed by one unit: `s` seconds, `m` minutes, `h` hours or \
                    `d` days (e.g. \"30s\", \"15m\", \"24h\", \"7d\")";
    let Some((count, unit_secs)) = count_and_unit(&text) else {
        cx.error(lit.span(), format!("malformed window `{text}`; {accepted}"));
        return None;
    };
    if count == 0 {
        cx.error(
            lit.span(),
            format!(
                "a zero window makes every repeat a new operation; {accepted}, or remove `window` to keep \
                     records for the ledger's retention"
            ),
        );
        return None;
    }
    match count.checked_mul(unit_secs) {
        Some(secs) if secs <= MAX_WINDOW_SECS => Some(secs),
        _ => {
            cx.error(lit.span(), format!("window `{text}` is longer than 366 days; {accepted}"));
            None
        }
    }
}

/// `wait = "5s"`: written as a window is, from one second to a minute.
fn wait(cx: &mut Ctxt, lit: &LitStr) -> Option<u64> {
    let text = lit.value();
    let accepted = "write a whole number of seconds from 1 to 60 (e.g. \"5s\", \"30s\"), or \"1m\"";
    match count_and_unit(&text).map(|(count, unit_secs)| count.checked_mul(unit_secs)) {
        None => cx.error(lit.span(), format!("malformed wait `{text}`; {accepted}")),
        Some(Some(0)) => cx.error(
            lit.span(),
            format!("a zero wait never waits; {accepted}, or remove `wait` to answer \"in flight\" at once"),
        ),
        Some(Some(secs)) if secs <= MAX_WAIT_SECS => return Some(secs),
        Some(_) => cx.error(
            lit.span(),
            format!(
                "wait `{text}` is longer than a minute, longer than most clients keep a request open; {accepted}, \
                 and let the caller ask the status tool after that"
            ),
        ),
    }
    None
}

fn stale(cx: &mut Ctxt, args: &Args) -> Stale {
    let reconcile = args.reconcile.get().cloned();
    let Some(lit) = args.stale.get() else {
        return reconcile.map_or(Stale::Hold, Stale::Reconcile);
    };
    match (lit.value().as_str(), reconcile) {
        ("hold", None) => Stale::Hold,
        ("takeover", None) => Stale::Takeover,
        ("reconcile", Some(path)) => Stale::Reconcile(path),
        ("reconcile", None) => {
            cx.error(
                lit.span(),
                "`stale = \"reconcile\"` needs the function that asks the downstream: `reconcile = path::to::fn`",
            );
            Stale::Hold
        }
        ("hold" | "takeover", Some(path)) => {
            let span = args.reconcile.span().unwrap_or_else(|| syn::spanned::Spanned::span(&path));
            cx.error(span, "`reconcile` is only used with `stale = \"reconcile\"`; remove one of them");
            Stale::Hold
        }
        (other, _) => {
            cx.error(
                lit.span(),
                format!(
                    "unknown stale-lease policy `{other}`; use `\"takeover\"` (the downstream dedupes by the \
                     forwarded key), `\"hold\"` (report unknown until resolved) or `reconcile = path::to::fn`"
                ),
            );
            Stale::Hold
        }
    }
}
