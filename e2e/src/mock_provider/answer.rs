//! A chat (any API) or embeddings request from its body to its response:
//! the knobs it carries, the wait for a load, the knobs that act before any
//! answer, then the reply as a whole body or as a stream.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;

use super::api::{Api, ChatRequest};
use super::embeddings::{EmbedPlan, EmbedRequest};
use super::faults::{Faults, MALFORMED_JSON, on, request_faults, sleep_ms};
use super::plan::{Part, Reply, ReplyPlan, prompt_tokens, reasoning_text};
use super::residency;
use super::scripts::{ScriptTurn, requested_script};
use super::state::AppState;
use super::streaming::{BodyScript, Step, cut_error, schedule};
use super::{ollama, openai, responses};

pub(super) async fn chat(api: Api, state: AppState, headers: HeaderMap, body: Bytes) -> Response {
    state.counters.requests_total.fetch_add(1, Ordering::Relaxed);
    let mut req: ChatRequest = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => return api.error(StatusCode::BAD_REQUEST, &format!("invalid chat request: {e}")),
    };
    state.counters.residency.learn(&req.model);
    if api == Api::Responses {
        req.responses_messages();
    }
    let defaults = state.defaults.read().expect("fault defaults lock").clone();
    let faults = match request_faults(&defaults, &req.model, &headers) {
        Ok(faults) => faults,
        Err(message) => return api.error(StatusCode::BAD_REQUEST, &message),
    };
    if on(faults.text_only) && carries_image(&body) {
        return api.error(StatusCode::INTERNAL_SERVER_ERROR, TEXT_ONLY_REFUSAL);
    }
    let script = requested_script(&req.messages);
    if let Some(name) = &script
        && let Err(message) = state.check_script(name)
    {
        return api.error(StatusCode::BAD_REQUEST, &message);
    }
    tracing::debug!(?api, model = %req.model, ?faults, ?script, "chat request");
    residency::endpoints::until_resident(&state).await;
    let echoed = on(faults.echo_auth).then(|| auth_quote(&headers));
    if let Some(answer) = before_answer(api, &state, &faults, echoed.as_deref()).await {
        return answer;
    }
    let stream = req.stream.unwrap_or(api.streams_by_default());
    if let Some(message) = &echoed
        && !stream
    {
        return api.error(StatusCode::UNAUTHORIZED, message);
    }
    if let Some(window) = faults.context_window
        && prompt_tokens(&req.messages) > window
    {
        let message = format!(
            "This model's maximum context length is {window} tokens. However, your messages resulted in {} tokens.",
            prompt_tokens(&req.messages)
        );
        return api.error(StatusCode::BAD_REQUEST, &message);
    }

    let plan = match &script {
        Some(name) => match state.take_turn(name) {
            Ok(turn) => {
                let calls = match &turn {
                    ScriptTurn::Text(_) => 0,
                    ScriptTurn::ToolCalls(calls) => calls.len() as u64,
                };
                let first_call = state.counters.next_tool_call_id.fetch_add(calls, Ordering::Relaxed);
                ReplyPlan::scripted(&req.messages, &turn, api.limit(&req), first_call)
            }
            Err(message) => return api.error(StatusCode::BAD_REQUEST, &message),
        },
        None => match req.answer_schema(api) {
            Some(schema) => ReplyPlan::from_text(
                prompt_tokens(&req.messages),
                &serde_json::to_string_pretty(&crate::schema_example::example_for_schema(schema)).unwrap_or_default(),
                api.limit(&req),
            ),
            None => {
                let words = faults.words.map(|n| (n, on(faults.repeat_prefill)));
                ReplyPlan::echo(&req.messages, req.tools.as_deref().unwrap_or_default(), api.limit(&req), words)
            }
        },
    };
    let plan = if api.wants_reasoning(&req) { plan.with_reasoning(&reasoning_text(&req.messages)) } else { plan };
    let reply = Reply {
        api,
        id: format!("{}{}", api.id_prefix(), state.counters.next_completion_id.fetch_add(1, Ordering::Relaxed)),
        plan,
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        no_done: on(faults.no_done),
        line_end: faults.sse_line_end.unwrap_or_default(),
        model: req.model,
    };
    let mut response = if stream {
        streaming_response(&reply, &faults, &state, echoed.as_deref())
    } else {
        full_response(&reply, &faults, &state).await
    };
    if on(faults.set_cookie) {
        let headers = response.headers_mut();
        headers.append(header::SET_COOKIE, HeaderValue::from_static("mock-session=s3cr3t; Path=/; HttpOnly"));
        headers.append("x-ratelimit-remaining-requests", HeaderValue::from_static("99"));
    }
    response
}

/// `echo_auth`'s message: the request's `Authorization` quoted whole.
fn auth_quote(headers: &HeaderMap) -> String {
    let presented = headers.get(header::AUTHORIZATION).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    format!("Incorrect API key provided: {}", presented.as_deref().unwrap_or("(none)"))
}

/// The knobs that act before any answer, in this order: `exit`, `hold`,
/// `headers_delay_ms`, `never_answer`, `status`. Returns the answer to send
/// instead of the normal one, if any.
async fn before_answer(api: Api, state: &AppState, faults: &Faults, echoed: Option<&str>) -> Option<Response> {
    if on(faults.exit) {
        tracing::warn!("`exit` fault requested: exiting with status 3");
        std::process::exit(3);
    }
    if let Some(name) = &faults.hold {
        state.until_released(name).await;
    }
    sleep_ms(faults.headers_delay_ms).await;
    if on(faults.never_answer) {
        state.until_stopping().await;
        return Some(api.error(StatusCode::SERVICE_UNAVAILABLE, "mock provider is shutting down"));
    }
    if faults.fail_times.is_some_and(|n| state.counters.count_failure(faults) > n) {
        return None;
    }
    faults.status.map(|code| fault_status(api, code, faults, echoed))
}

/// What llama.cpp's server answers (HTTP 500) to an image without a
/// vision projector loaded.
const TEXT_ONLY_REFUSAL: &str =
    "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj";

/// Whether a chat request carries an image: OpenAI `image_url` parts,
/// Responses `input_image` items, Ollama `images`.
fn carries_image(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    ["\"image_url\"", "\"input_image\"", "\"images\""].iter().any(|key| text.contains(key))
}

fn fault_status(api: Api, code: u16, faults: &Faults, message: Option<&str>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = message.map_or_else(|| format!("mock fault: status {code}"), str::to_owned);
    let mut response = api.error_with_code(status, &message, faults.error_code.as_deref());
    if let Some(secs) = faults.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// A non-streaming answer: the whole generation time passes before the
/// response; the chunk-level knobs degrade the body as a whole.
async fn full_response(reply: &Reply, faults: &Faults, state: &AppState) -> Response {
    if faults.stall_after.is_some() {
        state.until_stopping().await;
        return reply.api.error(StatusCode::SERVICE_UNAVAILABLE, "mock provider is shutting down");
    }
    let chunks = reply.plan.chunk_count() as u64;
    sleep_ms(faults.first_token_delay_ms).await;
    sleep_ms(faults.chunk_delay_ms.map(|ms| ms.saturating_mul(chunks.saturating_sub(1)))).await;

    let json = header::HeaderValue::from_static("application/json");
    if faults.any_malformed() {
        return ([(header::CONTENT_TYPE, json)], MALFORMED_JSON).into_response();
    }
    let mut body = reply.full_body().to_string().into_bytes();
    if faults.cut_after.is_some() {
        body.truncate(body.len() / 2);
        let half = futures_util::stream::once(async { Ok(Bytes::from(body)) });
        let body = Body::from_stream(half.chain(futures_util::stream::once(cut_error())));
        return ([(header::CONTENT_TYPE, json)], body).into_response();
    }
    ([(header::CONTENT_TYPE, json)], body).into_response()
}

fn streaming_response(reply: &Reply, faults: &Faults, state: &AppState, echoed: Option<&str>) -> Response {
    let mut parts = reply.stream_parts();
    if echoed.is_some() {
        // The first content chunk, then the error instead of the rest.
        let first = parts.iter().position(|p| matches!(p, Part::Content(_))).map_or(parts.len(), |i| i + 1);
        parts.truncate(first);
    }
    let mut steps = schedule(parts, faults, reply.api.malformed_chunk());
    if let Some(message) = echoed {
        let event = reply.api.stream_error(message);
        // Split inside the quoted key: the halves are separate writes.
        let cut = event.find("Bearer ").map_or(event.len() / 2, |at| {
            let key = at + "Bearer ".len();
            key + event[key..].find('"').unwrap_or(0) / 2
        });
        let (first, second) = event.split_at(cut);
        steps.push_back(Step::Send(Bytes::from(first.to_owned())));
        steps.push_back(Step::Delay(Duration::from_millis(5)));
        steps.push_back(Step::Send(Bytes::from(second.to_owned())));
    }
    let body = BodyScript::new(steps, state).into_body();
    let headers = [(header::CONTENT_TYPE, reply.api.stream_content_type()), (header::CACHE_CONTROL, "no-cache")];
    (headers, body).into_response()
}

pub(super) async fn embed(api: Api, state: AppState, headers: HeaderMap, body: Bytes) -> Response {
    let req: EmbedRequest = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => return api.error(StatusCode::BAD_REQUEST, &format!("invalid embeddings request: {e}")),
    };
    state.counters.residency.learn(&req.model);
    let defaults = state.defaults.read().expect("fault defaults lock").clone();
    let faults = match request_faults(&defaults, &req.model, &headers) {
        Ok(faults) => faults,
        Err(message) => return api.error(StatusCode::BAD_REQUEST, &message),
    };
    let plan = match EmbedPlan::new(api, &req) {
        Ok(plan) => plan,
        Err(message) => return api.error(StatusCode::BAD_REQUEST, &message),
    };
    tracing::debug!(?api, model = %req.model, ?faults, inputs = plan.vectors.len(), "embeddings request");
    residency::endpoints::until_resident(&state).await;
    if let Some(answer) = before_answer(api, &state, &faults, None).await {
        return answer;
    }
    let body = match api {
        Api::Ollama => ollama::embed(&req.model, &plan),
        Api::OpenAi | Api::Responses => openai::embeddings(&req.model, &plan),
    };
    Json(body).into_response()
}

impl Reply {
    fn stream_parts(&self) -> Vec<Part> {
        let parts = match self.api {
            // NDJSON lines end with `\n` whatever `sse_line_end` says.
            Api::Ollama => return ollama::stream_parts(self),
            Api::OpenAi => openai::stream_parts(self),
            Api::Responses => responses::stream_parts(self),
        };
        parts.into_iter().map(|part| part.map(|b| self.line_end.apply(b))).collect()
    }

    fn full_body(&self) -> Value {
        match self.api {
            Api::Ollama => ollama::full_body(self),
            Api::OpenAi => openai::full_body(self),
            Api::Responses => responses::full_body(self),
        }
    }
}
