//! OpenAI's embeddings API <-> the normalized embeddings run: the request
//! (`model`, `input` as a string or strings, `encoding_format`,
//! `dimensions`; token-id input is refused, as no provider behind IOP
//! shares OpenAI's tokenizer) and the answer (`float` or `base64`).

use base64::Engine as _;
use iop_proto::pb::{self, run_event::Event};
use serde_json::{Value, json};

use super::error::ApiError;
use super::json::{Wording, body_object, field};
use super::outcome::{Terminal, failure_of, finish_reason};

const JSON: Wording = Wording::OpenAi;
/// Most inputs in one request (OpenAI's own bound).
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub embed: pb::EmbedRequest,
    pub base64: bool,
}

pub fn parse_request(body: &[u8]) -> Result<EmbeddingsRequest, ApiError> {
    let obj = body_object(body)?;
    let model = JSON.non_empty_string(&obj, "model", "model")?.to_string();
    let inputs = match JSON.required(&obj, "input", "input")? {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid_param("input", "`input` must not be an empty array"));
        }
        Value::Array(items) if items.len() > MAX_INPUTS => {
            return Err(ApiError::invalid_param("input", format!("`input` may hold at most {MAX_INPUTS} items")));
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                _ => Err(ApiError::invalid_param(
                    &format!("input[{i}]"),
                    "only text input is supported (token arrays need the provider's own tokenizer)",
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(JSON.type_error("input", "a string or an array of strings")),
    };
    let base64 = match field(&obj, "encoding_format").map(|v| JSON.string(v, "encoding_format")).transpose()? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            let message = format!("`encoding_format` is `{other}`; expected float or base64");
            return Err(ApiError::invalid_param("encoding_format", message));
        }
    };
    let dimensions = field(&obj, "dimensions").map(|v| JSON.positive_u32(v, "dimensions")).transpose()?.unwrap_or(0);
    Ok(EmbeddingsRequest { model, embed: pb::EmbedRequest { inputs, dimensions }, base64 })
}

/// The OpenAI answer from a completed embeddings run's events.
pub fn answer(request: &EmbeddingsRequest, events: &[Event]) -> Result<Value, ApiError> {
    let (mut vectors, mut usage, mut terminal, mut model) = (None, None, None, request.model.clone());
    for event in events {
        match event {
            Event::Started(s) if !s.model.is_empty() => model.clone_from(&s.model),
            Event::Embeddings(result) => vectors = Some(result),
            Event::Usage(u) => usage = Some(*u),
            Event::Completed(c) => terminal = Some(Terminal::Completed { finish_reason: c.finish_reason }),
            Event::Failed(f) => terminal = Some(Terminal::Failed(failure_of(f))),
            Event::Cancelled(c) => terminal = Some(Terminal::Cancelled { reason: c.reason }),
            _ => {}
        }
    }
    finish_reason(terminal)?;
    let vectors = vectors.ok_or_else(|| {
        ApiError::Execution(pb::ExecutionFailure::new(
            pb::FailureKind::ProviderProtocol,
            "the run returned no embeddings",
        ))
    })?;
    let data: Vec<Value> = vectors
        .embeddings
        .iter()
        .enumerate()
        .map(|(index, e)| {
            let embedding = if request.base64 {
                let bytes: Vec<u8> = e.values.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(e.values)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let prompt_tokens = usage.map_or(0, |u| u.prompt_tokens);
    Ok(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
}

#[cfg(test)]
mod tests;
