//! The operator's status mirror against a running Edge: the admin API it
//! polls parses, and the pure mapping turns a healthy provider, a lowered
//! one, a recovered one and a connected node into the statuses `kubectl get
//! providers` and `kubectl get nodecatalogs` show; a status is planned for
//! writing only when what a user sees changes.
//!
//! The node probes its providers by itself (in tests every second while
//! they are available, with a short backoff while they are not), so turning
//! the mock's health endpoints off lowers every provider on it without any
//! request, and turning them on brings them back.
//!
//! Several replicas: the running Edge is read the way the operator reads
//! every Edge pod (`poll_all` at an IP and the admin port) next to replicas
//! that do not answer or see otherwise, and the merge turns that into
//! `degraded` and `1/2` (the merge rule itself is unit-tested in
//! `operator/src/mirror/tests.rs`; two real replicas run in `replicas.rs`).

mod common;

use std::collections::BTreeMap;

use common::*;
use iop_e2e::harness::wait_until;
use iop_operator::crd::provider::{Classification, Health, Residency};
use iop_operator::mirror::{self, EdgeView, NodeMirror, ProviderMirror};
use iop_operator::replicas::Replica;
use iop_operator::runtime::admin::{AdminClient, EdgeAdminUrl};
use iop_operator::runtime::metrics::Metrics;
use iop_proto::admin::{EdgeHealth, NodesSnapshot, ProvidersSnapshot};
use k8s_openapi::jiff::Timestamp;

const PROVIDER: &str = "ollama-mock";

#[tokio::test]
async fn the_status_mirror_reads_health_from_a_running_edge() {
    let stack = Stack::start(StackOptions::default()).await;
    let admin = Admin { client: AdminClient::new(), url: EdgeAdminUrl { authority: stack.admin.to_string() } };

    let (providers, nodes) = mirror_fetch(&admin).await;
    let node = nodes.nodes.iter().find(|n| n.name == NODE).expect("the node is listed");
    let status = mirror::node(node, &NodeMirror::default(), Timestamp::now());
    assert_eq!(status.connected, Some(true));
    assert!(status.generation.is_some() && status.version.is_some(), "{status:?}");
    let healthy = providers.providers.iter().find(|p| p.id == PROVIDER).unwrap();
    let up = mirror::provider(healthy, Some(node), &ProviderMirror::default(), Timestamp::now());
    assert_eq!((up.health, up.classification), (Some(Health::Available), None));

    // The provider's health endpoints fail: the node's probe finds it down,
    // the Edge lowers it, and the mirror reports it unhealthy.
    set_mock_health(&stack, false).await;
    wait_until("the Edge lowered the provider", WAIT, || async {
        stack.provider_admin(PROVIDER).await["health"] == "unavailable"
    })
    .await;
    let (providers, nodes) = mirror_fetch(&admin).await;
    let sick = providers.providers.iter().find(|p| p.id == PROVIDER).unwrap();
    let down = mirror::provider(sick, nodes.nodes.first(), &up, Timestamp::now());
    assert_eq!(down.health, Some(Health::Unavailable));
    assert_eq!(down.classification, Some(Classification::ProviderUnhealthy));
    assert!(down.last_observation_sequence.is_some(), "{down:?}");

    // Once written, later polls while it stays down never write its health
    // again: new observations (each probe's sequence) are not a change. A
    // write may still carry what else the node reports meanwhile (its
    // residency poll finds the failing server's model `unknown`), so the
    // check is on the health fields, not on "no write at all" (which
    // failed one run in four when that report landed mid-loop).
    let current = BTreeMap::from([(PROVIDER.to_string(), down.clone())]);
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let (providers, nodes) = mirror_fetch(&admin).await;
        let edge = EdgeView::one("edge", providers, nodes);
        let planned = mirror::plan(&edge, &current, &BTreeMap::new(), &BTreeMap::new(), Timestamp::now());
        for (_, next) in &planned.providers {
            let health = |m: &ProviderMirror| {
                (m.health, m.classification, m.generation, m.last_transition_time.clone(), m.credential.clone())
            };
            assert_eq!(health(next), health(&down), "a health write while it stayed down: {planned:?}");
        }
    }

    // Back: the node's probe finds it healthy again, and so does the mirror.
    set_mock_health(&stack, true).await;
    wait_until("the Edge restored the provider", WAIT, || async {
        stack.provider_admin(PROVIDER).await["health"] == "available"
    })
    .await;
    let (providers, nodes) = mirror_fetch(&admin).await;
    let back = providers.providers.iter().find(|p| p.id == PROVIDER).unwrap();
    let restored = mirror::provider(back, nodes.nodes.first(), &down, Timestamp::now());
    assert_eq!((restored.health, restored.classification), (Some(Health::Available), None));
    assert!(restored.last_observation_sequence > down.last_observation_sequence, "{restored:?}");
    assert!(mirror::visible_change(&down, &restored));
}

async fn set_mock_health(stack: &Stack, healthy: bool) {
    let response = stack
        .client
        .post(format!("{}/mock/health", stack.mock_url))
        .body(format!(r#"{{"healthy":{healthy}}}"#))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
}

/// The merge of several replicas' views, with one real replica: the
/// running Edge read as the operator reads an Edge pod, a replica without
/// an IP yet (not polled), and a stand-in replica that sees the provider
/// down.
#[tokio::test]
async fn replicas_views_merge_with_one_real_edge() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.wait_node_ready(NODE).await;
    wait_until("the Edge sees the provider available", WAIT, || async {
        stack.provider_admin(PROVIDER).await["health"] == "available"
    })
    .await;

    let replicas = [
        Replica { id: "iop-edge-a".into(), ip: Some(stack.admin.ip()) },
        Replica { id: "iop-edge-b".into(), ip: None },
    ];
    let mut edge =
        iop_operator::runtime::mirror::poll_all(&AdminClient::new(), &replicas, stack.admin.port(), &Metrics::new())
            .await;
    assert!(edge.replicas["iop-edge-a"].is_some(), "the real Edge answers at its IP and admin port");
    assert!(edge.replicas["iop-edge-b"].is_none(), "no IP: not polled, sees nothing");

    let providers = BTreeMap::from([(PROVIDER.to_string(), ProviderMirror::default())]);
    let nodes = BTreeMap::from([(NODE.to_string(), NodeMirror::default())]);
    let writes = mirror::plan(&edge, &providers, &nodes, &BTreeMap::new(), Timestamp::now());
    let (p, n) = (&writes.providers[0].1, &writes.nodes[0].1);
    assert_eq!((p.health, p.classification), (Some(Health::Available), None), "a silent replica sees nothing");
    assert_eq!((n.connected, n.replicas_summary.as_deref()), (Some(true), Some("1/2")));

    // Replica b answers and sees the provider down on its own session.
    let (mut providers_b, nodes_b) = edge.replicas["iop-edge-a"].clone().unwrap();
    for p in &mut providers_b.providers {
        p.health = EdgeHealth::Unavailable;
    }
    edge.replicas.insert("iop-edge-b".into(), Some((providers_b, nodes_b)));
    let writes = mirror::plan(&edge, &providers, &nodes, &BTreeMap::new(), Timestamp::now());
    let (p, n) = (&writes.providers[0].1, &writes.nodes[0].1);
    assert_eq!((p.health, p.classification), (Some(Health::Degraded), Some(Classification::ProviderUnhealthy)));
    assert_eq!((n.connected_replicas, n.replicas, n.replicas_summary.as_deref()), (Some(2), Some(2), Some("2/2")));
}

struct Admin {
    client: AdminClient,
    url: EdgeAdminUrl,
}

async fn mirror_fetch(admin: &Admin) -> (ProvidersSnapshot, NodesSnapshot) {
    iop_operator::runtime::mirror::fetch(&admin.client, &admin.url).await.expect("the Edge admin API parses")
}

/// Issue 25 items 3 and 6 through the status mirror: a running Edge whose
/// keyed provider refuses its managed credential says so, the mirror turns
/// that into `CredentialAccepted=False` (`CredentialRejected`) next to
/// `unavailable` health, and a run the provider accepts again brings both
/// back.
#[tokio::test]
async fn the_status_mirror_says_when_a_provider_refuses_its_credential() {
    const KEY: &str = "sk-mirror-1";
    let (_keyed, url) = spawn_keyed_mock(KEY).await;
    let keyed = provider("keyed", iop_proto::config::Adapter::Openai, "mock", "keyed", &url);
    let stack = Stack::start(StackOptions {
        extra_providers: vec![keyed],
        credentials: vec![Managed { profile: "lm", secret: KEY, revision: 1, providers: vec!["keyed"] }],
        ..Default::default()
    })
    .await;
    let admin = Admin { client: AdminClient::new(), url: EdgeAdminUrl { authority: stack.admin.to_string() } };
    wait_until("keyed dispatchable", WAIT, || async { stack.provider_admin("keyed").await["dispatchable"] == true })
        .await;
    let keyed_status = |previous: ProviderMirror| {
        let admin = &admin;
        async move {
            let (providers, nodes) = mirror_fetch(admin).await;
            let p = providers.providers.iter().find(|p| p.id == "keyed").unwrap();
            mirror::provider(p, nodes.nodes.first(), &previous, Timestamp::now())
        }
    };
    let accepted = keyed_status(ProviderMirror::default()).await;
    let condition = accepted.credential.clone().expect("a managed credential has the condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "Accepted"));

    let set_key = |key: &'static str| {
        let (client, url) = (stack.client.clone(), url.clone());
        async move { client.post(format!("{url}/mock/api-key")).body(key).send().await.unwrap().status() }
    };
    assert_eq!(set_key("sk-mirror-2").await, 204);
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hi", false)).await).await;
    assert_eq!(status, 502);
    let rejected = keyed_status(accepted.clone()).await;
    let condition = rejected.credential.clone().unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "CredentialRejected"));
    assert_eq!(rejected.health, Some(Health::Unavailable));
    assert!(mirror::visible_change(&accepted, &rejected));

    // The provider takes the key again: the next run (it is the model's last
    // resort) is accepted and ends the rejection.
    assert_eq!(set_key(KEY).await, 204);
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    let back = keyed_status(rejected).await;
    let condition = back.credential.unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "Accepted"));
    assert_eq!(back.health, Some(Health::Available));
}

/// Issue 29: a provider's model residency reaches its status (the `LOADED`
/// column of `kubectl get providers`): `not_loaded` while the server does not
/// have the model in memory, then `loaded` with the load's duration and time
/// once a request loaded it, and the change is a write.
#[tokio::test]
async fn residency_and_the_last_load_reach_the_provider_status() {
    let stack = Stack::start(StackOptions {
        mock_args: vec!["--loaded", "false", "--load-delay-ms", "300"],
        ..Default::default()
    })
    .await;
    let admin = Admin { client: AdminClient::new(), url: EdgeAdminUrl { authority: stack.admin.to_string() } };
    wait_until("the node reported the model not loaded", WAIT, || async {
        stack.provider_admin(PROVIDER).await["residency"] == "not_loaded"
    })
    .await;
    let (providers, nodes) = mirror_fetch(&admin).await;
    let cold = providers.providers.iter().find(|p| p.id == PROVIDER).unwrap();
    let cold = mirror::provider(cold, nodes.nodes.first(), &ProviderMirror::default(), Timestamp::now());
    assert_eq!((cold.residency, cold.last_load_seconds), (Some(Residency::NotLoaded), None), "{cold:?}");

    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    wait_until("the node reported the load", WAIT, || async {
        stack.provider_admin(PROVIDER).await["residency"] == "loaded"
    })
    .await;
    let (providers, nodes) = mirror_fetch(&admin).await;
    let warm = providers.providers.iter().find(|p| p.id == PROVIDER).unwrap();
    let warm = mirror::provider(warm, nodes.nodes.first(), &cold, Timestamp::now());
    assert_eq!(warm.residency, Some(Residency::Loaded), "{warm:?}");
    assert!(warm.last_load_seconds.unwrap() >= 0.3, "{warm:?}");
    assert!(warm.last_load_time.is_some(), "{warm:?}");
    assert!(mirror::visible_change(&cold, &warm));
}
