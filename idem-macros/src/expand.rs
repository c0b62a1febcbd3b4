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

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, Pat, ReturnType, Type};

use crate::attr::Ctxt;
use crate::handler::Handler;
use crate::tool::{ToolAttr, is_tool};
use crate::valid::{ArgPath, Recipe, Stale};

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
    // hosts and gateways, and so the startup audit (`mcp::checked_router`) sees every audited
    // impl's tools in whatever router holds them.
    let krate = &recipe.krate;
    let (function, backing) = if recipe.inherent.is_some() {
        (quote!(#krate::__private::backed_meta), quote!(#krate::__private::Backing::Inherent))
    } else {
        let recipe = recipe_expr(recipe, &name);
        (quote!(#krate::__private::recipe_meta), quote!(&#recipe))
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

/// A handler parameter as the key and the fingerprint see it.
struct Param {
    /// The name in the body of the generated code (the user's, or ours for a pattern).
    binding: Ident,
    /// The name in the fingerprint and in messages.
    name: String,
    /// Named by its type like an rmcp extractor: not a candidate for the arguments struct.
    likely_extractor: bool,
    /// A plain value (no named fields): not a candidate for the arguments struct.
    plain: bool,
    /// Its `#[cfg(...)]` attributes, repeated on every statement that reads it.
    cfgs: Vec<Attribute>,
    /// The user could name it in `key`, `ignore` or `within` (not a destructuring pattern).
    nameable: bool,
    /// How to reach it as the handler's arguments struct, if it can be one: its name, the value
    /// a struct pattern destructures (`Order { order_id, .. }: Order`), or the one field a
    /// newtype pattern unwraps (`Body(order): Body<Order>`, a renamed `Parameters`).
    root: Option<TokenStream>,
    /// A JSON object (`JsonObject`, `Map`, `Value`): no key path can name its members.
    json_object: bool,
    /// Not refused already (an `impl Trait` argument is, once): statements may read it.
    keyable: bool,
}

/// How the handler's parameters feed the key and the fingerprint.
struct Arguments {
    /// Statements filling `idem_args`.
    statements: Vec<TokenStream>,
    /// `let PATTERN = idem_param_N;` for parameters whose pattern was replaced by a plain name.
    rebinds: Vec<TokenStream>,
}

impl Arguments {
    #[allow(clippy::too_many_lines)]
    fn collect(cx: &mut Ctxt, recipe: &Recipe, item: &mut Handler) -> Self {
        let mut rebinds = Vec::new();
        let mut params: Vec<Param> = Vec::new();
        // The arguments struct: how to reach it, its `cfg`s, and where to report it (its type).
        let mut params_struct: Option<(TokenStream, Vec<Attribute>, Span)> = None;
        // Where the arguments struct is a JSON object (`Parameters<JsonObject>`), whose members
        // no key path can name at compile time.
        let mut json_root: Option<Span> = None;
        let ignored_param = |name: &str| recipe.ignore.iter().any(|path| path.text == name);
        for (index, input) in item.sig.inputs.iter_mut().enumerate() {
            let FnArg::Typed(typed) = input else { continue };
            let cfgs: Vec<Attribute> = typed.attrs.iter().filter(|attr| attr.path().is_ident("cfg")).cloned().collect();
            let is_params = last_segment_is(&typed.ty, &["Parameters"]);
            if matches!(&*typed.pat, Pat::Wild(_)) && !is_params {
                // `_: T`: the handler reads nothing of it, so it is neither keyed nor
                // fingerprinted (changing it is no conflict), and no path can name it.
                continue;
            }
            let (binding, name, nameable, root) = match &*typed.pat {
                Pat::Ident(pat) if pat.subpat.is_none() && pat.by_ref.is_none() => {
                    let name = pat.ident.unraw().to_string();
                    let binding = if name.starts_with('_') {
                        // Read at the macro's own span, so that clippy's `used_underscore_binding`
                        // does not blame the user's `_x` for what the macro reads.
                        Ident::new(&pat.ident.to_string(), Span::call_site())
                    } else {
                        pat.ident.clone()
                    };
                    let root = quote!(#binding);
                    (binding, name, true, Some(root))
                }
                pattern => {
                    // Give the parameter a name of ours and bind the user's pattern inside the body.
                    let name = pattern.to_token_stream().to_string().replace(' ', "");
                    let ident = Ident::new(&format!("idem_param_{index}"), Span::mixed_site());
                    let root = match pattern {
                        Pat::Struct(_) => Some(quote!(#ident)),
                        Pat::TupleStruct(newtype) if newtype.elems.len() == 1 => Some(quote!(#ident.0)),
                        _ => None,
                    };
                    let pattern = std::mem::replace(&mut *typed.pat, syn::parse_quote!(#ident));
                    rebinds.push(quote!(#(#cfgs)* let #pattern = #ident;));
                    (ident, name, false, root)
                }
            };
            let keyable = ignored_param(&name) || !is_impl_trait(&typed.ty);
            if !keyable {
                cx.error(
                    typed.ty.span(),
                    format!(
                        "`{name}` cannot be keyed or fingerprinted: every argument is serialised, and an \
                         `impl Trait` type is not known to be `serde::Serialize`; take a concrete type (`{name}: \
                         String`), or, if it is a dependency rather than part of the call, leave it out with \
                         `ignore = \"{name}\"`"
                    ),
                );
            }
            if !ignored_param(&name)
                && let Some(span) = unordered_set(&typed.ty)
            {
                cx.error(
                    span,
                    format!(
                        "a `HashSet` cannot be part of an idempotency key or fingerprint: each deserialised set \
                         iterates in its own random order, so every retry would get a different key (a duplicate) \
                         or a spurious conflict; use a `BTreeSet` for `{name}` (an `IndexSet` also works)"
                    ),
                );
            }
            if let Some(path) = paths_through_option(recipe, &name, &typed.ty) {
                cx.error(
                    path.span,
                    format!(
                        "`{name}` is an `Option`, so the key path `{}` may lead nowhere; key on `{name}` itself \
                         (then `None` and each `Some` are different operations) or make `{name}` required",
                        path.text
                    ),
                );
            }
            if is_params && params_struct.is_none() {
                let inner = first_type_argument(&typed.ty, "Parameters");
                if inner.is_some_and(|inner| last_segment_is(inner, JSON_OBJECTS)) {
                    json_root = Some(typed.ty.span());
                }
                params_struct = Some((quote!(#binding.0), cfgs, typed.ty.span()));
            } else {
                params.push(Param {
                    binding,
                    name,
                    likely_extractor: last_segment_is(&typed.ty, EXTRACTORS),
                    plain: is_plain_value(&typed.ty),
                    cfgs,
                    nameable,
                    root,
                    json_object: last_segment_is(&typed.ty, JSON_OBJECTS),
                    keyable,
                });
            }
        }
        // One argument that no path names is the handler's arguments struct: paths are its fields
        // — named, destructured by a struct pattern, or unwrapped by a newtype pattern.
        // Not when it is a plain value (`order_id: String`): a path that does not name it is a
        // misspelt argument, and "no argument named" says so better than "no field on `String`".
        let candidates: Vec<&Param> = params.iter().filter(|param| !param.likely_extractor).collect();
        let paths = || recipe.keys.iter().chain(&recipe.ignore).chain(&recipe.within);
        let mut root_param: Option<String> = None;
        if params_struct.is_none()
            && let [single] = candidates[..]
            && !single.plain
            && single.keyable
            && let Some(root) = &single.root
            && !paths().any(|path| path.text.split('.').next() == Some(single.name.as_str()))
        {
            params_struct = Some((root.clone(), single.cfgs.clone(), single.binding.span()));
            root_param = Some(single.name.clone());
            if single.json_object {
                json_root = Some(single.binding.span());
            }
        }
        if json_root.is_some() && recipe.keys.iter().chain(&recipe.within).next().is_some() {
            for path in recipe.keys.iter().chain(&recipe.within) {
                cx.error(
                    path.span,
                    format!(
                        "a key cannot name `{}` inside a JSON object argument: its members are only known at run \
                         time; declare the arguments as a struct (`#[derive(Serialize, Deserialize, JsonSchema)] \
                         struct Args {{ {}: String, .. }}`) and take that instead — or call `Idem::call`, whose \
                         recipe names members of any JSON object",
                        path.text,
                        path.text.split('.').next().unwrap_or_default(),
                    ),
                );
            }
            return Self { statements: Vec::new(), rebinds };
        }
        let args = Ident::new("idem_args", Span::mixed_site());
        let private = {
            let krate = &recipe.krate;
            quote!(#krate::__private)
        };
        let path_expr =
            |root: &TokenStream, segments: &[Ident], span: Span| quote_spanned!(span=> &#root #(.#segments)*);
        // `(&&&&&&Probe(&value)).idem_kind()`: the value's type decides what it is (see `Probe`).
        let kind = |value: &TokenStream, span: Span| {
            let probe = quote_spanned!(span=> #private::Probe(#value));
            quote!((&&&&&&#probe).idem_kind())
        };
        let mut statements = vec![quote!(use #private::kinds::*;)];
        let named = |param: &Param| param.nameable.then(|| param.name.clone());
        if let Some((root, cfgs, span)) = &params_struct {
            // Through a name located at the struct's type, so that a struct that is not
            // `Serialize` is reported there (see `ArgumentsStruct`).
            let whole = Ident::new("idem_arguments_struct", Span::mixed_site().located_at(*span));
            statements.push(quote!(#(#cfgs)* let #whole = &#root;));
            statements.push(quote!(#(#cfgs)* #args.all(#whole);));
            for key in &recipe.keys {
                let text = &key.text;
                let value = path_expr(root, &key.segments, key.span);
                let kind = kind(&value, key.span);
                statements.push(quote!(#(#cfgs)* #kind.select(&mut #args, #text, #value);));
            }
            if let Some(within) = &recipe.within {
                let value = path_expr(root, &within.segments, within.span);
                statements.push(quote!(#(#cfgs)* #args.within(#value);));
            }
            for ignored in &recipe.ignore {
                if params.iter().any(|param| {
                    named(param).as_deref() == Some(ignored.text.as_str())
                        && root_param.as_deref() != Some(ignored.text.as_str())
                }) {
                    continue; // another parameter, left out below
                }
                // Not read, only named, so that rustc checks the field exists (E0609 on the literal).
                let value = path_expr(root, &ignored.segments, ignored.span);
                statements.push(quote!(#(#cfgs)* let _ = #value;));
            }
            // The other parameters: extractors are left out by type; anything else is an argument.
            for param in &params {
                if root_param.as_deref() == Some(param.name.as_str()) || ignored_param(&param.name) || !param.keyable {
                    continue;
                }
                statements.push(insert(&args, param, &kind));
            }
            return Self { statements, rebinds };
        }
        let names: Vec<String> = params.iter().filter_map(named).collect();
        for path in paths() {
            let first = path.text.split('.').next().unwrap_or_default();
            if !names.iter().any(|name| name == first) {
                let list = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
                let options = match (list.is_empty(), params.iter().any(|param| !param.nameable)) {
                    (true, false) => "it has none".to_owned(),
                    (true, true) => format!("it has no named ones ({UNNAMED})"),
                    (false, false) => format!("its arguments are {list}"),
                    (false, true) => format!("its arguments are {list} ({UNNAMED})"),
                };
                cx.error(path.span, format!("no argument named `{first}` in this handler; {options}"));
            }
        }
        for param in &params {
            if !ignored_param(&param.name) && param.keyable {
                statements.push(insert(&args, param, &kind));
            }
        }
        let rooted = |path: &ArgPath| {
            let param = params.iter().find(|param| {
                param.nameable && param.keyable && path.text.split('.').next() == Some(param.name.as_str())
            });
            param.map(|param| {
                // The whole path at the literal, so rustc's errors about it underline the literal.
                let mut root = param.binding.clone();
                root.set_span(path.span.resolved_at(root.span()));
                let root = root.to_token_stream();
                (path_expr(&root, &path.segments[1..], path.span), param.cfgs.clone())
            })
        };
        for key in &recipe.keys {
            let Some((value, cfgs)) = rooted(key) else { continue };
            let text = &key.text;
            let kind = kind(&value, key.span);
            statements.push(quote!(#(#cfgs)* #kind.select(&mut #args, #text, #value);));
        }
        if let Some(within) = &recipe.within
            && let Some((value, cfgs)) = rooted(within)
        {
            statements.push(quote!(#(#cfgs)* #args.within(#value);));
        }
        Self { statements, rebinds }
    }
}

/// The types of a JSON object argument, by their last path segment (rmcp's `JsonObject`,
/// `serde_json`'s `Map` and `Value`).
const JSON_OBJECTS: &[&str] = &["JsonObject", "Map", "Value"];

/// What a key path cannot name, and how to make it nameable.
const UNNAMED: &str = "a destructured parameter cannot be named: name it (`order: Order`) and destructure it \
                       in the body; a single arguments struct may be destructured, and a key then names its fields";

/// `idem_args.insert("name", &value)` for an argument, nothing for an extractor: by type.
fn insert(args: &Ident, param: &Param, kind: &dyn Fn(&TokenStream, Span) -> TokenStream) -> TokenStream {
    let binding = &param.binding;
    let span = binding.span().resolved_at(Span::mixed_site());
    let span = if param.nameable { param.binding.span() } else { span };
    let value = quote_spanned!(span=> &#binding);
    let kind = kind(&value, span);
    let name = &param.name;
    let cfgs = &param.cfgs;
    quote!(#(#cfgs)* #kind.insert(&mut #args, #name, #value);)
}

/// A key or `within` path that reaches into the parameter `name` of type `Option<...>`.
fn paths_through_option<'a>(recipe: &'a Recipe, name: &str, ty: &Type) -> Option<&'a ArgPath> {
    if !last_segment_is(ty, &["Option"]) {
        return None;
    }
    recipe
        .keys
        .iter()
        .chain(&recipe.within)
        .find(|path| path.segments.len() > 1 && path.text.split('.').next() == Some(name))
}

/// Where `ty` names a `HashSet` (at any depth: `Option<HashSet<_>>`, `Vec<HashSet<_>>`).
fn unordered_set(ty: &Type) -> Option<Span> {
    find_ident(ty.to_token_stream(), "HashSet")
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

/// Whether `ty` is an `impl Trait` (or a reference to one).
fn is_impl_trait(ty: &Type) -> bool {
    match ty {
        Type::ImplTrait(_) => true,
        Type::Reference(reference) => is_impl_trait(&reference.elem),
        Type::Paren(paren) => is_impl_trait(&paren.elem),
        _ => false,
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

/// `T` of a `Json<T>` or `Result<Json<T>, E>` return type (as rmcp's `#[tool]` reads it), or
/// of a `Result<Step<Json<T>>, E>` (a tool that may ask for input first).
fn json_output(ty: &Type) -> Option<&Type> {
    let ok = first_type_argument(ty, "Result").unwrap_or(ty);
    let done = first_type_argument(ok, "Step").unwrap_or(ok);
    first_type_argument(done, "Json")
}

fn last_segment_is(ty: &Type, names: &[&str]) -> bool {
    let ty = match ty {
        Type::Reference(reference) => &*reference.elem,
        other => other,
    };
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|s| names.iter().any(|n| s.ident == n)))
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
    // method by its type's path (known only at run time), a function by its module's; a
    // handler pinned with `name = "..."` by that name (the runtime's default).
    let function = item.sig.ident.unraw().to_string();
    let owner = match (&recipe.name, audited) {
        (Some(_), _) => None,
        (None, true) => Some(quote!(#idem_args.owner_in::<Self>(#function);)),
        (None, false) => Some(quote!(#idem_args.owner(::core::concat!(::core::module_path!(), "::", #function));)),
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
    // status tool its answers name (`mcp::check_status_served` is the check at startup).
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
        let run = respan(quote!(#private::run_mcp), span);
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
        let run = respan(quote!(#private::run_reconciling), span);
        quote_spanned!(span=> #run(#handle.as_ref(), &__IDEM_RECIPE, #caller_expr, #idem_args, #reconcile, #handler).await)
    } else {
        let run = respan(quote!(#private::run), span);
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
        #(#statements)*
        let #handle: ::core::option::Option<#krate::__private::Idem> = #handle_expr;
        #run
    }
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
