//! Several Edge replicas behind one load balancer (Debian's HAProxy, TCP
//! mode for the node-facing gRPC port): the node dials the one URL until it
//! holds a session with every replica, and any replica serves any request.
//! Real processes throughout: two `iop-edge`, one `iop-node`, the mock
//! provider and `haproxy`. Skipped (with a message) where `haproxy` is not
//! installed; CI installs it.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::*;
use iop_e2e::harness::{self, Proc, bin, spawn_until, wait_until};
use iop_e2e::pki::Validity;
use iop_proto::config::Adapter;
use serde_json::{Value, json};

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn haproxy_installed() -> bool {
    let found = std::process::Command::new("haproxy").arg("-v").output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipping: haproxy is not installed (apt-get install haproxy)");
    }
    found
}

/// One `iop-edge` replica on fixed ports (a restart comes back on them).
struct Replica {
    id: &'static str,
    config: PathBuf,
    http: SocketAddr,
    grpc: SocketAddr,
    admin: SocketAddr,
    process: Option<Proc>,
}

impl Replica {
    async fn start(&mut self) {
        let config = self.config.to_str().unwrap();
        let args = ["--config", config, "--replica-id", self.id, "--test-heartbeat-profile", FAST_HEARTBEAT];
        let (process, _) = spawn_until("iop-edge", &bin("iop-edge"), &args, "iop-edge listening").await;
        self.process = Some(process);
    }

    async fn node(&self, client: &reqwest::Client) -> Value {
        let url = format!("http://{}/admin/v1/nodes", self.admin);
        let Ok(response) = client.get(url).send().await else { return Value::Null };
        let nodes: Value = serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or_default();
        nodes["nodes"].as_array().and_then(|n| n.iter().find(|n| n["name"] == NODE).cloned()).unwrap_or_default()
    }

    async fn wait_ready(&self, client: &reqwest::Client) -> u64 {
        wait_until(&format!("{NODE} ready on {}", self.id), WAIT, || async {
            self.node(client).await["phase"] == "ready"
        })
        .await;
        self.node(client).await["generation"].as_u64().unwrap()
    }

    async fn metric(&self, client: &reqwest::Client, sample: &str) -> f64 {
        let text = client.get(format!("http://{}/metrics", self.admin)).send().await.unwrap().text().await.unwrap();
        text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
    }

    async fn chat(&self, client: &reqwest::Client) -> (u16, Value) {
        self.chat_with(client, "mock-ollama").await
    }

    async fn chat_with(&self, client: &reqwest::Client, model: &str) -> (u16, Value) {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let url = format!("http://{}/v1/chat/completions", self.http);
        let body = serde_json::to_vec(&body).unwrap();
        let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
        json_body(response).await
    }
}

/// Two replicas of one config, HAProxy in front of their gRPC ports, and
/// a node dialing HAProxy.
struct Fleet {
    _dir: tempfile::TempDir,
    _mock: Proc,
    mock_url: String,
    _haproxy: Proc,
    node: Option<Proc>,
    replicas: Vec<Replica>,
    client: reqwest::Client,
}

impl Fleet {
    async fn start() -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let pki = harness::DevPki::create(dir.path()).unwrap();
        let (mock, mock_url) = spawn_mock("127.0.0.1:0").await;
        // One slot, and its requests wait for `POST /mock/release/h1`.
        let mut held = provider("held", Adapter::Ollama, "mock@hold=h1", "mock-held", &mock_url);
        held.capacity = 1;
        let providers = [provider("ollama-mock", Adapter::Ollama, "mock", "mock-ollama", &mock_url), held];
        let ids = ["edge-a", "edge-b"];
        let mut replicas = Vec::new();
        for id in ids {
            let (http, grpc, admin) = (free_port(), free_port(), free_port());
            let mut config = harness::edge_config(&pki, http, grpc, &[NODE], &providers);
            config.listen.admin = admin;
            config.replicas = ids.map(String::from).to_vec();
            let path = dir.path().join(format!("{id}.yaml"));
            std::fs::write(&path, config.to_yaml()).unwrap();
            replicas.push(Replica { id, config: path, http, grpc, admin, process: None });
        }
        for replica in &mut replicas {
            replica.start().await;
        }

        // TCP passthrough: TLS stays end to end between node and Edge.
        let lb = free_port();
        let servers: String = replicas
            .iter()
            .map(|r| format!("  server {} {} check inter 100ms fall 1 rise 1\n", r.id, r.grpc))
            .collect();
        let haproxy_config = format!(
            "global\n  maxconn 256\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 1h\n  \
             timeout server 1h\nfrontend grpc\n  bind {lb}\n  default_backend edges\nbackend edges\n  \
             balance roundrobin\n{servers}"
        );
        let haproxy_file = dir.path().join("haproxy.cfg");
        std::fs::write(&haproxy_file, haproxy_config).unwrap();
        let child = tokio::process::Command::new("haproxy")
            .args(["-db", "-f", haproxy_file.to_str().unwrap()])
            .kill_on_drop(true)
            .spawn()
            .expect("haproxy starts");
        let haproxy = Proc { child, name: "haproxy" };
        wait_until("haproxy listening", WAIT, || async { tokio::net::TcpStream::connect(lb).await.is_ok() }).await;

        let pair = pki.node_cert(NODE, Validity::Current).unwrap();
        let mut node_config = harness::node_config(lb, &pki.ca_file, &pair, (50, 500));
        node_config.metrics = Some(iop_node::config::MetricsConfig { listen: free_port() });
        let node_file = dir.path().join("node.yaml");
        std::fs::write(&node_file, serde_saphyr::to_string(&node_config).unwrap()).unwrap();
        let args = ["--config", node_file.to_str().unwrap(), "--test-heartbeat-profile", FAST_HEARTBEAT];
        let (node, _) = spawn_until("iop-node", &bin("iop-node"), &args, "iop-node metrics on").await;
        Fleet { _dir: dir, _mock: mock, mock_url, _haproxy: haproxy, node: Some(node), replicas, client: http_client() }
    }
}

/// The node holds one session with each replica through the load
/// balancer; a second session it reaches a held replica with is answered
/// as a duplicate and replaces nothing; a replica that restarts is reached
/// again.
#[tokio::test]
async fn a_node_behind_a_load_balancer_holds_a_session_with_every_replica() {
    if !haproxy_installed() {
        return;
    }
    let mut fleet = Fleet::start().await;
    let client = fleet.client.clone();
    let generation_a = fleet.replicas[0].wait_ready(&client).await;
    fleet.replicas[1].wait_ready(&client).await;
    for replica in &fleet.replicas {
        let (status, body) = replica.chat(&client).await;
        assert_eq!(status, 200, "{} serves the node's provider: {body}", replica.id);
    }

    // With edge-b gone, every dial reaches edge-a, which holds the node:
    // answered as duplicates, and edge-a's session stays the same one.
    let b = fleet.replicas[1].process.take().unwrap();
    b.terminate().await;
    let duplicate = "iop_edge_node_sessions_closed_total{reason=\"duplicate\"}";
    wait_until("a duplicate dial reached edge-a", WAIT, || async {
        fleet.replicas[0].metric(&client, duplicate).await >= 1.0
    })
    .await;
    assert_eq!(fleet.replicas[0].node(&client).await["generation"], generation_a, "the held session stays");
    assert_eq!(fleet.replicas[0].chat(&client).await.0, 200);

    fleet.replicas[1].start().await;
    fleet.replicas[1].wait_ready(&client).await;
    assert_eq!(fleet.replicas[1].chat(&client).await.0, 200, "the restarted replica serves again");
    assert_eq!(fleet.replicas[0].node(&client).await["generation"], generation_a);
    drop(fleet.node.take());
}

/// A provider of capacity 1 busy with a run one replica admitted: the node
/// refuses the other replica's run as `capacity_exhausted`, which waits
/// like a queued request (no failure, health untouched) and is answered
/// once the slot frees.
#[tokio::test]
async fn the_node_enforces_capacity_across_replicas() {
    if !haproxy_installed() {
        return;
    }
    let fleet = Fleet::start().await;
    let client = fleet.client.clone();
    for replica in &fleet.replicas {
        replica.wait_ready(&client).await;
    }
    let stats = || async {
        let response = client.get(format!("{}/mock/stats", fleet.mock_url)).send().await.unwrap();
        serde_json::from_slice::<Value>(&response.bytes().await.unwrap()).unwrap()["requests_total"].as_u64().unwrap()
    };
    let (a, b) = (&fleet.replicas[0], &fleet.replicas[1]);
    let first = a.chat_with(&client, "mock-held");
    tokio::pin!(first);
    // The first run holds the slot at the provider.
    tokio::select! {
        _ = &mut first => panic!("the held run answered before its release"),
        _ = wait_until("the first run at the provider", WAIT, || async { stats().await == 1 }) => {}
    }
    let second = b.chat_with(&client, "mock-held");
    tokio::pin!(second);
    let refused = "iop_edge_attempts_total{provider=\"held\",outcome=\"retried\"}";
    tokio::select! {
        _ = &mut first => panic!("the held run answered before its release"),
        _ = &mut second => panic!("the second run answered while the slot was taken"),
        _ = wait_until("edge-b's run refused at the node", WAIT, || async { b.metric(&client, refused).await >= 1.0 }) => {}
    }
    assert_eq!(stats().await, 1, "the refused run never reached the provider");
    client.post(format!("{}/mock/release/h1", fleet.mock_url)).send().await.unwrap();
    let ((status_a, body_a), (status_b, body_b)) = tokio::join!(first, second);
    assert_eq!((status_a, status_b), (200, 200), "{body_a} {body_b}");
    assert_eq!(stats().await, 2);
    let providers: Value = serde_json::from_slice(
        &client.get(format!("http://{}/admin/v1/providers", b.admin)).send().await.unwrap().bytes().await.unwrap(),
    )
    .unwrap();
    let held = providers["providers"].as_array().unwrap().iter().find(|p| p["id"] == "held").unwrap();
    assert_eq!(held["health"], "available", "a capacity refusal never lowers health: {held}");
}
