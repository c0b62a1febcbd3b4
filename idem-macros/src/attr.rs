//! Parse: `#[idempotent(...)]` arguments into one small typed struct.
//!
//! Only syntax is checked here; what the values mean is checked in `valid.rs`. Every mistake is
//! recorded in the [`Ctxt`] so the user sees all of them at once.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::{Expr, LitBool, LitStr, Path};

/// Accumulates errors (as serde_derive's `Ctxt` does).
#[derive(Default)]
pub struct Ctxt {
    errors: Option<syn::Error>,
}

impl Ctxt {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(errors) => errors.combine(error),
            None => self.errors = Some(error),
        }
    }

    pub fn error(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub fn finish(self) -> Result<(), syn::Error> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// An attribute value that may be set once; a second `set` is an error on the second occurrence.
pub struct Attr<T> {
    name: &'static str,
    value: Option<(Span, T)>,
    /// Given, even if with a value that could not be read (already reported).
    given: bool,
}

impl<T> Attr<T> {
    const fn none(name: &'static str) -> Self {
        Self { name, value: None, given: false }
    }

    fn set(&mut self, span: Span, value: T) -> syn::Result<()> {
        if self.value.is_some() {
            return Err(syn::Error::new(span, format!("duplicate `{}` option; give it once", self.name)));
        }
        self.given = true;
        self.value = Some((span, value));
        Ok(())
    }

    /// Whether the option was written at all, so a bad value is not also reported as missing.
    pub const fn given(&self) -> bool {
        self.given
    }

    pub fn get(&self) -> Option<&T> {
        self.value.as_ref().map(|(_, value)| value)
    }

    pub fn span(&self) -> Option<Span> {
        self.value.as_ref().map(|(span, _)| *span)
    }
}

/// The accepted options, for the "unknown option" message.
pub const OPTIONS: &str = "`key`, `window`, `ignore`, `stale`, `reconcile`, `scope`, `within`, `task`, `inherent`, \
                           `name`, `replay_note`, `wait`, `input_key`, `single_use_state`, `client_key`, `idem`, \
                           `caller`, `crate`";

/// `#[idempotent(...)]` as written.
pub struct Args {
    pub key: Attr<LitStr>,
    pub window: Attr<LitStr>,
    pub ignore: Attr<LitStr>,
    pub stale: Attr<LitStr>,
    pub reconcile: Attr<Path>,
    pub scope: Attr<LitStr>,
    pub within: Attr<LitStr>,
    pub task: Attr<LitBool>,
    pub inherent: Attr<LitStr>,
    pub name: Attr<LitStr>,
    pub replay_note: Attr<LitBool>,
    pub wait: Attr<LitStr>,
    pub input_key: Attr<LitStr>,
    pub single_use_state: Attr<LitBool>,
    pub client_key: Attr<LitStr>,
    pub idem: Attr<Expr>,
    pub caller: Attr<Expr>,
    pub krate: Attr<Path>,
}

impl Args {
    fn new() -> Self {
        Self {
            key: Attr::none("key"),
            window: Attr::none("window"),
            ignore: Attr::none("ignore"),
            stale: Attr::none("stale"),
            reconcile: Attr::none("reconcile"),
            scope: Attr::none("scope"),
            within: Attr::none("within"),
            task: Attr::none("task"),
            inherent: Attr::none("inherent"),
            name: Attr::none("name"),
            replay_note: Attr::none("replay_note"),
            wait: Attr::none("wait"),
            input_key: Attr::none("input_key"),
            single_use_state: Attr::none("single_use_state"),
            client_key: Attr::none("client_key"),
            idem: Attr::none("idem"),
            caller: Attr::none("caller"),
            krate: Attr::none("crate"),
        }
    }
}

/// Parses the attribute's tokens, recording errors in `cx` and returning what could be read.
///
/// An unknown or repeated option, or a value of the wrong kind, is recorded and parsing goes on,
/// so the options after it are still read (and a `key` after a typo is not reported missing).
pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Args {
    let mut args = Args::new();
    let parser = syn::meta::parser(|meta| parse_one(cx, &mut args, &meta));
    if let Err(error) = syn::parse::Parser::parse2(parser, tokens) {
        cx.push(error);
    }
    args
}

fn parse_one(cx: &mut Ctxt, args: &mut Args, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    let span = meta.path.segments.first().map_or_else(Span::call_site, |s| s.ident.span());
    let Some(name) = meta.path.get_ident().map(ToString::to_string) else {
        cx.error(span, format!("unknown option; the options are {OPTIONS}"));
        return skip_value(meta);
    };
    let set = match name.as_str() {
        "key" => return set_string(cx, meta, span, &mut args.key),
        "window" => return set_string(cx, meta, span, &mut args.window),
        "ignore" => return set_string(cx, meta, span, &mut args.ignore),
        "stale" => return set_string(cx, meta, span, &mut args.stale),
        "scope" => return set_string(cx, meta, span, &mut args.scope),
        "within" => return set_string(cx, meta, span, &mut args.within),
        "task" => return set_task(cx, meta, span, &mut args.task),
        "inherent" => return set_string(cx, meta, span, &mut args.inherent),
        "name" => return set_string(cx, meta, span, &mut args.name),
        "replay_note" => return set_bool(cx, meta, span, &mut args.replay_note, false),
        "wait" => return set_string(cx, meta, span, &mut args.wait),
        "input_key" => return set_string(cx, meta, span, &mut args.input_key),
        "single_use_state" => return set_bool(cx, meta, span, &mut args.single_use_state, true),
        "client_key" => return set_string(cx, meta, span, &mut args.client_key),
        "reconcile" => args.reconcile.set(span, meta.value()?.parse()?),
        "idem" => args.idem.set(span, meta.value()?.parse()?),
        "caller" => args.caller.set(span, meta.value()?.parse()?),
        "crate" => args.krate.set(span, meta.value()?.parse()?),
        other => {
            cx.error(span, format!("unknown option `{other}`; the options are {OPTIONS}"));
            return skip_value(meta);
        }
    };
    if let Err(error) = set {
        cx.push(error);
    }
    Ok(())
}

/// Sets a string option from `option = "..."`; any other value is reported and skipped.
fn set_string(cx: &mut Ctxt, meta: &ParseNestedMeta<'_>, span: Span, attr: &mut Attr<LitStr>) -> syn::Result<()> {
    let literal = |lit| match lit {
        syn::Lit::Str(lit) => Some(lit),
        _ => None,
    };
    set_literal(cx, meta, span, attr, literal, "takes a string in double quotes: `{option} = \"...\"`")
}

/// Sets a boolean option from `option = true|false`; any other value is reported and skipped,
/// with `option = <example>` (the value that changes the default) as the accepted form.
fn set_bool(
    cx: &mut Ctxt,
    meta: &ParseNestedMeta<'_>,
    span: Span,
    attr: &mut Attr<LitBool>,
    example: bool,
) -> syn::Result<()> {
    let literal = |lit| match lit {
        syn::Lit::Bool(lit) => Some(lit),
        _ => None,
    };
    set_literal(cx, meta, span, attr, literal, &format!("takes `true` or `false`: `{{option}} = {example}`"))
}

/// Sets `task = true|false` (the tool may run as an MCP task). Before, `task = "arg"` narrowed
/// the key's scope to an argument; that is `within` now, and the old spelling says so.
const TASK_TAKES_A_BOOL: &str = "`task` takes `true` or `false`: `task = true` lets the tool run as an MCP task \
                                 (to key within a conversation or task id argument, write `within = \"...\"`)";

fn set_task(cx: &mut Ctxt, meta: &ParseNestedMeta<'_>, span: Span, attr: &mut Attr<LitBool>) -> syn::Result<()> {
    let literal = |lit| match lit {
        syn::Lit::Bool(lit) => Ok(lit),
        _ => Err(TASK_TAKES_A_BOOL.to_owned()),
    };
    let mut value = meta.value()?.parse::<Expr>()?;
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    attr.given = true;
    let accepted = match value {
        Expr::Lit(syn::ExprLit { lit, .. }) => {
            let at = syn::spanned::Spanned::span(&lit);
            literal(lit).map_err(|message| (at, message))
        }
        other => Err((syn::spanned::Spanned::span(&other), TASK_TAKES_A_BOOL.to_owned())),
    };
    match accepted {
        Ok(value) => {
            if let Err(error) = attr.set(span, value) {
                cx.push(error);
            }
        }
        Err((at, message)) => cx.error(at, message),
    }
    Ok(())
}

/// Sets an option from `option = <literal>` when `literal` accepts it; any other value is
/// reported (`expected`, with `{option}` standing for the option's name) and skipped.
fn set_literal<T>(
    cx: &mut Ctxt,
    meta: &ParseNestedMeta<'_>,
    span: Span,
    attr: &mut Attr<T>,
    literal: impl FnOnce(syn::Lit) -> Option<T>,
    expected: &str,
) -> syn::Result<()> {
    let mut value = meta.value()?.parse::<Expr>()?;
    // A `$key:literal` or `$key:expr` from `macro_rules!` arrives in an invisible group.
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    let accepted = match value {
        Expr::Lit(syn::ExprLit { lit, .. }) => {
            let span = syn::spanned::Spanned::span(&lit);
            literal(lit).ok_or(span)
        }
        other => Err(syn::spanned::Spanned::span(&other)),
    };
    match accepted {
        Ok(value) => {
            if let Err(error) = attr.set(span, value) {
                cx.push(error);
            }
        }
        Err(wrong) => {
            attr.given = true;
            let option = attr.name;
            cx.error(wrong, format!("`{option}` {}", expected.replace("{option}", option)));
        }
    }
    Ok(())
}

/// Consumes the value of an option that will not be used: `= expr`, `(...)`, or nothing.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        content.parse::<TokenStream>()?;
    }
    Ok(())
}
