//! What `#[idempotent]` expands to, whatever the transport. Reached only through
//! `idem_runtime::__private`; nothing here is public API. The rmcp-specific part (the run that
//! answers an rmcp tool, the argument kinds of rmcp's types) is `mcp::macro_support`.

mod owner;

use std::borrow::Borrow;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::canonical::{self, CanonicalError, Members};
use crate::idem::{Call, CallArguments, Idem, Operation, Ran, Reconciled};
use crate::recipe::Recipe;
use crate::rejection::{IdempotentError, Rejection};
use crate::scope::Caller;

pub use owner::shown;

/// A handler's result type, split into what is stored and what is classified.
///
/// `M` tells the shapes apart without overlapping impls: [`Plain`] for `Result<T, E>` whose `T`
/// is stored as it is, and (feature `rmcp`) `RmcpJson` for rmcp's `Result<Json<T>, E>`, whose
/// inner `T` is stored. The generated code never names `M`: it is inferred, as exactly one
/// impl applies to a given type. Whether `Ok` can be stored and `Err` classified is required
/// where the result is run, so that rustc names the type that falls short.
#[diagnostic::on_unimplemented(
    message = "an `#[idempotent]` handler must return `Result<T, E>`, not `{Self}`",
    label = "this return type",
    note = "`T` is stored and replayed to repeats (serde; on an rmcp tool, `rmcp::Json<T>` stores its `T`); \
            `E` implements `idem_runtime::IdempotentError`"
)]
pub trait HandlerResult<M>: Sized {
    /// The success type as the handler returns it (`rmcp::Json<T>` for a stored `T`).
    type Success;
    /// The success type, as it is stored.
    type Ok;
    /// The error type.
    type Err;
    /// As a plain `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// From a plain `Result`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
    /// Whether this result is an input request (a multi-round-trip request, `mcp::Step`)
    /// rather than an outcome: then its `requestState`, which the rmcp run seals to the
    /// operation before it leaves. An input request is answered but never stored, and
    /// `into_result` is never asked of it. Every shape but `mcp::Step` is always an outcome:
    /// `None`, the value left untouched.
    fn request_state(&mut self) -> Option<&mut Option<String>> {
        None
    }
}

/// The [`HandlerResult`] shape of a `Result<T, E>` whose `T` is stored as it is.
pub struct Plain;

impl<T: Storable, E> HandlerResult<Plain> for Result<T, E> {
    type Success = T;
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Self {
        self
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

/// A result idem can store and replay.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed by idem",
    label = "the success type of this `#[idempotent]` handler",
    note = "idem stores the first call's result and replays it to every repeat: derive `serde::Serialize` and \
            `serde::Deserialize` for `{Self}`"
)]
pub trait Storable: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> Storable for T {}

/// A handler's arguments struct (rmcp's `Parameters<T>`), which must serialise: rmcp itself
/// only needs `Deserialize`, so this is where a missing `Serialize` is explained.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the arguments of an `#[idempotent]` handler: it does not implement \
               `serde::Serialize`",
    label = "the arguments of this handler",
    note = "arguments are part of the operation's identity (its key and its conflict fingerprint), so they must \
            be `Serialize`: derive `serde::Serialize` for `{Self}` beside `Deserialize`"
)]
pub trait ArgumentsStruct: Serialize {}

impl<T: Serialize + ?Sized> ArgumentsStruct for T {}

/// Collects a call's arguments from the handler's parameters.
#[derive(Debug, Default)]
pub struct Arguments {
    arguments: CallArguments,
    error: Option<CanonicalError>,
}

impl Arguments {
    /// No arguments yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the first error, its path prefixed with the argument `name`.
    fn refused(&mut self, name: &str, error: CanonicalError) {
        self.error.get_or_insert(error.within(name));
    }

    /// All arguments at once: the handler's arguments struct (rmcp's `Parameters<T>`).
    pub fn all<T: ArgumentsStruct + ?Sized>(&mut self, value: &T) {
        match Members::of_object(value) {
            Ok(Some(members)) => self.arguments.all = members,
            Ok(None) => {
                self.error.get_or_insert(CanonicalError::Invalid {
                    message: "the arguments struct must serialise to a JSON object".to_owned(),
                });
            }
            Err(error) => self.refused("", error),
        }
    }

    /// The JSON Schema of the handler's `Ok` value (from [`ShapeOf`]), kept in the ledger for
    /// its operator.
    pub fn result_schema(&mut self, schema: Option<fn() -> serde_json::Value>) {
        self.arguments.result_schema = schema;
    }

    /// One named argument.
    pub fn insert<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        if let Err(error) = self.arguments.all.insert(name, value) {
            self.refused(name, error);
        }
    }

    /// One of the key's values, by its path.
    pub fn select<T: Serialize + ?Sized>(&mut self, path: &str, value: &T) {
        if let Err(error) = self.arguments.selected.insert(path, value) {
            self.refused(path, error);
        }
    }

    /// The task or conversation id that narrows the scope (`within = "..."`).
    pub fn within<T: Serialize + ?Sized>(&mut self, value: &T) {
        match canonical::to_value(value) {
            Ok(value) => self.arguments.within = Some(value),
            Err(error) => {
                self.arguments.within = None;
                self.refused("within", error);
            }
        }
    }

    pub(crate) fn finish(self) -> Result<CallArguments, Rejection> {
        match self.error {
            Some(error) => Err(Rejection::InvalidArguments { error }),
            None => Ok(self.arguments),
        }
    }
}

/// The `Idem` named by `idem = expr` (an `Idem`, a reference to one, or anything that borrows one).
pub fn handle<I: Borrow<Idem> + ?Sized>(idem: &I) -> Idem {
    idem.borrow().clone()
}

/// The caller named by `caller = expr`.
pub fn caller<C: Borrow<Caller> + ?Sized>(caller: &C) -> Caller {
    caller.borrow().clone()
}

/// The process-wide `Idem` installed with [`Idem::install`], for free functions.
#[must_use]
pub fn installed() -> Option<Idem> {
    Idem::installed()
}

fn no_idem<E: IdempotentError>() -> E {
    E::from_rejection(Rejection::ledger_unavailable(
        "no idem ledger is configured for this handler: call `Idem::install` at startup, implement `HasIdem`, \
         or pass `idem = ...`",
    ))
}

/// Calls a handler under `recipe`: the door of `#[idempotent]` on a plain handler.
pub async fn call<R, M, F, Fut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    caller: Option<Caller>,
    arguments: Arguments,
    handler: F,
) -> R
where
    R: HandlerResult<M>,
    R::Ok: Storable,
    R::Err: IdempotentError,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
{
    let never = |_| async { Reconciled::StillUnknown };
    call_reconciling(idem, recipe, caller, arguments, never, handler).await
}

/// Calls a handler under a `reconcile` recipe.
pub async fn call_reconciling<R, M, F, Fut, C, CFut>(
    idem: Option<&Idem>,
    recipe: &Recipe,
    caller: Option<Caller>,
    arguments: Arguments,
    reconcile: C,
    handler: F,
) -> R
where
    R: HandlerResult<M>,
    R::Ok: Storable,
    R::Err: IdempotentError,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
    C: FnOnce(Operation) -> CFut,
    CFut: Future<Output = Reconciled<R::Ok, R::Err>>,
{
    let Some(idem) = idem else { return R::from_result(Err(no_idem())) };
    let handler = || async { Unrecorded::of(handler().await) };
    let arguments = arguments.finish();
    let served =
        idem.execute(Call { recipe, caller: caller.as_ref(), fallback: true, arguments, reconcile, handler }).await;
    match served.map(|served| served.value) {
        Ok(Ran::Outcome(result)) => R::from_result(result),
        // Off rmcp there is no continuation to check a sealed state against: the input request
        // goes back as the handler made it (and, like every input request, unrecorded).
        Ok(Ran::Unrecorded(Unrecorded::Asked(asked))) => asked,
        Ok(Ran::Unrecorded(Unrecorded::Refused(rejection))) | Err(rejection) => {
            R::from_result(Err(R::Err::from_rejection(rejection)))
        }
    }
}

/// What a round of a tool ends with when it records nothing (a multi-round-trip request): the
/// handler's input request, untouched, or idem's refusal of a continuation (its
/// `requestState`) inside the won claim. Both mean nothing happened: the claim is let go (a
/// continuation claims afresh), and nothing is stored.
pub enum Unrecorded<R> {
    /// The handler's input request, untouched.
    Asked(R),
    /// idem refused to run the handler.
    Refused(Rejection),
}

impl<R> Unrecorded<R> {
    /// The handler's result as the engine takes it: an input request goes back unrecorded, an
    /// outcome is recorded.
    pub(crate) fn of<M>(mut result: R) -> Ran<R::Ok, R::Err, Self>
    where
        R: HandlerResult<M>,
    {
        if result.request_state().is_some() {
            return Ran::Unrecorded(Self::Asked(result));
        }
        Ran::Outcome(result.into_result())
    }
}

/// Which handler parameters are arguments, decided by type (never by a type's name, which a
/// user type could share): the generated code calls
/// `(&&&&&&Probe(&value)).idem_kind().insert(&mut arguments, "name", &value)`, and method
/// resolution picks the first impl that applies, in this order (autoref specialisation):
///
/// 1. rmcp's raw arguments map (`JsonObject`): an argument;
/// 2. idem's own handle and caller (`Idem`, `Caller`): left out;
/// 3. rmcp's extractors (what rmcp's own `FromContextPart` builds from the request context):
///    left out;
/// 4. a `HashSet`, whose serialised order differs from one deserialisation to the next: refused;
/// 5. anything `Serialize`: an argument;
/// 6. anything else: refused, with a message that names the fixes.
pub struct Probe<'a, T: ?Sized>(pub &'a T);

/// An argument: serialised into the key or the fingerprint.
pub struct Serialized;
/// Not an argument (an extractor, idem's handle or caller): left out.
pub struct Skipped;
/// A `HashSet`: refused at compile time.
pub struct Unordered;
/// Not `Serialize`: refused at compile time.
pub struct Unserializable;

/// Level 1: rmcp's raw arguments map (implemented in `mcp::macro_support`, feature `rmcp`).
pub trait RawArgumentsKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Serialized {
        Serialized
    }
}

/// Level 2: idem's own handle and caller.
pub trait IdemKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Skipped {
        Skipped
    }
}
impl<T: IdemParameter + ?Sized> IdemKind for &&&&Probe<'_, T> {}

/// idem's own parameters (`idem = ...`, `caller = ...`), never part of the arguments.
pub trait IdemParameter {}
impl IdemParameter for Idem {}
impl IdemParameter for Caller {}
impl<T: IdemParameter + ?Sized> IdemParameter for &T {}

/// Level 3: rmcp's extractors (implemented in `mcp::macro_support`, feature `rmcp`).
pub trait ExtractorKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Skipped {
        Skipped
    }
}

/// Level 4: a `HashSet`.
pub trait UnorderedKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Unordered {
        Unordered
    }
}
impl<T, S> UnorderedKind for &&Probe<'_, std::collections::HashSet<T, S>> {}

/// Level 5: a serialisable argument.
pub trait SerializedKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Serialized {
        Serialized
    }
}
impl<T: Serialize + ?Sized> SerializedKind for &Probe<'_, T> {}

/// Level 6: anything else.
pub trait UnserializableKind {
    /// The tag for this level.
    fn idem_kind(&self) -> Unserializable {
        Unserializable
    }
}
impl<T: ?Sized> UnserializableKind for Probe<'_, T> {}

impl Serialized {
    /// A named argument.
    pub fn insert<T: Serialize + ?Sized>(self, arguments: &mut Arguments, name: &str, value: &T) {
        arguments.insert(name, value);
    }
    /// A key path's value.
    pub fn select<T: Serialize + ?Sized>(self, arguments: &mut Arguments, path: &str, value: &T) {
        arguments.select(path, value);
    }
}

impl Skipped {
    /// Not an argument: nothing to record.
    pub fn insert<T: ?Sized>(self, _: &mut Arguments, _: &str, _: &T) {}
    /// Named by a key path: then it is part of the key after all, and must serialise.
    pub fn select<T: Serialize + ?Sized>(self, arguments: &mut Arguments, path: &str, value: &T) {
        arguments.select(path, value);
    }
}

/// Never implemented: the message of a `HashSet` argument.
#[diagnostic::on_unimplemented(
    message = "a `HashSet` cannot be part of an idempotency key or fingerprint: its serialised order changes \
               from one call to the next",
    label = "this argument is a `HashSet`",
    note = "each deserialised `HashSet` iterates in its own random order, so every retry would get a different \
            key (a duplicate) or a spurious conflict: use a `BTreeSet` (or an `IndexSet`, which keeps the order \
            it was sent in)"
)]
pub trait OrderedCollection {}

impl Unordered {
    /// Refused: see [`OrderedCollection`].
    pub fn insert<T: OrderedCollection + ?Sized>(self, _: &mut Arguments, _: &str, _: &T) {}
    /// Refused: see [`OrderedCollection`].
    pub fn select<T: OrderedCollection + ?Sized>(self, _: &mut Arguments, _: &str, _: &T) {}
}

/// Never implemented: the message of an argument that cannot be serialised.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key or fingerprint: it does not implement \
               `serde::Serialize`",
    label = "this argument is serialised into the key or the fingerprint",
    note = "if it is part of the call, derive `serde::Serialize` for it; if it is a dependency (a database \
            handle, a client, a config), leave it out with `#[idempotent(ignore = \"...\")]` naming this argument"
)]
pub trait KeyArgument {}

impl Unserializable {
    /// Refused: see [`KeyArgument`].
    pub fn insert<T: KeyArgument + ?Sized>(self, _: &mut Arguments, _: &str, _: &T) {}
    /// Refused: see [`KeyArgument`].
    pub fn select<T: KeyArgument + ?Sized>(self, _: &mut Arguments, _: &str, _: &T) {}
}

/// The kind traits, for the generated `use` (their methods share a name on purpose).
pub mod kinds {
    pub use super::{
        ExtractorKind as _, IdemKind as _, RawArgumentsKind as _, SerializedKind as _, UnorderedKind as _,
        UnserializableKind as _,
    };
}

/// Asks whether a handler's return type `R` is a `Result` whose `Ok` type has a JSON Schema:
/// `(&&ShapeOf::<R>::NEW).idem_result_schema()`, with `__private::shape_kinds` in scope. The schema is
/// what an operator's verdict is checked against.
pub struct ShapeOf<R: ?Sized>(std::marker::PhantomData<fn() -> Box<R>>);

impl<R: ?Sized> ShapeOf<R> {
    /// The probe.
    pub const NEW: Self = Self(std::marker::PhantomData);
}

/// The fallback of [`ShapeOf`]: no schema.
pub trait NoShapeKind {
    /// None: the type has no schema.
    fn idem_result_schema(&self) -> Option<fn() -> serde_json::Value> {
        None
    }
}

impl<R: ?Sized> NoShapeKind for ShapeOf<R> {}
