//! Controller wiring with synthetic watch streams and tokio's paused clock:
//! watch events go through the real reflectors into the loop, and the
//! reconcile is a recorder whose results the test scripts.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::core::error_boundary::InvalidObject;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::certs::CA_SECRET;
use crate::reconcile::CONFIG_MAP_NAME;
use crate::reconcile::fixtures::{NS, node, provider, template};

type Tx<K> = mpsc::UnboundedSender<Result<Event<DeserializeGuard<K>>, watcher::Error>>;
type PodTx = mpsc::UnboundedSender<Result<Event<Pod>, watcher::Error>>;
type SecretTx = mpsc::UnboundedSender<Result<Event<PartialObjectMeta<Secret>>, watcher::Error>>;
type MetaTx<K> = mpsc::UnboundedSender<Result<Event<PartialObjectMeta<K>>, watcher::Error>>;
type ConfigMapTx = MetaTx<ConfigMap>;

struct Harness {
    providers: Tx<Provider>,
    nodes: Tx<NodeCatalog>,
    templates: Tx<WorkspaceTemplate>,
    pods: PodTx,
    secrets: SecretTx,
    /// The operator's own objects: `iop-edge-config`, `iop-ca`, labelled Secrets.
    config_map: ConfigMapTx,
    ca: SecretTx,
    owned: SecretTx,
    /// The replica ids each reconcile read, in order.
    replicas: Arc<Mutex<Vec<Vec<String>>>>,
    /// (when, provider names, undecodable names) of each reconcile.
    calls: mpsc::UnboundedReceiver<(Instant, Vec<String>, Vec<String>)>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn channel<K>(kind: Kind) -> (Tx<K>, Store<DeserializeGuard<K>>, Signals)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (store, writer) = reflector::store();
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (tx, store, signals(kind, writer, events))
}

/// The Secrets' metadata watch, listed empty (a reconcile reads the
/// Secrets it needs itself; no test waits on this list).
fn secret_channel(providers: Store<DeserializeGuard<Provider>>) -> (SecretTx, Signals) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    tx.send(Ok(Event::Init)).unwrap();
    tx.send(Ok(Event::InitDone)).unwrap();
    (tx, secret_signals(names_a_credential(providers), events))
}

/// A metadata watch of the operator's own objects, listed with `objects`.
fn owned_channel<K: Send + 'static>(kind: Kind, objects: Vec<PartialObjectMeta<K>>) -> (MetaTx<K>, Signals)
where
    PartialObjectMeta<K>: kube::Resource,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    tx.send(Ok(Event::Init)).unwrap();
    for o in objects {
        tx.send(Ok(Event::InitApply(o))).unwrap();
    }
    tx.send(Ok(Event::InitDone)).unwrap();
    (tx, meta_signals(kind, |_| true, events))
}

fn pod_channel() -> (PodTx, Store<Pod>, Signals) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (store, writer) = reflector::store();
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (tx, store, pod_signals(writer, events))
}

/// Starts the loop; `results` are returned by successive reconciles (then Ok).
fn start(results: Vec<Result<(), Error>>) -> Harness {
    let (providers, p_store, p) = channel::<Provider>(Kind::Provider);
    let (nodes, n_store, n) = channel::<NodeCatalog>(Kind::NodeCatalog);
    let (templates, t_store, t) = channel::<WorkspaceTemplate>(Kind::WorkspaceTemplate);
    let (pods, pod_store, e) = pod_channel();
    let (secrets, s) = secret_channel(p_store.clone());
    let (config_map, c) = owned_channel(Kind::EdgeConfigMap, vec![meta(CONFIG_MAP_NAME, "1")]);
    let (ca, a) = owned_channel(Kind::CaSecret, vec![secret(CA_SECRET, "2")]);
    let (owned, o) = owned_channel(Kind::OwnedSecret, vec![secret("iop-node-mac-1", "3"), secret("iop-edge-tls", "4")]);
    let (_namespace, ns) = owned_channel::<Namespace>(Kind::Namespace, vec![]);
    let (config_map_store, _) = reflector::store();
    let (namespace_store, _) = reflector::store();
    let stores = Stores {
        providers: p_store,
        nodes: n_store,
        templates: t_store,
        pods: pod_store,
        config_map: config_map_store,
        namespace: namespace_store,
    };
    let signals = stream::select_all([p, n, t, e, s, c, a, o, ns]).boxed();
    let (calls_tx, calls) = mpsc::unbounded_channel();
    let results = Arc::new(Mutex::new(VecDeque::from(results)));
    let replicas = Arc::new(Mutex::new(Vec::new()));
    let seen_replicas = replicas.clone();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        NS.to_string(),
        stores,
        signals,
        move |read: Read| {
            assert_eq!(read.snapshot.namespace, NS);
            let mut names: Vec<String> = read.snapshot.providers.iter().map(|p| p.name_any()).collect();
            names.sort();
            let bad = read.undecodable.iter().map(|u| u.metadata.name.clone().unwrap_or_default()).collect();
            seen_replicas.lock().unwrap().push(read.snapshot.replicas.clone());
            calls_tx.send((Instant::now(), names, bad)).unwrap();
            let result = results.lock().unwrap().pop_front().unwrap_or(Ok(()));
            async move { result }
        },
        cancel.clone(),
    ));
    Harness { providers, nodes, templates, pods, secrets, config_map, ca, owned, replicas, calls, cancel, task }
}

fn ok<K>(object: K) -> Result<Event<DeserializeGuard<K>>, watcher::Error> {
    Ok(Event::Apply(DeserializeGuard(Ok(object))))
}

fn listed<K>(tx: &Tx<K>, objects: Vec<K>) {
    tx.send(Ok(Event::Init)).unwrap();
    for o in objects {
        tx.send(Ok(Event::InitApply(DeserializeGuard(Ok(o))))).unwrap();
    }
    tx.send(Ok(Event::InitDone)).unwrap();
}

fn pods_listed(tx: &PodTx, pods: Vec<Pod>) {
    tx.send(Ok(Event::Init)).unwrap();
    for p in pods {
        tx.send(Ok(Event::InitApply(p))).unwrap();
    }
    tx.send(Ok(Event::InitDone)).unwrap();
}

/// An Edge pod (`Running`, with an IP) of uid `uid-<name>`.
fn edge_pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.to_string()), uid: Some(format!("uid-{name}")), ..Default::default() },
        status: Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.7".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Harness {
    /// The next reconcile, at most `within` (virtual time) away.
    async fn call(&mut self, within: Duration) -> (Instant, Vec<String>, Vec<String>) {
        tokio::time::timeout(within, self.calls.recv())
            .await
            .unwrap_or_else(|_| panic!("no reconcile within {within:?}"))
            .unwrap()
    }

    /// No reconcile for `period` (virtual time).
    async fn quiet(&mut self, period: Duration) {
        if let Ok(call) = tokio::time::timeout(period, self.calls.recv()).await {
            panic!("unexpected reconcile: {call:?}");
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn waits_for_every_kind_then_reconciles_the_namespace_once_per_burst() {
    let mut h = start(vec![]);
    let t0 = Instant::now();
    listed(&h.providers, vec![provider("b", "mac-1"), provider("a", "mac-1")]);
    listed(&h.nodes, vec![node("mac-1")]);
    pods_listed(&h.pods, vec![]);
    // Templates not listed yet: the namespace is not known completely.
    h.quiet(Duration::from_secs(30)).await;

    listed(&h.templates, vec![template("t")]);
    let (at, providers, _) = h.call(Duration::from_secs(5)).await;
    // The first lists are older than the debounce: at once.
    assert_eq!(at - t0, Duration::from_secs(30));
    assert_eq!(providers, ["a", "b"]);

    // A burst of changes (an object added, two touched): one reconcile, reading the caches.
    let burst = Instant::now();
    h.providers.send(ok(provider("c", "mac-1"))).unwrap();
    h.nodes.send(ok(node("mac-1"))).unwrap();
    h.providers.send(Ok(Event::Delete(DeserializeGuard(Ok(provider("a", "mac-1")))))).unwrap();
    let (at, providers, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - burst, DEBOUNCE);
    assert_eq!(providers, ["b", "c"]);
    h.quiet(RESYNC - Duration::from_secs(1)).await;

    // Nothing changes: the resync comes.
    let (at, _, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - burst, DEBOUNCE + RESYNC);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_success_resets_the_backoff() {
    let failure = || Err(Error::Timeout(Duration::from_secs(60)));
    let mut h = start(vec![failure(), failure(), failure(), Ok(()), failure(), Ok(())]);
    listed(&h.providers, vec![]);
    listed(&h.nodes, vec![]);
    listed(&h.templates, vec![]);
    pods_listed(&h.pods, vec![]);
    let mut last = h.call(Duration::from_secs(5)).await.0;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let at = h.call(Duration::from_secs(600)).await.0;
        gaps.push((at - last).as_secs());
        last = at;
    }
    // 1 s, 2 s, 4 s after the failures; the resync after the success; then 1 s again.
    assert_eq!(gaps, [1, 2, 4, RESYNC.as_secs(), 1]);

    let mut backoff = Backoff::default();
    let delays: Vec<u64> = (0..12).map(|_| backoff.next_delay().as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300], "bounded");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_object_is_reported_and_never_stops_the_others() {
    // As the watcher decodes it: an object that does not match the schema
    // becomes an error that still carries its metadata.
    let bad: DeserializeGuard<Provider> = serde_json::from_value(json!({
        "apiVersion": "iop.dev/v1alpha1", "kind": "Provider",
        "metadata": {"name": "broken", "namespace": NS},
        "spec": {"node": "mac-1", "adapter": "carrier-pigeon"}
    }))
    .unwrap();
    let InvalidObject { error, metadata } = bad.0.clone().unwrap_err();
    assert!(
        error.contains("carrier-pigeon") || error.contains("unknown variant") || error.contains("missing field"),
        "{error}"
    );
    assert_eq!(metadata.name.as_deref(), Some("broken"));

    let mut h = start(vec![]);
    h.providers.send(Ok(Event::Init)).unwrap();
    h.providers.send(Ok(Event::InitApply(bad))).unwrap();
    h.providers.send(Ok(Event::InitApply(DeserializeGuard(Ok(provider("fine", "mac-1")))))).unwrap();
    h.providers.send(Ok(Event::InitDone)).unwrap();
    listed(&h.nodes, vec![node("mac-1")]);
    listed(&h.templates, vec![]);
    pods_listed(&h.pods, vec![]);
    let (_, providers, undecodable) = h.call(Duration::from_secs(5)).await;
    assert_eq!((providers, undecodable), (vec!["fine".to_string()], vec!["broken".to_string()]));

    // A failing watch is reported; the loop goes on.
    h.nodes.send(Err(watcher::Error::NoResourceVersion)).unwrap();
    h.providers.send(ok(provider("another", "mac-1"))).unwrap();
    let (_, providers, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(providers, ["another", "fine"]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_the_loop_even_while_waiting() {
    let h = start(vec![]);
    listed(&h.providers, vec![]);
    let started = Instant::now();
    h.cancel.cancel();
    h.task.await.unwrap();
    assert_eq!(Instant::now(), started, "no waiting for timers");
}

/// The status mirror and the operator's own status writes update objects
/// all the time; only a spec change (generation), a deletion or finalizers
/// may reconcile the namespace (a provider that stayed unavailable used to
/// cause a full reconcile at every mirror write).
#[tokio::test(start_paused = true)]
async fn status_only_updates_do_not_reconcile() {
    let mut h = start(vec![]);
    listed(&h.providers, vec![provider("a", "mac-1")]);
    listed(&h.nodes, vec![node("mac-1")]);
    listed(&h.templates, vec![]);
    pods_listed(&h.pods, vec![]);
    h.call(Duration::from_secs(5)).await;

    // Status written (by the mirror, the certificate writer, reconcile): nothing.
    let mut mirrored = provider("a", "mac-1");
    mirrored.status = Some(crate::crd::ProviderStatus {
        health: Some(crate::crd::provider::Health::Unavailable),
        last_observation_sequence: Some(7),
        ..Default::default()
    });
    mirrored.metadata.resource_version = Some("8".into());
    h.providers.send(ok(mirrored.clone())).unwrap();
    mirrored.status.as_mut().unwrap().last_observation_sequence = Some(8);
    h.providers.send(ok(mirrored.clone())).unwrap();
    let mut certified = node("mac-1");
    certified.status = Some(Default::default());
    h.nodes.send(ok(certified.clone())).unwrap();
    h.quiet(RESYNC - Duration::from_secs(10)).await;
    h.stop().await;

    // Each change a reconcile acts on does reconcile.
    type Change = Box<dyn Fn(&mut Provider)>;
    let changes: Vec<Change> = vec![
        Box::new(|p| p.metadata.generation = Some(2)),
        Box::new(|p| p.metadata.finalizers = Some(vec!["example.com/keep".into()])),
        Box::new(|p| {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::reconcile::fixtures::at(5)))
        }),
    ];
    for change in changes {
        let mut h = start(vec![]);
        listed(&h.providers, vec![provider("a", "mac-1")]);
        listed(&h.nodes, vec![]);
        listed(&h.templates, vec![]);
        pods_listed(&h.pods, vec![]);
        h.call(Duration::from_secs(5)).await;
        let mut p = provider("a", "mac-1");
        change(&mut p);
        h.providers.send(ok(p)).unwrap();
        // Within the debounce, long before the resync.
        h.call(Duration::from_secs(5)).await;
        h.stop().await;
    }
}

/// The Edge pods are the config's replicas: the first reconcile waits for
/// their list, and only a change of the replica ids (a pod added,
/// terminating, ended or gone) reconciles; a pod getting ready, an IP or a
/// restarted container does not.
#[tokio::test(start_paused = true)]
async fn edge_pods_reconcile_only_when_the_replica_ids_change() {
    let mut h = start(vec![]);
    listed(&h.providers, vec![]);
    listed(&h.nodes, vec![]);
    listed(&h.templates, vec![]);
    // Pods not listed yet: the config would miss its replicas.
    h.quiet(Duration::from_secs(30)).await;
    pods_listed(&h.pods, vec![edge_pod("iop-edge-b"), edge_pod("iop-edge-a")]);
    h.call(Duration::from_secs(5)).await;

    // Status only: nothing.
    let mut ready = edge_pod("iop-edge-a");
    ready.status.as_mut().unwrap().pod_ip = Some("10.0.0.8".into());
    ready.status.as_mut().unwrap().conditions = Some(vec![]);
    h.pods.send(Ok(Event::Apply(ready))).unwrap();
    h.quiet(Duration::from_secs(60)).await;

    // A new pod (rolling update), then the old one terminating, then gone.
    h.pods.send(Ok(Event::Apply(edge_pod("iop-edge-c")))).unwrap();
    h.call(Duration::from_secs(5)).await;
    let mut leaving = edge_pod("iop-edge-a");
    leaving.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::reconcile::fixtures::at(5)));
    h.pods.send(Ok(Event::Apply(leaving.clone()))).unwrap();
    h.call(Duration::from_secs(5)).await;
    // Already out of the replicas: its deletion changes nothing more.
    h.pods.send(Ok(Event::Delete(leaving))).unwrap();
    h.quiet(Duration::from_secs(60)).await;
    // Evicted (phase Failed, still in the API): out.
    let mut evicted = edge_pod("iop-edge-b");
    evicted.status.as_mut().unwrap().phase = Some("Failed".into());
    h.pods.send(Ok(Event::Apply(evicted))).unwrap();
    h.call(Duration::from_secs(5)).await;

    let seen = h.replicas.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            vec!["iop-edge-a", "iop-edge-b"],
            vec!["iop-edge-a", "iop-edge-b", "iop-edge-c"],
            vec!["iop-edge-b", "iop-edge-c"],
            vec!["iop-edge-c"],
        ]
    );
    // A failing pod watch is reported; the loop goes on.
    h.pods.send(Err(watcher::Error::NoResourceVersion)).unwrap();
    h.quiet(Duration::from_secs(5)).await;
    h.stop().await;
}

/// A Secret's metadata at `resource_version`.
fn secret(name: &str, resource_version: &str) -> PartialObjectMeta<Secret> {
    meta(name, resource_version)
}

/// An object's metadata at `resource_version`.
fn meta<K>(name: &str, resource_version: &str) -> PartialObjectMeta<K> {
    let metadata = ObjectMeta {
        name: Some(name.to_string()),
        resource_version: Some(resource_version.to_string()),
        ..Default::default()
    };
    PartialObjectMeta { types: None, metadata, _phantom: std::marker::PhantomData }
}

/// The operator's own objects reconcile within the debounce when one is
/// deleted, edited, or (the CA) replaced; not at the next resync.
#[tokio::test(start_paused = true)]
async fn a_deleted_config_map_or_node_secret_or_a_replaced_ca_reconciles_within_the_debounce() {
    let mut h = start(vec![]);
    listed(&h.providers, vec![provider("a", "mac-1")]);
    listed(&h.nodes, vec![node("mac-1")]);
    listed(&h.templates, vec![]);
    pods_listed(&h.pods, vec![]);
    h.call(Duration::from_secs(5)).await;

    let deleted = Instant::now();
    h.config_map.send(Ok(Event::Delete(meta(CONFIG_MAP_NAME, "1")))).unwrap();
    let (at, _, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - deleted, DEBOUNCE, "a deleted iop-edge-config");

    let deleted = Instant::now();
    h.owned.send(Ok(Event::Delete(secret("iop-node-mac-1", "3")))).unwrap();
    let (at, _, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - deleted, DEBOUNCE, "a deleted node Secret");

    // `kubectl delete secret iop-ca && kubectl create secret tls iop-ca ...`: one reconcile.
    let replaced = Instant::now();
    h.ca.send(Ok(Event::Delete(secret(CA_SECRET, "2")))).unwrap();
    h.ca.send(Ok(Event::Apply(secret(CA_SECRET, "20")))).unwrap();
    let (at, _, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - replaced, DEBOUNCE, "a replaced CA");
    // Replaced in place (`kubectl apply`): a new version.
    h.ca.send(Ok(Event::Apply(secret(CA_SECRET, "21")))).unwrap();
    h.call(Duration::from_secs(5)).await;

    // An edited Edge certificate Secret, and the ConfigMap re-created.
    h.owned.send(Ok(Event::Apply(secret("iop-edge-tls", "30")))).unwrap();
    h.call(Duration::from_secs(5)).await;
    h.config_map.send(Ok(Event::Apply(meta(CONFIG_MAP_NAME, "31")))).unwrap();
    h.call(Duration::from_secs(5)).await;

    // A watch restart replays what it delivered: nothing; a failing watch: nothing.
    h.config_map.send(Ok(Event::Apply(meta(CONFIG_MAP_NAME, "31")))).unwrap();
    h.owned.send(Ok(Event::Apply(secret("iop-edge-tls", "30")))).unwrap();
    h.ca.send(Err(watcher::Error::NoResourceVersion)).unwrap();
    h.quiet(Duration::from_secs(60)).await;
    h.stop().await;
}

/// A reconcile waits for the owned objects' lists as for the others.
#[tokio::test(start_paused = true)]
async fn the_first_reconcile_waits_for_the_owned_objects_lists() {
    let (tx, mut rx) = mpsc::unbounded_channel::<Result<Event<PartialObjectMeta<ConfigMap>>, watcher::Error>>();
    let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut signals = meta_signals(Kind::EdgeConfigMap, |_| true, events);
    tx.send(Ok(Event::Init)).unwrap();
    tx.send(Ok(Event::InitApply(meta(CONFIG_MAP_NAME, "1")))).unwrap();
    tx.send(Ok(Event::InitDone)).unwrap();
    assert!(matches!(signals.next().await, Some(Signal::Listed(Kind::EdgeConfigMap))));
    assert_eq!(Kind::ALL.len(), 9);
    assert!(Kind::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
}

/// A Secret a Provider's `credentialSecretRef` names reconciles when it
/// changes or goes (a rotated key reaches the Edge within the debounce);
/// a replayed version, other Secrets (the operator's own credentials
/// Secret among them) and a failing watch do not.
#[tokio::test(start_paused = true)]
async fn a_rotated_credential_secret_reconciles_and_other_secrets_do_not() {
    let mut h = start(vec![]);
    let mut keyed = provider("keyed", "mac-1");
    keyed.spec.credential_secret_ref =
        Some(crate::crd::provider::SecretKeyRef { name: "llama-key".into(), key: "api-key".into() });
    listed(&h.providers, vec![keyed, provider("plain", "mac-1")]);
    listed(&h.nodes, vec![]);
    listed(&h.templates, vec![]);
    pods_listed(&h.pods, vec![]);
    h.call(Duration::from_secs(5)).await;

    let rotated = Instant::now();
    h.secrets.send(Ok(Event::Apply(secret("llama-key", "7")))).unwrap();
    let (at, _, _) = h.call(Duration::from_secs(5)).await;
    assert_eq!(at - rotated, DEBOUNCE);
    // The same version again (a watch restart replays it): nothing.
    h.secrets.send(Ok(Event::Apply(secret("llama-key", "7")))).unwrap();
    h.secrets.send(Ok(Event::Apply(secret("unrelated", "8")))).unwrap();
    h.secrets.send(Ok(Event::Apply(secret(crate::reconcile::credentials::EDGE_CREDENTIALS_SECRET, "9")))).unwrap();
    h.secrets.send(Err(watcher::Error::NoResourceVersion)).unwrap();
    h.quiet(Duration::from_secs(60)).await;

    h.secrets.send(Ok(Event::Apply(secret("llama-key", "10")))).unwrap();
    h.call(Duration::from_secs(5)).await;
    h.secrets.send(Ok(Event::Delete(secret("unrelated", "11")))).unwrap();
    h.quiet(Duration::from_secs(60)).await;
    h.secrets.send(Ok(Event::Delete(secret("llama-key", "12")))).unwrap();
    h.call(Duration::from_secs(5)).await;
    h.stop().await;
}

#[test]
fn changes_tell_spec_deletion_and_finalizers_from_status() {
    let mut changes = Changes::default();
    let mut p = provider("a", "mac-1");
    assert!(changes.applied(&p.metadata), "new");
    assert!(!changes.applied(&p.metadata), "the same again");
    p.metadata.resource_version = Some("9".into());
    p.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    assert!(!changes.applied(&p.metadata), "status or labels only");
    p.metadata.generation = Some(2);
    assert!(changes.applied(&p.metadata), "spec");
    p.metadata.finalizers = Some(vec!["iop.dev/node-identity".into()]);
    assert!(changes.applied(&p.metadata), "finalizers");
    assert!(changes.deleted(&p.metadata));
    assert!(changes.applied(&p.metadata), "re-created under the same uid counts as new");
    changes.relist();
    assert!(changes.applied(&p.metadata), "after a relist everything is new");
    let mut no_generation = p.metadata.clone();
    no_generation.generation = None;
    assert!(changes.applied(&no_generation) && changes.applied(&no_generation));
}

/// The watches the leader starts, as the API server sees their first
/// requests: the Secrets only label- or name-selected and metadata only,
/// the ConfigMap by name (what RBAC's `resourceNames` needs for a
/// list/watch), whole (its data is compared before an apply), the Edge
/// pods by their selector.
#[tokio::test]
async fn the_watches_ask_only_for_what_they_select() {
    let (client, mut server) = crate::runtime::tests::mock();
    let (_stores, mut signals) = watch(&client, NS, "app.kubernetes.io/component=edge");
    let poller = tokio::spawn(async move { while signals.next().await.is_some() {} });
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..Kind::ALL.len() {
        let call = server.next().await;
        assert_eq!(call.method, "GET");
        let selector = |k: &str| call.query.get(k).cloned().unwrap_or_default();
        let metadata_only = call.accept.as_deref().is_some_and(|a| a.contains("as=PartialObjectMetadataList"));
        seen.insert((call.path.clone(), selector("labelSelector"), selector("fieldSelector"), metadata_only));
    }
    let core = format!("/api/v1/namespaces/{NS}");
    let crd = format!("/apis/iop.dev/v1alpha1/namespaces/{NS}");
    let s = |v: &str| v.to_string();
    let expected: std::collections::BTreeSet<_> = [
        (format!("{crd}/providers"), s(""), s(""), false),
        (format!("{crd}/nodecatalogs"), s(""), s(""), false),
        (format!("{crd}/workspacetemplates"), s(""), s(""), false),
        (format!("{core}/pods"), s("app.kubernetes.io/component=edge"), s(""), false),
        (format!("{core}/secrets"), s("iop.dev/credential=true"), s(""), true),
        (format!("{core}/secrets"), s("app.kubernetes.io/managed-by=iop-operator"), s(""), true),
        (format!("{core}/secrets"), s(""), s("metadata.name=iop-ca"), true),
        (format!("{core}/configmaps"), s(""), s("metadata.name=iop-edge-config"), false),
        (s("/api/v1/namespaces"), s(""), format!("metadata.name={NS}"), false),
    ]
    .into();
    assert_eq!(seen, expected);
    poller.abort();
}

/// Issue 43 D2: the namespace's deletion reaches the reconcile's snapshot
/// (which then only releases finalizers).
#[test]
fn a_terminating_namespace_is_in_the_snapshot() {
    let (namespace, mut writer) = reflector::store::<Namespace>();
    let stores = Stores {
        providers: reflector::store().0,
        nodes: reflector::store().0,
        templates: reflector::store().0,
        pods: reflector::store().0,
        config_map: reflector::store().0,
        namespace,
    };
    let mut ns = Namespace::default();
    ns.metadata.name = Some(NS.into());
    writer.apply_watcher_event(&Event::Apply(ns.clone()));
    assert!(!stores.read(NS).snapshot.namespace_terminating);
    ns.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    writer.apply_watcher_event(&Event::Apply(ns));
    assert!(stores.read(NS).snapshot.namespace_terminating);
}
