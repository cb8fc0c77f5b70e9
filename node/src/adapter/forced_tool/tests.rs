use super::super::fake;
use super::*;

fn tool(name: &str, parameters: &str) -> pb::ToolDefinition {
    pb::ToolDefinition { name: name.into(), parameters_json: parameters.into(), ..Default::default() }
}

fn request(tools: Vec<pb::ToolDefinition>, mode: pb::ToolChoiceMode, name: &str) -> pb::RunRequest {
    pb::RunRequest {
        tools,
        options: Some(pb::GenerationOptions {
            tool_choice: Some(pb::ToolChoice { mode: mode.into(), name: name.into() }),
            ..Default::default()
        }),
        ..fake::request(vec![fake::user("hi")])
    }
}

const WEATHER: &str = r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;

#[test]
fn named_or_single_required_tool_is_enforced_by_its_parameter_schema() {
    let tools = || vec![tool("time", ""), tool("weather", WEATHER)];
    let (forced, schema, only) = plan(&request(tools(), pb::ToolChoiceMode::Named, "weather")).unwrap().unwrap();
    assert_eq!(forced, ForcedTool::Named("weather".into()));
    assert_eq!(schema, serde_json::from_str::<Value>(WEATHER).unwrap());
    assert_eq!(only, Some(1));
    let (forced, schema, only) =
        plan(&request(vec![tool("time", "")], pb::ToolChoiceMode::Required, "")).unwrap().unwrap();
    assert_eq!(forced, ForcedTool::Named("time".into()));
    assert_eq!(schema, json!({"type": "object", "properties": {}}));
    assert_eq!(only, Some(0));
    for mode in [pb::ToolChoiceMode::Auto, pb::ToolChoiceMode::None] {
        assert_eq!(plan(&request(tools(), mode, "")).unwrap(), None);
    }
}

#[test]
fn required_among_several_tools_is_a_choice_schema() {
    let (forced, schema, only) =
        plan(&request(vec![tool("time", ""), tool("weather", WEATHER)], pb::ToolChoiceMode::Required, ""))
            .unwrap()
            .unwrap();
    assert_eq!(forced, ForcedTool::Choice(vec!["time".into(), "weather".into()]));
    assert_eq!(only, None);
    let choice = |name: &str, arguments: Value| {
        json!({"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
               "required": ["name", "arguments"], "additionalProperties": false})
    };
    assert_eq!(
        schema,
        json!({"anyOf": [
            choice("time", json!({"type": "object", "properties": {}})),
            choice("weather", serde_json::from_str(WEATHER).unwrap()),
        ]})
    );
}

/// A pydantic model with a nested model refers to `#/$defs/...`; inside
/// the choice the references follow the tool's schema.
#[test]
fn references_inside_a_choice_point_to_the_tools_own_definitions() {
    let nested = r##"{"type":"object","properties":{"place":{"$ref":"#/$defs/Place"},"self":{"$ref":"#"},
            "other":{"$ref":"https://example.com/s.json"}},"$defs":{"Place":{"type":"object","properties":{"near":{"$ref":"#/$defs/Place"}}}}}"##;
    let (_, schema, _) =
        plan(&request(vec![tool("time", ""), tool("where", nested)], pb::ToolChoiceMode::Required, ""))
            .unwrap()
            .unwrap();
    let arguments = &schema["anyOf"][1]["properties"]["arguments"];
    let at = "#/anyOf/1/properties/arguments";
    assert_eq!(arguments["properties"]["place"]["$ref"], format!("{at}/$defs/Place"));
    assert_eq!(arguments["$defs"]["Place"]["properties"]["near"]["$ref"], format!("{at}/$defs/Place"));
    assert_eq!(arguments["properties"]["self"]["$ref"], at);
    assert_eq!(arguments["properties"]["other"]["$ref"], "https://example.com/s.json");
    // Every local reference resolves inside the choice schema.
    let target = format!("{at}/$defs/Place");
    assert!(schema.pointer(target.trim_start_matches('#')).is_some());
    // A named tool's schema is the whole format: unchanged.
    let (_, named, _) =
        plan(&request(vec![tool("where", nested)], pb::ToolChoiceMode::Named, "where")).unwrap().unwrap();
    assert_eq!(named["properties"]["place"]["$ref"], "#/$defs/Place");
}

#[test]
fn what_format_cannot_enforce_is_refused() {
    let no_tools = request(vec![], pb::ToolChoiceMode::Required, "");
    assert!(matches!(plan(&no_tools), Err(AdapterError::InvalidRequest(m)) if m.contains("at least one tool")));
    for kind in [pb::ResponseFormatKind::JsonObject, pb::ResponseFormatKind::JsonSchema] {
        let mut with_format = request(vec![tool("time", "")], pb::ToolChoiceMode::Named, "time");
        with_format.options.as_mut().unwrap().response_format =
            Some(pb::ResponseFormat { kind: kind.into(), schema_json: "{}".into(), ..Default::default() });
        assert!(matches!(plan(&with_format), Err(AdapterError::InvalidRequest(m)) if m.contains("format")));
    }
    let mut text = request(vec![tool("time", "")], pb::ToolChoiceMode::Named, "time");
    text.options.as_mut().unwrap().response_format =
        Some(pb::ResponseFormat { kind: pb::ResponseFormatKind::Text.into(), ..Default::default() });
    assert!(plan(&text).unwrap().is_some());
    let bad_schema = request(vec![tool("time", "[1]")], pb::ToolChoiceMode::Required, "");
    assert!(matches!(plan(&bad_schema), Err(AdapterError::InvalidRequest(_))));
}

#[test]
fn answers_become_calls_or_say_why_not() {
    let named = ForcedTool::Named("weather".into());
    assert_eq!(named.call("{\n  \"city\": \"Paris\"\n}"), Ok(("weather".into(), r#"{"city":"Paris"}"#.into())));
    assert_eq!(named.call("{\"city\": \"Par"), Err(NotACall::NotJson));
    assert_eq!(named.call("[1]"), Err(NotACall::NotObject));
    let choice = ForcedTool::Choice(vec!["time".into(), "weather".into()]);
    assert_eq!(
        choice.call(r#"{"name":"weather","arguments":{"city":"Oslo"}}"#),
        Ok(("weather".into(), r#"{"city":"Oslo"}"#.into()))
    );
    assert_eq!(choice.call(r#"{"name":"time"}"#), Ok(("time".into(), "{}".into())));
    assert_eq!(choice.call(r#"{"name":"rm","arguments":{}}"#), Err(NotACall::UnknownTool));
    assert_eq!(choice.call(r#"{"arguments":{}}"#), Err(NotACall::UnknownTool));
    assert_eq!(choice.call(r#"{"name":"time","arguments":"{}"}"#), Err(NotACall::ArgumentsNotObject));
}
