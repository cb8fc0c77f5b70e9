//! `iop-bench`: the side-by-side benchmark behind `scripts/bench` (run that,
//! it builds the release binaries and installs `oha` first).
//!
//! Starts `iop-fast-upstream`, `iop-edge` and `iop-node` as separate
//! processes (release binaries next to this one), joined by real mTLS gRPC on
//! loopback, with two providers on the one node and the one upstream:
//! `bench` (normalized) and `bench-tunnel` (tunnel). Then runs `oha` against
//! the upstream directly and through the Edge, for JSON and SSE bodies, at
//! concurrency 1, 32 and 64 and at a fixed 50 req/s, and samples each
//! process's CPU time (`/proc/PID/stat` utime + stime) and context switches
//! (`voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` summed over
//! `/proc/PID/task/*/status`) before and after every scenario.
//!
//! The processes log at `RUST_LOG` (`scripts/bench` sets `warn`, so no
//! per-request logging is measured).
//!
//! Prints one Markdown table, with ratios to the direct run of the same body
//! and load, and writes it to `target/iop-bench/bench.md`. Measures only:
//! nothing is asserted.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use clap::Parser;
use iop_e2e::harness::{self, DevPki, ProviderSpec};
use iop_e2e::pki::Validity;
use iop_proto::config::{Adapter, Limits, ProviderMode};
use serde::Deserialize;
use tokio::process::Command;

const NODE: &str = "bench";
const TARGET_MODEL: &str = "bench-model";

#[derive(Parser)]
#[command(name = "iop-bench", about = "Direct vs through IOP (normalized, tunnel) with oha; CPU and context switches")]
struct Args {
    /// Seconds of load per concurrency scenario.
    #[arg(long, env = "IOP_BENCH_SECS", default_value_t = 3)]
    secs: u32,
    /// Seconds of load per fixed-rate (50 req/s) scenario.
    #[arg(long, env = "IOP_BENCH_RATE_SECS", default_value_t = 6)]
    rate_secs: u32,
    /// The `oha` executable.
    #[arg(long, env = "IOP_BENCH_OHA", default_value = "oha")]
    oha: PathBuf,
    /// Where to write the table.
    #[arg(long, default_value = "target/iop-bench/bench.md")]
    out: PathBuf,
    /// Run only the scenarios whose name contains this text (e.g.
    /// `normalized JSON c=32`); the direct run of the same body and load
    /// still runs first, for the ratios.
    #[arg(long)]
    only: Option<String>,
    /// Start the processes, print their URLs and pids, and wait for Ctrl-C
    /// instead of running scenarios (for `perf record -p PID` and a load of
    /// your own).
    #[arg(long)]
    serve: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Via {
    Direct,
    Normalized,
    Tunnel,
}

impl Via {
    fn label(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Normalized => "IOP normalized",
            Via::Tunnel => "IOP tunnel",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Load {
    Concurrency(u32),
    /// Fixed request rate (req/s), one connection.
    Rate(u32),
}

impl Load {
    fn label(self) -> String {
        match self {
            Load::Concurrency(c) => format!("c={c}"),
            Load::Rate(q) => format!("{q} req/s"),
        }
    }
}

/// A scenario's row name, e.g. `IOP normalized JSON c=32`.
fn scenario_name(via: Via, stream: bool, load: Load) -> String {
    format!("{} {} {}", via.label(), if stream { "SSE" } else { "JSON" }, load.label())
}

/// One oha run's summary, as the table needs it.
struct Outcome {
    ok: u64,
    failed: u64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Time to the first response body byte, p50.
    ttfb_p50_ms: f64,
    /// CPU µs per successful request: Edge, Node, upstream.
    cpu_us: [f64; 3],
    /// Context switches per successful request: Edge, Node, upstream.
    switches: [f64; 3],
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    iop_edge::install_crypto_provider();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iop-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

type Error = Box<dyn std::error::Error>;

async fn run(args: Args) -> Result<(), Error> {
    let oha_version = oha_version(&args.oha).await?;
    let clock_ticks = clock_ticks();
    let dir = tempfile::Builder::new().prefix("iop-bench-").tempdir()?;

    let (upstream, upstream_url) = harness::spawn_fast_upstream().await;

    let pki = DevPki::create(dir.path())?;
    let node_pair = pki.node_cert(NODE, Validity::Current)?;
    let provider = |id: &str, mode| ProviderSpec {
        id: id.into(),
        node: NODE.into(),
        adapter: Adapter::Openai,
        base_url: upstream_url.clone(),
        target_model: TARGET_MODEL.into(),
        public_model: id.into(),
        capacity: 256,
        priority: 0,
        mode,
        stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        keep_warm: false,
    };
    let providers = [provider("bench", ProviderMode::Normalized), provider("bench-tunnel", ProviderMode::Tunnel)];
    let any = "127.0.0.1:0".parse()?;
    let mut config = harness::edge_config(&pki, any, any, &[NODE], &providers);
    config.limits = Limits { queue_depth: 2048, ..Limits::default() };
    let (edge, line) = harness::spawn_edge(dir.path(), &config).await;
    let (http, grpc) = (harness::addr_field(&line, "http"), harness::addr_field(&line, "grpc"));

    let node_config = harness::node_config(grpc, &pki.ca_file, &node_pair, (50, 500));
    let node = harness::spawn_node(&harness::write_node_config(dir.path(), node_config)).await;

    let gateway = format!("http://{http}/v1/chat/completions");
    let direct = format!("{upstream_url}/v1/chat/completions");
    wait_serving(&gateway, &["bench", "bench-tunnel"]).await?;

    let pids = [edge.pid(), node.pid(), upstream.pid()];
    if args.serve {
        println!("gateway {gateway} (models bench, bench-tunnel)\ndirect  {direct} (model {TARGET_MODEL})");
        println!("pids: edge {} node {} upstream {}\nCtrl-C stops", pids[0], pids[1], pids[2]);
        tokio::signal::ctrl_c().await?;
        for process in [node, edge, upstream] {
            process.terminate().await;
        }
        return Ok(());
    }
    let loads = [Load::Concurrency(1), Load::Concurrency(32), Load::Concurrency(64), Load::Rate(50)];
    let mut baseline: HashMap<(bool, Load), (f64, f64, f64)> = HashMap::new();
    // Background cost with no traffic (heartbeats, health probes, timers):
    // it is inside every per-request figure below, most visibly at 50 req/s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_secs = 3;
    let before = pids.map(sample);
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let after = pids.map(sample);
    let idle_cpu = |i: usize| (after[i].ticks - before[i].ticks) as f64 * 1e3 / clock_ticks / idle_secs as f64;
    let idle_switches = |i: usize| after[i].switches.saturating_sub(before[i].switches) as f64 / idle_secs as f64;

    let mut report = String::new();
    writeln!(
        report,
        "{} s per concurrency scenario, {} s per fixed-rate scenario, {oha_version}, {} cores; \
         CPU and context switches per successful request (Edge / Node / upstream). \
         Idle, per second: CPU {:.1} / {:.1} / {:.1} ms, context switches {:.0} / {:.0} / {:.0}.\n",
        args.secs,
        args.rate_secs,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        idle_cpu(0),
        idle_cpu(1),
        idle_cpu(2),
        idle_switches(0),
        idle_switches(1),
        idle_switches(2),
    )?;
    writeln!(
        report,
        "| scenario | ok / failed | req/s | p50 ms | p99 ms | first byte p50 ms | req/s vs direct | added p50 ms \
         | added p99 ms | CPU µs/req Edge / Node / upstream | ctx switches/req Edge / Node / upstream |"
    )?;
    writeln!(report, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    print!("{report}");
    for stream in [false, true] {
        for via in [Via::Direct, Via::Normalized, Via::Tunnel] {
            let (url, model) = match via {
                Via::Direct => (&direct, TARGET_MODEL),
                Via::Normalized => (&gateway, "bench"),
                Via::Tunnel => (&gateway, "bench-tunnel"),
            };
            let body = format!(
                r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"benchmark prompt"}}]}}"#
            );
            let wanted = |load: Load| {
                let wanted =
                    |via: Via| args.only.as_ref().is_none_or(|only| scenario_name(via, stream, load).contains(only));
                wanted(via) || (via == Via::Direct && [Via::Normalized, Via::Tunnel].into_iter().any(wanted))
            };
            if !loads.into_iter().any(wanted) {
                continue;
            }
            // Warm-up: connections, pools and allocator caches; not recorded.
            oha(&args.oha, url, &body, &["-n", "500", "-c", "32"]).await?;
            for load in loads.into_iter().filter(|&load| wanted(load)) {
                let secs = match load {
                    Load::Concurrency(_) => args.secs,
                    Load::Rate(_) => args.rate_secs,
                };
                let outcome = scenario(&args.oha, url, &body, load, secs, pids, clock_ticks).await?;
                if via == Via::Direct {
                    baseline.insert((stream, load), (outcome.rps, outcome.p50_ms, outcome.p99_ms));
                }
                let (rps, p50, p99) = baseline.get(&(stream, load)).copied().unwrap_or((f64::NAN, f64::NAN, f64::NAN));
                let name = scenario_name(via, stream, load);
                let [ce, cn, cu] = outcome.cpu_us;
                let [se, sn, su] = outcome.switches;
                let line = if via == Via::Direct {
                    format!(
                        "| {name} | {} / {} | {:.0} | {:.2} | {:.2} | {:.2} | 1 | – | – | – / – / {cu:.0} | – / – / {su:.2} |",
                        outcome.ok, outcome.failed, outcome.rps, outcome.p50_ms, outcome.p99_ms, outcome.ttfb_p50_ms,
                    )
                } else {
                    format!(
                        "| {name} | {} / {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.3} | {:+.2} | {:+.2} | {ce:.0} / {cn:.0} / {cu:.0} \
                         | {se:.2} / {sn:.2} / {su:.2} |",
                        outcome.ok,
                        outcome.failed,
                        outcome.rps,
                        outcome.p50_ms,
                        outcome.p99_ms,
                        outcome.ttfb_p50_ms,
                        outcome.rps / rps,
                        outcome.p50_ms - p50,
                        outcome.p99_ms - p99,
                    )
                };
                println!("{line}");
                writeln!(report, "{line}")?;
            }
        }
    }

    // SIGTERM, node first, so each exits the way it would in production.
    for process in [node, edge, upstream] {
        process.terminate().await;
    }
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, &report)?;
    println!("\nwritten to {}", args.out.display());
    Ok(())
}

/// Waits until the node is connected and every model answers 200 (the node
/// probes its providers before it offers them).
async fn wait_serving(gateway: &str, models: &[&str]) -> Result<(), Error> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for model in models {
        let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"ready?"}}]}}"#);
        loop {
            let sent = client.post(gateway).header("content-type", "application/json").body(body.clone()).send().await;
            if sent.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("model {model} did not answer 200 through the Edge within 30 s").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

async fn scenario(
    oha_path: &Path,
    url: &str,
    body: &str,
    load: Load,
    secs: u32,
    pids: [u32; 3],
    clock_ticks: f64,
) -> Result<Outcome, Error> {
    let duration = format!("{secs}s");
    let mut flags = vec!["-z".to_string(), duration];
    match load {
        Load::Concurrency(c) => flags.extend(["-c".to_string(), c.to_string()]),
        Load::Rate(q) => flags.extend(["-c".to_string(), "1".to_string(), "-q".to_string(), q.to_string()]),
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let before = pids.map(sample);
    let summary = oha(oha_path, url, body, &flags).await?;
    let after = pids.map(sample);
    let ok = summary.ok();
    let per_request = |value: f64| if ok == 0 { f64::NAN } else { value / ok as f64 };
    let mut cpu_us = [0.0; 3];
    let mut switches = [0.0; 3];
    for i in 0..3 {
        cpu_us[i] = per_request((after[i].ticks - before[i].ticks) as f64 * 1e6 / clock_ticks);
        switches[i] = per_request(after[i].switches.saturating_sub(before[i].switches) as f64);
    }
    Ok(Outcome {
        ok,
        failed: summary.failed(),
        rps: summary.summary.requests_per_sec,
        p50_ms: summary.latency_percentiles.p50.unwrap_or(f64::NAN) * 1e3,
        p99_ms: summary.latency_percentiles.p99.unwrap_or(f64::NAN) * 1e3,
        ttfb_p50_ms: summary.first_byte_percentiles.and_then(|p| p.p50).unwrap_or(f64::NAN) * 1e3,
        cpu_us,
        switches,
    })
}

// ------------------------------------------------------------------ oha

/// The parts of `oha --output-format json` the table uses (times in seconds).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OhaSummary {
    summary: OhaTotals,
    latency_percentiles: OhaPercentiles,
    /// oha 1.10 and later.
    #[serde(default)]
    first_byte_percentiles: Option<OhaPercentiles>,
    #[serde(default)]
    status_code_distribution: HashMap<String, u64>,
    #[serde(default)]
    error_distribution: HashMap<String, u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OhaTotals {
    requests_per_sec: f64,
}

#[derive(Deserialize)]
struct OhaPercentiles {
    p50: Option<f64>,
    p99: Option<f64>,
}

impl OhaSummary {
    fn ok(&self) -> u64 {
        self.status_code_distribution.iter().filter(|(code, _)| code.starts_with('2')).map(|(_, n)| n).sum()
    }

    /// Non-2xx answers and transport errors (requests still in flight at the
    /// deadline are not errors: oha waits for them).
    fn failed(&self) -> u64 {
        let statuses: u64 =
            self.status_code_distribution.iter().filter(|(code, _)| !code.starts_with('2')).map(|(_, n)| n).sum();
        statuses + self.error_distribution.values().sum::<u64>()
    }
}

async fn oha(oha_path: &Path, url: &str, body: &str, flags: &[&str]) -> Result<OhaSummary, Error> {
    let output = Command::new(oha_path)
        .args(["--no-tui", "--output-format", "json", "--wait-ongoing-requests-after-deadline"])
        .args(["-m", "POST", "-H", "content-type: application/json", "-d", body])
        .args(flags)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", oha_path.display()))?;
    if !output.status.success() {
        return Err(format!("oha failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(serde_json::from_slice(&output.stdout).map_err(|e| format!("oha's JSON: {e}"))?)
}

async fn oha_version(oha_path: &Path) -> Result<String, Error> {
    let output = Command::new(oha_path)
        .arg("--version")
        .output()
        .await
        .map_err(|e| format!("running {} (install it: cargo install --locked oha): {e}", oha_path.display()))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

// ---------------------------------------------------------------- /proc

#[derive(Clone, Copy)]
struct Sample {
    /// utime + stime of the whole process, in clock ticks.
    ticks: u64,
    /// Voluntary + involuntary context switches of the live threads. Threads
    /// that exit between two samples take theirs with them (Linux keeps no
    /// per-process total in /proc); tokio's worker threads live as long as
    /// the process, so this undercounts only blocking-pool threads.
    switches: u64,
}

fn sample(pid: u32) -> Sample {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`, which may itself contain spaces: state is
    // field 3, utime and stime are fields 14 and 15.
    let after_comm = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(14) + field(15);
    let mut switches = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            switches += status
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:").or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    Sample { ticks, switches }
}

/// `getconf CLK_TCK` (the unit of /proc's utime and stime); 100 on Linux.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}
