//! Admission: per-provider capacity slots, a bounded FIFO queue per route
//! (public model), and leases that are released exactly once.
//!
//! Selection is a pure function ([`choose`]) over a snapshot of candidates.
//! Within the best priority group that has a free slot, the eligible provider
//! with the lowest cost wins: its in-flight runs, plus
//! `scheduling.load_penalty` when its node reports its model `not_loaded`
//! ([`crate::residency`]; `unknown` pays nothing). On equal cost a provider
//! that is not cold wins, then the fewest in flight, then round robin. With
//! a penalty of 0 residency is ignored (fewest in flight, round robin). A
//! group at capacity spills to the next group, and only when every eligible
//! provider is full does the request wait in its route's queue. Providers
//! already tried by this request are avoided while any alternative is
//! eligible.
//!
//! Providers the outlier detector ejected ([`crate::core::outlier`]) are chosen
//! like providers the request already tried: only when no other candidate
//! is eligible (panic routing, so ejection never empties a route).
//!
//! A [`LeaseGuard`] owns one slot. Its `Drop` returns the slot, so every
//! terminal path (success, provider error, client or node disconnect,
//! fencing, queue timeout, shutdown) releases exactly once, and records why.
//!
//! The pool's lock guards slots, queues and outlier state only. What
//! selection reads from the other owners (each candidate's effective health
//! and residency, its "standing") is read before that lock is taken, so no
//! owner's lock is ever held under the pool's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use iop_proto::config::{EdgeConfig, ProviderEntry};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::core::health::ProviderView;
use crate::core::lease::{Lease, ReleaseReason};
use crate::core::outlier::{Gate, OutlierDetector, OutlierPolicy, OutlierStatus, Transition, Verdict};
use crate::core::selection::{Candidate, CandidateView, Choice, choose};
use crate::credentials::CredentialHealth;
use crate::metrics::{EdgeMetrics, ProviderLabels, RouteLabels};
use crate::node::registry::NodeRegistry;
use crate::overlay::HealthOverlay;
use crate::residency::ResidencyTable;

/// Owns one provider slot until dropped.
pub struct LeaseGuard {
    lease: Lease,
    pool: Arc<AdmissionPool>,
    reason: ReleaseReason,
}

impl LeaseGuard {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Records the terminal path; the slot is returned when the guard drops.
    pub fn set_reason(&mut self, reason: ReleaseReason) {
        self.reason = reason;
    }

    pub fn reason(&self) -> ReleaseReason {
        self.reason
    }

    /// Its provider's outlier state now (for tests of the recording).
    #[cfg(test)]
    pub fn outlier_status(&self) -> OutlierStatus {
        self.pool.outlier_status(self.lease.provider_id(), std::time::Instant::now())
    }

    /// Records how the run's generation ended for outlier ejection.
    pub fn record_generation(&self, verdict: Verdict) {
        let (provider, run) = (self.lease.provider_id(), self.lease.run_id());
        self.pool.record_generation(provider, run, verdict, std::time::Instant::now());
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.pool.release(&self.lease, self.reason);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("no provider for this model is available")]
    NoneEligible,
    #[error("the queue for this model is full")]
    QueueFull,
    #[error("timed out waiting for capacity")]
    QueueTimeout,
}

/// A provider's slots, tracked by the slot numbers leases hold (not by a
/// free list sized to the capacity), so a reload that lowers and raises
/// the capacity while runs are in flight still counts every held slot.
struct Slots {
    capacity: u32,
    held: std::collections::BTreeSet<u32>,
}

impl Slots {
    fn new(capacity: u32) -> Self {
        Self { capacity, held: Default::default() }
    }

    fn in_flight(&self) -> u32 {
        self.held.len() as u32
    }

    /// The lowest slot number nobody holds, if the capacity allows another.
    fn acquire(&mut self) -> Option<u32> {
        if self.in_flight() >= self.capacity {
            return None;
        }
        let slot = (0..).find(|n| !self.held.contains(n)).expect("fewer holders than numbers");
        self.held.insert(slot);
        Some(slot)
    }

    /// False when `slot` was not held (a double release).
    fn release(&mut self, slot: u32) -> bool {
        self.held.remove(&slot)
    }
}

/// What a request asks admission for; kept by a queued waiter.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    pub route: String,
    pub run_id: String,
    pub candidates: Arc<[Candidate]>,
    /// Providers this request already tried, each with whether it may be
    /// re-selected when no alternate is eligible
    /// (`allow_avoided_provider_fallback`).
    pub avoid: HashMap<String, bool>,
}

/// A provider's health view and residency, as selection reads them.
#[derive(Debug, Clone, Copy)]
struct Standing {
    view: ProviderView,
    cold: bool,
}

/// Provider id -> its standing, read before the pool's lock is taken.
type Standings = HashMap<String, Standing>;

struct Waiter {
    id: u64,
    request: AdmitRequest,
    grant: oneshot::Sender<LeaseGuard>,
}

#[derive(Default)]
struct PoolState {
    slots: HashMap<String, Slots>,
    queues: HashMap<String, VecDeque<Waiter>>,
    /// The config's routes (public model names). The queue of another route
    /// (a reload removed it; requests admitted before may still wait in
    /// it) is dropped with its gauge once empty.
    routes: HashSet<String>,
    rotation: HashMap<(String, u32), usize>,
    next_waiter: u64,
    acquired: u64,
    released: u64,
    double_releases: u64,
    /// Passive outlier ejection: who is out of selection, under the
    /// config's current policy.
    outliers: OutlierDetector,
    outlier_policy: OutlierPolicy,
    /// `scheduling.load_penalty` of the current config.
    load_penalty: u32,
}

pub struct AdmissionPool {
    state: Mutex<PoolState>,
    registry: Arc<NodeRegistry>,
    overlay: Arc<HealthOverlay>,
    residency: Arc<ResidencyTable>,
    credentials: Arc<CredentialHealth>,
    metrics: Arc<EdgeMetrics>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProviderLoad {
    pub in_flight: u32,
    pub capacity: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolSnapshot {
    pub providers: HashMap<String, ProviderLoad>,
    pub queued: HashMap<String, usize>,
    pub acquired: u64,
    pub released: u64,
    pub double_releases: u64,
}

impl AdmissionPool {
    pub fn new(
        config: &EdgeConfig,
        registry: Arc<NodeRegistry>,
        overlay: Arc<HealthOverlay>,
        residency: Arc<ResidencyTable>,
        credentials: Arc<CredentialHealth>,
        metrics: Arc<EdgeMetrics>,
    ) -> Arc<Self> {
        let state = PoolState {
            slots: config.providers.iter().map(|p| (p.id.clone(), Slots::new(p.capacity))).collect(),
            routes: configured_routes(config),
            outlier_policy: OutlierPolicy::from(&config.outlier),
            load_penalty: config.scheduling.load_penalty,
            ..Default::default()
        };
        Arc::new(Self { state: Mutex::new(state), registry, overlay, residency, credentials, metrics })
    }

    /// Admits `request` now, or queues it (bounded, FIFO) for up to `wait`.
    pub async fn admit(
        self: &Arc<Self>,
        request: AdmitRequest,
        queue_depth: usize,
        wait: Duration,
    ) -> Result<LeaseGuard, AdmitError> {
        let (ticket, granted) = {
            let (mut state, standings) = self.lock_with_standings(&request.candidates);
            match self.try_acquire(&mut state, &standings, &request) {
                Attempt::Granted(lease) => {
                    self.publish(&mut state);
                    drop(state);
                    return Ok(self.guard(lease));
                }
                Attempt::NoneEligible => return Err(AdmitError::NoneEligible),
                Attempt::Busy => {}
            }
            let state = &mut *state;
            let queue = state.queues.entry(request.route.clone()).or_default();
            if queue.len() >= queue_depth {
                return Err(AdmitError::QueueFull);
            }
            state.next_waiter += 1;
            let id = state.next_waiter;
            let route = request.route.clone();
            let (grant, granted) = oneshot::channel();
            queue.push_back(Waiter { id, request, grant });
            self.publish(state);
            (WaitTicket { pool: self.clone(), route, id }, granted)
        };
        let mut granted = granted;
        let outcome = match tokio::time::timeout(wait, &mut granted).await {
            Ok(Ok(guard)) => Ok(guard),
            // The pool dropped our waiter: its providers are no longer eligible.
            Ok(Err(_)) => Err(AdmitError::NoneEligible),
            Err(_) => Err(AdmitError::QueueTimeout),
        };
        drop(ticket);
        if outcome.is_err() {
            // A grant may have raced the timeout; hand its slot straight back.
            if let Ok(mut guard) = granted.try_recv() {
                guard.set_reason(ReleaseReason::QueueTimeout);
            }
        }
        outcome
    }

    /// Whether admission could choose `provider` now for its node and
    /// health (capacity aside), and not only as a last resort: what the
    /// gate's retry plan counts as an eligible alternative.
    pub fn dispatchable(&self, provider: &ProviderEntry) -> bool {
        let view = ProviderView::of(&self.registry, &self.overlay, &self.credentials, provider);
        view.dispatchable_on.is_some() && !view.last_resort
    }

    /// Mirrors slot and queue occupancy into the gauges. Drops the empty
    /// queues of routes no longer configured, and their gauges.
    fn publish(&self, state: &mut PoolState) {
        for (provider, slots) in &state.slots {
            let labels = ProviderLabels { provider: provider.clone() };
            self.metrics.in_flight.get_or_create(&labels).set(i64::from(slots.in_flight()));
        }
        let routes = &state.routes;
        state.queues.retain(|route, queue| {
            let keep = !queue.is_empty() || routes.contains(route);
            if !keep {
                self.metrics.queue_depth.remove(&RouteLabels { route: route.clone() });
            }
            keep
        });
        for (route, queue) in &state.queues {
            self.metrics.queue_depth.get_or_create(&RouteLabels { route: route.clone() }).set(queue.len() as i64);
        }
    }

    fn guard(self: &Arc<Self>, lease: Lease) -> LeaseGuard {
        LeaseGuard { lease, pool: self.clone(), reason: ReleaseReason::ClientDisconnected }
    }

    /// The standing of each provider of `providers` not in `into` yet,
    /// read from its owners (registry, overlay, credentials, residency),
    /// each under its own lock, never under the pool's.
    fn read_standings<'a>(&self, providers: impl Iterator<Item = &'a ProviderEntry>, into: &mut Standings) {
        for provider in providers {
            if into.contains_key(&provider.id) {
                continue;
            }
            let view = ProviderView::of(&self.registry, &self.overlay, &self.credentials, provider);
            let cold = view.dispatchable_on.is_some_and(|g| self.residency.on(&provider.id, g).cold());
            into.insert(provider.id.clone(), Standing { view, cold });
        }
    }

    /// The pool's lock, with the standing of every candidate of `extra`
    /// and of every queued request, read before it was taken. Should a
    /// request queue while the standings are read, its candidates are read
    /// too and the lock taken again: selection always has a standing for
    /// every provider it may choose, and no owner's lock is taken under the
    /// pool's.
    fn lock_with_standings(&self, extra: &[Candidate]) -> (MutexGuard<'_, PoolState>, Standings) {
        let mut standings = Standings::new();
        self.read_standings(extra.iter().map(|c| &c.provider), &mut standings);
        loop {
            let state = self.state.lock().unwrap();
            let missing: Vec<ProviderEntry> = state
                .queues
                .values()
                .flatten()
                .flat_map(|waiter| waiter.request.candidates.iter())
                .filter(|c| !standings.contains_key(&c.provider.id))
                .map(|c| c.provider.clone())
                .collect();
            if missing.is_empty() {
                return (state, standings);
            }
            drop(state);
            self.read_standings(missing.iter(), &mut standings);
        }
    }

    fn try_acquire(&self, state: &mut PoolState, standings: &Standings, request: &AdmitRequest) -> Attempt {
        let provider_views: Vec<Standing> =
            request.candidates.iter().map(|c| standings[c.provider.id.as_str()]).collect();
        let generations: Vec<Option<u64>> = provider_views.iter().map(|s| s.view.dispatchable_on).collect();
        let now = std::time::Instant::now();
        let policy = state.outlier_policy;
        let gates: Vec<Gate> =
            request.candidates.iter().map(|c| state.outliers.gate(&c.provider.id, now, &policy)).collect();
        let views: Vec<CandidateView> = request
            .candidates
            .iter()
            .zip(&provider_views)
            .zip(&gates)
            .map(|((c, Standing { view, cold }), gate)| {
                let slots = state.slots.get(&c.provider.id);
                let avoided = request.avoid.get(&c.provider.id);
                let ejected = *gate == Gate::Closed;
                CandidateView {
                    priority: c.priority,
                    eligible: view.dispatchable_on.is_some() && slots.is_some(),
                    // A provider that rejected its credential, or that the
                    // outlier detector ejected, is tried only when nothing
                    // else is eligible, like one this request already tried.
                    avoided: avoided.is_some() || view.last_resort || ejected,
                    fallback_allowed: avoided.copied().unwrap_or(true),
                    in_flight: slots.map_or(0, Slots::in_flight),
                    capacity: slots.map_or(0, |s| s.capacity),
                    cold: *cold,
                }
            })
            .collect();
        let rotation = &mut state.rotation;
        let choice = choose(&views, state.load_penalty, |priority, _| {
            let cursor = rotation.entry((request.route.clone(), priority)).or_default();
            *cursor = cursor.wrapping_add(1);
            *cursor - 1
        });
        match choice {
            Choice::NoneEligible => Attempt::NoneEligible,
            Choice::AllBusy => Attempt::Busy,
            Choice::Admit(i) => {
                let c = &request.candidates[i];
                let slot = state
                    .slots
                    .get_mut(&c.provider.id)
                    .and_then(Slots::acquire)
                    .expect("chosen provider has a free slot");
                state.acquired += 1;
                self.metrics.leases_acquired.inc();
                if gates[i] == Gate::Trial {
                    // The one request that tries the ejected provider again.
                    state.outliers.begin_trial(&c.provider.id, &request.run_id, now);
                    tracing::info!(provider = %c.provider.id, "provider ejection over: one request tries it");
                }
                let generation = generations[i].expect("chosen provider is eligible");
                Attempt::Granted(Lease::new(request.run_id.clone(), &c.provider, generation, slot))
            }
        }
    }

    /// Test-only: a lease for `request` now, if one is free (no queue).
    #[cfg(test)]
    pub(crate) fn try_admit_now(self: &Arc<Self>, request: &AdmitRequest) -> Option<LeaseGuard> {
        let (mut state, standings) = self.lock_with_standings(&request.candidates);
        let Attempt::Granted(lease) = self.try_acquire(&mut state, &standings, request) else { return None };
        drop(state);
        Some(self.guard(lease))
    }

    fn release(self: &Arc<Self>, lease: &Lease, reason: ReleaseReason) {
        let grants = {
            let (mut state, standings) = self.lock_with_standings(&[]);
            // A provider a reload removed retired its slots with it.
            let released = state.slots.get_mut(lease.provider_id()).is_none_or(|slots| slots.release(lease.slot()));
            if !released {
                state.double_releases += 1;
                tracing::error!(provider = %lease.provider_id(), "lease released twice");
            }
            state.released += 1;
            let grants = self.drain(&mut state, &standings);
            self.publish(&mut state);
            grants
        };
        self.metrics.reason(&self.metrics.lease_releases, reason.label());
        self.deliver(grants);
    }

    /// Applies a reloaded config: new providers get slots, removed ones
    /// lose theirs and their `in_flight` gauge, a changed capacity keeps the
    /// slots in use (a shrink takes effect as they are released). Queues
    /// are re-evaluated; a removed route's loses its gauge once empty.
    pub fn reconfigure(self: &Arc<Self>, config: &EdgeConfig) {
        self.residency.retain(|id| config.providers.iter().any(|p| p.id == id));
        let grants = {
            let (mut state, standings) = self.lock_with_standings(&[]);
            let mut slots = HashMap::new();
            for p in &config.providers {
                let next = match state.slots.remove(&p.id) {
                    None => Slots::new(p.capacity),
                    Some(old) => Slots { capacity: p.capacity, held: old.held },
                };
                slots.insert(p.id.clone(), next);
            }
            for removed in std::mem::replace(&mut state.slots, slots).into_keys() {
                self.metrics.in_flight.remove(&ProviderLabels { provider: removed.clone() });
                self.metrics.provider_ejected.remove(&ProviderLabels { provider: removed });
            }
            let policy = OutlierPolicy::from(&config.outlier);
            let PoolState { slots, outliers, outlier_policy, .. } = &mut *state;
            outliers.retain(&policy, |id| slots.contains_key(id));
            *outlier_policy = policy;
            state.load_penalty = config.scheduling.load_penalty;
            state.routes = configured_routes(config);
            let grants = self.drain(&mut state, &standings);
            self.publish(&mut state);
            grants
        };
        self.deliver(grants);
    }

    /// Records how a generation on `provider` ended ([`crate::core::outlier`]);
    /// an ejection or a return is counted and logged, naming the provider.
    pub fn record_generation(&self, provider: &str, run: &str, verdict: Verdict, now: std::time::Instant) {
        let transition = {
            let mut state = self.state.lock().unwrap();
            let policy = state.outlier_policy;
            state.outliers.record(provider, run, verdict, now, &policy)
        };
        let labels = ProviderLabels { provider: provider.to_string() };
        match transition {
            Transition::None => {}
            Transition::Ejected { ejections, duration, .. } => {
                self.metrics.provider_ejections.get_or_create(&labels).inc();
                self.metrics.provider_ejected.get_or_create(&labels).set(1);
                tracing::warn!(
                    provider,
                    ejections,
                    ejection_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
                    "provider ejected: its generations keep failing; other providers of its models answer until \
                     the ejection ends"
                );
            }
            Transition::Returned => {
                self.metrics.provider_ejected.get_or_create(&labels).set(0);
                tracing::info!(provider, "provider back in selection: a generation succeeded after its ejection");
            }
        }
    }

    /// The node saw `provider` recover (the overlay moved it to
    /// `available`): its ejection history is cleared ([`crate::core::outlier`]).
    pub fn forgive(&self, provider: &str) {
        if self.state.lock().unwrap().outliers.forgive(provider) {
            let labels = ProviderLabels { provider: provider.to_string() };
            self.metrics.provider_ejected.get_or_create(&labels).set(0);
            tracing::info!(provider, "provider back in selection: its node saw it recover");
        }
    }

    /// `provider`'s ejection state at `now`.
    pub fn outlier_status(&self, provider: &str, now: std::time::Instant) -> OutlierStatus {
        self.state.lock().unwrap().outliers.status(provider, now)
    }

    /// Sets `iop_edge_provider_ejected` of every configured provider as of
    /// `now` (an ejection ends by time passing, so the `/metrics` handler
    /// calls this before encoding).
    pub fn publish_ejections(&self, now: std::time::Instant) {
        let state = self.state.lock().unwrap();
        for provider in state.slots.keys() {
            let ejected = state.outliers.is_ejected(provider, now, &state.outlier_policy);
            let labels = ProviderLabels { provider: provider.clone() };
            self.metrics.provider_ejected.get_or_create(&labels).set(i64::from(ejected));
        }
    }

    /// Re-evaluates queued requests, e.g. after a node became ready.
    pub fn drain_queues(self: &Arc<Self>) {
        let (mut state, standings) = self.lock_with_standings(&[]);
        let grants = self.drain(&mut state, &standings);
        drop(state);
        self.deliver(grants);
    }

    /// Admits queue heads (FIFO per route) while capacity allows. Waiters
    /// whose providers are no longer eligible are dropped (they see
    /// `NoneEligible`). Returns grants to deliver outside the lock.
    fn drain(&self, state: &mut PoolState, standings: &Standings) -> Vec<(oneshot::Sender<LeaseGuard>, Lease)> {
        let mut grants = Vec::new();
        let routes: Vec<String> = state.queues.keys().cloned().collect();
        for route in routes {
            while let Some(head) = state.queues.get(&route).and_then(|q| q.front()).map(|w| w.request.clone()) {
                match self.try_acquire(state, standings, &head) {
                    Attempt::Busy => break,
                    Attempt::NoneEligible => {
                        state.queues.get_mut(&route).and_then(VecDeque::pop_front);
                    }
                    Attempt::Granted(lease) => {
                        let waiter = state.queues.get_mut(&route).and_then(VecDeque::pop_front).expect("head exists");
                        grants.push((waiter.grant, lease));
                    }
                }
            }
        }
        grants
    }

    fn deliver(self: &Arc<Self>, grants: Vec<(oneshot::Sender<LeaseGuard>, Lease)>) {
        for (grant, lease) in grants {
            // A waiter that already left drops the guard here, which returns
            // the slot (and may grant it to the next waiter).
            if let Err(mut guard) = grant.send(self.guard(lease)) {
                guard.set_reason(ReleaseReason::QueueTimeout);
            }
        }
    }

    fn remove_waiter(&self, route: &str, id: u64) {
        let mut state = self.state.lock().unwrap();
        if let Some(queue) = state.queues.get_mut(route) {
            queue.retain(|w| w.id != id);
        }
        self.publish(&mut state);
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        let state = self.state.lock().unwrap();
        PoolSnapshot {
            providers: state
                .slots
                .iter()
                .map(|(id, s)| (id.clone(), ProviderLoad { in_flight: s.in_flight(), capacity: s.capacity }))
                .collect(),
            queued: state.queues.iter().map(|(route, q)| (route.clone(), q.len())).collect(),
            acquired: state.acquired,
            released: state.released,
            double_releases: state.double_releases,
        }
    }
}

fn configured_routes(config: &EdgeConfig) -> HashSet<String> {
    crate::route::public_models(config).into_iter().map(str::to_string).collect()
}

enum Attempt {
    Granted(Lease),
    Busy,
    NoneEligible,
}

/// Removes a waiter from its queue however the wait ends (grant, timeout,
/// or the request future being dropped because the client went away).
struct WaitTicket {
    pool: Arc<AdmissionPool>,
    route: String,
    id: u64,
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.pool.remove_waiter(&self.route, self.id);
    }
}

#[cfg(test)]
mod tests;
