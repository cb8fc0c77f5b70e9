//! Route: public model name -> ordered candidate providers. Pure; which
//! candidate runs the request is admission's choice
//! ([`crate::core::selection::choose`]), and where a failed attempt goes
//! next is the gate's ([`crate::retry`]).

use std::sync::Arc;

use iop_proto::config::{EdgeConfig, ProviderEntry};

use crate::core::selection::Candidate;

/// Providers serving `model` with their priority for it, lowest priority
/// value first (config order breaks ties). `None` when no provider serves
/// the model at all. The one ordering: [`candidates`] and
/// [`admission_candidates`] are views of it.
fn ranked<'a>(config: &'a EdgeConfig, model: &str) -> Option<Vec<(u32, &'a ProviderEntry)>> {
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
    Some(found.into_iter().map(|(priority, _, p)| (priority, p)).collect())
}

/// Providers serving `model`, best first; `None` when none does.
pub fn candidates<'a>(config: &'a EdgeConfig, model: &str) -> Option<Vec<&'a ProviderEntry>> {
    Some(ranked(config, model)?.into_iter().map(|(_, p)| p).collect())
}

/// The same providers as admission takes them: each with its priority for
/// `model`.
pub fn admission_candidates(config: &EdgeConfig, model: &str) -> Option<Arc<[Candidate]>> {
    let ranked = ranked(config, model)?;
    Some(ranked.into_iter().map(|(priority, p)| Candidate { priority, provider: p.clone() }).collect())
}

/// The candidates of one route whose context window fits a prompt of about
/// `prompt` tokens: a candidate whose window (`window`: declared, or as its
/// server said) is known and smaller is left out, unless that would leave
/// none (every provider then answers the prompt as it would, its own
/// context error included, which a declared `context_fallbacks` route
/// takes). Returns the kept candidates and whether any was left out. Pure.
pub fn fit_context(
    candidates: &Arc<[Candidate]>,
    prompt: u64,
    window: impl Fn(&Candidate) -> Option<u32>,
) -> (Arc<[Candidate]>, bool) {
    let fits = |c: &&Candidate| window(c).is_none_or(|w| prompt <= u64::from(w));
    let kept: Arc<[Candidate]> = candidates.iter().filter(fits).cloned().collect();
    if kept.is_empty() || kept.len() == candidates.len() {
        return (candidates.clone(), false);
    }
    (kept, true)
}

/// The candidates of one route that can read a request's inputs: with
/// `images`, a candidate known not to read images (`accepts_images`:
/// declared, or as its server said) is left out; one not known either way
/// stays (its own answer then decides). `None` when none is left: no
/// provider of the route can ever serve the request. Pure.
pub fn fit_inputs(
    candidates: Arc<[Candidate]>,
    images: bool,
    accepts_images: impl Fn(&Candidate) -> Option<bool>,
) -> Option<Arc<[Candidate]>> {
    if !images {
        return Some(candidates);
    }
    let kept: Arc<[Candidate]> = candidates.iter().filter(|c| accepts_images(c) != Some(false)).cloned().collect();
    (!kept.is_empty()).then_some(kept)
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
