//! Randomized fault soak through real processes (ignored by default: it is
//! bounded in time, not fast). Run it with `scripts/soak [SECONDS]`, which
//! builds release binaries and runs
//! `cargo test -p iop-e2e --release --test soak -- --ignored --nocapture`.
//! `IOP_SOAK_SECS` (default 60) bounds the chaos phase; `IOP_SOAK_SEED`
//! replays a run (the seed is printed).
//!
//! Two nodes, four providers on four mock servers, one public model. Client
//! tasks send every API, streaming and not, some abandoning their response
//! half-way, while a chaos task resets, stalls, cuts, 5xx-es and 429-s the
//! providers, takes their metadata calls down, kills and restarts their
//! servers, pauses a node (SIGSTOP) past the heartbeat wait, and holds a
//! provider at 5xx long enough for outlier ejection (short ejection times,
//! so ejections end and repeat within the run). Then the
//! chaos stops and the soak asserts what must hold after any fault sequence:
//! every answer was one the API documents, none came after its deadline, no
//! slot, lease, run or node execution leaked, and every provider returned to
//! `available` by itself and is no longer ejected.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use iop_e2e::harness::{Proc, ProviderSpec, wait_until};
use iop_proto::config::{Adapter, Limits, OutlierConfig, ProviderMode};
use serde_json::{Value, json};

const NODES: [&str; 2] = [NODE, "mac-2"];
const REQUEST_TIMEOUT_MS: u64 = 8_000;
/// Slack past the deadline for rendering and loopback.
const DEADLINE_SLACK: Duration = Duration::from_millis(1_500);
/// Heartbeat every 250 ms, session closed after 1 s of silence.
const HEARTBEAT: &str = "250,1000";
/// Each provider's answer: 12 streamed pieces, 5 ms apart.
const TARGET: &str = "mock@words=12,chunk_delay_ms=5";
const CLIENTS: usize = 12;
/// Process-wide mock knobs the chaos task picks from ("" clears them).
const FAULTS: [&str; 11] = [
    "",
    "",
    "cut_after=3",
    // Half the answer's text, then a cut: continued on a provider that
    // continues prefills (every normalized provider here declares it).
    "cut_after=6",
    "stall_after=2",
    "status=500",
    "status=429,retry_after=1",
    "first_token_delay_ms=3000",
    "headers_delay_ms=3000",
    // One malformed chunk is skipped; three in a row fail the attempt.
    "malformed_at=2",
    "malformed_at=2,malformed_run=3",
];

/// One provider's mock server, restartable on its address.
struct Mock {
    addr: String,
    proc: Option<Proc>,
}

impl Mock {
    /// On a port below the ephemeral range, so that a restart finds it free.
    async fn start() -> Mock {
        let (proc, url) = spawn_mock(&free_port().to_string()).await;
        Mock { addr: url.trim_start_matches("http://").to_string(), proc: Some(proc) }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn post(&self, what: &str, body: &str) {
        if self.proc.is_some() {
            let _ = http_client().post(format!("{}/mock/{what}", self.url())).body(body.to_string()).send().await;
        }
    }

    async fn kill(&mut self) {
        if let Some(proc) = self.proc.take() {
            proc.terminate().await;
        }
    }

    async fn ensure_running(&mut self) {
        if self.proc.is_none() {
            self.proc = Some(spawn_mock(&self.addr).await.0);
        }
    }
}

/// What the clients saw, by outcome, plus every violation.
#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<String, u64>,
    violations: Vec<String>,
    slowest: Duration,
}

impl Tally {
    fn count(&mut self, outcome: impl Into<String>, elapsed: Duration) {
        *self.outcomes.entry(outcome.into()).or_default() += 1;
        self.slowest = self.slowest.max(elapsed);
    }
}

/// How many APIs [`body`] sends to.
const APIS: usize = 5;

/// APIs: 0 chat, 1 responses, 2 messages, 3 chat and 4 responses to the
/// tunnel provider.
fn body(api: usize, stream: bool, n: u64) -> (&'static str, Value) {
    let text = format!("soak request {n}");
    let model = if tunnelled(api) { "soak-tunnel" } else { "soak" };
    match api {
        0 | 3 => (
            "/v1/chat/completions",
            json!({ "model": model, "stream": stream,
            "messages": [{ "role": "user", "content": text }] }),
        ),
        1 | 4 => ("/v1/responses", json!({ "model": model, "stream": stream, "input": text })),
        _ => (
            "/v1/messages",
            json!({ "model": "soak", "stream": stream, "max_tokens": 64,
            "messages": [{ "role": "user", "content": text }] }),
        ),
    }
}

fn tunnelled(api: usize) -> bool {
    api >= 3
}

/// Sends one request and classifies what came back. A stream is read to its
/// end unless `abandon` (the client then goes away after the first chunk).
async fn one_request(stack: &Stack, api: usize, stream: bool, abandon: bool, n: u64) -> Result<String, String> {
    let (path, body) = body(api, stream, n);
    let sent = stack
        .client
        .post(stack.url(path))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS) + Duration::from_secs(10))
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        // A tunnel cut right after its commit can abort the connection
        // before the relayed head was flushed: a broken response too.
        Err(e) if tunnelled(api) && format!("{e:?}").contains("IncompleteMessage") => return Ok("tunnel cut".into()),
        Err(e) => return Err(format!("api {api} stream {stream}: no answer: {e:?}")),
    };
    let status = response.status().as_u16();
    // A tunnel relays the provider's own error status when no other
    // provider could answer.
    let relayed = tunnelled(api) && status >= 400;
    if !matches!(status, 200 | 429 | 502 | 503 | 504) && !relayed {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("{path}: undocumented status {status}: {text}"));
    }
    if status != 200 {
        let bytes = response.bytes().await.map_err(|e| format!("{path} {status}: body cut: {e}"))?;
        let error: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{path} {status}: not JSON: {e}"))?;
        let code = error["error"]["code"].as_str().or(error["error"]["type"].as_str()).unwrap_or("?").to_string();
        return Ok(format!("{status} {code}"));
    }
    let mut response = response;
    if abandon {
        let _ = response.chunk().await;
        return Ok("abandoned".into());
    }
    let text = match response.text().await {
        Ok(text) => text,
        // A tunnel relays the provider's bytes as they are: when the
        // provider cuts its body, the client's body is cut too (never a
        // clean end).
        Err(_) if tunnelled(api) => return Ok("tunnel cut".into()),
        Err(e) => return Err(format!("api {api} stream {stream}: body cut: {e:?}")),
    };
    if !stream {
        return Ok("200".into());
    }
    // Each API's own completion and error events.
    let (finished, failed) = match api {
        0 | 3 => (text.contains("data: [DONE]"), text.contains("data: {\"error\":")),
        1 | 4 => (
            text.contains("event: response.completed"),
            text.contains("event: error") || text.contains("event: response.failed"),
        ),
        _ => (text.contains("event: message_stop"), text.contains("event: error")),
    };
    match (finished, failed) {
        (true, false) if !tunnelled(api) => {
            check_words(api, &text).map_err(|e| format!("{path}: {e}: {text}"))?;
            Ok("200 stream".into())
        }
        (true, false) => Ok("200 stream".into()),
        (false, true) => Ok("200 stream ended by error event".into()),
        _ => Err(format!("{path}: a stream must end in exactly one of completion or error: {text}")),
    }
}

/// A completed normalized stream's text: `TARGET`'s words in order, none
/// repeated (a continuation neither repeats nor reorders text), ending with
/// the last (a skipped malformed chunk may drop one in the middle).
fn check_words(api: usize, text: &str) -> Result<(), String> {
    let data = text.split("\n\n").filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")));
    let pieces: String = data
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| match api {
            0 => v["choices"][0]["delta"]["content"].as_str().map(str::to_string),
            1 => (v["type"] == "response.output_text.delta").then(|| v["delta"].as_str().map(str::to_string)).flatten(),
            _ => {
                (v["type"] == "content_block_delta").then(|| v["delta"]["text"].as_str().map(str::to_string)).flatten()
            }
        })
        .collect();
    let numbers: Vec<u32> =
        pieces.split_whitespace().map(|w| w.strip_prefix('w').and_then(|n| n.parse().ok()).unwrap_or(0)).collect();
    let in_order = numbers.windows(2).all(|w| w[0] < w[1]) && numbers.first().is_some_and(|n| *n > 0);
    if !in_order || numbers.last() != Some(&12) {
        return Err(format!("the answer's words are repeated, out of order or incomplete: {pieces:?}"));
    }
    Ok(())
}

async fn client(stack: Arc<Stack>, seed: u64, until: Instant, tally: Arc<Mutex<Tally>>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let (api, stream, abandon) = (rng.usize(0..APIS), rng.bool(), rng.u8(0..10) == 0);
        let started = Instant::now();
        let result = one_request(&stack, api, stream, abandon, seed.wrapping_mul(1_000_000).wrapping_add(n)).await;
        let elapsed = started.elapsed();
        let refused = result.as_ref().is_ok_and(|o| o.starts_with("429") || o.starts_with("503"));
        {
            let mut tally = tally.lock().unwrap();
            match result {
                Ok(outcome) => tally.count(outcome, elapsed),
                Err(violation) => tally.violations.push(violation),
            }
            if elapsed > Duration::from_millis(REQUEST_TIMEOUT_MS) + DEADLINE_SLACK {
                tally.violations.push(format!("request {n} of client {seed} took {elapsed:?}, past its deadline"));
            }
        }
        if refused {
            // Like a client that backs off on 429/503, so answered traffic
            // is not drowned in instant refusals while a route is down.
            tokio::time::sleep(Duration::from_millis(rng.u64(20..100))).await;
        }
    }
}

/// Injects faults until `until`; returns how many of each kind.
async fn chaos(
    stack: &Stack,
    mocks: &mut [Mock],
    rng: &mut fastrand::Rng,
    until: Instant,
) -> BTreeMap<&'static str, u64> {
    let mut injected = BTreeMap::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
        let mock = rng.usize(0..mocks.len());
        let kind = match rng.u8(0..20) {
            0..=10 => {
                let faults = FAULTS[rng.usize(0..FAULTS.len())];
                mocks[mock].post("faults", faults).await;
                if faults.is_empty() { "faults cleared" } else { "provider fault" }
            }
            11 => {
                // Every generation refused while the metadata call answers,
                // for long enough under the clients' traffic to be ejected.
                mocks[mock].post("faults", "status=503").await;
                tokio::time::sleep(Duration::from_millis(rng.u64(800..2_000))).await;
                mocks[mock].post("faults", "").await;
                "provider ejection"
            }
            12..=14 => {
                let healthy = rng.bool();
                mocks[mock].post("health", &format!(r#"{{"healthy":{healthy}}}"#)).await;
                if healthy { "metadata restored" } else { "metadata down" }
            }
            15..=17 => {
                mocks[mock].kill().await;
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
                mocks[mock].ensure_running().await;
                "server restarted"
            }
            _ => {
                let node = &stack.nodes[rng.usize(0..stack.nodes.len())];
                node.pause();
                // Past the heartbeat wait: the Edge fences the session.
                tokio::time::sleep(Duration::from_millis(rng.u64(1_200..2_500))).await;
                node.resume();
                "node paused"
            }
        };
        *injected.entry(kind).or_default() += 1;
    }
    injected
}

fn soak_provider(id: &str, adapter: Adapter, mock: &Mock, node: &str, priority: u32) -> ProviderSpec {
    let mut spec = provider(id, adapter, TARGET, "soak", &mock.url());
    spec.node = node.to_string();
    spec.priority = priority;
    spec.capacity = 2;
    spec.stall_timeout_ms = 1_000;
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a bounded-time soak; run with scripts/soak"]
async fn soak() {
    let secs: u64 = std::env::var("IOP_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 =
        std::env::var("IOP_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    println!("soak: {secs} s of chaos, IOP_SOAK_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut mocks = Vec::new();
    for _ in 0..4 {
        mocks.push(Mock::start().await);
    }
    let mut tunnel = soak_provider("t2", Adapter::Openai, &mocks[2], NODES[1], 0);
    tunnel.mode = ProviderMode::Tunnel;
    tunnel.public_model = "soak-tunnel".into();
    let providers = vec![
        soak_provider("o1", Adapter::Ollama, &mocks[0], NODES[0], 0),
        soak_provider("c1", Adapter::Openai, &mocks[1], NODES[0], 0),
        tunnel,
        soak_provider("o2", Adapter::Ollama, &mocks[3], NODES[1], 1),
    ];
    let limits = Limits {
        request_timeout_ms: REQUEST_TIMEOUT_MS,
        queue_timeout_ms: 2_000,
        queue_depth: 16,
        // Streams that wait get keepalives, and retries happen behind them.
        stream_keepalive_ms: 500,
        ..Limits::default()
    };
    let stack = Arc::new(
        Stack::start(StackOptions {
            heartbeat: Some(HEARTBEAT),
            extra_providers: providers,
            limits: Some(limits),
            extra_nodes: vec![NODES[1]],
            outlier: Some(OutlierConfig {
                consecutive_failures: 3,
                base_ejection_ms: 1_000,
                max_ejection_ms: 4_000,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await,
    );

    stack.declare_continuation(&["o1", "c1", "o2"]).await;

    let until = Instant::now() + Duration::from_secs(secs);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|n| tokio::spawn(client(stack.clone(), seed.wrapping_add(n + 1), until, tally.clone())))
        .collect();
    let injected = chaos(&stack, &mut mocks, &mut rng, until).await;
    for client in clients {
        client.await.expect("a client task panicked");
    }

    // Calm: every fault lifted, every server up, every node running.
    for mock in &mut mocks {
        mock.ensure_running().await;
        mock.post("faults", "").await;
        mock.post("health", r#"{"healthy":true}"#).await;
    }
    for node in &stack.nodes {
        node.resume();
    }
    let settle = Duration::from_secs(60);
    for node in NODES {
        wait_until(&format!("{node} ready"), settle, || async { stack.node(node).await["phase"] == "ready" }).await;
    }
    wait_until("every provider available and dispatchable", settle, || async {
        let view = stack.get_json("/admin/v1/providers").await;
        view["providers"].as_array().unwrap().iter().all(|p| p["health"] == "available" && p["dispatchable"] == true)
    })
    .await;
    wait_until("no provider ejected", settle, || async {
        let view = stack.get_json("/admin/v1/providers").await;
        view["providers"].as_array().unwrap().iter().all(|p| p["ejected_until"].is_null())
    })
    .await;
    wait_until("no slot, lease or run outstanding", settle, || async {
        let view = stack.get_json("/admin/v1/providers").await;
        let leases = &view["leases"];
        view["in_flight_runs"] == 0
            && view["providers"].as_array().unwrap().iter().all(|p| p["in_flight"] == 0)
            && view["queued"].as_object().is_none_or(|q| q.values().all(|d| d == 0))
            && leases["acquired"] == leases["released"]
    })
    .await;
    let view = stack.get_json("/admin/v1/providers").await;
    assert_eq!(view["leases"]["double_releases"], 0, "{view}");
    for node in NODES {
        let url = stack.admin_url(&format!("/admin/v1/nodes/{node}/commands/transport_status"));
        wait_until(&format!("{node} runs nothing"), settle, || async {
            let status = stack.client.post(&url).send().await.unwrap();
            let status: Value = serde_json::from_slice(&status.bytes().await.unwrap()).unwrap();
            status["active_runs"] == 0
        })
        .await;
    }
    for api in 0..APIS {
        for stream in [false, true] {
            let outcome = one_request(&stack, api, stream, false, api as u64).await;
            assert!(
                outcome.as_ref().is_ok_and(|o| o == "200" || o == "200 stream"),
                "after the chaos every API answers: {outcome:?}"
            );
        }
    }

    let metrics = stack.client.get(stack.admin_url("/metrics")).send().await.unwrap().text().await.unwrap();
    let ejections: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("iop_edge_provider_ejections_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let continuations: Vec<&str> = metrics.lines().filter(|l| l.starts_with("iop_edge_continuations_total")).collect();
    let tally = tally.lock().unwrap();
    let requests: u64 = tally.outcomes.values().sum::<u64>() + tally.violations.len() as u64;
    println!("soak: seed {seed}, {requests} requests, slowest {:?}", tally.slowest);
    println!("soak: outcomes {:#?}", tally.outcomes);
    println!("soak: faults injected {injected:#?}");
    println!("soak: outlier ejections {ejections}");
    println!(
        "soak: leases acquired {} released {}, leaks 0, violations {}",
        view["leases"]["acquired"],
        view["leases"]["released"],
        tally.violations.len()
    );
    println!("soak: continuations {continuations:#?}");
    assert!(tally.violations.is_empty(), "violations (seed {seed}): {:#?}", tally.violations);
    assert!(requests > 0);
}
