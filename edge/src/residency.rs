//! Model residency: whether each provider's model is in its server's memory
//! now, as the provider's node reports it (`ProviderResidencyReport` on the
//! control stream), and what the Edge does with it: selection charges a
//! provider whose model is `not_loaded` `scheduling.load_penalty` requests
//! ([`crate::core::selection::choose`]), and its first-byte deadline is extended by
//! the node's last measured load ([`first_byte_timeout_ms`](crate::core::residency::first_byte_timeout_ms)).
//!
//! Rules:
//! - a report counts only from the node's *current* connection, and an entry
//!   is read only while that connection is Ready: the same generation rule as
//!   the health overlay ([`crate::overlay`]), so a provider reads `unknown` as
//!   soon as its node's session ends, with nothing to clear;
//! - a node reports only its own providers: an entry naming another node's
//!   provider, an unknown one, one named twice in a report, or with an
//!   unspecified or unknown residency is dropped (it changes nothing);
//! - a `last_load_ms` over [`MAX_LOAD_MS`](crate::core::residency::MAX_LOAD_MS) (an hour, the longest first-byte
//!   deadline there is) is not a load anyone measured: the figure is ignored
//!   (read as no load measured), the rest of the entry is kept.
//!
//! Advisory only: residency never changes health or dispatchability.

use std::collections::HashMap;
use std::sync::Mutex;

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::pb;

use crate::core::residency::{Figures, Residency, check_report};
use crate::node::registry::NodeRegistry;

#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: u64,
    figures: Figures,
}

/// Provider id -> its last accepted residency, with the connection
/// generation it arrived on.
#[derive(Debug, Default)]
pub struct ResidencyTable {
    entries: Mutex<HashMap<String, Entry>>,
}

impl ResidencyTable {
    /// Applies a report from `node` received on `generation`; nothing when
    /// that connection is no longer the node's current one. Returns how
    /// many providers it set.
    pub fn apply(
        &self,
        config: &EdgeConfig,
        registry: &NodeRegistry,
        node: &str,
        generation: u64,
        entries: &[pb::ProviderResidency],
    ) -> usize {
        if registry.current_generation(node) != Some(generation) {
            return 0;
        }
        let checked = check_report(config, node, entries);
        let mut table = self.entries.lock().unwrap();
        for (provider, figures) in &checked {
            table.insert(provider.clone(), Entry { generation, figures: *figures });
        }
        checked.len()
    }

    /// `provider`'s residency now: its entry while its node's connection
    /// that sent it is Ready, else unknown.
    pub fn of(&self, registry: &NodeRegistry, provider: &ProviderEntry) -> Figures {
        match registry.ready_generation(&provider.node) {
            Some(generation) => self.on(&provider.id, generation),
            None => Figures::UNKNOWN,
        }
    }

    /// `provider`'s residency as reported on connection `generation` (a
    /// lease's), else unknown.
    pub fn on(&self, provider: &str, generation: u64) -> Figures {
        let table = self.entries.lock().unwrap();
        table.get(provider).filter(|e| e.generation == generation).map_or(Figures::UNKNOWN, |e| e.figures)
    }

    /// Whether a broken stream may be continued on `provider` now: as its
    /// config says, else as its node detected its server (read like its
    /// residency: from its Ready connection; unknown is no).
    pub fn continues(&self, registry: &NodeRegistry, provider: &ProviderEntry) -> bool {
        provider.continuation.unwrap_or_else(|| self.of(registry, provider).continues_prefill)
    }

    /// `provider`'s context window in tokens: as its config declares, else
    /// as its server said to its node; `None` when unknown.
    pub fn context_window(&self, registry: &NodeRegistry, provider: &ProviderEntry) -> Option<u32> {
        provider.context_window.or_else(|| Some(self.of(registry, provider).context_window).filter(|w| *w > 0))
    }

    /// Whether `provider`'s model reads images: as its config declares, else
    /// as its server said to its node; `None` when unknown.
    pub fn accepts_images(&self, registry: &NodeRegistry, provider: &ProviderEntry) -> Option<bool> {
        provider.accepts_images.or_else(|| self.of(registry, provider).images)
    }

    /// Forgets providers `keep` rejects (a reload removed them).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.entries.lock().unwrap().retain(|id, _| keep(id));
    }
}

/// Publishes every provider of `providers` (the config's) with its
/// residency now as `iop_edge_provider_residency` (what
/// `/admin/v1/providers` reports). At scrape time, like
/// [`crate::overlay::publish_health`], for the same reasons: the state
/// depends on the registry as much as on reports, and the series of a
/// provider a reload removed go at the next scrape.
pub fn publish(
    metrics: &crate::metrics::EdgeMetrics,
    registry: &NodeRegistry,
    table: &ResidencyTable,
    providers: &[ProviderEntry],
) {
    let figures: Vec<(&str, Figures)> = providers.iter().map(|p| (p.id.as_str(), table.of(registry, p))).collect();
    let states: Vec<(&str, Residency)> = figures.iter().map(|(id, f)| (*id, f.residency)).collect();
    metrics.set_provider_residency(&states);
    let paces: Vec<(&str, u64, u64)> =
        figures.iter().map(|(id, f)| (*id, f.prefill_ms_per_1k_tokens, f.learned_stall_ms)).collect();
    metrics.set_provider_pace(&paces);
}

#[cfg(test)]
mod tests;
