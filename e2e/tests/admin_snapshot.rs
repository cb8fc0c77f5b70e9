//! Issue 40 item 4: the JSON of the admin snapshots (`GET /admin/v1/providers`,
//! `GET /admin/v1/nodes`) of a running Edge, field by field: names, types,
//! `null`s, enum spellings, numbers and key order. The operator's status
//! mirror and people's scripts read these; this pins what they read, so a
//! change of the Rust types that write it cannot change it unnoticed. It is
//! deliberately a raw `serde_json::Value` reading, independent of those
//! types.
//!
//! The stack: node `mac-1` with the mock's two providers (`ollama-mock`'s
//! model server starts without the model in memory, and a request loads
//! it: residency, memory and the last load), `keyed` with a managed
//! credential, and `bad`, ejected after a failed generation; and node
//! `mac-2`, configured but never connected, with provider `away`.
//!
//! What differs from run to run (generations, times, sequences, lease
//! counts, the machine's sandbox, the node's version) is replaced by its
//! JSON type (`"<u64>"`, `"<f64>"`, `"<string>"`, `"<strings>"`), so even
//! those stay pinned to a type and to being `null` or not.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{Adapter, OutlierConfig};
use serde_json::{Value, json};

/// Keys whose values differ between runs.
const VARYING: [&str; 14] = [
    "generation",
    "connected_at_ms",
    "since_ms",
    "sequence",
    "version",
    "ejected_until",
    "last_load_at",
    "last_load_seconds",
    "size_bytes",
    "vram_bytes",
    "command_sandbox",
    "sandbox_gaps",
    "acquired",
    "released",
];

/// `value`'s JSON type, for a value that differs between runs (`null`
/// stays `null`).
fn typed(value: &Value) -> Value {
    match value {
        Value::Number(n) if n.is_u64() => json!("<u64>"),
        Value::Number(n) if n.is_f64() => json!("<f64>"),
        Value::String(_) => json!("<string>"),
        Value::Array(items) if items.iter().all(Value::is_string) => json!("<strings>"),
        other => panic!("a varying value of an unexpected type: {other}"),
    }
}

/// `value` with every [`VARYING`] key's value replaced by [`typed`].
fn normalized(mut value: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if VARYING.contains(&key.as_str()) && !v.is_null() {
                        *v = typed(v);
                    } else {
                        walk(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// The admin endpoint `path` as JSON, after checking its bytes are exactly
/// what serde_json writes for that JSON: compact, every object's keys in
/// alphabetical order.
async fn get_exact(stack: &Stack, path: &str) -> Value {
    let text = stack.client.get(stack.admin_url(path)).send().await.unwrap().text().await.unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(text, value.to_string(), "{path}: keys in alphabetical order, compact");
    value
}

#[tokio::test]
async fn the_admin_snapshots_keep_their_json() {
    const KEY: &str = "sk-admin-1";
    let (_keyed_mock, keyed_url) = spawn_keyed_mock(KEY).await;
    let (_bad_mock, bad_url) = spawn_mock("127.0.0.1:0").await;
    let keyed = provider("keyed", Adapter::Openai, "mock", "keyed", &keyed_url);
    let bad = provider("bad", Adapter::Openai, "mock", "flaky", &bad_url);
    let mut away = provider("away", Adapter::Ollama, "mock", "away", "http://127.0.0.1:9");
    away.node = "mac-2".into();
    let mut stack = Stack::start(StackOptions {
        start_node: false,
        extra_nodes: vec!["mac-2"],
        extra_providers: vec![keyed, bad, away],
        credentials: vec![
            Managed { profile: "lm", secret: KEY, revision: 1, providers: vec!["keyed"] },
            // Not a usable value (a space): `invalid`, with the problem.
            Managed { profile: "broken", secret: "sk-lm studio", revision: 1, providers: vec!["away"] },
        ],
        mock_args: vec!["--loaded", "false", "--load-delay-ms", "300"],
        outlier: Some(OutlierConfig {
            consecutive_failures: 1,
            base_ejection_ms: 600_000,
            max_ejection_ms: 600_000,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await;
    let pair = stack.pki.node_cert(NODE, iop_e2e::pki::Validity::Current).unwrap();
    let (node, _) = stack.spawn_node(&pair, &stack.pki.ca_file.clone()).await;
    stack.nodes.push(node);
    stack.wait_node_ready(NODE).await;
    for id in ["ollama-mock", "openai-mock", "keyed", "bad"] {
        wait_until(&format!("{id} available"), WAIT, || async {
            stack.provider_admin(id).await["health"] == "available"
        })
        .await;
    }

    // The node measures a load only for a run on a model it last saw not
    // loaded: its first residency report (after its metadata calls) must
    // come before the request.
    wait_until("ollama-mock reported not loaded", WAIT, || async {
        stack.provider_admin("ollama-mock").await["residency"] == "not_loaded"
    })
    .await;
    // A request loads ollama-mock's model; one failed generation ejects `bad`.
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    wait_until("the node reported the load", WAIT, || async {
        stack.provider_admin("ollama-mock").await["last_load_at"].is_string()
    })
    .await;
    stack.set_mock_faults(&bad_url, "status=500").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("flaky", "hi", false)).await).await;
    assert_ne!(status, 200, "{body}");
    wait_until("every run ended", WAIT, || async {
        let all = stack.get_json("/admin/v1/providers").await;
        all["in_flight_runs"] == 0 && all["providers"].as_array().unwrap().iter().all(|p| p["in_flight"] == 0)
    })
    .await;

    // The node's residency reports of the other providers (the load is the
    // node's per target model, and the shared server now has the model) come
    // on its next polls: the snapshots settle on exactly this.
    let expected_providers = json!({
        "in_flight_runs": 0,
        "leases": {"acquired": "<u64>", "double_releases": 0, "released": "<u64>"},
        "queued": {},
        "workspace_calls": 0,
        "providers": [
            {
                "accepts_images": true, "adapter": "ollama", "capacity": 4, "consecutive_failures": 0, "credential": null,
                "dispatchable": true, "ejected_until": null, "ejections": 0, "health": "available",
                "id": "ollama-mock", "in_flight": 0, "last_load_at": "<string>", "last_load_seconds": "<f64>", "learned_stall_ms": null,
                "model_memory": {"size_bytes": "<u64>", "vram_bytes": "<u64>"},
                "models": [{"name": "mock-ollama", "priority": 0}], "node": "mac-1", "node_ready": true, "on_trial": false,
                "overlay": {"generation": "<u64>", "sequence": "<u64>", "since_ms": "<u64>", "state": "available"}, "prefill_ms_per_1k_tokens": null,
                "residency": "loaded", "target_model": "mock"
            },
            {
                "accepts_images": true, "adapter": "openai", "capacity": 4, "consecutive_failures": 0, "credential": null,
                "dispatchable": true, "ejected_until": null, "ejections": 0, "health": "available",
                "id": "openai-mock", "in_flight": 0, "last_load_at": "<string>", "last_load_seconds": "<f64>", "learned_stall_ms": null,
                "model_memory": null, "models": [{"name": "mock-openai", "priority": 0}], "node": "mac-1",
                "node_ready": true, "on_trial": false,
                "overlay": {"generation": "<u64>", "sequence": "<u64>", "since_ms": "<u64>", "state": "available"}, "prefill_ms_per_1k_tokens": null,
                "residency": "loaded", "target_model": "mock"
            },
            {
                "accepts_images": null, "adapter": "openai", "capacity": 4, "consecutive_failures": 0,
                "credential": {"node_refusal": null, "problem": null, "profile": "lm", "state": "ok"}, "dispatchable": true,
                "ejected_until": null, "ejections": 0, "health": "available", "id": "keyed", "in_flight": 0,
                "last_load_at": "<string>", "last_load_seconds": "<f64>", "learned_stall_ms": null, "model_memory": null,
                "models": [{"name": "keyed", "priority": 0}], "node": "mac-1", "node_ready": true, "on_trial": false,
                "overlay": {"generation": "<u64>", "sequence": "<u64>", "since_ms": "<u64>", "state": "available"}, "prefill_ms_per_1k_tokens": null,
                "residency": "unknown", "target_model": "mock"
            },
            {
                "accepts_images": true, "adapter": "openai", "capacity": 4, "consecutive_failures": 0, "credential": null,
                "dispatchable": true, "ejected_until": "<string>", "ejections": 1, "health": "available",
                "id": "bad", "in_flight": 0, "last_load_at": "<string>", "last_load_seconds": "<f64>", "learned_stall_ms": null,
                "model_memory": null, "models": [{"name": "flaky", "priority": 0}], "node": "mac-1",
                "node_ready": true, "on_trial": false,
                "overlay": {"generation": "<u64>", "sequence": "<u64>", "since_ms": "<u64>", "state": "available"}, "prefill_ms_per_1k_tokens": null,
                "residency": "loaded", "target_model": "mock"
            },
            {
                "accepts_images": null, "adapter": "ollama", "capacity": 4, "consecutive_failures": 0,
                "credential": {
                    "node_refusal": null, "problem": "the value must be printable ASCII without spaces",
                    "profile": "broken", "state": "invalid"
                },
                "dispatchable": false, "ejected_until": null, "ejections": 0, "health": "unavailable",
                "id": "away", "in_flight": 0, "last_load_at": null, "last_load_seconds": null, "learned_stall_ms": null,
                "model_memory": null, "models": [{"name": "away", "priority": 0}], "node": "mac-2",
                "node_ready": false, "on_trial": false, "overlay": null, "prefill_ms_per_1k_tokens": null, "residency": "unknown", "target_model": "mock"
            },
        ],
    });
    // The serial of the certificate this test issued the node (issue 43
    // item 6), as the operator reads it from the certificate it issued.
    let serial = iop_pki::inspect(&std::fs::read_to_string(&pair.cert).unwrap()).unwrap().serial;
    let expected_nodes = json!({"nodes": [
        {
            "certificate_serial": serial,
            "command_sandbox": "<string>", "connected": true, "connected_at_ms": "<u64>", "generation": "<u64>",
            "name": "mac-1", "phase": "ready",
            "providers": {
                "bad": "available", "keyed": "available", "ollama-mock": "available", "openai-mock": "available"
            },
            "sandbox_gaps": "<strings>", "version": "<string>", "workspaces": {}
        },
        {
            "certificate_serial": null,
            "command_sandbox": null, "connected": false, "connected_at_ms": null, "generation": null,
            "name": "mac-2", "phase": null, "providers": {"away": "unavailable"}, "sandbox_gaps": "<strings>",
            "version": null, "workspaces": {}
        },
    ]});
    let deadline = tokio::time::Instant::now() + WAIT;
    let (providers, nodes) = loop {
        let providers = normalized(get_exact(&stack, "/admin/v1/providers").await);
        let nodes = normalized(get_exact(&stack, "/admin/v1/nodes").await);
        if (&providers, &nodes) == (&expected_providers, &expected_nodes) || tokio::time::Instant::now() > deadline {
            break (providers, nodes);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(providers, expected_providers, "/admin/v1/providers");
    assert_eq!(nodes, expected_nodes, "/admin/v1/nodes");
}
