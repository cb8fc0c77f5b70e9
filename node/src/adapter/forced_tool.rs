//! A forced tool choice (`required`, or a named tool) on a provider that has
//! no `tool_choice` (Ollama): enforced through the provider's structured
//! output instead. Pure: the schema to send, and the answer read back as a
//! tool call.
//!
//! - A named tool (or `required` with exactly one tool): the schema is that
//!   tool's parameter schema, and the answer is the call's arguments.
//! - `required` with several tools: the schema is a choice among them,
//!   `{"anyOf": [{"type": "object", "properties": {"name": {"const": <tool>},
//!   "arguments": <its parameters>}, "required": ["name", "arguments"],
//!   "additionalProperties": false}, ...]}`, and the answer is
//!   `{"name", "arguments"}`. `anyOf`, `const` and `required` are what
//!   llama.cpp's schema-to-grammar conversion (which Ollama's `format` uses)
//!   supports, so the grammar admits exactly one call of one of the tools.
//!   A tool schema's own references (`#/$defs/...`) are rewritten to point
//!   into its branch.
//!
//! A choice that even this cannot serve is refused: `required` without
//! tools, and any forced choice together with the caller's own
//! `response_format` (both would need the one `format`).

use serde_json::{Value, json};

use super::error::AdapterError;
use super::request::{ResponseFormat, ToolChoice, response_format, tool_choice, tool_parameters};
use iop_proto::pb;

/// How the run's answer becomes its one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ForcedTool {
    /// The answer is the arguments of a call to this tool.
    Named(String),
    /// The answer is `{"name": <one of these>, "arguments": {...}}`.
    Choice(Vec<String>),
}

/// The forced tool choice of `request`, if it has one, with the JSON schema
/// that enforces it and the index of the only tool to offer (`None`: all).
pub(super) fn plan(request: &pb::RunRequest) -> Result<Option<(ForcedTool, Value, Option<usize>)>, AdapterError> {
    let named = match tool_choice(request)? {
        ToolChoice::Default | ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Named(name) => Some(name),
        ToolChoice::Required => None,
    };
    let default_options = pb::GenerationOptions::default();
    if response_format(request.options.as_ref().unwrap_or(&default_options))? != ResponseFormat::Text {
        return Err(AdapterError::InvalidRequest(
            "tool_choice `required` or a named tool together with a response format cannot be enforced by \
             Ollama (both need its one `format`); drop one of them or use an OpenAI-compatible provider"
                .into(),
        ));
    }
    let index = match (named, request.tools.len()) {
        (Some(name), _) => request.tools.iter().position(|t| t.name == name),
        (None, 0) => {
            return Err(AdapterError::InvalidRequest("tool_choice `required` needs at least one tool".into()));
        }
        (None, 1) => Some(0),
        (None, _) => None,
    };
    Ok(Some(match index {
        Some(i) => (ForcedTool::Named(request.tools[i].name.clone()), tool_parameters(i, &request.tools[i])?, Some(i)),
        None => {
            let choices = request
                .tools
                .iter()
                .enumerate()
                .map(|(i, tool)| {
                    let mut arguments = tool_parameters(i, tool)?;
                    rebase_refs(&mut arguments, &format!("/anyOf/{i}/properties/arguments"));
                    Ok(json!({
                        "type": "object",
                        "properties": { "name": { "const": tool.name }, "arguments": arguments },
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                    }))
                })
                .collect::<Result<Vec<_>, AdapterError>>()?;
            let names = request.tools.iter().map(|t| t.name.clone()).collect();
            (ForcedTool::Choice(names), json!({ "anyOf": choices }), None)
        }
    }))
}

/// A tool's schema moved to `at` (a JSON pointer) inside the choice schema:
/// its own references (`#/$defs/...`, pydantic's nested models, or `#`)
/// are made to point to where its definitions now are.
fn rebase_refs(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                match value {
                    Value::String(reference) if key == "$ref" => {
                        if let Some(rest) = reference.strip_prefix('#').filter(|r| r.is_empty() || r.starts_with('/')) {
                            *reference = format!("#{at}{rest}");
                        }
                    }
                    _ => rebase_refs(value, at),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, at)),
        _ => {}
    }
}

/// Why an answer is not the forced call (never quoting the answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum NotACall {
    #[error("the answer is not JSON")]
    NotJson,
    #[error("the answer is not a JSON object")]
    NotObject,
    #[error("the answer names no tool of the run")]
    UnknownTool,
    #[error("the answer's `arguments` is not a JSON object")]
    ArgumentsNotObject,
}

impl ForcedTool {
    /// The model's whole answer as `(tool name, arguments JSON text)`.
    pub(super) fn call(&self, answer: &str) -> Result<(String, String), NotACall> {
        let value: Value = serde_json::from_str(answer).map_err(|_| NotACall::NotJson)?;
        let Value::Object(mut object) = value else { return Err(NotACall::NotObject) };
        match self {
            Self::Named(name) => Ok((name.clone(), Value::Object(object).to_string())),
            Self::Choice(names) => {
                let name = object.get("name").and_then(Value::as_str).ok_or(NotACall::UnknownTool)?;
                let name = names.iter().find(|n| *n == name).ok_or(NotACall::UnknownTool)?.clone();
                match object.remove("arguments") {
                    None | Some(Value::Null) => Ok((name, "{}".to_owned())),
                    Some(arguments @ Value::Object(_)) => Ok((name, arguments.to_string())),
                    Some(_) => Err(NotACall::ArgumentsNotObject),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
}
