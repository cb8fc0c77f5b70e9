//! Route: public model name -> ordered candidate providers. Pure; which
//! candidate runs the request is admission's choice
//! ([`crate::core::selection::choose`]), and where a failed attempt goes
//! next is the gate's ([`crate::retry`]).

use iop_proto::config::{EdgeConfig, ProviderEntry};

/// Providers serving `model`, lowest priority value first (config order breaks
/// ties). `None` when no provider serves the model at all.
pub fn candidates<'a>(config: &'a EdgeConfig, model: &str) -> Option<Vec<&'a ProviderEntry>> {
    let mut found: Vec<(u32, usize, &ProviderEntry)> = config
        .providers
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.models.iter().find(|m| m.name == model).map(|m| (m.priority, i, p)))
        .collect();
    if found.is_empty() {
        return None;
    }
    found.sort_by_key(|(priority, index, _)| (*priority, *index));
    Some(found.into_iter().map(|(_, _, p)| p).collect())
}

/// Every public model name, sorted and deduplicated.
pub fn public_models(config: &EdgeConfig) -> Vec<&str> {
    let mut names: Vec<&str> = config.providers.iter().flat_map(|p| p.models.iter().map(|m| m.name.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests;
