//! Managed provider credentials end to end: a keyed model server (the mock
//! with `--api-key`) reached through separate `iop-edge` and `iop-node`
//! processes, the key living only in the Edge and sealed per execution to
//! the node's connection key; rotation without a restart; every kind of
//! bad lease refused by the node before the provider is called; and a
//! provider quoting the key back never handing it to the client.

mod common;

use common::*;
use iop_e2e::harness::{Proc, wait_until};
use iop_proto::config::{Adapter, ProviderMode};
use serde_json::Value;

const KEY: &str = "sk-lmstudio-1";

/// Three providers on one keyed mock, all managed under profile `lm`:
/// `keyed` and its lower-priority sibling `keyed-backup` serve public model
/// `keyed` (normalized); `keyed-tunnel` serves `keyed-tunnel` (tunnel).
async fn keyed_stack(edge_args: Vec<&'static str>) -> (Stack, Proc, String) {
    let (mock, url) = spawn_keyed_mock(KEY).await;
    let normalized = provider("keyed", Adapter::Openai, "mock", "keyed", &url);
    let mut backup = provider("keyed-backup", Adapter::Openai, "mock", "keyed", &url);
    backup.priority = 1;
    let mut tunnel = provider("keyed-tunnel", Adapter::Openai, "mock", "keyed-tunnel", &url);
    tunnel.mode = ProviderMode::Tunnel;
    let managed = vec!["keyed", "keyed-backup", "keyed-tunnel"];
    let stack = Stack::start(StackOptions {
        extra_providers: vec![normalized, backup, tunnel],
        credentials: vec![Managed { profile: "lm", secret: KEY, revision: 1, providers: managed }],
        edge_args,
        ..Default::default()
    })
    .await;
    for id in ["keyed", "keyed-backup", "keyed-tunnel"] {
        wait_until(&format!("{id} dispatchable (its probe's 401 means up)"), WAIT, || async {
            stack.provider_admin(id).await["dispatchable"] == true
        })
        .await;
    }
    (stack, mock, url)
}

async fn keyed_requests(stack: &Stack, url: &str) -> u64 {
    let response = stack.client.get(format!("{url}/mock/stats")).send().await.unwrap();
    let stats: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    stats["requests_total"].as_u64().unwrap()
}

async fn node_metric(stack: &Stack, sample: &str) -> f64 {
    stack.metric_at(stack.node_metrics.as_ref().unwrap(), sample).await
}

#[tokio::test]
async fn a_keyed_provider_answers_through_sealed_leases_and_its_key_rotates_without_a_restart() {
    let (stack, _mock, url) = keyed_stack(Vec::new()).await;
    for (model, stream) in [("keyed", false), ("keyed", true), ("keyed-tunnel", false), ("keyed-tunnel", true)] {
        let response = stack
            .client
            .post(stack.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            // A client's own Authorization never reaches the provider: the
            // lease's key is the only one.
            .header("authorization", "Bearer sk-client-guess")
            .body(serde_json::to_vec(&chat_body(model, "hello", stream)).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{model} stream={stream}");
    }
    assert_eq!(keyed_requests(&stack, &url).await, 4);
    assert_eq!(stack.metric("iop_edge_credential_leases_sealed_total").await, 4.0);

    // Rotation: the server's key changes; until the Edge has the new one the
    // provider says 401. That is the provider refusing its own credential
    // (issue 25 item 6): a 502 with its own code in every API's shape and
    // in tunnels, never the client's `authentication_error`; the sibling
    // with the same credential is not tried; the credential and the
    // provider's health say so.
    let rotate = stack.client.post(format!("{url}/mock/api-key")).body("sk-lmstudio-2").send().await.unwrap();
    assert_eq!(rotate.status(), 204);
    let before = keyed_requests(&stack, &url).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("provider_credential_rejected")), "{body}");
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not about your API key"), "{body}");
    assert_eq!(keyed_requests(&stack, &url).await, before + 1, "keyed-backup has the same credential: not tried");
    for id in ["keyed", "keyed-backup", "keyed-tunnel"] {
        let admin = stack.provider_admin(id).await;
        assert_eq!(admin["credential"]["state"], "rejected", "{admin}");
        assert_eq!(admin["health"], "unavailable", "{admin}");
    }
    let sample = "iop_edge_provider_credential{provider=\"keyed\",state=\"rejected\"}";
    assert_eq!(stack.metric(sample).await, 1.0);
    for stream in [false, true] {
        let (status, body) =
            json_body(stack.post("/v1/chat/completions", &chat_body("keyed-tunnel", "hello", stream)).await).await;
        assert_eq!((status, body["error"]["code"].as_str()), (502, Some("provider_credential_rejected")), "{body}");
    }
    let messages =
        serde_json::json!({"model": "keyed", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (502, Some("api_error")), "{body}");
    // New secret, new revision: the Edge reloads it, the node accepts it.
    set_credential(&stack, "sk-lmstudio-2", (1, 2));
    wait_until("the rotated credential", WAIT, || async {
        stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await.status() == 200
    })
    .await;
    assert_eq!(stack.get_json("/admin/v1/config").await["config"]["last_error"], Value::Null);
    assert_eq!(node_metric(&stack, "iop_node_credential_lease_rejections_total").await, 0.0);
    let admin = stack.provider_admin("keyed").await;
    assert_eq!((admin["credential"]["state"].as_str(), admin["health"].as_str()), (Some("ok"), Some("available")));

    // Going back to the old revision (an old Secret restored by mistake) is
    // refused by the node: revisions of a profile never go backwards.
    set_credential(&stack, KEY, (2, 1));
    wait_until("the old revision's refusal", WAIT, || async {
        let (status, body) =
            json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hi", false)).await).await;
        status == 502 && body["error"]["message"].as_str().unwrap_or_default().contains("revoked")
    })
    .await;
    assert_eq!(node_metric(&stack, "iop_node_credential_lease_rejections_total{reason=\"revoked\"}").await, 1.0);
    // Issue 43 D1: what users see says so, not `available`.
    let admin = stack.provider_admin("keyed").await;
    assert_eq!(
        (admin["credential"]["state"].as_str(), admin["credential"]["node_refusal"].as_str()),
        (Some("refused_by_node"), Some("revoked")),
        "{admin}"
    );
    assert_eq!(admin["health"], "unavailable", "{admin}");
    let health = stack.metric("iop_edge_provider_credential{provider=\"keyed\",state=\"refused_by_node\"}").await;
    assert_eq!(health, 1.0);
    // The working key at a later revision (what the operator gives after
    // any restore) is taken: the refusal is over.
    set_credential(&stack, "sk-lmstudio-2", (1, 3));
    wait_until("the later revision accepted", WAIT, || async {
        stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await.status() == 200
    })
    .await;
    let admin = stack.provider_admin("keyed").await;
    assert_eq!((admin["credential"]["state"].as_str(), admin["health"].as_str()), (Some("ok"), Some("available")));
}

/// Profile `lm` gets `value` and its revision goes `from` -> `to` (the
/// Edge reloads both).
fn set_credential(stack: &Stack, value: &str, (from, to): (u64, u64)) {
    std::fs::write(stack.dir.path().join("lm.key"), format!("{value}\n")).unwrap();
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    std::fs::write(&stack.edge_config, text.replace(&format!("revision: {from}"), &format!("revision: {to}"))).unwrap();
}

/// Every request through a stack whose Edge seals leases wrongly in one way:
/// the node refuses each before calling the provider, the client gets a
/// typed `credential_rejected`, and no other provider is tried for it.
async fn refused_with(fault: &'static str, reason: &str, answered_first: bool) {
    let (stack, _mock, url) = keyed_stack(vec!["--test-lease-fault", fault]).await;
    if answered_first {
        let first = stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await;
        assert_eq!(first.status(), 200, "{fault}: the first lease is good");
    }
    let before = keyed_requests(&stack, &url).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await).await;
    assert_eq!(status, 502, "{fault}: {body}");
    assert_eq!(body["error"]["code"], "credential_rejected", "{fault}: {body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(reason), "{fault}: {body}");
    assert!(!body.to_string().contains(KEY), "{fault}: the key never comes back");
    assert_eq!(keyed_requests(&stack, &url).await, before, "{fault}: the provider was not called");
    let sample = format!("iop_node_credential_lease_rejections_total{{reason=\"{reason}\"}}");
    assert_eq!(node_metric(&stack, &sample).await, 1.0, "{fault}");
    // The Edge shows the node's refusal and its reason (issue 43 D1).
    let admin = stack.provider_admin("keyed").await;
    let credential = &admin["credential"];
    assert_eq!(
        (credential["state"].as_str(), credential["node_refusal"].as_str()),
        (Some("refused_by_node"), Some(reason))
    );
    assert_eq!(admin["health"], "unavailable", "{fault}: {admin}");
    // Its sibling serves the same model under the same profile: it was not
    // tried instead.
    let failed = "iop_edge_attempts_total{provider=\"keyed\",outcome=\"failed\"}";
    assert_eq!(stack.metric(failed).await, 1.0, "{fault}");
    let sibling = stack.metric("iop_edge_attempts_total{provider=\"keyed-backup\",outcome=\"failed\"}").await;
    assert_eq!(sibling, 0.0, "{fault}");
}

#[tokio::test]
async fn a_tampered_lease_is_refused() {
    refused_with("tamper", "unopenable", false).await;
}

#[tokio::test]
async fn a_lease_sealed_to_another_key_is_refused() {
    refused_with("other-key", "unopenable", false).await;
}

#[tokio::test]
async fn a_lease_of_a_previous_generation_is_refused() {
    refused_with("stale-generation", "stale_generation", false).await;
}

#[tokio::test]
async fn an_expired_lease_is_refused() {
    refused_with("expired", "expired", false).await;
}

#[tokio::test]
async fn a_replayed_lease_is_refused() {
    refused_with("replay", "replayed", true).await;
}

/// A disabled profile takes its providers out of selection: the model's
/// other providers answer, and with none the client gets the usual 503.
/// Nothing reaches the provider and no lease is sealed.
#[tokio::test]
async fn a_disabled_profile_takes_its_providers_out() {
    let (stack, _mock, url) = keyed_stack(Vec::new()).await;
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    std::fs::write(&stack.edge_config, text.replace("disabled: false", "disabled: true")).unwrap();
    wait_until("the reload", WAIT, || async { stack.get_json("/admin/v1/config").await["config"]["revision"] == 2 })
        .await;
    let admin = stack.provider_admin("keyed").await;
    assert_eq!(
        admin["credential"],
        serde_json::json!({"profile": "lm", "state": "disabled", "problem": null, "node_refusal": null})
    );
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("keyed", "hello", false)).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("no_provider_available")), "{body}");
    assert_eq!(keyed_requests(&stack, &url).await, 0);
    assert_eq!(stack.metric("iop_edge_credential_leases_sealed_total").await, 0.0);
    assert_eq!(stack.metric("iop_edge_provider_credential{provider=\"keyed\",state=\"disabled\"}").await, 1.0);
}

/// A Kubernetes rollout may update the config before the Secret with the
/// credential file it names: the config applies at once, the providers of
/// the missing credential are unavailable (saying why), and they come back
/// as soon as the file appears, without another change to the config.
#[tokio::test]
async fn a_config_naming_a_credential_file_not_there_yet_applies_and_the_profile_follows_the_file() {
    let (stack, _mock, _url) = keyed_stack(Vec::new()).await;
    let late = stack.dir.path().join("late.key");
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
    config.credentials.push(iop_proto::config::CredentialProfile {
        profile: "late".into(),
        file: late.clone(),
        revision: 1,
        disabled: false,
    });
    let backup = config.providers.iter_mut().find(|p| p.id == "keyed-backup").unwrap();
    backup.credential = Some(iop_proto::config::CredentialRef { profile: "late".into() });
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    wait_until("the reload", WAIT, || async { stack.get_json("/admin/v1/config").await["config"]["revision"] == 2 })
        .await;
    let admin = stack.provider_admin("keyed-backup").await;
    assert_eq!(admin["credential"]["state"], "invalid", "{admin}");
    assert_eq!(admin["credential"]["problem"], "the file cannot be read", "{admin}");
    assert_eq!((admin["health"].as_str(), admin["dispatchable"].as_bool()), (Some("unavailable"), Some(false)));
    std::fs::write(&late, KEY).unwrap();
    wait_until("the profile once the file exists", WAIT, || async {
        stack.provider_admin("keyed-backup").await["credential"]["state"] == "ok"
    })
    .await;
    assert_eq!(stack.metric("iop_edge_config_reloads_total{result=\"rejected\"}").await, 0.0);
}

/// One bad credential value (issue 25 item 3): a file with a space or a
/// control byte disables only its profile. The rest of the same reload (a
/// revoked API key) applies, the profile's providers say why in
/// `/admin/v1/providers` and the metric, other providers keep answering,
/// and an Edge restarted with that config starts.
#[tokio::test]
async fn a_bad_credential_value_disables_only_its_profile() {
    use std::io::Write;
    const KEYED_CLIENT: &str = "sk-client-keyed-0123456789";
    const REVOKED_CLIENT: &str = "sk-client-revoked-0123456789";
    let hash = |key: &str| {
        let mut child = std::process::Command::new(iop_e2e::harness::bin("iop-edge"))
            .arg("hash-key")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(key.as_bytes()).unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap().trim().to_string()
    };
    let entry = |name: &str, key: &str, disabled: bool| {
        format!("  - {{ name: {name}, key_sha256: {}, models: ['*'], disabled: {disabled} }}\n", hash(key))
    };
    let (_mock, url) = spawn_keyed_mock(KEY).await;
    let keyed = provider("keyed", Adapter::Openai, "mock", "keyed", &url);
    let mut stack = Stack::start(StackOptions {
        keys: Some(format!("principals:\n{}{}", entry("a", KEYED_CLIENT, false), entry("b", REVOKED_CLIENT, false))),
        extra_providers: vec![keyed],
        credentials: vec![Managed { profile: "lm", secret: KEY, revision: 1, providers: vec!["keyed"] }],
        ..Default::default()
    })
    .await;
    wait_until("keyed dispatchable", WAIT, || async { stack.provider_admin("keyed").await["dispatchable"] == true })
        .await;
    assert_eq!(call(&stack, REVOKED_CLIENT, "mock-openai").await.0, 200);

    // One change: the credential file gets a space, and `b` is revoked.
    std::fs::write(stack.dir.path().join("lm.key"), "sk-lm studio\n").unwrap();
    let keys = stack.dir.path().join("keys.yaml");
    std::fs::write(
        &keys,
        format!("principals:\n{}{}", entry("a", KEYED_CLIENT, false), entry("b", REVOKED_CLIENT, true)),
    )
    .unwrap();
    wait_until("the revocation applied", WAIT, || async { call(&stack, REVOKED_CLIENT, "mock-openai").await.0 == 401 })
        .await;
    assert_eq!(stack.get_json("/admin/v1/config").await["config"]["last_error"], Value::Null);
    wait_until("the bad credential seen", WAIT, || async {
        stack.provider_admin("keyed").await["credential"]["state"] == "invalid"
    })
    .await;
    let admin = stack.provider_admin("keyed").await;
    assert_eq!(admin["credential"]["problem"].as_str().unwrap(), "the value must be printable ASCII without spaces");
    assert!(!admin.to_string().contains("studio"), "never the value: {admin}");
    assert_eq!(stack.metric("iop_edge_provider_credential{provider=\"keyed\",state=\"invalid\"}").await, 1.0);
    let (status, body) = call(&stack, KEYED_CLIENT, "keyed").await;
    assert_eq!(status, 503, "the only provider of the model is unavailable: {body}");
    assert_eq!(call(&stack, KEYED_CLIENT, "mock-openai").await.0, 200, "other providers answer");

    // A control byte, then a restart with that config: the Edge starts.
    std::fs::write(stack.dir.path().join("lm.key"), b"sk-lm\x07studio\n").unwrap();
    stack.edge.take().unwrap().terminate().await;
    stack.start_edge().await;
    stack.wait_node_ready(NODE).await;
    assert_eq!(stack.provider_admin("keyed").await["credential"]["state"], "invalid");
    assert_eq!(call(&stack, KEYED_CLIENT, "mock-openai").await.0, 200);
    assert_eq!(call(&stack, REVOKED_CLIENT, "mock-openai").await.0, 401);
}

/// A chat for `model` with the client key `key`.
async fn call(stack: &Stack, key: &str, model: &str) -> (u16, Value) {
    let response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(serde_json::to_vec(&chat_body(model, "hello", false)).unwrap())
        .send()
        .await
        .unwrap();
    json_body(response).await
}

/// Issue 25 item 5: a provider that quotes the `Authorization` header it got
/// (in an error body, or in an error event inside a stream split across two
/// writes) does not hand the managed key to the client: not through a
/// normalized run (OpenAI-compatible or Ollama adapter), not through a
/// tunnel, in any API shape, streamed or not.
#[tokio::test]
async fn a_provider_quoting_its_key_never_hands_it_to_the_client() {
    const LONG_KEY: &str = "sk-proj-Zq8vK2mN4pR7tW1xY5aB3cD6eF9gH0jL";
    let (_mock, url) = spawn_keyed_mock(LONG_KEY).await;
    let openai = provider("echo", Adapter::Openai, "mock@echo_auth", "echo", &url);
    let ollama = provider("echo-ollama", Adapter::Ollama, "mock@echo_auth", "echo-ollama", &url);
    let status = provider("echo-status", Adapter::Openai, "mock@echo_auth,status=400", "echo-status", &url);
    let mut tunnel = provider("echo-tunnel", Adapter::Openai, "mock@echo_auth", "echo-tunnel", &url);
    tunnel.mode = ProviderMode::Tunnel;
    let managed = vec!["echo", "echo-ollama", "echo-status", "echo-tunnel"];
    let stack = Stack::start(StackOptions {
        extra_providers: vec![openai, ollama, status, tunnel],
        credentials: vec![Managed { profile: "lm", secret: LONG_KEY, revision: 1, providers: managed.clone() }],
        ..Default::default()
    })
    .await;
    for id in &managed {
        wait_until(&format!("{id} dispatchable"), WAIT, || async {
            stack.provider_admin(id).await["dispatchable"] == true
        })
        .await;
    }
    let mut cases = 0;
    for model in ["echo", "echo-ollama", "echo-status", "echo-tunnel"] {
        for stream in [false, true] {
            let shapes = [
                ("/v1/chat/completions", chat_body(model, "hello", stream)),
                ("/v1/responses", serde_json::json!({ "model": model, "input": "hello", "stream": stream })),
                (
                    "/v1/messages",
                    serde_json::json!({
                        "model": model, "max_tokens": 16, "stream": stream,
                        "messages": [{ "role": "user", "content": "hello" }],
                    }),
                ),
            ];
            for (path, body) in shapes {
                let response = stack.post(path, &body).await;
                let status = response.status();
                let headers = format!("{:?}", response.headers());
                let text = response.text().await.unwrap();
                let case = format!("{model} {path} stream={stream}: {status} {text}");
                assert!(!text.contains(LONG_KEY) && !headers.contains(LONG_KEY), "{case}");
                assert!(!text.contains(&LONG_KEY[8..24]) && !text.contains(&LONG_KEY[24..]), "no piece of it: {case}");
                // The quote did reach the client, scrubbed: the test sees
                // the path a leak would take.
                assert!(text.contains("[credential redacted]"), "{case}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 24);
}
