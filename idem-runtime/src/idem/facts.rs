//! What an operator is shown of a tool beside its operations: the shape of its result (the
//! JSON Schema of its `Ok` value, when its type has one) and its stale policy. The handles that
//! serve a tool write them to the ledger ([`Ledger::keep_tool_facts`]) at its first call; the
//! operator's verbs read them to show what a verdict must look like (`idem show`) and to refuse
//! a "completed" verdict that the tool could not read back ([`Admin::resolve`]).
//!
//! The check is deliberately partial, and errs one way: it reads `type`, `enum`, `const`,
//! `required`, `properties`, `additionalProperties`, `items`, `prefixItems`, `anyOf`, `oneOf`
//! (as `anyOf`), `allOf` and local `$ref`s — what schemars writes for serde types — and ignores
//! every other keyword (formats, bounds, patterns). So a value it refuses is one the tool cannot
//! decode; a value it accepts may still fail a bound it does not read.
//!
//! [`Ledger::keep_tool_facts`]: crate::ledger::Ledger::keep_tool_facts
//! [`Admin::resolve`]: super::Admin::resolve

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::recipe::StalePolicy;

/// How deep a shape is described on one line before it is shown as `…`.
const DESCRIBE_DEPTH: usize = 4;
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

    /// Whether `value` fits the result's shape: `Err` says where and how it does not. A tool
    /// without a declared shape accepts anything.
    ///
    /// # Errors
    /// `value` does not fit the shape (see the module's note on what is checked).
    pub fn check(&self, value: &Value) -> Result<(), String> {
        match &self.result_schema {
            Some(schema) => check(schema, schema, value, "the result", CHECK_DEPTH),
            None => Ok(()),
        }
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

fn check(schema: &Value, root: &Value, value: &Value, at: &str, depth: usize) -> Result<(), String> {
    let object = match schema {
        Value::Bool(false) => return Err(format!("{at} is not allowed here")),
        Value::Object(object) if depth > 0 => object,
        _ => return Ok(()),
    };
    if let Some(Value::String(reference)) = object.get("$ref")
        && let Some(target) = resolve(root, reference)
    {
        check(target, root, value, at, depth - 1)?;
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
        if let Some(Value::Array(forms)) = object.get(word)
            && !forms.iter().any(|form| check(form, root, value, at, depth - 1).is_ok())
        {
            let first = forms.first().map(|form| check(form, root, value, at, depth - 1));
            let why = first.and_then(Result::err).unwrap_or_default();
            return Err(format!("{at} fits none of its {} forms (the first: {why})", forms.len()));
        }
    }
    if let Some(Value::Array(all)) = object.get("allOf") {
        for form in all {
            check(form, root, value, at, depth - 1)?;
        }
    }
    if let Value::Object(members) = value {
        check_object(object, root, members, at, depth)?;
    }
    if let Value::Array(items) = value {
        let prefix = match object.get("prefixItems") {
            Some(Value::Array(prefix)) => prefix.as_slice(),
            _ => &[],
        };
        for (index, item) in items.iter().enumerate() {
            if let Some(form) = prefix.get(index).or_else(|| object.get("items")) {
                check(form, root, item, &format!("{at}[{index}]"), depth - 1)?;
            }
        }
    }
    Ok(())
}

fn check_object(
    object: &Map<String, Value>,
    root: &Value,
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
            Some(form) => check(form, root, member, &member_at, depth - 1)?,
            None => match object.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!("{at} has the member \"{name}\", which it does not take"));
                }
                Some(form @ Value::Object(_)) => check(form, root, member, &member_at, depth - 1)?,
                _ => {}
            },
        }
    }
    Ok(())
}

/// `schema` on one line, `depth` levels deep.
fn describe(schema: &Value, root: &Value, depth: usize) -> String {
    let Value::Object(object) = schema else {
        return if schema == &Value::Bool(false) { "nothing".to_owned() } else { "any".to_owned() };
    };
    if depth == 0 {
        return "…".to_owned();
    }
    if let Some(Value::String(reference)) = object.get("$ref") {
        return resolve(root, reference).map_or_else(|| "any".to_owned(), |target| describe(target, root, depth - 1));
    }
    if let Some(Value::Array(allowed)) = object.get("enum") {
        return allowed.iter().map(Value::to_string).collect::<Vec<_>>().join(" | ");
    }
    if let Some(expected) = object.get("const") {
        return expected.to_string();
    }
    for word in ["anyOf", "oneOf"] {
        if let Some(Value::Array(forms)) = object.get(word) {
            return forms.iter().map(|form| describe(form, root, depth - 1)).collect::<Vec<_>>().join(" | ");
        }
    }
    let types: Vec<&str> = match object.get("type") {
        Some(Value::String(name)) => vec![name.as_str()],
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
        _ if object.contains_key("properties") => vec!["object"],
        _ => vec![],
    };
    if types.is_empty() {
        return "any".to_owned();
    }
    types
        .iter()
        .map(|name| match *name {
            "object" => describe_object(object, root, depth),
            "array" => match object.get("items") {
                Some(items) => format!("[{}]", describe(items, root, depth - 1)),
                None => "[any]".to_owned(),
            },
            other => other.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn describe_object(object: &Map<String, Value>, root: &Value, depth: usize) -> String {
    let Some(Value::Object(properties)) = object.get("properties") else { return "object".to_owned() };
    let required: Vec<&str> = match object.get("required") {
        Some(Value::Array(required)) => required.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let members: Vec<String> = properties
        .iter()
        .map(|(name, form)| {
            let optional = if required.contains(&name.as_str()) { "" } else { "?" };
            format!("\"{name}\"{optional}: {}", describe(form, root, depth - 1))
        })
        .collect();
    format!("{{{}}}", members.join(", "))
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
}
