//! `iop-floods` (`scripts/floods`): each flood of issue 41 against a real
//! `iop-edge` and `iop-node` on loopback (127.0.0.2 and up standing in for
//! separate sources), and beside it the latency of an authenticated
//! request and the Edge's resident memory. It measures; it asserts
//! nothing (the tests in `e2e/tests/hostile_load.rs` do).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use iop_e2e::harness::{self, DevPki, Proc, ProviderSpec};
use iop_e2e::pki::Validity;
use iop_proto::config::{Adapter, AuthConfig, AuthMode, ProviderMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

const NODE: &str = "floods";
const MODEL: &str = "floods";
const KEY: &str = "sk-floods-probe-0123456789";
/// Limited to 6 requests a minute and 2 at once (the attacker).
const LIMITED_KEY: &str = "sk-floods-limited-0123456789";
const MIB: usize = 1 << 20;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
    iop_edge::install_crypto_provider();
    match run().await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iop-floods: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Gateway {
    http: SocketAddr,
    grpc: SocketAddr,
    admin: SocketAddr,
    edge: Proc,
    client: reqwest::Client,
}

async fn run() -> Result<String, Error> {
    let dir = tempfile::Builder::new().prefix("iop-floods-").tempdir()?;
    let (_upstream, upstream) = harness::spawn_fast_upstream().await;
    let pki = DevPki::create(dir.path())?;
    let provider = ProviderSpec {
        id: MODEL.into(),
        node: NODE.into(),
        adapter: Adapter::Openai,
        base_url: upstream,
        target_model: "floods-model".into(),
        public_model: MODEL.into(),
        capacity: 64,
        priority: 0,
        mode: ProviderMode::Normalized,
        stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        keep_warm: false,
    };
    let any = "127.0.0.1:0".parse()?;
    let mut config = harness::edge_config(&pki, any, any, &[NODE], &[provider]);
    let hash = |key: &str| iop_edge::auth::to_hex(&iop_edge::auth::sha256(key.as_bytes()));
    let keys = format!(
        "principals:\n  - {{ name: probe, key_sha256: {}, models: ['*'] }}\n  - {{ name: limited, key_sha256: {}, models: ['*'], requests_per_minute: 6, max_concurrent_requests: 2 }}\n",
        hash(KEY),
        hash(LIMITED_KEY)
    );
    let keys_file = dir.path().join("keys.yaml");
    std::fs::write(&keys_file, keys)?;
    config.auth = AuthConfig { mode: AuthMode::Required, keys_file: Some(keys_file), ..Default::default() };
    let (edge, line) = harness::spawn_edge(dir.path(), &config).await;
    let gateway = Gateway {
        http: harness::addr_field(&line, "http"),
        grpc: harness::addr_field(&line, "grpc"),
        admin: harness::addr_field(&line, "admin"),
        edge,
        client: reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?,
    };
    let node_pair = pki.node_cert(NODE, Validity::Current)?;
    let node_config = harness::node_config(gateway.grpc, &pki.ca_file, &node_pair, (50, 500));
    let node_yaml = harness::write_node_config(dir.path(), node_config);
    let mut node = harness::spawn_node(&node_yaml).await;
    gateway.wait_ready().await?;

    let mut report = String::from(
        "| flood | authenticated request (median / max of 5) | Edge RSS before / during | outcome |\n|---|---|---|---|\n",
    );
    let quiet = gateway.probe().await?;
    writeln!(report, "| none | {quiet} | {} MiB | |", rss_mib(gateway.edge.pid()))?;

    // 1. Idle HTTP/2 connections: preface and SETTINGS, then nothing.
    let row =
        gateway.flood("4,200 idle HTTP/2 connections, 100 sources", || flood_http(&gateway, 4200, idle_http2)).await?;
    report += &row;
    // 2. HTTP/1 requests whose headers never end.
    let row = gateway
        .flood("4,200 unfinished HTTP/1 headers, 100 sources", || flood_http(&gateway, 4200, partial_http1))
        .await?;
    report += &row;
    // 3. Held 4 MiB bodies (one byte short), a limited key and any key.
    let row = gateway
        .flood("100 held 4 MiB bodies, a key limited to 2 at once", || held_bodies(&gateway, LIMITED_KEY, 100))
        .await?;
    report += &row;
    report += &gateway.flood("300 held 4 MiB bodies, an unlimited key", || held_bodies(&gateway, KEY, 300)).await?;
    // 4. count_tokens, 100 at once from the limited key.
    let statuses = count_tokens(&gateway, 100).await;
    writeln!(report, "| 100 concurrent 1 MB count_tokens, the limited key | | | {statuses} |")?;
    // 5. The admin listener, a rebound Host.
    let rebound = gateway
        .client
        .get(format!("http://{}/admin/v1/nodes", gateway.admin))
        .header("host", "evil.example")
        .send()
        .await?
        .status();
    writeln!(report, "| admin API, `Host: evil.example` | | | {} |", rebound.as_u16())?;
    // 6. Stalled TLS handshakes while the node reconnects.
    node.terminate().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut flood = JoinSet::new();
    for i in 0..100u8 {
        flood.spawn(stalled_hellos(i, gateway.grpc, 16, stop.clone()));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dialed = Instant::now();
    node = harness::spawn_node(&node_yaml).await;
    gateway.wait_ready().await?;
    let took = dialed.elapsed();
    writeln!(
        report,
        "| 1,600 stalled TLS ClientHellos, 100 sources (16 each) | | {} MiB | a restarted node ready {} ms after it started |",
        rss_mib(gateway.edge.pid()),
        took.as_millis()
    )?;
    stop.cancel();
    while flood.join_next().await.is_some() {}
    node.terminate().await;
    Ok(report)
}

/// A JSON request body.
fn json(request: reqwest::RequestBuilder, body: &serde_json::Value) -> reqwest::RequestBuilder {
    request.header("content-type", "application/json").body(body.to_string())
}

impl Gateway {
    async fn wait_ready(&self) -> Result<(), Error> {
        for _ in 0..600 {
            let answer = self.client.get(format!("http://{}/admin/v1/nodes", self.admin)).send().await?;
            let nodes: serde_json::Value = serde_json::from_slice(&answer.bytes().await?)?;
            if nodes["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["phase"] == "ready")) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the node did not become ready".into())
    }

    /// Five authenticated chat completions, one after another: their
    /// median and longest time, or the failure.
    async fn probe(&self) -> Result<String, Error> {
        let mut times = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let body = serde_json::json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }] });
            let request = self.client.post(format!("http://{}/v1/chat/completions", self.http)).bearer_auth(KEY);
            let response = json(request, &body).send();
            match response.await {
                Ok(r) if r.status().is_success() => times.push(started.elapsed()),
                Ok(r) => return Ok(format!("HTTP {}", r.status().as_u16())),
                Err(e) => return Ok(format!("failed: {e}")),
            }
        }
        times.sort();
        Ok(format!("{:.1} / {:.1} ms", times[2].as_secs_f64() * 1e3, times[4].as_secs_f64() * 1e3))
    }

    /// Runs `flood` (which returns what it holds and a word on its
    /// outcome), probes beside it, and reports a table row.
    async fn flood<F, Fut>(&self, name: &str, flood: F) -> Result<String, Error>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = (Vec<TcpStream>, String)>,
    {
        let before = rss_mib(self.edge.pid());
        let (held, outcome) = flood().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = rss_mib(self.edge.pid());
        let probe = self.probe().await?;
        drop(held);
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(format!("| {name} | {probe} | {before} / {during} MiB | {outcome} |\n"))
    }
}

fn rss_mib(pid: u32) -> u64 {
    harness::rss_kib(pid) / 1024
}

async fn connect_from(source: u8, to: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from(([127, 0, 0, 2 + source % 100], 0))).ok()?;
    socket.connect(to).await.ok()
}

async fn idle_http2(mut tcp: TcpStream) -> TcpStream {
    let _ = tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await;
    tcp
}

async fn partial_http1(mut tcp: TcpStream) -> TcpStream {
    let _ = tcp.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await;
    tcp
}

/// `count` connections from 100 sources, each opened with `open`.
async fn flood_http<F, Fut>(gateway: &Gateway, count: usize, open: F) -> (Vec<TcpStream>, String)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = TcpStream>,
{
    let mut held = Vec::new();
    for i in 0..count {
        if let Some(tcp) = connect_from((i % 100) as u8, gateway.http).await {
            held.push(open(tcp).await);
        }
    }
    let shed = metric(gateway, "iop_edge_http_connections_refused_total{reason=\"shed_idle\"}").await;
    let open = metric(gateway, "iop_edge_http_connections ").await;
    let outcome = format!("{} opened; {open} open at the Edge, {shed} shed in all so far", held.len());
    (held, outcome)
}

/// `count` requests of `key` whose 4 MiB body stops one byte short.
async fn held_bodies(gateway: &Gateway, key: &str, count: usize) -> (Vec<TcpStream>, String) {
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..count {
        let Some(mut tcp) = connect_from((i % 100) as u8, gateway.http).await else { continue };
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            4 * MIB
        );
        let _ = tcp.write_all(head.as_bytes()).await;
        let _ = tcp.write_all(&vec![b' '; 4 * MIB - 1]).await;
        let mut answer = [0u8; 12];
        match tokio::time::timeout(Duration::from_millis(20), tcp.read(&mut answer)).await {
            Ok(Ok(n)) if n > 0 => refused += 1,
            _ => held.push(tcp),
        }
    }
    let in_flight = metric(gateway, "iop_edge_http_body_bytes_in_flight").await;
    let outcome = format!(
        "{} held, {refused} answered at once; {:.0} MiB of bodies held by the Edge",
        held.len(),
        in_flight / MIB as f64
    );
    (held, outcome)
}

/// `count` concurrent 1 MB count_tokens calls of the limited key: their
/// statuses.
async fn count_tokens(gateway: &Gateway, count: usize) -> String {
    let text = "x".repeat(MIB);
    let body = serde_json::json!({ "model": MODEL, "messages": [{ "role": "user", "content": text }] });
    let mut calls = JoinSet::new();
    for _ in 0..count {
        let request = gateway.client.post(format!("http://{}/v1/messages/count_tokens", gateway.http));
        let request = json(request.bearer_auth(LIMITED_KEY), &body);
        calls.spawn(async move { request.send().await.map(|r| r.status().as_u16()).unwrap_or(0) });
    }
    let mut statuses = std::collections::BTreeMap::new();
    while let Some(Ok(status)) = calls.join_next().await {
        *statuses.entry(status).or_insert(0) += 1;
    }
    statuses.iter().map(|(s, n)| format!("{n} x {s}")).collect::<Vec<_>>().join(", ")
}

/// Keeps `per_source` TLS handshakes stalled from `127.0.0.<2 + source>`,
/// reopening those the Edge closes, until `stop`.
async fn stalled_hellos(source: u8, to: SocketAddr, per_source: usize, stop: tokio_util::sync::CancellationToken) {
    let mut open = JoinSet::new();
    loop {
        while open.len() < per_source {
            open.spawn(async move {
                let Some(mut tcp) = connect_from(source, to).await else { return };
                let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc]).await;
                let mut sink = [0u8; 64];
                while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
        tokio::select! {
            () = stop.cancelled() => return,
            _ = open.join_next() => {}
        }
    }
}

async fn metric(gateway: &Gateway, sample: &str) -> f64 {
    let Ok(response) = gateway.client.get(format!("http://{}/metrics", gateway.admin)).send().await else { return 0.0 };
    let text = response.text().await.unwrap_or_default();
    text.lines().find(|l| l.starts_with(sample)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
}
