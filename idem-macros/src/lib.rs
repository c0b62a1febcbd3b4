//! Procedural macros for idem. Use them through `idem-runtime`, which re-exports them and
//! documents them: `#[idempotent]` on handlers, `#[audit_idempotent]` on `#[tool_router]` impls.
//!
//! Pipeline, as in `thiserror-impl`: `attr.rs` parses, `valid.rs` validates, `expand.rs` and
//! `audit.rs` expand; `tool.rs` reads rmcp's `#[tool(...)]`. Errors are accumulated and, on any
//! error, the user's item is still emitted beside them so follow-on errors do not cascade.

mod attr;
mod audit;
mod expand;
mod tool;
mod valid;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Makes an async handler safe to repeat. Documented on `idem_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, input: TokenStream) -> TokenStream {
    idempotent_impl(args.into(), input.into()).into()
}

/// Audits a `#[tool_router]` impl. Documented on `idem_runtime::audit_idempotent`.
#[proc_macro_attribute]
pub fn audit_idempotent(args: TokenStream, input: TokenStream) -> TokenStream {
    audit::audit(args.into(), input.into()).into()
}

fn idempotent_impl(args: proc_macro2::TokenStream, input: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let item: syn::ItemFn = match syn::parse2(input.clone()) {
        Ok(item) => item,
        Err(error) => {
            let message = syn::Error::new(
                error.span(),
                "`#[idempotent]` goes on an `async fn` handler (a free function or a method with a body)",
            );
            let mut out = message.to_compile_error();
            out.extend(input);
            return out;
        }
    };
    let mut cx = attr::Ctxt::default();
    let parsed = attr::parse(&mut cx, args);
    let recipe = valid::validate(&mut cx, parsed);
    let expanded = expand::expand(&mut cx, &recipe, item.clone());
    match cx.finish() {
        Ok(()) => expanded,
        Err(errors) => {
            // Emit the user's function unchanged beside the errors (tokio-macros does the same),
            // so `#[tool_router]` and IDEs still find it.
            let mut out = errors.to_compile_error();
            out.extend(item.into_token_stream());
            out
        }
    }
}
