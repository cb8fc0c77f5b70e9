use super::*;

#[test]
fn examples_follow_the_schema() {
    let cases = [
        ("scalar types", json!({"type": "string"}), json!("mock")),
        ("integer", json!({"type": "integer"}), json!(1)),
        ("number", json!({"type": "number"}), json!(1.5)),
        ("boolean", json!({"type": "boolean"}), json!(true)),
        ("null", json!({"type": "null"}), json!(null)),
        ("no constraint", json!({}), json!(null)),
        ("boolean schema", json!(true), json!(null)),
        ("integer above minimum", json!({"type": "integer", "minimum": 3}), json!(3)),
        ("integer below maximum", json!({"type": "integer", "maximum": -2}), json!(-2)),
        ("number in range", json!({"type": "number", "minimum": 0, "maximum": 1}), json!(1.0)),
        ("nullable string", json!({"type": ["null", "string"]}), json!("mock")),
        ("only null", json!({"type": ["null"]}), json!(null)),
        ("enum first", json!({"type": "string", "enum": ["fast", "slow"]}), json!("fast")),
        ("const", json!({"const": 7}), json!(7)),
        ("anyOf first", json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}), json!(1)),
        ("oneOf first", json!({"oneOf": [{"type": "boolean"}, {"type": "string"}]}), json!(true)),
        (
            "allOf merges objects",
            json!({"allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}},
            ]}),
            json!({"a": "mock", "b": 1}),
        ),
        ("array of items", json!({"type": "array", "items": {"type": "integer"}}), json!([1])),
        ("array without items", json!({"type": "array"}), json!([])),
        ("items imply an array", json!({"items": {"type": "string"}}), json!(["mock"])),
        ("empty object", json!({"type": "object"}), json!({})),
        (
            "all properties when none is required",
            json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}),
            json!({"query": "mock", "limit": 1}),
        ),
        (
            "only the required properties",
            json!({"type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string"}, "recursive": {"type": "boolean"}}}),
            json!({"path": "mock"}),
        ),
        ("properties imply an object", json!({"properties": {"flag": {"type": "boolean"}}}), json!({"flag": true})),
        (
            "a required name without a schema",
            json!({"type": "object", "required": ["x"], "properties": {}}),
            json!({"x": null}),
        ),
        (
            "nested objects and arrays",
            json!({"type": "object", "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object", "required": ["mode"], "properties": {
                    "mode": {"enum": ["read", "write"]},
                    "depth": {"type": "integer"},
                }},
            }}),
            json!({"command": ["mock"], "options": {"mode": "read"}}),
        ),
        (
            "local references ($defs and definitions)",
            json!({"type": "object", "required": ["point", "tag"],
                   "properties": {"point": {"$ref": "#/$defs/Point"}, "tag": {"$ref": "#/definitions/Tag"}},
                   "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}},
                   "definitions": {"Tag": {"type": "string", "enum": ["a"]}}}),
            json!({"point": {"x": 1.5}, "tag": "a"}),
        ),
        ("a remote reference", json!({"$ref": "https://example.com/s.json"}), json!(null)),
    ];
    for (name, schema, want) in cases {
        assert_eq!(example_for_schema(&schema), want, "{name}: {schema}");
    }
}

#[test]
fn a_recursive_schema_ends() {
    let schema = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {
        "type": "object", "required": ["next"], "properties": {"next": {"$ref": "#/$defs/Node"}},
    }}});
    let mut value = &example_for_schema(&schema);
    let mut levels = 0;
    while let Some(next) = value.get("next") {
        value = next;
        levels += 1;
    }
    assert!(value.is_null());
    assert!(levels < MAX_DEPTH, "{levels}");
}
