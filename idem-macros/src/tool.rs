//! rmcp's `#[tool(...)]`, as seen from an attribute above it: read its `annotations(...)`, and
//! insert `idempotent_hint = true` where a recipe backs it.

use proc_macro2::Span;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, Lit, LitStr, Meta, Token};

/// Whether `attr` is rmcp's `#[tool]` (found, like `#[tool_router]` does, by its last segment).
pub fn is_tool(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "tool")
}

/// A boolean hint as written: absent, or set (a bare word counts as `true`, as rmcp reads it).
#[derive(Clone, Copy)]
pub struct Hint {
    pub value: bool,
    pub span: Span,
}

/// What a `#[tool(...)]` says that idem cares about.
pub struct ToolAttr {
    pub name: Option<LitStr>,
    pub idempotent: Option<Hint>,
    pub read_only: Option<Hint>,
    args: Punctuated<Meta, Token![,]>,
}

impl ToolAttr {
    /// Reads a `#[tool]` attribute. Malformed contents are left for rmcp to report.
    pub fn read(attr: &Attribute) -> syn::Result<Self> {
        let args = match &attr.meta {
            Meta::Path(_) => Punctuated::new(),
            Meta::List(list) => list.parse_args_with(Punctuated::parse_terminated)?,
            Meta::NameValue(nv) => return Err(syn::Error::new(nv.span(), "expected `#[tool(...)]`")),
        };
        let mut tool = Self { name: None, idempotent: None, read_only: None, args };
        for meta in &tool.args {
            if meta.path().is_ident("name")
                && let Meta::NameValue(nv) = meta
                && let Expr::Lit(lit) = &nv.value
                && let Lit::Str(name) = &lit.lit
            {
                tool.name = Some(name.clone());
            }
        }
        if let Some(annotations) = tool.annotations()? {
            for meta in &annotations {
                if meta.path().is_ident("idempotent_hint") {
                    tool.idempotent = Some(hint(meta)?);
                } else if meta.path().is_ident("read_only_hint") {
                    tool.read_only = Some(hint(meta)?);
                }
            }
        }
        Ok(tool)
    }

    fn annotations(&self) -> syn::Result<Option<Punctuated<Meta, Token![,]>>> {
        for meta in &self.args {
            if meta.path().is_ident("annotations") {
                return match meta {
                    Meta::List(list) => list.parse_args_with(Punctuated::parse_terminated).map(Some),
                    _ => Err(syn::Error::new(meta.span(), "expected `annotations(...)`")),
                };
            }
        }
        Ok(None)
    }

    /// Whether `#[tool(...)]` sets `name` itself (e.g. `output_schema`).
    pub fn has(&self, name: &str) -> bool {
        self.args.iter().any(|meta| meta.path().is_ident(name))
    }

    /// Adds an argument (e.g. an `output_schema` that rmcp can no longer infer).
    pub fn push(&mut self, meta: Meta) {
        self.args.push(meta);
    }

    /// Replaces `meta = expr` by `stamp(Some(expr))`, or adds `meta = stamp(None)`.
    pub fn stamp_meta(&mut self, stamp: impl FnOnce(Option<&Expr>) -> proc_macro2::TokenStream) {
        for meta in &mut self.args {
            if let Meta::NameValue(nv) = meta
                && nv.path.is_ident("meta")
            {
                let stamped = stamp(Some(&nv.value));
                nv.value = syn::parse_quote!(#stamped);
                return;
            }
        }
        let stamped = stamp(None);
        self.args.push(syn::parse_quote!(meta = #stamped));
    }

    /// The attribute with `idempotent_hint = true` in its annotations (added if absent).
    pub fn with_idempotent_hint(mut self, original: &Attribute) -> syn::Result<Attribute> {
        if self.idempotent.is_none() {
            let hint: Meta = syn::parse_quote!(idempotent_hint = true);
            match self.annotations()? {
                Some(mut annotations) => {
                    annotations.push(hint);
                    for meta in &mut self.args {
                        if meta.path().is_ident("annotations") {
                            *meta = syn::parse_quote!(annotations(#annotations));
                        }
                    }
                }
                None => self.args.push(syn::parse_quote!(annotations(#hint))),
            }
        }
        let path = original.path();
        let args = &self.args;
        let pound = original.pound_token;
        let tokens = quote!(#pound[#path(#args)]);
        let mut parsed = syn::parse::Parser::parse2(Attribute::parse_outer, tokens)?;
        parsed.pop().ok_or_else(|| syn::Error::new(original.span(), "failed to rebuild `#[tool]`"))
    }
}

fn hint(meta: &Meta) -> syn::Result<Hint> {
    let span = meta.span();
    match meta {
        Meta::Path(_) => Ok(Hint { value: true, span }),
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Bool(value) => Ok(Hint { value: value.value, span }),
                _ => Err(syn::Error::new(nv.value.span(), "expected `true` or `false`")),
            },
            other => Err(syn::Error::new(other.span(), "expected `true` or `false`")),
        },
        Meta::List(_) => Err(syn::Error::new(span, "expected `true` or `false`")),
    }
}
