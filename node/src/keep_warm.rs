//! Keep-warm: the Edge may ask that a provider's model stay resident
//! (`ProviderAssignment.keep_warm`). The node honours it only on an Ollama
//! provider and only where its owner opted in (`models.allow_keep_warm`):
//! the memory of the Mac is the owner's to give. Then
//!
//! - every normalized run carries Ollama's `keep_alive` ([`KEEP_ALIVE`]);
//! - a zero-token touch, `POST /api/generate {"model": .., "keep_alive": ..}`
//!   without a prompt (Ollama's documented way to load a model and keep
//!   it), is sent when the connection is Ready and then every
//!   [`TOUCH_INTERVAL`], shorter than [`KEEP_ALIVE`] so the model never
//!   expires between touches.
//!
//! Elsewhere the request is ignored and logged once per assignment.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::adapter::error::error_chain;
use crate::adapter::http::read_capped;
use crate::adapter::target::{AdapterKind, ProviderTarget};

/// How long Ollama keeps a kept-warm model after a run or touch. Bounded on
/// purpose, never "forever" (`-1`): a node that dies, or a cluster that
/// stops asking, releases the Mac's memory within this time instead of
/// pinning the model until someone restarts Ollama.
pub const KEEP_ALIVE: &str = "10m";

/// Touch period: half of [`KEEP_ALIVE`], so one lost touch does not let the
/// model expire.
pub const TOUCH_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// Upper bound of one touch: it may load the model, which takes minutes for
/// a large one.
const TOUCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether the node honours an assignment's `keep_warm` (pure): asked, an
/// Ollama provider, and the owner allows it.
pub fn honoured(asked: bool, adapter: AdapterKind, allowed: bool) -> bool {
    asked && allowed && adapter == AdapterKind::Ollama
}

/// Applies an assignment's `keep_warm` to its target, logging (once, at
/// info, naming only the provider) a request the node does not honour.
pub fn apply(target: &mut ProviderTarget, asked: bool, allowed: bool) {
    target.keep_warm = honoured(asked, target.adapter, allowed);
    if asked && !target.keep_warm {
        let why = if target.adapter == AdapterKind::Ollama {
            "models.allow_keep_warm is off on this node"
        } else {
            "keep_warm applies to Ollama providers only"
        };
        tracing::info!(provider = %target.provider_id, reason = why, "keep_warm requested and not honoured");
    }
}

/// One zero-token touch.
async fn touch(http: &reqwest::Client, target: &ProviderTarget) {
    let body = serde_json::json!({ "model": target.target_model, "keep_alive": KEEP_ALIVE }).to_string();
    let call = async {
        let response = http
            .post(target.url("/api/generate"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let status = response.status();
        read_capped(response, 64 * 1024).await;
        Ok::<_, reqwest::Error>(status)
    };
    match tokio::time::timeout(TOUCH_TIMEOUT, call).await {
        Ok(Ok(status)) if status.is_success() => {}
        Ok(Ok(status)) => {
            tracing::debug!(provider = %target.provider_id, status = status.as_u16(), "keep_warm touch refused")
        }
        Ok(Err(e)) => tracing::debug!(
            provider = %target.provider_id,
            error = %error_chain(&e.without_url()),
            "keep_warm touch failed"
        ),
        Err(_) => tracing::debug!(provider = %target.provider_id, "keep_warm touch timed out"),
    }
}

/// Touches every kept-warm target now and then every `interval` until
/// `stop`. Runs only on a Ready connection.
pub async fn run(http: reqwest::Client, targets: Vec<ProviderTarget>, interval: Duration, stop: CancellationToken) {
    let warm: Vec<_> = targets.into_iter().filter(|t| t.keep_warm).collect();
    if warm.is_empty() {
        return;
    }
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let touches = warm.iter().map(|t| touch(&http, t));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = futures_util::future::join_all(touches) => {}
        }
    }
}

#[cfg(test)]
mod tests;
