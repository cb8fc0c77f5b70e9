//! Exact prompt-token counts (`RunRequest.count_tokens`), asked of the
//! provider's own tokenizer: llama.cpp's server renders the model's chat
//! template over the same body a chat would send (`POST /apply-template`)
//! and tokenizes the rendered prompt (`POST /tokenize`), so the count is the
//! one the chat would report. Ollama has no tokenizer endpoint, and neither
//! has an OpenAI-compatible server without these two; both fail the run with
//! `InvalidRequest` without generating anything, and the Edge then answers
//! its documented estimate. The same count is a run's prompt when its
//! provider reported no usage (`crate::run`).

use iop_proto::pb;
use reqwest::StatusCode;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::json;

use super::error::{AdapterError, json_error_summary};
use super::events::EventSink;
use super::http::{post_json, read_capped};
use super::target::{AdapterKind, ProviderTarget};

pub(super) const TEMPLATE_PATH: &str = "/apply-template";
pub(super) const TOKENIZE_PATH: &str = "/tokenize";
/// Largest tokenizer answer read (a long prompt's token ids as JSON text).
const BODY_LIMIT: usize = 32 * 1024 * 1024;

#[derive(Deserialize)]
struct Template {
    prompt: String,
}

#[derive(Deserialize)]
struct Tokens {
    tokens: Vec<serde_json::Value>,
}

pub(super) async fn execute(
    client: &reqwest::Client,
    target: &ProviderTarget,
    request: &pb::RunRequest,
    authorization: Option<HeaderValue>,
    sink: &EventSink,
) -> Result<pb::FinishReason, AdapterError> {
    let prompt_tokens = count_prompt(client, target, request, authorization).await?;
    let events = [
        super::events::started(&target.target_model),
        pb::run_event::Event::Usage(pb::Usage::provider(prompt_tokens, 0, 0)),
    ];
    for event in events {
        sink.send(event).await.map_err(|_| AdapterError::SinkClosed)?;
    }
    Ok(pb::FinishReason::Stop)
}

/// The prompt tokens of `request` by the provider's own tokenizer (see the
/// module's doc), or why it has none.
pub(crate) async fn count_prompt(
    client: &reqwest::Client,
    target: &ProviderTarget,
    request: &pb::RunRequest,
    authorization: Option<HeaderValue>,
) -> Result<u32, AdapterError> {
    if target.adapter == AdapterKind::Ollama {
        return Err(no_tokenizer(target, "Ollama has no tokenizer endpoint"));
    }
    let chat = super::openai::request_body(target, request)?;
    let template: Template = call(client, target, TEMPLATE_PATH, chat, authorization.clone()).await?;
    let body = json!({ "content": template.prompt, "add_special": true }).to_string().into_bytes();
    let tokens: Tokens = call(client, target, TOKENIZE_PATH, body, authorization).await?;
    Ok(u32::try_from(tokens.tokens.len()).unwrap_or(u32::MAX))
}

/// One tokenizer call; a provider that does not serve `path` (404, 405,
/// 501) has no tokenizer, which is not the provider failing.
async fn call<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    target: &ProviderTarget,
    path: &str,
    body: Vec<u8>,
    authorization: Option<HeaderValue>,
) -> Result<T, AdapterError> {
    let url = reqwest::Url::parse(&target.url(path)).map_err(|e| AdapterError::InvalidRequest(e.to_string()))?;
    let response = match post_json(client, url, body, authorization).await {
        Err(AdapterError::HttpStatus { status, .. })
            if [StatusCode::NOT_FOUND, StatusCode::METHOD_NOT_ALLOWED, StatusCode::NOT_IMPLEMENTED]
                .map(|s| s.as_u16())
                .contains(&status) =>
        {
            return Err(no_tokenizer(target, &format!("the provider answers HTTP {status} to {path}")));
        }
        other => other?,
    };
    let (bytes, error) = read_capped(response, BODY_LIMIT).await;
    if error.is_some() {
        return Err(AdapterError::StreamCut(format!("the answer to {path} was cut off")));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        AdapterError::Protocol(format!("provider sent an invalid answer to {path} ({})", json_error_summary(&e)))
    })
}

fn no_tokenizer(target: &ProviderTarget, why: &str) -> AdapterError {
    AdapterError::InvalidRequest(format!("provider `{}` cannot count tokens: {why}", target.provider_id))
}

#[cfg(test)]
mod tests;
