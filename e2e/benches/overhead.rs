//! Gateway overhead, measured (not asserted): `cargo bench -p iop-e2e --bench overhead`.
//!
//! Starts the mock provider in this process and the Edge and the Node as
//! child processes (this same executable in another role), joined by real
//! mTLS gRPC on loopback. Measures, direct-to-provider and through IOP side
//! by side with their ratio:
//! - non-streaming latency at concurrency 1 and 64 (p50, p99, throughput),
//! - streaming time to first byte and inter-chunk delta at concurrency 1 and 64,
//! - Edge and Node resident memory at idle and with 1,000 concurrent open streams.
//!
//! Results are printed and written to `target/iop-bench/overhead.md`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use iop_e2e::harness::{self, DevPki, ProviderSpec};
use iop_e2e::mock_provider::{self, MockConfig};
use iop_e2e::pki::Validity;
use iop_proto::config::{Adapter, Limits};
use iop_proto::liveness::HeartbeatProfile;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

const ROLE_ENV: &str = "IOP_BENCH_ROLE";
const CONFIG_ENV: &str = "IOP_BENCH_CONFIG";
const REQUESTS: usize = 640;
const WARMUP: usize = 64;
const OPEN_STREAMS: usize = 1000;

fn main() {
    iop_edge::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("edge") => runtime.block_on(edge_role()),
        Ok("node") => runtime.block_on(node_role()),
        _ => runtime.block_on(bench()),
    }
}

async fn edge_role() {
    let config = iop_edge::config::load(&PathBuf::from(std::env::var(CONFIG_ENV).unwrap())).unwrap();
    let edge = iop_edge::Edge::bind(config, HeartbeatProfile::default()).await.unwrap();
    println!("iop-edge listening http={} grpc={}", edge.http_addr(), edge.grpc_addr());
    edge.serve(iop_edge::shutdown_signal()).await.unwrap();
}

async fn node_role() {
    let config = iop_node::NodeConfig::load(&PathBuf::from(std::env::var(CONFIG_ENV).unwrap())).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        iop_edge::shutdown_signal().await;
        stop.cancel();
    });
    iop_node::run(config, HeartbeatProfile::default(), shutdown).await.unwrap();
}

fn spawn_role(role: &str, config: &std::path::Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(ROLE_ENV, role).env(CONFIG_ENV, config).env("RUST_LOG", "warn").kill_on_drop(true);
    command
}

fn rss_kib(child: &Child) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id().unwrap())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn body(model: &str, stream: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model, "stream": stream,
        "messages": [{ "role": "user", "content": "benchmark prompt" }]
    }))
    .unwrap()
}

#[derive(Default)]
struct Samples {
    /// Whole response (non-streaming) or first body byte (streaming).
    latency: Vec<Duration>,
    /// Gaps between body chunks (streaming).
    gaps: Vec<Duration>,
    wall: Duration,
}

fn pct(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

async fn one(client: &reqwest::Client, url: &str, body: &[u8], stream: bool, out: &mut Samples) {
    let started = Instant::now();
    let response = client.post(url).header("content-type", "application/json").body(body.to_vec()).send().await;
    let response = response.expect("request");
    assert!(response.status().is_success(), "{url}: {}", response.status());
    let mut chunks = response.bytes_stream();
    let mut last: Option<Instant> = None;
    while let Some(chunk) = chunks.next().await {
        chunk.expect("body");
        let now = Instant::now();
        match last {
            None if stream => out.latency.push(now - started),
            Some(previous) => out.gaps.push(now - previous),
            None => {}
        }
        last = Some(now);
    }
    if !stream {
        out.latency.push(started.elapsed());
    }
}

async fn load(client: &reqwest::Client, url: &str, body: Vec<u8>, stream: bool, concurrency: usize) -> Samples {
    let mut warm = Samples::default();
    for _ in 0..WARMUP {
        one(client, url, &body, stream, &mut warm).await;
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_string(), body.clone());
            tokio::spawn(async move {
                let mut samples = Samples::default();
                for _ in 0..REQUESTS / concurrency {
                    one(&client, &url, &body, stream, &mut samples).await;
                }
                samples
            })
        })
        .collect();
    let mut all = Samples::default();
    for task in tasks {
        let s = task.await.unwrap();
        all.latency.extend(s.latency);
        all.gaps.extend(s.gaps);
    }
    all.wall = started.elapsed();
    all.latency.sort();
    all.gaps.sort();
    all
}

fn row(report: &mut String, what: &str, direct: f64, gateway: f64, unit: &str) {
    let line = format!(
        "| {what} | {direct:.3} {unit} | {gateway:.3} {unit} | {:+.3} {unit} | {:.2}x |",
        gateway - direct,
        gateway / direct
    );
    println!("{line}");
    writeln!(report, "{line}").unwrap();
}

async fn bench() {
    let mock =
        mock_provider::start(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(dir.path()).unwrap();
    let node_pair = pki.node_cert("bench", Validity::Current).unwrap();
    let spec = |id: &str, target: &str, capacity| ProviderSpec {
        id: id.into(),
        node: "bench".into(),
        adapter: Adapter::Openai,
        base_url: mock.base_url(),
        target_model: target.into(),
        public_model: id.into(),
        capacity,
        priority: 0,
        mode: Default::default(),
        stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        keep_warm: false,
    };
    let providers =
        [spec("plain", "mock", 128), spec("words", "mock@words=50", 128), spec("hold", "mock@stall_after=1", 1024)];
    let any = "127.0.0.1:0".parse().unwrap();
    let mut config = harness::edge_config(&pki, any, any, &["bench"], &providers);
    config.limits = Limits { queue_depth: 2048, ..Limits::default() };
    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(&edge_config, config.to_yaml()).unwrap();
    let mut edge = spawn_role("edge", &edge_config).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(edge.stdout.take().unwrap()));
    let line = lines.next_line().await.unwrap().expect("edge ready line");
    let (http, grpc) = (harness::addr_field(&line, "http"), harness::addr_field(&line, "grpc"));
    let node_config = harness::node_config(grpc, &pki.ca_file, &node_pair, (50, 500));
    let node_config_path = dir.path().join("node.yaml");
    std::fs::write(&node_config_path, serde_saphyr::to_string(&node_config).unwrap()).unwrap();
    let node = spawn_role("node", &node_config_path).spawn().unwrap();

    let client = reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(2048).build().unwrap();
    let gateway = format!("http://{http}/v1/chat/completions");
    let direct = format!("{}/v1/chat/completions", mock.base_url());
    harness::wait_until("node ready", Duration::from_secs(30), || async {
        let r = client.get(format!("http://{http}/readyz")).send().await;
        match r {
            Ok(r) => r.text().await.unwrap_or_default().contains("\"ready_nodes\":1"),
            Err(_) => false,
        }
    })
    .await;

    let mut report = String::new();
    let header = "| measure | direct | through IOP | added | ratio |\n|---|---|---|---|---|";
    println!("gateway overhead on loopback, {REQUESTS} requests per row after {WARMUP} warm-up requests\n{header}");
    writeln!(report, "{header}").unwrap();
    for concurrency in [1, 64] {
        let d = load(&client, &direct, body("mock", false), false, concurrency).await;
        let g = load(&client, &gateway, body("plain", false), false, concurrency).await;
        row(
            &mut report,
            &format!("non-streaming p50, c={concurrency}"),
            pct(&d.latency, 50),
            pct(&g.latency, 50),
            "ms",
        );
        row(
            &mut report,
            &format!("non-streaming p99, c={concurrency}"),
            pct(&d.latency, 99),
            pct(&g.latency, 99),
            "ms",
        );
        let rps = |s: &Samples| s.latency.len() as f64 / s.wall.as_secs_f64();
        row(&mut report, &format!("non-streaming throughput, c={concurrency}"), rps(&d), rps(&g), "req/s");
        let d = load(&client, &direct, body("mock@words=50", true), true, concurrency).await;
        let g = load(&client, &gateway, body("words", true), true, concurrency).await;
        row(
            &mut report,
            &format!("streaming TTFB p50, c={concurrency}"),
            pct(&d.latency, 50),
            pct(&g.latency, 50),
            "ms",
        );
        row(
            &mut report,
            &format!("streaming TTFB p99, c={concurrency}"),
            pct(&d.latency, 99),
            pct(&g.latency, 99),
            "ms",
        );
        row(&mut report, &format!("inter-chunk p50, c={concurrency}"), pct(&d.gaps, 50), pct(&g.gaps, 50), "ms");
        row(&mut report, &format!("inter-chunk p99, c={concurrency}"), pct(&d.gaps, 99), pct(&g.gaps, 99), "ms");
    }

    let (edge_idle, node_idle) = (rss_kib(&edge), rss_kib(&node));
    let mut open = Vec::with_capacity(OPEN_STREAMS);
    for _ in 0..OPEN_STREAMS {
        let (client, url) = (client.clone(), gateway.clone());
        open.push(tokio::spawn(async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .body(body("hold", true))
                .send()
                .await
                .unwrap();
            let mut chunks = response.bytes_stream();
            chunks.next().await.expect("first chunk").unwrap();
            chunks // held open: the provider stalls after one chunk
        }));
    }
    let mut held = Vec::with_capacity(OPEN_STREAMS);
    for task in open {
        held.push(task.await.unwrap());
    }
    let (edge_busy, node_busy) = (rss_kib(&edge), rss_kib(&node));
    drop(held);
    let mem = format!(
        "\nresident memory (VmRSS)\n| process | idle | {OPEN_STREAMS} open streams | per stream |\n|---|---|---|---|\n\
         | iop-edge | {:.1} MiB | {:.1} MiB | {:.1} KiB |\n| iop-node | {:.1} MiB | {:.1} MiB | {:.1} KiB |",
        edge_idle as f64 / 1024.0,
        edge_busy as f64 / 1024.0,
        (edge_busy.saturating_sub(edge_idle)) as f64 / OPEN_STREAMS as f64,
        node_idle as f64 / 1024.0,
        node_busy as f64 / 1024.0,
        (node_busy.saturating_sub(node_idle)) as f64 / OPEN_STREAMS as f64,
    );
    println!("{mem}");
    report.push_str(&mem);
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/iop-bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("overhead.md"), report + "\n").unwrap();
    println!("written to target/iop-bench/overhead.md");
}
