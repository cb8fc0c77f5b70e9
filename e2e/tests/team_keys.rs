//! A gateway a team shares (issue 30, items 2 and 3) end to end: real
//! `iop-edge`, `iop-node` and mock provider processes, keys made by
//! `iop-edge new-key --expires-in`, the official `openai` and `anthropic`
//! SDKs (`sdk/team_keys.py`): expired keys, a rotation by keys-file reload
//! without a refused request, and usage counted per principal and model in
//! `/admin/v1/usage` and `iop_edge_tokens_total`.

mod common;

use common::*;
use iop_e2e::harness::{bin, wait_until};
use iop_edge::auth::{sha256, to_hex};
use serde_json::Value;

fn hash(key: &str) -> String {
    to_hex(&sha256(key.as_bytes()))
}

/// `iop-edge new-key --name NAME --expires-in IN`: the key and the
/// `expires_at` it printed.
fn expiring_key(name: &str, expires_in: &str) -> (String, String) {
    let (key, entry) = new_key(name, &["--expires-in", expires_in]);
    assert!(entry.contains(&hash(&key)), "{entry}");
    let at = entry.split("expires_at: \"").nth(1).and_then(|rest| rest.split('"').next()).expect("expires_at");
    (key, at.to_string())
}

#[tokio::test]
async fn new_key_refuses_a_bad_expiry() {
    let out = std::process::Command::new(bin("iop-edge"))
        .args(["new-key", "--name", "x", "--expires-in", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("e.g. 90d"));
    assert!(out.stdout.is_empty(), "no key is printed");
}

/// An expired key (its own `expires_at`, or its principal's) is `401
/// api_key_expired` in each SDK; a key from `new-key --expires-in 30d` works.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn expired_keys_are_refused_in_each_sdks_shape() {
    let (fresh, expires_at) = expiring_key("fresh", "30d");
    let keys = format!(
        "principals:
  - name: fresh
    keys: [ {{ sha256: {fresh}, expires_at: \"{expires_at}\" }} ]
    models: ['*']
  - name: rotated
    keys:
      - {{ sha256: {old}, expires_at: '2020-01-01T00:00:00Z' }}
      - {{ sha256: {new} }}
    models: ['*']
  - {{ name: gone, key_sha256: {gone}, expires_at: '2021-06-01T00:00:00+02:00', models: ['*'] }}
",
        fresh = hash(&fresh),
        old = hash("sk-old-0123"),
        new = hash("sk-new-0123"),
        gone = hash("sk-gone-0123"),
    );
    let stack = Stack::start(StackOptions { keys: Some(keys), ..Default::default() }).await;
    let base = stack.url("");
    let base = base.trim_end_matches('/');
    run_script("team_keys.py", &["works", base, &fresh, "mock-openai"]).await;
    run_script("team_keys.py", &["works", base, "sk-new-0123", "mock-openai"]).await;
    for expired in ["sk-old-0123", "sk-gone-0123"] {
        run_script("team_keys.py", &["refused", base, expired, "mock-openai", "api_key_expired"]).await;
    }
    let expired = stack.metric("iop_edge_auth_rejections_total{reason=\"api_key_expired\"}").await;
    assert_eq!(expired, 4.0, "two keys, two SDKs");
    let usage = stack.get_json("/admin/v1/usage").await;
    assert!(usage["principals"].get("gone").is_none(), "a refused key's principal is not charged: {usage}");
}

/// A rotation as a team runs it: the new key is added beside the old one,
/// clients move, the old key is removed; each step is a keys-file reload,
/// and the old key answers until the step that removes it.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn a_key_is_rotated_by_reload_without_a_refused_request() {
    let entry = |keys: &[&str]| {
        let list: Vec<String> = keys.iter().map(|k| format!("{{ sha256: {} }}", hash(k))).collect();
        format!("principals:\n  - {{ name: team, keys: [ {} ], models: ['*'] }}\n", list.join(", "))
    };
    let stack = Stack::start(StackOptions { keys: Some(entry(&["sk-a-0123"])), ..Default::default() }).await;
    let keys_path = stack.dir.path().join("keys.yaml");
    let base = stack.url("");
    let base = base.trim_end_matches('/');
    let reload = |text: String, revision: u64| {
        let (path, stack) = (keys_path.clone(), &stack);
        async move {
            std::fs::write(path, text).unwrap();
            wait_until("the keys reload", WAIT, || async {
                stack.get_json("/admin/v1/config").await["config"]["revision"] == revision
            })
            .await;
        }
    };
    run_script("team_keys.py", &["works", base, "sk-a-0123", "mock-openai"]).await;
    reload(entry(&["sk-a-0123", "sk-b-0123"]), 2).await;
    run_script("team_keys.py", &["works", base, "sk-a-0123", "mock-openai"]).await;
    run_script("team_keys.py", &["works", base, "sk-b-0123", "mock-openai"]).await;
    reload(entry(&["sk-b-0123"]), 3).await;
    run_script("team_keys.py", &["refused", base, "sk-a-0123", "mock-openai", "invalid_api_key"]).await;
    run_script("team_keys.py", &["works", base, "sk-b-0123", "mock-openai"]).await;
    // Every answer was the same principal's: 4 `works` runs, 2 requests each.
    let usage = stack.get_json("/admin/v1/usage").await;
    assert_eq!(usage["principals"]["team"]["requests"], 8, "{usage}");
    assert_eq!(usage["principals"]["team"]["errors"], 0, "{usage}");
}

/// Usage is counted per principal and model from what each answer
/// reported (normalized runs, streams, and a tunnel whose usage the node
/// read from the relayed body), equal to what the SDKs saw; refusals after
/// authentication are the principal's errors; another principal's usage is
/// its own.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn usage_is_counted_per_principal_and_model() {
    let keys = format!(
        "principals:\n  - {{ name: team, key_sha256: {}, models: ['mock-*'] }}\n  - {{ name: other, key_sha256: {}, models: ['*'] }}\n",
        hash("sk-team-0123"),
        hash("sk-other-0123")
    );
    let mut tunnel = provider("tunnel-mock", iop_proto::config::Adapter::Openai, "mock", "mock-tunnel", "");
    tunnel.mode = iop_proto::config::ProviderMode::Tunnel;
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![tunnel], ..Default::default() }).await;
    let base = stack.url("");
    let base = base.trim_end_matches('/');
    let printed = run_script("team_keys.py", &["usage", base, "sk-team-0123", "mock-openai", "mock-tunnel"]).await;
    let seen: Value = serde_json::from_str(printed.lines().last().unwrap()).unwrap();
    run_script("team_keys.py", &["works", base, "sk-other-0123", "mock-ollama"]).await;
    // One refusal after authentication: a model the key may not use.
    let forbidden = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth("sk-team-0123")
        .header("content-type", "application/json")
        .body(chat_body("secret-model", "hi", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 403);

    // Accounted when each response is done: wait for the last one.
    let requests = seen["requests"].as_u64().unwrap() + 1;
    wait_until("every request accounted", WAIT, || async {
        stack.get_json("/admin/v1/usage").await["principals"]["team"]["requests"].as_u64() == Some(requests)
    })
    .await;
    let usage = stack.get_json("/admin/v1/usage").await;
    let team = &usage["principals"]["team"];
    assert_eq!(team["errors"], 1, "{usage}");
    assert_eq!(team["models"]["unknown"]["errors"], 1, "the refused model is not a label: {usage}");
    let (mut input, mut output) = (0, 0);
    for (model, saw) in seen["models"].as_object().unwrap() {
        let counted = &team["models"][model];
        assert_eq!(counted["input_tokens"], saw["input"], "{model}: {usage}");
        assert_eq!(counted["output_tokens"], saw["output"], "{model}: {usage}");
        input += saw["input"].as_u64().unwrap();
        output += saw["output"].as_u64().unwrap();
        for (kind, n) in [("input", &saw["input"]), ("output", &saw["output"])] {
            let sample = format!(
                "iop_edge_tokens_total{{principal=\"team\",model=\"{model}\",kind=\"{kind}\",source=\"provider\"}}"
            );
            assert_eq!(stack.metric(&sample).await, n.as_f64().unwrap(), "{sample}");
        }
    }
    assert_eq!((team["input_tokens"].as_u64(), team["output_tokens"].as_u64()), (Some(input), Some(output)));
    assert!(team["models"]["mock-tunnel"]["input_tokens"].as_u64().unwrap() > 0, "the tunnel's usage: {usage}");
    let other = &usage["principals"]["other"];
    assert_eq!((other["requests"].as_u64(), other["errors"].as_u64()), (Some(2), Some(0)), "{usage}");
    assert!(other["models"]["mock-ollama"]["output_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(stack.metric("iop_edge_principal_errors_total{principal=\"team\"}").await, 1.0);
    assert_eq!(stack.metric("iop_edge_principal_errors_total{principal=\"other\"}").await, 0.0);
}

/// A client that reads a tunnelled stream to its `[DONE]` and closes at
/// once, as the SDKs do, before the node's End frame (which carries the
/// usage the node read) arrives: the provider did the work, so the tokens
/// are still accounted, and the principal's request is not an error.
#[tokio::test]
async fn a_tunnel_client_that_closes_at_done_is_still_charged_its_tokens() {
    let keys = format!("principals:\n  - {{ name: team, key_sha256: {}, models: ['*'] }}\n", hash("sk-team-0123"));
    // The provider keeps its body open 300 ms after `[DONE]`.
    let mut tunnel =
        provider("tunnel-mock", iop_proto::config::Adapter::Openai, "mock@end_delay_ms=300", "mock-tunnel", "");
    tunnel.mode = iop_proto::config::ProviderMode::Tunnel;
    let stack =
        Stack::start(StackOptions { keys: Some(keys), extra_providers: vec![tunnel], ..Default::default() }).await;
    let mut body = chat_body("mock-tunnel", "hi", true);
    body["stream_options"] = serde_json::json!({ "include_usage": true });
    let mut response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth("sk-team-0123")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    while !text.contains("data: [DONE]") {
        let chunk = response.chunk().await.unwrap().expect("the stream reaches [DONE]");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let usage: Value = text
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find_map(|chunk| chunk.get("usage").filter(|u| u.is_object()).cloned())
        .expect("the stream reports its usage");
    drop(response);

    wait_until("the request accounted", WAIT, || async {
        stack.get_json("/admin/v1/usage").await["principals"]["team"]["requests"].as_u64() == Some(1)
    })
    .await;
    let ledger = stack.get_json("/admin/v1/usage").await;
    let counted = &ledger["principals"]["team"]["models"]["mock-tunnel"];
    assert_eq!(counted["input_tokens"], usage["prompt_tokens"], "{ledger}");
    assert_eq!(counted["output_tokens"], usage["completion_tokens"], "{ledger}");
    assert_eq!(counted["errors"], 0, "{ledger}");
}
