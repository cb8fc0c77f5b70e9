//! Model residency (see *Residency* in the [`super`] docs): whether the
//! mock's model is in memory, the residency endpoints of Ollama
//! (`GET /api/ps`), llama.cpp's server (`GET /props`) and LM Studio
//! (`GET /api/v0/models`, `GET /api/v0/models/{model}`) in each server's
//! shape, and the load that a request for a model that is not resident
//! waits for before its headers.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) mod endpoints;

/// The only model the mock lists.
pub const MODEL_NAME: &str = "mock";
/// What `/api/ps` says the resident model takes (`size`; all of it in
/// unified memory: `size_vram` is the same, as on a Mac).
pub const MODEL_SIZE_BYTES: u64 = 2_019_393_189;
/// `max_context_length` (LM Studio) and `n_ctx` (llama.cpp).
pub const MODEL_CONTEXT_LENGTH: u64 = 8192;

/// Which residency endpoints answer (`--residency-api`); the others answer
/// 404 like a server that has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ResidencyApi {
    /// Every one of them.
    #[default]
    All,
    /// `GET /api/ps`.
    Ollama,
    /// `GET /props`.
    #[value(name = "llama_cpp")]
    LlamaCpp,
    /// `GET /api/v0/models` and `GET /api/v0/models/{model}`.
    #[value(name = "lm_studio")]
    LmStudio,
    /// None (an OpenAI-compatible server that cannot tell).
    None,
}

impl ResidencyApi {
    fn answers(self, endpoint: ResidencyApi) -> bool {
        self == ResidencyApi::All || self == endpoint
    }
}

/// Process state of residency (not per-request knobs). Also clap flags
/// (`--loaded false --load-delay-ms 2000 --residency-api ollama`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ResidencyConfig {
    /// Whether the model is resident (in memory) at start.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub loaded: bool,
    /// How long a load takes: a chat, responses or embeddings request while
    /// the model is not resident waits this long before its headers (every
    /// request arriving during the load waits for the same load), then the
    /// model is resident.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub load_delay_ms: u64,
    /// Which residency endpoints answer; the others answer 404.
    #[arg(long, value_enum, value_name = "API", default_value_t = ResidencyApi::All)]
    pub residency_api: ResidencyApi,
}

impl Default for ResidencyConfig {
    fn default() -> Self {
        Self { loaded: true, load_delay_ms: 0, residency_api: ResidencyApi::All }
    }
}

#[derive(Debug, Default)]
struct Current {
    loaded: bool,
    /// A load is under way (its task sets `loaded` when it ends).
    loading: bool,
    load_delay_ms: u64,
    api: ResidencyApi,
}

/// Shared residency state (in the server's counters).
#[derive(Debug, Default)]
pub(super) struct Residency {
    state: Mutex<Current>,
    /// Wakes the requests waiting for a load.
    changed: tokio::sync::Notify,
    /// Loads performed ([`super::MockStats::loads`]).
    pub(super) loads: AtomicU64,
    /// Base names of every model a request named (`mock` from the start).
    models: Mutex<BTreeSet<String>>,
}

impl Residency {
    /// Takes the configured start state.
    pub(super) fn configure(&self, config: &ResidencyConfig) {
        let mut state = self.state.lock().unwrap();
        state.loaded = config.loaded;
        state.load_delay_ms = config.load_delay_ms;
        state.api = config.residency_api;
        self.models.lock().unwrap().insert(MODEL_NAME.to_owned());
    }

    /// Remembers a model a request named (by its base name).
    pub(super) fn learn(&self, model: &str) {
        let name = base_model(model);
        if !name.is_empty() {
            self.models.lock().unwrap().insert(name.to_owned());
        }
    }

    fn loaded(&self) -> bool {
        self.state.lock().unwrap().loaded
    }

    fn api(&self) -> ResidencyApi {
        self.state.lock().unwrap().api
    }

    fn models(&self) -> Vec<String> {
        self.models.lock().unwrap().iter().cloned().collect()
    }

    /// `POST /mock/residency`: evict or make resident (no load counted),
    /// and optionally change the load delay of later loads.
    fn set(&self, loaded: bool, load_delay_ms: Option<u64>) {
        let mut state = self.state.lock().unwrap();
        state.loaded = loaded;
        if let Some(ms) = load_delay_ms {
            state.load_delay_ms = ms;
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// The end of a load: resident (counted once, unless something made it
    /// resident meanwhile).
    fn finish_load(&self) {
        let mut state = self.state.lock().unwrap();
        state.loading = false;
        if !state.loaded {
            state.loaded = true;
            self.loads.fetch_add(1, Ordering::Relaxed);
        }
        drop(state);
        self.changed.notify_waiters();
    }
}

/// A model name without the mock's `@knobs` suffix (`mock@words=3` -> `mock`).
#[must_use]
pub fn base_model(model: &str) -> &str {
    model.split_once('@').map_or(model, |(base, _)| base)
}

#[cfg(test)]
mod tests;
