//! Provider adapters: translate one normalized [`pb::RunRequest`] into a
//! provider's HTTP API (Ollama native or OpenAI-compatible), stream the
//! answer back as normalized run events, and map every failure onto the wire
//! taxonomy ([`AdapterError::to_failure`]).
//!
//! The adapters always stream from the provider; the Edge aggregates for
//! clients that did not ask for a stream. Nothing here buffers a whole
//! response: each line is decoded and forwarded as it arrives (the one
//! exception: Ollama's answer to a forced tool choice, held back, at most
//! 1 MiB, until it becomes one tool call; see [`forced_tool`]), and dropping
//! the [`execute`] future drops the in-flight response, which closes the
//! provider connection.

mod embed;
pub(crate) mod error;
mod events;
mod forced_tool;
pub(crate) mod http;
mod images;
mod lines;
mod malformed;
mod ollama;
mod openai;
pub mod probe;
mod request;
mod sse;
mod stream;
pub(crate) mod target;
mod tokens;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod fuzz;

use iop_proto::pb;
use reqwest::header::HeaderValue;

use http::post_json;
use stream::{Tally, drive};

use crate::metrics::NodeMetrics;

pub use error::AdapterError;
pub(crate) use error::{stream_cut, transport_error};
pub use events::EventSink;
pub use http::http_client;
pub(crate) use http::read_capped;
pub(crate) use images::{ollama_capabilities, ollama_image_input};
pub use target::{AdapterKind, ProviderTarget, Providers};
pub(crate) use tokens::count_prompt;

/// Runs one normalized chat request against the provider, streaming events
/// into `sink`. Returns the finish reason on success; the caller emits the
/// terminal event. Cancellation = dropping this future, which drops the
/// in-flight response so the provider sees the connection close.
///
/// The model sent to the provider is `target.target_model` (the validated
/// assignment); `request.stream` is ignored (we always stream). Malformed
/// events the stream skips are counted in `metrics`.
pub async fn execute(
    client: &reqwest::Client,
    target: &ProviderTarget,
    request: &pb::RunRequest,
    authorization: Option<HeaderValue>,
    sink: &EventSink,
    metrics: &NodeMetrics,
) -> Result<pb::FinishReason, AdapterError> {
    if request.adapter != 0 && request.adapter != i32::from(target.adapter.to_wire()) {
        return Err(AdapterError::InvalidRequest(format!(
            "run names adapter {} but provider `{}` is {:?}",
            request.adapter, target.provider_id, target.adapter
        )));
    }
    if sink.is_closed() {
        return Err(AdapterError::SinkClosed);
    }
    if let Some(embed) = &request.embed {
        return embed::execute(client, target, embed, authorization, sink).await;
    }
    if request.count_tokens {
        return tokens::execute(client, target, request, authorization, sink).await;
    }
    match target.adapter {
        AdapterKind::Ollama => {
            if request.carries_images() {
                images::ensure_ollama_takes_images(client, target).await?;
            }
            let fetched;
            let request = if target.fetch_image_urls && images::any_url(request) {
                fetched = images::fetch_urls(request).await?;
                &fetched
            } else {
                request
            };
            let (body, plan) = ollama::request_body(target, request)?;
            let response = post_json(client, target.chat_url.clone(), body, authorization).await?;
            let decoder = ollama::Decoder::new(&target.target_model, &request.run_id).planned(plan);
            drive(response, decoder, sink, Tally { provider: &target.provider_id, metrics, reported: 0 }).await
        }
        AdapterKind::OpenAi => {
            let body = openai::request_body(target, request)?;
            let response = post_json(client, target.chat_url.clone(), body, authorization).await?;
            let decoder = openai::Decoder::new(&target.target_model);
            drive(response, decoder, sink, Tally { provider: &target.provider_id, metrics, reported: 0 }).await
        }
    }
}

#[cfg(test)]
mod tests;
