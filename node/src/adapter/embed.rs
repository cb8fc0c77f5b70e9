//! Embeddings: one non-streamed request, Ollama's `POST /api/embed` or an
//! OpenAI-compatible `POST /v1/embeddings`, answered as one
//! `EmbeddingResult` event (vectors in input order) and usage.

use iop_proto::pb;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::json;

use super::error::{AdapterError, json_error_summary};
use super::events::EventSink;
use super::http::{post_json, read_capped};
use super::target::{AdapterKind, ProviderTarget};

pub(super) const OLLAMA_PATH: &str = "/api/embed";
pub(super) const OPENAI_PATH: &str = "/v1/embeddings";
/// Largest embeddings answer read (a batch of large vectors as JSON text):
/// twice the run event the Edge accepts, since a float takes at least ~8
/// bytes of JSON and 4 of protobuf.
const BODY_LIMIT: usize = 2 * iop_proto::wire::MAX_RUN_EVENT_MESSAGE_BYTES;

#[derive(Deserialize)]
struct OllamaAnswer {
    embeddings: Vec<Vec<f32>>,
    #[serde(default)]
    prompt_eval_count: u32,
}

#[derive(Deserialize)]
struct OpenAiAnswer {
    data: Vec<OpenAiEmbedding>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiEmbedding {
    #[serde(default)]
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: u32,
}

pub(super) async fn execute(
    client: &reqwest::Client,
    target: &ProviderTarget,
    embed: &pb::EmbedRequest,
    authorization: Option<HeaderValue>,
    sink: &EventSink,
) -> Result<pb::FinishReason, AdapterError> {
    if embed.inputs.is_empty() {
        return Err(AdapterError::InvalidRequest("an embeddings run needs at least one input".into()));
    }
    let (path, body) = match target.adapter {
        AdapterKind::Ollama if embed.dimensions != 0 => {
            return Err(AdapterError::InvalidRequest(
                "dimensions cannot be enforced by Ollama's /api/embed; leave it unset or use an OpenAI-compatible \
                 provider"
                    .into(),
            ));
        }
        AdapterKind::Ollama => (OLLAMA_PATH, json!({"model": target.target_model, "input": embed.inputs})),
        AdapterKind::OpenAi => {
            let mut body = json!({"model": target.target_model, "input": embed.inputs, "encoding_format": "float"});
            if embed.dimensions != 0 {
                body["dimensions"] = embed.dimensions.into();
            }
            (OPENAI_PATH, body)
        }
    };
    let url = reqwest::Url::parse(&target.url(path)).map_err(|e| AdapterError::InvalidRequest(e.to_string()))?;
    let response = post_json(client, url, body.to_string().into_bytes(), authorization).await?;
    let (bytes, error) = read_capped(response, BODY_LIMIT).await;
    if error.is_some() {
        return Err(AdapterError::StreamCut("the embeddings answer was cut off".into()));
    }
    let invalid = |e: serde_json::Error| {
        AdapterError::Protocol(format!("provider sent an invalid embeddings answer ({})", json_error_summary(&e)))
    };
    let (vectors, prompt_tokens) = match target.adapter {
        AdapterKind::Ollama => {
            let answer: OllamaAnswer = serde_json::from_slice(&bytes).map_err(invalid)?;
            (answer.embeddings, answer.prompt_eval_count)
        }
        AdapterKind::OpenAi => {
            let mut answer: OpenAiAnswer = serde_json::from_slice(&bytes).map_err(invalid)?;
            answer.data.sort_by_key(|e| e.index);
            (answer.data.into_iter().map(|e| e.embedding).collect(), answer.usage.map_or(0, |u| u.prompt_tokens))
        }
    };
    if vectors.len() != embed.inputs.len() {
        return Err(AdapterError::Protocol(format!(
            "provider answered {} embeddings for {} inputs",
            vectors.len(),
            embed.inputs.len()
        )));
    }
    // A server that does not implement `dimensions` (llama.cpp's ignores
    // it) answers the model's full width; handing that to a client that
    // asked for fewer would be a silent wrong answer.
    if let Some(width) = vectors.iter().map(Vec::len).find(|w| embed.dimensions != 0 && *w != embed.dimensions as usize)
    {
        return Err(AdapterError::InvalidRequest(format!(
            "provider `{}` does not enforce dimensions: it answered {width}-dimensional vectors for dimensions {}; \
             leave dimensions unset",
            target.provider_id, embed.dimensions
        )));
    }
    let result =
        pb::EmbeddingResult { embeddings: vectors.into_iter().map(|values| pb::Embedding { values }).collect() };
    let events = [
        super::events::started(&target.target_model),
        pb::run_event::Event::Embeddings(result),
        pb::run_event::Event::Usage(pb::Usage::provider(prompt_tokens, 0, 0)),
    ];
    for event in events {
        sink.send(event).await.map_err(|_| AdapterError::SinkClosed)?;
    }
    Ok(pb::FinishReason::Stop)
}

#[cfg(test)]
mod tests;
