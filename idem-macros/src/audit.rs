//! `#[audit_idempotent]` on a `#[tool_router]` impl: a tool whose annotations say
//! `idempotent_hint = true` must carry `#[idempotent(...)]` with a key recipe or an inherent reason.
//!
//! It works above or below `#[tool_router]`: either way it expands before the methods' own
//! attributes and sees their raw `#[tool]` and `#[idempotent]`. It marks every `#[idempotent]` of
//! the impl as audited (a hidden first argument); a method's `#[idempotent]` without the mark
//! refuses to compile, so an impl that uses `#[idempotent]` cannot skip the audit.
//!
//! ```text
//! // Input:
//! #[audit_idempotent]
//! #[tool_router]
//! impl Shop { #[idempotent(key = "id")] #[tool] async fn a(..) {..}  #[tool] async fn b(..) {..} }
//!
//! // Output:
//! impl Shop { pub fn idem_backed_tools() -> &'static [&'static str] { &["a"] } } // default router only
//! #[tool_router]
//! impl Shop { #[idempotent(__idem_audited, key = "id")] #[tool] async fn a(..) {..}  #[tool] async fn b(..) {..} }
//! ```

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Attribute, ImplItem, ItemImpl, Meta, ReturnType, Type};

use crate::AUDITED;
use crate::attr::Ctxt;
use crate::tool::{ToolAttr, is_tool};

/// rmcp's name for a router that is not given one.
const DEFAULT_ROUTER: &str = "tool_router";

pub fn audit(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    if let Some(first) = args.clone().into_iter().next() {
        cx.error(first.span(), "`#[audit_idempotent]` takes no options; write `#[audit_idempotent]` alone");
    }
    let mut item: ItemImpl = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(error) => {
            let mut out = syn::Error::new(error.span(), "`#[audit_idempotent]` goes on an `impl` block of tools")
                .to_compile_error();
            out.extend(input);
            return out;
        }
    };
    let mut backed = Vec::new();
    for method in item.items.iter_mut().filter_map(|item| if let ImplItem::Fn(f) = item { Some(f) } else { None }) {
        let idempotent = method.attrs.iter().any(is_idempotent);
        for attr in method.attrs.iter_mut().filter(|attr| is_idempotent(attr)) {
            mark_audited(attr);
        }
        let Some(tool_attr) = method.attrs.iter().find(|attr| is_tool(attr)) else { continue };
        let Ok(tool) = ToolAttr::read(tool_attr) else { continue }; // rmcp reports malformed `#[tool]`
        let name = tool.name.as_ref().map_or_else(|| method.sig.ident.to_string(), syn::LitStr::value);
        if idempotent {
            backed.push(name.clone());
        }
        let Some(hint) = tool.idempotent.filter(|hint| hint.value) else { continue };
        // `#[idempotent]` refuses to compile without a recipe and reports its own mistakes; a
        // second error here for the same mistake would only be noise.
        if !idempotent {
            cx.error(
                hint.span,
                format!(
                    "tool `{name}` says `idempotent_hint = true` but has no key recipe, so hosts would retry it \
                     blindly; add `#[idempotent(key = \"...\")]` above its `#[tool]` naming the arguments that \
                     make two calls the same operation, or `#[idempotent(inherent = \"...\")]` saying why \
                     repeating it is harmless"
                ),
            );
        }
    }
    let mut out = cx.finish().err().map(|errors| errors.to_compile_error()).unwrap_or_default();
    if router_name(&item).as_deref() == Some(DEFAULT_ROUTER) {
        out.extend(backed_tools(&item, &backed));
    }
    out.extend(item.into_token_stream());
    out
}

/// `#[idempotent(...)]` → `#[idempotent(__idem_audited, ...)]`.
fn mark_audited(attr: &mut Attribute) {
    let marker = syn::Ident::new(AUDITED, Span::call_site());
    match &mut attr.meta {
        Meta::Path(path) => {
            let path = path.clone();
            attr.meta = syn::parse_quote!(#path(#marker));
        }
        Meta::List(list) => {
            let tokens = std::mem::take(&mut list.tokens);
            list.tokens = quote!(#marker, #tokens);
        }
        Meta::NameValue(_) => {} // not ours to read; `#[idempotent]` reports it
    }
}

/// The name of the router this impl's tools go into: from `#[tool_router(router = ...)]` when it
/// is still to expand (the audit above it), or the router function rmcp added (the audit below).
fn router_name(item: &ItemImpl) -> Option<String> {
    if let Some(attr) = item.attrs.iter().find(|attr| last_segment(attr.path()) == Some(DEFAULT_ROUTER)) {
        let mut name = DEFAULT_ROUTER.to_owned();
        if let Meta::List(list) = &attr.meta {
            let _ = list.parse_nested_meta(|meta| {
                if meta.path.is_ident("router") {
                    name = meta.value()?.parse::<syn::Ident>()?.to_string();
                } else if meta.input.peek(syn::Token![=]) {
                    meta.value()?.parse::<syn::Expr>()?;
                }
                Ok(())
            });
        }
        return Some(name);
    }
    item.items.iter().rev().find_map(|item| match item {
        ImplItem::Fn(f)
            if f.sig.inputs.is_empty()
                && matches!(&f.sig.output, ReturnType::Type(_, ty) if returns_tool_router(ty)) =>
        {
            Some(f.sig.ident.to_string())
        }
        _ => None,
    })
}

fn returns_tool_router(ty: &Type) -> bool {
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|s| s.ident == "ToolRouter"))
}

fn last_segment(path: &syn::Path) -> Option<&str> {
    path.segments.last().map(|segment| segment.ident.to_string()).and_then(|name| {
        // Only the two names this module compares against.
        [DEFAULT_ROUTER, "idempotent"].into_iter().find(|known| *known == name)
    })
}

/// `Self::idem_backed_tools()`: the tools of the default router's impl whose hint a recipe or an
/// inherent reason backs. Generated for the impl of the default router only, so several audited
/// impls of one type do not collide; the startup check (`mcp::check`) does not need it (each tool's `_meta`
/// carries its backing), it lists the backed tools for tests and logs.
fn backed_tools(item: &ItemImpl, backed: &[String]) -> TokenStream {
    let self_ty = &item.self_ty;
    let (impl_generics, _, where_clause) = item.generics.split_for_impl();
    quote! {
        impl #impl_generics #self_ty #where_clause {
            /// The tools of this impl (the default `tool_router`) whose `idempotentHint` a key
            /// recipe or an inherent reason backs.
            #[must_use]
            pub fn idem_backed_tools() -> &'static [&'static str] {
                &[#(#backed),*]
            }
        }
    }
}

pub fn is_idempotent(attr: &Attribute) -> bool {
    last_segment(attr.path()) == Some("idempotent")
}
