//! Status mirroring against stand-in Edge admin APIs (real HTTP servers on
//! local addresses) and the mocked Kubernetes API.

use std::time::Duration;

use iop_proto::admin::{EdgeHealth, EdgeNode, EdgeProvider, NodesSnapshot, Overlay, ProvidersSnapshot, SessionPhase};
use kube::core::DeserializeGuard;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::crd::provider::Health;
use crate::reconcile::fixtures::{node, provider};
use crate::replicas::Replica;
use crate::runtime::metrics::Metrics;
use crate::runtime::namespace::STATUS_WRITE_TIMEOUT;
use crate::runtime::tests::{NOW, context, mock, status_writes, value};

const CRD_PATH: &str = "/apis/iop.dev/v1alpha1/namespaces/iop";
const STATUS: &str = "iop-operator/status";

/// Serves one canned answer per path, one request per connection.
async fn fake_edge(routes: Vec<(&'static str, u16, String)>, hang: bool) -> EdgeAdminUrl {
    fake_edge_at("127.0.0.1:0", routes, hang).await
}

async fn fake_edge_at(addr: &str, routes: Vec<(&'static str, u16, String)>, hang: bool) -> EdgeAdminUrl {
    let listener = TcpListener::bind(addr).await.unwrap();
    let authority = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                if hang {
                    std::future::pending::<()>().await;
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or_default();
                let (status, body) = routes
                    .iter()
                    .find(|(p, _, _)| *p == path)
                    .map_or((404, "{}".to_string()), |(_, s, b)| (*s, b.clone()));
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                socket.write_all(response.as_bytes()).await.unwrap();
            });
        }
    });
    EdgeAdminUrl { authority }
}

#[tokio::test]
async fn fetches_both_admin_snapshots_and_reports_failures_by_kind() {
    let providers = json!({"providers": [{"id": "llama", "node": "mac-1", "adapter": "ollama", "node_ready": true,
        "health": "available", "dispatchable": true, "capacity": 4, "overlay": null, "in_flight": 0}],
        "queued": 0, "in_flight_runs": 0});
    let nodes = json!({"nodes": [{"name": "mac-1", "connected": true, "phase": "ready", "generation": 4,
        "connected_at_ms": 1_793_534_000_000u64, "providers": {"llama": "available"}}]});
    let url = fake_edge(
        vec![("/admin/v1/providers", 200, providers.to_string()), ("/admin/v1/nodes", 200, nodes.to_string())],
        false,
    )
    .await;
    let metrics = Metrics::new();
    let admin = AdminClient::new();
    let (p, n) = poll(&admin, &url, &metrics).await.unwrap();
    assert_eq!(p.providers[0].id, "llama");
    assert_eq!(n.nodes[0].phase, Some(SessionPhase::Ready));
    poll(&admin, &url, &metrics).await.unwrap();

    let url =
        fake_edge(vec![("/admin/v1/providers", 500, "{}".into()), ("/admin/v1/nodes", 200, nodes.to_string())], false)
            .await;
    assert!(matches!(poll(&admin, &url, &metrics).await, Err(AdminError::Status(500))));

    let url = fake_edge(
        vec![("/admin/v1/providers", 200, "[1,2".into()), ("/admin/v1/nodes", 200, nodes.to_string())],
        false,
    )
    .await;
    assert_eq!(poll(&admin, &url, &metrics).await.unwrap_err().label(), "decode");

    let url = fake_edge(vec![], true).await;
    let client = AdminClient::new().with_timeout(Duration::from_millis(200));
    assert!(matches!(poll(&client, &url, &metrics).await, Err(AdminError::Timeout(_))));

    // Nothing listening.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = closed.local_addr().unwrap().to_string();
    drop(closed);
    assert_eq!(poll(&admin, &EdgeAdminUrl { authority }, &metrics).await.unwrap_err().label(), "request");

    // One poll, one count, under `ok` or the error's label.
    let polls = |result: &str| value(&metrics, "iop_operator_mirror_polls_total", &[("result", result)]);
    let counted: Vec<(&str, f64)> =
        ["ok", "timeout", "request", "status", "body", "decode"].into_iter().map(|r| (r, polls(r))).collect();
    assert_eq!(
        counted,
        [("ok", 2.0), ("timeout", 1.0), ("request", 1.0), ("status", 1.0), ("body", 0.0), ("decode", 1.0)]
    );
}

fn stores(providers: Vec<Provider>, nodes: Vec<NodeCatalog>) -> Stores {
    let (p_store, mut p) = reflector::store();
    for o in providers {
        p.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(o))));
    }
    let (n_store, mut n) = reflector::store();
    for o in nodes {
        n.apply_watcher_event(&Event::Apply(DeserializeGuard(Ok(o))));
    }
    let (templates, _) = reflector::store();
    let (pods, _) = reflector::store();
    let (config_map, _) = reflector::store();
    let (namespace, _) = reflector::store();
    Stores { providers: p_store, nodes: n_store, templates, pods, config_map, namespace }
}

fn view(overlay: Option<Overlay>) -> EdgeView {
    let p = |id: &str| EdgeProvider {
        accepts_images: None,
        id: id.to_string(),
        node: "mac-1".to_string(),
        node_ready: true,
        on_trial: false,
        health: EdgeHealth::Available,
        overlay: None,
        prefill_ms_per_1k_tokens: None,
        credential: None,
        ejected_until: None,
        residency: None,
        last_load_seconds: None,
        learned_stall_ms: None,
        last_load_at: None,
        adapter: None,
        capacity: 4,
        consecutive_failures: 0,
        dispatchable: true,
        ejections: 0,
        in_flight: 0,
        model_memory: None,
        models: vec![],
        target_model: String::new(),
    };
    // The Edge's effective health follows its overlay here.
    let health = overlay.as_ref().map_or(EdgeHealth::Available, |o| o.state);
    EdgeView::one(
        "iop-edge-0",
        ProvidersSnapshot {
            providers: vec![EdgeProvider { overlay, health, ..p("llama") }, p("qwen")],
            ..Default::default()
        },
        NodesSnapshot {
            nodes: vec![EdgeNode {
                certificate_serial: None,
                name: "mac-1".to_string(),
                connected: true,
                phase: Some(SessionPhase::Ready),
                generation: Some(4),
                connected_at_ms: Some(1_793_534_000_000),
                version: Some("0.1.0".to_string()),
                command_sandbox: None,
                providers: Default::default(),
                sandbox_gaps: vec![],
                workspaces: Default::default(),
            }],
        },
    )
}

#[tokio::test]
async fn writes_only_what_changed_with_the_status_field_manager() {
    let now = crate::runtime::timestamp(NOW);
    let llama = provider("llama", "mac-1");
    // qwen already carries what the Edge says (written before a restart).
    let mut qwen = provider("qwen", "mac-1");
    qwen.status = Some(
        crate::mirror::ProviderMirror {
            health: Some(Health::Available),
            generation: Some(4),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
            ..Default::default()
        }
        .to_status(),
    );
    let mac = node("mac-1");
    let stores = stores(vec![llama.clone(), qwen], vec![mac.clone()]);
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let down = Overlay { state: EdgeHealth::Unavailable, generation: 4, sequence: 9, since_ms: 1_793_534_450_000 };

    let task = tokio::spawn(async move {
        let mut state = MirrorState::default();
        let first = write(&ctx, &stores, &view(None), &mut state, now).await;
        let unchanged = write(&ctx, &stores, &view(None), &mut state, now).await;
        let lowered = write(&ctx, &stores, &view(Some(down.clone())), &mut state, now).await;
        // Probed again, still down: a new sequence alone is not written.
        let probed = Overlay { sequence: 10, ..down };
        let reprobed = write(&ctx, &stores, &view(Some(probed)), &mut state, now).await;
        (first, unchanged, lowered, reprobed)
    });

    let call = server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), STATUS).await;
    assert_eq!(
        call.body,
        json!({"apiVersion": "iop.dev/v1alpha1", "kind": "Provider", "metadata": {"name": "llama"},
               "status": {"health": "available", "generation": 4, "lastTransitionTime": "2026-11-01T12:00:00Z"}})
    );
    call.ok(&llama);
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), STATUS).await;
    assert_eq!(
        call.body["status"],
        json!({"connected": true, "connectedReplicas": 1, "replicas": 1, "replicasSummary": "1/1", "generation": 4,
               "since": "2026-11-01T11:53:20Z", "version": "0.1.0",
               "conditions": [{"type": "WorkspacesReady", "status": "True", "reason": "Accepted",
                               "message": "no workspaces", "observedGeneration": 1,
                               "lastTransitionTime": "2026-11-01T12:00:00Z"}]})
    );
    call.ok(&mac);

    // Unchanged: nothing. Lowered by the overlay: only llama, at the overlay's time.
    let call = server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), STATUS).await;
    assert_eq!(
        call.body["status"],
        json!({"health": "unavailable", "classification": "provider_unhealthy", "lastObservationSequence": 9,
               "generation": 4, "lastTransitionTime": "2026-11-01T12:00:50Z"})
    );
    call.ok(&llama);

    let (first, unchanged, lowered, reprobed) = task.await.unwrap();
    assert_eq!(first, Round { written: 2, failed: 0 });
    assert_eq!(unchanged, Round::default());
    assert_eq!(lowered, Round { written: 1, failed: 0 });
    assert_eq!(reprobed, Round::default());
    server.done().await;
    assert_eq!(status_writes(&metrics, "provider", "mirror", "ok"), 2.0);
    assert_eq!(status_writes(&metrics, "nodecatalog", "mirror", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "ok"), 0.0, "the mirror's own writer label");
}

#[tokio::test(start_paused = true)]
async fn a_write_without_an_answer_times_out_is_counted_and_retried_next_round() {
    let now = crate::runtime::timestamp(NOW);
    let llama = provider("llama", "mac-1");
    let mac = node("mac-1");
    let stores = stores(vec![llama.clone()], vec![mac.clone()]);
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let started = tokio::time::Instant::now();
    let task = tokio::spawn(async move {
        let mut state = MirrorState::default();
        let first = write(&ctx, &stores, &view(None), &mut state, now).await;
        let second = write(&ctx, &stores, &view(None), &mut state, now).await;
        (first, second)
    });

    // The provider's write gets no answer: given up after the bound, the
    // node is still written.
    let unanswered = server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), STATUS).await;
    tokio::time::sleep(STATUS_WRITE_TIMEOUT).await;
    server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), STATUS).await.ok(&mac);
    // Not remembered as written: the next round writes it again (and only it).
    server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), STATUS).await.ok(&llama);
    let (first, second) = task.await.unwrap();
    assert_eq!(started.elapsed(), STATUS_WRITE_TIMEOUT);
    drop(unanswered);
    assert_eq!(first, Round { written: 1, failed: 1 });
    assert_eq!(second, Round { written: 1, failed: 0 });
    server.done().await;
    assert_eq!(status_writes(&metrics, "provider", "mirror", "timeout"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "mirror", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "nodecatalog", "mirror", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "mirror", "failed"), 0.0);
}

/// Every replica is polled at once at its pod IP and the admin port: one
/// answers, one refuses, one hangs (bounded by the client's timeout), one
/// has no IP yet (not polled). Only the answer counts; the others are
/// replicas that see nothing.
#[tokio::test]
async fn polls_every_replica_at_its_pod_ip_at_once() {
    let providers = json!({"providers": [{"id": "llama", "node": "mac-1", "node_ready": true, "health": "available"}]});
    let nodes = json!({"nodes": [{"name": "mac-1", "connected": true, "phase": "ready", "generation": 4}]});
    let routes = vec![("/admin/v1/providers", 200, providers.to_string()), ("/admin/v1/nodes", 200, nodes.to_string())];
    // Several loopback addresses, one port: as pod IPs with the one admin port.
    let answering = fake_edge_at("127.0.0.1:0", routes, false).await;
    let port: u16 = answering.authority.rsplit_once(':').unwrap().1.parse().unwrap();
    fake_edge_at(&format!("127.0.0.3:{port}"), vec![], true).await;
    let replica = |id: &str, ip: Option<&str>| Replica { id: id.to_string(), ip: ip.map(|ip| ip.parse().unwrap()) };
    let replicas = [
        replica("edge-a", Some("127.0.0.1")),
        replica("edge-b", Some("127.0.0.2")),
        replica("edge-c", Some("127.0.0.3")),
        replica("edge-d", None),
    ];
    let metrics = Metrics::new();
    let admin = AdminClient::new().with_timeout(Duration::from_millis(500));
    let started = std::time::Instant::now();
    let edge = poll_all(&admin, &replicas, port, &metrics).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "at once, not one after the other: {:?}",
        started.elapsed()
    );
    let answered: Vec<(&str, bool)> = edge.replicas.iter().map(|(id, a)| (id.as_str(), a.is_some())).collect();
    assert_eq!(answered, [("edge-a", true), ("edge-b", false), ("edge-c", false), ("edge-d", false)]);
    assert_eq!(edge.replicas["edge-a"].as_ref().unwrap().0.providers[0].id, "llama");
    let polls = |result: &str| value(&metrics, "iop_operator_mirror_polls_total", &[("result", result)]);
    assert_eq!((polls("ok"), polls("request"), polls("timeout")), (1.0, 1.0, 1.0), "one poll per replica with an IP");

    // One answering replica of four: the node is connected to 1 of 4.
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let mac = node("mac-1");
    let stores = stores(vec![], vec![mac.clone()]);
    let task = tokio::spawn(async move {
        write(&ctx, &stores, &edge, &mut MirrorState::default(), crate::runtime::timestamp(NOW)).await
    });
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), STATUS).await;
    assert_eq!(
        (&call.body["status"]["connected"], &call.body["status"]["replicasSummary"], &call.body["status"]["replicas"]),
        (&json!(true), &json!("1/4"), &json!(4))
    );
    call.ok(&mac);
    assert_eq!(task.await.unwrap(), Round { written: 1, failed: 0 });
    server.done().await;
}

/// Issue 43 item 6: what the mirror wrote stands for the object only while
/// the cache shows the object as it was just before or just after that
/// write; once another writer moved it, the object's own status counts (so
/// a hand edit is corrected at the next poll).
#[test]
fn a_remembered_write_counts_only_until_someone_else_writes() {
    let written = Written { value: 1, versions: vec![Some("10".to_string()), Some("11".to_string())] };
    let v = |s: &str| Some(s.to_string());
    assert_eq!(Written::current(Some(&written), &v("10"), || 7), 1, "the cache has not seen the write yet");
    assert_eq!(Written::current(Some(&written), &v("11"), || 7), 1, "the cache has seen the write");
    assert_eq!(Written::current(Some(&written), &v("12"), || 7), 7, "someone wrote since");
    assert_eq!(Written::current(None, &v("10"), || 7), 7, "never written by this process");
}

/// Status has one writer (issue 43 item 6): a mirror field someone else set
/// (`kubectl patch --subresource=status`, its own field manager) survives
/// a server-side apply that leaves it out, so the mirror removes it with a
/// merge patch right after the apply; a condition goes through the list,
/// guarded by the resourceVersion the apply returned. Then nothing more.
#[tokio::test]
async fn fields_another_manager_set_are_removed_after_the_apply() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    let now = crate::runtime::timestamp(NOW);
    let condition = |type_: &str, status: &str, reason: &str| Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    };
    // A hand edit: health and a classification the mirror does not set.
    let mut llama = provider("llama", "mac-1");
    llama.metadata.resource_version = Some("10".into());
    llama.status = Some(crate::crd::ProviderStatus {
        health: Some(Health::Unavailable),
        classification: Some(crate::crd::provider::Classification::ProviderUnhealthy),
        ..Default::default()
    });
    // A BundleCurrent beside reconcile's Ready, while no certificate is issued.
    let mut mac = node("mac-1");
    mac.metadata.resource_version = Some("20".into());
    let ready = condition("Ready", "True", "Accepted");
    mac.status = Some(crate::crd::NodeCatalogStatus {
        conditions: vec![ready.clone(), condition("BundleCurrent", "True", "Current")],
        ..Default::default()
    });
    let stores = stores(vec![llama.clone()], vec![mac.clone()]);
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let task = tokio::spawn(async move {
        let mut state = MirrorState::default();
        let first = write(&ctx, &stores, &view(None), &mut state, now).await;
        let again = write(&ctx, &stores, &view(None), &mut state, now).await;
        (first, again)
    });

    let path = format!("{CRD_PATH}/providers/llama/status");
    let call = server.expect_apply(&path, STATUS).await;
    assert_eq!(call.body["status"]["health"], "available");
    assert!(call.body["status"].get("classification").is_none());
    // The API server keeps the other manager's classification.
    let mut applied = llama.clone();
    applied.metadata.resource_version = Some("11".into());
    applied.status.as_mut().unwrap().health = Some(Health::Available);
    call.ok(&applied);
    let call = server.expect_merge(&path, STATUS).await;
    assert_eq!(call.body, json!({"status": {"classification": null}}));
    let mut cleaned = applied.clone();
    cleaned.metadata.resource_version = Some("12".into());
    cleaned.status.as_mut().unwrap().classification = None;
    call.ok(&cleaned);

    let path = format!("{CRD_PATH}/nodecatalogs/mac-1/status");
    let call = server.expect_apply(&path, STATUS).await;
    let types: Vec<&str> =
        call.body["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["WorkspacesReady"]);
    let mut applied = mac.clone();
    applied.metadata.resource_version = Some("21".into());
    let status = applied.status.as_mut().unwrap();
    status.conditions.push(condition("WorkspacesReady", "True", "Accepted"));
    call.ok(&applied);
    let call = server.expect_merge(&path, STATUS).await;
    let kept: Vec<&str> =
        call.body["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(kept, ["Ready", "WorkspacesReady"], "the list without BundleCurrent, the others as they are");
    assert_eq!(call.body["metadata"], json!({"resourceVersion": "21"}));
    assert_eq!(call.body["status"]["conditions"][0], serde_json::to_value(&ready).unwrap());
    let mut cleaned = applied.clone();
    cleaned.metadata.resource_version = Some("22".into());
    cleaned.status.as_mut().unwrap().conditions.remove(1);
    call.ok(&cleaned);

    let (first, again) = task.await.unwrap();
    assert_eq!(first, Round { written: 2, failed: 0 });
    assert_eq!(again, Round::default(), "the cache still shows the versions before: the written values count");
    server.done().await;
    assert_eq!(status_writes(&metrics, "provider", "mirror", "ok"), 2.0);
    assert_eq!(status_writes(&metrics, "nodecatalog", "mirror", "ok"), 2.0);
}

/// The cache shows the object after the apply but before the removal (the
/// watch is between the two): it counts as written, not as a stranger's edit.
#[tokio::test]
async fn the_version_between_the_apply_and_the_removal_counts_as_written() {
    let now = crate::runtime::timestamp(NOW);
    let mut llama = provider("llama", "mac-1");
    llama.metadata.resource_version = Some("10".into());
    llama.status = Some(crate::crd::ProviderStatus {
        health: Some(Health::Available),
        classification: Some(crate::crd::provider::Classification::ProviderUnhealthy),
        ..Default::default()
    });
    let mut between = llama.clone();
    between.metadata.resource_version = Some("11".into());
    between.status.as_mut().unwrap().generation = Some(4);
    between.status.as_mut().unwrap().last_transition_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let task = {
        let (llama, between) = (llama.clone(), between.clone());
        tokio::spawn(async move {
            let mut state = MirrorState::default();
            let first = write(&ctx, &stores(vec![llama], vec![]), &view(None), &mut state, now).await;
            let again = write(&ctx, &stores(vec![between], vec![]), &view(None), &mut state, now).await;
            (first, again)
        })
    };
    let path = format!("{CRD_PATH}/providers/llama/status");
    server.expect_apply(&path, STATUS).await.ok(&between);
    let mut cleaned = between.clone();
    cleaned.metadata.resource_version = Some("12".into());
    cleaned.status.as_mut().unwrap().classification = None;
    server.expect_merge(&path, STATUS).await.ok(&cleaned);
    let (first, again) = task.await.unwrap();
    assert_eq!((first, again), (Round { written: 1, failed: 0 }, Round::default()));
    server.done().await;
}
