//! The handler's parameters as the key and the fingerprint see them: which one is the arguments
//! struct, which are extractors, and the statements that feed each to `idem_args`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, Pat, Type};

use crate::attr::Ctxt;
use crate::handler::Handler;
use crate::valid::{ArgPath, Recipe};

use super::{EXTRACTORS, find_ident};

/// A handler parameter as the key and the fingerprint see it.
pub(super) struct Param {
    /// The name in the body of the generated code (the user's, or ours for a pattern).
    pub(super) binding: Ident,
    /// The name in the fingerprint and in messages.
    pub(super) name: String,
    /// Named by its type like an rmcp extractor: not a candidate for the arguments struct.
    pub(super) likely_extractor: bool,
    /// A plain value (no named fields): not a candidate for the arguments struct.
    pub(super) plain: bool,
    /// Its `#[cfg(...)]` attributes, repeated on every statement that reads it.
    pub(super) cfgs: Vec<Attribute>,
    /// The user could name it in `key`, `ignore` or `within` (not a destructuring pattern).
    pub(super) nameable: bool,
    /// How to reach it as the handler's arguments struct, if it can be one: its name, the value
    /// a struct pattern destructures (`Order { order_id, .. }: Order`), or the one field a
    /// newtype pattern unwraps (`Body(order): Body<Order>`, a renamed `Parameters`).
    pub(super) root: Option<TokenStream>,
    /// A JSON object (`JsonObject`, `Map`, `Value`): no key path can name its members.
    pub(super) json_object: bool,
    /// Not refused already (an `impl Trait` argument is, once): statements may read it.
    pub(super) keyable: bool,
}

/// How the handler's parameters feed the key and the fingerprint.
pub(super) struct Arguments {
    /// Statements filling `idem_args`.
    pub(super) statements: Vec<TokenStream>,
    /// `let PATTERN = idem_param_N;` for parameters whose pattern was replaced by a plain name.
    pub(super) rebinds: Vec<TokenStream>,
}

impl Arguments {
    #[allow(clippy::too_many_lines)]
    pub(super) fn collect(cx: &mut Ctxt, recipe: &Recipe, item: &mut Handler) -> Self {
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
            // An `impl Trait` whose bounds do not say `Serialize` is refused here, in words:
            // rustc's own error would suggest a bound on idem's internals. One that says so is
            // keyed by its value, as any other argument.
            let keyable = ignored_param(&name) || !is_impl_trait(&typed.ty) || says_serialize(&typed.ty);
            if !keyable {
                let shown = typed.ty.to_token_stream().to_string().replace(" < ", "<").replace(" >", ">");
                cx.error(
                    typed.ty.span(),
                    format!(
                        "`{name}` cannot be keyed or fingerprinted: every argument is serialised, and `{shown}` \
                         does not say it is `serde::Serialize`; add the bound (`{name}: {shown} + \
                         serde::Serialize`), take a generic parameter (`<P: serde::Serialize>` and `{name}: P`) \
                         or a concrete type (`{name}: String`), or, if it is a dependency rather than part of \
                         the call, leave it out with `ignore = \"{name}\"`"
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
pub(super) const JSON_OBJECTS: &[&str] = &["JsonObject", "Map", "Value"];

/// What a key path cannot name, and how to make it nameable.
pub(super) const UNNAMED: &str = "a destructured parameter cannot be named: name it (`order: Order`) and destructure it \
                       in the body; a single arguments struct may be destructured, and a key then names its fields";

/// `idem_args.insert("name", &value)` for an argument, nothing for an extractor: by type.
pub(super) fn insert(args: &Ident, param: &Param, kind: &dyn Fn(&TokenStream, Span) -> TokenStream) -> TokenStream {
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
pub(super) fn paths_through_option<'a>(recipe: &'a Recipe, name: &str, ty: &Type) -> Option<&'a ArgPath> {
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
pub(super) fn unordered_set(ty: &Type) -> Option<Span> {
    find_ident(ty.to_token_stream(), "HashSet")
}

/// Whether `ty` is a value with no named fields (a string, a number, a collection), so that it
/// cannot be an arguments struct. Anything else might be one.
pub(super) fn is_plain_value(ty: &Type) -> bool {
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
pub(super) fn is_impl_trait(ty: &Type) -> bool {
    match ty {
        Type::ImplTrait(_) => true,
        Type::Reference(reference) => is_impl_trait(&reference.elem),
        Type::Paren(paren) => is_impl_trait(&paren.elem),
        _ => false,
    }
}

/// Whether an `impl Trait` type (or a reference to one) names `Serialize` among its bounds
/// (`impl Serialize + Send`, `&impl serde::Serialize`).
pub(super) fn says_serialize(ty: &Type) -> bool {
    match ty {
        Type::ImplTrait(bounds) => bounds.bounds.iter().any(|bound| {
            matches!(bound, syn::TypeParamBound::Trait(bound)
                if bound.path.segments.last().is_some_and(|last| last.ident == "Serialize"))
        }),
        Type::Reference(reference) => says_serialize(&reference.elem),
        Type::Paren(paren) => says_serialize(&paren.elem),
        _ => false,
    }
}

/// The first type argument of `ty` when its last path segment is `name` (`T` of `Json<T>`).
pub(super) fn first_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
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
pub(super) fn json_output(ty: &Type) -> Option<&Type> {
    let ok = first_type_argument(ty, "Result").unwrap_or(ty);
    let done = first_type_argument(ok, "Step").unwrap_or(ok);
    first_type_argument(done, "Json")
}

pub(super) fn last_segment_is(ty: &Type, names: &[&str]) -> bool {
    let ty = match ty {
        Type::Reference(reference) => &*reference.elem,
        other => other,
    };
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|s| names.iter().any(|n| s.ident == n)))
}
