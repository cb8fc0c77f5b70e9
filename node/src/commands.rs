//! Node commands that reach a provider. OLLAMA_API runs one call from a
//! fixed, read-only allowlist against an Ollama provider's base URL; the
//! caller names the provider and the call, never a path, a method or a
//! model (`show` always asks about the provider's own target model).

use std::time::Duration;

use iop_proto::pb::{self, CommandErrorCode, OllamaApiCall, node_command_result::Result as CommandResult};
use iop_proto::wire::closed_enum;
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderValue};

use crate::adapter::Providers;
use crate::adapter::{self, AdapterKind};

/// Bound on one OLLAMA_API call, connect to last body byte.
pub const OLLAMA_API_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of the provider's answer passed back; the rest is not read.
pub const OLLAMA_API_BODY_LIMIT: usize = 1024 * 1024;

/// Runs one OLLAMA_API command and returns its result (an error result for
/// an unknown call, a provider that is not an assigned Ollama provider, or a
/// provider that cannot be reached in time). Any HTTP status the provider
/// answers is passed back as-is with its body (truncated to
/// [`OLLAMA_API_BODY_LIMIT`]).
pub async fn ollama_api(http: &reqwest::Client, providers: &Providers, provider_id: &str, call: i32) -> CommandResult {
    match ollama_api_call(http, providers, provider_id, call).await {
        Ok(result) => CommandResult::OllamaApi(result),
        Err(error) => CommandResult::Error(error),
    }
}

fn error(code: CommandErrorCode, message: impl Into<String>) -> pb::CommandError {
    pb::CommandError { code: code.into(), message: message.into() }
}

/// The allowlist: method, path and whether the body names the target model.
fn endpoint(call: OllamaApiCall) -> Option<(Method, &'static str, bool)> {
    match call {
        OllamaApiCall::Tags => Some((Method::GET, "/api/tags", false)),
        OllamaApiCall::Ps => Some((Method::GET, "/api/ps", false)),
        OllamaApiCall::Version => Some((Method::GET, "/api/version", false)),
        OllamaApiCall::Show => Some((Method::POST, "/api/show", true)),
        OllamaApiCall::Unspecified => None,
    }
}

async fn ollama_api_call(
    http: &reqwest::Client,
    providers: &Providers,
    provider_id: &str,
    call: i32,
) -> Result<pb::OllamaApiResult, pb::CommandError> {
    let unsupported = || error(CommandErrorCode::Unsupported, format!("unsupported ollama_call {call}"));
    let (method, path, names_model) =
        closed_enum::<OllamaApiCall>("command.ollama_call", call).ok().and_then(endpoint).ok_or_else(unsupported)?;
    let invalid = |why: &str| error(CommandErrorCode::InvalidTarget, format!("provider `{provider_id}` {why}"));
    let target = match providers.get(provider_id) {
        None => return Err(invalid("is not assigned to this node")),
        Some(Err(_)) => return Err(invalid("has an invalid assignment")),
        Some(Ok(target)) if target.adapter != AdapterKind::Ollama => {
            return Err(invalid("does not use the ollama adapter"));
        }
        Some(Ok(target)) => target,
    };
    let url = target.url(path);
    // The provider's address is internal: the answer names only the call.
    let context = format!("{method} {path}");
    let mut request = http.request(method, &url).timeout(OLLAMA_API_TIMEOUT);
    if names_model {
        let body = serde_json::json!({ "model": target.target_model });
        request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json")).body(body.to_string());
    }
    let exchange = async {
        let response = request.send().await.map_err(|e| adapter::transport_error(&context, e))?;
        let status = u32::from(response.status().as_u16());
        match adapter::read_capped(response, OLLAMA_API_BODY_LIMIT).await {
            (_, Some(e)) => Err(adapter::transport_error("reading the provider's answer", e)),
            (body, None) => Ok(pb::OllamaApiResult { status, body }),
        }
    };
    match tokio::time::timeout(OLLAMA_API_TIMEOUT, exchange).await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(e)) => Err(error(CommandErrorCode::ProviderFailed, e.to_string())),
        Err(_) => Err(error(
            CommandErrorCode::ProviderFailed,
            format!("{context}: no complete answer within {} s", OLLAMA_API_TIMEOUT.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests;
