//! A JSON value that satisfies a JSON Schema: what the mock provider answers
//! when a request constrains its answer to a schema (Ollama's `format`), as
//! a real provider's grammar would force.
//!
//! A small generator for the schemas clients send (pydantic, zod, tool
//! parameter schemas), not a validator: `const`, then the first of `enum`,
//! `anyOf`, `oneOf` and `allOf`; `$ref` to `#/...` inside the same schema
//! (pydantic's `$defs`); `type` (the first non-`null` of a list): an object
//! gets every property in `properties`, an array one item, a string
//! `"mock"`, a number or integer its `minimum` or else 1, a boolean `true`.
//! Without a type, a schema with `properties` is an object and anything
//! else `"mock"`. References deeper than 32 levels (a recursive schema) end
//! in `null`.

use serde_json::{Map, Value};

/// How deep `$ref`s and nesting are followed.
const MAX_DEPTH: usize = 32;

/// A value that satisfies `schema`.
pub fn example_for_schema(schema: &Value) -> Value {
    example(schema, schema, 0)
}

fn example(root: &Value, schema: &Value, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    let Value::Object(s) = schema else {
        // `true` (anything) or a malformed schema.
        return Value::from("mock");
    };
    if let Some(value) = s.get("const") {
        return value.clone();
    }
    if let Some(first) = s.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|schemas| schemas.first()) {
            return example(root, first, depth + 1);
        }
    }
    if let Some(target) = s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
        return root.pointer(target).map_or(Value::Null, |target| example(root, target, depth + 1));
    }
    let ty = match s.get("type") {
        Some(Value::String(ty)) => Some(ty.as_str()),
        Some(Value::Array(types)) => {
            let mut names = types.iter().filter_map(Value::as_str);
            let first = names.clone().next();
            names.find(|t| *t != "null").or(first)
        }
        _ => None,
    };
    match ty {
        Some("object") => object(root, s, depth),
        None if s.contains_key("properties") => object(root, s, depth),
        Some("array") => {
            let item = s.get("items").map_or(Value::from("mock"), |items| example(root, items, depth + 1));
            Value::Array(vec![item])
        }
        Some("integer") => s.get("minimum").and_then(Value::as_i64).map_or(Value::from(1), Value::from),
        Some("number") => s.get("minimum").cloned().filter(Value::is_number).unwrap_or(Value::from(1)),
        Some("boolean") => Value::Bool(true),
        Some("null") => Value::Null,
        _ => Value::from("mock"),
    }
}

fn object(root: &Value, schema: &Map<String, Value>, depth: usize) -> Value {
    let properties = schema.get("properties").and_then(Value::as_object);
    Value::Object(
        properties
            .into_iter()
            .flatten()
            .map(|(name, property)| (name.clone(), example(root, property, depth + 1)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn examples_follow_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 18},
                "score": {"type": "number"},
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "kind": {"enum": ["a", "b"]},
                "fixed": {"const": 7},
                "maybe": {"type": ["null", "string"]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "pet": {"$ref": "#/$defs/Pet"},
                "any": {},
            },
            "required": ["name"],
            "$defs": {"Pet": {"properties": {"legs": {"type": "integer"}}}},
        });
        assert_eq!(
            example_for_schema(&schema),
            json!({"name": "mock", "age": 18, "score": 1, "ok": true, "tags": ["mock"], "kind": "a",
                   "fixed": 7, "maybe": "mock", "either": 1, "pet": {"legs": 1}, "any": "mock"})
        );
        let choice = json!({"anyOf": [
            {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "object", "properties": {"name": {"const": "get_time"}, "arguments": {"type": "object", "properties": {}}}},
        ]});
        assert_eq!(example_for_schema(&choice), json!({"name": "get_weather", "arguments": {"city": "mock"}}));
        assert_eq!(example_for_schema(&json!({"type": "object"})), json!({}));
        let recursive = json!({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"});
        assert!(example_for_schema(&recursive).is_object());
    }
}
