//! Several Edge replicas behind one load balancer (Debian's HAProxy, TCP
//! mode for the node-facing gRPC port): the node dials the one URL until it
//! holds a session with every replica, and any replica serves any request.
//! Real processes throughout: two `iop-edge`, one `iop-node`, the mock
//! provider and `haproxy`. Reported as skipped where `haproxy` is absent
//! (`scripts/test-deps --haproxy` installs it).

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use iop_e2e::harness::{self, Proc, ProviderSpec, bin, spawn_until, wait_until};
use iop_e2e::parts::{self, Part};
use iop_e2e::pki::Validity;
use iop_proto::config::{Adapter, EdgeConfig};
use serde_json::{Value, json};

/// The sample counting sessions a replica answered as duplicates.
const DUPLICATES: &str = "iop_edge_node_sessions_closed_total{reason=\"duplicate\"}";

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
        let args = [
            "--config",
            config,
            "--replica-id",
            self.id,
            "--test-heartbeat-profile",
            FAST_HEARTBEAT,
            // HAProxy checks /readyz every 100 ms and takes a replica out
            // after two failed checks of up to 1 s each: a draining replica
            // keeps answering well past that.
            "--drain-delay-ms",
            "2000",
        ];
        let (process, _) = spawn_until("iop-edge", &bin("iop-edge"), &args, "iop-edge listening").await;
        self.process = Some(process);
    }

    async fn node(&self, client: &reqwest::Client) -> Value {
        self.node_named(client, NODE).await
    }

    /// Node `name` as this replica's `/admin/v1/nodes` shows it.
    async fn node_named(&self, client: &reqwest::Client, name: &str) -> Value {
        let url = format!("http://{}/admin/v1/nodes", self.admin);
        let Ok(response) = client.get(url).send().await else { return Value::Null };
        let nodes: Value = serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or_default();
        nodes["nodes"].as_array().and_then(|n| n.iter().find(|n| n["name"] == name).cloned()).unwrap_or_default()
    }

    /// `/readyz`: its status and body (status 0 when it does not answer).
    async fn readyz(&self, client: &reqwest::Client) -> (u16, Value) {
        match client.get(format!("http://{}/readyz", self.http)).send().await {
            Ok(response) => json_body(response).await,
            Err(_) => (0, Value::Null),
        }
    }

    async fn wait_ready(&self, client: &reqwest::Client) -> u64 {
        wait_until(&format!("{NODE} ready on {}", self.id), WAIT, || async {
            self.node(client).await["phase"] == "ready"
        })
        .await;
        self.generation(client).await
    }

    /// The generation of this replica's session with the node.
    async fn generation(&self, client: &reqwest::Client) -> u64 {
        self.node(client).await["generation"].as_u64().unwrap()
    }

    /// Rewrites this replica's config with replica set `ids` and reloads
    /// it (SIGHUP), returning once the reload is applied.
    async fn reload_replicas(&self, client: &reqwest::Client, ids: &[&str]) {
        let revision = "iop_edge_config_revision";
        let before = self.metric(client, revision).await;
        let mut config = EdgeConfig::from_yaml(&std::fs::read_to_string(&self.config).unwrap()).unwrap();
        config.replicas = ids.iter().map(|id| id.to_string()).collect();
        std::fs::write(&self.config, config.to_yaml()).unwrap();
        let pid = self.process.as_ref().unwrap().pid().to_string();
        assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        wait_until(&format!("{} reloaded", self.id), WAIT, || async { self.metric(client, revision).await > before })
            .await;
    }

    async fn health(&self, client: &reqwest::Client, provider: &str) -> Value {
        let url = format!("http://{}/admin/v1/providers", self.admin);
        let Ok(response) = client.get(url).send().await else { return Value::Null };
        let providers: Value = serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or_default();
        let found = providers["providers"].as_array().and_then(|p| p.iter().find(|p| p["id"] == provider).cloned());
        found.map(|p| p["health"].clone()).unwrap_or_default()
    }

    async fn wait_health(&self, client: &reqwest::Client, provider: &str, health: &str) {
        wait_until(&format!("{provider} {health} on {}", self.id), WAIT, || async {
            self.health(client, provider).await == health
        })
        .await;
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
    /// HAProxy's HTTP frontend: any replica whose `/readyz` passes.
    lb_http: SocketAddr,
    node: Option<Proc>,
    replicas: Vec<Replica>,
    client: reqwest::Client,
}

impl Fleet {
    async fn start() -> Fleet {
        Fleet::start_with(Vec::new()).await
    }

    /// The fleet with `extra` providers on the node besides its three.
    async fn start_with(extra: Vec<ProviderSpec>) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let pki = harness::DevPki::create(dir.path()).unwrap();
        let (mock, mock_url) = spawn_mock("127.0.0.1:0").await;
        // One slot, and its requests wait for `POST /mock/release/h1`.
        let mut held = provider("held", Adapter::Ollama, "mock@hold=h1", "mock-held", &mock_url);
        held.capacity = 1;
        // Streams of about 300 ms.
        let mut slow = provider("slow", Adapter::Ollama, "mock@words=10,chunk_delay_ms=30", "mock-slow", &mock_url);
        slow.capacity = 32;
        let mut providers =
            vec![provider("ollama-mock", Adapter::Ollama, "mock", "mock-ollama", &mock_url), held, slow];
        providers.extend(extra);
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

        let (haproxy, lb, lb_http) = start_haproxy(dir.path(), &replicas).await;
        // Fast reconnects: a test that restarts a replica waits less.
        let reconnect = iop_node::config::ReconnectConfig { initial_backoff_ms: 50, max_backoff_ms: 500 };
        let node = start_node(dir.path(), &pki, NODE, lb, reconnect).await;
        let fleet = Fleet {
            _dir: dir,
            _mock: mock,
            mock_url,
            _haproxy: haproxy,
            lb_http,
            node: Some(node),
            replicas,
            client: http_client(),
        };
        // Every test starts from a node ready on each replica.
        for replica in &fleet.replicas {
            replica.wait_ready(&fleet.client).await;
        }
        fleet
    }
}

/// HAProxy in front of `replicas`, started or not: returns it, its gRPC
/// frontend (TCP passthrough: TLS stays end to end between node and Edge)
/// and its HTTP frontend (to replicas whose `/readyz` passes, a new server
/// connection per request, never retried, as kube-proxy does not).
async fn start_haproxy(dir: &std::path::Path, replicas: &[Replica]) -> (Proc, SocketAddr, SocketAddr) {
    let (lb, lb_http) = (free_port(), free_port());
    let servers = |port: fn(&Replica) -> SocketAddr| -> String {
        replicas
            .iter()
            // `fall 2` and a check timeout of its own: one slow /readyz
            // under load is not a down replica (with `fall 1` and the
            // 100 ms interval as the timeout it took the last replica
            // out mid-rollout and 503'd a third of the requests). A
            // server not up at start is out after its first check.
            .map(|r| format!("  server {} {} check inter 100ms fall 2 rise 1\n", r.id, port(r)))
            .collect()
    };
    let haproxy_config = format!(
        "global\n  maxconn 256\ndefaults\n  retries 0\n  timeout connect 2s\n  timeout check 1s\n  timeout client 1h\n  timeout server 1h\n\
         frontend grpc\n  mode tcp\n  bind {lb}\n  default_backend edges_grpc\n\
         backend edges_grpc\n  mode tcp\n  balance roundrobin\n{grpc}\
         frontend http\n  mode http\n  bind {lb_http}\n  default_backend edges_http\n\
         backend edges_http\n  mode http\n  balance roundrobin\n  option httpclose\n  \
         option httpchk GET /readyz\n  http-check expect status 200\n{http}",
        grpc = servers(|r| r.grpc),
        http = servers(|r| r.http),
    );
    let haproxy_file = dir.join("haproxy.cfg");
    std::fs::write(&haproxy_file, haproxy_config).unwrap();
    let child = tokio::process::Command::new(Part::Haproxy.require(parts::haproxy()))
        .args(["-db", "-f", haproxy_file.to_str().unwrap()])
        .kill_on_drop(true)
        .spawn()
        .expect("haproxy starts");
    let haproxy = Proc::new(child, "haproxy");
    wait_until("haproxy listening", WAIT, || async { tokio::net::TcpStream::connect(lb).await.is_ok() }).await;
    (haproxy, lb, lb_http)
}

/// An `iop-node` named `name` dialing the load balancer `lb`.
async fn start_node(
    dir: &std::path::Path,
    pki: &harness::DevPki,
    name: &str,
    lb: SocketAddr,
    reconnect: iop_node::config::ReconnectConfig,
) -> Proc {
    let pair = pki.node_cert(name, Validity::Current).unwrap();
    let mut node_config = harness::node_config(lb, &pki.ca_file, &pair, (0, 0));
    node_config.reconnect = reconnect;
    node_config.metrics = Some(iop_node::config::MetricsConfig { listen: free_port() });
    let node_file = dir.join(format!("node-{name}.yaml"));
    std::fs::write(&node_file, serde_saphyr::to_string(&node_config).unwrap()).unwrap();
    let args = ["--config", node_file.to_str().unwrap(), "--test-heartbeat-profile", FAST_HEARTBEAT];
    spawn_until("iop-node", &bin("iop-node"), &args, "iop-node metrics on").await.0
}

/// The node holds one session with each replica through the load
/// balancer; a second session it reaches a held replica with is answered
/// as a duplicate and replaces nothing; a replica that restarts is reached
/// again.
#[tokio::test]
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn a_node_behind_a_load_balancer_holds_a_session_with_every_replica() {
    let mut fleet = Fleet::start().await;
    let client = fleet.client.clone();
    let generation_a = fleet.replicas[0].generation(&client).await;
    for replica in &fleet.replicas {
        let (status, body) = replica.chat(&client).await;
        assert_eq!(status, 200, "{} serves the node's provider: {body}", replica.id);
    }

    // With edge-b gone, every dial reaches edge-a, which holds the node:
    // answered as duplicates, and edge-a's session stays the same one.
    let b = fleet.replicas[1].process.take().unwrap();
    b.terminate().await;
    wait_until("a duplicate dial reached edge-a", WAIT, || async {
        fleet.replicas[0].metric(&client, DUPLICATES).await >= 1.0
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
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn the_node_enforces_capacity_across_replicas() {
    let fleet = Fleet::start().await;
    let client = fleet.client.clone();
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
    assert_eq!(b.health(&client, "held").await, "available", "a capacity refusal never lowers health");
}

/// One streamed chat through HAProxy's HTTP frontend: whether it answered
/// 200 and its stream ended with `[DONE]`.
/// Streamed chats through the load balancer, one loop per model, until
/// `stop`: how many answered, and what failed.
struct Load(Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>);

impl Load {
    fn start(
        client: &reqwest::Client,
        lb_http: SocketAddr,
        models: impl IntoIterator<Item = &'static str>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Self {
        let loop_on = |model: &'static str| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut answered, mut failed) = (0u32, Vec::new());
                while !stop.is_cancelled() {
                    match streamed_through(&client, lb_http, model).await {
                        Ok(()) => answered += 1,
                        Err(e) => failed.push(format!("{model}: {e}")),
                    }
                }
                (answered, failed)
            })
        };
        Self(models.into_iter().map(loop_on).collect())
    }

    /// Waits for every loop (after `stop`).
    async fn finish(self) -> (u32, Vec<String>) {
        let (mut answered, mut failed) = (0, Vec::new());
        for task in self.0 {
            let (a, f) = task.await.unwrap();
            answered += a;
            failed.extend(f);
        }
        (answered, failed)
    }
}

async fn streamed_through(client: &reqwest::Client, lb_http: SocketAddr, model: &str) -> Result<(), String> {
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let response = client
        .post(format!("http://{lb_http}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(|e| format!("body after {status}: {e}"))?;
    if status != 200 || !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("{status}: {}", text.chars().take(300).collect::<String>()));
    }
    Ok(())
}

/// A rolling restart under steady streaming load fails nothing: each
/// replica in turn drains (not ready, nodes told, in-flight streams
/// finish) and comes back, and the node reaches it again before the next
/// one goes.
#[tokio::test]
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn a_rolling_restart_under_streaming_load_fails_no_request() {
    let mut fleet = Fleet::start().await;
    let client = fleet.client.clone();
    let lb_http = fleet.lb_http;
    // HAProxy's checks see a replica ready up to 100 ms after it is: the
    // load starts once the load balancer routes (as clients reach a
    // Service once an endpoint is ready).
    wait_until("the load balancer routes", WAIT, || async {
        streamed_through(&client, lb_http, "mock-slow").await.is_ok()
    })
    .await;
    let stop = tokio_util::sync::CancellationToken::new();
    // Streams of 300 ms (in flight when a replica drains), and short ones
    // back to back: those reach a replica in any window it refuses
    // connections while the load balancer still lists it (with
    // `--drain-delay-ms 0` they fail in every run tried).
    let models = ["mock-slow", "mock-slow", "mock-slow", "mock-slow", "mock-ollama", "mock-ollama"];
    let load = Load::start(&client, lb_http, models, &stop);
    // Both replicas answer before, between and after the restarts.
    let answered = "iop_edge_http_requests_total{api=\"chat_completions\",route=\"mock-slow\",outcome=\"ok\"}";
    for i in 0..fleet.replicas.len() {
        let replica = &fleet.replicas[i];
        wait_until(&format!("{} answering", replica.id), WAIT, || async {
            replica.metric(&client, answered).await >= 2.0
        })
        .await;
        let process = fleet.replicas[i].process.take().unwrap();
        let status = process.terminate().await;
        assert!(status.success(), "{} exits cleanly after draining: {status}", fleet.replicas[i].id);
        fleet.replicas[i].start().await;
        fleet.replicas[i].wait_ready(&client).await;
        // As a rollout waits for readiness: the load balancer sends the
        // restarted replica requests (its fresh counter moves) before the
        // next replica goes.
        let restarted = &fleet.replicas[i];
        wait_until(&format!("{} answering again", restarted.id), WAIT, || async {
            restarted.metric(&client, answered).await >= 2.0
        })
        .await;
    }
    stop.cancel();
    let (answered, failed) = load.finish().await;
    assert!(failed.is_empty(), "{} of {} requests failed: {failed:?}", failed.len(), answered as usize + failed.len());
    assert!(answered >= 20, "a steady load: {answered}");
    drop(fleet.node.take());
}

/// A scale-up under load fails nothing (issue 43 D3): two nodes, each
/// with a model of its own, hold edge-a and keep dialing for the listed
/// edge-b, whose pod is not up yet (every dial lands on edge-a, a
/// duplicate). edge-b then starts under a steady load of both models
/// through the load balancer: the nodes reach it within seconds with the
/// default reconnect backoff (a duplicate does not grow it), and it turns
/// ready, so the load balancer sends it requests, only once both nodes hold
/// it (before, the first node made it ready and the other node's model
/// answered 503 `no_provider_available` there).
#[tokio::test]
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn a_new_replica_takes_traffic_once_every_node_holds_it() {
    const NODES: [&str; 2] = ["mac-1", "mac-2"];
    const MODELS: [&str; 2] = ["mock-one", "mock-two"];
    let dir = tempfile::tempdir().unwrap();
    let pki = harness::DevPki::create(dir.path()).unwrap();
    let (_mock, mock_url) = spawn_mock("127.0.0.1:0").await;
    let providers: Vec<_> = NODES
        .iter()
        .zip(MODELS)
        .map(|(node, model)| ProviderSpec {
            node: node.to_string(),
            ..provider(model, Adapter::Ollama, "mock", model, &mock_url)
        })
        .collect();
    let ids = ["edge-a", "edge-b"];
    let mut replicas = Vec::new();
    for id in ids {
        let (http, grpc, admin) = (free_port(), free_port(), free_port());
        let mut config = harness::edge_config(&pki, http, grpc, &NODES, &providers);
        config.listen.admin = admin;
        config.replicas = ids.map(String::from).to_vec();
        let path = dir.path().join(format!("{id}.yaml"));
        std::fs::write(&path, config.to_yaml()).unwrap();
        replicas.push(Replica { id, config: path, http, grpc, admin, process: None });
    }
    replicas[0].start().await;
    let (_haproxy, lb, lb_http) = start_haproxy(dir.path(), &replicas).await;
    let mut nodes = Vec::new();
    for name in NODES {
        // The default backoff (500 ms doubling to 30 s), as deployed.
        nodes.push(start_node(dir.path(), &pki, name, lb, Default::default()).await);
    }
    let client = http_client();
    let a = &replicas[0];
    for name in NODES {
        wait_until(&format!("{name} ready on edge-a"), WAIT, || async {
            a.node_named(&client, name).await["phase"] == "ready"
        })
        .await;
    }
    assert_eq!(a.readyz(&client).await.0, 200, "edge-a is held by every node");
    // Both nodes dial for edge-b and land on edge-a several times each (a
    // pod that takes seconds to start): the backoff a duplicate used to
    // grow (0.5, 1, 2, 4, then 8 to 16 s).
    wait_until("ten duplicate dials on edge-a", Duration::from_secs(60), || async {
        a.metric(&client, DUPLICATES).await >= 10.0
    })
    .await;

    // A steady load of both nodes' models through the load balancer.
    for model in MODELS {
        wait_until(&format!("the load balancer routes {model}"), WAIT, || async {
            streamed_through(&client, lb_http, model).await.is_ok()
        })
        .await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let load = Load::start(&client, lb_http, MODELS.into_iter().chain(MODELS), &stop);

    replicas[1].start().await;
    let listening = std::time::Instant::now();
    let b = &replicas[1];
    // Every /readyz answer edge-b gives until its first 200.
    let watch = {
        let (client, url) = (client.clone(), format!("http://{}/readyz", b.http));
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let answer = match client.get(&url).send().await {
                    Ok(response) => json_body(response).await,
                    Err(_) => (0, Value::Null),
                };
                seen.push(answer.clone());
                if answer.0 == 200 {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    wait_until("both nodes ready on edge-b", Duration::from_secs(60), || async {
        let (one, two) = tokio::join!(b.node_named(&client, NODES[0]), b.node_named(&client, NODES[1]));
        one["phase"] == "ready" && two["phase"] == "ready"
    })
    .await;
    let held = listening.elapsed();
    eprintln!("both nodes held edge-b {} ms after it listened", held.as_millis());
    let readiness = tokio::time::timeout(WAIT, watch).await.expect("edge-b turns ready").unwrap();
    // The load balancer sends edge-b both models (its counters move).
    for model in MODELS {
        let answered =
            format!("iop_edge_http_requests_total{{api=\"chat_completions\",route=\"{model}\",outcome=\"ok\"}}");
        wait_until(&format!("edge-b answering {model}"), WAIT, || async { b.metric(&client, &answered).await >= 2.0 })
            .await;
    }
    stop.cancel();
    let (answered, failed) = load.finish().await;
    let first: Vec<_> = failed.iter().take(3).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed, first: {first:?}",
        failed.len(),
        answered as usize + failed.len()
    );
    let (ready, starting) = readiness.split_last().unwrap();
    assert_eq!(ready.1["ready_nodes"], 2, "edge-b turned ready with both nodes held: {ready:?}");
    for (status, body) in starting {
        assert_ne!(*status, 200, "{body}");
    }
    assert!(held < Duration::from_secs(5), "both nodes hold edge-b within seconds, took {held:?}");
    drop(nodes);
}

/// `/readyz` says `starting` until every node of the config is ready here
/// (a load balancer sends nothing to a replica that cannot run what the
/// others run), and why; then `ready`, which a node lost later does not
/// undo (it is lost for every replica); on SIGTERM it says `draining`
/// while the replica still answers for the drain delay.
#[tokio::test]
async fn readyz_waits_for_every_node_and_fails_while_draining() {
    const OTHER: &str = "mac-2";
    let mut stack = Stack::start(StackOptions {
        start_node: false,
        extra_nodes: vec![OTHER],
        edge_args: vec!["--drain-delay-ms", "2000"],
        ..Default::default()
    })
    .await;
    let readyz = |stack: &Stack| {
        let request = stack.client.get(stack.url("/readyz"));
        async move { json_body(request.send().await.unwrap()).await }
    };
    let starts_with = |body: &Value, prefix: &str| body["reason"].as_str().is_some_and(|r| r.starts_with(prefix));
    let (status, body) = readyz(&stack).await;
    assert_eq!(
        (status, &body["status"], &body["ready_nodes"], &body["configured_nodes"]),
        (503, &json!("starting"), &json!(0), &json!(2))
    );
    assert!(starts_with(&body, "waiting for nodes: 0 of 2 ready (ready anyway in "), "{body}");
    for name in [NODE, OTHER] {
        let pair = stack.pki.node_cert(name, iop_e2e::pki::Validity::Current).unwrap();
        let (node, _) = stack.spawn_node(&pair, &stack.pki.ca_file.clone()).await;
        stack.nodes.push(node);
        stack.wait_node_ready(name).await;
        if name == NODE {
            // One node of two: the other's models would answer 503 here.
            let (status, body) = readyz(&stack).await;
            assert_eq!((status, &body["status"], &body["ready_nodes"]), (503, &json!("starting"), &json!(1)), "{body}");
            assert!(starts_with(&body, "waiting for nodes: 1 of 2 ready"), "{body}");
        }
    }
    let every = json!({"status": "ready", "ready_nodes": 2, "configured_nodes": 2, "reason": "every node holds a ready session: 2 of 2"});
    assert_eq!(readyz(&stack).await, (200, every));

    // A node lost after the replica was ready leaves it ready.
    drop(stack.nodes.pop());
    wait_until("mac-2 gone", WAIT, || async { stack.node(OTHER).await["connected"] == false }).await;
    let (status, body) = readyz(&stack).await;
    assert_eq!((status, &body["ready_nodes"]), (200, &json!(1)), "{body}");
    assert_eq!(body["reason"], "ready since every node was; 1 of 2 nodes ready now");

    let edge = stack.edge.as_ref().unwrap().pid();
    assert!(std::process::Command::new("kill").args(["-TERM", &edge.to_string()]).status().unwrap().success());
    wait_until("readyz says draining", WAIT, || async { readyz(&stack).await.0 == 503 }).await;
    assert_eq!(readyz(&stack).await.1["status"], "draining");
    let chat = json!({"model": "mock-ollama", "messages": [{"role": "user", "content": "still there?"}]});
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat).await).await;
    assert_eq!(status, 200, "a draining replica still answers during the delay: {body}");
}

/// Faults in sequence across replicas: a provider that starts after its
/// node turns available on both replicas without a node restart; a replica
/// that crashes (SIGKILL, no drain) leaves the other's session untouched
/// and, restarted, learns the provider's health on its new session; the
/// provider's death is then seen by both.
#[tokio::test]
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn a_late_provider_then_a_crashed_replica_then_a_dead_provider() {
    let late = free_port();
    let late_url = format!("http://{late}");
    let mut fleet = Fleet::start_with(vec![provider("late", Adapter::Ollama, "mock", "mock-late", &late_url)]).await;
    let client = fleet.client.clone();
    let generation_b = fleet.replicas[1].generation(&client).await;
    for replica in &fleet.replicas {
        replica.wait_health(&client, "late", "unavailable").await;
        let (status, body) = replica.chat_with(&client, "mock-late").await;
        assert_eq!((status, body["error"]["code"].as_str()), (503, Some("no_provider_available")), "{body}");
    }

    let (late_mock, _) = spawn_mock(&late.to_string()).await;
    for replica in &fleet.replicas {
        replica.wait_health(&client, "late", "available").await;
        let (status, body) = replica.chat_with(&client, "mock-late").await;
        assert_eq!(status, 200, "{} serves the late provider: {body}", replica.id);
    }

    // edge-a crashes: edge-b's session is the same one and serves on.
    drop(fleet.replicas[0].process.take());
    let (status, body) = fleet.replicas[1].chat_with(&client, "mock-late").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fleet.replicas[1].node(&client).await["generation"], generation_b);

    fleet.replicas[0].start().await;
    fleet.replicas[0].wait_ready(&client).await;
    fleet.replicas[0].wait_health(&client, "late", "available").await;
    let (status, body) = fleet.replicas[0].chat_with(&client, "mock-late").await;
    assert_eq!(status, 200, "the restarted replica serves the late provider: {body}");
    assert_eq!(fleet.replicas[1].node(&client).await["generation"], generation_b, "edge-b's session never moved");

    drop(late_mock);
    for replica in &fleet.replicas {
        replica.wait_health(&client, "late", "unavailable").await;
        assert_eq!(replica.health(&client, "ollama-mock").await, "available", "evidence about one provider only");
    }
    drop(fleet.node.take());
}

/// The node follows the replica set: a reload that lists a replica it does
/// not hold sends it dialing (every dial lands on a held replica here, a
/// duplicate), and a new replica id in place of an old one, as a rollout
/// names its new pods, is reached and held, all without touching the
/// sessions it keeps.
#[tokio::test]
#[cfg_attr(iop_absent_haproxy, ignore = "needs haproxy: scripts/test-deps --haproxy")]
async fn the_node_follows_the_replica_set() {
    let mut fleet = Fleet::start().await;
    let client = fleet.client.clone();
    let generation_a = fleet.replicas[0].generation(&client).await;
    let generation_b = fleet.replicas[1].generation(&client).await;
    let duplicates = || async {
        fleet.replicas[0].metric(&client, DUPLICATES).await + fleet.replicas[1].metric(&client, DUPLICATES).await
    };

    // A third replica is listed (its pod is starting): the node dials for it.
    let before = duplicates().await;
    for replica in &fleet.replicas {
        replica.reload_replicas(&client, &["edge-a", "edge-b", "edge-c"]).await;
    }
    wait_until("the node dials for the listed edge-c", WAIT, || async { duplicates().await > before }).await;
    assert_eq!(fleet.replicas[0].node(&client).await["generation"], generation_a, "a set change keeps sessions");
    assert_eq!(fleet.replicas[1].node(&client).await["generation"], generation_b);

    // edge-b goes and edge-c comes up on its address (a rollout's new pod):
    // the node reaches it through the load balancer and holds it.
    let b = fleet.replicas.pop().unwrap();
    b.process.unwrap().terminate().await;
    let config = b.config.with_file_name("edge-c.yaml");
    std::fs::copy(&b.config, &config).unwrap();
    let mut c = Replica { id: "edge-c", config, process: None, ..b };
    c.start().await;
    fleet.replicas[0].reload_replicas(&client, &["edge-a", "edge-c"]).await;
    c.reload_replicas(&client, &["edge-a", "edge-c"]).await;
    c.wait_ready(&client).await;
    let (status, body) = c.chat(&client).await;
    assert_eq!(status, 200, "the new replica serves the node's provider: {body}");
    assert_eq!(fleet.replicas[0].node(&client).await["generation"], generation_a, "edge-a's session never moved");
    fleet.replicas.push(c);
    drop(fleet.node.take());
}
