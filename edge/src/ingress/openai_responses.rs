//! OpenAI Responses API (`POST /v1/responses`) <-> IOP's normalized run shape.
//!
//! Pure translation, no I/O: [`parse_request`] turns a request body into
//! normalized messages, tools and options; [`EventRenderer`] (streaming) and
//! [`ResponseAggregator`] (non-streaming) turn run events back into the exact
//! Responses wire format. Both build their output items through the same
//! `OutputItems`, so for the same run events the streamed final response
//! object and the non-streaming body are identical (apart from generated ids).
//!
//! IOP keeps no conversation state: `previous_response_id` and `conversation`
//! are rejected, and nothing is ever stored.

use iop_proto::pb;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::hosted_tools::{self, DroppedTool};
use super::json::{Wording, body_object, field, text_message};
use super::openai_common::{
    ImagePart, expect_function_type, function_call, function_definition, reasoning_effort, refuse_unsupported,
    response_format, text_content, tool_choice as openai_tool_choice, user_content,
};
use super::outcome::{synthetic_call_id, synthetic_id, usage_pair};
use super::transcript::{BlockKind, Step, Transcript};

/// Validation messages are worded the OpenAI way.
const JSON: Wording = Wording::OpenAi;
/// The content part types whose text is kept (`output_text` when a client
/// replays earlier output).
const TEXT_PART_TYPES: &[&str] = &["input_text", "output_text"];
const STATEFUL_UNSUPPORTED: &str = "stateful responses are not supported: send the full input";

// ---------------------------------------------------------------- request

/// A validated Responses request in normalized form.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub model: String,
    pub stream: bool,
    /// `instructions` (as a leading system message) followed by the `input` items.
    pub messages: Vec<pb::ChatMessage>,
    pub tools: Vec<pb::ToolDefinition>,
    pub options: pb::GenerationOptions,
    /// Echoed back in the response object.
    pub instructions: Option<String>,
    /// Hosted tools the request named (served without them, or refused,
    /// by the Edge's `api.hosted_tools`).
    pub dropped_tools: Vec<DroppedTool>,
    /// The functions that came from `namespace` tools.
    pub namespaces: Namespaces,
    /// `reasoning.summary` (`auto`, `concise` or `detailed`) was asked for:
    /// reasoning is rendered as a summary (see [`ResponseMeta::reasoning_summary`]).
    pub reasoning_summary: bool,
}

/// Namespace tools (`{"type":"namespace","name","tools":[functions]}`, as
/// Codex CLI groups its sub-agent tools) are offered to the provider as
/// plain functions named `<namespace>__<name>` (the characters every
/// OpenAI-compatible server takes in a function name); a call of one goes
/// back to the client as `name` plus `namespace`, and a `function_call`
/// input item with a `namespace` is read the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces(Vec<(String, usize)>);

impl Namespaces {
    const SEPARATOR: &str = "__";

    fn qualified(namespace: &str, name: &str) -> String {
        format!("{namespace}{}{name}", Self::SEPARATOR)
    }

    fn add(&mut self, namespace: &str, name: &str) -> String {
        let qualified = Self::qualified(namespace, name);
        self.0.push((qualified.clone(), namespace.len()));
        qualified
    }

    /// `(namespace, name)` of a provider-facing function name that came
    /// from a namespace tool.
    pub fn split<'a>(&self, function: &'a str) -> Option<(&'a str, &'a str)> {
        let (_, at) = self.0.iter().find(|(qualified, _)| qualified == function)?;
        Some((&function[..*at], &function[at + Self::SEPARATOR.len()..]))
    }
}

/// Strict parse + validation. Every error is [`ApiError::InvalidRequest`]
/// with a message saying exactly what is wrong and `param` naming the field
/// (e.g. `input[2].content[0].type`). Unknown top-level fields are ignored
/// (SDKs send extras such as `metadata`, `user`, `include`, `text`). An
/// explicit `null` counts as absent.
pub fn parse_request(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let obj = body_object(body)?;
    let model = JSON.non_empty_string(&obj, "model", "model")?.to_string();

    // IOP keeps no conversation state, so a request that points at an earlier
    // response or conversation cannot be honoured.
    for key in ["previous_response_id", "conversation"] {
        if field(&obj, key).is_some() {
            return Err(ApiError::invalid_param(key, STATEFUL_UNSUPPORTED));
        }
    }
    if JSON.optional_bool(&obj, "background", "background")? == Some(true) {
        return Err(ApiError::invalid_param("background", "background responses are not supported"));
    }
    // `store` is accepted and ignored: IOP never stores responses, whatever it says.

    let instructions =
        field(&obj, "instructions").map(|v| JSON.string(v, "instructions").map(str::to_string)).transpose()?;
    let mut messages = Vec::new();
    if let Some(text) = instructions.as_deref().filter(|s| !s.is_empty()) {
        messages.push(text_message(pb::Role::System, text.to_string()));
    }
    match field(&obj, "input") {
        None => return Err(JSON.missing("input")),
        Some(Value::String(s)) => messages.push(text_message(pb::Role::User, s.clone())),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_param("input", "`input` must contain at least one item"));
        }
        Some(Value::Array(items)) => {
            let mut tool_images = Vec::new();
            for (i, item) in items.iter().enumerate() {
                parse_item(item, i, &mut messages, &mut tool_images)?;
            }
            flush_tool_images(&mut messages, &mut tool_images);
        }
        Some(_) => return Err(JSON.type_error("input", "a string or an array of input items")),
    }

    let mut tools = Vec::new();
    let mut namespaces = Namespaces::default();
    let mut dropped_tools = Vec::new();
    match field(&obj, "tools") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("tools[{i}]");
                let ty = item.get("type").and_then(Value::as_str).unwrap_or_default();
                if let Some(kind) = hosted_tools::openai_kind(ty) {
                    dropped_tools.push(DroppedTool { path, kind });
                } else if ty == "namespace" {
                    parse_namespace(item, &path, &mut namespaces, &mut tools)?;
                } else {
                    tools.push(parse_tool(item, &path)?);
                }
            }
        }
        Some(_) => return Err(JSON.type_error("tools", "an array")),
    }

    let stream = JSON.optional_bool(&obj, "stream", "stream")?.unwrap_or(false);
    let mut options = parse_options(&obj)?;
    if let Some(v) = field(&obj, "tool_choice") {
        options.tool_choice = Some(openai_tool_choice(v, &tools, |f| f.get("name"))?);
    }
    options.parallel_tool_calls = JSON.optional_bool(&obj, "parallel_tool_calls", "parallel_tool_calls")?;
    let mut reasoning_summary = false;
    match field(&obj, "reasoning") {
        None => {}
        Some(Value::Object(reasoning)) => {
            if let Some(v) = field(reasoning, "effort") {
                options.reasoning_effort = Some(reasoning_effort(v, "reasoning.effort")?.into());
            }
            // `generate_summary` is the older name of `summary`.
            for key in ["summary", "generate_summary"] {
                if let Some(v) = field(reasoning, key) {
                    reasoning_summary = parse_reasoning_summary(v, &format!("reasoning.{key}"))?;
                }
            }
        }
        Some(_) => return Err(JSON.type_error("reasoning", "an object")),
    }
    options.response_format = match field(&obj, "text") {
        None => None,
        Some(Value::Object(text)) => match field(text, "format") {
            None => None,
            Some(Value::Object(format)) => {
                let kind = JSON.non_empty_string(format, "type", "text.format.type")?;
                Some(response_format(kind, "text.format.type", Some(format), "text.format")?)
            }
            Some(_) => return Err(JSON.type_error("text.format", "an object")),
        },
        Some(_) => return Err(JSON.type_error("text", "an object")),
    };

    Ok(ResponsesRequest {
        model,
        stream,
        messages,
        tools,
        options,
        instructions,
        dropped_tools,
        namespaces,
        reasoning_summary,
    })
}

/// `{"type":"namespace","name","description"?,"tools":[function tools]}`:
/// each function joins `tools` under its qualified name.
fn parse_namespace(
    value: &Value,
    path: &str,
    namespaces: &mut Namespaces,
    tools: &mut Vec<pb::ToolDefinition>,
) -> Result<(), ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    let namespace = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?;
    let inner_path = format!("{path}.tools");
    let Value::Array(inner) = JSON.required(obj, "tools", &inner_path)? else {
        return Err(JSON.type_error(&inner_path, "an array"));
    };
    for (j, tool) in inner.iter().enumerate() {
        let mut tool = parse_tool(tool, &format!("{inner_path}[{j}]"))?;
        tool.name = namespaces.add(namespace, &tool.name);
        tools.push(tool);
    }
    Ok(())
}

/// `reasoning.summary`: `auto`, `concise` or `detailed` ask for a summary
/// (IOP makes none: the provider's reasoning text is shown as it), `none`
/// for none.
fn parse_reasoning_summary(value: &Value, path: &str) -> Result<bool, ApiError> {
    match JSON.string(value, path)? {
        "auto" | "concise" | "detailed" => Ok(true),
        "none" => Ok(false),
        other => Err(ApiError::invalid_param(
            path,
            format!("`{path}` is `{other}`; expected auto, concise, detailed or none"),
        )),
    }
}

/// One `input` item, appended to `messages`. A `function_call` joins the
/// assistant message right before it (consecutive calls, or the text of the
/// same assistant turn), as Chat Completions would carry it. Images in a
/// `function_call_output` (Codex's `view_image`) wait in `tool_images` for
/// the end of the run of outputs (see [`flush_tool_images`]).
fn parse_item(
    value: &Value,
    i: usize,
    messages: &mut Vec<pb::ChatMessage>,
    tool_images: &mut Vec<pb::Image>,
) -> Result<(), ApiError> {
    let path = format!("input[{i}]");
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(&path, "an object"));
    };
    let type_path = format!("{path}.type");
    // Easy-input messages (`{"role","content"}`) carry no `type`.
    let ty = match field(obj, "type") {
        None => "message",
        Some(v) => JSON.string(v, &type_path)?,
    };
    if ty != "function_call_output" {
        flush_tool_images(messages, tool_images);
    }
    match ty {
        "message" => messages.push(parse_message_item(obj, &path)?),
        "function_call" => {
            let call = parse_function_call(obj, &path)?;
            match messages.last_mut() {
                Some(last) if last.role == i32::from(pb::Role::Assistant) => last.tool_calls.push(call),
                _ => messages.push(pb::ChatMessage {
                    role: pb::Role::Assistant.into(),
                    tool_calls: vec![call],
                    ..Default::default()
                }),
            }
        }
        // Earlier turns' reasoning a client hands back (Codex CLI does, with
        // `store: false`): no provider takes it back, so it is dropped.
        "reasoning" => {}
        "function_call_output" => {
            let tool_call_id = JSON.non_empty_string(obj, "call_id", &format!("{path}.call_id"))?.to_string();
            let output_path = format!("{path}.output");
            let output = JSON.required(obj, "output", &output_path)?;
            let (content, images) = user_content(output, &output_path, TEXT_PART_TYPES, &IMAGE_PART)?;
            tool_images.extend(images);
            messages.push(pb::ChatMessage { role: pb::Role::Tool.into(), content, tool_call_id, ..Default::default() });
        }
        other => {
            return Err(ApiError::invalid_param(
                &type_path,
                format!(
                    "{path}: item type `{other}` is not supported; only message, function_call, function_call_output and reasoning are"
                ),
            ));
        }
    }
    Ok(())
}

/// Images that tool outputs returned, as one user message after those
/// outputs: the tool role carries text only at OpenAI-compatible servers,
/// and the outputs of one turn must stay together after its calls.
fn flush_tool_images(messages: &mut Vec<pb::ChatMessage>, tool_images: &mut Vec<pb::Image>) {
    if !tool_images.is_empty() {
        let images = std::mem::take(tool_images);
        messages.push(pb::ChatMessage { images, ..text_message(pb::Role::User, String::new()) });
    }
}

/// `{"type":"message"?,"role","content"}`; `id` and `status` (present when a
/// client replays earlier output items) are ignored.
fn parse_message_item(obj: &Map<String, Value>, path: &str) -> Result<pb::ChatMessage, ApiError> {
    let role_path = format!("{path}.role");
    let role = match JSON.string(JSON.required(obj, "role", &role_path)?, &role_path)? {
        "system" | "developer" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        other => {
            return Err(ApiError::invalid_param(
                &role_path,
                format!("`{role_path}` has unknown role `{other}`; expected one of system, developer, user, assistant"),
            ));
        }
    };
    let content_path = format!("{path}.content");
    let content = JSON.required(obj, "content", &content_path)?;
    if role == pb::Role::User {
        let (text, images) = user_content(content, &content_path, TEXT_PART_TYPES, &IMAGE_PART)?;
        return Ok(pb::ChatMessage { images, ..text_message(role, text) });
    }
    Ok(text_message(role, text_content(content, &content_path, TEXT_PART_TYPES)?))
}

/// `{"type": "input_image", "image_url": <URL>, "detail"?: ...}` (a
/// `file_id` image cannot be fetched: IOP stores no files).
const IMAGE_PART: ImagePart =
    ImagePart { kind: "input_image", url_of: |part| part.get("image_url"), url_path: ".image_url" };

/// `{"type":"function_call","call_id","name","namespace"?,"arguments":<string>}`;
/// `id` and `status` are ignored.
fn parse_function_call(obj: &Map<String, Value>, path: &str) -> Result<pb::ToolCall, ApiError> {
    let id = JSON.non_empty_string(obj, "call_id", &format!("{path}.call_id"))?.to_string();
    let mut call = function_call(id, obj, path)?;
    if field(obj, "namespace").is_some() {
        let namespace = JSON.non_empty_string(obj, "namespace", &format!("{path}.namespace"))?;
        call.name = Namespaces::qualified(namespace, &call.name);
    }
    Ok(call)
}

/// `{"type":"function","name","description"?,"parameters"?,"strict"?}`:
/// Responses tools are flat, not nested under `function`. `strict` is ignored.
fn parse_tool(value: &Value, path: &str) -> Result<pb::ToolDefinition, ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    expect_function_type(obj, path, true)?;
    let name_path = format!("{path}.name");
    if field(obj, "name").is_none() && field(obj, "function").is_some() {
        return Err(ApiError::invalid_param(
            &name_path,
            format!(
                "`{name_path}` is required (Responses tools are flat: put name, description and parameters next to `type`, not under `function`)"
            ),
        ));
    }
    function_definition(obj, path)
}

fn parse_options(obj: &Map<String, Value>) -> Result<pb::GenerationOptions, ApiError> {
    let mut options = pb::GenerationOptions::default();
    if let Some(v) = field(obj, "max_output_tokens") {
        options.max_tokens = Some(JSON.positive_u32(v, "max_output_tokens")?);
    }
    if let Some(v) = field(obj, "temperature") {
        options.temperature = Some(JSON.number_in(v, "temperature", 0.0, 2.0)?);
    }
    if let Some(v) = field(obj, "top_p") {
        options.top_p = Some(JSON.number_in(v, "top_p", 0.0, 1.0)?);
    }
    refuse_unsupported(obj, &["top_logprobs", "prompt", "max_tool_calls"])?;
    Ok(options)
}

// ---------------------------------------------------------------- response

/// What every response object of one response carries: its identity and
/// what it echoes of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_` followed by 32 hex digits.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// The request's tools as Responses spells them.
    pub tools: Vec<Value>,
    /// Which function names came from namespace tools.
    pub namespaces: Namespaces,
    /// The client asked for `reasoning.summary`: each reasoning item
    /// carries the provider's reasoning text as its one `summary_text` (no
    /// `content`), streamed as `response.reasoning_summary_*` events.
    /// Otherwise the text is the item's `reasoning_text` content (as gpt-oss
    /// models answer on the Responses API) and `summary` is empty.
    pub reasoning_summary: bool,
}

impl ResponseMeta {
    /// A fresh id: `resp_` followed by a v4 UUID in simple form; the
    /// defaults of a request that set nothing else.
    pub fn new(model: String, created_at: u64, instructions: Option<String>, max_output_tokens: Option<u32>) -> Self {
        Self {
            id: synthetic_id("resp_"),
            created_at,
            model,
            instructions,
            max_output_tokens,
            tool_choice: json!("auto"),
            parallel_tool_calls: true,
            temperature: None,
            top_p: None,
            tools: Vec::new(),
            namespaces: Namespaces::default(),
            reasoning_summary: false,
        }
    }

    /// The meta echoing `request`: instructions, limits, sampling, tools
    /// and tool choice as the client sent them.
    pub fn for_request(request: &ResponsesRequest, created_at: u64) -> Self {
        let o = &request.options;
        let tool_choice = match &o.tool_choice {
            None => json!("auto"),
            Some(choice) => match choice.mode() {
                pb::ToolChoiceMode::None => json!("none"),
                pb::ToolChoiceMode::Required => json!("required"),
                pb::ToolChoiceMode::Named => json!({ "type": "function", "name": choice.name }),
                pb::ToolChoiceMode::Auto | pb::ToolChoiceMode::Unspecified => json!("auto"),
            },
        };
        let tools = request
            .tools
            .iter()
            .map(|t| {
                let parameters: Value = serde_json::from_str(&t.parameters_json).unwrap_or(Value::Null);
                json!({ "type": "function", "name": t.name, "description": t.description, "parameters": parameters })
            })
            .collect();
        Self {
            tool_choice,
            parallel_tool_calls: o.parallel_tool_calls.unwrap_or(true),
            temperature: o.temperature,
            top_p: o.top_p,
            tools,
            namespaces: request.namespaces.clone(),
            reasoning_summary: request.reasoning_summary,
            ..Self::new(request.model.clone(), created_at, request.instructions.clone(), o.max_tokens)
        }
    }
}

fn output_text_part(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [] })
}

fn reasoning_text_part(text: &str) -> Value {
    json!({ "type": "reasoning_text", "text": text })
}

fn summary_text_part(text: &str) -> Value {
    json!({ "type": "summary_text", "text": text })
}

/// The ids Responses gives each block of the transcript, in order: an item
/// id (`msg_…` / `fc_…`) and, for a tool call, its `call_id` (the
/// provider's, or a made-up `call_…`).
#[derive(Debug, Default)]
struct ItemIds {
    ids: Vec<(String, String)>,
    /// Reasoning as a summary ([`ResponseMeta::reasoning_summary`]).
    summary: bool,
    /// Which function names came from namespace tools.
    namespaces: Namespaces,
}

impl ItemIds {
    fn new(meta: &ResponseMeta) -> Self {
        Self { ids: Vec::new(), summary: meta.reasoning_summary, namespaces: meta.namespaces.clone() }
    }

    fn of(&mut self, transcript: &Transcript, i: usize) -> (String, String) {
        while self.ids.len() <= i {
            let ids = match &transcript.block(self.ids.len()).kind {
                BlockKind::Text => (synthetic_id("msg_"), String::new()),
                BlockKind::Reasoning => (synthetic_id("rs_"), String::new()),
                BlockKind::ToolCall { id, .. } => {
                    (synthetic_id("fc_"), if id.is_empty() { synthetic_call_id() } else { id.clone() })
                }
            };
            self.ids.push(ids);
        }
        self.ids[i].clone()
    }

    /// Output item `i` with `status`; `added` shows it as just opened.
    fn item(&mut self, transcript: &Transcript, i: usize, status: &str, added: bool) -> Value {
        let (id, call_id) = self.of(transcript, i);
        let block = transcript.block(i);
        match &block.kind {
            BlockKind::Text if added => {
                json!({ "type": "message", "id": id, "status": status, "role": "assistant", "content": [] })
            }
            BlockKind::Text => json!({
                "type": "message", "id": id, "status": status, "role": "assistant",
                "content": [output_text_part(&block.content)],
            }),
            // Asked for a summary: the provider's text as the one summary
            // part (IOP summarizes nothing). `encrypted_content` is left out
            // even when `include` asks for it: there is nothing to encrypt,
            // and a client hands no reasoning back that a provider would take.
            BlockKind::Reasoning if self.summary && added => json!({ "type": "reasoning", "id": id, "summary": [] }),
            BlockKind::Reasoning if self.summary => {
                json!({ "type": "reasoning", "id": id, "summary": [summary_text_part(&block.content)] })
            }
            // Otherwise the raw reasoning, as gpt-oss models answer on the
            // Responses API (no summary is made up).
            BlockKind::Reasoning if added => json!({ "type": "reasoning", "id": id, "summary": [], "content": [] }),
            BlockKind::Reasoning => json!({
                "type": "reasoning", "id": id, "summary": [],
                "content": [reasoning_text_part(&block.content)],
            }),
            BlockKind::ToolCall { name, .. } => {
                let mut item = json!({
                    "type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "arguments": if added { "" } else { block.content.as_str() }, "status": status,
                });
                if let Some((namespace, name)) = self.namespaces.split(name) {
                    item["name"] = json!(name);
                    item["namespace"] = json!(namespace);
                }
                item
            }
        }
    }

    /// Every item; the open one (if any) with `open_status`, the rest completed.
    fn output(&mut self, transcript: &Transcript, open_status: &str) -> Vec<Value> {
        (0..transcript.blocks().len())
            .map(|i| self.item(transcript, i, if transcript.is_open(i) { open_status } else { "completed" }, false))
            .collect()
    }

    /// Every item of a completed run; when the run stopped short (`cut`),
    /// the last item, the one being generated when it stopped, `incomplete`.
    fn completed_output(&mut self, transcript: &Transcript, cut: bool) -> Vec<Value> {
        let last = transcript.blocks().len().checked_sub(1);
        (0..transcript.blocks().len())
            .map(|i| self.item(transcript, i, if cut && Some(i) == last { "incomplete" } else { "completed" }, false))
            .collect()
    }
}

/// Streaming renderer: one instance per response.
#[derive(Debug)]
pub struct EventRenderer {
    meta: ResponseMeta,
    transcript: Transcript,
    ids: ItemIds,
    next_sequence_number: u64,
    begun: bool,
}

impl EventRenderer {
    pub fn new(meta: ResponseMeta) -> Self {
        let ids = ItemIds::new(&meta);
        Self { meta, transcript: Transcript::default(), ids, next_sequence_number: 0, begun: false }
    }

    /// Zero or more `(event type, JSON payload)` pairs for one run event; the
    /// caller writes `event: <type>\ndata: <payload>\n\n` for each. The first
    /// call (unless Cancelled) starts with `response.created` and
    /// `response.in_progress`. The stream ends after `response.completed`,
    /// `response.incomplete` or `response.failed` (there is no `[DONE]`);
    /// Cancelled renders nothing, and so does every event after a terminal.
    pub fn render(&mut self, event: &pb::run_event::Event) -> Vec<(&'static str, String)> {
        let mut events: Vec<(&'static str, Value)> = Vec::new();
        // A run that stops short closes the item it was generating as
        // `incomplete`, as OpenAI marks a message cut by `max_output_tokens`.
        let cut = matches!(event, pb::run_event::Event::Completed(c) if incomplete_reason(c.finish_reason).is_some());
        for step in self.transcript.push(event) {
            self.step_events(step, cut, &mut events);
        }
        events
            .into_iter()
            .map(|(kind, mut payload)| {
                payload["type"] = kind.into();
                payload["sequence_number"] = self.next_sequence_number.into();
                self.next_sequence_number += 1;
                (kind, payload.to_string())
            })
            .collect()
    }

    fn begin(&mut self, events: &mut Vec<(&'static str, Value)>) {
        if !self.begun {
            self.begun = true;
            let response = response_json(&self.meta, "in_progress", Vec::new(), Value::Null);
            events.push(("response.created", json!({ "response": response })));
            events.push(("response.in_progress", json!({ "response": response })));
        }
    }

    /// `cut`: this event ended a run that stopped short (the block it
    /// closes is `incomplete`).
    fn step_events(&mut self, step: Step<'_>, cut: bool, events: &mut Vec<(&'static str, Value)>) {
        let t = &self.transcript;
        let summary = self.ids.summary;
        match step {
            Step::Begin => self.begin(events),
            Step::Open(i) => {
                let item = self.ids.item(t, i, "in_progress", true);
                events.push(("response.output_item.added", json!({ "output_index": i, "item": item })));
                let (id, _) = self.ids.of(t, i);
                let part = match t.block(i).kind {
                    BlockKind::Text => Some(("response.content_part.added", "content_index", output_text_part(""))),
                    BlockKind::Reasoning if summary => {
                        Some(("response.reasoning_summary_part.added", "summary_index", summary_text_part("")))
                    }
                    BlockKind::Reasoning => {
                        Some(("response.content_part.added", "content_index", reasoning_text_part("")))
                    }
                    BlockKind::ToolCall { .. } => None,
                };
                if let Some((kind, index, part)) = part {
                    let mut payload = json!({ "item_id": id, "output_index": i, "part": part });
                    payload[index] = 0.into();
                    events.push((kind, payload));
                }
            }
            Step::Delta(i, delta) => {
                let (id, _) = self.ids.of(t, i);
                events.push(match t.block(i).kind {
                    BlockKind::Text => (
                        "response.output_text.delta",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "delta": delta, "logprobs": [] }),
                    ),
                    BlockKind::Reasoning if summary => (
                        "response.reasoning_summary_text.delta",
                        json!({ "item_id": id, "output_index": i, "summary_index": 0, "delta": delta }),
                    ),
                    BlockKind::Reasoning => (
                        "response.reasoning_text.delta",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "delta": delta }),
                    ),
                    BlockKind::ToolCall { .. } => (
                        "response.function_call_arguments.delta",
                        json!({ "item_id": id, "output_index": i, "delta": delta }),
                    ),
                });
            }
            Step::Close(i) => {
                let (id, _) = self.ids.of(t, i);
                let block = t.block(i);
                match block.kind {
                    BlockKind::Text => {
                        events.push((
                            "response.output_text.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "text": block.content, "logprobs": [],
                            }),
                        ));
                        events.push((
                            "response.content_part.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "part": output_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::Reasoning if summary => {
                        events.push((
                            "response.reasoning_summary_text.done",
                            json!({ "item_id": id, "output_index": i, "summary_index": 0, "text": block.content }),
                        ));
                        events.push((
                            "response.reasoning_summary_part.done",
                            json!({
                                "item_id": id, "output_index": i, "summary_index": 0,
                                "part": summary_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::Reasoning => {
                        events.push((
                            "response.reasoning_text.done",
                            json!({ "item_id": id, "output_index": i, "content_index": 0, "text": block.content }),
                        ));
                        events.push((
                            "response.content_part.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "part": reasoning_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::ToolCall { .. } => events.push((
                        "response.function_call_arguments.done",
                        json!({ "item_id": id, "output_index": i, "arguments": block.content }),
                    )),
                }
                let item = self.ids.item(t, i, if cut { "incomplete" } else { "completed" }, false);
                events.push(("response.output_item.done", json!({ "output_index": i, "item": item })));
            }
            Step::Complete { finish_reason } => {
                let response = completed_response(&self.meta, t, &mut self.ids, finish_reason);
                let kind =
                    if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                events.push((kind, json!({ "response": response })));
            }
            Step::Fail(failure) => {
                self.begin(events);
                let response = failed_response(&self.meta, &self.transcript, &mut self.ids, &failure);
                events.push(("response.failed", json!({ "response": response })));
            }
            Step::Cancel => {}
        }
    }
}

/// Non-streaming: collects run events and produces the final response object
/// (the same object `response.completed` carries when streaming).
#[derive(Debug)]
pub struct ResponseAggregator {
    meta: ResponseMeta,
    transcript: Transcript,
}

impl ResponseAggregator {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta, transcript: Transcript::default() }
    }

    /// Events after a terminal are ignored.
    pub fn push(&mut self, event: &pb::run_event::Event) {
        self.transcript.push(event);
    }

    /// `Ok(response object)` after a Completed terminal (status `completed`,
    /// or `incomplete` for a length / content-filter stop);
    /// `Err(ApiError::Execution(..))` after Failed (that failure), Cancelled,
    /// or no terminal at all.
    pub fn finish(mut self) -> Result<Value, ApiError> {
        let finish_reason = self.transcript.finish()?;
        Ok(completed_response(&self.meta, &self.transcript, &mut ItemIds::new(&self.meta), finish_reason))
    }
}

/// The response object, echoing what [`ResponseMeta`] keeps of the request.
fn response_json(meta: &ResponseMeta, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": meta.instructions,
        "max_output_tokens": meta.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": meta.parallel_tool_calls,
        "temperature": meta.temperature,
        "tool_choice": meta.tool_choice,
        "tools": meta.tools,
        "top_p": meta.top_p,
        "usage": usage,
    })
}

/// The final object after a Completed terminal: `incomplete` with a reason
/// when the provider stopped at the token limit or its content filter.
fn completed_response(meta: &ResponseMeta, transcript: &Transcript, ids: &mut ItemIds, finish_reason: i32) -> Value {
    let incomplete_reason = incomplete_reason(finish_reason);
    let status = if incomplete_reason.is_some() { "incomplete" } else { "completed" };
    let output = ids.completed_output(transcript, incomplete_reason.is_some());
    let mut response = response_json(meta, status, output, usage_json(transcript.usage()));
    if let Some(reason) = incomplete_reason {
        response["incomplete_details"] = json!({ "reason": reason });
    }
    response
}

/// Why a completed run is `incomplete`: the provider stopped at the token
/// limit or its content filter.
fn incomplete_reason(finish_reason: i32) -> Option<&'static str> {
    match pb::FinishReason::try_from(finish_reason) {
        Ok(pb::FinishReason::Length) => Some("max_output_tokens"),
        Ok(pb::FinishReason::ContentFilter) => Some("content_filter"),
        _ => None,
    }
}

/// The object `response.failed` carries: the items so far (the one being
/// generated as `incomplete`), usage if any was reported, and the error.
fn failed_response(
    meta: &ResponseMeta,
    transcript: &Transcript,
    ids: &mut ItemIds,
    failure: &pb::ExecutionFailure,
) -> Value {
    let usage = transcript.usage().map_or(Value::Null, |u| usage_json(Some(u)));
    let mut response = response_json(meta, "failed", ids.output(transcript, "incomplete"), usage);
    let error = ApiError::Execution(failure.clone());
    response["error"] = json!({ "code": error.client_code(), "message": error.message() });
    response
}

fn usage_json(usage: Option<&pb::Usage>) -> Value {
    let (input, output) = usage_pair(usage);
    json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u64::from(input) + u64::from(output),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::test_events::{completed, started, text, tool, usage};
    use pb::run_event::Event;

    fn parse(v: Value) -> Result<ResponsesRequest, ApiError> {
        parse_request(v.to_string().as_bytes())
    }

    fn msg(role: pb::Role, content: &str) -> pb::ChatMessage {
        text_message(role, content.to_string())
    }

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp_test".into(),
            created_at: 1_700_000_000,
            model: "llama".into(),
            instructions: Some("be brief".into()),
            max_output_tokens: Some(64),
            ..ResponseMeta::new(String::new(), 0, None, None)
        }
    }

    /// What Codex CLI 0.171.0 sent with default settings (recorded through a
    /// capturing proxy; long texts cut): developer messages, a `namespace`
    /// tool, the hosted `web_search`, `reasoning.summary`, `include`, then
    /// an exec_command round trip.
    #[test]
    fn codex_requests_parse() {
        let recorded: Value = serde_json::from_str(include_str!("fixtures/codex-0.171.0.json")).unwrap();
        let first = parse(recorded["first_turn"].clone()).unwrap();
        let names: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"exec_command"), "{names:?}");
        assert!(names.contains(&"multi_agent_v1__spawn_agent"), "{names:?}");
        assert_eq!(first.namespaces.split("multi_agent_v1__spawn_agent"), Some(("multi_agent_v1", "spawn_agent")));
        assert_eq!(first.namespaces.split("exec_command"), None);
        let web_search =
            recorded["first_turn"]["tools"].as_array().unwrap().iter().position(|t| t["type"] == "web_search");
        assert_eq!(
            first.dropped_tools,
            [DroppedTool { path: format!("tools[{}]", web_search.unwrap()), kind: "web_search" }]
        );
        assert_eq!(first.messages[0].role(), pb::Role::System);

        let round_trip = parse(recorded["tool_round_trip"].clone()).unwrap();
        let n = round_trip.messages.len();
        assert_eq!(round_trip.messages[n - 2].tool_calls[0].name, "exec_command");
        assert_eq!(round_trip.messages[n - 1].role(), pb::Role::Tool);
    }

    #[test]
    fn images_in_tool_outputs_follow_the_outputs_as_one_user_message() {
        let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
        let request = parse(json!({"model": "m", "input": [
            {"role": "user", "content": "look at both"},
            {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "view_image", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": png, "detail": "high"}]},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_text", "text": "second:"}, {"type": "input_image", "image_url": png}
            ]},
            {"role": "user", "content": "well?"},
        ]}))
        .unwrap();
        let shape: Vec<(pb::Role, &str, usize)> =
            request.messages.iter().map(|m| (m.role(), m.content.as_str(), m.images.len())).collect();
        assert_eq!(
            shape,
            [
                (pb::Role::User, "look at both", 0),
                (pb::Role::Assistant, "", 0),
                (pb::Role::Tool, "", 0),
                (pb::Role::Tool, "second:", 0),
                (pb::Role::User, "", 2),
                (pb::Role::User, "well?", 0),
            ]
        );
        assert_eq!(request.messages[4].images[0].media_type, "image/png");
    }

    #[test]
    fn namespace_tools_are_functions_to_the_provider_and_calls_go_back_with_their_namespace() {
        let request = parse(json!({"model": "m", "input": [
            {"role": "user", "content": "spawn one"},
            {"type": "function_call", "call_id": "c0", "name": "spawn_agent", "namespace": "agents", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c0", "output": "ok"},
        ], "tools": [
            {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
                {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
                {"type": "function", "name": "close_agent"},
            ]},
            {"type": "function", "name": "exec"},
        ]}))
        .unwrap();
        let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["agents__spawn_agent", "agents__close_agent", "exec"]);
        assert_eq!(request.messages[1].tool_calls[0].name, "agents__spawn_agent");

        let meta = ResponseMeta::for_request(&request, 0);
        let events =
            [started(), tool(0, "call_9", "agents__close_agent", r#"{"id":"a"}"#), tool(1, "call_8", "exec", "{}")];
        let mut aggregator = ResponseAggregator::new(meta.clone());
        events.iter().chain([&completed(pb::FinishReason::ToolCalls)]).for_each(|e| aggregator.push(e));
        let output = aggregator.finish().unwrap()["output"].clone();
        assert_eq!(
            (output[0]["name"].as_str(), output[0]["namespace"].as_str()),
            (Some("close_agent"), Some("agents"))
        );
        assert_eq!((output[1]["name"].as_str(), output[1].get("namespace")), (Some("exec"), None));
        let streamed = render_all(&mut EventRenderer::new(meta), &events);
        let added = streamed.iter().find(|(kind, _)| *kind == "response.output_item.added").unwrap();
        assert_eq!(
            (added.1["item"]["name"].as_str(), added.1["item"]["namespace"].as_str()),
            (Some("close_agent"), Some("agents"))
        );

        for (bad, param, message) in [
            (json!({"type": "namespace", "tools": []}), "tools[0].name", "`tools[0].name` is required"),
            (json!({"type": "namespace", "name": "n"}), "tools[0].tools", "`tools[0].tools` is required"),
            (
                json!({"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}),
                "tools[0].tools[0].type",
                "tools[0].tools[0]: tool type `web_search` is not supported; only `function` is",
            ),
        ] {
            let error = parse(json!({"model": "m", "input": "x", "tools": [bad]})).unwrap_err();
            assert_eq!(error, ApiError::invalid_param(param, message));
        }
    }

    fn failed(failure: &pb::ExecutionFailure) -> Event {
        Event::Failed(pb::RunFailed { failure: Some(failure.clone()) })
    }

    fn cancelled() -> Event {
        Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() })
    }

    /// Renders `events` with a fresh renderer and checks that every payload
    /// names its own type and that sequence numbers count up from 0.
    fn render_all(renderer: &mut EventRenderer, events: &[Event]) -> Vec<(&'static str, Value)> {
        let out: Vec<(&'static str, Value)> = events
            .iter()
            .flat_map(|e| renderer.render(e))
            .map(|(kind, p)| (kind, serde_json::from_str(&p).expect("payload is JSON")))
            .collect();
        for (i, (kind, payload)) in out.iter().enumerate() {
            assert_eq!(payload["type"], *kind, "event {i}");
            assert_eq!(payload["sequence_number"], i, "event {i}");
        }
        out
    }

    fn kinds(events: &[(&'static str, Value)]) -> Vec<&'static str> {
        events.iter().map(|(k, _)| *k).collect()
    }

    fn assert_id(id: &Value, prefix: &str) -> String {
        let id = id.as_str().expect("id is a string");
        let hex = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id} lacks prefix {prefix}"));
        assert_eq!(hex.len(), 32, "{id}");
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        id.to_string()
    }

    /// Checks the generated output item ids and replaces them with `msg_N` / `fc_N`.
    fn scrub_item_ids(response: &mut Value) {
        for (n, item) in response["output"].as_array_mut().unwrap().iter_mut().enumerate() {
            let prefix = if item["type"] == "message" { "msg_" } else { "fc_" };
            assert_id(&item["id"], prefix);
            item["id"] = format!("{prefix}{n}").into();
        }
    }

    fn expected_response(status: &str, output: Value, usage: Value) -> Value {
        json!({
            "id": "resp_test",
            "object": "response",
            "created_at": 1_700_000_000u64,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": "be brief",
            "max_output_tokens": 64,
            "model": "llama",
            "output": output,
            "parallel_tool_calls": true,
            "temperature": null,
            "tool_choice": "auto",
            "tools": [],
            "top_p": null,
            "usage": usage,
        })
    }

    fn usage_value(input: u32, output: u32) -> Value {
        json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        })
    }

    // ------------------------------------------------------------ parse

    #[test]
    fn string_input_parses_with_defaults() {
        let req = parse(json!({"model": "llama", "input": "hi"})).unwrap();
        assert_eq!(req.model, "llama");
        assert!(!req.stream);
        assert!(req.tools.is_empty());
        assert_eq!(req.options, pb::GenerationOptions::default());
        assert_eq!(req.instructions, None);
        assert_eq!(req.messages, vec![msg(pb::Role::User, "hi")]);
    }

    #[test]
    fn sdk_style_request_with_instructions_roles_and_extras_parses() {
        let req = parse(json!({
            "model": "llama",
            "instructions": "be brief",
            "input": [
                {"role": "developer", "content": "dev rules"},
                {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "first"},
                    {"type": "input_text", "text": "second"}
                ]},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "answer", "annotations": []}]},
                {"role": "user", "content": "thanks"}
            ],
            "stream": true,
            "max_output_tokens": 128,
            "temperature": 0.5,
            "top_p": 1,
            "store": true,
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "metadata": {"k": "v"},
            "user": "u-1",
            "include": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "reasoning": null,
            "previous_response_id": null,
            "conversation": null,
            "background": false
        }))
        .unwrap();
        assert!(req.stream);
        assert_eq!(req.instructions.as_deref(), Some("be brief"));
        assert_eq!(
            req.messages,
            vec![
                msg(pb::Role::System, "be brief"),
                msg(pb::Role::System, "dev rules"),
                msg(pb::Role::System, "sys"),
                msg(pb::Role::User, "first\nsecond"),
                msg(pb::Role::Assistant, "answer"),
                msg(pb::Role::User, "thanks"),
            ]
        );
        assert_eq!(req.options.max_tokens, Some(128));
        assert_eq!(req.options.temperature, Some(0.5));
        assert_eq!(req.options.top_p, Some(1.0));
        assert!(req.options.stop.is_empty());
    }

    #[test]
    fn empty_instructions_are_echoed_but_add_no_message() {
        let req = parse(json!({"model": "m", "input": "x", "instructions": ""})).unwrap();
        assert_eq!(req.instructions.as_deref(), Some(""));
        assert_eq!(req.messages, vec![msg(pb::Role::User, "x")]);
    }

    #[test]
    fn function_calls_and_outputs_round_trip() {
        // What a client sends after replaying `response.output` and adding the tool results.
        let req = parse(json!({
            "model": "m",
            "input": [
                {"role": "user", "content": "weather in Paris and Rome?"},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                 "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "rainy"}]},
                {"type": "function_call", "call_id": "call_3", "name": "noop", "arguments": "{}"}
            ]
        }))
        .unwrap();
        let call = |id: &str, name: &str, args: &str| pb::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments_json: args.into(),
        };
        let tool_msg = |id: &str, content: &str| pb::ChatMessage {
            images: Vec::new(),
            role: pb::Role::Tool.into(),
            content: content.into(),
            tool_calls: vec![],
            tool_call_id: id.into(),
        };
        assert_eq!(
            req.messages,
            vec![
                msg(pb::Role::User, "weather in Paris and Rome?"),
                pb::ChatMessage {
                    images: Vec::new(),
                    role: pb::Role::Assistant.into(),
                    content: "Let me check.".into(),
                    tool_calls: vec![
                        call("call_1", "get_weather", r#"{"city":"Paris"}"#),
                        call("call_2", "get_weather", r#"{"city":"Rome"}"#),
                    ],
                    tool_call_id: String::new(),
                },
                tool_msg("call_1", "sunny"),
                tool_msg("call_2", "rainy"),
                pb::ChatMessage {
                    images: Vec::new(),
                    role: pb::Role::Assistant.into(),
                    content: String::new(),
                    tool_calls: vec![call("call_3", "noop", "{}")],
                    tool_call_id: String::new(),
                },
            ]
        );
    }

    #[test]
    fn flat_function_tools_parse() {
        let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let req = parse(json!({
            "model": "m",
            "input": "weather?",
            "tools": [
                {"type": "function", "name": "get_weather", "description": "Weather", "parameters": params, "strict": true},
                {"type": "function", "name": "noop", "parameters": null, "strict": false}
            ],
            "tool_choice": {"type": "function", "name": "get_weather"}
        }))
        .unwrap();
        assert_eq!(req.tools.len(), 2);
        assert_eq!(req.tools[0].name, "get_weather");
        assert_eq!(req.tools[0].description, "Weather");
        let parsed: Value = serde_json::from_str(&req.tools[0].parameters_json).unwrap();
        assert_eq!(parsed, params);
        assert_eq!(req.tools[1].name, "noop");
        assert_eq!(req.tools[1].description, "");
        let parsed: Value = serde_json::from_str(&req.tools[1].parameters_json).unwrap();
        assert_eq!(parsed, json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn malformed_and_non_object_bodies_are_rejected() {
        let err = parse_request(b"{").unwrap_err();
        let ApiError::InvalidRequest { message, param } = err else { panic!("not InvalidRequest") };
        assert!(message.starts_with("invalid JSON: "), "{message}");
        assert_eq!(param, None);

        for body in [&b"[]"[..], b"\"s\"", b"1", b"null"] {
            assert_eq!(parse_request(body).unwrap_err(), ApiError::invalid("request body must be a JSON object"));
        }
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let with = |extra: Value| {
            let mut base = json!({"model": "m", "input": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                base[k] = v.clone();
            }
            base
        };
        let input = |items: Value| with(json!({"input": items}));
        let user = json!({"role": "user", "content": "hi"});
        let cases: Vec<(Value, &str, &str)> = vec![
            (json!({"input": "hi"}), "model", "`model` is required"),
            (with(json!({"model": 3})), "model", "`model` must be a string"),
            (with(json!({"model": ""})), "model", "`model` must not be empty"),
            (json!({"model": "m"}), "input", "`input` is required"),
            (with(json!({"input": null})), "input", "`input` is required"),
            (input(json!(5)), "input", "`input` must be a string or an array of input items"),
            (input(json!([])), "input", "`input` must contain at least one item"),
            (input(json!([user.clone(), "x"])), "input[1]", "`input[1]` must be an object"),
            (input(json!([{"content": "x"}])), "input[0].role", "`input[0].role` is required"),
            (
                input(json!([{"role": "tool", "content": "x"}])),
                "input[0].role",
                "`input[0].role` has unknown role `tool`; expected one of system, developer, user, assistant",
            ),
            (input(json!([{"type": 5, "role": "user"}])), "input[0].type", "`input[0].type` must be a string"),
            (input(json!([{"type": "message", "role": "user"}])), "input[0].content", "`input[0].content` is required"),
            (
                input(json!([{"role": "user", "content": 5}])),
                "input[0].content",
                "`input[0].content` must be a string or an array of content parts",
            ),
            (
                input(json!([{"role": "user", "content": []}])),
                "input[0].content",
                "`input[0].content` must not be an empty array",
            ),
            (
                input(json!([{"role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "file_id": "file-1", "detail": "auto"}
                ]}])),
                "input[0].content[1].image_url",
                "`input[0].content[1].image_url` is required",
            ),
            (
                input(json!([user.clone(), {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])),
                "input[1].content[0].type",
                "input[1].content[0]: content part type `input_file` is not supported",
            ),
            (
                input(json!([{"role": "user", "content": [{"type": "input_text"}]}])),
                "input[0].content[0].text",
                "`input[0].content[0].text` is required",
            ),
            (
                input(json!([{"type": "web_search_call", "id": "ws_1", "status": "completed"}])),
                "input[0].type",
                "input[0]: item type `web_search_call` is not supported; only message, function_call, function_call_output and reasoning are",
            ),
            (
                input(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
                "input[0].call_id",
                "`input[0].call_id` is required",
            ),
            (
                input(json!([{"type": "function_call", "call_id": "c", "arguments": "{}"}])),
                "input[0].name",
                "`input[0].name` is required",
            ),
            (
                input(json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}])),
                "input[0].arguments",
                "`input[0].arguments` must be a string (the arguments as JSON text)",
            ),
            (
                input(json!([{"type": "function_call_output", "output": "x"}])),
                "input[0].call_id",
                "`input[0].call_id` is required",
            ),
            (
                input(json!([{"type": "function_call_output", "call_id": "c"}])),
                "input[0].output",
                "`input[0].output` is required",
            ),
            (with(json!({"instructions": 5})), "instructions", "`instructions` must be a string"),
            (with(json!({"tools": {}})), "tools", "`tools` must be an array"),
            (with(json!({"tools": ["f"]})), "tools[0]", "`tools[0]` must be an object"),
            (with(json!({"tools": [{"name": "f"}]})), "tools[0].type", "`tools[0].type` is required"),
            (
                with(json!({"tools": [{"type": "custom", "name": "apply_patch"}]})),
                "tools[0].type",
                "tools[0]: tool type `custom` is not supported; only `function` is",
            ),
            (
                with(json!({"tools": [{"type": "function", "name": "f"}, {"type": "local_shell"}]})),
                "tools[1].type",
                "tools[1]: tool type `local_shell` is not supported; only `function` is",
            ),
            (with(json!({"tools": [{"type": "function"}]})), "tools[0].name", "`tools[0].name` is required"),
            (
                with(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
                "tools[0].name",
                "`tools[0].name` is required (Responses tools are flat: put name, description and parameters next to `type`, not under `function`)",
            ),
            (
                with(json!({"tools": [{"type": "function", "name": "f", "parameters": "{}"}]})),
                "tools[0].parameters",
                "`tools[0].parameters` must be an object",
            ),
            (
                with(json!({"tools": [{"type": "function", "name": "f", "description": 1}]})),
                "tools[0].description",
                "`tools[0].description` must be a string",
            ),
            (with(json!({"previous_response_id": "resp_1"})), "previous_response_id", STATEFUL_UNSUPPORTED),
            (with(json!({"conversation": "conv_1"})), "conversation", STATEFUL_UNSUPPORTED),
            (with(json!({"conversation": {"id": "conv_1"}})), "conversation", STATEFUL_UNSUPPORTED),
            (with(json!({"background": true})), "background", "background responses are not supported"),
            (with(json!({"background": "yes"})), "background", "`background` must be a boolean"),
            (with(json!({"stream": "yes"})), "stream", "`stream` must be a boolean"),
            (with(json!({"max_output_tokens": "10"})), "max_output_tokens", "`max_output_tokens` must be an integer"),
            (
                with(json!({"max_output_tokens": 0})),
                "max_output_tokens",
                "`max_output_tokens` must be an integer between 1 and 4294967295",
            ),
            (with(json!({"temperature": "hot"})), "temperature", "`temperature` must be a number"),
            (with(json!({"temperature": 2.5})), "temperature", "`temperature` must be between 0 and 2"),
            (with(json!({"top_p": 1.5})), "top_p", "`top_p` must be between 0 and 1"),
        ];
        for (body, want_param, want_message) in cases {
            let err = parse(body.clone()).expect_err(&format!("should fail: {body}"));
            assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(err, ApiError::invalid_param(want_param, want_message), "body: {body}");
            assert_eq!(err.openai_body()["error"]["param"], want_param);
        }
    }

    // ------------------------------------------------------------ render

    #[test]
    fn response_meta_id_is_resp_plus_32_hex_and_echoes_the_request() {
        let req = parse(json!({"model": "m", "input": "x", "instructions": "sys", "max_output_tokens": 9})).unwrap();
        let meta = ResponseMeta::for_request(&req, 5);
        assert_id(&meta.id.clone().into(), "resp_");
        assert_eq!((meta.created_at, meta.model.as_str()), (5, "m"));
        assert_eq!((meta.instructions.as_deref(), meta.max_output_tokens), (Some("sys"), Some(9)));
        assert_ne!(meta.id, ResponseMeta::for_request(&req, 5).id);
    }

    #[test]
    fn streaming_text_event_order_and_payloads() {
        let mut r = EventRenderer::new(meta());
        let events = render_all(
            &mut r,
            &[started(), text("Hel"), text(""), text("lo"), usage(7, 2), completed(pb::FinishReason::Stop)],
        );
        assert_eq!(
            kinds(&events),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let p = |i: usize| events[i].1.clone();
        let in_progress = expected_response("in_progress", json!([]), Value::Null);
        assert_eq!(p(0)["response"], in_progress);
        assert_eq!(p(1)["response"], in_progress);

        let item_id = assert_id(&p(2)["item"]["id"], "msg_");
        assert_eq!(p(2)["output_index"], 0);
        assert_eq!(
            p(2)["item"],
            json!({"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []})
        );
        let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
        let located = |i: usize| (p(i)["item_id"].clone(), p(i)["output_index"].clone(), p(i)["content_index"].clone());
        for i in 3..=7 {
            assert_eq!(located(i), (json!(item_id), json!(0), json!(0)), "event {i}");
        }
        assert_eq!(p(3)["part"], part(""));
        assert_eq!((p(4)["delta"].clone(), p(5)["delta"].clone()), (json!("Hel"), json!("lo")));
        assert_eq!(p(6)["text"], "Hello");
        assert_eq!(p(7)["part"], part("Hello"));
        let done_item = json!({"type": "message", "id": item_id, "status": "completed", "role": "assistant",
                               "content": [part("Hello")]});
        assert_eq!(p(8)["output_index"], 0);
        assert_eq!(p(8)["item"], done_item);
        assert_eq!(p(9)["response"], expected_response("completed", json!([done_item]), usage_value(7, 2)));

        // Nothing after the terminal.
        assert!(r.render(&text("late")).is_empty());
    }

    #[test]
    fn streaming_function_calls() {
        let mut r = EventRenderer::new(meta());
        let events = render_all(
            &mut r,
            &[
                started(),
                tool(0, "call_a", "get_weather", ""),
                tool(0, "", "", "{\"city\":"),
                tool(0, "", "", "\"Paris\"}"),
                tool(1, "call_b", "noop", "{}"),
                completed(pb::FinishReason::ToolCalls),
            ],
        );
        assert_eq!(
            kinds(&events),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let p = |i: usize| events[i].1.clone();
        let fc_a = assert_id(&p(2)["item"]["id"], "fc_");
        let fc_b = assert_id(&p(7)["item"]["id"], "fc_");
        assert_ne!(fc_a, fc_b);
        assert_eq!(
            p(2),
            json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                   "item": {"type": "function_call", "id": fc_a, "call_id": "call_a", "name": "get_weather",
                            "arguments": "", "status": "in_progress"}})
        );
        assert_eq!(
            p(3),
            json!({"type": "response.function_call_arguments.delta", "sequence_number": 3,
                   "item_id": fc_a, "output_index": 0, "delta": "{\"city\":"})
        );
        assert_eq!(p(4)["delta"], "\"Paris\"}");
        assert_eq!(
            p(5),
            json!({"type": "response.function_call_arguments.done", "sequence_number": 5,
                   "item_id": fc_a, "output_index": 0, "arguments": "{\"city\":\"Paris\"}"})
        );
        let done_a = json!({"type": "function_call", "id": fc_a, "call_id": "call_a", "name": "get_weather",
                            "arguments": "{\"city\":\"Paris\"}", "status": "completed"});
        assert_eq!((p(6)["output_index"].clone(), p(6)["item"].clone()), (json!(0), done_a.clone()));
        assert_eq!(p(7)["output_index"], 1);
        assert_eq!(p(7)["item"]["call_id"], "call_b");
        assert_eq!((p(8)["item_id"].clone(), p(8)["output_index"].clone()), (json!(fc_b), json!(1)));
        assert_eq!(p(8)["delta"], "{}");
        assert_eq!(p(9)["arguments"], "{}");
        let done_b = json!({"type": "function_call", "id": fc_b, "call_id": "call_b", "name": "noop",
                            "arguments": "{}", "status": "completed"});
        assert_eq!(p(10)["item"], done_b);
        assert_eq!(p(11)["response"], expected_response("completed", json!([done_a, done_b]), usage_value(0, 0)));
    }

    #[test]
    fn text_then_function_call_then_text_are_separate_items() {
        let mut r = EventRenderer::new(meta());
        let events = render_all(
            &mut r,
            &[text("Let me check."), tool(0, "call_a", "f", "{}"), text("Done."), completed(pb::FinishReason::Stop)],
        );
        assert_eq!(
            kinds(&events),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                // The tool call closes the message.
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                // The text after it closes the call.
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let indices: Vec<(&str, Value)> = events
            .iter()
            .filter(|(k, _)| k.starts_with("response.output_item."))
            .map(|(k, p)| (*k, p["output_index"].clone()))
            .collect();
        assert_eq!(
            indices,
            vec![
                ("response.output_item.added", json!(0)),
                ("response.output_item.done", json!(0)),
                ("response.output_item.added", json!(1)),
                ("response.output_item.done", json!(1)),
                ("response.output_item.added", json!(2)),
                ("response.output_item.done", json!(2)),
            ]
        );
        let mut response = events.last().unwrap().1["response"].clone();
        scrub_item_ids(&mut response);
        let output = json!([
            {"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "f", "arguments": "{}",
             "status": "completed"},
            {"type": "message", "id": "msg_2", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}
        ]);
        assert_eq!(response, expected_response("completed", output, usage_value(0, 0)));
    }

    #[test]
    fn length_and_content_filter_finish_as_incomplete() {
        for (reason, want) in
            [(pb::FinishReason::Length, "max_output_tokens"), (pb::FinishReason::ContentFilter, "content_filter")]
        {
            let mut r = EventRenderer::new(meta());
            let events = render_all(&mut r, &[text("abc"), usage(3, 64), completed(reason)]);
            let (kind, last) = events.last().unwrap();
            assert_eq!(*kind, "response.incomplete");
            assert_eq!(last["response"]["status"], "incomplete");
            assert_eq!(last["response"]["incomplete_details"], json!({"reason": want}));
            assert_eq!(last["response"]["output"][0]["content"][0]["text"], "abc");
            assert_eq!(last["response"]["usage"], usage_value(3, 64));
            assert_eq!(events[events.len() - 2].0, "response.output_item.done");

            let mut agg = ResponseAggregator::new(meta());
            for e in [text("abc"), usage(3, 64), completed(reason)] {
                agg.push(&e);
            }
            let body = agg.finish().unwrap();
            assert_eq!(body["status"], "incomplete");
            assert_eq!(body["incomplete_details"], json!({"reason": want}));
        }
    }

    #[test]
    fn streaming_failure_renders_response_failed() {
        let failure = pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "provider stalled");
        let mut r = EventRenderer::new(meta());
        let events = render_all(&mut r, &[started(), text("partial"), failed(&failure)]);
        assert_eq!(
            kinds(&events),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.failed",
            ]
        );
        let mut response = events[5].1["response"].clone();
        scrub_item_ids(&mut response);
        let mut want = expected_response(
            "failed",
            json!([{"type": "message", "id": "msg_0", "status": "incomplete", "role": "assistant",
                    "content": [{"type": "output_text", "text": "partial", "annotations": []}]}]),
            Value::Null,
        );
        want["error"] = json!({"code": "response_stalled", "message": "provider stalled"});
        assert_eq!(response, want);
        assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());

        // A failure before anything else still opens the stream properly.
        let mut r = EventRenderer::new(meta());
        let events = render_all(&mut r, &[failed(&failure)]);
        assert_eq!(kinds(&events), vec!["response.created", "response.in_progress", "response.failed"]);
        assert_eq!(events[2].1["response"]["output"], json!([]));
        assert_eq!(events[2].1["response"]["error"]["code"], "response_stalled");

        // A Failed without a description is an internal error.
        let mut r = EventRenderer::new(meta());
        let events = render_all(&mut r, &[Event::Failed(pb::RunFailed { failure: None })]);
        assert_eq!(events[2].1["response"]["error"]["code"], "internal");
    }

    #[test]
    fn cancel_renders_nothing() {
        let mut r = EventRenderer::new(meta());
        assert!(r.render(&cancelled()).is_empty());
        assert!(r.render(&text("late")).is_empty());

        let mut r = EventRenderer::new(meta());
        assert_eq!(render_all(&mut r, &[text("hi")]).len(), 5);
        assert!(r.render(&cancelled()).is_empty());
        assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());
    }

    #[test]
    fn aggregates_text_function_calls_and_usage() {
        let mut agg = ResponseAggregator::new(meta());
        for e in [
            started(),
            text("Let me "),
            text("check."),
            tool(0, "call_a", "get_weather", "{\"city\""),
            tool(0, "", "", ":\"Paris\"}"),
            tool(1, "", "noop", "{}"),
            usage(10, 5),
            completed(pb::FinishReason::ToolCalls),
        ] {
            agg.push(&e);
        }
        let mut body = agg.finish().unwrap();
        // A call streamed without an id gets a synthetic call id.
        assert_id(&body["output"][2]["call_id"], "call_");
        body["output"][2]["call_id"] = "call_synthetic".into();
        scrub_item_ids(&mut body);
        assert_eq!(
            body,
            expected_response(
                "completed",
                json!([
                    {"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                    {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
                     "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
                    {"type": "function_call", "id": "fc_2", "call_id": "call_synthetic", "name": "noop",
                     "arguments": "{}", "status": "completed"}
                ]),
                usage_value(10, 5),
            )
        );
    }

    #[test]
    fn aggregate_equals_the_streamed_final_response() {
        let run = [
            started(),
            text("a"),
            tool(0, "call_a", "f", "{"),
            tool(0, "", "", "}"),
            usage(1, 2),
            completed(pb::FinishReason::Stop),
        ];
        let mut r = EventRenderer::new(meta());
        let mut streamed = render_all(&mut r, &run).pop().unwrap().1["response"].clone();
        let mut agg = ResponseAggregator::new(meta());
        run.iter().for_each(|e| agg.push(e));
        let mut body = agg.finish().unwrap();
        scrub_item_ids(&mut streamed);
        scrub_item_ids(&mut body);
        assert_eq!(body, streamed);
        assert_eq!(body["output"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn aggregator_failed_returns_the_failure() {
        let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, "rate limited");
        failure.provider_status = 429;
        let mut agg = ResponseAggregator::new(meta());
        agg.push(&text("partial"));
        agg.push(&failed(&failure));
        agg.push(&completed(pb::FinishReason::Stop)); // ignored after the terminal
        let err = agg.finish().unwrap_err();
        assert_eq!(err, ApiError::Execution(failure));
        assert_eq!(err.openai_body()["error"]["code"], "provider_http_status");
    }

    #[test]
    fn aggregator_without_completion_is_an_execution_error() {
        let mut agg = ResponseAggregator::new(meta());
        agg.push(&text("partial"));
        let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
        assert_eq!(f.kind(), pb::FailureKind::TransportLost);

        let mut agg = ResponseAggregator::new(meta());
        agg.push(&cancelled());
        let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
        assert_eq!(f.kind(), pb::FailureKind::Internal);

        let mut agg = ResponseAggregator::new(meta());
        agg.push(&Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::Deadline.into() }));
        let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
        assert_eq!(f.kind(), pb::FailureKind::DeadlineExceeded, "a deadline is no stall");
        assert_eq!(ApiError::Execution(f).code(), "request_timeout");

        let mut agg = ResponseAggregator::new(meta());
        agg.push(&Event::Failed(pb::RunFailed { failure: None }));
        let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
        assert_eq!(f.kind(), pb::FailureKind::Internal);
    }

    /// Issue 13 items 2, 3: tool choice and `text.format` reach the run.
    #[test]
    fn tool_choice_and_text_format_are_carried() {
        let body = |extra: Value| {
            let mut body = json!({"model": "m", "input": "hi",
                "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            parse(body)
        };
        let r = body(json!({
            "tool_choice": {"type": "function", "name": "lookup"},
            "parallel_tool_calls": true,
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": false}}
        }))
        .unwrap();
        assert_eq!(r.options.tool_choice.unwrap().name, "lookup");
        assert_eq!(r.options.parallel_tool_calls, Some(true));
        assert_eq!(r.options.response_format.unwrap().kind(), pb::ResponseFormatKind::JsonSchema);
        let plain = body(json!({"text": {"format": {"type": "text"}}, "tool_choice": "required"})).unwrap();
        assert_eq!(plain.options.response_format.unwrap().kind(), pb::ResponseFormatKind::Text);
        assert_eq!(plain.options.tool_choice.unwrap().mode(), pb::ToolChoiceMode::Required);
        for (extra, param) in [
            (json!({"tool_choice": {"type": "function", "name": "nope"}}), "tool_choice"),
            (json!({"text": {"format": {"type": "json_schema", "name": "a"}}}), "text.format.schema"),
            (json!({"top_logprobs": 3}), "top_logprobs"),
        ] {
            let err = body(extra.clone()).unwrap_err();
            assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == param), "{extra}: {err:?}");
        }
    }

    // ------------------------------------------------- issue 27 item 4

    fn reasoning(text: &str) -> Event {
        Event::Reasoning(pb::ReasoningDelta { text: text.into() })
    }

    /// The output items of `run`, streamed (each `response.output_item.done`
    /// item, and the final response's output) and not.
    fn done_items_final_and_whole(meta: ResponseMeta, run: &[Event]) -> (Vec<Value>, Value, Value) {
        let mut r = EventRenderer::new(meta.clone());
        let events = render_all(&mut r, run);
        let done = events.iter().filter(|(k, _)| *k == "response.output_item.done").map(|(_, p)| p["item"].clone());
        let final_output = events.last().unwrap().1["response"]["output"].clone();
        let mut agg = ResponseAggregator::new(meta);
        run.iter().for_each(|e| agg.push(e));
        (done.collect(), final_output, agg.finish().unwrap()["output"].clone())
    }

    /// A message cut by the token limit (or the content filter) is
    /// `incomplete` as OpenAI marks it, in `response.output_item.done`, in
    /// `response.incomplete`'s output and in the non-streaming body; items
    /// finished before the cut stay `completed`.
    #[test]
    fn a_truncated_answer_marks_the_item_it_was_generating_incomplete() {
        for reason in [pb::FinishReason::Length, pb::FinishReason::ContentFilter] {
            let run = [started(), text("abc"), usage(3, 64), completed(reason)];
            let (done, final_output, whole) = done_items_final_and_whole(meta(), &run);
            assert_eq!(done.len(), 1);
            for output in [&done[0], &final_output[0], &whole[0]] {
                assert_eq!((output["type"].as_str(), output["status"].as_str()), (Some("message"), Some("incomplete")));
            }

            let run = [started(), text("a"), tool(0, "call_a", "f", "{}"), completed(reason)];
            let (done, final_output, whole) = done_items_final_and_whole(meta(), &run);
            let statuses = |items: &[Value]| items.iter().map(|i| i["status"].clone()).collect::<Vec<_>>();
            assert_eq!(statuses(&done), [json!("completed"), json!("incomplete")]);
            assert_eq!(statuses(final_output.as_array().unwrap()), statuses(&done));
            assert_eq!(statuses(whole.as_array().unwrap()), statuses(&done));
        }
        // A run that stops normally completes every item.
        let (done, final_output, whole) =
            done_items_final_and_whole(meta(), &[text("abc"), completed(pb::FinishReason::Stop)]);
        for output in [&done[0], &final_output[0], &whole[0]] {
            assert_eq!(output["status"], "completed");
        }
    }

    /// Codex CLI's request shape: `reasoning.summary` and `include:
    /// ["reasoning.encrypted_content"]` are accepted; `summary` is on for
    /// `auto`/`concise`/`detailed` (and the older `generate_summary`), off
    /// when absent, null or `none`; anything else names the field.
    #[test]
    fn reasoning_summary_and_include_encrypted_content_are_accepted() {
        let codex = json!({
            "model": "m", "instructions": "be useful", "input": [{"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hi"}]}], "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": false, "reasoning": {"effort": "medium", "summary": "auto"}, "store": false,
            "stream": true, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
        });
        let req = parse(codex).unwrap();
        assert!(req.reasoning_summary);
        assert_eq!(req.options.reasoning_effort, Some(pb::ReasoningEffort::Medium.into()));
        assert!(ResponseMeta::for_request(&req, 0).reasoning_summary);
        for (reasoning, want) in [
            (json!({"summary": "concise"}), true),
            (json!({"summary": "detailed"}), true),
            (json!({"generate_summary": "auto"}), true),
            (json!({"summary": null}), false),
            (json!({"summary": "none"}), false),
            (json!({"effort": "low"}), false),
        ] {
            let req = parse(json!({"model": "m", "input": "x", "reasoning": reasoning})).unwrap();
            assert_eq!(req.reasoning_summary, want, "{reasoning}");
        }
        let err = parse(json!({"model": "m", "input": "x", "reasoning": {"summary": "verbose"}})).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == "reasoning.summary"), "{err:?}");
    }

    /// With `reasoning.summary` the provider's reasoning text is the item's
    /// summary, streamed with OpenAI's summary events; without it, today's
    /// `reasoning_text` content, now with its content part events.
    #[test]
    fn reasoning_renders_as_a_summary_when_asked_and_as_content_otherwise() {
        let run = [started(), reasoning("Think"), reasoning("ing"), text("ok"), completed(pb::FinishReason::Stop)];
        let summary_meta = ResponseMeta { reasoning_summary: true, ..meta() };
        let mut r = EventRenderer::new(summary_meta.clone());
        let events = render_all(&mut r, &run);
        assert_eq!(
            kinds(&events)[2..9],
            [
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
            ]
        );
        let p = |i: usize| events[i].1.clone();
        let id = assert_id(&p(2)["item"]["id"], "rs_");
        assert_eq!(p(2)["item"], json!({"type": "reasoning", "id": id, "summary": []}));
        let at = |i: usize| (p(i)["item_id"].clone(), p(i)["output_index"].clone(), p(i)["summary_index"].clone());
        for i in 3..=7 {
            assert_eq!(at(i), (json!(id), json!(0), json!(0)), "event {i}");
        }
        assert_eq!(p(3)["part"], json!({"type": "summary_text", "text": ""}));
        assert_eq!((p(4)["delta"].clone(), p(5)["delta"].clone()), (json!("Think"), json!("ing")));
        assert_eq!(p(6)["text"], "Thinking");
        assert_eq!(p(7)["part"], json!({"type": "summary_text", "text": "Thinking"}));
        let item = json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": "Thinking"}]});
        assert_eq!(p(8)["item"], item);
        assert_eq!(events.last().unwrap().1["response"]["output"][0], item);
        let mut agg = ResponseAggregator::new(summary_meta);
        run.iter().for_each(|e| agg.push(e));
        let body = agg.finish().unwrap();
        assert_eq!(body["output"][0]["summary"], item["summary"]);
        assert!(body["output"][0].get("content").is_none() && body["output"][0].get("encrypted_content").is_none());

        let mut r = EventRenderer::new(meta());
        let events = render_all(&mut r, &run);
        assert_eq!(
            kinds(&events)[2..9],
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        let p = |i: usize| events[i].1.clone();
        assert_eq!(p(3)["part"], json!({"type": "reasoning_text", "text": ""}));
        assert_eq!((p(3)["content_index"].clone(), p(7)["content_index"].clone()), (json!(0), json!(0)));
        assert_eq!(p(7)["part"], json!({"type": "reasoning_text", "text": "Thinking"}));
        assert_eq!(p(8)["item"]["summary"], json!([]));
        assert_eq!(p(8)["item"]["content"], json!([{"type": "reasoning_text", "text": "Thinking"}]));
    }
}
