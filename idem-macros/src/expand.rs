//! Expand: wrap the handler's body in idem's orchestration. A plain handler keeps its
//! signature; an rmcp tool gains a `ToolContext` first parameter and returns a `ToolOutcome`
//! ([`into_mcp_tool`], documented for users in the guide's MCP chapter).
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

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, ReturnType, Type};

use crate::attr::Ctxt;
use crate::handler::Handler;
use crate::tool::{ToolAttr, is_tool};
use crate::valid::{ClientKey, Recipe, Stale};

mod arguments;

use arguments::{Arguments, json_output};

/// Parameter types that are not tool arguments, by name: used only to guess which parameter is
/// the arguments struct when one is not named. Whether a parameter is left out of the arguments
/// is decided by its type (`idem_runtime::__private::Probe`), which a user type named like one of
/// these cannot trip.
const EXTRACTORS: &[&str] = &[
    "RequestContext",
    "Extension",
    "Extensions",
    "Peer",
    "CancellationToken",
    "RequestId",
    "ToolName",
    "RequestMetaObject",
    "RequestState",
    "InputResponses",
    "Caller",
    "Idem",
];

/// clippy's default `too_many_arguments` threshold.
const CLIPPY_MAX_ARGUMENTS: usize = 7;

/// Expands `#[idempotent]` on `item`, or records why it cannot.
/// `audited`: the handler is in an impl `#[audit_idempotent]` marked, so `Self` names its type.
pub fn expand(cx: &mut Ctxt, recipe: &Recipe, mut item: Handler, audited: bool) -> TokenStream {
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
    if let Some(shown) = plainly_not_result(&ret) {
        cx.error(
            ret.span(),
            format!(
                "an `#[idempotent]` handler must return `Result<T, E>`, not `{shown}`: `T` is stored and replayed \
                 to repeats, `E` (an `IdempotentError`) says what each error means for a repeat — e.g. \
                 `Result<{shown}, MyError>`"
            ),
        );
        return TokenStream::new();
    }
    if let Some(span) = find_ident(ret.to_token_stream(), "impl") {
        cx.error(
            span,
            "an `#[idempotent]` handler's result is stored and decoded again for every repeat, so it needs a \
             type that can be named: write the concrete type instead of `impl Trait`",
        );
        return TokenStream::new();
    }
    if !is_tool && let Some(span) = recipe.task.1 {
        cx.error(
            span,
            "`task` only applies to an rmcp tool (a method with `#[tool(...)]` below `#[idempotent]`): MCP tasks are \
             answered over MCP; remove it here",
        );
    }
    if !is_tool && let Some(span) = recipe.replay_note.1 {
        cx.error(
            span,
            "`replay_note` only applies to an rmcp tool (a method with `#[tool(...)]` below `#[idempotent]`), \
             whose answers a model reads; remove it here",
        );
    }
    if !is_tool && let Some(span) = recipe.client_key.1 {
        cx.error(
            span,
            "`client_key` only applies to an rmcp tool (a method with `#[tool(...)]` below `#[idempotent]`), whose \
             requests carry `_meta`; remove it here",
        );
    }
    for (option, span) in [("input_key", recipe.input_key.1), ("single_use_state", recipe.single_use_state.1)] {
        if !is_tool && let Some(span) = span {
            cx.error(
                span,
                format!(
                    "`{option}` only applies to an rmcp tool (a method with `#[tool(...)]` below `#[idempotent]`), \
                     which may ask the client for input; remove it here"
                ),
            );
        }
    }
    let args = Arguments::collect(cx, recipe, &mut item);
    let body = wrap_body(recipe, &tool_name, &item, &args, &ret, (is_tool, audited));
    let mut group = Group::new(Delimiter::Brace, body);
    group.set_span(item.body.span());
    item.body = group;
    if is_tool {
        into_mcp_tool(recipe, &mut item, &ret);
    }
    item.into_token_stream()
}

/// The return type as written, if it plainly cannot be a `Result` (a tuple, a reference, an
/// array, or a standard type that is not one); a path that may name an alias of `Result` is
/// left to the type checker.
fn plainly_not_result(ty: &Type) -> Option<String> {
    const NOT_RESULTS: &[&str] = &[
        "String",
        "str",
        "Vec",
        "Option",
        "bool",
        "char",
        "u8",
        "u16",
        "u32",
        "u64",
        "u128",
        "usize",
        "i8",
        "i16",
        "i32",
        "i64",
        "i128",
        "isize",
        "f32",
        "f64",
        "Value",
        "Json",
        "HashMap",
        "BTreeMap",
        "Box",
        "Arc",
        "Step",
        "CallToolResult",
    ];
    let plain = match ty {
        Type::Tuple(_) | Type::Reference(_) | Type::Array(_) | Type::Slice(_) => true,
        Type::Path(path) if path.qself.is_none() => {
            path.path.segments.last().is_some_and(|last| NOT_RESULTS.iter().any(|name| last.ident == name))
        }
        _ => false,
    };
    plain.then(|| ty.to_token_stream().to_string().replace(" < ", "<").replace(" >", ">").replace(" ,", ","))
}

/// The span of the first `name` among `tokens`, at any depth.
fn find_ident(tokens: TokenStream, name: &str) -> Option<Span> {
    tokens.into_iter().find_map(|token| match token {
        proc_macro2::TokenTree::Ident(ident) if ident == name => Some(ident.span()),
        proc_macro2::TokenTree::Group(group) => find_ident(group.stream(), name),
        _ => None,
    })
}

/// An rmcp tool reads its caller from the request context and returns idem's outcome, which
/// carries the replay marker and the refusals' codes into the tool result:
///
/// ```text
/// // Input:  async fn charge(&self, p: Parameters<Charge>) -> Result<Receipt, E>
/// // Output: async fn charge(&self, idem_context: ToolContext, p: Parameters<Charge>) -> ToolOutcome<Result<Receipt, E>>
/// ```
fn into_mcp_tool(recipe: &Recipe, item: &mut Handler, ret: &Type) {
    let krate = &recipe.krate;
    let context = Ident::new("idem_context", Span::mixed_site());
    let position = usize::from(item.sig.receiver().is_some());
    let written = item.sig.inputs.len();
    item.sig.inputs.insert(position, syn::parse_quote!(#context: #krate::__private::ToolContext));
    item.sig.output = syn::parse_quote!(-> #krate::__private::ToolOutcome<#ret>);
    // The context parameter is ours: clippy should not count it against the user's signature.
    if written == CLIPPY_MAX_ARGUMENTS {
        item.attrs.push(syn::parse_quote!(#[allow(clippy::too_many_arguments)]));
    }
}

fn check_async(cx: &mut Ctxt, item: &Handler) {
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
fn rewrite_tool_attr(cx: &mut Ctxt, recipe: &Recipe, item: &mut Handler) -> (String, bool) {
    let fn_name = item.sig.ident.unraw().to_string();
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
        tool.push(syn::parse_quote!(output_schema = #krate::__private::output_schema::<#inner>()));
    }
    // The tool's `_meta` advertises the recipe that backs its hint (`dev.idem/recipe`), for
    // hosts and gateways, and so the startup check (`mcp::check`) sees every audited
    // impl's tools in whatever router holds them.
    let krate = &recipe.krate;
    let (function, backing) = if recipe.inherent.is_some() {
        (quote!(#krate::mcp::wire::backed_meta), quote!(#krate::mcp::wire::Backing::Inherent))
    } else {
        let recipe = recipe_expr(recipe, &name);
        (quote!(#krate::mcp::wire::recipe_meta), quote!(&#recipe))
    };
    tool.stamp_meta(|user| match user {
        Some(user) => quote!(#function(::core::option::Option::Some(#user), #backing)),
        None => quote!(#function(::core::option::Option::None, #backing)),
    });
    match tool.with_idempotent_hint(&item.attrs[index]) {
        Ok(rewritten) => item.attrs[index] = rewritten,
        Err(error) => cx.push(error),
    }
    (name, true)
}

/// `(mcp, audited)`: whether the handler is an rmcp tool, and in an audited impl.
fn wrap_body(
    recipe: &Recipe,
    tool_name: &str,
    item: &Handler,
    args: &Arguments,
    ret: &Type,
    (mcp, audited): (bool, bool),
) -> TokenStream {
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
            let has_idem = respan(quote!(#krate::__private::HasIdem::idem), span);
            let receiver = receiver_ref(item);
            quote_spanned!(span=> ::core::option::Option::Some(#private::handle(#has_idem(#receiver))))
        }
        (None, false) => quote!(#private::installed()),
    };
    let caller_expr = match &recipe.caller {
        Some(expr) => quote!(::core::option::Option::Some(#private::caller(&(#expr)))),
        None => quote!(::core::option::Option::None),
    };
    let statements = &args.statements;
    let rebinds = &args.rebinds;
    // Who serves the tool, so that two different handlers under one tool name are refused: a
    // method by its type's path with its generic arguments (known only at run time), any other
    // function by the path rustc gives a closure in its body (its module, impl and name); with
    // the function's generic arguments that no parameter carries. A handler pinned with
    // `name = "..."` by that name (and its instance, if generic).
    let function = item.sig.ident.unraw().to_string();
    let pinned = match &recipe.name {
        Some(_) => quote!(::core::option::Option::Some(#tool_name)),
        None => quote!(::core::option::Option::None),
    };
    let phantom = phantom_generics(item).into_iter().map(|param| match param {
        syn::GenericParam::Type(ty) => {
            let ident = &ty.ident;
            quote!(::core::any::type_name::<#ident>())
        }
        syn::GenericParam::Const(constant) => {
            let ident = &constant.ident;
            quote!(&*#private::shown(&#ident))
        }
        syn::GenericParam::Lifetime(_) => quote!(),
    });
    let owner = if audited {
        quote!(#idem_args.owner_in::<Self>(#function, #pinned, &[#(#phantom),*]);)
    } else {
        let marker = Ident::new("idem_handler_marker", Span::mixed_site());
        quote! {
            #idem_args.owner_at(
                ::core::any::type_name_of_val(&|| ()),
                {
                    fn #marker() {}
                    ::core::any::type_name_of_val(&#marker)
                },
                #function,
                #pinned,
                &[#(#phantom),*],
            );
        }
    };
    // The body's statements go straight into the async block, not as a nested `{ ... }`: a
    // one-line body would otherwise draw `unused_braces` with a suggestion that does not compile.
    let (inner_attrs, body) = item.body_parts();
    let handler = quote! {
        move || async move {
            #inner_attrs
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
            #body
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
    // On an rmcp server's tool: at the server's first idempotent call, whether it serves the
    // status tool its answers name (`mcp::check` is the check at startup).
    let status_check = (mcp && has_self).then(|| {
        let receiver = receiver_ref(item);
        let tool = Ident::new("idem_tool", Span::mixed_site());
        quote! {
            {
                use #private::server_kinds::*;
                // Once this site has looked, every later call costs one atomic load.
                static IDEM_STATUS_CHECKED: ::core::sync::atomic::AtomicBool = ::core::sync::atomic::AtomicBool::new(false);
                #private::check_status_once::<Self>(&IDEM_STATUS_CHECKED, #tool_name, |#tool| (&&#private::Server(#receiver)).idem_serves_status(#tool));
            }
        }
    });
    let run = if mcp {
        let context = Ident::new("idem_context", Span::mixed_site());
        let reconcile = match reconcile {
            Some(reconcile) => quote!(::core::option::Option::Some(#reconcile)),
            None => quote!(#private::no_reconcile()),
        };
        let run = respan(quote!(#private::call_tool), span);
        let note = recipe.replay_note.0;
        let server_tasks = if recipe.task.0 && has_self {
            // Asked only when a repeat of a task tool is about to get a task: whether its server
            // advertises tasks (`get_info`), so that no client is handed a task the server's
            // `tasks/get` cannot answer.
            let receiver = receiver_ref(item);
            quote! {
                ::core::option::Option::Some(&|| {
                    use #private::server_kinds::*;
                    static IDEM_TASKS_CHECKED: ::core::sync::atomic::AtomicBool = ::core::sync::atomic::AtomicBool::new(false);
                    #private::server_tasks(&IDEM_TASKS_CHECKED, #tool_name, (&&#private::Server(#receiver)).idem_advertises_tasks())
                })
            }
        } else {
            quote!(::core::option::Option::None)
        };
        let call = quote!(#private::ToolCall { context: &#context, caller: #caller_expr, replay_note: #note, server_tasks: #server_tasks });
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #call, #idem_args, #reconcile, #handler).await)
    } else if let Some(reconcile) = reconcile {
        let run = respan(quote!(#private::call_reconciling), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #caller_expr, #idem_args, #reconcile, #handler).await)
    } else {
        let run = respan(quote!(#private::call), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #caller_expr, #idem_args, #handler).await)
    };
    // A task's result is rebuilt from its stored JSON by `tasks/get`: only types that render
    // the same from their JSON may run as tasks.
    let task_check = (mcp && recipe.task.0).then(|| {
        let check = respan(quote!(#private::task_result::<#ret>), span);
        quote_spanned!(span=> #check();)
    });
    quote! {
        static __IDEM_RECIPE: #krate::__private::Recipe = #recipe_tokens;
        #task_check
        #status_check
        let mut #idem_args = #private::Arguments::new();
        #owner
        {
            // The `Ok` type's JSON Schema, if it has one: what an operator's verdict must fit.
            use #private::shape_kinds::*;
            #idem_args.result_schema((&&#private::ShapeOf::<#ret>::NEW).idem_result_schema());
        }
        #(#statements)*
        let #handle: ::core::option::Option<#krate::__private::Idem> = #handle_expr;
        #run
    }
}

/// The handler's own type and const parameters that no parameter's type mentions
/// (`load::<OrderRow>(id)`): they are part of which handler runs, not of the call's arguments.
/// A parameter a parameter's type carries (`value: T`, `impl Serialize`) is keyed by its value.
fn phantom_generics(item: &Handler) -> Vec<&syn::GenericParam> {
    let mentioned = |ident: &Ident| {
        item.sig.inputs.iter().any(|input| match input {
            syn::FnArg::Typed(typed) => mentions(typed.ty.to_token_stream(), ident),
            syn::FnArg::Receiver(_) => false,
        })
    };
    item.sig
        .generics
        .params
        .iter()
        .filter(|param| match param {
            syn::GenericParam::Type(ty) => !mentioned(&ty.ident),
            syn::GenericParam::Const(constant) => !mentioned(&constant.ident),
            syn::GenericParam::Lifetime(_) => false,
        })
        .collect()
}

/// Whether `tokens` hold the identifier `ident`, at any depth.
fn mentions(tokens: TokenStream, ident: &Ident) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(found) => found == *ident,
        proc_macro2::TokenTree::Group(group) => mentions(group.stream(), ident),
        _ => false,
    })
}

/// `self` as a `&Self`, whatever the receiver: `&self`, `self`, `self: Arc<Self>`, `self: Pin<&mut Self>`.
fn receiver_ref(item: &Handler) -> TokenStream {
    let Some(receiver) = item.sig.receiver() else { return quote!(self) };
    let self_token = receiver.self_token;
    match &receiver.kind {
        syn::ReceiverKind::Value => quote!(&#self_token),
        syn::ReceiverKind::Typed(_, ty) => match &**ty {
            Type::Path(path) if path.qself.is_none() && path.path.is_ident("Self") => quote!(&#self_token),
            Type::Reference(_) => quote!(#self_token),
            _ => quote!(&*#self_token),
        },
        _ => quote!(#self_token),
    }
}

fn recipe_expr(recipe: &Recipe, tool_name: &str) -> TokenStream {
    let krate = &recipe.krate;
    let keys = recipe.keys.iter().map(|key| &key.text);
    // The namespace defaults to the declaring package's name: stable across module moves.
    let mut expr = quote!(#krate::__private::Recipe::new(#tool_name, &[#(#keys),*]).package(::core::option_env!("CARGO_PKG_NAME")));
    if let Some(secs) = recipe.window_secs {
        expr.extend(quote!(.window(::core::time::Duration::from_secs(#secs))));
    }
    if !recipe.ignore.is_empty() {
        let ignore = recipe.ignore.iter().map(|path| &path.text);
        expr.extend(quote!(.ignore(&[#(#ignore),*])));
    }
    if recipe.tenant_scope {
        expr.extend(quote!(.scope(#krate::__private::ScopeRule::Tenant)));
    }
    if let Some(within) = &recipe.within {
        let text = &within.text;
        expr.extend(quote!(.scope(#krate::__private::ScopeRule::Within(#text))));
    }
    if recipe.task.0 {
        expr.extend(quote!(.task(true)));
    }
    if !recipe.input_key.0.is_empty() {
        let paths = &recipe.input_key.0;
        expr.extend(quote!(.input_key(&[#(#paths),*])));
    }
    if recipe.single_use_state.0 {
        expr.extend(quote!(.single_use_state(true)));
    }
    match recipe.client_key.0 {
        ClientKey::Ignored => {}
        ClientKey::Optional => expr.extend(quote!(.client_key(#krate::__private::ClientKey::Optional))),
        ClientKey::Required => expr.extend(quote!(.client_key(#krate::__private::ClientKey::Required))),
    }
    match recipe.stale {
        Stale::Hold => {}
        Stale::Takeover => expr.extend(quote!(.stale(#krate::__private::StalePolicy::Takeover))),
        Stale::Reconcile(_) => expr.extend(quote!(.stale(#krate::__private::StalePolicy::Reconcile))),
    }
    if let Some(secs) = recipe.wait_secs {
        expr.extend(quote!(.wait(::core::time::Duration::from_secs(#secs))));
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
