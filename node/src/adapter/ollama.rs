//! Ollama's native chat API: `POST {base}/api/chat`, answered as NDJSON (one
//! JSON object per line, the last one with `"done": true`).

use std::collections::HashMap;

use base64::Engine as _;
use iop_proto::pb;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{AdapterError, json_error_summary, stream_error};
use super::events::Events;
use super::forced_tool::{self, ForcedTool};
use super::malformed::MalformedRun;
use super::request::{
    ResponseFormat, Tool, ToolChoice, check_options, message_role, parse_arguments_object, reasoning_effort,
    response_format, to_json_body, tool_choice, wire_tools,
};
use super::stream::StreamDecoder;
use super::target::ProviderTarget;

// ------------------------------------------------------------- request

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<Options<'a>>,
    /// `"json"`, or a JSON Schema the answer must follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<Value>,
    /// Reasoning on or off (levels are model-specific in Ollama, so only
    /// the switch is sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    think: Option<bool>,
    /// How long Ollama keeps the model loaded after this run; only on a
    /// provider kept warm ([`crate::keep_warm`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    keep_alive: Option<&'static str>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
    /// Base64 image data (Ollama takes no URLs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    images: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<&'a str>,
}

#[derive(Serialize)]
struct ToolCall<'a> {
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    arguments: Value,
}

#[derive(Serialize)]
struct Options<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    num_predict: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f32>,
}

/// How the decoder of a run must read Ollama's answer.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// The forced tool choice the answer is turned into, if any.
    pub forced: Option<ForcedTool>,
    /// `parallel_tool_calls=false` with tools offered and no forced choice:
    /// Ollama cannot be told, so only the answer's first tool call is relayed.
    pub first_tool_call_only: bool,
}

/// The `/api/chat` body for `request` (always `"stream": true`), and how
/// its answer is to be decoded.
pub(super) fn request_body(target: &ProviderTarget, request: &pb::RunRequest) -> Result<(Vec<u8>, Plan), AdapterError> {
    // Ollama matches tool results by name, not id: remember which name each
    // earlier assistant tool call id had.
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.iter().enumerate() {
        let images = m
            .images
            .iter()
            .enumerate()
            .map(|(j, image)| {
                if image.data.is_empty() {
                    return Err(AdapterError::InvalidRequest(format!(
                        "messages[{i}].images[{j}]: Ollama takes image data, not URLs; send the image inline \
                         (base64) or use an OpenAI-compatible provider"
                    )));
                }
                Ok(base64::engine::general_purpose::STANDARD.encode(&image.data))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut message = Message { role: "", content: &m.content, images, tool_calls: Vec::new(), tool_name: None };
        match message_role(i, m)? {
            pb::Role::System => message.role = "system",
            pb::Role::User => message.role = "user",
            pb::Role::Assistant => {
                message.role = "assistant";
                for (j, call) in m.tool_calls.iter().enumerate() {
                    let arguments = parse_arguments_object(
                        format_args!("messages[{i}].tool_calls[{j}].arguments_json"),
                        &call.arguments_json,
                    )?;
                    if !call.id.is_empty() {
                        call_names.insert(&call.id, &call.name);
                    }
                    message.tool_calls.push(ToolCall { function: CallFunction { name: &call.name, arguments } });
                }
            }
            pb::Role::Tool => {
                message.role = "tool";
                message.tool_name = call_names.get(m.tool_call_id.as_str()).copied();
            }
            pb::Role::Unspecified => {
                return Err(AdapterError::InvalidRequest(format!("messages[{i}]: role is unspecified")));
            }
        }
        messages.push(message);
    }

    // Ollama has no tool_choice: `none` is honoured by sending no tools;
    // `required` and a named tool through `format` (`forced_tool`: the
    // answer is the call, which the decoder turns into one), offering only
    // the named tool.
    let forced = forced_tool::plan(request)?;
    let mut tools = match tool_choice(request)? {
        ToolChoice::None => Vec::new(),
        _ => wire_tools(request)?,
    };
    if let Some((_, _, Some(only))) = &forced {
        tools = vec![tools.swap_remove(*only)];
    }

    let default_options = pb::GenerationOptions::default();
    let o = request.options.as_ref().unwrap_or(&default_options);
    check_options(o)?;
    // parallel_tool_calls=false: a forced choice is answered with exactly
    // one call, and with no tools offered there is no call to limit (Codex's
    // compaction sends `tools: []` with it); otherwise Ollama cannot be
    // told, so the decoder keeps the first call and drops the rest.
    let first_tool_call_only = o.parallel_tool_calls == Some(false) && forced.is_none() && !tools.is_empty();
    let (forced, format) = match (forced, response_format(o)?) {
        (Some((forced, schema, _)), _) => (Some(forced), Some(schema)),
        (None, ResponseFormat::Text) => (None, None),
        (None, ResponseFormat::JsonObject) => (None, Some(Value::from("json"))),
        // Ollama constrains the answer to the schema itself.
        (None, ResponseFormat::JsonSchema { schema, .. }) => (None, Some(schema)),
    };
    let options = Options {
        num_predict: o.max_tokens,
        temperature: o.temperature,
        top_p: o.top_p,
        stop: &o.stop,
        seed: o.seed,
        top_k: o.top_k,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
    };
    let any = serde_json::to_value(&options).is_ok_and(|v| v.as_object().is_some_and(|m| !m.is_empty()));
    let options = any.then_some(options);

    let think = reasoning_effort(o)?.map(|effort| effort != pb::ReasoningEffort::None);

    let keep_alive = target.keep_warm.then_some(crate::keep_warm::KEEP_ALIVE);
    let model = &target.target_model;
    let body = to_json_body(&ChatBody { model, messages, stream: true, tools, options, format, think, keep_alive })?;
    Ok((body, Plan { forced, first_tool_call_only }))
}

// ------------------------------------------------------------ response

#[derive(Deserialize)]
struct Chunk {
    model: Option<String>,
    message: Option<ChunkMessage>,
    #[serde(default)]
    done: bool,
    done_reason: Option<String>,
    prompt_eval_count: Option<u64>,
    eval_count: Option<u64>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkMessage {
    content: Option<String>,
    /// A reasoning model's thinking (with `think` on).
    thinking: Option<String>,
    tool_calls: Option<Vec<ChunkToolCall>>,
}

#[derive(Deserialize)]
struct ChunkToolCall {
    function: ChunkFunction,
}

#[derive(Deserialize)]
struct ChunkFunction {
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// Most answer text held back for a forced tool choice (the arguments of one
/// call); more is `TooLarge`.
const FORCED_ANSWER_LIMIT: usize = 1024 * 1024;

/// Decodes Ollama's NDJSON chat stream.
pub(super) struct Decoder {
    fallback_model: String,
    /// The run's id: tool-call ids are derived from it.
    run_id: String,
    started: bool,
    /// Tool calls emitted so far; also the next call's index.
    tool_calls: u32,
    /// A forced tool choice: the answer text is held back here and becomes
    /// one tool call at the end, so none of it reaches the client as text.
    forced: Option<(ForcedTool, String)>,
    /// Relay only the first tool call ([`Plan::first_tool_call_only`]).
    first_tool_call_only: bool,
    malformed: MalformedRun,
}

/// What [`MalformedRun`] calls an undecodable event of this stream.
const EVENT: &str = "NDJSON line";

impl Decoder {
    pub(super) fn new(model: &str, run_id: &str) -> Self {
        Self {
            fallback_model: model.to_owned(),
            run_id: run_id.to_owned(),
            started: false,
            tool_calls: 0,
            forced: None,
            first_tool_call_only: false,
            malformed: MalformedRun::default(),
        }
    }

    /// Reads the answer as the call of a forced tool choice
    /// ([`forced_tool::plan`]).
    pub(super) fn forcing(mut self, forced: Option<ForcedTool>) -> Self {
        self.forced = forced.map(|f| (f, String::new()));
        self
    }

    /// Reads the answer as [`request_body`] planned it.
    pub(super) fn planned(self, plan: Plan) -> Self {
        Self { first_tool_call_only: plan.first_tool_call_only, ..self.forcing(plan.forced) }
    }

    fn call_id(&self, index: u32) -> String {
        // Ollama gives calls no id; clients match tool results by id across
        // turns, so each call gets a unique one: run ids are unique, and
        // deriving from them keeps decoding deterministic.
        format!("call_{}_{index}", self.run_id)
    }

    /// At the final chunk of a forced choice: the held-back answer as the
    /// one tool call (unless the provider made a real call itself). An
    /// answer cut by the length limit is passed on as text with finish
    /// `length`; any other answer that is not the call is a protocol error.
    fn finish_forced(&mut self, truncated: bool, out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError> {
        let Some((forced, answer)) = self.forced.take() else { return Ok(None) };
        if self.tool_calls > 0 {
            return Ok(None);
        }
        match forced.call(&answer) {
            Ok((name, arguments)) => {
                out.push(super::events::tool_call(0, &self.call_id(0), &name, &arguments));
                self.tool_calls = 1;
                Ok(None)
            }
            Err(_) if truncated => {
                if !answer.is_empty() {
                    out.push(super::events::text(&answer));
                }
                Ok(Some(pb::FinishReason::Length))
            }
            Err(why) => Err(AdapterError::Protocol(format!("the provider's answer to a forced tool choice: {why}"))),
        }
    }
}

impl StreamDecoder for Decoder {
    fn line(&mut self, line: &str, out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError> {
        if line.trim().is_empty() {
            return Ok(None);
        }
        let chunk: Chunk = match serde_json::from_str(line) {
            Ok(chunk) => chunk,
            Err(e) => return self.malformed.malformed(EVENT, &json_error_summary(&e)).map(|()| None),
        };
        self.malformed.on_good();
        if let Some(error) = &chunk.error {
            return Err(stream_error(error));
        }
        if !self.started {
            self.started = true;
            let model = chunk.model.as_deref().filter(|m| !m.is_empty()).unwrap_or(&self.fallback_model);
            let first_tool_call_only = self.first_tool_call_only;
            out.push(pb::run_event::Event::Started(pb::RunStarted { model: model.to_owned(), first_tool_call_only }));
        }
        if let Some(message) = &chunk.message {
            if let Some(thinking) = message.thinking.as_deref().filter(|t| !t.is_empty()) {
                out.push(super::events::reasoning(thinking));
            }
            if let Some(content) = message.content.as_deref().filter(|c| !c.is_empty()) {
                match &mut self.forced {
                    Some((_, answer)) => {
                        if answer.len() + content.len() > FORCED_ANSWER_LIMIT {
                            return Err(AdapterError::TooLarge(format!(
                                "the answer to a forced tool choice is over {FORCED_ANSWER_LIMIT} bytes"
                            )));
                        }
                        answer.push_str(content);
                    }
                    None => out.push(super::events::text(content)),
                }
            }
            for call in message.tool_calls.iter().flatten() {
                if self.first_tool_call_only && self.tool_calls > 0 {
                    continue;
                }
                let index = self.tool_calls;
                self.tool_calls += 1;
                let arguments = match &call.function.arguments {
                    Value::Null => "{}".to_owned(),
                    // Some models hand back arguments already as JSON text.
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let id = self.call_id(index);
                out.push(super::events::tool_call(index, &id, &call.function.name, &arguments));
            }
        }
        if !chunk.done {
            return Ok(None);
        }
        let truncated = chunk.done_reason.as_deref() == Some("length");
        if let Some(reason) = self.finish_forced(truncated, out)? {
            out.push(super::events::usage(chunk.prompt_eval_count.unwrap_or(0), chunk.eval_count.unwrap_or(0)));
            return Ok(Some(reason));
        }
        out.push(super::events::usage(chunk.prompt_eval_count.unwrap_or(0), chunk.eval_count.unwrap_or(0)));
        let reason = if self.tool_calls > 0 {
            pb::FinishReason::ToolCalls
        } else {
            match chunk.done_reason.as_deref() {
                Some("length") => pb::FinishReason::Length,
                _ => pb::FinishReason::Stop,
            }
        };
        Ok(Some(reason))
    }

    fn end(&mut self, _out: &mut Events) -> Result<pb::FinishReason, AdapterError> {
        self.malformed.end(EVENT)?;
        Err(AdapterError::Protocol("stream ended before the provider's final chunk".into()))
    }

    fn malformed_skipped(&self) -> u64 {
        self.malformed.skipped()
    }
}

#[cfg(test)]
mod tests;
