//! The namespace controller. Every Provider, NodeCatalog and
//! WorkspaceTemplate of the namespace feeds the one Edge config, so there is
//! one reconcile key: the namespace. Watch events of all three kinds mark it
//! dirty; a short debounce folds bursts (an initial list, `kubectl apply -f
//! dir/`) into one reconcile of the whole namespace, read from the
//! reflectors' caches.
//!
//! The Secrets Providers' `credentialSecretRef`s name are watched by their
//! metadata only, and only those labelled `iop.dev/credential: "true"` (the
//! only ones a Provider may use; a label selector, so the API server sends
//! no other Secret) ([`secret_signals`]): rotating a provider key reconciles
//! within the debounce, not at the next resync.
//!
//! The operator's own objects are watched too ([`meta_signals`]): the
//! ConfigMap `iop-edge-config` (by name, whole: the reconcile compares it
//! with the config it would apply and sends nothing when they are the
//! same), and, metadata only, the CA
//! Secret `iop-ca` (by name: a CA the user supplies carries no label of
//! ours) and every Secret labelled `app.kubernetes.io/managed-by:
//! iop-operator` (`iop-edge-tls`, `iop-edge-credentials`, each
//! `iop-node-<name>`). Deleting one, editing it or replacing the CA
//! reconciles within the debounce, not at the next resync. A write of the
//! operator's own moves its object's resourceVersion too, so each write
//! wakes one more reconcile, which finds nothing to do (and sends no
//! write: [`crate::reconcile::unchanged`]).
//!
//! The operator's own Namespace is watched by name: when it is being
//! deleted, the reconcile only releases the NodeCatalogs' finalizers
//! ([`super::namespace`]), so the namespace's deletion completes.
//!
//! The Edge pods (label selector `IOP_EDGE_POD_SELECTOR`) are watched too:
//! their names are the Edge config's `replicas` ([`crate::replicas`]), and
//! their IPs where the status mirror reads each replica's admin API. A pod
//! event wakes the loop only when the replica ids change (a pod created,
//! terminating, ended or gone), never for readiness or other status updates
//! ([`pod_signals`]). The first reconcile waits for the pods' list as for the
//! three kinds', so a new leader never renders the config without them.
//!
//! (kube-runtime's `Controller` reconciles one object per key and only
//! objects present in its store; a namespace-wide key that is not an object
//! does not fit it, so this loop is its own.)
//!
//! Only changes a reconcile acts on wake it ([`Changes`]): a new or deleted
//! object, a spec edit (`metadata.generation`), the start of a deletion, or
//! its finalizers. Status-only updates (the status mirror, certificate and
//! condition writes, the operator's own) change none of these and do not
//! trigger a reconcile; the caches see them all the same.
//!
//! Objects are watched through [`DeserializeGuard`]: one that does not
//! decode is reported and left out; it never stops the watch. A failed
//! reconcile is retried with exponential backoff (bounded), or sooner when
//! an object changes meanwhile; a successful one is repeated every
//! [`RESYNC`] (certificate rotation, drift).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{self, Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use kube::{Api, Client, Resource};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Error;
use crate::certs::CA_SECRET;
use crate::crd::{NodeCatalog, Provider, WorkspaceTemplate};
use crate::reconcile::{CONFIG_MAP_NAME, Snapshot, credentials};
use crate::replicas::replica_ids;

/// A change is reconciled this long after the first event of a burst; the
/// burst's later events join that reconcile.
pub const DEBOUNCE: Duration = Duration::from_millis(500);
/// A successful reconcile runs again after this long without changes.
pub const RESYNC: Duration = Duration::from_secs(300);
/// Backoff after failed reconciles: 1 s, doubling, at most this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Provider,
    NodeCatalog,
    WorkspaceTemplate,
    /// The Edge's pods (its replicas).
    EdgePod,
    /// Secrets labelled `iop.dev/credential: "true"`, for the ones a
    /// Provider's `credentialSecretRef` names.
    CredentialSecret,
    /// The ConfigMap `iop-edge-config`.
    EdgeConfigMap,
    /// The CA Secret `iop-ca`.
    CaSecret,
    /// Secrets labelled `app.kubernetes.io/managed-by: iop-operator`.
    OwnedSecret,
    /// The operator's own Namespace (by name): its deletion.
    Namespace,
}

impl Kind {
    /// Every watched kind: a reconcile waits until each one is listed.
    pub const ALL: [Self; 9] = [
        Self::Provider,
        Self::NodeCatalog,
        Self::WorkspaceTemplate,
        Self::EdgePod,
        Self::CredentialSecret,
        Self::EdgeConfigMap,
        Self::CaSecret,
        Self::OwnedSecret,
        Self::Namespace,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "Provider",
            Self::NodeCatalog => "NodeCatalog",
            Self::WorkspaceTemplate => "WorkspaceTemplate",
            Self::EdgePod => "Pod",
            Self::CredentialSecret => "Secret",
            Self::EdgeConfigMap => "ConfigMap",
            Self::CaSecret => "CaSecret",
            Self::OwnedSecret => "OwnedSecret",
            Self::Namespace => "Namespace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a watch reports to the loop.
#[derive(Debug)]
pub enum Signal {
    /// The initial list of this kind is complete (its cache is usable).
    Listed(Kind),
    /// An object of this kind changed (or the kind was re-listed).
    Changed(Kind),
    /// The watch failed; it retries with its own backoff.
    WatchFailed(Kind, String),
}

/// The reflectors' caches.
#[derive(Clone)]
pub struct Stores {
    pub providers: Store<DeserializeGuard<Provider>>,
    pub nodes: Store<DeserializeGuard<NodeCatalog>>,
    pub templates: Store<DeserializeGuard<WorkspaceTemplate>>,
    /// The Edge pods (by `IOP_EDGE_POD_SELECTOR`).
    pub pods: Store<Pod>,
    /// `iop-edge-config` (at most one object).
    pub config_map: Store<ConfigMap>,
    /// The operator's own Namespace (at most one object).
    pub namespace: Store<Namespace>,
}

/// An object that did not decode: only its metadata is known.
#[derive(Debug, Clone)]
pub struct Undecodable {
    pub kind: Kind,
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    pub error: String,
}

/// What one reconcile reads: every decodable object, and the others.
#[derive(Debug, Clone, Default)]
pub struct Read {
    pub snapshot: Snapshot,
    pub undecodable: Vec<Undecodable>,
}

impl Stores {
    pub fn read(&self, namespace: &str) -> Read {
        let mut read = Read {
            snapshot: Snapshot { namespace: namespace.to_string(), ..Default::default() },
            undecodable: Vec::new(),
        };
        fn split<K: Clone>(
            kind: Kind,
            objects: Vec<std::sync::Arc<DeserializeGuard<K>>>,
            valid: &mut Vec<K>,
            bad: &mut Vec<Undecodable>,
        ) {
            for o in objects {
                match &o.0 {
                    Ok(k) => valid.push(k.clone()),
                    Err(e) => bad.push(Undecodable { kind, metadata: e.metadata.clone(), error: e.error.clone() }),
                }
            }
        }
        split(Kind::Provider, self.providers.state(), &mut read.snapshot.providers, &mut read.undecodable);
        split(Kind::NodeCatalog, self.nodes.state(), &mut read.snapshot.nodes, &mut read.undecodable);
        split(Kind::WorkspaceTemplate, self.templates.state(), &mut read.snapshot.templates, &mut read.undecodable);
        read.snapshot.replicas = replica_ids(self.pods.state().iter().map(|p| p.as_ref()));
        read.snapshot.edge_config_map = self.config_map.state().first().map(|c| c.as_ref().clone());
        read.snapshot.namespace_terminating =
            self.namespace.state().first().is_some_and(|n| super::ownership::is_terminating(n));
        read
    }
}

pub type Signals = Pin<Box<dyn Stream<Item = Signal> + Send>>;

/// What of an object a reconcile acts on: everything in `spec` (through
/// `metadata.generation`, which the API server moves on every spec change
/// and when a deletion starts), whether it is being deleted, and its
/// finalizers. Not `status`: a status write must not trigger a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Watched {
    generation: Option<i64>,
    deleting: bool,
    finalizers: Vec<String>,
}

impl Watched {
    fn of(meta: &ObjectMeta) -> Self {
        Self {
            generation: meta.generation,
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
        }
    }
}

/// The last [`Watched`] state of each object of one kind (by uid), to tell
/// the watch events that change something a reconcile acts on from those
/// that only touched status or other metadata (pure, no I/O).
#[derive(Debug, Default)]
pub struct Changes {
    seen: HashMap<String, Watched>,
}

impl Changes {
    /// A relist starts: forget everything (the relist's end reconciles anyway).
    pub fn relist(&mut self) {
        self.seen.clear();
    }

    /// An object was listed or updated: whether it changed what a reconcile
    /// acts on (new objects did). An object without a generation always counts.
    pub fn applied(&mut self, meta: &ObjectMeta) -> bool {
        let now = Watched::of(meta);
        if now.generation.is_none() {
            return true;
        }
        let key = meta.uid.clone().or_else(|| meta.name.clone()).unwrap_or_default();
        self.seen.insert(key, now.clone()).is_none_or(|before| before != now)
    }

    /// An object is gone: always a change.
    pub fn deleted(&mut self, meta: &ObjectMeta) -> bool {
        self.seen.remove(&meta.uid.clone().or_else(|| meta.name.clone()).unwrap_or_default());
        true
    }
}

/// Feeds one kind's watch events into its cache and turns the ones that
/// matter ([`Changes`]) into signals.
pub fn signals<K>(
    kind: Kind,
    writer: Writer<DeserializeGuard<K>>,
    events: impl Stream<Item = Result<Event<DeserializeGuard<K>>, watcher::Error>> + Send + 'static,
) -> Signals
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let mut changes = Changes::default();
    reflector::reflector(writer, events)
        .filter_map(move |event| {
            let signal = match event {
                Ok(Event::InitDone) => Some(Signal::Listed(kind)),
                Ok(Event::Init) => {
                    changes.relist();
                    None
                }
                Ok(Event::InitApply(object)) => {
                    changes.applied(object.meta());
                    None
                }
                Ok(Event::Apply(object)) => changes.applied(object.meta()).then_some(Signal::Changed(kind)),
                Ok(Event::Delete(object)) => changes.deleted(object.meta()).then_some(Signal::Changed(kind)),
                Err(e) => Some(Signal::WatchFailed(kind, e.to_string())),
            };
            std::future::ready(signal)
        })
        .boxed()
}

/// Feeds the Edge pods' watch events into their cache and signals a change
/// only when the replica ids ([`replica_ids`]) differ from the last ones
/// signalled: pods become ready, get IPs and restart containers all the
/// time, and none of that changes the Edge config.
pub fn pod_signals(
    writer: Writer<Pod>,
    events: impl Stream<Item = Result<Event<Pod>, watcher::Error>> + Send + 'static,
) -> Signals {
    let store = writer.as_reader();
    let mut last: Option<Vec<String>> = None;
    reflector::reflector(writer, events)
        .filter_map(move |event| {
            let ids = || replica_ids(store.state().iter().map(|p| p.as_ref()));
            let signal = match event {
                Ok(Event::InitDone) => {
                    last = Some(ids());
                    Some(Signal::Listed(Kind::EdgePod))
                }
                Ok(Event::Init | Event::InitApply(_)) => None,
                Ok(Event::Apply(_) | Event::Delete(_)) => {
                    let now = ids();
                    (last.as_ref() != Some(&now)).then(|| {
                        last = Some(now);
                        Signal::Changed(Kind::EdgePod)
                    })
                }
                Err(e) => Some(Signal::WatchFailed(Kind::EdgePod, e.to_string())),
            };
            std::future::ready(signal)
        })
        .boxed()
}

/// Signals a change of a Secret that a Provider's `credentialSecretRef`
/// names (`referenced`), so a rotated provider key reaches the Edge within
/// the debounce rather than at the next resync. Only metadata is watched
/// (`Api<PartialObjectMeta<Secret>>`): a change moves `resourceVersion`,
/// and the data is read by the reconcile itself, never cached here. Other
/// Secrets change nothing.
pub fn secret_signals(
    referenced: impl Fn(&str) -> bool + Send + 'static,
    events: impl Stream<Item = Result<Event<PartialObjectMeta<Secret>>, watcher::Error>> + Send + 'static,
) -> Signals {
    meta_signals(Kind::CredentialSecret, referenced, events)
}

/// Signals every change (a new `resourceVersion`) and every deletion of an
/// object (of a metadata-only watch, or of a whole object's) whose name
/// `matters`. A watch restart replays objects it already delivered: an
/// unchanged version is no change.
pub fn meta_signals<K>(
    kind: Kind,
    matters: impl Fn(&str) -> bool + Send + 'static,
    events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
) -> Signals
where
    K: Resource + Send + 'static,
{
    // The last resourceVersion seen of each object.
    let mut versions: HashMap<String, Option<String>> = HashMap::new();
    events
        .filter_map(move |event| {
            let signal = match event {
                // A relist restates every object: forget the ones gone meanwhile.
                Ok(Event::Init) => {
                    versions.clear();
                    None
                }
                Ok(Event::InitApply(object)) => {
                    versions.insert(name_of(object.meta()), object.meta().resource_version.clone());
                    None
                }
                Ok(Event::InitDone) => Some(Signal::Listed(kind)),
                Ok(Event::Apply(object)) => {
                    let (name, version) = (name_of(object.meta()), object.meta().resource_version.clone());
                    let moved = versions.insert(name.clone(), version.clone()) != Some(version);
                    (moved && matters(&name)).then_some(Signal::Changed(kind))
                }
                Ok(Event::Delete(object)) => {
                    let name = name_of(object.meta());
                    versions.remove(&name);
                    matters(&name).then_some(Signal::Changed(kind))
                }
                Err(e) => Some(Signal::WatchFailed(kind, e.to_string())),
            };
            std::future::ready(signal)
        })
        .boxed()
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// Whether a Provider in `providers` names Secret `name` in its
/// `credentialSecretRef`.
fn names_a_credential(providers: Store<DeserializeGuard<Provider>>) -> impl Fn(&str) -> bool + Send + 'static {
    move |name| providers.state().iter().any(|p| p.0.as_ref().is_ok_and(|p| p.spec.credential_secret() == Some(name)))
}

/// The label of every object the operator creates (the owned-Secret watch
/// selects on it).
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=iop-operator";

/// Watches the three kinds, the Edge pods (`pod_selector`), the labelled
/// credential Secrets' and the operator's own objects' metadata in
/// `namespace` (with the watcher's own backoff).
pub fn watch(client: &Client, namespace: &str, pod_selector: &str) -> (Stores, Signals) {
    fn one<K>(client: &Client, namespace: &str, kind: Kind) -> (Store<DeserializeGuard<K>>, Signals)
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let (store, writer) = reflector::store();
        let api: Api<DeserializeGuard<K>> = Api::namespaced(client.clone(), namespace);
        let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
        (store, signals(kind, writer, events))
    }
    let (providers, p) = one::<Provider>(client, namespace, Kind::Provider);
    let (nodes, n) = one::<NodeCatalog>(client, namespace, Kind::NodeCatalog);
    let (templates, t) = one::<WorkspaceTemplate>(client, namespace, Kind::WorkspaceTemplate);
    let (pods, writer) = reflector::store();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let events = watcher::watcher(api, watcher::Config::default().labels(pod_selector))
        .default_backoff()
        // Only names, deletion, phase and IP are read: keep the cache small.
        .modify(|pod: &mut Pod| {
            pod.metadata.managed_fields = None;
            pod.metadata.annotations = None;
            pod.spec = None;
        });
    let e = pod_signals(writer, events);
    // `Api<PartialObjectMeta<_>>` lists and watches metadata only; the
    // selectors make the API server send only the objects named.
    let secrets: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), namespace);
    let metadata = |config: watcher::Config| watcher::watcher(secrets.clone(), config).default_backoff();
    let s = secret_signals(
        names_a_credential(providers.clone()),
        metadata(watcher::Config::default().labels(credentials::CREDENTIAL_SELECTOR)),
    );
    let owned =
        meta_signals(Kind::OwnedSecret, |_| true, metadata(watcher::Config::default().labels(MANAGED_BY_SELECTOR)));
    let ca_by_name = format!("metadata.name={CA_SECRET}");
    let ca = meta_signals(Kind::CaSecret, |_| true, metadata(watcher::Config::default().fields(&ca_by_name)));
    // The ConfigMap is watched whole (by name): the reconcile compares the
    // config it would apply with the one there and sends nothing when they
    // are the same (`reconcile::unchanged`).
    let (config_map, writer) = reflector::store();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let by_name = format!("metadata.name={CONFIG_MAP_NAME}");
    let events = watcher::watcher(config_maps, watcher::Config::default().fields(&by_name))
        .default_backoff()
        .modify(|cm: &mut ConfigMap| cm.metadata.managed_fields = None);
    let c = meta_signals(Kind::EdgeConfigMap, |_| true, reflector::reflector(writer, events));
    // The namespace, by name (the chart's ClusterRole grants get/list/watch
    // of this one): when it is being deleted the reconcile releases every
    // finalizer (issue 43 D2).
    let (namespace_store, writer) = reflector::store();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let by_name = format!("metadata.name={namespace}");
    let events = watcher::watcher(namespaces, watcher::Config::default().fields(&by_name))
        .default_backoff()
        .modify(|ns: &mut Namespace| ns.metadata.managed_fields = None);
    let ns = meta_signals(Kind::Namespace, |_| true, reflector::reflector(writer, events));
    let signals = stream::select_all([p, n, t, e, s, owned, ca, c, ns]).boxed();
    (Stores { providers, nodes, templates, pods, config_map, namespace: namespace_store }, signals)
}

/// Exponential backoff without jitter (one reconciler per namespace has
/// nobody to collide with): 1 s, 2 s, 4 s, ... at most [`MAX_BACKOFF`].
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    pub fn next_delay(&mut self) -> Duration {
        let delay = Duration::from_secs(1).saturating_mul(1 << self.failures.min(16)).min(MAX_BACKOFF);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Runs until `cancel` (or the signals end): reconciles once every kind is
/// listed, then after every change (debounced), after failures (backoff)
/// and every [`RESYNC`].
pub async fn run<F, Fut>(
    namespace: String,
    stores: Stores,
    mut signals: Signals,
    mut reconcile: F,
    cancel: CancellationToken,
) where
    F: FnMut(Read) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let mut listed = [false; Kind::ALL.len()];
    // Watches failing since their last list: said once each way, not at every retry.
    let mut failing = [false; Kind::ALL.len()];
    let mut due: Option<Instant> = None;
    let mut backoff = Backoff::default();
    loop {
        let all_listed = listed.iter().all(|l| *l);
        let wake = async {
            match due {
                Some(at) if all_listed => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            signal = signals.next() => {
                let soon = Instant::now() + DEBOUNCE;
                match signal {
                    None => return,
                    Some(Signal::Listed(kind)) => {
                        listed[kind.index()] = true;
                        if std::mem::replace(&mut failing[kind.index()], false) {
                            tracing::info!(kind = kind.as_str(), "watch listed again");
                        }
                        due = Some(due.map_or(soon, |d| d.min(soon)));
                    }
                    Some(Signal::Changed(_)) => due = Some(due.map_or(soon, |d| d.min(soon))),
                    Some(Signal::WatchFailed(kind, error)) => {
                        if std::mem::replace(&mut failing[kind.index()], true) {
                            tracing::debug!(kind = kind.as_str(), %error, "watch failed again");
                        } else {
                            tracing::warn!(kind = kind.as_str(), %error, "watch failed; it retries with backoff (said once until it lists again)");
                        }
                    }
                }
            }
            _ = wake => {
                let read = stores.read(&namespace);
                for bad in &read.undecodable {
                    tracing::warn!(
                        kind = bad.kind.as_str(),
                        name = bad.metadata.name.as_deref().unwrap_or_default(),
                        error = %bad.error,
                        "object does not decode; it is left out until it is fixed"
                    );
                }
                due = match reconcile(read).await {
                    Ok(()) => {
                        backoff.reset();
                        Some(Instant::now() + RESYNC)
                    }
                    Err(e) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(error = %e, kind = e.label(), retry_in = ?delay, "reconcile failed");
                        Some(Instant::now() + delay)
                    }
                };
            }
        }
    }
}

#[cfg(test)]
mod tests;
