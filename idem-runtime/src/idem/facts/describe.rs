//! A tool's result shape as its operator reads it: on one line (`ToolFacts::expected_shape`)
//! and as a value that fits it (`ToolFacts::example`).

use serde_json::{Map, Value};

use super::resolve;

/// A value of `schema`'s shape (see [`ToolFacts::example`](super::ToolFacts::example)).
pub(super) fn example(schema: &Value, root: &Value, depth: usize) -> Value {
    let Value::Object(object) = schema else { return Value::Null };
    if depth == 0 {
        return Value::Null;
    }
    if let Some(Value::Array(examples)) = object.get("examples")
        && let Some(first) = examples.first()
    {
        return sorted(first);
    }
    for word in ["const", "default"] {
        if let Some(value) = object.get(word) {
            return sorted(value);
        }
    }
    if let Some(Value::Array(allowed)) = object.get("enum")
        && let Some(first) = allowed.first()
    {
        return sorted(first);
    }
    if let Some(Value::String(reference)) = object.get("$ref") {
        return resolve(root, reference).map_or(Value::Null, |target| example(target, root, depth - 1));
    }
    for word in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(forms)) = object.get(word)
            && let Some(first) = forms.first()
        {
            return example(first, root, depth - 1);
        }
    }
    let name = match object.get("type") {
        Some(Value::String(name)) => name.as_str(),
        // `["string", "null"]`: the first that is not null.
        Some(Value::Array(names)) => {
            names.iter().filter_map(Value::as_str).find(|name| *name != "null").unwrap_or("null")
        }
        _ if object.contains_key("properties") => "object",
        _ => return Value::Null,
    };
    match name {
        "object" => {
            let required: Vec<&str> = match object.get("required") {
                Some(Value::Array(required)) => required.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let members = match object.get("properties") {
                // By name, as `describe_object` lists them.
                Some(Value::Object(properties)) => by_name(properties)
                    .into_iter()
                    .filter(|(name, _)| required.contains(&name.as_str()))
                    .map(|(name, form)| (name.clone(), example(form, root, depth - 1)))
                    .collect(),
                _ => Map::new(),
            };
            Value::Object(members)
        }
        "array" => {
            let prefix = match object.get("prefixItems") {
                Some(Value::Array(prefix)) => prefix.iter().map(|form| example(form, root, depth - 1)).collect(),
                _ => Vec::new(),
            };
            let least = object.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let mut items: Vec<Value> = prefix;
            while (items.len() as u64) < least.min(16) {
                items.push(object.get("items").map_or(Value::Null, |form| example(form, root, depth - 1)));
            }
            Value::Array(items)
        }
        "integer" | "number" => {
            let least = object.get("minimum").filter(|bound| bound.as_i64().is_some_and(|bound| bound > 0));
            least.cloned().unwrap_or(Value::from(0))
        }
        "string" => Value::String(String::new()),
        "boolean" => Value::Bool(false),
        _ => Value::Null,
    }
}

/// `schema` on one line, `depth` levels deep.
pub(super) fn describe(schema: &Value, root: &Value, depth: usize) -> String {
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
            return forms.iter().map(|form| describe(form, root, depth)).collect::<Vec<_>>().join(" | ");
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
            "array" => match (object.get("prefixItems"), object.get("items")) {
                (Some(Value::Array(prefix)), items) => {
                    let mut parts: Vec<String> = prefix.iter().map(|form| describe(form, root, depth - 1)).collect();
                    if items != Some(&Value::Bool(false)) {
                        parts.push("…".to_owned());
                    }
                    format!("[{}]", parts.join(", "))
                }
                (_, Some(items)) => format!("[{}]", describe(items, root, depth - 1)),
                (_, None) => "[any]".to_owned(),
            },
            "integer" | "number" => format!("{name}{}", describe_bounds(object)),
            "string" if object.get("contentEncoding").and_then(Value::as_str) == Some("base64") => {
                "string (base64)".to_owned()
            }
            other => other.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `value` with every object's members by name, as a build without serde_json's
/// `preserve_order` keeps them: what an operator is shown does not depend on the build.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(members) => {
            Value::Object(by_name(members).into_iter().map(|(name, member)| (name.clone(), sorted(member))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// A schema's members by name, whatever order the map keeps: serde_json's `preserve_order`, which
/// a crate beside idem may turn on (rig-core does), keeps the schema's.
fn by_name(properties: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut members: Vec<(&String, &Value)> = properties.iter().collect();
    members.sort_by_key(|(name, _)| *name);
    members
}

fn describe_object(object: &Map<String, Value>, root: &Value, depth: usize) -> String {
    let Some(Value::Object(properties)) = object.get("properties") else { return "object".to_owned() };
    let required: Vec<&str> = match object.get("required") {
        Some(Value::Array(required)) => required.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let members: Vec<String> = by_name(properties)
        .into_iter()
        // A member a form does not take (`"base64": false` beside `"text"`) is not listed.
        .filter(|(_, form)| **form != Value::Bool(false))
        .map(|(name, form)| {
            let optional = if required.contains(&name.as_str()) { "" } else { "?" };
            format!("\"{name}\"{optional}: {}", describe(form, root, depth - 1))
        })
        .collect();
    format!("{{{}}}", members.join(", "))
}

/// A number's bounds in words (` from 100 to 599`), unless a `format` names them: schemars
/// writes a sized integer's own range (`uint64`, at least 0), which its type already says.
fn describe_bounds(object: &Map<String, Value>) -> String {
    if object.contains_key("format") {
        return String::new();
    }
    match (object.get("minimum"), object.get("maximum")) {
        (Some(least), Some(most)) => format!(" from {least} to {most}"),
        (Some(least), None) => format!(" of at least {least}"),
        (None, Some(most)) => format!(" of at most {most}"),
        (None, None) => String::new(),
    }
}
