//! A call's arguments as its recipe sees them: every argument by name (the fingerprint's
//! input), the key's arguments by path, the task or conversation id (`within`) — and the scope and moment a key is
//! derived in ([`Derive`]).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::canonical::{self, CanonicalError};
use crate::key::Key;
use crate::recipe::{Recipe, ScopeRule};
use crate::rejection::Rejection;
use crate::scope::{Caller, Scope};

use super::Idem;
use super::keyring::no_secret;

/// A call's arguments, split the way a recipe needs them.
#[derive(Debug, Default)]
pub(crate) struct CallArguments<'a> {
    /// Every argument by name (the fingerprint's input; ignored names are dropped there).
    pub(crate) all: std::borrow::Cow<'a, Map<String, Value>>,
    /// The key's arguments by path.
    pub(crate) selected: Map<String, Value>,
    /// The task or conversation id, for `ScopeRule::Within`.
    pub(crate) within: Option<Value>,
}

impl CallArguments<'static> {
    /// Canonicalises `arguments` (an object of arguments by name, refused otherwise) and splits
    /// them by the recipe's paths.
    pub(super) fn of<A: Serialize + ?Sized>(recipe: &Recipe, arguments: &A) -> Result<Self, Rejection> {
        let invalid = |error| Rejection::InvalidArguments { error };
        let Value::Object(all) = canonical::arguments_to_value(arguments).map_err(invalid)? else {
            return Err(invalid(CanonicalError::Invalid { message: "the arguments must be a JSON object".to_owned() }));
        };
        // A missing or null key path is refused: as `null` it would make every call without it
        // (a typo, a forgetful client) one operation. Only the recipe's optional key paths take
        // "absent" as a value, and then absent and null are one value.
        let mut selected = Map::with_capacity(recipe.key_paths().len());
        for path in recipe.key_paths() {
            let value = match lookup(&all, path) {
                Some(value) if !value.is_null() => value.clone(),
                _ if recipe.is_optional_key(path) => Value::Null,
                _ => {
                    return Err(Rejection::InvalidArguments {
                        error: CanonicalError::MissingKey { path: (*path).to_owned() },
                    });
                }
            };
            selected.insert((*path).to_owned(), value);
        }
        let within = match recipe.scope_rule().within() {
            Some(path) => lookup(&all, path).cloned(),
            None => None,
        };
        Ok(Self { all: std::borrow::Cow::Owned(all), selected, within })
    }
}

/// The value at a dotted argument path (`"customer.id"`).
fn lookup<'a>(arguments: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut segments = path.split('.');
    let first = arguments.get(segments.next()?)?;
    segments.try_fold(first, |value, segment| value.as_object()?.get(segment))
}

/// What a claim is derived from, apart from the secret.
pub(super) struct Derive<'r, 'a, 's> {
    pub(super) recipe: &'r Recipe,
    pub(super) scope: &'s Scope,
    pub(super) arguments: &'a CallArguments<'a>,
    /// Ledger time when the call is claimed.
    pub(super) now: u64,
    /// Whether `now` can be acted on (see [`crate::ledger::ClaimRequest::clock_trusted`]).
    pub(super) clock_trusted: bool,
}

/// The scope `recipe` keys a call of `caller` in.
pub(super) fn scope_of(recipe: &Recipe, caller: &Caller, arguments: &CallArguments<'_>) -> Result<Scope, Rejection> {
    let rule = recipe.scope_rule();
    Ok(match (rule.within(), &arguments.within) {
        _ if rule == ScopeRule::Tenant => Scope::tenant(caller),
        (Some(_), Some(within)) if !within.is_null() => Scope::task(caller, within.clone()),
        (Some(path), _) => {
            return Err(Rejection::InvalidArguments {
                error: CanonicalError::Invalid {
                    message: format!(
                        "the argument `{path}` (the task or conversation id the key's scope is narrowed to) is \
                         missing; pass it"
                    ),
                },
            });
        }
        (None, _) => Scope::caller(caller),
    })
}

impl Idem {
    /// The key a call of `recipe` by `caller` with `arguments` (as given to [`Idem::call`]) has
    /// under this handle's current secret: what the handler would see as
    /// [`Operation::ledger_key`](super::Operation::ledger_key), and whose [`Key::reference`] the
    /// caller would be given. For operators and tests; a secret-less derivation does not exist.
    ///
    /// # Errors
    /// As [`Idem::call`] refuses: no secret, invalid arguments, a missing `within` argument.
    pub fn key_of(
        &self,
        recipe: &Recipe,
        caller: &Caller,
        arguments: &(impl Serialize + ?Sized),
    ) -> Result<Key, Rejection> {
        let keyring = self.keyring().map_err(|error| no_secret(&error))?;
        let arguments = CallArguments::of(recipe, arguments)?;
        let scope = scope_of(recipe, caller, &arguments)?;
        Key::derive(&keyring.current, self.namespace(recipe), &scope, recipe.tool(), &arguments.selected)
            .map_err(|error| Rejection::InvalidArguments { error })
    }
}
