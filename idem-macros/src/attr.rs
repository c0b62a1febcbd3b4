//! Parse: `#[idempotent(...)]` arguments into one small typed struct.
//!
//! Only syntax is checked here; what the values mean is checked in `valid.rs`. Every mistake is
//! recorded in the [`Ctxt`] so the user sees all of them at once.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::{Expr, LitStr, Path};

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
}

impl<T> Attr<T> {
    const fn none(name: &'static str) -> Self {
        Self { name, value: None }
    }

    fn set(&mut self, span: Span, value: T) -> syn::Result<()> {
        if self.value.is_some() {
            return Err(syn::Error::new(span, format!("duplicate `{}` option; give it once", self.name)));
        }
        self.value = Some((span, value));
        Ok(())
    }

    pub fn get(&self) -> Option<&T> {
        self.value.as_ref().map(|(_, value)| value)
    }

    pub fn span(&self) -> Option<Span> {
        self.value.as_ref().map(|(span, _)| *span)
    }
}

/// The accepted options, for the "unknown option" message.
pub const OPTIONS: &str = "`key`, `window`, `ignore`, `stale`, `reconcile`, `scope`, `task`, `inherent`, `name`, \
                           `idem`, `caller`, `crate`";

/// `#[idempotent(...)]` as written.
pub struct Args {
    pub key: Attr<LitStr>,
    pub window: Attr<LitStr>,
    pub ignore: Attr<LitStr>,
    pub stale: Attr<LitStr>,
    pub reconcile: Attr<Path>,
    pub scope: Attr<LitStr>,
    pub task: Attr<LitStr>,
    pub inherent: Attr<LitStr>,
    pub name: Attr<LitStr>,
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
            task: Attr::none("task"),
            inherent: Attr::none("inherent"),
            name: Attr::none("name"),
            idem: Attr::none("idem"),
            caller: Attr::none("caller"),
            krate: Attr::none("crate"),
        }
    }

    /// Whether the attribute gives a way to make the hint true.
    pub fn has_recipe(&self) -> bool {
        self.key.get().is_some() || self.inherent.get().is_some()
    }
}

/// Parses the attribute's tokens, recording errors in `cx` and returning what could be read.
pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Args {
    let mut args = Args::new();
    let parser = syn::meta::parser(|meta| parse_one(&mut args, &meta));
    if let Err(error) = syn::parse::Parser::parse2(parser, tokens) {
        cx.push(error);
    }
    args
}

fn parse_one(args: &mut Args, meta: &ParseNestedMeta) -> syn::Result<()> {
    let span = meta.path.segments.first().map_or_else(Span::call_site, |s| s.ident.span());
    let Some(name) = meta.path.get_ident().map(ToString::to_string) else {
        return Err(meta.error(format!("unknown option; the options are {OPTIONS}")));
    };
    match name.as_str() {
        "key" => args.key.set(span, meta.value()?.parse()?),
        "window" => args.window.set(span, meta.value()?.parse()?),
        "ignore" => args.ignore.set(span, meta.value()?.parse()?),
        "stale" => args.stale.set(span, meta.value()?.parse()?),
        "reconcile" => args.reconcile.set(span, meta.value()?.parse()?),
        "scope" => args.scope.set(span, meta.value()?.parse()?),
        "task" => args.task.set(span, meta.value()?.parse()?),
        "inherent" => args.inherent.set(span, meta.value()?.parse()?),
        "name" => args.name.set(span, meta.value()?.parse()?),
        "idem" => args.idem.set(span, meta.value()?.parse()?),
        "caller" => args.caller.set(span, meta.value()?.parse()?),
        "crate" => args.krate.set(span, meta.value()?.parse()?),
        other => Err(meta.error(format!("unknown option `{other}`; the options are {OPTIONS}"))),
    }
}
