//! The node's provider health monitor: every provider of a Ready connection
//! is probed again by itself, so a provider that was down when the node
//! connected (or that a stall or a refused connection showed down) returns
//! to rotation without traffic and without a node restart, and one that
//! goes down while idle leaves it.
//!
//! - A provider that is not available is probed with capped exponential
//!   backoff (`health.retry_initial_ms` doubling up to `health.retry_max_ms`).
//! - An available provider is probed every `health.idle_interval_ms`.
//! - Every probe is [`crate::adapter::probe`], the one definition of healthy
//!   (a metadata call, never a generation).
//! - When a probe's verdict differs from the last one this connection
//!   reported (readiness is the first), the node sends a
//!   `ProviderHealthReport` with the session's next health observation
//!   sequence; the Edge applies it to its runtime overlay, in both directions.
//!
//! Evidence the node sends another way (a stall's or an unreachable
//! provider's probe on a run's terminal) only lowers a provider at the Edge,
//! so only that direction is fed back here ([`HealthMonitor::lowered`]): the
//! monitor then probes the provider again soon and reports its return.
//!
//! [`HealthSchedule`] is the pure part (who is due when, what is owed a
//! report); [`HealthMonitor::run`] the I/O loop around it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use iop_proto::pb;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::adapter::ProviderTarget;
use crate::adapter::probe::probe;
use crate::config::HealthConfig;
use crate::transport::sequence::SessionSequence;

#[derive(Debug, Clone)]
struct Entry {
    /// The last health this connection reported to the Edge.
    reported: pb::ProviderHealth,
    /// Consecutive probes that did not find the provider available.
    failures: u32,
    due: Instant,
}

/// Which provider is probed when, and which verdicts are owed a report.
/// Pure: callers pass the time.
#[derive(Debug, Clone)]
pub struct HealthSchedule {
    profile: HealthConfig,
    entries: BTreeMap<String, Entry>,
}

impl HealthSchedule {
    /// Starts from what readiness reported.
    pub fn new(
        profile: HealthConfig,
        reported: impl IntoIterator<Item = (String, pb::ProviderHealth)>,
        now: Instant,
    ) -> Self {
        let mut schedule = Self { profile, entries: BTreeMap::new() };
        for (id, health) in reported {
            let due = now + schedule.delay(health, 0);
            schedule.entries.insert(id, Entry { reported: health, failures: 0, due });
        }
        schedule
    }

    /// Wait before the next probe: the idle interval while available, else
    /// `retry_initial * 2^failures`, capped at `retry_max`.
    fn delay(&self, health: pb::ProviderHealth, failures: u32) -> Duration {
        if health == pb::ProviderHealth::Available {
            return self.profile.idle_interval();
        }
        let initial = self.profile.retry_initial();
        initial.saturating_mul(1u32.checked_shl(failures).unwrap_or(u32::MAX)).min(self.profile.retry_max())
    }

    /// When the earliest probe is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.due).min()
    }

    /// Providers whose probe is due at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.entries.iter().filter(|(_, e)| e.due <= now).map(|(id, _)| id.clone()).collect()
    }

    /// Records a monitor probe's verdict and schedules the next one. Returns
    /// true when it differs from what was last reported: a report is owed
    /// (and from now on counts as reported).
    pub fn probed(&mut self, id: &str, health: pb::ProviderHealth, now: Instant) -> bool {
        let failures = match self.entries.get(id) {
            None => return false,
            Some(_) if health == pb::ProviderHealth::Available => 0,
            Some(entry) => entry.failures.saturating_add(1),
        };
        let due = now + self.delay(health, failures.saturating_sub(1));
        let entry = self.entries.get_mut(id).expect("checked above");
        let changed = entry.reported != health;
        *entry = Entry { reported: health, failures, due };
        changed
    }

    /// Evidence sent with a run's terminal lowered `id` at the Edge: probe
    /// it again after the initial retry delay.
    pub fn lowered(&mut self, id: &str, now: Instant) {
        let due = now + self.delay(pb::ProviderHealth::Unavailable, 0);
        if let Some(entry) = self.entries.get_mut(id) {
            *entry = Entry { reported: pb::ProviderHealth::Unavailable, failures: 0, due };
        }
    }
}

/// A provider's status as the node reports it: `target` is `None` for an
/// assignment that failed validation (no adapter or target to name).
pub(crate) fn provider_status(
    id: &str,
    target: Option<&ProviderTarget>,
    health: pb::ProviderHealth,
    health_observation_seq: Option<u64>,
) -> pb::ProviderStatus {
    pb::ProviderStatus {
        provider_id: id.to_string(),
        health: health.into(),
        adapter: target.map_or(0, |t| t.adapter.to_wire().into()),
        target_model: target.map(|t| t.target_model.clone()).unwrap_or_default(),
        health_observation_seq,
    }
}

/// One connection's monitor: the schedule, shared with the paths that send
/// evidence of their own, and the loop that probes and reports.
pub struct HealthMonitor {
    schedule: Mutex<HealthSchedule>,
    changed: Notify,
}

impl HealthMonitor {
    pub fn new(schedule: HealthSchedule) -> Arc<Self> {
        Arc::new(Self { schedule: Mutex::new(schedule), changed: Notify::new() })
    }

    /// See [`HealthSchedule::lowered`].
    pub fn lowered(&self, id: &str) {
        self.schedule.lock().unwrap().lowered(id, Instant::now());
        self.changed.notify_one();
    }

    /// Probes due providers until `stop`, sending a report whenever a
    /// verdict changes. Runs only on a Ready connection.
    pub async fn run(
        self: Arc<Self>,
        http: reqwest::Client,
        targets: Vec<ProviderTarget>,
        sequence: Arc<SessionSequence>,
        out: mpsc::Sender<pb::NodeToEdge>,
        stop: CancellationToken,
    ) {
        loop {
            let next = self.schedule.lock().unwrap().next_due();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.changed.notified() => continue,
                _ = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            let due = self.schedule.lock().unwrap().due(Instant::now());
            let probes = targets.iter().filter(|t| due.contains(&t.provider_id)).map(|target| {
                let http = &http;
                async move { (target, probe(http, target).await) }
            });
            let verdicts = tokio::select! {
                _ = stop.cancelled() => return,
                verdicts = join_all(probes) => verdicts,
            };
            let mut report = Vec::new();
            for (target, verdict) in verdicts {
                if !self.schedule.lock().unwrap().probed(&target.provider_id, verdict.health, Instant::now()) {
                    continue;
                }
                match &verdict.failure {
                    None => tracing::info!(provider = %target.provider_id, "provider is available again"),
                    Some(failure) => tracing::warn!(
                        provider = %target.provider_id,
                        health = verdict.health.as_str_name(),
                        reason = failure.label(),
                        detail = %failure,
                        "provider health check failed"
                    ),
                }
                // Sequenced once the observation is final.
                let seq = Some(sequence.next());
                report.push(provider_status(&target.provider_id, Some(target), verdict.health, seq));
            }
            if !report.is_empty() {
                let msg = pb::node_to_edge::Msg::HealthReport(pb::ProviderHealthReport { providers: report });
                // Bounded wait: a connection that stopped reading ends by
                // its heartbeat wait, and `stop` with it.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = out.send(pb::NodeToEdge { msg: Some(msg) }) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
