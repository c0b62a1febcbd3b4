//! The owner a call records, from the type names `#[idempotent]` passes in: the handler's path
//! (a method's type with its generic arguments, a function's module and impl), and the instance
//! of a generic handler, as its instances run different code.

use super::Arguments;

impl Arguments {
    /// The handler is `function` in an `impl` of `S` (an impl `#[audit_idempotent]` marks, where
    /// `Self` can be named): named by `S`'s path with its generic arguments, so that two
    /// instances of a generic service (`Store<OrderRow>`, `Store<InvoiceRow>`), which run
    /// different code, are two handlers. `pinned`: the tool's name, if `name = "..."` pins it;
    /// `phantom`: the function's own generic arguments that no parameter carries (see
    /// [`Arguments::owner_at`]).
    pub fn owner_in<S: ?Sized>(&mut self, function: &str, pinned: Option<&str>, phantom: &[&str]) {
        let ty = without_lifetimes(std::any::type_name::<S>());
        let ty = ty.as_str();
        let path = format!("{ty}::{function}{}", turbofish(phantom));
        // The instance: `S`'s generic arguments and the phantom ones.
        let instance = ty.find('<').map(|start| &ty[start..]);
        let instance = match (instance, phantom.is_empty()) {
            (None, true) => None,
            (instance, _) => Some(format!("{}{}", instance.unwrap_or_default(), turbofish(phantom))),
        };
        self.arguments.owner = owner(path, pinned, instance);
    }

    /// The handler is the function `function` declared where `closure` (the type name of a
    /// closure in its body: the function's path with the concrete generic arguments of the
    /// function and of its impl, if any) and `marker` (a function item declared in its body: the
    /// same path without generic arguments) say: a free function, or a function with no `self`
    /// in an impl without `#[audit_idempotent]` (`Parcels::ship` and `Letters::ship` of one
    /// module are two handlers). The function's own generic arguments are left out of the path,
    /// as its arguments carry them (`impl Serialize`, `value: T`: an argument is keyed by its
    /// value, whatever its type); those that no parameter carries (`load::<OrderRow>(id)`) are
    /// `phantom`, and named.
    pub fn owner_at(&mut self, closure: &str, marker: &str, function: &str, pinned: Option<&str>, phantom: &[&str]) {
        let (marker, closure) = (without_lifetimes(marker), without_lifetimes(closure));
        let declared = marker.rsplit_once("::").map_or(marker.as_str(), |(path, _)| path);
        let mut path = closure.as_str();
        while let Some(outer) = path.strip_suffix("::{{closure}}") {
            path = outer;
        }
        let path = without_generic_arguments(path);
        let at = path.strip_suffix(function).filter(|outer| outer.ends_with("::")).map(|_| path);
        // A closure's name in another shape than expected: the declared path, which tells
        // functions apart but not the instances of a generic impl.
        let path = at.unwrap_or(declared);
        let instance = match (path == declared, phantom.is_empty()) {
            (true, true) => None,
            (true, false) => Some(turbofish(phantom)),
            (false, _) => Some(format!("{path}{}", turbofish(phantom))),
        };
        self.arguments.owner = owner(format!("{path}{}", turbofish(phantom)), pinned, instance);
    }
}

/// The owner a call records: the handler's path, or, if `name = "..."` pins the tool, the pin
/// (`None`: the tool's name, which the runtime fills in) — with the instance, if the handler is
/// one of a generic one, as its instances run different code.
fn owner(path: String, pinned: Option<&str>, instance: Option<String>) -> Option<String> {
    match (pinned, instance) {
        (None, _) => Some(path),
        (Some(_), None) => None,
        (Some(tool), Some(instance)) => Some(format!("name = \"{tool}\" for {instance}")),
    }
}

/// `name` without lifetime arguments, which a type's name shows as `'_` (`S<'_>` → `S`,
/// `S<'_, T>` → `S<T>`): they are no part of which code runs, and a type with only lifetime
/// parameters is no generic service.
fn without_lifetimes(name: &str) -> String {
    let mut name = name.to_owned();
    while name.contains("'_") {
        let shorter = name.replace("<'_>", "").replace("<'_, ", "<").replace(", '_,", ",").replace(", '_>", ">");
        if shorter == name {
            break;
        }
        name = shorter;
    }
    name
}

/// `::<A, B>`, or nothing for no arguments.
fn turbofish(arguments: &[&str]) -> String {
    if arguments.is_empty() { String::new() } else { format!("::<{}>", arguments.join(", ")) }
}

/// `path` without the generic arguments of its last segment (`a::f<u8, B<C>>` → `a::f`).
fn without_generic_arguments(path: &str) -> &str {
    if !path.ends_with('>') {
        return path;
    }
    let bytes = path.as_bytes();
    let mut depth = 0_usize;
    for index in (0..bytes.len()).rev() {
        match bytes[index] {
            // `->` of a function pointer type is no bracket.
            b'>' if index == 0 || bytes[index - 1] != b'-' => depth += 1,
            b'<' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &path[..index];
                }
            }
            _ => {}
        }
    }
    path
}

/// A const generic argument as text, for [`Arguments::owner_in`] and [`Arguments::owner_at`].
pub fn shown<T: std::fmt::Display + ?Sized>(value: &T) -> String {
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_path_loses_its_own_generic_arguments_only() {
        assert_eq!(without_generic_arguments("a::f"), "a::f");
        assert_eq!(without_generic_arguments("a::f<u8, b::C<d::E>>"), "a::f");
        assert_eq!(without_generic_arguments("a::S<u8>::f<fn(u8) -> u16>"), "a::S<u8>::f");
        assert_eq!(without_generic_arguments("<a::A as a::H>::f"), "<a::A as a::H>::f");
    }

    fn owner_at(closure: &str, marker: &str, function: &str, pinned: Option<&str>, phantom: &[&str]) -> Option<String> {
        let mut arguments = Arguments::new();
        arguments.owner_at(closure, marker, function, pinned, phantom);
        arguments.arguments.owner
    }

    #[test]
    fn a_function_is_named_by_its_module_impl_and_name() {
        // A free function: as `module_path!()` and its name named it before.
        let free = owner_at("c::m::ship::{{closure}}::{{closure}}", "c::m::ship::marker", "ship", None, &[]);
        assert_eq!(free.as_deref(), Some("c::m::ship"));
        // Its own generic arguments are its arguments'; its impl's are the instance's.
        let generic =
            owner_at("c::m::S<u8>::ship<u16>::{{closure}}::{{closure}}", "c::m::S<_>::ship::marker", "ship", None, &[]);
        assert_eq!(generic.as_deref(), Some("c::m::S<u8>::ship"));
        let phantom = owner_at("c::m::load<c::A>::{{closure}}", "c::m::load::marker", "load", None, &["c::A"]);
        assert_eq!(phantom.as_deref(), Some("c::m::load::<c::A>"));
        // Pinned: the tool's name (the runtime's default), with the instance if generic.
        assert_eq!(owner_at("c::m::ship::{{closure}}", "c::m::ship::marker", "ship", Some("s"), &[]), None);
        let pinned = owner_at("c::m::load<c::A>::{{closure}}", "c::m::load::marker", "load", Some("l"), &["c::A"]);
        assert_eq!(pinned.as_deref(), Some("name = \"l\" for ::<c::A>"));
        // A closure's name in an unexpected shape: the declared path.
        let odd = owner_at("closure@c/m.rs:1:2", "c::m::ship::marker", "ship", None, &[]);
        assert_eq!(odd.as_deref(), Some("c::m::ship"));
    }

    #[test]
    fn lifetimes_are_no_generic_arguments() {
        assert_eq!(without_lifetimes("a::P<'_>"), "a::P");
        assert_eq!(without_lifetimes("a::Q<'_, '_, a::P<'_>>"), "a::Q<a::P>");
        assert_eq!(without_lifetimes("a::Q<u8, '_>::f<'_, fn(&'_ u8)>"), "a::Q<u8>::f<fn(&'_ u8)>");
        let lifetime = owner_at("a::P<'_>::ship::{{closure}}", "a::P<'_>::ship::marker", "ship", Some("s"), &[]);
        assert_eq!(lifetime, None, "a pinned handler of a type with only lifetimes is no instance");
        struct Borrowed<'a>(std::marker::PhantomData<&'a ()>);
        let mut borrowed = Arguments::new();
        borrowed.owner_in::<Borrowed<'_>>("create", None, &[]);
        let named = borrowed.arguments.owner.expect("named");
        assert!(named.ends_with("::Borrowed::create"), "{named}");
    }

    #[test]
    fn a_method_is_named_by_its_type_with_its_generic_arguments() {
        struct Plain;
        struct Generic<T>(std::marker::PhantomData<T>);
        let owner = |arguments: Arguments| arguments.arguments.owner;
        let mut plain = Arguments::new();
        plain.owner_in::<Plain>("create", None, &[]);
        assert_eq!(owner(plain).as_deref(), Some(format!("{}::create", std::any::type_name::<Plain>()).as_str()));
        let mut generic = Arguments::new();
        generic.owner_in::<Generic<u8>>("create", None, &[]);
        assert!(owner(generic).is_some_and(|owner| owner.ends_with("Generic<u8>::create")));
        let mut pinned = Arguments::new();
        pinned.owner_in::<Generic<u8>>("create", Some("make"), &[]);
        assert_eq!(owner(pinned).as_deref(), Some("name = \"make\" for <u8>"));
        let mut pinned = Arguments::new();
        pinned.owner_in::<Plain>("create", Some("make"), &[]);
        assert_eq!(owner(pinned), None);
    }
}
