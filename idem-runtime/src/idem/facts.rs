//! What an operator is shown of a tool beside its operations: the shape of its result (the
//! JSON Schema of its `Ok` value, when its type has one, or the one its recipe carries:
//! [`Recipe::result_schema`]) and its stale policy. The handles that serve a tool write them to
//! the ledger ([`Ledger::keep_tool_facts`]) at its first call; the operator's verbs read them to
//! show what a verdict must look like (`idem show`: the shape and an example) and to refuse a
//! "completed" verdict that does not fit ([`Admin::resolve`]).
//!
//! The check is deliberately partial. It reads `type`, `enum`, `const`, `required`,
//! `properties`, `additionalProperties`, `items`, `prefixItems`, `anyOf`, `oneOf` (as `anyOf`),
//! `allOf` and local `$ref`s — what schemars writes for serde types — and ignores every other
//! keyword but the few below. What it refuses with these is a value the tool cannot decode
//! ([`ToolFacts::readable`]); what it accepts may still fail what it does not read.
//!
//! A verdict is held to a little more ([`ToolFacts::check`]): the bounds `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`, `minItems` and `maxItems` (what schemars writes for
//! sized integers and tuples, and what a recipe's hand-written schema may say: an HTTP status is
//! 100 to 599), `contentEncoding: "base64"` (standard base64, padded, as the HTTP layer keeps a
//! binary body), and `oneOf` as exactly one. A stored result outside these is not taken for
//! unreadable: a repeat may have been answered with it, so it is never replaced.
//!
//! [`Recipe::result_schema`]: crate::Recipe::result_schema
//! [`Ledger::keep_tool_facts`]: crate::ledger::Ledger::keep_tool_facts
//! [`Admin::resolve`]: super::Admin::resolve

mod describe;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::recipe::StalePolicy;
use describe::{describe, example};

/// How deep a shape is described on one line before it is shown as `…` (the forms of an
/// `anyOf` are alternatives at one depth).
const DESCRIBE_DEPTH: usize = 4;
/// How deep an example is made before it is left `null`.
const EXAMPLE_DEPTH: usize = 16;
/// How deep `$ref`s are followed when checking a value (a recursive type's schema refers to
/// itself; a value that deep is accepted unchecked).
const CHECK_DEPTH: usize = 64;

/// What the ledger keeps of a tool for its operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolFacts {
    /// The JSON Schema of the tool's result (its handler's `Ok` value), if its type has one
    /// (`schemars::JsonSchema`, which rmcp's structured output also needs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_schema: Option<Value>,
    /// Its stale policy: `hold`, `takeover` or `reconcile`.
    pub stale: String,
}

impl ToolFacts {
    /// A tool's facts: its stale policy and, if known, its result's schema.
    #[must_use]
    pub fn new(stale: StalePolicy, result_schema: Option<Value>) -> Self {
        let stale = match stale {
            StalePolicy::Takeover => "takeover",
            StalePolicy::Reconcile => "reconcile",
            StalePolicy::Hold => "hold",
        };
        Self { result_schema, stale: stale.to_owned() }
    }

    /// The facts as the ledger keeps them.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The facts a ledger kept, if they read as facts.
    pub(crate) fn from_json(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The result's shape on one line (`{"charge_id": string, "amount_cents": integer}`), if
    /// the tool declared one.
    #[must_use]
    pub fn expected_shape(&self) -> Option<String> {
        let schema = self.result_schema.as_ref()?;
        Some(describe(schema, schema, DESCRIBE_DEPTH))
    }

    /// Whether `value` fits the result's shape, as a "completed" verdict must: `Err` says where
    /// and how it does not. Reads the bounds and encodings too (see the module's note). A tool
    /// without a declared shape accepts anything.
    ///
    /// # Errors
    /// `value` does not fit the shape.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        match &self.result_schema {
            Some(schema) => Checker { root: schema, bounds: true }.check(schema, value, "the result", CHECK_DEPTH),
            None => Ok(()),
        }
    }

    /// Whether a stored `value` could be read back as the tool's result, as far as its shape
    /// tells: [`ToolFacts::check`] without the bounds and encodings. A value it refuses is one no
    /// repeat could have been answered with (each was refused as unreadable), which a fitting
    /// verdict may replace; one it accepts is never taken for unreadable.
    ///
    /// # Errors
    /// `value` is not of the shape's types and members.
    pub fn readable(&self, value: &Value) -> Result<(), String> {
        match &self.result_schema {
            Some(schema) => Checker { root: schema, bounds: false }.check(schema, value, "the result", CHECK_DEPTH),
            None => Ok(()),
        }
    }

    /// A value of the result's shape, to show an operator what a verdict looks like: the
    /// schema's first `examples` entry, else one made from the shape (its members' first allowed
    /// values, `""`, `0`, `false`, empty arrays). `None` for a tool without a declared shape.
    #[must_use]
    pub fn example(&self) -> Option<Value> {
        let schema = self.result_schema.as_ref()?;
        Some(example(schema, schema, EXAMPLE_DEPTH))
    }

    /// Whether the tool recovers a dead holder's operation by itself (`takeover`: it runs again
    /// under the same forwarded key), so an operator need not resolve it. A `reconcile` tool asks
    /// its downstream first, which may not tell; a `hold` tool waits for its operator.
    #[must_use]
    pub fn recovers_by_itself(&self) -> bool {
        self.stale == "takeover"
    }
}

/// The schema a local `$ref` names, if it is one.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if number.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(value: &Value, name: &str) -> bool {
    let actual = type_of(value);
    actual == name || (name == "number" && actual == "integer")
}

/// The check of a value against a schema whose local `$ref`s point into `root`; with or without
/// the bounds and encodings ([`ToolFacts::check`], [`ToolFacts::readable`]).
#[derive(Clone, Copy)]
struct Checker<'a> {
    root: &'a Value,
    bounds: bool,
}

impl Checker<'_> {
    fn check(self, schema: &Value, value: &Value, at: &str, depth: usize) -> Result<(), String> {
        let object = match schema {
            Value::Bool(false) => return Err(format!("{at} is not allowed here")),
            Value::Object(object) if depth > 0 => object,
            _ => return Ok(()),
        };
        if let Some(Value::String(reference)) = object.get("$ref")
            && let Some(target) = resolve(self.root, reference)
        {
            self.check(target, value, at, depth - 1)?;
        }
        if let Some(types) = object.get("type") {
            let names: Vec<&str> = match types {
                Value::String(name) => vec![name.as_str()],
                Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !names.is_empty() && !names.iter().any(|name| is_type(value, name)) {
                return Err(format!("{at} is {} where {} is expected", type_of(value), names.join(" or ")));
            }
        }
        if let Some(Value::Array(allowed)) = object.get("enum")
            && !allowed.contains(value)
        {
            let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Err(format!("{at} is {value} where one of {} is expected", allowed.join(", ")));
        }
        if let Some(expected) = object.get("const")
            && expected != value
        {
            return Err(format!("{at} is {value} where {expected} is expected"));
        }
        for word in ["anyOf", "oneOf"] {
            let Some(Value::Array(forms)) = object.get(word) else { continue };
            let misfits: Vec<String> =
                forms.iter().filter_map(|form| self.check(form, value, at, depth - 1).err()).collect();
            let fits = forms.len() - misfits.len();
            if fits == 0 {
                // The form the value went furthest into says best what is wrong with it.
                let why = misfits.iter().rev().max_by_key(|why| reached(why)).cloned().unwrap_or_default();
                return Err(format!("{at} fits none of its {} forms (the nearest: {why})", forms.len()));
            }
            // Exactly one, for a verdict: a value two forms take is read as one of them.
            if self.bounds && word == "oneOf" && fits > 1 {
                return Err(format!("{at} fits {fits} of its {} forms where exactly one is expected", forms.len()));
            }
        }
        if let Some(Value::Array(all)) = object.get("allOf") {
            for form in all {
                self.check(form, value, at, depth - 1)?;
            }
        }
        if self.bounds {
            check_bounds(object, value, at)?;
        }
        if let Value::Object(members) = value {
            self.check_object(object, members, at, depth)?;
        }
        if let Value::Array(items) = value {
            let prefix = match object.get("prefixItems") {
                Some(Value::Array(prefix)) => prefix.as_slice(),
                _ => &[],
            };
            for (index, item) in items.iter().enumerate() {
                if let Some(form) = prefix.get(index).or_else(|| object.get("items")) {
                    self.check(form, item, &format!("{at}[{index}]"), depth - 1)?;
                }
            }
        }
        Ok(())
    }

    fn check_object(
        self,
        object: &Map<String, Value>,
        members: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), String> {
        if let Some(Value::Array(required)) = object.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !members.contains_key(name) {
                    return Err(format!("{at} lacks the member \"{name}\""));
                }
            }
        }
        let properties = match object.get("properties") {
            Some(Value::Object(properties)) => Some(properties),
            _ => None,
        };
        for (name, member) in members {
            let member_at = format!("{at}.{name}");
            match properties.and_then(|properties| properties.get(name)) {
                Some(Value::Bool(false)) => {
                    return Err(format!("{at} has the member \"{name}\", which it does not take here"));
                }
                Some(form) => self.check(form, member, &member_at, depth - 1)?,
                None => match object.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at} has the member \"{name}\", which it does not take"));
                    }
                    Some(form @ Value::Object(_)) => self.check(form, member, &member_at, depth - 1)?,
                    _ => {}
                },
            }
        }
        Ok(())
    }
}

/// How far into a value a misfit's reason reached: the length of the place it names
/// (`the result.headers[0]` is further than `the result`).
fn reached(why: &str) -> usize {
    [" is ", " lacks ", " has ", " fits "].iter().filter_map(|word| why.find(word)).min().unwrap_or(0)
}

/// The bounds and encodings a verdict is held to: a number's `minimum`, `maximum` and their
/// exclusive forms, an array's `minItems` and `maxItems`, a string's `contentEncoding: "base64"`.
fn check_bounds(object: &Map<String, Value>, value: &Value, at: &str) -> Result<(), String> {
    use std::cmp::Ordering::{Greater, Less};
    if let Value::Number(number) = value {
        let bound = |word: &str, refused: &[std::cmp::Ordering], words: &str| match object.get(word) {
            Some(Value::Number(bound)) if compare(number, bound).is_some_and(|order| refused.contains(&order)) => {
                Err(format!("{at} is {number} where {words} {bound} is expected"))
            }
            _ => Ok(()),
        };
        bound("minimum", &[Less], "at least")?;
        bound("maximum", &[Greater], "at most")?;
        bound("exclusiveMinimum", &[Less, std::cmp::Ordering::Equal], "more than")?;
        bound("exclusiveMaximum", &[Greater, std::cmp::Ordering::Equal], "less than")?;
    }
    if let Value::Array(items) = value {
        let count = items.len() as u64;
        if let Some(least) = object.get("minItems").and_then(Value::as_u64)
            && count < least
        {
            return Err(format!("{at} has {count} items where at least {least} are expected"));
        }
        if let Some(most) = object.get("maxItems").and_then(Value::as_u64)
            && count > most
        {
            return Err(format!("{at} has {count} items where at most {most} are expected"));
        }
    }
    if let Value::String(text) = value
        && object.get("contentEncoding").and_then(Value::as_str) == Some("base64")
    {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|error| format!("{at} is not standard base64 ({error})"))?;
    }
    Ok(())
}

/// Two JSON numbers in order: exactly when both are integers, else as doubles.
fn compare(a: &serde_json::Number, b: &serde_json::Number) -> Option<std::cmp::Ordering> {
    let integer =
        |number: &serde_json::Number| number.as_i64().map(i128::from).or_else(|| number.as_u64().map(i128::from));
    match (integer(a), integer(b)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receipt() -> ToolFacts {
        ToolFacts::new(
            StalePolicy::Hold,
            Some(json!({
                "type": "object",
                "properties": {
                    "charge_id": {"type": "string"},
                    "amount_cents": {"type": "integer", "format": "uint64", "minimum": 0},
                    "status": {"$ref": "#/$defs/Status"},
                    "note": {"type": ["string", "null"]},
                    "lines": {"type": "array", "items": {"type": "number"}}
                },
                "required": ["charge_id", "amount_cents", "status"],
                "$defs": {"Status": {"type": "string", "enum": ["paid", "refunded"]}}
            })),
        )
    }

    #[test]
    fn a_value_of_the_shape_fits() {
        let facts = receipt();
        facts.check(&json!({"charge_id": "ch_1", "amount_cents": 500, "status": "paid"})).unwrap();
        facts
            .check(
                &json!({"charge_id": "ch_1", "amount_cents": 5, "status": "refunded", "note": null, "lines": [1, 2.5]}),
            )
            .unwrap();
    }

    #[test]
    fn a_value_of_another_shape_is_refused_with_where() {
        let facts = receipt();
        let why = facts.check(&json!({"charge": "ch_2"})).unwrap_err();
        assert_eq!(why, "the result lacks the member \"charge_id\"");
        let why = facts.check(&json!({"charge_id": 7, "amount_cents": 5, "status": "paid"})).unwrap_err();
        assert_eq!(why, "the result.charge_id is integer where string is expected");
        let why = facts.check(&json!({"charge_id": "c", "amount_cents": 5, "status": "lost"})).unwrap_err();
        assert!(why.starts_with("the result.status is \"lost\" where one of"), "{why}");
        let why = facts.check(&json!({"charge_id": "c", "amount_cents": 1.5, "status": "paid"})).unwrap_err();
        assert!(why.contains("amount_cents is number where integer"), "{why}");
        let why = facts.check(&json!({"charge_id": "c", "amount_cents": 1, "status": "paid", "lines": ["x"]}));
        assert!(why.unwrap_err().contains("lines[0] is string"));
    }

    #[test]
    fn the_shape_reads_on_one_line() {
        assert_eq!(
            receipt().expected_shape().unwrap(),
            "{\"amount_cents\": integer, \"charge_id\": string, \"lines\"?: [number], \"note\"?: string | null, \
             \"status\": \"paid\" | \"refunded\"}"
        );
        assert_eq!(ToolFacts::new(StalePolicy::Takeover, None).expected_shape(), None);
    }

    #[test]
    fn a_tool_without_a_shape_takes_anything_and_says_how_it_recovers() {
        let facts = ToolFacts::new(StalePolicy::Takeover, None);
        facts.check(&json!(["anything"])).unwrap();
        assert!(facts.recovers_by_itself());
        assert!(!receipt().recovers_by_itself());
        assert!(!ToolFacts::new(StalePolicy::Reconcile, None).recovers_by_itself(), "it may not tell");
        assert_eq!(ToolFacts::from_json(&receipt().to_json()), Some(receipt()));
    }

    #[test]
    fn a_verdict_is_held_to_the_bounds_a_stored_result_is_not() {
        let facts = ToolFacts::new(
            StalePolicy::Hold,
            Some(json!({
                "type": "object",
                "properties": {
                    "code": {"type": "integer", "minimum": 100, "maximum": 599},
                    "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                    "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2},
                    "bytes": {"type": "string", "contentEncoding": "base64"}
                },
                "required": ["code"]
            })),
        );
        facts.check(&json!({"code": 100, "ratio": 0.5, "pair": ["a", 1], "bytes": "AAE="})).unwrap();
        for (value, words) in [
            (json!({"code": 600}), "the result.code is 600 where at most 599 is expected"),
            (json!({"code": 99}), "the result.code is 99 where at least 100 is expected"),
            (json!({"code": 200, "ratio": 1}), "the result.ratio is 1 where less than 1 is expected"),
            (json!({"code": 200, "ratio": 0.0}), "the result.ratio is 0.0 where more than 0 is expected"),
            (json!({"code": 200, "pair": ["a"]}), "the result.pair has 1 items where at least 2 are expected"),
            (json!({"code": 200, "bytes": "AAE"}), "the result.bytes is not standard base64"),
        ] {
            let why = facts.check(&value).unwrap_err();
            assert!(why.starts_with(words), "{value}: {why}");
            facts.readable(&value).unwrap_or_else(|why| panic!("{value} is of the types: {why}"));
        }
        assert!(facts.readable(&json!({"code": "200"})).is_err());
        assert!(facts.readable(&json!({"pair": ["a", 1]})).is_err(), "lacks code");
        assert_eq!(
            facts.expected_shape().unwrap(),
            "{\"bytes\"?: string (base64), \"code\": integer from 100 to 599, \"pair\"?: [string, integer, …], \
             \"ratio\"?: number}"
        );
    }

    #[test]
    fn an_example_fits_its_shape() {
        let example = receipt().example().unwrap();
        assert_eq!(example, json!({"charge_id": "", "amount_cents": 0, "status": "paid"}));
        receipt().check(&example).unwrap();
        let given = ToolFacts::new(StalePolicy::Hold, Some(json!({"type": "integer", "examples": [7]})));
        assert_eq!(given.example(), Some(json!(7)), "a schema's own example first");
        let bounded = ToolFacts::new(StalePolicy::Hold, Some(json!({"type": "integer", "minimum": 100})));
        bounded.check(&bounded.example().unwrap()).unwrap();
        assert_eq!(ToolFacts::new(StalePolicy::Hold, None).example(), None, "no shape, no example");
    }
}
