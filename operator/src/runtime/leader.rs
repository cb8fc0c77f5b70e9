//! Leader election through a `coordination.k8s.io/v1` Lease, as client-go
//! does it: the leader renews the Lease every `retry_period`; a candidate
//! takes it over when its record has not changed for the Lease's duration
//! *as measured by the candidate's own clock* (no trust in the holder's
//! timestamps, so clock skew between pods does not matter). Every write
//! carries the resourceVersion it read, so two candidates never both win.
//!
//! A leader that cannot renew for `renew_deadline` (shorter than the lease
//! duration) steps down before anyone else may take over. On shutdown the
//! leader releases the Lease so a standby takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Clock, Error, is_status, timestamp};

pub const LEASE_NAME: &str = "iop-operator-leader";

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub lease_name: String,
    /// This candidate (the pod name).
    pub identity: String,
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down.
    pub renew_deadline: Duration,
    /// Between two rounds.
    pub retry_period: Duration,
    /// Bound of one round (read + write).
    pub round_timeout: Duration,
}

impl LeaderConfig {
    pub fn new(identity: &str) -> Self {
        Self {
            lease_name: LEASE_NAME.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            round_timeout: Duration::from_secs(4),
        }
    }
}

/// What a round does with the Lease it read (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create,
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or the holder stopped renewing: take it over.
    Acquire,
    /// Someone else holds it and renews.
    Follow,
}

/// `unchanged_for`: how long the Lease's record has been the same by our clock.
pub fn decide(lease: Option<&Lease>, me: &str, unchanged_for: Duration, default_duration: Duration) -> Decision {
    let Some(lease) = lease else { return Decision::Create };
    let spec = lease.spec.as_ref();
    match spec.and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty()) {
        None => Decision::Acquire,
        Some(holder) if holder == me => Decision::Renew,
        Some(_) => {
            let duration = spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map_or(default_duration, Duration::from_secs);
            if unchanged_for >= duration { Decision::Acquire } else { Decision::Follow }
        }
    }
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    clock: Arc<dyn Clock>,
    /// resourceVersion of the record last seen, and when it was first seen.
    observed: Option<(String, Instant)>,
}

impl Elector {
    pub fn new(api: Api<Lease>, config: LeaderConfig, clock: Arc<dyn Clock>) -> Self {
        Self { api, config, clock, observed: None }
    }

    pub fn config(&self) -> &LeaderConfig {
        &self.config
    }

    fn now(&self) -> MicroTime {
        MicroTime(timestamp(self.clock.now()))
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// One round: read the Lease and create, renew or take it over when
    /// that is ours to do. `Ok(true)`: we lead until the next round.
    pub async fn round(&mut self) -> Result<bool, Error> {
        let lease = self.api.get_opt(&self.config.lease_name).await?;
        let now = Instant::now();
        let unchanged_for = match &lease {
            Some(l) => {
                let rv = l.metadata.resource_version.clone().unwrap_or_default();
                match &self.observed {
                    Some((seen, since)) if *seen == rv => now - *since,
                    _ => {
                        self.observed = Some((rv, now));
                        Duration::ZERO
                    }
                }
            }
            None => {
                self.observed = None;
                Duration::ZERO
            }
        };
        let decision = decide(lease.as_ref(), &self.config.identity, unchanged_for, self.config.lease_duration);
        let written = match (decision, lease) {
            (Decision::Follow, _) => return Ok(false),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.config.lease_name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(self.duration_seconds()),
                        acquire_time: Some(self.now()),
                        renew_time: Some(self.now()),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Decision::Renew, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.renew_time = Some(self.now());
                spec.lease_duration_seconds = Some(self.duration_seconds());
                self.api.replace(&self.config.lease_name, &PostParams::default(), &lease).await
            }
            (Decision::Acquire, Some(mut lease)) => {
                let (now, duration) = (self.now(), self.duration_seconds());
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = Some(self.config.identity.clone());
                spec.lease_duration_seconds = Some(duration);
                spec.acquire_time = Some(now.clone());
                spec.renew_time = Some(now);
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                self.api.replace(&self.config.lease_name, &PostParams::default(), &lease).await
            }
            (Decision::Renew | Decision::Acquire, None) => unreachable!("decide returns Create without a Lease"),
        };
        match written {
            Ok(lease) => {
                self.observed = lease.metadata.resource_version.map(|rv| (rv, Instant::now()));
                Ok(true)
            }
            // Someone else wrote first (409), or created it first.
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the Lease up if we hold it (on shutdown).
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else { return Ok(()) };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(self.now());
        self.api.replace(&self.config.lease_name, &PostParams::default(), &lease).await?;
        Ok(())
    }
}

/// Whether the API server answers, as the leader rounds see it: says when
/// that changes, so an unreachable API server is logged once (and its
/// return once), not at every round. Pure.
#[derive(Debug, Default)]
pub struct Reachability {
    /// Rounds failed in a row.
    failures: u32,
}

/// A change of [`Reachability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The first failure after answers (or at start).
    Lost,
    /// The first answer after failures.
    Back,
}

impl Reachability {
    pub fn observe(&mut self, answered: bool) -> Option<Reach> {
        let before = self.failures;
        self.failures = if answered { 0 } else { before.saturating_add(1) };
        match (before, answered) {
            (0, false) => Some(Reach::Lost),
            (n, true) if n > 0 => Some(Reach::Back),
            _ => None,
        }
    }

    /// How long until the next round: `retry_period` while leading (a
    /// leader must renew before its deadline) or answered; otherwise it
    /// doubles with every failure in a row, up to `max` (the lease duration:
    /// a standby that backs off no longer than that takes over no later).
    pub fn wait(&self, leading: bool, retry_period: Duration, max: Duration) -> Duration {
        if leading || self.failures == 0 {
            return retry_period;
        }
        retry_period.saturating_mul(1 << (self.failures - 1).min(16)).min(max.max(retry_period))
    }
}

/// Campaigns and renews until `shutdown`, publishing whether we lead.
/// While the API server does not answer it says so once, backs off (when
/// not leading) and says once when it answers again.
/// Returns the elector so the caller can release the Lease once the leader
/// tasks have stopped.
pub async fn run(mut elector: Elector, leading: watch::Sender<bool>, shutdown: CancellationToken) -> Elector {
    let config = elector.config.clone();
    let mut renewed: Option<Instant> = None;
    let mut reach = Reachability::default();
    loop {
        let outcome = tokio::time::timeout(config.round_timeout, elector.round()).await;
        let now = Instant::now();
        let leader = match outcome {
            Ok(Ok(won)) => {
                if reach.observe(true) == Some(Reach::Back) {
                    tracing::info!("the Kubernetes API server answers again");
                }
                if won {
                    renewed = Some(now);
                }
                won
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", config.round_timeout),
                };
                let keep = renewed.is_some_and(|at| now - at < config.renew_deadline);
                if reach.observe(false) == Some(Reach::Lost) {
                    tracing::warn!(%error, leading = keep, "the Kubernetes API server does not answer; retrying with backoff (said once until it answers)");
                } else {
                    tracing::debug!(%error, leading = keep, "leader election round failed");
                }
                if renewed.is_some() && !keep {
                    tracing::warn!("could not renew the leader Lease in time: stepping down");
                }
                keep
            }
        };
        if !leader {
            renewed = None;
        }
        leading.send_if_modified(|l| std::mem::replace(l, leader) != leader);
        let wait = reach.wait(leader, config.retry_period, config.lease_duration);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    leading.send_replace(false);
    elector
}

#[cfg(test)]
mod tests;
