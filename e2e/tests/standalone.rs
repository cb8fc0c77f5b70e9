//! docs/standalone.md, followed with real processes (issue 39 item 5): an
//! Edge without Kubernetes whose certificates come only from `iop-edge pki
//! init` and `pki node`, two `iop-node` processes on their bundles (real
//! mTLS), a request answered through the Edge, then a node cut off as the
//! page's "Revocation" says and certificates renewed as its "Rotation" says.
//!
//! The page and the test cannot drift apart: every command the test runs
//! is a block of the page marked `<!-- test: NAME -->`, run as written by
//! `sh` (with the page's variables set to this test's values and `sudo -u
//! iop ` left out: the test is its own Edge user), and the Edge runs with
//! the page's `edge.yaml`, only its listeners and model servers pointed at
//! the test's.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use iop_e2e::harness::{Proc, bin, spawn_until, wait_until};
use iop_proto::config::EdgeConfig;
use serde_json::Value;

const DOC: &str = include_str!("../../docs/standalone.md");

/// The body of the fenced block right after `<!-- test: NAME -->` (also
/// inside a list item: the fence's indentation is taken off every line).
fn block(name: &str) -> String {
    let marker = format!("<!-- test: {name} -->");
    let mut lines = DOC.lines().skip_while(|l| l.trim() != marker);
    assert!(lines.next().is_some(), "docs/standalone.md has no block marked `{marker}`");
    let fence = lines.next().filter(|l| l.trim_start().starts_with("```"));
    let fence = fence.unwrap_or_else(|| panic!("{marker} is not right before a fenced block"));
    let indent = fence.len() - fence.trim_start().len();
    let body: Vec<&str> =
        lines.take_while(|l| !l.trim_start().starts_with("```")).map(|l| l.get(indent..).unwrap_or("")).collect();
    body.join("\n") + "\n"
}

/// A standalone Edge's machine, in a temporary directory laid out as the
/// page's `/etc/iop`.
struct Machine {
    dir: tempfile::TempDir,
    /// The page's variables, and `IOP_KEY` once `new-key` printed it.
    vars: Vec<(&'static str, String)>,
}

impl Machine {
    fn etc(&self) -> &Path {
        self.dir.path()
    }

    /// Runs the page's block `name` with `sh -eu`; its stdout.
    fn run(&self, name: &str) -> String {
        let script = block(name).replace("sudo -u iop ", "");
        let bins = bin("iop-edge").parent().unwrap().to_path_buf();
        let path = std::env::join_paths(
            std::iter::once(bins).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .unwrap();
        let out = std::process::Command::new("sh")
            .args(["-euc", &script])
            .current_dir(self.etc())
            .env("PATH", path)
            .envs(self.vars.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap_or_else(|e| panic!("sh for block {name}: {e}"));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "block {name}:\n{script}\nfailed: {stderr}{stdout}");
        assert!(!stdout.contains("PRIVATE KEY") && !stderr.contains("PRIVATE KEY"), "block {name} printed a key");
        stdout.into_owned()
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn cert(path: &Path) -> iop_pki::CertInfo {
    iop_pki::inspect(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Waits until the clock has left the second a certificate of `lifetime`
/// ending at `not_after` was issued in, so one issued from now on ends
/// later (certificates hold whole seconds).
async fn past_issuance(not_after: time::OffsetDateTime, lifetime: Duration) {
    let issued = not_after.unix_timestamp() - lifetime.as_secs() as i64;
    wait_until("the clock to leave the second of the last issuance", WAIT, || async {
        time::OffsetDateTime::now_utc().unix_timestamp() > issued
    })
    .await;
}

/// The Edge and its admin listener.
struct Edge {
    proc: Proc,
    admin: std::net::SocketAddr,
    client: reqwest::Client,
}

impl Edge {
    async fn get(&self, path: &str) -> String {
        let url = format!("http://{}{path}", self.admin);
        self.client.get(url).send().await.unwrap().text().await.unwrap()
    }

    async fn nodes(&self) -> Vec<Value> {
        let nodes: Value = serde_json::from_str(&self.get("/admin/v1/nodes").await).unwrap();
        nodes["nodes"].as_array().unwrap().clone()
    }

    /// The node's entry in `/admin/v1/nodes`, if the config lists it.
    async fn node(&self, name: &str) -> Option<Value> {
        self.nodes().await.into_iter().find(|n| n["name"] == name)
    }

    /// Waits until `name` is ready on a generation after `after`; returns it.
    async fn ready_after(&self, name: &str, after: u64) -> u64 {
        wait_until(&format!("{name} ready after generation {after}"), WAIT, || async {
            self.node(name).await.is_some_and(|n| n["phase"] == "ready" && n["generation"].as_u64() > Some(after))
        })
        .await;
        self.node(name).await.unwrap()["generation"].as_u64().unwrap()
    }

    async fn metric(&self, sample: &str) -> f64 {
        let text = self.get("/metrics").await;
        text.lines().find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
    }

    async fn wait_metric(&self, sample: &str, what: impl Fn(f64) -> bool) {
        wait_until(sample, WAIT, || async { what(self.metric(sample).await) }).await;
    }

    async fn revision(&self) -> u64 {
        let config: Value = serde_json::from_str(&self.get("/admin/v1/config").await).unwrap();
        config["config"]["revision"].as_u64().unwrap()
    }

    /// Waits until a reload after `revision` is applied.
    async fn reloaded_after(&self, revision: u64) {
        wait_until(&format!("a reload after revision {revision}"), WAIT, || async { self.revision().await > revision })
            .await;
    }

    /// Writes the config and reloads it as the page's `ExecReload` does.
    async fn apply(&self, path: &Path, config: &EdgeConfig) {
        let revision = self.revision().await;
        // Replaced whole: the Edge's own polling never reads half a file.
        iop_pki::files::write(path, &config.to_yaml(), iop_pki::files::Access::Public).unwrap();
        let status = std::process::Command::new("kill").args(["-HUP", &self.proc.pid().to_string()]).status();
        assert!(status.unwrap().success());
        self.reloaded_after(revision).await;
    }
}

/// `iop-node --config BUNDLE/node.yaml`, as on the Mac.
fn start_node(bundle: &Path) -> Proc {
    let child = tokio::process::Command::new(bin("iop-node"))
        .arg("--config")
        .arg(bundle.join("node.yaml"))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Proc::new(child, "iop-node")
}

/// A chat request with the key `new-key` made, the way the page's
/// `request` block sends it; its status and JSON body.
async fn chat(client: &reqwest::Client, machine: &Machine, model: &str) -> (u16, Value) {
    let var = |name| machine.vars.iter().find(|(k, _)| *k == name).unwrap().1.clone();
    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Say hello"}]});
    let response = client
        .post(format!("{}/v1/chat/completions", var("IOP_URL")))
        .bearer_auth(var("IOP_KEY"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap();
    json_body(response).await
}

fn answered(body: &Value) -> bool {
    body["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty())
}

#[tokio::test]
async fn a_standalone_edge_as_the_page_says_serves_cuts_off_a_node_and_rotates_its_certificates() {
    let (http, grpc, admin) = (free_port(), free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let mut machine = Machine {
        vars: vec![
            ("PKI", pki.to_str().unwrap().to_string()),
            // An IP address: the Edge's certificate carries it as an IP SAN.
            ("EDGE_HOST", "127.0.0.1".to_string()),
            ("EDGE_URL", format!("https://127.0.0.1:{}", grpc.port())),
            ("IOP_URL", format!("http://127.0.0.1:{}", http.port())),
        ],
        dir,
    };
    // The page sets exactly the variables the test gives values to.
    let variables = block("variables");
    let defined: BTreeSet<&str> =
        variables.lines().filter_map(|l| l.split_once('=')).map(|(name, _)| name.trim()).collect();
    let given: BTreeSet<&str> = machine.vars.iter().map(|(k, _)| *k).collect();
    assert_eq!(defined, given, "the page's variables");

    // 1. Certificates.
    let printed = machine.run("pki-init");
    assert!(printed.contains("the Edge's certificate is for 127.0.0.1"), "{printed}");
    for (file, expected) in [("ca-key.pem", 0o600), ("edge-key.pem", 0o600), ("ca.pem", 0o644), ("edge.pem", 0o644)] {
        assert_eq!(mode(&pki.join(file)), expected, "{file}");
    }
    assert_eq!(mode(&pki), 0o700);

    // 2. The config, with this test's listeners and model server, and a key.
    let (_mock, mock_url) = spawn_mock("127.0.0.1:0").await;
    let mut config = EdgeConfig::from_yaml(&block("edge.yaml")).expect("the page's edge.yaml is a valid config");
    config.listen.http = http;
    config.listen.grpc = grpc;
    config.listen.admin = admin;
    for provider in &mut config.providers {
        provider.target.base_url = mock_url.clone();
        provider.target.model = "mock".to_string();
    }
    let edge_yaml = machine.etc().join("edge.yaml");
    std::fs::write(&edge_yaml, config.to_yaml()).unwrap();
    let printed = machine.run("new-key");
    let key = printed.lines().find_map(|l| l.trim().strip_prefix("iop-").map(|k| format!("iop-{k}"))).unwrap();
    let entry = printed.lines().find(|l| l.trim_start().starts_with("- { name: alice")).expect("an entry").to_string();
    std::fs::write(machine.etc().join("keys.yaml"), format!("principals:\n{entry}\n")).unwrap();
    machine.vars.push(("IOP_KEY", key));

    // 3. The Edge, as its service unit runs it.
    let unit = block("iop-edge.service");
    assert!(unit.contains("ExecStart=/usr/local/bin/iop-edge --config /etc/iop/edge.yaml\n"), "{unit}");
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID\n"), "the test reloads as the unit does: {unit}");
    let (proc, _) =
        spawn_until("iop-edge", &bin("iop-edge"), &["--config", edge_yaml.to_str().unwrap()], "iop-edge listening")
            .await;
    let edge = Edge { proc, admin, client: http_client() };
    assert_eq!(edge.nodes().await.len(), 2);

    // 4. The Macs: a bundle each, and `iop-node` on it.
    let printed = machine.run("pki-node");
    for name in ["studio-mac", "laptop"] {
        assert!(printed.contains(&format!("  nodes:\n    - name: {name}\n")), "the entry to add: {printed}");
        assert!(config.nodes.iter().any(|n| n.name == name), "the page's config lists {name}");
        assert_eq!(mode(&pki.join("nodes").join(name).join("node-key.pem")), 0o600);
    }
    let bundle = |name: &str| pki.join("nodes").join(name);
    let mut studio = start_node(&bundle("studio-mac"));
    let _laptop = start_node(&bundle("laptop"));
    let studio_generation = edge.ready_after("studio-mac", 0).await;
    edge.ready_after("laptop", 0).await;

    // 5. A first request: the page's curl, then the laptop's model.
    let printed = machine.run("request");
    let body: Value = serde_json::from_str(&printed).unwrap_or_else(|_| panic!("not JSON: {printed}"));
    assert!(answered(&body), "{body}");
    let (status, body) = chat(&edge.client, &machine, "qwen2.5").await;
    assert!(status == 200 && answered(&body), "{status} {body}");

    // Revocation: `laptop` leaves `nodes` (and its provider), then a reload.
    config.nodes.retain(|n| n.name != "laptop");
    config.providers.retain(|p| p.node != "laptop");
    edge.apply(&edge_yaml, &config).await;
    assert!(edge.node("laptop").await.is_none(), "no longer listed");
    edge.wait_metric(r#"iop_edge_node_connections{node="laptop"}"#, |v| v == 0.0).await;
    // The laptop's node dials again and again, and is refused each time.
    edge.wait_metric(r#"iop_edge_node_handshake_rejections_total{reason="unknown_node"}"#, |v| v >= 1.0).await;
    assert_eq!(edge.metric(r#"iop_edge_node_connections{node="laptop"}"#).await, 0.0);
    let (status, body) = chat(&edge.client, &machine, "qwen2.5").await;
    assert_ne!(status, 200, "{body}");
    let (status, body) = chat(&edge.client, &machine, "llama3.2").await;
    assert!(status == 200 && answered(&body), "the other node serves on: {status} {body}");
    assert_eq!(edge.node("studio-mac").await.unwrap()["generation"].as_u64(), Some(studio_generation));

    // Rotation of the Edge's certificate: the Edge reloads it by itself.
    let old_edge = cert(&pki.join("edge.pem"));
    past_issuance(old_edge.not_after, iop_pki::EDGE_VALIDITY).await;
    machine.run("renew-edge");
    let new_edge = cert(&pki.join("edge.pem"));
    assert!(new_edge.not_after > old_edge.not_after && new_edge.names == old_edge.names, "{new_edge:?}");
    let served = new_edge.not_after.unix_timestamp() as f64;
    edge.wait_metric("iop_edge_server_certificate_expiry_timestamp_seconds", |v| v == served).await;

    // Rotation of a node's certificate: the same command again, then the
    // node restarts on the new files (and checks the Edge's new certificate).
    let old_node = cert(&bundle("studio-mac").join("node.pem"));
    past_issuance(old_node.not_after, iop_pki::NODE_VALIDITY).await;
    machine.run("renew-node");
    let new_node = cert(&bundle("studio-mac").join("node.pem"));
    assert!(new_node.serial != old_node.serial && new_node.not_after > old_node.not_after);
    assert!(studio.terminate().await.success());
    studio = start_node(&bundle("studio-mac"));
    let mut studio_generation = edge.ready_after("studio-mac", studio_generation).await;
    let node_expiry = r#"iop_edge_node_certificate_expiry_timestamp_seconds{node="studio-mac"}"#;
    let presented = new_node.not_after.unix_timestamp() as f64;
    edge.wait_metric(node_expiry, |v| v == presented).await;
    let printed = machine.run("request");
    let body: Value = serde_json::from_str(&printed).unwrap_or_else(|_| panic!("not JSON: {printed}"));
    assert!(answered(&body), "{body}");

    // Rotation of the CA, with an overlap. 1. The new CA carries the old.
    past_issuance(new_edge.not_after, iop_pki::EDGE_VALIDITY).await;
    machine.run("ca-next");
    let next = machine.etc().join("pki.next");
    let carried = std::fs::read_to_string(next.join("ca.pem")).unwrap();
    assert_eq!(carried.matches("BEGIN CERTIFICATE").count(), 2, "{carried}");
    // 2. The Edge trusts both CAs.
    config.tls.ca_file = "pki.next/ca.pem".into();
    edge.apply(&edge_yaml, &config).await;
    // 3. The node on a bundle of the new CA, still served the old CA's certificate.
    machine.run("ca-next-node");
    assert!(studio.terminate().await.success());
    studio = start_node(&next.join("nodes/studio-mac"));
    studio_generation = edge.ready_after("studio-mac", studio_generation).await;
    // 4. The Edge's certificate of the new CA; the node checks it at its next handshake.
    config.tls.cert_file = "pki.next/edge.pem".into();
    config.tls.key_file = "pki.next/edge-key.pem".into();
    edge.apply(&edge_yaml, &config).await;
    let served = cert(&next.join("edge.pem")).not_after.unix_timestamp() as f64;
    edge.wait_metric("iop_edge_server_certificate_expiry_timestamp_seconds", |v| v == served).await;
    assert!(studio.terminate().await.success());
    studio = start_node(&next.join("nodes/studio-mac"));
    studio_generation = edge.ready_after("studio-mac", studio_generation).await;
    // 5. The old CA dropped: the Edge reloads the file by itself, and a
    // certificate of the old CA is refused even by a node that trusts the new one.
    let revision = edge.revision().await;
    machine.run("ca-next-drop");
    edge.reloaded_after(revision).await;
    let stale = machine.etc().join("stale-studio");
    std::fs::create_dir(&stale).unwrap();
    for file in ["node.pem", "node-key.pem", "node.yaml"] {
        std::fs::copy(bundle("studio-mac").join(file), stale.join(file)).unwrap();
    }
    std::fs::copy(next.join("ca.pem"), stale.join("ca.pem")).unwrap();
    let untrusted = r#"iop_edge_node_handshake_rejections_total{reason="untrusted_issuer"}"#;
    assert_eq!(edge.metric(untrusted).await, 0.0);
    let stale_node = start_node(&stale);
    edge.wait_metric(untrusted, |v| v >= 1.0).await;
    drop(stale_node);
    assert_eq!(edge.node("studio-mac").await.unwrap()["generation"].as_u64(), Some(studio_generation));
    let printed = machine.run("request");
    let body: Value = serde_json::from_str(&printed).unwrap_or_else(|_| panic!("not JSON: {printed}"));
    assert!(answered(&body), "the node of the new CA serves on: {body}");
    drop(studio);
}
