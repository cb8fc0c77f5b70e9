//! Scenarios of one namespace reconcile against the mocked API: the exact
//! requests, in order.

use std::collections::BTreeMap;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use iop_proto::identity::NodeIdentity;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

use super::*;
use crate::certs::secrets::{EDGE_RENEW_BEFORE, ca_secret, edge_tls_secret, node_secret};
use crate::certs::status::CaExpiry;
use crate::certs::{self, Authority, Ca, inspect};
use crate::crd::node_catalog::CertificateStatus;
use crate::reconcile::fixtures::{node, provider, settings, snapshot};
use crate::reconcile::{CONFIG_KEY, Snapshot};
use crate::runtime::metrics::Metrics;
use crate::runtime::tests::{ApiServer, Call, EDGE_NAMES, NOW, context, mock, samples, status_writes, value};

const DAY: Duration = Duration::from_secs(86_400);
const CRD_PATH: &str = "/apis/iop.dev/v1alpha1/namespaces/iop";
const CORE_PATH: &str = "/api/v1/namespaces/iop";
const CONFIG: &str = "iop-operator/config";

/// The reconcile's config writes: it reads its credentials Secret (absent
/// here), applies it, then applies the ConfigMap (returned, unanswered).
async fn expect_config_apply(server: &mut ApiServer) -> Call {
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-credentials"), &[]).await.not_found();
    let secret = server.expect_apply(&format!("{CORE_PATH}/secrets/iop-edge-credentials"), CONFIG).await;
    assert_eq!(secret.body["data"], serde_json::json!({}), "no managed credentials in these tests");
    secret.echo();
    server.expect_apply(&format!("{CORE_PATH}/configmaps/iop-edge-config"), CONFIG).await
}
const CERTS: &str = "iop-operator/certs";

fn with_rv<K: kube::Resource>(mut object: K, rv: &str) -> K {
    object.meta_mut().resource_version = Some(rv.to_string());
    object
}

/// The objects as they are after earlier reconciles: finalizers on live
/// nodes and the conditions the build computes.
fn settle(s: &mut Snapshot, now: OffsetDateTime) {
    let prepared = reconcile::build(s, &settings(), timestamp(now)).unwrap();
    for n in &mut s.nodes {
        if n.metadata.deletion_timestamp.is_none() {
            n.metadata.finalizers = Some(vec![NODE_FINALIZER.to_string()]);
        }
        let u = prepared.nodes.iter().find(|u| u.name == n.name_any()).unwrap();
        let status = n.status.get_or_insert_with(Default::default);
        status.conditions = u.status.conditions.clone();
        status.observed_generation = u.status.observed_generation;
    }
    for p in &mut s.providers {
        let u = prepared.providers.iter().find(|u| u.name == p.name_any()).unwrap();
        let status = p.status.get_or_insert_with(Default::default);
        status.conditions = u.status.conditions.clone();
        status.observed_generation = u.status.observed_generation;
        status.public_models = u.status.public_models.clone();
    }
}

/// A CA with its Secret, the Edge Secret, and issued node Secrets; the
/// nodes' `status.certificate` is set to match.
struct Pki {
    ca_secret: Secret,
    edge_secret: Secret,
    node_secrets: BTreeMap<String, Secret>,
}

fn pki(s: &mut Snapshot, now: OffsetDateTime) -> Pki {
    let authority = Authority::single(Ca::generate("test CA", now, 3650 * DAY).unwrap());
    let ca = &authority.signer;
    let names: Vec<String> = EDGE_NAMES.iter().map(|n| n.to_string()).collect();
    let edge = ca.edge_server_cert(&names, now, 90 * DAY).unwrap();
    let mut node_secrets = BTreeMap::new();
    for n in &mut s.nodes {
        let id = NodeIdentity::new("iop.example", n.name_any()).unwrap();
        let cert = ca.node_client_cert(&id, now, 30 * DAY).unwrap();
        let info = inspect(&cert.cert_pem).unwrap();
        let status = n.status.get_or_insert_with(Default::default);
        status.certificate =
            Some(CertificateStatus { serial: info.serial, not_after: Time(timestamp(info.not_after)) });
        let expiry = CaExpiry { not_after: ca.not_after(), window: EDGE_RENEW_BEFORE };
        status.conditions.push(expiry.condition(&status.conditions, now, timestamp(now)));
        node_secrets.insert(n.name_any(), node_secret(NS, n, &authority, &cert));
    }
    Pki { ca_secret: ca_secret(NS, ca), edge_secret: edge_tls_secret(NS, &authority, &edge), node_secrets }
}

fn secret_value(body: &Value, key: &str) -> String {
    let secret: Secret = serde_json::from_value(body.clone()).unwrap();
    certs::secrets::value(&secret, key).unwrap_or_else(|| panic!("no `{key}` in the Secret"))
}

fn edge_yaml(body: &Value) -> EdgeConfig {
    assert_eq!(body["kind"], "ConfigMap");
    assert_eq!(body["metadata"]["name"], CONFIG_MAP_NAME);
    EdgeConfig::from_yaml(body["data"][CONFIG_KEY].as_str().expect("edge.yaml")).unwrap()
}

fn names(config: &EdgeConfig) -> (Vec<&str>, Vec<&str>) {
    (config.nodes.iter().map(|n| n.name.as_str()).collect(), config.providers.iter().map(|p| p.id.as_str()).collect())
}

const NS: &str = crate::reconcile::fixtures::NS;

fn spawn(ctx: Context, s: Snapshot, now: OffsetDateTime) -> tokio::task::JoinHandle<Result<(), Error>> {
    tokio::spawn(async move { reconcile(&ctx, Read { snapshot: s, undecodable: Vec::new() }, now).await })
}

/// Serves the certificate stage when every Secret exists and is current.
async fn serve_current_certs(server: &mut ApiServer, pki: &Pki, nodes: &[&str]) {
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&pki.ca_secret);
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&pki.edge_secret);
    for n in nodes {
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-{n}"), &[]).await.ok(&pki.node_secrets[*n]);
    }
}

#[tokio::test]
async fn a_new_namespace_gets_config_status_ca_and_certificates_and_an_unchanged_one_only_the_config() {
    let llama = with_rv(provider("llama", "mac-1"), "3");
    let mac = with_rv(node("mac-1"), "4");
    let s = snapshot(vec![llama.clone()], vec![mac.clone()], vec![]);
    let expected = reconcile::build(&s, &settings(), timestamp(NOW)).unwrap();

    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let task = spawn(ctx, s.clone(), NOW);

    // 1. The finalizer, guarded by the resourceVersion read.
    let call = server.expect_merge(&format!("{CRD_PATH}/nodecatalogs/mac-1"), CONFIG).await;
    assert_eq!(call.body, json!({"metadata": {"resourceVersion": "4", "finalizers": [NODE_FINALIZER]}}));
    call.ok(&mac);

    // 2. The ConfigMap: server-side apply, forced, by iop-operator/config.
    let call = expect_config_apply(&mut server).await;
    assert_eq!(call.body["data"][CONFIG_KEY], expected.config_map.data.as_ref().unwrap()[CONFIG_KEY]);
    assert_eq!(names(&edge_yaml(&call.body)), (vec!["mac-1"], vec!["llama"]));
    call.echo();

    // 3. Conditions, on the status subresource, only the reconcile's fields.
    let call = server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), CONFIG).await;
    assert_eq!(
        call.body,
        json!({"apiVersion": "iop.dev/v1alpha1", "kind": "Provider", "metadata": {"name": "llama"},
               "status": {"observedGeneration": 1, "conditions": [{
                   "type": "Ready", "status": "True", "reason": "Accepted",
                   "message": "rendered into the Edge config", "observedGeneration": 1,
                   "lastTransitionTime": "2026-11-01T12:00:00Z"}],
               "publicModels": "llama3.2"}})
    );
    let provider_status = call.body["status"].clone();
    call.ok(&llama);
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CONFIG).await;
    let node_conditions = call.body["status"].clone();
    assert_eq!(
        node_conditions["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["Ready"],
        "WorkspacesReady is the status mirror's"
    );
    call.ok(&mac);

    // 4. No CA yet: one is generated and created (POST), never applied.
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.not_found();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.not_found();
    let call = server.expect("POST", &format!("{CORE_PATH}/secrets"), &[("fieldManager", CERTS)]).await;
    assert_eq!(call.body["metadata"]["name"], "iop-ca");
    let ca_pem = secret_value(&call.body, "ca.pem");
    assert!(secret_value(&call.body, "ca-key.pem").contains("PRIVATE KEY"));
    let ca_body = call.body.clone();
    call.respond(201, ca_body.clone());

    // 5. The Edge server certificate, for the configured names.
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.not_found();
    let call = server.expect_apply(&format!("{CORE_PATH}/secrets/iop-edge-tls"), CERTS).await;
    assert_eq!(secret_value(&call.body, "ca.pem"), ca_pem);
    assert!(secret_value(&call.body, "edge.pem").contains("CERTIFICATE"));
    assert!(secret_value(&call.body, "edge-key.pem").contains("PRIVATE KEY"));
    let edge_body = call.body.clone();
    call.echo();

    // 6. The node's certificate Secret, owned by its NodeCatalog, then its serial and expiry.
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.not_found();
    let call = server.expect_apply(&format!("{CORE_PATH}/secrets/iop-node-mac-1"), CERTS).await;
    assert_eq!(call.body["metadata"]["ownerReferences"][0]["kind"], "NodeCatalog");
    assert_eq!(call.body["metadata"]["ownerReferences"][0]["uid"], "uid-mac-1");
    assert_eq!(secret_value(&call.body, "ca.pem"), ca_pem);
    let node_pem = secret_value(&call.body, "node.pem");
    let info = inspect(&node_pem).unwrap();
    assert_eq!(info.not_after, NOW + 30 * DAY, "validityHours default: 720");
    let node_body = call.body.clone();
    call.echo();
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CERTS).await;
    assert_eq!(
        call.body["status"],
        json!({
            "certificate": {"serial": info.serial, "notAfter": "2026-12-01T12:00:00Z"},
            "conditions": [{"type": "CAExpiring", "status": "False", "reason": "Valid",
                            "message": "the CA in Secret iop-ca is valid until 2036-10-29T12:00:00Z",
                            "lastTransitionTime": "2026-11-01T12:00:00Z"}],
        }),
        "only the certificate fields, by iop-operator/certs"
    );
    let certificate = call.body["status"]["certificate"].clone();
    let ca_condition = call.body["status"]["conditions"][0].clone();
    call.ok(&mac);

    task.await.unwrap().unwrap();
    server.done().await;
    // Counted: each status write by its writer, each issued certificate.
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "nodecatalog", "reconcile", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "nodecatalog", "certs", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "workspacetemplate", "reconcile", "ok"), 0.0);
    for kind in ["ca", "edge", "node"] {
        assert_eq!(value(&metrics, "iop_operator_certificates_issued_total", &[("kind", kind)]), 1.0, "{kind}");
    }

    // Next reconcile, unchanged objects (now carrying what was written), one
    // second before the node certificate's rotation window: the config is
    // applied again (a no-op for the API server), the CA is loaded, and no
    // status is written and nothing is issued.
    let mut llama = llama;
    llama.status = Some(serde_json::from_value(provider_status).unwrap());
    let mut mac = mac;
    mac.metadata.finalizers = Some(vec![NODE_FINALIZER.to_string()]);
    let mut status: crate::crd::NodeCatalogStatus = serde_json::from_value(node_conditions).unwrap();
    status.certificate = Some(serde_json::from_value(certificate).unwrap());
    status.conditions.push(serde_json::from_value(ca_condition).unwrap());
    mac.status = Some(status);
    let s = snapshot(vec![llama], vec![mac], vec![]);
    let later = NOW + 20 * DAY - Duration::from_secs(1);

    let (client, mut server) = mock();
    let ctx = context(client, later);
    let metrics = ctx.metrics.clone();
    let task = spawn(ctx, s.clone(), later);
    expect_config_apply(&mut server).await.echo();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.respond(200, ca_body.clone());
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.respond(200, edge_body.clone());
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.respond(200, node_body.clone());
    task.await.unwrap().unwrap();
    server.done().await;
    // Nothing changed: nothing written, nothing issued, nothing counted.
    assert!(
        samples(&metrics.encode()).iter().filter(|s| s.name.ends_with("_total")).all(|s| s.value == 0.0),
        "{}",
        metrics.encode()
    );

    // At the window: a new certificate, and the new serial in status.
    let at_window = NOW + 20 * DAY;
    let (client, mut server) = mock();
    let task = spawn(context(client, at_window), s, at_window);
    expect_config_apply(&mut server).await.echo();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.respond(200, ca_body);
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.respond(200, edge_body);
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.respond(200, node_body);
    let call = server.expect_apply(&format!("{CORE_PATH}/secrets/iop-node-mac-1"), CERTS).await;
    let renewed = inspect(&secret_value(&call.body, "node.pem")).unwrap();
    assert_ne!(renewed.serial, info.serial);
    assert_eq!(renewed.not_after, at_window + 30 * DAY);
    assert_eq!(secret_value(&call.body, "ca.pem"), ca_pem, "same CA");
    call.echo();
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CERTS).await;
    assert_eq!(call.body["status"]["certificate"]["serial"], renewed.serial.as_str());
    assert_eq!(call.body["status"]["conditions"][0]["lastTransitionTime"], "2026-11-01T12:00:00Z", "not flipped");
    call.respond(200, serde_json::to_value(node("mac-1")).unwrap());
    task.await.unwrap().unwrap();
    server.done().await;
}

#[tokio::test]
async fn a_deleted_node_leaves_the_config_before_its_finalizer_is_removed() {
    let mut s = snapshot(
        vec![provider("llama", "mac-1"), provider("qwen", "mac-2")],
        vec![with_rv(node("mac-1"), "7"), with_rv(node("mac-2"), "8")],
        vec![],
    );
    settle(&mut s, NOW - DAY);
    let pki = pki(&mut s, NOW - DAY);
    // Someone deletes mac-1; another controller's finalizer is on it too.
    let gone = &mut s.nodes[0];
    gone.metadata.deletion_timestamp = Some(Time(timestamp(NOW)));
    gone.metadata.finalizers = Some(vec!["example.com/other".to_string(), NODE_FINALIZER.to_string()]);

    let (client, mut server) = mock();
    let task = spawn(context(client, NOW), s.clone(), NOW);

    // The config no longer lists mac-1 (nor its provider)...
    let call = expect_config_apply(&mut server).await;
    assert_eq!(names(&edge_yaml(&call.body)), (vec!["mac-2"], vec!["qwen"]));
    call.echo();
    // ...its provider says why (qwen and mac-2 are unchanged: no writes)...
    let call = server.expect_apply(&format!("{CRD_PATH}/providers/llama/status"), CONFIG).await;
    let ready = &call.body["status"]["conditions"][0];
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("NodeNotFound")));
    call.ok(&s.providers[0]);
    // ...and only then is the finalizer removed, keeping the other one.
    let call = server.expect_merge(&format!("{CRD_PATH}/nodecatalogs/mac-1"), CONFIG).await;
    assert_eq!(call.body, json!({"metadata": {"resourceVersion": "7", "finalizers": ["example.com/other"]}}));
    call.ok(&s.nodes[0]);
    // The remaining node's certificate is current.
    serve_current_certs(&mut server, &pki, &["mac-2"]).await;

    task.await.unwrap().unwrap();
    server.done().await;
}

#[tokio::test]
async fn an_undecodable_node_being_deleted_is_released_and_the_rest_reconciles() {
    let mut s = snapshot(vec![], vec![node("mac-2")], vec![]);
    settle(&mut s, NOW);
    let pki = pki(&mut s, NOW);
    let broken = Undecodable {
        kind: Kind::NodeCatalog,
        metadata: ObjectMeta {
            name: Some("broken".to_string()),
            resource_version: Some("9".to_string()),
            deletion_timestamp: Some(Time(timestamp(NOW))),
            finalizers: Some(vec![NODE_FINALIZER.to_string()]),
            ..Default::default()
        },
        error: "spec.certificate.validityHours: invalid type".to_string(),
    };

    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let task = tokio::spawn(async move { reconcile(&ctx, Read { snapshot: s, undecodable: vec![broken] }, NOW).await });
    let call = expect_config_apply(&mut server).await;
    assert_eq!(names(&edge_yaml(&call.body)).0, ["mac-2"]);
    call.echo();
    let call = server.expect_merge(&format!("{CRD_PATH}/nodecatalogs/broken"), CONFIG).await;
    assert_eq!(call.body, json!({"metadata": {"resourceVersion": "9", "finalizers": []}}));
    call.respond(200, serde_json::to_value(node("broken")).unwrap());
    serve_current_certs(&mut server, &pki, &["mac-2"]).await;
    task.await.unwrap().unwrap();
    server.done().await;
}

/// A CA that expires sooner than the renewal windows (a user-supplied CA
/// valid 5 days): the certificates it issued end with it. Reconciles issue
/// nothing (they used to re-issue the Edge and node certificates every time,
/// and each node status write triggered the next reconcile: ~2 issues/s);
/// the `CAExpiring` condition is written once and the gauge says it.
#[tokio::test]
async fn a_ca_ending_inside_the_renewal_window_issues_nothing_and_says_so_once() {
    let mut s = snapshot(vec![], vec![node("mac-1")], vec![]);
    settle(&mut s, NOW);
    let authority = Authority::single(Ca::generate("user CA", NOW, 5 * DAY).unwrap());
    let ca = &authority.signer;
    let edge_names: Vec<String> = EDGE_NAMES.iter().map(|n| n.to_string()).collect();
    let edge_secret = edge_tls_secret(NS, &authority, &ca.edge_server_cert(&edge_names, NOW, 90 * DAY).unwrap());
    let id = NodeIdentity::new("iop.example", "mac-1").unwrap();
    let cert = ca.node_client_cert(&id, NOW, 30 * DAY).unwrap();
    let info = inspect(&cert.cert_pem).unwrap();
    assert_eq!(info.not_after, ca.not_after(), "cut short at the CA's end");
    let node_secret = node_secret(NS, &s.nodes[0], &authority, &cert);
    s.nodes[0].status.as_mut().unwrap().certificate =
        Some(CertificateStatus { serial: info.serial.clone(), not_after: Time(timestamp(info.not_after)) });

    let later = NOW + DAY;
    let (client, mut server) = mock();
    let ctx = context(client, later);
    let metrics = ctx.metrics.clone();
    let task = spawn(ctx, s.clone(), later);
    expect_config_apply(&mut server).await.echo();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&ca_secret(NS, ca));
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&edge_secret);
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.ok(&node_secret);
    // Nothing issued; only the condition, by the certificate writer.
    let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CERTS).await;
    assert_eq!(call.body["status"]["certificate"]["serial"], info.serial.as_str());
    let condition = call.body["status"]["conditions"][0].clone();
    assert_eq!(
        (&condition["type"], &condition["status"], &condition["reason"]),
        (&json!("CAExpiring"), &json!("True"), &json!("WithinRenewalWindow"))
    );
    assert_eq!(condition["lastTransitionTime"], "2026-11-02T12:00:00Z");
    call.ok(&s.nodes[0]);
    task.await.unwrap().unwrap();
    server.done().await;
    for kind in ["ca", "edge", "node"] {
        assert_eq!(value(&metrics, "iop_operator_certificates_issued_total", &[("kind", kind)]), 0.0, "{kind}");
    }
    assert_eq!(value(&metrics, "iop_operator_ca_expiring", &[]), 1.0);
    assert_eq!(
        value(&metrics, "iop_operator_ca_expiry_timestamp_seconds", &[]),
        ca.not_after().unix_timestamp() as f64
    );

    // The next reconcile, the condition in status: no write at all.
    s.nodes[0].status.as_mut().unwrap().conditions.push(serde_json::from_value(condition).unwrap());
    let even_later = NOW + 2 * DAY;
    let (client, mut server) = mock();
    let task = spawn(context(client, even_later), s, even_later);
    expect_config_apply(&mut server).await.echo();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&ca_secret(NS, ca));
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&edge_secret);
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.ok(&node_secret);
    task.await.unwrap().unwrap();
    server.done().await;
}

#[tokio::test]
async fn a_ca_create_race_loads_the_winner_and_a_bad_ca_secret_fails_without_touching_it() {
    let (client, mut server) = mock();
    let secrets: Api<Secret> = Api::namespaced(client, NS);
    let winner = Ca::generate("winner", NOW, 3650 * DAY).unwrap();
    let winner_secret = ca_secret(NS, &winner);
    let task = tokio::spawn({
        let secrets = secrets.clone();
        async move { pki::ensure_ca(&secrets, NS, &Metrics::new(), NOW).await.map(|ca| ca.signer.cert_pem().to_string()) }
    });
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.not_found();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.not_found();
    server.expect("POST", &format!("{CORE_PATH}/secrets"), &[("fieldManager", CERTS)]).await.conflict();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&winner_secret);
    assert_eq!(task.await.unwrap().unwrap(), winner.cert_pem());

    // A user-supplied CA that is not usable: an error, and no write.
    let mut bad = winner_secret;
    bad.data.as_mut().unwrap().remove("ca-key.pem");
    let task = tokio::spawn(async move { pki::ensure_ca(&secrets, NS, &Metrics::new(), NOW).await.map(|_| ()) });
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&bad);
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(e.label(), "ca_secret");
    assert!(e.to_string().contains("iop-ca"), "{e}");
    server.done().await;
}

/// Issue 43 D4: `iop-ca` deleted after the install (to be replaced, or by
/// mistake): the operator makes no CA of its own, which would win the race
/// against the user's `kubectl create` and cut off every node; it says what
/// to do instead and writes nothing.
#[tokio::test]
async fn a_deleted_ca_is_not_replaced_by_one_of_the_operators() {
    let (client, mut server) = mock();
    let secrets: Api<Secret> = Api::namespaced(client, NS);
    let mut s = snapshot(vec![], vec![node("mac-1")], vec![]);
    let issued = pki(&mut s, NOW);
    let task = tokio::spawn(async move { pki::ensure_ca(&secrets, NS, &Metrics::new(), NOW).await.map(|_| ()) });
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.not_found();
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&issued.edge_secret);
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(e.label(), "ca_missing");
    assert!(e.to_string().contains("Restore `iop-ca`"), "{e}");
    server.done().await;
}

#[tokio::test]
async fn a_failed_status_write_does_not_stop_the_rest_and_fails_the_reconcile() {
    let s = snapshot(vec![provider("a", "mac-1"), provider("b", "mac-1")], vec![node("mac-1")], vec![]);
    let mut settled = s.clone();
    settle(&mut settled, NOW);
    let pki = pki(&mut settled, NOW);
    // Status not written yet for the providers.
    for p in &mut settled.providers {
        p.status = None;
    }
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let task = tokio::spawn({
        let read = Read { snapshot: settled.clone(), undecodable: Vec::new() };
        async move { reconcile_with_timeout(&ctx, read).await }
    });
    expect_config_apply(&mut server).await.echo();
    server.expect_apply(&format!("{CRD_PATH}/providers/a/status"), CONFIG).await.fail(500, "InternalError");
    server.expect_apply(&format!("{CRD_PATH}/providers/b/status"), CONFIG).await.ok(&settled.providers[1]);
    serve_current_certs(&mut server, &pki, &["mac-1"]).await;
    let e = task.await.unwrap().unwrap_err();
    assert_eq!(e.label(), "kube");
    server.done().await;
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "failed"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "ok"), 1.0);
    assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", "failed")]), 1.0);
    assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", "ok")]), 0.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_count", &[]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_status_write_without_an_answer_times_out_is_counted_and_the_rest_goes_on() {
    let s = snapshot(vec![provider("a", "mac-1"), provider("b", "mac-1")], vec![node("mac-1")], vec![]);
    let mut settled = s.clone();
    settle(&mut settled, NOW);
    let pki = pki(&mut settled, NOW);
    for p in &mut settled.providers {
        p.status = None;
    }
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let started = tokio::time::Instant::now();
    let task = tokio::spawn({
        let read = Read { snapshot: settled.clone(), undecodable: Vec::new() };
        async move { reconcile_with_timeout(&ctx, read).await }
    });
    expect_config_apply(&mut server).await.echo();
    // The API server takes the write and never answers.
    let unanswered = server.expect_apply(&format!("{CRD_PATH}/providers/a/status"), CONFIG).await;
    tokio::time::sleep(STATUS_WRITE_TIMEOUT).await;
    // Given up after the bound: the next object is written.
    server.expect_apply(&format!("{CRD_PATH}/providers/b/status"), CONFIG).await.ok(&settled.providers[1]);
    serve_current_certs(&mut server, &pki, &["mac-1"]).await;
    let e = task.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Timeout(d) if d == STATUS_WRITE_TIMEOUT), "{e}");
    assert_eq!(started.elapsed(), STATUS_WRITE_TIMEOUT);
    drop(unanswered);
    server.done().await;

    assert_eq!(status_writes(&metrics, "provider", "reconcile", "timeout"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "failed"), 0.0);
    assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", "timeout")]), 1.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_sum", &[]), 10.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_bucket", &[("le", "12.8")]), 1.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_bucket", &[("le", "6.4")]), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_over_its_bound_is_counted_as_a_timeout_with_its_abandoned_write() {
    let mut s = snapshot(vec![provider("a", "mac-1")], vec![node("mac-1")], vec![]);
    settle(&mut s, NOW);
    s.providers[0].status = None;
    let (client, mut server) = mock();
    let ctx = context(client, NOW);
    let metrics = ctx.metrics.clone();
    let task = tokio::spawn({
        let read = Read { snapshot: s.clone(), undecodable: Vec::new() };
        async move { reconcile_with_timeout(&ctx, read).await }
    });
    // The ConfigMap apply takes 55 s; the status write is cut off by the
    // reconcile's own bound (60 s) before its 10 s are up.
    let apply = expect_config_apply(&mut server).await;
    tokio::time::sleep(Duration::from_secs(55)).await;
    apply.echo();
    let unanswered = server.expect_apply(&format!("{CRD_PATH}/providers/a/status"), CONFIG).await;
    let e = task.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Timeout(d) if d == RECONCILE_TIMEOUT), "{e}");
    drop(unanswered);
    assert_eq!(status_writes(&metrics, "provider", "reconcile", "timeout"), 1.0, "abandoned counts as timeout");
    assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", "timeout")]), 1.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_sum", &[]), 60.0);
}

#[tokio::test]
async fn node_bundle_reads_the_node_secret() {
    let mut s = snapshot(vec![], vec![node("mac-1")], vec![]);
    let pki = pki(&mut s, NOW);
    let (client, mut server) = mock();
    let task = tokio::spawn({
        let client = client.clone();
        async move { pki::read_node_secret(client, NS, "mac-1").await }
    });
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.ok(&pki.node_secrets["mac-1"]);
    let (ca, cert, key) = task.await.unwrap().unwrap();
    assert_eq!(ca, secret_value(&serde_json::to_value(&pki.ca_secret).unwrap(), "ca.pem"));
    assert!(cert.contains("CERTIFICATE") && key.expose().contains("PRIVATE KEY"));

    let task = tokio::spawn(async move { pki::read_node_secret(client, NS, "mac-2").await });
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-2"), &[]).await.not_found();
    let e = task.await.unwrap().unwrap_err();
    assert!(e.contains("iop/iop-node-mac-2 does not exist") && e.contains("NodeCatalog `mac-2`"), "{e}");
    server.done().await;
}

/// A Secret named `iop-node-<name>` that the operator did not make (here a
/// user's, without its labels and owner) is never overwritten: no apply on
/// it, `CertificateIssued=False`/`SecretNotOwned` on the NodeCatalog, and no
/// `status.certificate`. Once it is gone, the certificate is issued and the
/// condition removed.
#[tokio::test]
async fn a_node_secret_the_operator_did_not_create_is_never_overwritten() {
    let mut s = snapshot(vec![], vec![node("mac-1")], vec![]);
    settle(&mut s, NOW);
    let pki = pki(&mut s, NOW);
    s.nodes[0].status.as_mut().unwrap().certificate = None;
    let foreign = Secret {
        metadata: ObjectMeta { name: Some("iop-node-mac-1".into()), ..Default::default() },
        data: Some([("token".to_string(), k8s_openapi::ByteString(b"someone else's".to_vec()))].into()),
        ..Default::default()
    };
    // Labels copied by hand without the owner reference: still not ours.
    let mut copied_labels = pki.node_secrets["mac-1"].clone();
    copied_labels.metadata.owner_references = None;

    for existing in [foreign, copied_labels] {
        let (client, mut server) = mock();
        let task = spawn(context(client, NOW), s.clone(), NOW);
        expect_config_apply(&mut server).await.echo();
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&pki.ca_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&pki.edge_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.ok(&existing);
        // No PATCH of the Secret: straight to the status.
        let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CERTS).await;
        assert_eq!(call.body["status"].get("certificate"), None, "no certificate vouched for");
        let conditions = call.body["status"]["conditions"].as_array().unwrap().clone();
        let refused = conditions.iter().find(|c| c["type"] == "CertificateIssued").expect("the condition");
        assert_eq!((&refused["status"], &refused["reason"]), (&json!("False"), &json!("SecretNotOwned")));
        assert!(refused["message"].as_str().unwrap().contains("Secret iop-node-mac-1 exists"));
        call.ok(&s.nodes[0]);
        task.await.unwrap().unwrap();
        server.done().await;

        // Said once: with the condition in status, the next reconcile writes nothing.
        let mut again = s.clone();
        let status = again.nodes[0].status.as_mut().unwrap();
        let written: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> =
            serde_json::from_value(json!(conditions)).unwrap();
        status.conditions.retain(|c| written.iter().all(|w| w.type_ != c.type_));
        status.conditions.extend(written);
        let (client, mut server) = mock();
        let task = spawn(context(client, NOW), again.clone(), NOW);
        expect_config_apply(&mut server).await.echo();
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&pki.ca_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&pki.edge_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.ok(&existing);
        task.await.unwrap().unwrap();
        server.done().await;

        // The Secret removed: issued, and the condition goes (applied without it).
        let (client, mut server) = mock();
        let task = spawn(context(client, NOW), again, NOW);
        expect_config_apply(&mut server).await.echo();
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-ca"), &[]).await.ok(&pki.ca_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-tls"), &[]).await.ok(&pki.edge_secret);
        server.expect("GET", &format!("{CORE_PATH}/secrets/iop-node-mac-1"), &[]).await.not_found();
        server.expect_apply(&format!("{CORE_PATH}/secrets/iop-node-mac-1"), CERTS).await.echo();
        let call = server.expect_apply(&format!("{CRD_PATH}/nodecatalogs/mac-1/status"), CERTS).await;
        let types: Vec<&str> =
            call.body["status"]["conditions"].as_array().unwrap().iter().filter_map(|c| c["type"].as_str()).collect();
        assert_eq!(types, ["CAExpiring"]);
        assert!(call.body["status"]["certificate"]["serial"].is_string());
        call.ok(&s.nodes[0]);
        task.await.unwrap().unwrap();
        server.done().await;
    }
}

/// A `credentialSecretRef`'s Secret is read as metadata first; its data is
/// fetched only when it carries `iop.dev/credential: "true"`. An unlabelled
/// one (another team's key) is never read, its value never copied, and its
/// Provider gets `Ready=False`/`SecretNotLabelled`; the labelled one is
/// copied into `iop-edge-credentials`.
#[tokio::test]
async fn only_a_labelled_credential_secrets_data_is_read_and_copied() {
    use crate::crd::provider::{Adapter, SecretKeyRef};
    let keyed = |name: &str, secret: &str| {
        let mut p = provider(name, "mac-1");
        p.spec.adapter = Adapter::Openai;
        p.spec.credential_secret_ref = Some(SecretKeyRef { name: secret.into(), key: "api-key".into() });
        p
    };
    let mut s = snapshot(vec![keyed("good", "ours"), keyed("thief", "theirs")], vec![node("mac-1")], vec![]);
    let label = [(crate::reconcile::credentials::CREDENTIAL_LABEL.to_string(), "true".to_string())];
    let ours = Secret {
        metadata: ObjectMeta { name: Some("ours".into()), labels: Some(label.into()), ..Default::default() },
        data: Some([("api-key".to_string(), k8s_openapi::ByteString(b"sk-ours".to_vec()))].into()),
        ..Default::default()
    };
    let theirs_meta = ObjectMeta { name: Some("theirs".into()), ..Default::default() };
    // As it will have been read: the settled status matches what the build computes.
    s.secrets = [
        ("ours".to_string(), ours.clone()),
        ("theirs".to_string(), Secret { metadata: theirs_meta.clone(), ..Default::default() }),
    ]
    .into();
    settle(&mut s, NOW);
    let pki = pki(&mut s, NOW);
    let read = Snapshot { secrets: Default::default(), ..s.clone() };

    let (client, mut server) = mock();
    let task = spawn(context(client, NOW), read, NOW);
    let partial =
        |meta: &ObjectMeta| json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta});
    let metadata_only = |call: &Call| call.accept.as_deref().is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let call = server.expect("GET", &format!("{CORE_PATH}/secrets/ours"), &[]).await;
    assert!(metadata_only(&call), "metadata first: {:?}", call.accept);
    call.respond(200, partial(&ours.metadata));
    let call = server.expect("GET", &format!("{CORE_PATH}/secrets/ours"), &[]).await;
    assert!(!metadata_only(&call), "then the data of the labelled one");
    call.ok(&ours);
    let call = server.expect("GET", &format!("{CORE_PATH}/secrets/theirs"), &[]).await;
    assert!(metadata_only(&call));
    call.respond(200, partial(&theirs_meta));
    // Never a GET of `theirs`' data: next is the operator's own credentials Secret.
    server.expect("GET", &format!("{CORE_PATH}/secrets/iop-edge-credentials"), &[]).await.not_found();
    let call = server.expect_apply(&format!("{CORE_PATH}/secrets/iop-edge-credentials"), CONFIG).await;
    assert_eq!(call.body["data"], json!({"good": "c2stb3Vycw=="}), "only `ours`' value, base64");
    call.echo();
    let call = server.expect_apply(&format!("{CORE_PATH}/configmaps/iop-edge-config"), CONFIG).await;
    assert_eq!(names(&edge_yaml(&call.body)).1, ["good"]);
    call.echo();
    serve_current_certs(&mut server, &pki, &["mac-1"]).await;
    task.await.unwrap().unwrap();
    server.done().await;

    let thief = s.providers.iter().find(|p| p.name_any() == "thief").unwrap();
    let ready = thief.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "SecretNotLabelled"));
}
