//! Procedural macros for idem. Use them through `idem-runtime`, which re-exports them and
//! documents them: `#[idempotent]` on handlers, `#[audit_idempotent]` on `#[tool_router]` impls.
//!
//! Pipeline, as in `thiserror-impl`: `attr.rs` parses, `valid.rs` validates, `expand.rs` and
//! `audit.rs` expand; `tool.rs` reads rmcp's `#[tool(...)]`, `handler.rs` reads the handler
//! (its body stays tokens). Errors are accumulated and, on any error, the user's item is still
//! emitted beside them so follow-on errors do not cascade.

mod attr;
mod audit;
mod expand;
mod handler;
mod tool;
mod valid;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenTree};
use quote::ToTokens;

use crate::handler::Handler;

/// Makes an async handler safe to repeat. Documented on `idem_runtime::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, input: TokenStream) -> TokenStream {
    never_panic(args.into(), input.into(), idempotent_impl).into()
}

/// Audits a `#[tool_router]` impl. Documented on `idem_runtime::audit_idempotent`.
#[proc_macro_attribute]
pub fn audit_idempotent(args: TokenStream, input: TokenStream) -> TokenStream {
    never_panic(args.into(), input.into(), audit::audit).into()
}

/// A proc macro must never panic (the user's item would vanish behind "proc macro panicked"):
/// should one of ours, the item is emitted unchanged beside an error that says so.
fn never_panic(
    args: proc_macro2::TokenStream,
    input: proc_macro2::TokenStream,
    expand: fn(proc_macro2::TokenStream, proc_macro2::TokenStream) -> proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let kept = input.clone();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| expand(args, input))) {
        Ok(output) => output,
        Err(_) => {
            let mut out = syn::Error::new(
                Span::call_site(),
                "internal error in idem's macro: it could not expand this item (please report it with the item); \
                 the item is left unchanged",
            )
            .to_compile_error();
            out.extend(kept);
            out
        }
    }
}

/// The hidden first argument `#[audit_idempotent]` gives every `#[idempotent]` of its impl.
const AUDITED: &str = "__idem_audited";

/// Removes the audit's marker from the arguments; whether it was there.
fn strip_audited(args: proc_macro2::TokenStream) -> (bool, proc_macro2::TokenStream) {
    let mut tokens = args.clone().into_iter().peekable();
    match tokens.next() {
        Some(TokenTree::Ident(ident)) if ident == AUDITED => {
            if matches!(tokens.peek(), Some(TokenTree::Punct(punct)) if punct.as_char() == ',') {
                tokens.next();
            }
            (true, tokens.collect())
        }
        _ => (false, args),
    }
}

fn idempotent_impl(args: proc_macro2::TokenStream, input: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let (audited, args) = strip_audited(args);
    let handler: Handler = match syn::parse2(input.clone()) {
        Ok(handler) => handler,
        Err(error) => {
            let mut out = handler::not_a_handler(&input, &error).to_compile_error();
            out.extend(input);
            return out;
        }
    };
    let mut cx = attr::Ctxt::default();
    // A second `#[idempotent]` would wrap the handler twice: refuse it, and leave the handler
    // unchanged so that only this error shows.
    if let Some(second) = handler.attrs.iter().find(|attr| audit::is_idempotent(attr)) {
        cx.error(
            syn::spanned::Spanned::span(second.path()),
            "`#[idempotent]` is given twice on this handler; a handler has one recipe: merge the options into \
             one `#[idempotent(...)]` and remove the other",
        );
        return with_errors(cx, handler);
    }
    if let Some(error) = handler::foreign_rewrite(&handler) {
        cx.push(error);
        return with_errors(cx, handler);
    }
    if handler.sig.receiver().is_some() && !audited {
        cx.error(
            Span::call_site(),
            "an impl that uses `#[idempotent]` must be audited, so that no tool in it claims \
             `idempotent_hint = true` without a key recipe: add `#[audit_idempotent]` to this `impl` block \
             (above or below `#[tool_router]`)",
        );
    }
    let parsed = attr::parse(&mut cx, args);
    let recipe = valid::validate(&mut cx, parsed);
    let expanded = expand::expand(&mut cx, &recipe, handler.clone(), audited);
    match cx.finish() {
        Ok(()) => expanded,
        Err(errors) => {
            // Emit the user's function unchanged beside the errors (tokio-macros does the same),
            // so `#[tool_router]` and IDEs still find it.
            let mut out = errors.to_compile_error();
            out.extend(handler.into_token_stream());
            out
        }
    }
}

fn with_errors(cx: attr::Ctxt, handler: Handler) -> proc_macro2::TokenStream {
    let mut out = cx.finish().err().map(|errors| errors.to_compile_error()).unwrap_or_default();
    out.extend(handler.into_token_stream());
    out
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::idempotent_impl;

    /// Shapes that once panicked (and so swallowed the user's function) expand without panicking.
    #[test]
    fn keys_that_are_keywords_do_not_panic() {
        for key in ["r#type", "type", "self", "r#self", "crate", "_", "a.r#type", "0", "a..b", "r#"] {
            let out = idempotent_impl(
                quote!(key = #key),
                quote!(
                    async fn handler(r#type: String) -> Result<String, E> {
                        Ok(r#type)
                    }
                ),
            );
            assert!(out.to_string().contains("fn handler"), "{key}: {out}");
        }
    }
}
