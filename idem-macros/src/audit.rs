//! `#[audit_idempotent]` on a `#[tool_router]` impl: a tool whose annotations say
//! `idempotent_hint = true` must carry `#[idempotent(...)]` with a key recipe or an inherent reason.
//!
//! It works above or below `#[tool_router]`: either way it sees every method's raw attributes.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{ImplItem, ItemImpl};

use crate::attr::{self, Ctxt};
use crate::tool::{ToolAttr, is_tool};

pub fn audit(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    if !args.is_empty() {
        cx.error(proc_macro2::Span::call_site(), "`#[audit_idempotent]` takes no options");
    }
    let item: ItemImpl = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(error) => {
            let mut out = syn::Error::new(error.span(), "`#[audit_idempotent]` goes on an `impl` block of tools")
                .to_compile_error();
            out.extend(input);
            return out;
        }
    };
    for method in item.items.iter().filter_map(|item| if let ImplItem::Fn(f) = item { Some(f) } else { None }) {
        let Some(tool_attr) = method.attrs.iter().find(|attr| is_tool(attr)) else { continue };
        let Ok(tool) = ToolAttr::read(tool_attr) else { continue }; // rmcp reports malformed `#[tool]`
        let Some(hint) = tool.idempotent.filter(|hint| hint.value) else { continue };
        let has_recipe = method.attrs.iter().filter(|attr| is_idempotent(attr)).any(|attr| {
            let tokens = match &attr.meta {
                syn::Meta::List(list) => list.tokens.clone(),
                _ => TokenStream::new(),
            };
            // Errors in the attribute itself are reported by `#[idempotent]`, not here.
            attr::parse(&mut Ctxt::default(), tokens).has_recipe()
        });
        if !has_recipe {
            let name = tool.name.as_ref().map_or_else(|| method.sig.ident.to_string(), syn::LitStr::value);
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
    out.extend(item.into_token_stream());
    out
}

fn is_idempotent(attr: &syn::Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "idempotent")
}
