//! A call's arguments as its recipe sees them: every argument by name (the fingerprint's
//! input), the key's arguments by path, the task or conversation id (`within`) — and the scope and moment a key is
//! derived in ([`Derive`]).

use serde::Serialize;
use serde_json::Value;

use crate::canonical::{self, CanonicalError, Members};
use crate::key::{Fingerprint, Key};
use crate::recipe::{INPUT_KEY_PREFIX, Recipe, ScopeRule};
use crate::rejection::Rejection;
use crate::scope::{Caller, Scope};
use crate::secret::Secret;

/// A call's arguments, split the way a recipe needs them, in canonical form: written once,
/// hashed under each secret (the current one, and previous ones after a rotation).
#[derive(Debug, Default)]
pub(crate) struct CallArguments {
    /// Every argument by name (the fingerprint's input; ignored names are dropped there).
    pub(crate) all: Members,
    /// The key's values by path.
    pub(crate) selected: Members,
    /// The task or conversation id, for `ScopeRule::Within`.
    pub(crate) within: Option<Value>,
    /// The handler that serves the tool, as `#[idempotent]` names it at run time (a method's
    /// `Self` type is known only there); else the recipe's [`Recipe::owner`].
    pub(crate) owner: Option<String>,
    /// The JSON Schema of the handler's `Ok` value, if `#[idempotent]` found one.
    pub(crate) result_schema: Option<fn() -> serde_json::Value>,
}

impl CallArguments {
    /// Canonicalises `arguments` (an object of arguments by name, refused otherwise) in one
    /// pass, finding the recipe's paths on the way.
    pub(crate) fn of<A: Serialize + ?Sized>(recipe: &Recipe, arguments: &A) -> Result<Self, Rejection> {
        let invalid = |error| Rejection::InvalidArguments { error };
        let keys = recipe.key_paths();
        let within_path = recipe.scope_rule().within();
        let (all, found) = match within_path {
            None => Members::of_arguments_at(arguments, keys),
            Some(path) => {
                let paths: Vec<&str> = keys.iter().copied().chain([path]).collect();
                Members::of_arguments_at(arguments, &paths)
            }
        }
        .map_err(invalid)?;
        // A missing or null key path is refused: as `null` it would make every call without it
        // (a typo, a forgetful client) one operation. Only the recipe's optional key paths take
        // "absent" as a value, and then absent and null are one value.
        let mut selected = Members::new();
        for (index, path) in keys.iter().enumerate() {
            match found.get(index) {
                Some(value) if value != b"null" => selected.insert_canonical(path, value),
                _ if recipe.is_optional_key(path) => selected.insert_canonical(path, b"null"),
                _ => {
                    return Err(Rejection::InvalidArguments {
                        error: CanonicalError::MissingKey { path: (*path).to_owned() },
                    });
                }
            }
        }
        // Canonical text reads back as the value it was written from.
        let within = match within_path {
            Some(_) => found.get(keys.len()).map(parse_canonical).transpose().map_err(invalid)?,
            None => None,
        };
        Ok(Self { all, selected, within, owner: None, result_schema: None })
    }

    /// The key of these arguments under `secret`.
    pub(super) fn key(&self, secret: &Secret, namespace: &str, scope: &Scope, tool: &str) -> Result<Key, Rejection> {
        Key::derive_members(secret, namespace, scope, tool, &self.selected)
            .map_err(|error| Rejection::InvalidArguments { error })
    }

    /// The key of these arguments under `secret` without the input responses that joined it
    /// (what a `requestState` is sealed to); `None` if none joined it.
    pub(super) fn key_without_inputs(
        &self,
        secret: &Secret,
        namespace: &str,
        scope: &Scope,
        tool: &str,
    ) -> Result<Option<Key>, Rejection> {
        if !self.selected.names().any(|path| path.starts_with(INPUT_KEY_PREFIX)) {
            return Ok(None);
        }
        let mut without = self.selected.clone();
        without.retain(|path| !path.starts_with(INPUT_KEY_PREFIX));
        let key = Key::derive_members(secret, namespace, scope, tool, &without);
        key.map(Some).map_err(|error| Rejection::InvalidArguments { error })
    }

    /// The fingerprint of these arguments under `secret`, without the `ignore`d ones; its
    /// argument tags are computed when needed ([`Fingerprint::tag`]).
    // A `Result` like the key's: callers refuse alike whichever of the two has no canonical form.
    #[allow(clippy::unnecessary_wraps)]
    pub(super) fn fingerprint(
        &self,
        secret: &Secret,
        ignore: &'static [&'static str],
    ) -> Result<Fingerprint<'_>, Rejection> {
        Ok(Fingerprint::digest_of_members(secret, &self.all, ignore))
    }
}

fn parse_canonical(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let text = std::str::from_utf8(bytes).map_err(|error| CanonicalError::Invalid { message: error.to_string() })?;
    canonical::parse_strict(text)
}

/// The arguments as the `Value` path splits them: the reference the streaming split is tested
/// against.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct ValueArguments {
    pub(crate) all: serde_json::Map<String, Value>,
    pub(crate) selected: serde_json::Map<String, Value>,
    pub(crate) within: Option<Value>,
}

#[cfg(test)]
impl CallArguments {
    /// [`CallArguments::of`] through a `serde_json::Value` (how it was done before the stream).
    pub(crate) fn of_value<A: Serialize + ?Sized>(recipe: &Recipe, arguments: &A) -> Result<ValueArguments, Rejection> {
        let invalid = |error| Rejection::InvalidArguments { error };
        let Value::Object(all) = canonical::arguments_to_value(arguments).map_err(invalid)? else {
            return Err(invalid(CanonicalError::Invalid { message: "the arguments must be a JSON object".to_owned() }));
        };
        let mut selected = serde_json::Map::with_capacity(recipe.key_paths().len());
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
        Ok(ValueArguments { all, selected, within })
    }
}

/// The value at a dotted argument path (`"customer.id"`).
#[cfg(test)]
fn lookup<'a>(arguments: &'a serde_json::Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut segments = path.split('.');
    let first = arguments.get(segments.next()?)?;
    segments.try_fold(first, |value, segment| value.as_object()?.get(segment))
}

/// What a claim is derived from, apart from the secret.
pub(super) struct Derive<'r, 'a, 's> {
    pub(super) recipe: &'r Recipe,
    pub(super) scope: &'s Scope,
    pub(super) arguments: &'a CallArguments,
    /// Ledger time when the call is claimed.
    pub(super) now: u64,
    /// Whether `now` can be acted on (see [`crate::ledger::ClaimRequest::clock_trusted`]).
    pub(super) clock_trusted: bool,
}

/// The scope `recipe` keys a call of `caller` in.
pub(super) fn scope_of(recipe: &Recipe, caller: &Caller, arguments: &CallArguments) -> Result<Scope, Rejection> {
    let rule = recipe.scope_rule();
    Ok(match (rule.within(), &arguments.within) {
        _ if rule == ScopeRule::Tenant => Scope::tenant(caller),
        (Some(_), Some(within)) if !within.is_null() => Scope::within(caller, within.clone()),
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

/// What [`derive`] derives: the key, the fingerprint's digest, the argument tags.
#[doc(hidden)]
pub type Derived = (Key, [u8; 32], Vec<[u8; 4]>);

/// What a call derives from its arguments before it claims — its key, its fingerprint's digest
/// and, for a claim that is sent (`tagged`), its argument tags — as `Attempt::prepare` and
/// `complete_request` derive them, under the scope given (not the one `scope_of` would make for
/// a `within` recipe) and without the scope's tags or the label: for the ledger bench to measure
/// the key's cost. Not public API.
///
/// # Errors
/// What the call would be refused with: arguments with no canonical form, a key path missing.
#[doc(hidden)]
pub fn derive<A: Serialize + ?Sized>(
    secret: &Secret,
    namespace: &str,
    scope: &Scope,
    recipe: &Recipe,
    arguments: &A,
    tagged: bool,
) -> Result<Derived, Rejection> {
    let arguments = CallArguments::of(recipe, arguments)?;
    let key = arguments.key(secret, namespace, scope, recipe.tool())?;
    let mut fingerprint = arguments.fingerprint(secret, recipe.ignore_paths())?;
    if tagged {
        fingerprint.tag(secret);
    }
    Ok((key, *fingerprint.digest(), fingerprint.tags().to_vec()))
}
