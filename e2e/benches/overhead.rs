//! Gateway overhead: the latency Edge + Node add on top of calling the mock
//! provider directly, at concurrency 1, in one run. Not a test: it prints
//! numbers (`cargo bench -p iop-e2e --bench overhead`).
//!
//! Everything runs in this process on loopback with real mTLS gRPC between
//! Edge and Node; both paths hit the mock's OpenAI endpoint (the Node's
//! OpenAI adapter), with keep-alive HTTP clients.

use std::time::{Duration, Instant};

use iop_e2e::harness::{self, DevPki, ProviderSpec};
use iop_e2e::mock_provider::{self, MockConfig};
use iop_e2e::pki::Validity;
use iop_proto::config::Adapter;
use iop_proto::liveness::HeartbeatProfile;
use tokio_util::sync::CancellationToken;

const WARMUP: usize = 50;
const SAMPLES: usize = 500;

fn body(model: &str, stream: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model, "stream": stream,
        "messages": [{ "role": "user", "content": "benchmark prompt" }]
    }))
    .unwrap()
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    Stats { p50: samples[samples.len() / 2], p99: samples[samples.len() * 99 / 100], mean }
}

/// Time until the whole body was read (`first_byte = false`) or until the
/// first body chunk arrived (`first_byte = true`).
async fn measure(client: &reqwest::Client, url: &str, body: &[u8], first_byte: bool) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..WARMUP + SAMPLES {
        let started = Instant::now();
        let mut response = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .expect("request");
        assert!(response.status().is_success(), "{url}: {}", response.status());
        let mut elapsed = None;
        while let Some(_chunk) = response.chunk().await.expect("body") {
            if first_byte && elapsed.is_none() {
                elapsed = Some(started.elapsed());
            }
        }
        if i >= WARMUP {
            samples.push(elapsed.unwrap_or_else(|| started.elapsed()));
        }
    }
    samples
}

fn report(what: &str, direct: Stats, gateway: Stats) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{what}");
    println!(
        "  direct   p50 {:7.3} ms  p99 {:7.3} ms  mean {:7.3} ms",
        ms(direct.p50),
        ms(direct.p99),
        ms(direct.mean)
    );
    println!(
        "  gateway  p50 {:7.3} ms  p99 {:7.3} ms  mean {:7.3} ms",
        ms(gateway.p50),
        ms(gateway.p99),
        ms(gateway.mean)
    );
    println!(
        "  added    p50 {:7.3} ms  ratio p50 {:.2}x  ratio mean {:.2}x",
        ms(gateway.p50) - ms(direct.p50),
        ms(gateway.p50) / ms(direct.p50),
        ms(gateway.mean) / ms(direct.mean)
    );
}

#[tokio::main]
async fn main() {
    iop_edge::install_crypto_provider();
    let shutdown = CancellationToken::new();
    let mock =
        mock_provider::start(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), MockConfig::default()).await;

    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(dir.path()).unwrap();
    let node_pair = pki.node_cert("bench", Validity::Current).unwrap();
    let provider = ProviderSpec {
        id: "bench".into(),
        node: "bench".into(),
        adapter: Adapter::Openai,
        base_url: mock.base_url(),
        target_model: "mock".into(),
        public_model: "mock".into(),
        capacity: 64,
        priority: 0,
    };
    let any = "127.0.0.1:0".parse().unwrap();
    let edge = iop_edge::Edge::bind(
        harness::edge_config(&pki, any, any, &["bench"], &[provider]),
        HeartbeatProfile::default(),
    )
    .await
    .unwrap();
    let (http, grpc, state) = (edge.http_addr(), edge.grpc_addr(), edge.state());
    let stop = shutdown.clone();
    tokio::spawn(edge.serve(async move { stop.cancelled().await }));
    let node_config = harness::node_config(grpc, &pki.ca_file, &node_pair, (50, 500));
    tokio::spawn(iop_node::run(node_config, HeartbeatProfile::default(), shutdown.clone()));
    while state.registry.ready_count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
    let direct_url = format!("{}/v1/chat/completions", mock.base_url());
    let gateway_url = format!("http://{http}/v1/chat/completions");
    println!("gateway overhead, concurrency 1, {SAMPLES} samples after {WARMUP} warm-up requests");
    for (what, stream, first_byte) in [
        ("non-streaming, full response", false, false),
        ("streaming, full response", true, false),
        ("streaming, time to first byte", true, true),
    ] {
        let direct = measure(&client, &direct_url, &body("mock", stream), first_byte).await;
        let gateway = measure(&client, &gateway_url, &body("mock", stream), first_byte).await;
        report(what, stats(direct), stats(gateway));
    }
    shutdown.cancel();
}
