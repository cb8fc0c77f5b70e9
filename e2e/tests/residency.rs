//! Issue 29: Mac-aware scheduling through real processes (`iop-edge`,
//! `iop-node`, one `iop-mock-provider` process per Mac's model server).
//!
//! - Two providers serve one model at the same priority: one server has the
//!   model in memory, the other would have to load it (`--loaded false
//!   --load-delay-ms`). The loaded one takes every request while it is not
//!   busy; the cold one is used only once the loaded one has more than
//!   `scheduling.load_penalty` more runs in flight, and its load finishes
//!   without a client error.
//! - A model whose load is known to take longer than the first-byte deadline
//!   still answers after an eviction: the Edge extends the deadline by the
//!   node's measured load time, and a streaming client gets keepalives.
//! - Each server API the node reads residency from (Ollama `/api/ps`, LM
//!   Studio `/api/v0/models/{model}`, llama.cpp `/props`, none), as several
//!   providers on one node, in `/admin/v1/providers`.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{Adapter, Limits, SchedulingConfig};
use serde_json::{Value, json};

const MODEL: &str = "shared";
const LOAD_MS: u64 = 1_500;

/// Chat requests the mock at `url` received.
async fn generations(stack: &Stack, url: &str) -> usize {
    stack.mock_requests(url, "/api/chat", None).await + stack.mock_requests(url, "/v1/chat/completions", None).await
}

async fn stats(stack: &Stack, url: &str) -> Value {
    let response = stack.client.get(format!("{url}/mock/stats")).send().await.unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

async fn wait_residency(stack: &Stack, id: &str, residency: &str) -> Value {
    wait_until(&format!("{id} is {residency}"), WAIT, || async {
        stack.provider_admin(id).await["residency"] == residency
    })
    .await;
    stack.provider_admin(id).await
}

async fn set_residency(stack: &Stack, url: &str, loaded: bool) {
    let response = stack
        .client
        .post(format!("{url}/mock/residency"))
        .body(json!({ "loaded": loaded }).to_string())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
}

async fn ask(stack: &Stack, model: &str) -> Value {
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(model, "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn the_loaded_provider_takes_the_traffic_and_the_cold_one_only_under_load() {
    let (_warm_mock, warm_url) = spawn_mock_with("127.0.0.1:0", &["--loaded", "true"]).await;
    let (_cold_mock, cold_url) =
        spawn_mock_with("127.0.0.1:0", &["--loaded", "false", "--load-delay-ms", &LOAD_MS.to_string()]).await;
    let warm = provider("warm", Adapter::Ollama, "mock", MODEL, &warm_url);
    let cold = provider("cold", Adapter::Ollama, "mock", MODEL, &cold_url);
    let stack = Stack::start(StackOptions {
        extra_providers: vec![warm, cold],
        scheduling: Some(SchedulingConfig { load_penalty: 2 }),
        ..Default::default()
    })
    .await;
    let admin = wait_residency(&stack, "warm", "loaded").await;
    assert!(admin["model_memory"]["size_bytes"].as_u64().unwrap() > 0, "Ollama's figures: {admin}");
    assert_eq!(admin["last_load_seconds"], Value::Null, "{admin}");
    wait_residency(&stack, "cold", "not_loaded").await;
    assert_eq!(stack.metric(r#"iop_edge_provider_residency{provider="cold",state="not_loaded"}"#).await, 1.0);

    // Idle: every request goes to the Mac that has the model, even though
    // fewest-in-flight alone would alternate.
    for _ in 0..6 {
        ask(&stack, MODEL).await;
    }
    assert_eq!(generations(&stack, &warm_url).await, 6);
    assert_eq!(generations(&stack, &cold_url).await, 0, "the cold Mac loaded nothing");
    assert_eq!(stats(&stack, &cold_url).await["loads"], 0);

    // Busy: three runs held on the warm Mac (its in-flight 0, 1, 2 all cost
    // no more than the cold one's penalty of 2), then a fourth goes cold.
    stack.set_mock_faults(&warm_url, "hold=busy").await;
    let held: Vec<_> = (0..3)
        .map(|_| {
            let client = stack.client.clone();
            let url = stack.url("/v1/chat/completions");
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(chat_body(MODEL, "hi", false).to_string())
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    wait_until("three runs in flight on the warm provider", WAIT, || async {
        stack.provider_admin("warm").await["in_flight"] == 3
    })
    .await;
    // In flight at the Edge is not yet held at the mock: a run that reached
    // it after the fault was cleared would end and free its place.
    wait_until("the three runs held at the warm mock", WAIT, || async { generations(&stack, &warm_url).await == 9 })
        .await;
    stack.set_mock_faults(&warm_url, "").await;
    assert_eq!(generations(&stack, &cold_url).await, 0, "three in flight is not yet past the penalty");
    let body = ask(&stack, MODEL).await;
    assert!(body["choices"][0]["message"]["content"].as_str().unwrap().contains("mock provider"), "{body}");
    assert_eq!(generations(&stack, &cold_url).await, 1, "past the penalty the cold Mac takes a request");
    assert_eq!(stats(&stack, &cold_url).await["loads"], 1);
    stack.client.post(format!("{warm_url}/mock/release/busy")).send().await.unwrap();
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }

    // The load is measured and reported, and the cold Mac is warm now.
    let admin = wait_residency(&stack, "cold", "loaded").await;
    let seconds = admin["last_load_seconds"].as_f64().unwrap();
    assert!(seconds >= LOAD_MS as f64 / 1000.0, "{admin}");
    assert!(admin["last_load_at"].is_string(), "{admin}");
    let node_metrics = stack.node_metrics.clone().unwrap();
    assert_eq!(stack.metric_at(&node_metrics, r#"iop_node_model_loads_total{provider="cold"}"#).await, 1.0);
    assert_eq!(stack.metric_at(&node_metrics, r#"iop_node_model_loads_total{provider="warm"}"#).await, 0.0);
}

/// Rewrites provider `id`'s `first_byte_timeout_ms` and waits for the reload.
async fn set_first_byte_timeout(stack: &Stack, id: &str, ms: u64) {
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
    let revision = stack.get_json("/admin/v1/config").await["config"]["revision"].as_u64().unwrap();
    config.providers.iter_mut().find(|p| p.id == id).unwrap().first_byte_timeout_ms = ms;
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    wait_until("the reload is applied", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"].as_u64() == Some(revision + 1)
    })
    .await;
}

/// A model that takes longer to load than the provider's first-byte
/// deadline: its first (cold) request runs under the default deadline and is
/// measured; after an eviction the Edge extends the (now shorter) deadline by
/// the measured load, so the next cold request answers too, and a streaming
/// client gets keepalives while the model loads.
#[tokio::test]
async fn a_cold_load_is_given_its_measured_time_and_keepalives() {
    let (_mock, url) =
        spawn_mock_with("127.0.0.1:0", &["--loaded", "false", "--load-delay-ms", &LOAD_MS.to_string()]).await;
    let big = provider("big", Adapter::Ollama, "mock", MODEL, &url);
    let stack = Stack::start(StackOptions {
        extra_providers: vec![big],
        limits: Some(Limits { stream_keepalive_ms: 200, ..Default::default() }),
        ..Default::default()
    })
    .await;
    wait_residency(&stack, "big", "not_loaded").await;
    ask(&stack, MODEL).await;
    let admin = wait_residency(&stack, "big", "loaded").await;
    assert!(admin["last_load_seconds"].as_f64().unwrap() >= LOAD_MS as f64 / 1000.0, "{admin}");

    // Shorter than a load: only the extension lets the next cold load answer.
    set_first_byte_timeout(&stack, "big", 1_000).await;
    set_residency(&stack, &url, false).await;
    wait_residency(&stack, "big", "not_loaded").await;
    let response = stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", true)).await;
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    assert!(body.contains(": keepalive"), "keepalives while the model loads: {body}");
    assert!(body.contains(r#""finish_reason":"stop""#) && body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("error"), "{body}");
    assert_eq!(stats(&stack, &url).await["loads"], 2);
    let node_metrics = stack.node_metrics.clone().unwrap();
    assert_eq!(stack.metric_at(&node_metrics, r#"iop_node_model_loads_total{provider="big"}"#).await, 2.0);
    assert_eq!(stack.metric(r#"iop_edge_attempts_total{provider="big",outcome="retried"}"#).await, 0.0);
}

/// Each server API the node reads residency from, as four providers on one
/// node: Ollama `/api/ps`, LM Studio `/api/v0/models/{model}`, llama.cpp
/// `/props`, and a server with none of them (`unknown`). A run loads each
/// model; the refresh after it shows the model loaded.
#[tokio::test]
async fn residency_is_read_from_each_servers_own_api() {
    let apis = [
        ("ps", Adapter::Ollama, "ollama", "not_loaded"),
        ("lms", Adapter::Openai, "lm_studio", "not_loaded"),
        ("llama", Adapter::Openai, "llama_cpp", "not_loaded"),
        ("plain", Adapter::Openai, "none", "unknown"),
    ];
    let mut mocks = Vec::new();
    let mut providers = Vec::new();
    for (id, adapter, api, _) in apis {
        let (mock, url) = spawn_mock_with("127.0.0.1:0", &["--residency-api", api, "--loaded", "false"]).await;
        // A target of its own: the node remembers loads per target model.
        providers.push(provider(id, adapter, &format!("mock-{id}"), &format!("m-{id}"), &url));
        mocks.push((mock, url));
    }
    let stack = Stack::start(StackOptions { extra_providers: providers, ..Default::default() }).await;
    for (id, _, _, before) in apis {
        wait_residency(&stack, id, before).await;
    }
    // The stack's own mock answers every API with its model loaded.
    wait_residency(&stack, "openai-mock", "loaded").await;
    wait_residency(&stack, "ollama-mock", "loaded").await;
    for (id, _, _, before) in apis {
        ask(&stack, &format!("m-{id}")).await;
        let after = if before == "unknown" { "unknown" } else { "loaded" };
        let admin = wait_residency(&stack, id, after).await;
        assert_eq!(admin["last_load_seconds"].is_number(), after == "loaded", "{admin}");
    }
}
