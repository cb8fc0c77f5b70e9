//! Provider capacity across all of the node's Edge sessions. Each Edge
//! replica admits runs against its own count, so with several replicas only
//! the node sees every run a provider has: it lets at most the provider's
//! `capacity` run at once and refuses the rest with `CAPACITY_EXHAUSTED`
//! before anything reaches the provider (the Edge then retries or waits, as
//! for any failure before the first byte, and health is untouched).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iop_proto::pb;

/// Runs and tunnels in progress per provider id, shared by every session.
#[derive(Debug, Clone, Default)]
pub struct LocalAdmission {
    running: Arc<Mutex<HashMap<String, u32>>>,
}

impl LocalAdmission {
    /// A slot of `provider`, whose capacity is `capacity` (0: no limit here),
    /// held until the permit drops.
    pub fn admit(&self, provider: &str, capacity: u32) -> Result<CapacityPermit, pb::ExecutionFailure> {
        let mut running = self.running.lock().unwrap();
        let count = running.entry(provider.to_owned()).or_default();
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
        self.running.lock().unwrap().get(provider).copied().unwrap_or(0)
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
        let mut running = self.admission.running.lock().unwrap();
        if let Some(count) = running.get_mut(&self.provider) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.provider);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_capacity_across_holders_and_frees_on_drop() {
        let admission = LocalAdmission::default();
        let other_session = admission.clone();
        let first = admission.admit("p", 2).unwrap();
        let second = other_session.admit("p", 2).unwrap();
        let refused = admission.admit("p", 2).unwrap_err();
        assert_eq!(refused.kind(), pb::FailureKind::CapacityExhausted);
        assert!(refused.message.contains("`p`") && refused.message.contains("(2)"), "{}", refused.message);
        assert_eq!(admission.running("p"), 2);
        let _other_provider = admission.admit("q", 1).expect("capacity is per provider");
        drop(first);
        let third = admission.admit("p", 2).expect("a freed slot is taken again");
        drop((second, third));
        assert_eq!(admission.running("p"), 0);
        let _unlimited: Vec<_> = (0..100).map(|_| admission.admit("u", 0).unwrap()).collect();
        assert_eq!(admission.running("u"), 100, "capacity 0 sets no node-side limit");
    }
}
