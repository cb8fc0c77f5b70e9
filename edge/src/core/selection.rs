//! Selection: the pure choice of a provider among a route's candidates
//! (the rule is described in [`crate::admission`]).

use iop_proto::config::ProviderEntry;

/// One candidate as the pure selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CandidateView {
    pub priority: u32,
    /// Its node's current connection is Ready and the provider is available.
    pub eligible: bool,
    /// Already tried by this request.
    pub avoided: bool,
    /// An avoided candidate may still be chosen when nothing else is
    /// eligible (false only after stall evidence did not clear it).
    pub fallback_allowed: bool,
    pub in_flight: u32,
    pub capacity: u32,
    /// Its node reports its model `not_loaded`: a run would load it first.
    pub cold: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Admit(usize),
    /// Eligible providers exist but all are at capacity: queue.
    AllBusy,
    NoneEligible,
}

/// Picks a candidate (the module's rule). `load_penalty` is what a cold
/// candidate is charged, in runs in flight. `rotate(priority, n)` returns
/// the round-robin position among `n` tied candidates of that priority group.
pub fn choose(candidates: &[CandidateView], load_penalty: u32, mut rotate: impl FnMut(u32, usize) -> usize) -> Choice {
    // First pass: untried candidates only. Second pass, when none is
    // eligible: tried ones too, where fallback to them is allowed.
    let usable = |strict: bool| {
        candidates
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.eligible && (!c.avoided || (!strict && c.fallback_allowed)))
    };
    let avoid = usable(true).next().is_some();
    let mut priorities: Vec<u32> = usable(avoid).map(|(_, c)| c.priority).collect();
    if priorities.is_empty() {
        return Choice::NoneEligible;
    }
    priorities.sort_unstable();
    priorities.dedup();
    for priority in priorities {
        // Ordered by (cost, cold, in flight): lowest wins, the rest is a tie.
        let free: Vec<(usize, (u64, bool, u32))> = usable(avoid)
            .filter(|(_, c)| c.priority == priority && c.in_flight < c.capacity)
            .map(|(i, c)| {
                let cold = c.cold && load_penalty > 0;
                let cost = u64::from(c.in_flight) + if cold { u64::from(load_penalty) } else { 0 };
                (i, (cost, cold, c.in_flight))
            })
            .collect();
        let Some(least) = free.iter().map(|(_, key)| *key).min() else { continue };
        let tied: Vec<usize> = free.iter().filter(|(_, key)| *key == least).map(|(i, _)| *i).collect();
        return Choice::Admit(tied[rotate(priority, tied.len()) % tied.len()]);
    }
    Choice::AllBusy
}

/// A provider serving a route, with its priority for that route.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub priority: u32,
    pub provider: ProviderEntry,
}
