//! The handler `#[idempotent]` is placed on: attributes, visibility and signature parsed, the
//! body kept as tokens (as `tracing-attributes` and `tokio-macros` do), so a mistake inside the
//! body is reported by rustc, where it is, and never as a misplaced attribute.

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use quote::{ToTokens, TokenStreamExt};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Signature, Visibility};

#[derive(Clone)]
pub struct Handler {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    /// The body, braces included, as written.
    pub body: Group,
}

impl Parse for Handler {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(syn::Token![;]) {
            return Err(input.error(
                "`#[idempotent]` goes on a handler with a body; a method declared in a trait has none: put it on \
                 the method in the `impl` block",
            ));
        }
        let body = match input.parse::<TokenTree>()? {
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => group,
            other => return Err(syn::Error::new(other.span(), "expected the handler's body `{ ... }`")),
        };
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the handler's body"));
        }
        Ok(Self { attrs, vis, sig, body })
    }
}

impl ToTokens for Handler {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.append_all(&self.attrs);
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.body.to_tokens(tokens);
    }
}

impl Handler {
    /// The body's inner attributes (`#![...]`) and its statements, apart.
    pub fn body_parts(&self) -> (TokenStream, TokenStream) {
        let tokens: Vec<TokenTree> = self.body.stream().into_iter().collect();
        let mut split = 0;
        while let [TokenTree::Punct(pound), TokenTree::Punct(bang), TokenTree::Group(group), ..] = &tokens[split..]
            && pound.as_char() == '#'
            && bang.as_char() == '!'
            && group.delimiter() == Delimiter::Bracket
        {
            split += 3;
        }
        (tokens[..split].iter().cloned().collect(), tokens[split..].iter().cloned().collect())
    }
}

/// The error for an item `#[idempotent]` cannot read: a function whose signature syn rejects is
/// named as such (rustc reports the syntax itself); anything else is not a handler.
pub fn not_a_handler(input: &TokenStream, error: &syn::Error) -> syn::Error {
    let is_fn = input.clone().into_iter().any(|token| matches!(&token, TokenTree::Ident(ident) if ident == "fn"));
    if is_fn {
        syn::Error::new(error.span(), format!("`#[idempotent]` could not read this handler: {error}"))
    } else {
        syn::Error::new(
            error.span(),
            "`#[idempotent]` goes on an `async fn` handler (a free function or a method with a body)",
        )
    }
}

/// Another macro already rewrote the handler in a way `#[idempotent]` cannot work on.
pub fn foreign_rewrite(handler: &Handler) -> Option<syn::Error> {
    let async_trait = handler.sig.generics.lifetimes().any(|lifetime| lifetime.lifetime.ident == "async_trait")
        || handler.sig.output.to_token_stream().into_iter().any(|token| mentions_async_trait(&token));
    async_trait.then(|| {
        syn::Error::new(
            handler.sig.ident.span(),
            "`#[idempotent]` cannot work inside an `#[async_trait]` impl, which turns the handler into a boxed \
             future before `#[idempotent]` sees it; `async fn` in traits is native since Rust 1.75: remove \
             `#[async_trait]` from the trait and this impl, or put the `#[idempotent]` handler in an inherent \
             impl and call it from the trait method",
        )
    })
}

fn mentions_async_trait(token: &TokenTree) -> bool {
    match token {
        TokenTree::Ident(ident) => ident == "async_trait",
        TokenTree::Group(group) => group.stream().into_iter().any(|token| mentions_async_trait(&token)),
        _ => false,
    }
}
