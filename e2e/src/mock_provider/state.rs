//! The server's shared state: the [`AppState`] that every handler gets
//! (the process default knobs, the API key, the scripts, the stopping
//! signal) and its [`Counters`]: the stats ([`MockStats`]), the request log,
//! the script cursors, the held requests and the model's residency.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use axum::body::Bytes;
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use super::faults::Faults;
use super::residency;
use super::scripts::{ScriptTurn, Scripts};

/// How many requests `GET /mock/requests` keeps (the oldest go first).
pub const REQUEST_LOG_LIMIT: usize = 100;

/// Counters served on `GET /mock/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MockStats {
    /// Chat requests received (both APIs, including rejected ones).
    pub requests_total: u64,
    /// Streaming bodies the mock produced to their end (or to a `cut_after` abort).
    pub completed_streams: u64,
    /// Streaming bodies dropped (client went away) before the mock finished them.
    pub aborted_streams: u64,
    /// Bytes of streaming bodies handed to the HTTP server so far; stops
    /// growing when a client's backpressure reaches the mock.
    pub stream_bytes: u64,
    /// Turns taken per script since start or `POST /mock/scripts/reset`
    /// (the cursor; omitted from the JSON while empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scripts: BTreeMap<String, u64>,
    /// Model loads performed (see *Residency*).
    #[serde(default)]
    pub loads: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    /// When set, the metadata endpoints (`/api/tags`, `/api/show`, `/api/ps`,
    /// `/api/version`, `/v1/models`) answer 503: health probes fail while
    /// chat keeps its knobs. Toggled by `POST /mock/health`.
    pub(super) metadata_down: std::sync::atomic::AtomicBool,
    pub(super) requests_total: AtomicU64,
    pub(super) completed_streams: AtomicU64,
    pub(super) aborted_streams: AtomicU64,
    pub(super) stream_bytes: AtomicU64,
    pub(super) next_completion_id: AtomicU64,
    /// Scripted tool calls so far: their ids are `call_<n>`.
    pub(super) next_tool_call_id: AtomicU64,
    /// Script cursors (turns taken); rewound by `POST /mock/scripts/reset`.
    pub(super) script_cursors: std::sync::Mutex<BTreeMap<String, u64>>,
    /// `hold` names released by `POST /mock/release/NAME`, and a wake-up
    /// for the requests holding on them.
    pub(super) released: std::sync::Mutex<std::collections::BTreeSet<String>>,
    pub(super) release: tokio::sync::Notify,
    /// The last [`REQUEST_LOG_LIMIT`] provider requests, oldest first.
    pub(super) request_log: std::sync::Mutex<VecDeque<LoggedRequest>>,
    /// `fail_times`: requests seen per exact knob set.
    failures: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Whether the model is resident, the names requests named, loads.
    pub(super) residency: residency::Residency,
}

/// One entry of the request log (`GET /mock/requests`, [`MockHandle::requests`](super::MockHandle::requests)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    pub method: String,
    /// Without the query.
    pub path: String,
    /// The body as JSON, or as a string (lossy UTF-8, `""` when empty) when
    /// it is not JSON.
    pub body: Value,
    /// The request's headers in order, names in lower case (values that
    /// are not UTF-8 lossily).
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

/// A request log entry as kept: the body is parsed only when read.
#[derive(Debug)]
pub(super) struct LoggedRequest {
    pub(super) method: http::Method,
    pub(super) path: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl LoggedRequest {
    fn recorded(&self) -> RecordedRequest {
        let body = serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()));
        let headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect();
        RecordedRequest { method: self.method.to_string(), path: self.path.clone(), body, headers }
    }
}

impl Counters {
    pub(super) fn snapshot(&self) -> MockStats {
        MockStats {
            requests_total: self.requests_total.load(Ordering::Relaxed),
            completed_streams: self.completed_streams.load(Ordering::Relaxed),
            aborted_streams: self.aborted_streams.load(Ordering::Relaxed),
            stream_bytes: self.stream_bytes.load(Ordering::Relaxed),
            scripts: self.script_cursors.lock().unwrap().clone(),
            loads: self.residency.loads.load(Ordering::Relaxed),
        }
    }

    /// Appends to the request log, dropping the oldest entry past the limit.
    pub(super) fn log_request(&self, entry: LoggedRequest) {
        let mut log = self.request_log.lock().unwrap();
        if log.len() >= REQUEST_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(entry);
    }

    pub(super) fn logged_requests(&self) -> Vec<RecordedRequest> {
        self.request_log.lock().unwrap().iter().map(LoggedRequest::recorded).collect()
    }

    /// Counts one more request with exactly `faults` (`fail_times`); returns the count.
    pub(super) fn count_failure(&self, faults: &Faults) -> u64 {
        let mut failures = self.failures.lock().unwrap();
        let count = failures.entry(format!("{faults:?}")).or_default();
        *count += 1;
        *count
    }

    /// Advances the cursor of script `name`; returns where it was.
    fn take_turn(&self, name: &str) -> u64 {
        let mut cursors = self.script_cursors.lock().unwrap();
        let cursor = cursors.entry(name.to_owned()).or_default();
        *cursor += 1;
        *cursor - 1
    }
}

#[derive(Clone)]
pub(super) struct AppState {
    /// Process defaults; replaced at runtime by `POST /mock/faults`.
    pub(super) defaults: Arc<RwLock<Faults>>,
    pub(super) api_key: Arc<RwLock<Option<String>>>,
    /// Loaded once at start; the cursors are in `counters`.
    pub(super) scripts: Option<Arc<Scripts>>,
    pub(super) counters: Arc<Counters>,
    /// Becomes `true` (or closed) when the server shuts down.
    pub(super) stopping: watch::Receiver<bool>,
}

impl AppState {
    /// Waits until `name` is released (or the server stops).
    pub(super) async fn until_released(&self, name: &str) {
        loop {
            let notified = self.counters.release.notified();
            if self.counters.released.lock().unwrap().contains(name) {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = self.until_stopping() => return,
            }
        }
    }

    /// Whether script `name` is loaded, else the 400 message.
    pub(super) fn check_script(&self, name: &str) -> Result<(), String> {
        match self.scripts.as_deref() {
            None => Err(format!("no script `{name}`: the mock provider has no script file (--script-file)")),
            Some(scripts) if scripts.turn(name, 0).is_none() => {
                let known = scripts.names().collect::<Vec<_>>().join(", ");
                Err(format!("no script `{name}` in the script file (scripts: {known})"))
            }
            Some(_) => Ok(()),
        }
    }

    /// The next turn of script `name` (its cursor advances).
    pub(super) fn take_turn(&self, name: &str) -> Result<ScriptTurn, String> {
        self.check_script(name)?;
        let cursor = self.counters.take_turn(name);
        let turn = self.scripts.as_deref().and_then(|scripts| scripts.turn(name, cursor));
        turn.cloned().ok_or_else(|| format!("no script `{name}`"))
    }

    pub(super) async fn until_stopping(&self) {
        let mut stopping = self.stopping.clone();
        let _ = stopping.wait_for(|stop| *stop).await;
    }
}
