//! Property tests for the three request parsers (`openai_chat`,
//! `openai_responses`, `anthropic_messages`): whatever a client sends,
//! `parse_request` returns a request or an `InvalidRequest` (HTTP 400), never
//! a panic and never a 5xx; and a valid request keeps its model, its messages
//! (count, roles, text) and its tools.
//!
//! Each property runs proptest's default 256 cases; more with
//! `PROPTEST_CASES=100000 cargo nextest run -p iop-edge fuzz`. A failing case
//! is saved under `edge/proptest-regressions/` and replayed first next time.

use iop_proto::pb;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::{anthropic_messages, openai_chat, openai_responses};

// ------------------------------------------------------------ strategies

/// Field names the parsers look at, so generated objects reach past the
/// first `required` check.
const KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "name",
    "tools",
    "function",
    "arguments",
    "parameters",
    "description",
    "id",
    "tool_calls",
    "tool_call_id",
    "stream",
    "stream_options",
    "include_usage",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_sequences",
    "seed",
    "n",
    "input",
    "instructions",
    "call_id",
    "output",
    "previous_response_id",
    "conversation",
    "background",
    "max_output_tokens",
    "system",
    "tool_use_id",
    "input_schema",
    "is_error",
    "tool_choice",
];

/// String values the parsers branch on (roles, part and item types).
const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "text",
    "input_text",
    "output_text",
    "function",
    "message",
    "function_call",
    "function_call_output",
    "tool_use",
    "tool_result",
    "custom",
    "image_url",
    "auto",
    "mock",
];

/// Any text: every `char` is possible (control characters, surrogates'
/// neighbours, the BOM, right-to-left marks...), short so cases stay fast.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter)
}

fn non_empty_text() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 1..12).prop_map(String::from_iter)
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(KEYS).prop_map(str::to_string), 1 => text()]
}

fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![2 => prop::sample::select(WORDS).prop_map(str::to_string), 2 => text()]
}

/// Numbers at the edges of every range the parsers check.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(2),
            json!(4),
            json!(5),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(-0.0),
            json!(0.5),
            json!(1.0),
            json!(1.5),
            json!(2.0000001),
            json!(f64::MAX),
            json!(f64::MIN_POSITIVE),
            json!(-f64::MAX),
        ]),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Non-finite floats have no JSON form; serde_json makes them null.
        any::<f64>().prop_map(Value::from),
    ]
}

/// An arbitrary JSON value, at most a few levels deep and a few dozen nodes.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string_value().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// Arrays or objects nested `depth` deep: past serde_json's recursion limit
/// (128) the body must be a 400, not a stack overflow.
fn deeply_nested() -> impl Strategy<Value = Value> {
    (1usize..300, any::<bool>()).prop_map(|(depth, objects)| {
        let mut v = json!({"type": "text", "text": "x"});
        for _ in 0..depth {
            v = if objects { json!({ "content": v }) } else { json!([v]) };
        }
        v
    })
}

/// The values a mutation puts somewhere in a valid request.
fn replacement() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => json_value(),
        1 => deeply_nested(),
        1 => prop::collection::vec(json_value(), 0..40).prop_map(Value::Array),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// The value at the path becomes another (often of the wrong type).
    Replace(Value),
    /// The key (or array item) at the path goes away.
    Remove,
    /// A field is added to the object at the path.
    Insert(String, Value),
}

fn mutation() -> impl Strategy<Value = (Vec<Index>, Mutation)> {
    let m = prop_oneof![
        3 => replacement().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        2 => (key(), replacement()).prop_map(|(k, v)| Mutation::Insert(k, v)),
    ];
    (prop::collection::vec(any::<Index>(), 0..6), m)
}

/// Applies `m` at the node `path` leads to (each index picks a child; the
/// walk stops early at a leaf).
fn mutate(v: &mut Value, path: &[Index], m: &Mutation) {
    match (path.split_first(), v) {
        (Some((i, rest)), Value::Object(map)) if !map.is_empty() => {
            let key = map.keys().nth(i.index(map.len())).expect("index in range").clone();
            if rest.is_empty() && matches!(m, Mutation::Remove) {
                map.remove(&key);
            } else {
                mutate(map.get_mut(&key).expect("key exists"), rest, m);
            }
        }
        (Some((i, rest)), Value::Array(items)) if !items.is_empty() => {
            let i = i.index(items.len());
            if rest.is_empty() && matches!(m, Mutation::Remove) {
                items.remove(i);
            } else {
                mutate(&mut items[i], rest, m);
            }
        }
        (_, v) => match m {
            Mutation::Replace(x) => *v = x.clone(),
            Mutation::Remove => *v = Value::Null,
            Mutation::Insert(k, x) => match v {
                Value::Object(map) => {
                    map.insert(k.clone(), x.clone());
                }
                other => *other = x.clone(),
            },
        },
    }
}

/// Byte-level damage to a serialized request: flipped, inserted and
/// removed bytes, or a cut.
fn damage(mut bytes: Vec<u8>, edits: &[(Index, u8, u8)]) -> Vec<u8> {
    for (at, op, byte) in edits {
        if bytes.is_empty() {
            bytes.push(*byte);
            continue;
        }
        let i = at.index(bytes.len());
        match op % 4 {
            0 => bytes[i] = *byte,
            1 => bytes.insert(i, *byte),
            2 => {
                bytes.remove(i);
            }
            _ => bytes.truncate(i),
        }
    }
    bytes
}

// --------------------------------------------- a valid request, per API

#[derive(Debug, Clone)]
struct Call {
    id: String,
    name: String,
    args: Map<String, Value>,
}

#[derive(Debug, Clone)]
enum Turn {
    User(String),
    /// Text and tool calls of one assistant turn.
    Assistant(String, Vec<Call>),
    /// A tool's answer: the call id and the output text.
    ToolResult(String, String),
}

/// A valid conversation each API can express, rendered by `chat_json`,
/// `responses_json` and `anthropic_json`.
#[derive(Debug, Clone)]
struct Conversation {
    model: String,
    system: Option<String>,
    turns: Vec<Turn>,
    /// Name, description.
    tools: Vec<(String, String)>,
    stream: bool,
    max_tokens: u32,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Vec<String>,
    /// User text sent as content parts (each part's text) instead of a string.
    parts: bool,
}

fn args_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((text(), json_value()), 0..3).prop_map(|f| f.into_iter().collect())
}

fn call() -> impl Strategy<Value = Call> {
    (non_empty_text(), non_empty_text(), args_object()).prop_map(|(id, name, args)| Call { id, name, args })
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        3 => text().prop_map(Turn::User),
        2 => (text(), prop::collection::vec(call(), 0..3)).prop_map(|(t, c)| Turn::Assistant(t, c)),
        1 => (non_empty_text(), text()).prop_map(|(id, t)| Turn::ToolResult(id, t)),
    ]
}

fn conversation() -> impl Strategy<Value = Conversation> {
    (
        non_empty_text(),
        prop::option::of(text()),
        prop::collection::vec(turn(), 1..6),
        prop::collection::vec((non_empty_text(), text()), 0..3),
        any::<bool>(),
        1..=u32::MAX,
        prop::option::of(0.0..=1.0f64),
        prop::option::of(0.0..=1.0f64),
        prop::collection::vec(text(), 0..=4),
        any::<bool>(),
    )
        .prop_map(|(model, system, turns, tools, stream, max_tokens, temperature, top_p, stop, parts)| {
            Conversation { model, system, turns, tools, stream, max_tokens, temperature, top_p, stop, parts }
        })
}

/// `text` as a string, or as content parts of `part_type` that join back to it.
fn content(text: &str, parts: bool, part_type: &str) -> Value {
    if parts && !text.is_empty() {
        Value::Array(text.split('\n').map(|t| json!({ "type": part_type, "text": t })).collect())
    } else {
        Value::String(text.to_string())
    }
}

fn put_options(c: &Conversation, obj: &mut Map<String, Value>, max_tokens_key: &str) {
    obj.insert(max_tokens_key.into(), c.max_tokens.into());
    if let Some(t) = c.temperature {
        obj.insert("temperature".into(), t.into());
    }
    if let Some(p) = c.top_p {
        obj.insert("top_p".into(), p.into());
    }
}

fn chat_json(c: &Conversation) -> Value {
    let mut messages = Vec::new();
    if let Some(s) = &c.system {
        messages.push(json!({ "role": "system", "content": s }));
    }
    for t in &c.turns {
        messages.push(match t {
            Turn::User(text) => json!({ "role": "user", "content": content(text, c.parts, "text") }),
            Turn::Assistant(text, calls) => {
                let mut m = json!({ "role": "assistant", "content": text });
                if !calls.is_empty() {
                    m["tool_calls"] = calls
                        .iter()
                        .map(|k| {
                            json!({ "id": k.id, "type": "function",
                                    "function": { "name": k.name, "arguments": Value::Object(k.args.clone()).to_string() } })
                        })
                        .collect();
                }
                m
            }
            Turn::ToolResult(id, text) => json!({ "role": "tool", "tool_call_id": id, "content": text }),
        });
    }
    let tools: Vec<Value> = c
        .tools
        .iter()
        .map(|(name, description)| json!({ "type": "function", "function": { "name": name, "description": description } }))
        .collect();
    let mut obj = Map::new();
    obj.insert("model".into(), c.model.clone().into());
    obj.insert("messages".into(), messages.into());
    obj.insert("tools".into(), tools.into());
    obj.insert("stream".into(), c.stream.into());
    obj.insert("stream_options".into(), json!({ "include_usage": true }));
    obj.insert("stop".into(), c.stop.clone().into());
    put_options(c, &mut obj, "max_completion_tokens");
    Value::Object(obj)
}

fn responses_json(c: &Conversation) -> Value {
    let mut input = Vec::new();
    for t in &c.turns {
        match t {
            Turn::User(text) => input.push(json!({ "role": "user", "content": content(text, c.parts, "input_text") })),
            Turn::Assistant(text, calls) => {
                input.push(json!({ "type": "message", "role": "assistant", "content": text }));
                for k in calls {
                    input.push(json!({ "type": "function_call", "call_id": k.id, "name": k.name,
                                        "arguments": Value::Object(k.args.clone()).to_string() }));
                }
            }
            Turn::ToolResult(id, text) => {
                input.push(json!({ "type": "function_call_output", "call_id": id, "output": text }))
            }
        }
    }
    let tools: Vec<Value> = c
        .tools
        .iter()
        .map(|(name, description)| json!({ "type": "function", "name": name, "description": description }))
        .collect();
    let mut obj = Map::new();
    obj.insert("model".into(), c.model.clone().into());
    obj.insert("input".into(), input.into());
    if let Some(s) = &c.system {
        obj.insert("instructions".into(), s.clone().into());
    }
    obj.insert("tools".into(), tools.into());
    obj.insert("stream".into(), c.stream.into());
    obj.insert("store".into(), false.into());
    put_options(c, &mut obj, "max_output_tokens");
    Value::Object(obj)
}

fn anthropic_json(c: &Conversation) -> Value {
    let messages: Vec<Value> = c
        .turns
        .iter()
        .map(|t| match t {
            Turn::User(text) => json!({ "role": "user", "content": content(text, c.parts, "text") }),
            Turn::Assistant(text, calls) if calls.is_empty() => json!({ "role": "assistant", "content": text }),
            Turn::Assistant(text, calls) => {
                let mut blocks = Vec::new();
                if !text.is_empty() {
                    blocks.push(json!({ "type": "text", "text": text }));
                }
                for k in calls {
                    blocks.push(json!({ "type": "tool_use", "id": k.id, "name": k.name, "input": Value::Object(k.args.clone()) }));
                }
                json!({ "role": "assistant", "content": blocks })
            }
            Turn::ToolResult(id, text) => {
                json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": id, "content": text }] })
            }
        })
        .collect();
    let tools: Vec<Value> = c
        .tools
        .iter()
        .map(|(name, description)| json!({ "name": name, "description": description, "input_schema": { "type": "object" } }))
        .collect();
    let mut obj = Map::new();
    obj.insert("model".into(), c.model.clone().into());
    obj.insert("messages".into(), messages.into());
    if let Some(s) = &c.system {
        obj.insert("system".into(), s.clone().into());
    }
    obj.insert("tools".into(), tools.into());
    obj.insert("stream".into(), c.stream.into());
    obj.insert("stop_sequences".into(), c.stop.clone().into());
    put_options(c, &mut obj, "max_tokens");
    Value::Object(obj)
}

/// What every API must make of `c`: the normalized messages (role, text and
/// tool calls), given whether an empty system text still yields a message.
fn expected_messages(c: &Conversation, empty_system_is_a_message: bool) -> Vec<pb::ChatMessage> {
    let message = |role: pb::Role, content: &str| pb::ChatMessage {
        images: Vec::new(),
        role: role.into(),
        content: content.to_string(),
        tool_calls: Vec::new(),
        tool_call_id: String::new(),
    };
    let mut out = Vec::new();
    if let Some(s) = c.system.as_deref().filter(|s| empty_system_is_a_message || !s.is_empty()) {
        out.push(message(pb::Role::System, s));
    }
    for t in &c.turns {
        out.push(match t {
            Turn::User(text) => message(pb::Role::User, text),
            Turn::Assistant(text, calls) => pb::ChatMessage {
                tool_calls: calls
                    .iter()
                    .map(|k| pb::ToolCall {
                        id: k.id.clone(),
                        name: k.name.clone(),
                        arguments_json: Value::Object(k.args.clone()).to_string(),
                    })
                    .collect(),
                ..message(pb::Role::Assistant, text)
            },
            Turn::ToolResult(id, text) => pb::ChatMessage { tool_call_id: id.clone(), ..message(pb::Role::Tool, text) },
        });
    }
    out
}

// ------------------------------------------------------------ checks

/// Runs the three parsers on `body`; every rejection must be a typed 400.
fn parse_all(body: &[u8]) -> Result<(), TestCaseError> {
    client_error_only("chat", openai_chat::parse_request(body))?;
    client_error_only("responses", openai_responses::parse_request(body))?;
    client_error_only("messages", anthropic_messages::parse_request(body))?;
    Ok(())
}

fn client_error_only<T>(api: &str, result: Result<T, ApiError>) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        prop_assert!(matches!(e, ApiError::InvalidRequest { .. }), "{api}: {e:?}");
        prop_assert_eq!(e.status().as_u16(), 400, "{}: {:?}", api, e);
        // Rendering the error for the client must not fail either.
        prop_assert_eq!(&e.openai_body()["error"]["code"], "invalid_request");
        prop_assert_eq!(&e.anthropic_body()["error"]["type"], "invalid_request_error");
    }
    Ok(())
}

fn to_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serializes")
}

proptest! {
    /// (a) Any bytes at all.
    #[test]
    fn fuzz_parsers_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
        parse_all(&body)?;
    }

    /// (b) Any JSON value, at the top level or as a near-complete object.
    #[test]
    fn fuzz_parsers_arbitrary_json(value in json_value(), fields in prop::collection::vec((key(), json_value()), 0..8)) {
        parse_all(&to_bytes(&value))?;
        parse_all(&to_bytes(&Value::Object(fields.into_iter().collect())))?;
    }

    /// (c) A valid request with a few fields changed anywhere in it: wrong
    /// types, edge numbers, odd strings, deep nesting, removed or added
    /// fields. Each API's own valid shape is mutated and fed to all three.
    #[test]
    fn fuzz_parsers_mutated_valid_requests(c in conversation(), mutations in prop::collection::vec(mutation(), 1..4)) {
        for mut request in [chat_json(&c), responses_json(&c), anthropic_json(&c)] {
            for (path, m) in &mutations {
                mutate(&mut request, path, m);
            }
            parse_all(&to_bytes(&request))?;
        }
    }

    /// (c) A valid request with damaged bytes (cut, flipped, inserted).
    #[test]
    fn fuzz_parsers_damaged_bytes(c in conversation(), edits in prop::collection::vec((any::<Index>(), any::<u8>(), any::<u8>()), 1..4)) {
        for request in [chat_json(&c), responses_json(&c), anthropic_json(&c)] {
            parse_all(&damage(to_bytes(&request), &edits))?;
        }
    }

    /// (d) A valid request parses, and keeps its model, messages (roles,
    /// text, tool calls), tools, stream flag and options.
    #[test]
    fn fuzz_parsers_valid_requests_round_trip(c in conversation()) {
        let tool_names: Vec<String> = c.tools.iter().map(|(n, _)| n.clone()).collect();
        let names = |tools: &[pb::ToolDefinition]| tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        let check_options = |o: &pb::GenerationOptions| -> Result<(), TestCaseError> {
            prop_assert_eq!(o.max_tokens, Some(c.max_tokens));
            prop_assert_eq!(o.temperature, c.temperature.map(|t| t as f32));
            prop_assert_eq!(o.top_p, c.top_p.map(|t| t as f32));
            Ok(())
        };

        let chat = openai_chat::parse_request(&to_bytes(&chat_json(&c)));
        prop_assert!(chat.is_ok(), "chat: {:?}", chat);
        let chat = chat.unwrap();
        prop_assert_eq!(&chat.model, &c.model);
        prop_assert_eq!(chat.messages, expected_messages(&c, true));
        prop_assert_eq!(&names(&chat.tools), &tool_names);
        prop_assert_eq!((chat.stream, chat.include_usage), (c.stream, true));
        prop_assert_eq!(&chat.options.stop, &c.stop);
        check_options(&chat.options)?;

        let responses = openai_responses::parse_request(&to_bytes(&responses_json(&c)));
        prop_assert!(responses.is_ok(), "responses: {:?}", responses);
        let responses = responses.unwrap();
        prop_assert_eq!(&responses.model, &c.model);
        prop_assert_eq!(responses.messages, expected_messages(&c, false));
        prop_assert_eq!(&names(&responses.tools), &tool_names);
        prop_assert_eq!(&responses.instructions, &c.system);
        prop_assert_eq!(responses.stream, c.stream);
        check_options(&responses.options)?;

        let messages = anthropic_messages::parse_request(&to_bytes(&anthropic_json(&c)));
        prop_assert!(messages.is_ok(), "messages: {:?}", messages);
        let messages = messages.unwrap();
        prop_assert_eq!(&messages.model, &c.model);
        prop_assert_eq!(messages.messages, expected_messages(&c, false));
        prop_assert_eq!(&names(&messages.tools), &tool_names);
        prop_assert_eq!(messages.stream, c.stream);
        prop_assert_eq!(&messages.options.stop, &c.stop);
        check_options(&messages.options)?;
    }
}
