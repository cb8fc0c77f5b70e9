//! Residency evidence: whether a provider's model is in its server's memory
//! now, read from the server's own residency endpoint. Every call is a
//! read-only metadata call (never a generation, never a load), bounded by
//! [`crate::adapter::probe::PROBE_TIMEOUT`] and [`RESIDENCY_BODY_CAP`].
//!
//! | adapter           | endpoint                                      | loaded when |
//! |-------------------|-----------------------------------------------|-------------|
//! | Ollama            | `GET /api/ps`                                 | an entry's `name`/`model` is the target (or `target:latest`) |
//! | OpenAI-compatible | detected once per target, in this order:      | |
//! |                   | 1. LM Studio `GET /api/v0/models/{target}`    | `"state": "loaded"` |
//! |                   | 2. llama.cpp `GET /props`                     | 200 with `default_generation_settings`/`model_path`; 503 "Loading model": not loaded |
//! |                   | 3. Ollama `GET /api/ps`                       | as above |
//!
//! The same answers say whether the model reads images (llama.cpp's
//! `modalities.vision`, LM Studio's `type` `vlm`/`llm`); for Ollama that is
//! `/api/show`'s `capabilities` (`vision`), asked until it answers once per
//! connection.
//!
//! A server that answers none of them in its shape is `unknown`, and the
//! node stops asking that target until the connection is re-established. A
//! provider whose credential the Edge manages is asked without one: its
//! `401`/`403` is not in any shape, so `unknown`.
//!
//! The parsers are pure ([`ollama_ps`], [`lm_studio`], [`llama_cpp_props`]);
//! [`ResidencyReports`] decides what is owed a report (pure);
//! [`ResidencyMonitor::run`] is the I/O loop of one Ready connection. The
//! last measured load per target model ([`LoadMemory`]) outlives
//! connections.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iop_proto::pb;
use pb::ModelResidency;
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::adapter::probe::PROBE_TIMEOUT;
use crate::adapter::{AdapterKind, ProviderTarget, read_capped};

/// Upper bound of a residency answer's body (an `/api/ps` listing of many
/// models is a few KiB; llama.cpp's `/props` carries its chat template).
pub const RESIDENCY_BODY_CAP: usize = 1 << 20;

/// What one residency call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub residency: ModelResidency,
    /// Memory the loaded model takes; 0 when not loaded or unsaid.
    pub size_bytes: u64,
    /// Of which in GPU / unified memory; 0 likewise.
    pub vram_bytes: u64,
    /// The context window the server runs the model with; 0 when unsaid.
    pub context_window: u32,
    /// Whether the model reads images, where the same answer says.
    pub image_input: pb::ImageInput,
}

impl Observation {
    pub const UNKNOWN: Self = Self::bare(ModelResidency::Unknown);

    const fn bare(residency: ModelResidency) -> Self {
        Self { residency, size_bytes: 0, vram_bytes: 0, context_window: 0, image_input: pb::ImageInput::Unknown }
    }

    fn with_window(self, window: Option<&Value>) -> Self {
        let window = window.and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        Self { context_window: window, ..self }
    }
}

// ------------------------------------------------------------ parsers

fn json_object(body: &[u8]) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_slice(body).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// Whether an `/api/ps` name is `target`: equal, or `target:latest` for a
/// target without a tag (a `:` after its last `/`).
fn ollama_name_matches(name: &str, target: &str) -> bool {
    if name == target {
        return true;
    }
    let untagged = !target.rsplit('/').next().unwrap_or(target).contains(':');
    untagged && name.strip_suffix(":latest") == Some(target)
}

/// Ollama `GET /api/ps` (200 body). `None`: not in its shape. `expires_at`
/// is deliberately not read: its changes are not residency changes.
pub fn ollama_ps(body: &[u8], target: &str) -> Option<Observation> {
    let object = json_object(body)?;
    let models = object.get("models")?.as_array()?;
    let found = models.iter().find(|m| {
        ["name", "model"]
            .iter()
            .any(|k| m.get(k).and_then(Value::as_str).is_some_and(|n| ollama_name_matches(n, target)))
    });
    Some(match found {
        None => Observation::bare(ModelResidency::NotLoaded),
        Some(m) => Observation {
            residency: ModelResidency::Loaded,
            size_bytes: m.get("size").and_then(Value::as_u64).unwrap_or(0),
            vram_bytes: m.get("size_vram").and_then(Value::as_u64).unwrap_or(0),
            context_window: 0,
            image_input: pb::ImageInput::Unknown,
        }
        .with_window(m.get("context_length")),
    })
}

/// LM Studio `GET /api/v0/models/{target}`. `None`: not in its shape.
pub fn lm_studio(status: u16, body: &[u8]) -> Option<Observation> {
    if status != 200 {
        return None;
    }
    let model = json_object(body)?;
    let window = model.get("loaded_context_length").or_else(|| model.get("max_context_length"));
    // `vlm` is a vision model; `llm` reads text only.
    let image_input = match model.get("type").and_then(Value::as_str) {
        Some("vlm") => pb::ImageInput::Accepted,
        Some("llm") => pb::ImageInput::Refused,
        _ => pb::ImageInput::Unknown,
    };
    let observation = match model.get("state")?.as_str()? {
        "loaded" => Observation::bare(ModelResidency::Loaded),
        "not-loaded" => Observation::bare(ModelResidency::NotLoaded),
        _ => return None,
    };
    Some(Observation { image_input, ..observation.with_window(window) })
}

/// llama.cpp server `GET /props`. `None`: not in its shape.
pub fn llama_cpp_props(status: u16, body: &[u8]) -> Option<Observation> {
    let object = json_object(body)?;
    match status {
        200 if object.contains_key("default_generation_settings") || object.contains_key("model_path") => {
            let window = object.get("default_generation_settings").and_then(|s| s.get("n_ctx"));
            // `modalities` (a server built with multimodal support):
            // `vision` is true only with a projector (`--mmproj`) loaded.
            let image_input = match object.get("modalities").and_then(|m| m.get("vision")).and_then(Value::as_bool) {
                Some(true) => pb::ImageInput::Accepted,
                Some(false) => pb::ImageInput::Refused,
                None => pb::ImageInput::Unknown,
            };
            let loaded = Observation::bare(ModelResidency::Loaded).with_window(window.or_else(|| object.get("n_ctx")));
            Some(Observation { image_input, ..loaded })
        }
        503 if object.get("error").and_then(|e| e.get("message")).and_then(Value::as_str) == Some("Loading model") => {
            Some(Observation::bare(ModelResidency::NotLoaded))
        }
        _ => None,
    }
}

// ------------------------------------------------------------ I/O

/// Which residency endpoint a target answers (detected once per target on
/// an OpenAI-compatible adapter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Ollama,
    LmStudio,
    LlamaCpp,
    /// None answered in its shape: not asked again on this connection.
    Silent,
}

/// The OpenAI-compatible adapter's detection order.
const DETECTION_ORDER: [Dialect; 3] = [Dialect::LmStudio, Dialect::LlamaCpp, Dialect::Ollama];

/// One bounded GET: status and (capped) body; `None` when no answer came.
async fn get(client: &reqwest::Client, url: String) -> Option<(u16, Vec<u8>)> {
    let call = async {
        let response = client.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        let (body, error) = read_capped(response, RESIDENCY_BODY_CAP).await;
        error.is_none().then_some((status, body))
    };
    tokio::time::timeout(PROBE_TIMEOUT, call).await.ok().flatten()
}

/// Asks `dialect`'s endpoint once. `None`: not in its shape.
async fn ask(client: &reqwest::Client, target: &ProviderTarget, dialect: Dialect) -> Option<Observation> {
    match dialect {
        Dialect::Ollama => {
            let (status, body) = get(client, target.url("/api/ps")).await?;
            (status == 200).then(|| ollama_ps(&body, &target.target_model)).flatten()
        }
        Dialect::LmStudio => {
            let model = percent_encode_segment(&target.target_model);
            let (status, body) = get(client, target.url(&format!("/api/v0/models/{model}"))).await?;
            lm_studio(status, &body)
        }
        Dialect::LlamaCpp => {
            let (status, body) = get(client, target.url("/props")).await?;
            llama_cpp_props(status, &body)
        }
        Dialect::Silent => None,
    }
}

/// A model name as one URL path segment (names carry `/` and `:`).
fn percent_encode_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Observes `target` once. `known` is the dialect detected before (an
/// OpenAI-compatible target's first call detects it); returns the
/// observation and the dialect to remember.
pub async fn observe(
    client: &reqwest::Client,
    target: &ProviderTarget,
    known: Option<Dialect>,
) -> (Observation, Dialect) {
    let dialect = match (target.adapter, known) {
        (AdapterKind::Ollama, _) => Dialect::Ollama,
        (AdapterKind::OpenAi, Some(known)) => known,
        (AdapterKind::OpenAi, None) => {
            for dialect in DETECTION_ORDER {
                if let Some(observation) = ask(client, target, dialect).await {
                    return (observation, dialect);
                }
            }
            return (Observation::UNKNOWN, Dialect::Silent);
        }
    };
    (ask(client, target, dialect).await.unwrap_or(Observation::UNKNOWN), dialect)
}

// ------------------------------------------------------------ loads

/// One measured load: how long the provider took to its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    pub ms: u64,
    pub at_unix_ms: u64,
}

/// The node's last measured load per target model, process-wide (it
/// outlives connections: a reconnect must not forget how long a model
/// takes to load).
#[derive(Debug, Default)]
pub struct LoadMemory(Mutex<HashMap<String, Load>>);

impl LoadMemory {
    /// The process's memory.
    pub fn global() -> &'static Self {
        static GLOBAL: OnceLock<LoadMemory> = OnceLock::new();
        GLOBAL.get_or_init(Self::default)
    }

    pub fn record(&self, target_model: &str, took: Duration) -> Load {
        let at_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let load = Load { ms: took.as_millis() as u64, at_unix_ms };
        self.0.lock().unwrap().insert(target_model.to_owned(), load);
        load
    }

    pub fn last(&self, target_model: &str) -> Load {
        self.0.lock().unwrap().get(target_model).copied().unwrap_or_default()
    }
}

// ------------------------------------------------------------ reports

/// The figures a report carries; a change of any is owed a report.
fn residency_of(id: &str, observation: Observation, load: Load, continues_prefill: bool) -> pb::ProviderResidency {
    // Rounded, so that a report is owed when the pace changed, not with
    // every run's jitter.
    let paces = crate::pace::PaceMemory::global();
    let ceiling = std::time::Duration::from_millis(iop_proto::liveness::DEFAULT_RESPONSE_STALL_TIMEOUT_MS);
    let (prefill, stall) = paces.get(id).figures(ceiling, &paces.profile());
    pb::ProviderResidency {
        prefill_ms_per_1k_tokens: prefill.div_ceil(10) * 10,
        learned_stall_ms: stall.div_ceil(100) * 100,
        provider_id: id.to_owned(),
        residency: observation.residency.into(),
        size_bytes: observation.size_bytes,
        vram_bytes: observation.vram_bytes,
        last_load_ms: load.ms,
        last_loaded_at_unix_ms: load.at_unix_ms,
        continues_prefill,
        context_window: observation.context_window,
        image_input: observation.image_input.into(),
    }
}

/// Whether the server behind `adapter`, detected as `dialect`, continues a
/// prefilled final assistant turn. Ollama does on both its APIs (its chat
/// template ends with the assistant's text), and so does llama.cpp's
/// server (it answers with the prefill and its continuation; the Edge
/// drops the repeat): both verified by the e2e suites, llama.cpp's against
/// the real server. LM Studio and servers none of the dialects describe
/// (vLLM needs `continue_final_message`) are never asked. Pure.
pub fn continues_prefill(adapter: AdapterKind, dialect: Dialect) -> bool {
    match (adapter, dialect) {
        (AdapterKind::Ollama, _) => true,
        (AdapterKind::OpenAi, Dialect::LlamaCpp | Dialect::Ollama) => true,
        (AdapterKind::OpenAi, Dialect::LmStudio | Dialect::Silent) => false,
    }
}

/// What this connection reported per provider. Pure.
#[derive(Debug, Default)]
pub struct ResidencyReports {
    reported: HashMap<String, pb::ProviderResidency>,
}

impl ResidencyReports {
    /// Records `current`; returns it when it differs from what was last
    /// reported for its provider (always, the first time).
    pub fn owed(&mut self, current: pb::ProviderResidency) -> Option<pb::ProviderResidency> {
        if self.reported.get(&current.provider_id) == Some(&current) {
            return None;
        }
        self.reported.insert(current.provider_id.clone(), current.clone());
        Some(current)
    }

    /// The last residency reported for `id`.
    pub fn residency(&self, id: &str) -> Option<ModelResidency> {
        self.reported.get(id).map(|r| r.residency())
    }
}

/// One connection's residency monitor.
pub struct ResidencyMonitor {
    interval: Duration,
    reports: Mutex<ResidencyReports>,
    dialects: Mutex<HashMap<String, Dialect>>,
    /// What Ollama's `/api/show` said of each provider's image input, once
    /// it said (a model's capabilities do not change while it is served;
    /// asked again on the next connection).
    ollama_images: Mutex<HashMap<String, pb::ImageInput>>,
    /// Providers to observe again soon (a run or tunnel on them ended).
    pending: Mutex<BTreeSet<String>>,
    refresh: Notify,
}

impl ResidencyMonitor {
    /// Polls every `interval` (the health probe's idle interval).
    pub fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            interval,
            reports: Mutex::default(),
            dialects: Mutex::default(),
            ollama_images: Mutex::default(),
            pending: Mutex::default(),
            refresh: Notify::new(),
        })
    }

    /// Whether this connection last observed `id`'s model not loaded: a run
    /// that starts now and gets its first byte is a load.
    pub fn cold(&self, id: &str) -> bool {
        self.reports.lock().unwrap().residency(id) == Some(ModelResidency::NotLoaded)
    }

    /// A run or tunnel on `id` ended: observe it again soon.
    pub fn refresh(&self, id: &str) {
        self.pending.lock().unwrap().insert(id.to_owned());
        self.refresh.notify_one();
    }

    /// Ollama's word on `target`'s image input: remembered once known, else
    /// asked (`/api/show`, a metadata call; unknown until it answers, so a
    /// server that starts after its node is asked again next time).
    async fn ollama_image_input(&self, http: &reqwest::Client, target: &ProviderTarget) -> pb::ImageInput {
        if let Some(known) = self.ollama_images.lock().unwrap().get(&target.provider_id) {
            return *known;
        }
        let Some(capabilities) = crate::adapter::ollama_capabilities(http, target).await else {
            return pb::ImageInput::Unknown;
        };
        let said = crate::adapter::ollama_image_input(&capabilities);
        self.ollama_images.lock().unwrap().insert(target.provider_id.clone(), said);
        said
    }

    async fn observe_all<'t>(
        &self,
        http: &reqwest::Client,
        targets: impl Iterator<Item = &'t ProviderTarget>,
    ) -> Vec<pb::ProviderResidency> {
        let calls = targets.map(|target| async move {
            let known = self.dialects.lock().unwrap().get(&target.provider_id).copied();
            let (mut observation, dialect) = observe(http, target, known).await;
            self.dialects.lock().unwrap().insert(target.provider_id.clone(), dialect);
            if dialect == Dialect::Ollama {
                observation.image_input = self.ollama_image_input(http, target).await;
            }
            let load = LoadMemory::global().last(&target.target_model);
            residency_of(&target.provider_id, observation, load, continues_prefill(target.adapter, dialect))
        });
        let current = futures_util::future::join_all(calls).await;
        let mut reports = self.reports.lock().unwrap();
        current.into_iter().filter_map(|r| reports.owed(r)).collect()
    }

    /// Observes every target at once (the first report names them all),
    /// then every `interval` and after every run, sending a report of the
    /// providers whose figures changed. Runs only on a Ready connection.
    pub async fn run(
        self: Arc<Self>,
        http: reqwest::Client,
        targets: Vec<ProviderTarget>,
        out: mpsc::Sender<pb::NodeToEdge>,
        stop: CancellationToken,
    ) {
        let mut next = tokio::time::Instant::now();
        loop {
            let due = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {
                    next = tokio::time::Instant::now() + self.interval;
                    self.pending.lock().unwrap().clear();
                    None
                }
                _ = self.refresh.notified() => Some(std::mem::take(&mut *self.pending.lock().unwrap())),
            };
            let chosen = targets.iter().filter(|t| due.as_ref().is_none_or(|d| d.contains(&t.provider_id)));
            let report = tokio::select! {
                _ = stop.cancelled() => return,
                report = self.observe_all(&http, chosen) => report,
            };
            if report.is_empty() {
                continue;
            }
            let msg = pb::node_to_edge::Msg::ResidencyReport(pb::ProviderResidencyReport { providers: report });
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = out.send(pb::NodeToEdge { msg: Some(msg) }) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
