//! Expand: wrap the handler's body in idem's orchestration, keeping its signature.
//!
//! ```text
//! // Input:
//! #[idempotent(key = "order_id", window = "15m")]
//! #[tool(description = "Charge")]
//! async fn charge(&self, Parameters(args): Parameters<Charge>) -> Result<Receipt, ChargeError> { BODY }
//!
//! // Output:
//! #[tool(description = "Charge", annotations(idempotent_hint = true))]
//! async fn charge(&self, idem_params: Parameters<Charge>) -> Result<Receipt, ChargeError> {
//!     static __IDEM_RECIPE: Recipe = Recipe::new("charge", &["order_id"]).window(..);
//!     let mut idem_args = Arguments::new();
//!     idem_args.all(&idem_params.0);
//!     idem_args.select("order_id", &idem_params.0.order_id);
//!     run(handle, &__IDEM_RECIPE, caller, idem_args, move || async move {
//!         let Parameters(args) = idem_params;
//!         if false { /* fake return edge: the body's type is the fn's return type */ }
//!         BODY
//!     }).await
//! }
//! ```

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::attr::Ctxt;
use crate::tool::{ToolAttr, is_tool};
use crate::valid::{ArgPath, Recipe, Stale};

/// Handler parameters that are not tool arguments: rmcp's extractors, and idem's own handle and
/// caller (passed in for `idem = ...` and `caller = ...`).
const EXTRACTORS: &[&str] = &[
    "RequestContext",
    "Extension",
    "Peer",
    "CancellationToken",
    "RequestId",
    "ToolName",
    "RequestMetaObject",
    "Meta",
    "Caller",
    "Idem",
];

/// Expands `#[idempotent]` on `item`, or records why it cannot.
pub fn expand(cx: &mut Ctxt, recipe: &Recipe, mut item: ItemFn) -> TokenStream {
    check_async(cx, &item);
    let (tool_name, is_tool) = rewrite_tool_attr(cx, recipe, &mut item);
    if recipe.inherent.is_some() {
        // Naturally idempotent: no ledger, the hint is all there is to add.
        return item.into_token_stream();
    }
    let ReturnType::Type(_, ret) = item.sig.output.clone() else {
        cx.error(
            item.sig.ident.span(),
            "an `#[idempotent]` handler must return `Result<T, E>`: `T` is stored and replayed, `E` says what \
             each error means for a repeat",
        );
        return TokenStream::new();
    };
    let args = Arguments::collect(cx, recipe, &mut item);
    let body = wrap_body(recipe, &tool_name, &item, &args, &ret, is_tool);
    item.block = Box::new(syn::parse_quote!({ #body }));
    if is_tool {
        into_mcp_tool(recipe, &mut item, &ret);
    }
    item.into_token_stream()
}

/// An rmcp tool reads its caller from the request context and returns idem's outcome, which
/// carries the replay marker and the refusals' codes into the tool result:
///
/// ```text
/// // Input:  async fn charge(&self, p: Parameters<Charge>) -> Result<Receipt, E>
/// // Output: async fn charge(&self, idem_context: Context, p: Parameters<Charge>) -> ToolOutcome<Result<Receipt, E>>
/// ```
fn into_mcp_tool(recipe: &Recipe, item: &mut ItemFn, ret: &Type) {
    let krate = &recipe.krate;
    let context = Ident::new("idem_context", Span::mixed_site());
    let position = usize::from(item.sig.receiver().is_some());
    item.sig.inputs.insert(position, syn::parse_quote!(#context: #krate::mcp::Context));
    item.sig.output = syn::parse_quote!(-> #krate::mcp::ToolOutcome<#ret>);
}

fn check_async(cx: &mut Ctxt, item: &ItemFn) {
    if item.sig.asyncness.is_some() {
        return;
    }
    let boxed_future = matches!(&item.sig.output, ReturnType::Type(_, ty) if is_pin(ty));
    if boxed_future {
        cx.error(
            item.sig.fn_token.span(),
            "`#[idempotent]` must be placed above `#[tool]`: below it, rmcp has already turned the handler into a \
             boxed future and fixed its hints without the recipe; move `#[idempotent(...)]` to the line above \
             `#[tool(...)]`",
        );
    } else {
        cx.error(
            item.sig.fn_token.span(),
            "an `#[idempotent]` handler must be an `async fn`: idem claims the key before the body runs and \
             records its result after; write `async fn`",
        );
    }
}

fn is_pin(ty: &Type) -> bool {
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|s| s.ident == "Pin"))
}

/// Inserts `idempotent_hint = true` into a sibling `#[tool(...)]`, refusing contradictions, and
/// returns the tool's name (`name =` of the recipe, then of `#[tool]`, then the fn's name).
fn rewrite_tool_attr(cx: &mut Ctxt, recipe: &Recipe, item: &mut ItemFn) -> (String, bool) {
    let fn_name = item.sig.ident.to_string();
    let explicit = recipe.name.as_ref().map(syn::LitStr::value);
    let Some(index) = item.attrs.iter().position(is_tool) else {
        return (explicit.unwrap_or(fn_name), false);
    };
    let mut tool = match ToolAttr::read(&item.attrs[index]) {
        Ok(tool) => tool,
        Err(error) => {
            cx.push(error);
            return (explicit.unwrap_or(fn_name), true);
        }
    };
    if let Some(hint) = tool.idempotent.filter(|hint| !hint.value) {
        cx.error(
            hint.span,
            "`idempotent_hint = false` contradicts `#[idempotent]`, which makes repeats safe; remove the hint \
             (idem sets it to true)",
        );
    }
    if let Some(hint) = tool.read_only.filter(|hint| hint.value) {
        cx.error(
            hint.span,
            "a `read_only_hint = true` tool changes nothing and needs no idempotency key; remove \
             `#[idempotent]` or the read-only hint",
        );
    }
    let name = explicit.or_else(|| tool.name.as_ref().map(syn::LitStr::value)).unwrap_or(fn_name);
    // rmcp infers `outputSchema` from a `Json<T>` return type, which the rewrite to
    // `ToolOutcome<…>` hides from it: state the schema it would have inferred.
    if recipe.inherent.is_none()
        && !tool.has("output_schema")
        && let ReturnType::Type(_, ret) = &item.sig.output
        && let Some(inner) = json_output(ret)
    {
        let krate = &recipe.krate;
        tool.push(syn::parse_quote!(output_schema = #krate::mcp::output_schema::<#inner>()));
    }
    match tool.with_idempotent_hint(&item.attrs[index]) {
        Ok(rewritten) => item.attrs[index] = rewritten,
        Err(error) => cx.push(error),
    }
    (name, true)
}

/// How the handler's parameters feed the key and the fingerprint.
struct Arguments {
    /// Statements filling `idem_args`.
    statements: Vec<TokenStream>,
    /// `let PATTERN = idem_param_N;` for parameters whose pattern was replaced by a plain name.
    rebinds: Vec<TokenStream>,
}

impl Arguments {
    fn collect(cx: &mut Ctxt, recipe: &Recipe, item: &mut ItemFn) -> Self {
        let mut rebinds = Vec::new();
        // (binding, is an rmcp extractor, is a plain value that has no fields to name)
        let mut named: Vec<(Ident, bool, bool)> = Vec::new();
        let mut params_struct: Option<TokenStream> = None;
        for (index, input) in item.sig.inputs.iter_mut().enumerate() {
            let FnArg::Typed(typed) = input else { continue };
            let is_params = last_segment_is(&typed.ty, &["Parameters"]);
            let binding = match &*typed.pat {
                Pat::Ident(pat) if pat.subpat.is_none() && pat.by_ref.is_none() => pat.ident.clone(),
                _ => {
                    // Give the parameter a name of ours and bind the user's pattern inside the body.
                    let ident = Ident::new(&format!("idem_param_{index}"), Span::mixed_site());
                    let pattern = std::mem::replace(&mut *typed.pat, syn::parse_quote!(#ident));
                    rebinds.push(quote!(let #pattern = #ident;));
                    ident
                }
            };
            if is_params && params_struct.is_none() {
                params_struct = Some(quote!(#binding.0));
            } else {
                named.push((binding, last_segment_is(&typed.ty, EXTRACTORS), is_plain_value(&typed.ty)));
            }
        }
        // One argument that no path names is the handler's arguments struct: paths are its fields.
        // Not when it is a plain value (`order_id: String`): a path that does not name it is a
        // misspelt argument, and "no argument named" says so better than "no field on `String`".
        let arguments: Vec<_> = named.iter().filter(|(_, extractor, _)| !extractor).collect();
        let paths = || recipe.keys.iter().chain(&recipe.ignore).chain(&recipe.task);
        if params_struct.is_none()
            && let [(single, _, false)] = arguments[..]
            && !paths().any(|path| path.segments[0] == *single)
        {
            params_struct = Some(quote!(#single));
        }
        let args = Ident::new("idem_args", Span::mixed_site());
        let mut statements = Vec::new();
        let path_expr = |root: &TokenStream, path: &ArgPath| {
            let segments = &path.segments;
            quote_spanned!(path.span=> &#root #(.#segments)*)
        };
        if let Some(root) = &params_struct {
            statements.push(quote!(#args.all(&#root);));
            for key in &recipe.keys {
                let text = &key.text;
                let value = path_expr(root, key);
                statements.push(quote!(#args.select(#text, #value);));
            }
            if let Some(task) = &recipe.task {
                let value = path_expr(root, task);
                statements.push(quote!(#args.task(#value);));
            }
            for ignored in &recipe.ignore {
                // Not read, only named, so that rustc checks the field exists (E0609 on the literal).
                let value = path_expr(root, ignored);
                statements.push(quote!(let _ = #value;));
            }
            return Self { statements, rebinds };
        }
        let names: Vec<String> = named.iter().map(|(ident, _, _)| ident.to_string()).collect();
        for path in recipe.keys.iter().chain(&recipe.ignore).chain(&recipe.task) {
            let first = path.segments[0].to_string();
            if !names.contains(&first) {
                let list = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
                let options =
                    if list.is_empty() { "it has none".to_owned() } else { format!("its arguments are {list}") };
                cx.error(path.span, format!("no argument named `{first}` in this handler; {options}"));
            }
        }
        let ignored = |ident: &Ident| recipe.ignore.iter().any(|path| path.segments[0] == *ident);
        for (ident, extractor, _) in &named {
            if !extractor && !ignored(ident) {
                let name = ident.to_string();
                statements.push(quote!(#args.insert(#name, &#ident);));
            }
        }
        for key in &recipe.keys {
            let root = key.segments[0].to_token_stream();
            let rest = ArgPath { text: key.text.clone(), segments: key.segments[1..].to_vec(), span: key.span };
            let value = path_expr(&root, &rest);
            let text = &key.text;
            statements.push(quote!(#args.select(#text, #value);));
        }
        if let Some(task) = &recipe.task {
            let root = task.segments[0].to_token_stream();
            let rest = ArgPath { text: task.text.clone(), segments: task.segments[1..].to_vec(), span: task.span };
            let value = path_expr(&root, &rest);
            statements.push(quote!(#args.task(#value);));
        }
        Self { statements, rebinds }
    }
}

/// Whether `ty` is a value with no named fields (a string, a number, a collection), so that it
/// cannot be an arguments struct. Anything else might be one.
fn is_plain_value(ty: &Type) -> bool {
    const PLAIN: &[&str] = &[
        "String", "str", "bool", "char", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128",
        "isize", "f32", "f64", "Option", "Vec", "HashMap", "BTreeMap", "HashSet", "BTreeSet",
    ];
    match ty {
        Type::Reference(reference) => is_plain_value(&reference.elem),
        Type::Paren(paren) => is_plain_value(&paren.elem),
        Type::Slice(_) | Type::Array(_) | Type::Tuple(_) => true,
        other => last_segment_is(other, PLAIN),
    }
}

/// The first type argument of `ty` when its last path segment is `name` (`T` of `Json<T>`).
fn first_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else { return None };
    let segment = path.path.segments.last().filter(|segment| segment.ident == name)?;
    let syn::PathArguments::AngleBracketed(args) = &segment.arguments else { return None };
    match args.args.first()? {
        syn::GenericArgument::Type(inner) => Some(inner),
        _ => None,
    }
}

/// `T` of a `Json<T>` or `Result<Json<T>, E>` return type (as rmcp's `#[tool]` reads it).
fn json_output(ty: &Type) -> Option<&Type> {
    let ok = first_type_argument(ty, "Result").unwrap_or(ty);
    first_type_argument(ok, "Json")
}

fn last_segment_is(ty: &Type, names: &[&str]) -> bool {
    let ty = match ty {
        Type::Reference(reference) => &*reference.elem,
        other => other,
    };
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|s| names.iter().any(|n| s.ident == n)))
}

fn wrap_body(recipe: &Recipe, tool_name: &str, item: &ItemFn, args: &Arguments, ret: &Type, mcp: bool) -> TokenStream {
    let krate = &recipe.krate;
    let private = quote!(#krate::__private);
    let recipe_tokens = recipe_expr(recipe, tool_name);
    let idem_args = Ident::new("idem_args", Span::mixed_site());
    let handle = Ident::new("idem_handle", Span::mixed_site());
    let operation = Ident::new("idem_operation", Span::mixed_site());
    let has_self = item.sig.receiver().is_some();
    let handle_expr = match (&recipe.idem, has_self) {
        (Some(expr), _) => quote!(::core::option::Option::Some(#private::handle(&(#expr)))),
        (None, true) => {
            // Spanned at the receiver, so "does not give methods an `Idem` handle" points at `&self`.
            let span = item.sig.receiver().map_or_else(Span::call_site, |receiver| receiver.self_token.span);
            let has_idem = respan(quote!(#krate::HasIdem::idem), span);
            quote_spanned!(span=> ::core::option::Option::Some(#private::handle(#has_idem(self))))
        }
        (None, false) => quote!(#private::installed()),
    };
    let caller_expr = match &recipe.caller {
        Some(expr) => quote!(::core::option::Option::Some(#private::caller(&(#expr)))),
        None => quote!(::core::option::Option::None),
    };
    let statements = &args.statements;
    let rebinds = &args.rebinds;
    let block = &item.block;
    let handler = quote! {
        move || async move {
            #(#rebinds)*
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::needless_return,
                clippy::unreachable
            )]
            if false {
                let idem_fake_return: #ret = loop {};
                return idem_fake_return;
            }
            #block
        }
    };
    // rustc reports the unmet bounds of `run` (the return type must be a `Result` of a storable
    // value and a classified error) at the function's path and again at `.await`; both are ours,
    // so both are spanned at the user's return type. One span for all, so rustc shows each error
    // once (stable has no `Span::join` to underline the whole type).
    let span = ret.span();
    let reconcile = match &recipe.stale {
        Stale::Reconcile(path) if has_self => Some(quote!(move |#operation| #path(self, #operation))),
        Stale::Reconcile(path) => Some(quote!(move |#operation| #path(#operation))),
        _ => None,
    };
    let run = if mcp {
        let context = Ident::new("idem_context", Span::mixed_site());
        let reconcile = match reconcile {
            Some(reconcile) => quote!(::core::option::Option::Some(#reconcile)),
            None => quote!(#private::no_reconcile()),
        };
        let run = respan(quote!(#private::run_mcp), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, &#context, #caller_expr, #idem_args, #reconcile, #handler).await)
    } else if let Some(reconcile) = reconcile {
        let run = respan(quote!(#private::run_reconciling), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #caller_expr, #idem_args, #reconcile, #handler).await)
    } else {
        let run = respan(quote!(#private::run), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #caller_expr, #idem_args, #handler).await)
    };
    quote! {
        static __IDEM_RECIPE: #krate::Recipe = #recipe_tokens;
        let mut #idem_args = #private::Arguments::new();
        #(#statements)*
        let #handle: ::core::option::Option<#krate::Idem> = #handle_expr;
        #run
    }
}

fn recipe_expr(recipe: &Recipe, tool_name: &str) -> TokenStream {
    let krate = &recipe.krate;
    let keys = recipe.keys.iter().map(|key| &key.text);
    // The namespace defaults to the declaring package's name: stable across module moves.
    let mut expr =
        quote!(#krate::Recipe::new(#tool_name, &[#(#keys),*]).package(::core::option_env!("CARGO_PKG_NAME")));
    if let Some(secs) = recipe.window_secs {
        expr.extend(quote!(.window(::core::time::Duration::from_secs(#secs))));
    }
    if !recipe.ignore.is_empty() {
        let ignore = recipe.ignore.iter().map(|path| &path.text);
        expr.extend(quote!(.ignore(&[#(#ignore),*])));
    }
    if recipe.tenant_scope {
        expr.extend(quote!(.scope(#krate::ScopeRule::Tenant)));
    }
    if let Some(task) = &recipe.task {
        let text = &task.text;
        expr.extend(quote!(.scope(#krate::ScopeRule::Task(#text))));
    }
    match recipe.stale {
        Stale::Hold => {}
        Stale::Takeover => expr.extend(quote!(.stale(#krate::StalePolicy::Takeover))),
        Stale::Reconcile(_) => expr.extend(quote!(.stale(#krate::StalePolicy::Reconcile))),
    }
    expr
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens.into_iter().map(|token| respan_token(token, span)).collect()
}

fn respan_token(mut token: proc_macro2::TokenTree, span: Span) -> proc_macro2::TokenTree {
    if let proc_macro2::TokenTree::Group(group) = &token {
        let mut respanned = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
        respanned.set_span(span);
        token = proc_macro2::TokenTree::Group(respanned);
    } else {
        token.set_span(span);
    }
    token
}
