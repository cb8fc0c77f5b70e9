//! A value that fits a JSON schema, for the mock provider: the arguments of
//! its `call tool` answer (from the tool's `parameters` schema, so a client
//! that validates arguments against its own schema accepts them) and its
//! answer to a schema-constrained request (Ollama `format`, OpenAI
//! `response_format`), as a provider's grammar would force it.
//!
//! [`example_for_schema`] is pure and deterministic. It covers what tool
//! schemas use, not all of JSON Schema:
//!
//! | schema | example |
//! |---|---|
//! | `const` | that value |
//! | `enum` | its first value |
//! | `anyOf` / `oneOf` | the first alternative's example |
//! | `allOf` | the alternatives' object examples merged (else the first's) |
//! | `$ref` to `#/...` (`$defs`, `definitions`) | the referenced schema's example |
//! | `type: "object"` (or `properties` without `type`) | the `required` properties, or every property when none is required, each with its example |
//! | `type: "array"` (or `items` without `type`) | one example of `items` (`[]` without `items`) |
//! | `type: "string"` | `"mock"` |
//! | `type: "integer"` | `1`, moved into `minimum`..=`maximum` |
//! | `type: "number"` | `1.5`, moved into `minimum`..=`maximum` |
//! | `type: "boolean"` | `true` |
//! | `type: "null"`, or no constraint at all | `null` |
//!
//! A list of types (`["string", "null"]`) uses its first type that is not
//! `null`. References are followed at most [`MAX_DEPTH`] levels deep (a
//! recursive schema ends in `null`).

use serde_json::{Map, Value, json};

/// How deep nested schemas and references are followed.
pub const MAX_DEPTH: usize = 32;

/// The example string value.
pub const STRING_EXAMPLE: &str = "mock";

/// A value that `schema` accepts (see the module documentation).
pub fn example_for_schema(schema: &Value) -> Value {
    example(schema, schema, 0)
}

fn example(root: &Value, schema: &Value, depth: usize) -> Value {
    let Value::Object(schema) = schema else {
        // `true`, `false` or not a schema: nothing to follow.
        return Value::Null;
    };
    if depth >= MAX_DEPTH {
        return Value::Null;
    }
    let next = depth + 1;
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str).and_then(|r| resolve(root, r)) {
        return example(root, target, next);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(first) = schema.get(key).and_then(Value::as_array).and_then(|alternatives| alternatives.first()) {
            return example(root, first, next);
        }
    }
    if let Some(parts) = schema.get("allOf").and_then(Value::as_array).filter(|parts| !parts.is_empty()) {
        let examples: Vec<Value> = parts.iter().map(|part| example(root, part, next)).collect();
        if examples.iter().all(Value::is_object) {
            let merged: Map<String, Value> =
                examples.into_iter().filter_map(|e| e.as_object().cloned()).flatten().collect();
            return Value::Object(merged);
        }
        return examples.into_iter().next().unwrap_or(Value::Null);
    }
    match schema_type(schema) {
        Some("object") => object_example(root, schema, next),
        Some("array") => match schema.get("items") {
            Some(items @ Value::Object(_)) => json!([example(root, items, next)]),
            _ => json!([]),
        },
        Some("string") => json!(STRING_EXAMPLE),
        Some("integer") => json!(clamp(schema, 1.0).ceil() as i64),
        Some("number") => json!(clamp(schema, 1.5)),
        Some("boolean") => json!(true),
        _ => Value::Null,
    }
}

/// The schema's type: `type` (the first that is not `null` of a list), else
/// what `properties` or `items` imply.
fn schema_type(schema: &Map<String, Value>) -> Option<&str> {
    match schema.get("type") {
        Some(Value::String(ty)) => Some(ty),
        Some(Value::Array(types)) => {
            let mut names = types.iter().filter_map(Value::as_str);
            let first = names.clone().next();
            names.find(|ty| *ty != "null").or(first)
        }
        _ if schema.contains_key("properties") => Some("object"),
        _ if schema.contains_key("items") => Some("array"),
        _ => None,
    }
}

/// The required properties (every property when none is), each with its example.
fn object_example(root: &Value, schema: &Map<String, Value>, depth: usize) -> Value {
    let empty = Map::new();
    let properties = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let names: Vec<&str> = if required.is_empty() { properties.keys().map(String::as_str).collect() } else { required };
    let null = Value::Null;
    let object: Map<String, Value> = names
        .into_iter()
        .map(|name| (name.to_string(), example(root, properties.get(name).unwrap_or(&null), depth)))
        .collect();
    Value::Object(object)
}

/// `value` moved into the schema's `minimum`..=`maximum` (exclusive bounds
/// count as inclusive: good enough for an example).
fn clamp(schema: &Map<String, Value>, value: f64) -> f64 {
    let bound = |keys: [&str; 2]| keys.iter().find_map(|k| schema.get(*k).and_then(Value::as_f64));
    let mut value = value;
    if let Some(min) = bound(["minimum", "exclusiveMinimum"]) {
        value = value.max(min);
    }
    if let Some(max) = bound(["maximum", "exclusiveMaximum"]) {
        value = value.min(max);
    }
    value
}

/// A local reference (`#/$defs/Name`, `#/definitions/Name`, any JSON
/// pointer into the root); `None` for remote ones.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests;
