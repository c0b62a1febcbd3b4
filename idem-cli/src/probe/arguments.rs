//! The arguments each probe calls a tool with: from a fixtures file (`{"tool": [{…}, …]}`, or
//! one object per tool), or generated from the tool's `inputSchema`. Every `{unique}` in a
//! fixture's strings becomes a fresh token for each probe, so each probe starts an operation of
//! its own; a generated object puts one in every string.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// Where a tool's arguments come from.
pub enum Source {
    /// These fixtures, in turn.
    Fixtures(Vec<Map<String, Value>>),
    /// Generated from this input schema.
    Generated(Value),
}

impl Source {
    /// The arguments for one probe: the next fixture (or a generated object), with fresh
    /// tokens. Whether they hold a fresh token: without one, every probe repeats one operation.
    pub fn next(&self, turn: usize) -> (Map<String, Value>, bool) {
        let token = fresh();
        let value = match self {
            Self::Fixtures(list) => Value::Object(list[turn % list.len()].clone()),
            Self::Generated(schema) => generate(schema, schema, 0),
        };
        let mut fresh_seen = false;
        let value = substitute(value, &token, &mut fresh_seen);
        let Value::Object(object) = value else { unreachable!("a fixture or a generated input is an object") };
        (object, fresh_seen)
    }
}

/// Reads a fixtures file: a JSON object from tool name to one argument object or a list of them.
pub fn read_fixtures(path: &str) -> Result<BTreeMap<String, Vec<Map<String, Value>>>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("cannot read the fixtures file {path}: {error}"))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|error| format!("the fixtures file {path} is not JSON: {error}"))?;
    let Value::Object(tools) = value else {
        return Err(format!("the fixtures file {path} must be an object: {{\"tool\": [{{arguments}}, …]}}"));
    };
    let mut fixtures = BTreeMap::new();
    for (tool, entry) in tools {
        let list = match entry {
            Value::Object(object) => vec![object],
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::Object(object) => Ok(object),
                    other => Err(format!("fixtures for `{tool}`: each entry is an argument object, not {other}")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            other => return Err(format!("fixtures for `{tool}`: an argument object or a list of them, not {other}")),
        };
        if list.is_empty() {
            return Err(format!("fixtures for `{tool}`: the list is empty"));
        }
        fixtures.insert(tool, list);
    }
    Ok(fixtures)
}

fn fresh() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", nanos & 0xffff_ffff_ffff, COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn substitute(value: Value, token: &str, seen: &mut bool) -> Value {
    match value {
        Value::String(text) if text.contains("{unique}") => {
            *seen = true;
            Value::String(text.replace("{unique}", token))
        }
        Value::Array(items) => Value::Array(items.into_iter().map(|item| substitute(item, token, seen)).collect()),
        Value::Object(object) => {
            Value::Object(object.into_iter().map(|(name, item)| (name, substitute(item, token, seen))).collect())
        }
        other => other,
    }
}

/// A value that fits `schema` (the parts of JSON Schema tools use: types, required members,
/// enums, defaults, `$ref` to `$defs`/`definitions`); strings carry `{unique}`.
fn generate(root: &Value, schema: &Value, depth: usize) -> Value {
    if depth > 6 {
        return Value::Null;
    }
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next().unwrap_or_default();
        let found = root.get("$defs").or_else(|| root.get("definitions")).and_then(|defs| defs.get(name));
        return found.map_or(Value::Null, |schema| generate(root, schema, depth + 1));
    }
    if let Some(value) = schema.get("const").or_else(|| schema.get("default")) {
        return value.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(first) = ["anyOf", "oneOf", "allOf"]
        .iter()
        .find_map(|key| schema.get(*key).and_then(Value::as_array).and_then(|options| options.first()))
    {
        return generate(root, first, depth + 1);
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => {
            kinds.iter().filter_map(Value::as_str).find(|kind| *kind != "null").unwrap_or("null")
        }
        _ if schema.get("properties").is_some() => "object",
        _ => "string",
    };
    match kind {
        "object" => {
            let mut object = Map::new();
            let properties = schema.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|names| names.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, property) in properties.into_iter().flatten() {
                // Every required member, and at the top level every member: a probe wants the
                // arguments a caller would send.
                if depth == 0 || required.contains(&name.as_str()) {
                    object.insert(name.clone(), generate(root, property, depth + 1));
                }
            }
            Value::Object(object)
        }
        "array" => {
            let item = schema
                .get("items")
                .map_or(Value::String("probe-{unique}".into()), |items| generate(root, items, depth + 1));
            Value::Array(vec![item])
        }
        "integer" => schema.get("minimum").cloned().unwrap_or(Value::from(1)),
        "number" => schema.get("minimum").cloned().unwrap_or(Value::from(1.5)),
        "boolean" => Value::Bool(true),
        "null" => Value::Null,
        _ => Value::String("probe-{unique}".into()),
    }
}

/// `arguments` with one member that is not part of the key (`key` lists the recipe's key paths,
/// first segments count) changed: the same operation's key with other arguments. `None` when
/// every member is part of the key.
pub fn vary_outside(arguments: &Map<String, Value>, key: &[String]) -> Option<(String, Map<String, Value>)> {
    let keyed = |name: &str| key.iter().any(|path| path.split('.').next() == Some(name));
    let (name, value) = arguments.iter().find(|(name, _)| !keyed(name))?;
    let changed = match value {
        Value::Number(number) => match number.as_i64() {
            Some(n) => Value::from(n + 1),
            None => Value::from(number.as_f64().unwrap_or(0.0) + 1.0),
        },
        Value::String(text) => Value::String(format!("{text}-other")),
        Value::Bool(flag) => Value::Bool(!flag),
        Value::Array(items) => {
            let mut items = items.clone();
            items.push(items.first().cloned().unwrap_or(Value::Null));
            Value::Array(items)
        }
        Value::Object(_) | Value::Null => Value::String("other".into()),
    };
    let mut varied = arguments.clone();
    varied.insert(name.clone(), changed);
    Some((name.clone(), varied))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_probe_gets_fresh_tokens() {
        let source =
            Source::Fixtures(vec![json!({"order_id": "o-{unique}", "amount": 5}).as_object().unwrap().clone()]);
        let ((first, fresh), (second, _)) = (source.next(0), source.next(1));
        assert!(fresh);
        assert_ne!(first["order_id"], second["order_id"]);
        assert_eq!(first["amount"], 5);
    }

    #[test]
    fn a_schema_gives_an_object_that_fits_it() {
        let schema = json!({
            "type": "object",
            "properties": {
                "names": {"type": "array", "items": {"type": "string"}},
                "amount_cents": {"type": "integer", "minimum": 1},
                "item": {"$ref": "#/$defs/Item"}
            },
            "required": ["names"],
            "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}}
        });
        let (object, fresh) = Source::Generated(schema).next(0);
        assert!(fresh);
        assert!(object["names"][0].as_str().unwrap().starts_with("probe-"));
        assert_eq!(object["amount_cents"], 1);
        assert!(object["item"]["sku"].is_string());
    }

    #[test]
    fn a_member_outside_the_key_is_changed() {
        let arguments = json!({"order_id": "o-1", "amount_cents": 1250}).as_object().unwrap().clone();
        let (name, varied) = vary_outside(&arguments, &["order_id".to_owned()]).unwrap();
        assert_eq!((name.as_str(), &varied["amount_cents"]), ("amount_cents", &json!(1251)));
        assert!(vary_outside(&arguments, &["order_id".to_owned(), "amount_cents".to_owned()]).is_none());
    }
}
