//! How many jobs run at once: per workspace (`limits.max_concurrent_jobs`
//! of its template, default 1: two jobs writing one tree race) and per
//! principal (its keys-file `max_concurrent_jobs`, else
//! `limits.max_jobs_per_principal`; anonymous callers are one principal).
//!
//! A job takes one slot of each at admission, before any node call, or is
//! refused with `429 too_many_jobs`; the [`JobSlot`] it holds gives both back
//! when it drops, however the job ends (answer, failure, cancel, a panic of
//! its task). Counts are per Edge replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Which limit refused a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobLimit {
    Workspace,
    Principal,
}

#[derive(Debug, Default)]
struct Counts {
    workspaces: HashMap<String, u32>,
    principals: HashMap<String, u32>,
}

/// The jobs running now, by workspace ref and by principal name.
#[derive(Debug, Default)]
pub struct JobSlots {
    counts: Mutex<Counts>,
}

/// One running job's share of both limits; dropping it releases them, once.
#[derive(Debug)]
pub struct JobSlot {
    slots: Arc<JobSlots>,
    workspace: String,
    principal: String,
}

impl JobSlots {
    /// Takes a slot of `workspace` (at most `workspace_limit` at once) and
    /// of `principal` (at most `principal_limit`), both or neither.
    pub fn acquire(
        self: &Arc<Self>,
        workspace: &str,
        workspace_limit: u32,
        principal: &str,
        principal_limit: u32,
    ) -> Result<JobSlot, JobLimit> {
        let mut counts = self.counts.lock().unwrap();
        if counts.workspaces.get(workspace).copied().unwrap_or(0) >= workspace_limit {
            return Err(JobLimit::Workspace);
        }
        if counts.principals.get(principal).copied().unwrap_or(0) >= principal_limit {
            return Err(JobLimit::Principal);
        }
        *counts.workspaces.entry(workspace.to_string()).or_default() += 1;
        *counts.principals.entry(principal.to_string()).or_default() += 1;
        Ok(JobSlot { slots: self.clone(), workspace: workspace.to_string(), principal: principal.to_string() })
    }

    /// Jobs running in `workspace` now.
    pub fn in_workspace(&self, workspace: &str) -> u32 {
        self.counts.lock().unwrap().workspaces.get(workspace).copied().unwrap_or(0)
    }

    /// Jobs `principal` runs now.
    pub fn of_principal(&self, principal: &str) -> u32 {
        self.counts.lock().unwrap().principals.get(principal).copied().unwrap_or(0)
    }
}

impl Drop for JobSlot {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock().unwrap();
        release(&mut counts.workspaces, &self.workspace);
        release(&mut counts.principals, &self.principal);
    }
}

/// One fewer under `key`; the entry goes when it reaches zero (the maps
/// hold only what runs).
fn release(map: &mut HashMap<String, u32>, key: &str) {
    if let Some(count) = map.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
