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
}

impl Observation {
    pub const UNKNOWN: Self = Self::bare(ModelResidency::Unknown);

    const fn bare(residency: ModelResidency) -> Self {
        Self { residency, size_bytes: 0, vram_bytes: 0 }
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
        },
    })
}

/// LM Studio `GET /api/v0/models/{target}`. `None`: not in its shape.
pub fn lm_studio(status: u16, body: &[u8]) -> Option<Observation> {
    if status != 200 {
        return None;
    }
    match json_object(body)?.get("state")?.as_str()? {
        "loaded" => Some(Observation::bare(ModelResidency::Loaded)),
        "not-loaded" => Some(Observation::bare(ModelResidency::NotLoaded)),
        _ => None,
    }
}

/// llama.cpp server `GET /props`. `None`: not in its shape.
pub fn llama_cpp_props(status: u16, body: &[u8]) -> Option<Observation> {
    let object = json_object(body)?;
    match status {
        200 if object.contains_key("default_generation_settings") || object.contains_key("model_path") => {
            Some(Observation::bare(ModelResidency::Loaded))
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
fn residency_of(id: &str, observation: Observation, load: Load) -> pb::ProviderResidency {
    pb::ProviderResidency {
        provider_id: id.to_owned(),
        residency: observation.residency.into(),
        size_bytes: observation.size_bytes,
        vram_bytes: observation.vram_bytes,
        last_load_ms: load.ms,
        last_loaded_at_unix_ms: load.at_unix_ms,
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

    async fn observe_all<'t>(
        &self,
        http: &reqwest::Client,
        targets: impl Iterator<Item = &'t ProviderTarget>,
    ) -> Vec<pb::ProviderResidency> {
        let calls = targets.map(|target| async move {
            let known = self.dialects.lock().unwrap().get(&target.provider_id).copied();
            let (observation, dialect) = observe(http, target, known).await;
            self.dialects.lock().unwrap().insert(target.provider_id.clone(), dialect);
            let load = LoadMemory::global().last(&target.target_model);
            residency_of(&target.provider_id, observation, load)
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
mod tests {
    use super::*;
    use crate::adapter::fake::{self, Reply};
    use crate::adapter::http_client;
    use ModelResidency::{Loaded, NotLoaded, Unknown};

    fn obs(residency: ModelResidency, size_bytes: u64, vram_bytes: u64) -> Observation {
        Observation { residency, size_bytes, vram_bytes }
    }

    // A real `ollama ps` answer (0.5.x).
    const PS: &str = r#"{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest","size":3622320128,
        "digest":"a80c4f17acd5","details":{"parent_model":"","format":"gguf","family":"llama"},
        "expires_at":"2026-12-04T06:40:07.543Z","size_vram":3622320128},
        {"name":"qwen2.5:32b","model":"qwen2.5:32b","size":21500000000,"size_vram":20000000000,
        "expires_at":"2026-12-04T06:45:00Z"}]}"#;

    #[test]
    fn ollama_ps_table() {
        let cases: &[(&str, &str, Option<Observation>)] = &[
            (PS, "llama3.2", Some(obs(Loaded, 3622320128, 3622320128))),
            (PS, "llama3.2:latest", Some(obs(Loaded, 3622320128, 3622320128))),
            (PS, "qwen2.5:32b", Some(obs(Loaded, 21500000000, 20000000000))),
            (PS, "qwen2.5", Some(obs(NotLoaded, 0, 0))),
            (PS, "qwen2.5:7b", Some(obs(NotLoaded, 0, 0))),
            (PS, "llama3.2:1b", Some(obs(NotLoaded, 0, 0))),
            (r#"{"models":[]}"#, "llama3.2", Some(obs(NotLoaded, 0, 0))),
            (r#"{"models":[{"model":"m:latest"}]}"#, "m", Some(obs(Loaded, 0, 0))),
            (r#"{"object":"list","data":[]}"#, "m", None),
            (r#"{"models":"no"}"#, "m", None),
            ("[]", "m", None),
            ("not json", "m", None),
        ];
        for (body, target, want) in cases {
            assert_eq!(ollama_ps(body.as_bytes(), target), *want, "{target} in {body}");
        }
    }

    #[test]
    fn expires_at_alone_changes_nothing() {
        let later = PS.replace("2026-12-04T06:40:07.543Z", "2026-12-04T06:50:00Z");
        assert_eq!(ollama_ps(PS.as_bytes(), "llama3.2"), ollama_ps(later.as_bytes(), "llama3.2"));
    }

    #[test]
    fn lm_studio_and_llama_cpp_tables() {
        // LM Studio 0.3 `/api/v0/models/{id}`.
        let lms_loaded = r#"{"id":"qwen2-vl-7b-instruct","object":"model","type":"vlm","publisher":"mlx-community",
            "arch":"qwen2_vl","compatibility_type":"mlx","quantization":"4bit","state":"loaded","max_context_length":32768}"#;
        let lms_cold = lms_loaded.replace(r#""state":"loaded""#, r#""state":"not-loaded""#);
        let cases: &[(u16, &str, Option<Observation>)] = &[
            (200, lms_loaded, Some(obs(Loaded, 0, 0))),
            (200, &lms_cold, Some(obs(NotLoaded, 0, 0))),
            (200, r#"{"state":"loading"}"#, None),
            (404, r#"{"error":"Model not found"}"#, None),
            (200, r#"{"default_generation_settings":{}}"#, None),
        ];
        for (status, body, want) in cases {
            assert_eq!(lm_studio(*status, body.as_bytes()), *want, "{status} {body}");
        }
        // llama.cpp server `/props`.
        let cases: &[(u16, &str, Option<Observation>)] = &[
            (
                200,
                r#"{"default_generation_settings":{"n_ctx":4096,"params":{}},"total_slots":1,
                "model_path":"/models/qwen.gguf","chat_template":"{{ x }}","build_info":"b4600"}"#,
                Some(obs(Loaded, 0, 0)),
            ),
            (200, r#"{"model_path":"m.gguf"}"#, Some(obs(Loaded, 0, 0))),
            (
                503,
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
                Some(obs(NotLoaded, 0, 0)),
            ),
            (503, r#"{"error":{"code":503,"message":"Service Unavailable"}}"#, None),
            (200, r#"{"state":"loaded"}"#, None),
            (404, r#"{"error":"not found"}"#, None),
            (401, r#"{"error":{"message":"Invalid API Key"}}"#, None),
        ];
        for (status, body, want) in cases {
            assert_eq!(llama_cpp_props(*status, body.as_bytes()), *want, "{status} {body}");
        }
    }

    #[test]
    fn reports_are_owed_once_per_change() {
        let mut reports = ResidencyReports::default();
        let cold = residency_of("p1", obs(NotLoaded, 0, 0), Load::default());
        assert!(reports.owed(cold.clone()).is_some(), "the first is always owed");
        assert!(reports.owed(cold.clone()).is_none());
        assert_eq!(reports.residency("p1"), Some(NotLoaded));
        let warm = residency_of("p1", obs(Loaded, 10, 8), Load::default());
        assert!(reports.owed(warm.clone()).is_some());
        let loaded_after = residency_of("p1", obs(Loaded, 10, 8), Load { ms: 1500, at_unix_ms: 7 });
        assert!(reports.owed(loaded_after).is_some(), "a new load is owed");
        assert!(reports.owed(residency_of("p2", obs(Unknown, 0, 0), Load::default())).is_some());
    }

    #[tokio::test]
    async fn ollama_adapter_asks_api_ps_only() {
        let client = http_client();
        let mut server =
            fake::serve(Reply::json(200, r#"{"models":[{"name":"test-model","size":5,"size_vram":4}]}"#)).await;
        let target = fake::target(AdapterKind::Ollama, &server.base_url);
        assert_eq!(observe(&client, &target, None).await, (obs(Loaded, 5, 4), Dialect::Ollama));
        let req = server.request().await;
        assert_eq!((req.method.as_str(), req.path.as_str()), ("GET", "/api/ps"));
        assert!(server.received().is_none(), "one call");

        // A managed-credential provider asked without a key: unknown.
        let keyed = fake::serve(Reply::json(401, r#"{"error":"unauthorized"}"#)).await;
        let mut target = fake::target(AdapterKind::Ollama, &keyed.base_url);
        target.credential_profile = Some("key".into());
        assert_eq!(observe(&client, &target, None).await.0, Observation::UNKNOWN);
    }

    #[tokio::test]
    async fn openai_adapter_detects_in_order_and_remembers() {
        let client = http_client();
        // Nothing answers in shape: three calls in order, then silence.
        let mut server = fake::serve(Reply::json(404, r#"{"error":"not found"}"#)).await;
        let target = fake::target(AdapterKind::OpenAi, &server.base_url);
        assert_eq!(observe(&client, &target, None).await, (Observation::UNKNOWN, Dialect::Silent));
        let paths: Vec<_> = [server.request().await, server.request().await, server.request().await]
            .into_iter()
            .map(|r| (r.method, r.path))
            .collect();
        assert_eq!(
            paths,
            [
                ("GET".into(), "/api/v0/models/test-model".into()),
                ("GET".into(), "/props".into()),
                ("GET".into(), "/api/ps".into())
            ]
        );
        assert_eq!(observe(&client, &target, Some(Dialect::Silent)).await.0, Observation::UNKNOWN);
        assert!(server.received().is_none(), "a silent target is not asked again");

        // llama.cpp: LM Studio's path 404s first, then /props answers.
        let app = axum::Router::new()
            .route("/props", axum::routing::get(|| async { axum::Json(serde_json::json!({"model_path": "m.gguf"})) }));
        let base = fake::serve_router(app).await;
        let target = fake::target(AdapterKind::OpenAi, &base);
        assert_eq!(observe(&client, &target, None).await, (obs(Loaded, 0, 0), Dialect::LlamaCpp));

        // A refused server: unknown and silent.
        let refused = fake::refused_base_url().await;
        let target = fake::target(AdapterKind::OpenAi, &refused);
        assert_eq!(observe(&client, &target, None).await, (Observation::UNKNOWN, Dialect::Silent));
    }

    #[test]
    fn a_model_name_is_one_path_segment() {
        assert_eq!(percent_encode_segment("lmstudio-community/qwen:7b"), "lmstudio-community%2Fqwen%3A7b");
    }

    #[tokio::test]
    async fn monitor_reports_all_once_then_only_changes() {
        let state = Arc::new(Mutex::new(r#"{"models":[]}"#.to_string()));
        let shared = state.clone();
        let app = axum::Router::new().route(
            "/api/ps",
            axum::routing::get(move || {
                let body = shared.lock().unwrap().clone();
                async move { ([("content-type", "application/json")], body) }
            }),
        );
        let base = fake::serve_router(app).await;
        let target = fake::target(AdapterKind::Ollama, &base);
        let monitor = ResidencyMonitor::new(Duration::from_secs(3600));
        let (out, mut rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        tokio::spawn(monitor.clone().run(http_client(), vec![target], out, stop.clone()));
        let first = match rx.recv().await.unwrap().msg {
            Some(pb::node_to_edge::Msg::ResidencyReport(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(first.providers.len(), 1);
        assert_eq!(first.providers[0].residency(), NotLoaded);
        assert!(monitor.cold("p1"));

        // Unchanged figures are owed nothing: the next report is the change.
        monitor.refresh("p1");
        *state.lock().unwrap() = r#"{"models":[{"name":"test-model","size":9,"size_vram":9}]}"#.into();
        monitor.refresh("p1");
        let next = match rx.recv().await.unwrap().msg {
            Some(pb::node_to_edge::Msg::ResidencyReport(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!((next.providers[0].residency(), next.providers[0].size_bytes), (Loaded, 9));
        assert!(!monitor.cold("p1"));
        stop.cancel();
    }
}
