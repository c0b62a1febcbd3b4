//! `#[audit_idempotent]` on a `#[tool_router]` impl: a tool whose annotations say
//! `idempotent_hint = true` must carry `#[idempotent(...)]` with a key recipe or an inherent reason.
//!
//! It works above or below `#[tool_router]`: either way it sees every method's raw attributes.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{ImplItem, ItemImpl};

use crate::attr::Ctxt;
use crate::tool::{ToolAttr, is_tool};

pub fn audit(args: TokenStream, input: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    if let Some(first) = args.clone().into_iter().next() {
        cx.error(first.span(), "`#[audit_idempotent]` takes no options; write `#[audit_idempotent]` alone");
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
    let mut backed = Vec::new();
    for method in item.items.iter().filter_map(|item| if let ImplItem::Fn(f) = item { Some(f) } else { None }) {
        let Some(tool_attr) = method.attrs.iter().find(|attr| is_tool(attr)) else { continue };
        let Ok(tool) = ToolAttr::read(tool_attr) else { continue }; // rmcp reports malformed `#[tool]`
        if method.attrs.iter().any(is_idempotent) {
            backed.push(tool.name.as_ref().map_or_else(|| method.sig.ident.to_string(), syn::LitStr::value));
        }
        let Some(hint) = tool.idempotent.filter(|hint| hint.value) else { continue };
        // `#[idempotent]` refuses to compile without a recipe and reports its own mistakes; a
        // second error here for the same mistake would only be noise.
        if !method.attrs.iter().any(is_idempotent) {
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
    out.extend(backed_tools(&item, &backed));
    out.extend(item.into_token_stream());
    out
}

/// `Self::idem_backed_tools()`: the tools of this impl whose hint a recipe or an inherent reason
/// backs, for the startup audit of the served tool list (`idem_runtime::mcp::checked_router`).
fn backed_tools(item: &ItemImpl, backed: &[String]) -> TokenStream {
    let self_ty = &item.self_ty;
    let (impl_generics, _, where_clause) = item.generics.split_for_impl();
    quote::quote! {
        impl #impl_generics #self_ty #where_clause {
            /// The tools of this impl whose `idempotentHint` a key recipe or an inherent reason
            /// backs: pass it to `idem_runtime::mcp::checked_router` at startup.
            #[must_use]
            pub fn idem_backed_tools() -> &'static [&'static str] {
                &[#(#backed),*]
            }
        }
    }
}

fn is_idempotent(attr: &syn::Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "idempotent")
}
