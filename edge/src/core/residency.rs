//! Model residency as the Edge believes it, and what selection and the
//! first-byte deadline make of it (pure; the rules are described in
//! [`crate::residency`]).

use std::collections::HashMap;

use iop_proto::admin;
use iop_proto::config::EdgeConfig;
use iop_proto::liveness::{DEFAULT_FIRST_BYTE_TIMEOUT_MS, MAX_RESPONSE_STALL_TIMEOUT_MS};
use iop_proto::pb;
use iop_proto::wire::closed_enum;

/// The longest load the Edge believes, and the longest first-byte deadline
/// it sends (the node's own range for `first_byte_timeout_ms`).
pub const MAX_LOAD_MS: u64 = MAX_RESPONSE_STALL_TIMEOUT_MS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Loaded,
    NotLoaded,
    /// No report, the node is not Ready, or the server cannot say.
    Unknown,
}

impl Residency {
    /// Every state, in the order of the `iop_edge_provider_residency` state set.
    pub const ALL: [Self; 3] = [Self::Loaded, Self::NotLoaded, Self::Unknown];

    pub fn label(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::NotLoaded => "not_loaded",
            Self::Unknown => "unknown",
        }
    }
}

/// As `/admin/v1/providers` shows it.
impl From<Residency> for admin::Residency {
    fn from(residency: Residency) -> Self {
        match residency {
            Residency::Loaded => Self::Loaded,
            Residency::NotLoaded => Self::NotLoaded,
            Residency::Unknown => Self::Unknown,
        }
    }
}

/// One provider's residency and figures as the Edge believes them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    pub residency: Residency,
    pub size_bytes: u64,
    pub vram_bytes: u64,
    /// The node's last measured load of the provider's model; 0: none.
    pub last_load_ms: u64,
    pub last_loaded_at_unix_ms: u64,
    /// The node detected a server that continues a prefilled answer.
    pub continues_prefill: bool,
    /// The context window the server said (tokens); 0: unknown.
    pub context_window: u32,
    /// The node's learned pace: p95 ms to read 1,000 prompt tokens, and
    /// its inter-token deadline in ms; 0: not learned.
    pub prefill_ms_per_1k_tokens: u64,
    pub learned_stall_ms: u64,
    /// Whether the model reads images, as the server said; `None`: unknown.
    pub images: Option<bool>,
}

impl Figures {
    pub const UNKNOWN: Self = Self {
        residency: Residency::Unknown,
        size_bytes: 0,
        vram_bytes: 0,
        last_load_ms: 0,
        last_loaded_at_unix_ms: 0,
        continues_prefill: false,
        context_window: 0,
        prefill_ms_per_1k_tokens: 0,
        learned_stall_ms: 0,
        images: None,
    };

    /// Its model would have to be loaded first (selection's "cold").
    pub fn cold(&self) -> bool {
        self.residency == Residency::NotLoaded
    }
}

/// Validates a report from `node` (pure): only that node's providers, named
/// once, with a known residency (the module rules).
pub fn check_report(config: &EdgeConfig, node: &str, entries: &[pb::ProviderResidency]) -> Vec<(String, Figures)> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for entry in entries {
        *counts.entry(entry.provider_id.as_str()).or_default() += 1;
    }
    entries
        .iter()
        .filter(|e| counts[e.provider_id.as_str()] == 1)
        .filter(|e| config.providers.iter().any(|p| p.id == e.provider_id && p.node == node))
        .filter_map(|e| {
            let residency = match closed_enum::<pb::ModelResidency>("provider_residency.residency", e.residency).ok()? {
                pb::ModelResidency::Loaded => Residency::Loaded,
                pb::ModelResidency::NotLoaded => Residency::NotLoaded,
                pb::ModelResidency::Unknown => Residency::Unknown,
                pb::ModelResidency::Unspecified => return None,
            };
            let believable = e.last_load_ms <= MAX_LOAD_MS;
            let figures = Figures {
                residency,
                size_bytes: e.size_bytes,
                vram_bytes: e.vram_bytes,
                last_load_ms: if believable { e.last_load_ms } else { 0 },
                last_loaded_at_unix_ms: if believable { e.last_loaded_at_unix_ms } else { 0 },
                continues_prefill: e.continues_prefill,
                context_window: e.context_window,
                prefill_ms_per_1k_tokens: e.prefill_ms_per_1k_tokens,
                learned_stall_ms: e.learned_stall_ms,
                images: match pb::ImageInput::try_from(e.image_input) {
                    Ok(pb::ImageInput::Accepted) => Some(true),
                    Ok(pb::ImageInput::Refused) => Some(false),
                    Ok(pb::ImageInput::Unknown) | Err(_) => None,
                },
            };
            Some((e.provider_id.clone(), figures))
        })
        .collect()
}

/// The first-byte deadline sent with a request to `residency`'s provider
/// (pure; the one definition, used for `RunRequest`,
/// `ProviderTunnelRequest` and the Edge's own tunnel first-frame bound):
/// `configured` (0: the default, 60 s) plus the last measured load when the
/// model is `not_loaded` and a load was measured, at most [`MAX_LOAD_MS`].
/// Otherwise `configured` as it is (0 stays 0, the node's default).
pub fn first_byte_timeout_ms(configured: u64, residency: &Figures) -> u64 {
    if !residency.cold() || residency.last_load_ms == 0 {
        return configured;
    }
    let base = iop_proto::liveness::first_byte_timeout(configured)
        .map_or(DEFAULT_FIRST_BYTE_TIMEOUT_MS, |timeout| timeout.as_millis() as u64);
    base.saturating_add(residency.last_load_ms).min(MAX_LOAD_MS)
}
