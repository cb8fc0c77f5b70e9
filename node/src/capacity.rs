//! Provider capacity across all of the node's Edge sessions. Each Edge
//! replica admits runs against its own count, so with several replicas only
//! the node sees every run a provider has: it lets at most the provider's
//! `capacity` run at once and refuses the rest with `CAPACITY_EXHAUSTED`
//! before anything reaches the provider (the Edge then retries or waits, as
//! for any failure before the first byte, and health is untouched).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iop_proto::pb;

/// Runs and tunnels in progress per provider id, and each provider's
/// capacity, shared by every session.
#[derive(Debug, Clone, Default)]
pub struct LocalAdmission {
    state: Arc<Mutex<Slots>>,
}

#[derive(Debug, Default)]
struct Slots {
    running: HashMap<String, u32>,
    /// From the latest registration or `ProviderCapacities` of any session
    /// (replicas render one config; during a config rollout the newest
    /// word wins). Absent or 0: no node-side limit.
    capacity: HashMap<String, u32>,
}

impl LocalAdmission {
    /// Records the capacity of each provider named.
    pub fn set_capacities(&self, capacities: impl IntoIterator<Item = (String, u32)>) {
        self.state.lock().unwrap().capacity.extend(capacities);
    }

    /// A slot of `provider`, held until the permit drops.
    pub fn admit(&self, provider: &str) -> Result<CapacityPermit, pb::ExecutionFailure> {
        let mut state = self.state.lock().unwrap();
        let capacity = state.capacity.get(provider).copied().unwrap_or(0);
        let count = state.running.entry(provider.to_owned()).or_default();
        if capacity != 0 && *count >= capacity {
            return Err(pb::ExecutionFailure::new(
                pb::FailureKind::CapacityExhausted,
                format!("provider `{provider}` is running its capacity ({capacity}) across the node's Edge sessions"),
            ));
        }
        *count += 1;
        Ok(CapacityPermit { admission: self.clone(), provider: provider.to_owned() })
    }

    /// Runs and tunnels `provider` has now.
    pub fn running(&self, provider: &str) -> u32 {
        self.state.lock().unwrap().running.get(provider).copied().unwrap_or(0)
    }
}

/// One admitted run's slot; dropping it frees the slot.
#[derive(Debug)]
pub struct CapacityPermit {
    admission: LocalAdmission,
    provider: String,
}

impl Drop for CapacityPermit {
    fn drop(&mut self) {
        let mut state = self.admission.state.lock().unwrap();
        if let Some(count) = state.running.get_mut(&self.provider) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.running.remove(&self.provider);
            }
        }
    }
}

#[cfg(test)]
mod tests;
