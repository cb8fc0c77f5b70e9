//! The operator's status mirror against a running Edge: the admin API it
//! polls parses, and the pure mapping turns a healthy provider, a lowered
//! one and a connected node into the statuses `kubectl get providers` and
//! `kubectl get nodecatalogs` show.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_operator::crd::provider::{Classification, Health};
use iop_operator::env::EdgeAdminUrl;
use iop_operator::mirror::{self, NodeMirror, ProviderMirror};
use iop_operator::runtime::admin::AdminClient;
use iop_proto::config::Adapter;
use k8s_openapi::jiff::Timestamp;

#[tokio::test]
async fn the_status_mirror_reads_health_from_a_running_edge() {
    // `sick` has a server of its own, so faulting it leaves `backup` healthy.
    let (_sick_mock, sick_url) = spawn_mock("127.0.0.1:0").await;
    let mut sick = provider("sick", Adapter::Ollama, "mock@first_token_delay_ms=30000", "sick", &sick_url);
    sick.stall_timeout_ms = 1_000;
    let mut backup = provider("backup", Adapter::Openai, "mock@words=2", "sick", "");
    backup.priority = 1;
    let stack = Stack::start(StackOptions { extra_providers: vec![sick, backup], ..Default::default() }).await;
    let admin = AdminClient::new(EdgeAdminUrl { authority: stack.http.to_string() });

    let (providers, nodes) = mirror_fetch(&admin).await;
    let node = nodes.nodes.iter().find(|n| n.name == NODE).expect("the node is listed");
    let status = mirror::node(node, &NodeMirror::default(), Timestamp::now());
    assert_eq!(status.connected, Some(true));
    assert!(status.generation.is_some() && status.version.is_some(), "{status:?}");
    let healthy = providers.providers.iter().find(|p| p.id == "ollama-mock").unwrap();
    let mapped = mirror::provider(healthy, Some(node), &ProviderMirror::default(), Timestamp::now());
    assert_eq!((mapped.health, mapped.classification), (Some(Health::Available), None));

    // The provider's health endpoints fail and a request stalls on it: the
    // Edge lowers it, and the mirror reports it unhealthy.
    stack.client.post(format!("{sick_url}/mock/health")).body(r#"{"healthy":false}"#).send().await.unwrap();
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("sick", "hi", false)).await).await;
    assert_eq!(status, 200, "the backup answered");
    wait_until("the overlay lowered the provider", WAIT, || async {
        stack.provider_admin("sick").await["overlay"]["state"] == "unavailable"
    })
    .await;
    let (providers, nodes) = mirror_fetch(&admin).await;
    let sick = providers.providers.iter().find(|p| p.id == "sick").unwrap();
    let mapped = mirror::provider(sick, nodes.nodes.first(), &ProviderMirror::default(), Timestamp::now());
    assert_eq!(mapped.health, Some(Health::Unavailable));
    assert_eq!(mapped.classification, Some(Classification::ProviderUnhealthy));
    assert!(mapped.last_observation_sequence.is_some());
}

async fn mirror_fetch(admin: &AdminClient) -> (mirror::ProvidersSnapshot, mirror::NodesSnapshot) {
    iop_operator::runtime::mirror::fetch(admin).await.expect("the Edge admin API parses")
}
