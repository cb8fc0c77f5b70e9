//! Issue 28 item 6: passive outlier ejection through real processes. Two
//! providers serve one model; the preferred one answers every generation
//! with a 500 while its metadata probe answers (so its health stays
//! `available`). After `consecutive_failures` failed generations it is
//! ejected: the following requests go straight to the healthy provider,
//! with no failed attempt on the broken one first. Once the (short)
//! ejection time has passed and the provider is fixed, its trial request
//! succeeds and it takes traffic again.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{Adapter, OutlierConfig};
use serde_json::Value;

const MODEL: &str = "flaky";
const THRESHOLD: u32 = 3;
/// Long enough for a few requests on a loaded machine; the test checks it
/// did not run out while it asserted the ejection.
const EJECTION_MS: u64 = 6_000;

async fn ask(stack: &Stack) -> Value {
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", false)).await).await;
    assert_eq!(status, 200, "the healthy provider answers every request: {body}");
    body
}

fn wall_ms(rfc3339: &str) -> i64 {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339).unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// A stack whose model has a preferred provider `bad` on its own mock
/// (returned with its URL) and a healthy `good` one, under `outlier`.
async fn bad_and_good(outlier: OutlierConfig) -> (Stack, iop_e2e::harness::Proc, String) {
    let (bad_mock, bad_url) = spawn_mock("127.0.0.1:0").await;
    let mut bad = provider("bad", Adapter::Openai, "mock", MODEL, &bad_url);
    bad.priority = 0;
    let mut good = provider("good", Adapter::Openai, "mock", MODEL, "");
    good.priority = 1;
    let stack =
        Stack::start(StackOptions { extra_providers: vec![bad, good], outlier: Some(outlier), ..Default::default() })
            .await;
    (stack, bad_mock, bad_url)
}

#[tokio::test]
async fn a_provider_failing_every_generation_is_ejected_then_returns() {
    let (stack, _bad_mock, bad_url) = bad_and_good(OutlierConfig {
        consecutive_failures: THRESHOLD,
        base_ejection_ms: EJECTION_MS,
        max_ejection_ms: 4 * EJECTION_MS,
        ..Default::default()
    })
    .await;
    let good_url = stack.mock_url.clone();
    let retried = r#"iop_edge_attempts_total{provider="bad",outcome="retried"}"#;

    // The preferred provider refuses every generation; its probe still answers.
    stack.set_mock_faults(&bad_url, "status=500").await;
    let mut asked = 0;
    while stack.provider_admin("bad").await["ejected_until"].is_null() {
        assert!(asked < 2 * THRESHOLD, "still not ejected after {asked} requests");
        ask(&stack).await;
        asked += 1;
    }
    let admin = stack.provider_admin("bad").await;
    assert_eq!(admin["health"], "available", "the health overlay is untouched: {admin}");
    assert_eq!(admin["ejections"], 1, "{admin}");
    let until = wall_ms(admin["ejected_until"].as_str().unwrap());
    assert!(until > now_ms(), "{admin}");
    assert_eq!(stack.metric(r#"iop_edge_provider_ejections_total{provider="bad"}"#).await, 1.0);
    assert_eq!(stack.metric(r#"iop_edge_provider_ejected{provider="bad"}"#).await, 1.0);

    // Ejected: straight to the healthy provider, no failed attempt first.
    let (failed_before, bad_before, good_before) = (
        stack.metric(retried).await,
        stack.mock_requests(&bad_url, "/v1/chat/completions", None).await,
        stack.mock_requests(&good_url, "/v1/chat/completions", None).await,
    );
    for _ in 0..4 {
        ask(&stack).await;
    }
    assert!(now_ms() < until, "the ejection ran out while the test asserted it: raise EJECTION_MS");
    assert_eq!(
        stack.mock_requests(&bad_url, "/v1/chat/completions", None).await,
        bad_before,
        "the ejected provider got no generation"
    );
    assert_eq!(stack.metric(retried).await, failed_before, "no request paid a failed attempt");
    assert_eq!(stack.mock_requests(&good_url, "/v1/chat/completions", None).await, good_before + 4);

    // Fixed, and the ejection time passed: its trial request succeeds and it
    // takes traffic again.
    stack.set_mock_faults(&bad_url, "").await;
    wait_until("the ejection ends", WAIT, || async { stack.provider_admin("bad").await["ejected_until"].is_null() })
        .await;
    let bad_before = stack.mock_requests(&bad_url, "/v1/chat/completions", None).await;
    ask(&stack).await;
    ask(&stack).await;
    assert_eq!(
        stack.mock_requests(&bad_url, "/v1/chat/completions", None).await,
        bad_before + 2,
        "the preferred provider answers again"
    );
    let admin = stack.provider_admin("bad").await;
    assert_eq!((admin["ejected_until"].clone(), admin["consecutive_failures"].clone()), (Value::Null, 0.into()));
    assert_eq!(stack.metric(r#"iop_edge_provider_ejected{provider="bad"}"#).await, 0.0);
}

/// Never eject everything: when every provider of a model is ejected, the
/// requests still reach them (the providers' own errors, not
/// `no_provider_available`), and the first success brings one back.
#[tokio::test]
async fn when_every_provider_is_ejected_requests_still_reach_them() {
    let (_mock, url) = spawn_mock("127.0.0.1:0").await;
    let only = provider("only", Adapter::Openai, "mock", MODEL, &url);
    let stack = Stack::start(StackOptions {
        extra_providers: vec![only],
        outlier: Some(OutlierConfig {
            consecutive_failures: 1,
            base_ejection_ms: 600_000,
            max_ejection_ms: 600_000,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await;
    stack.set_mock_faults(&url, "status=500").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", false)).await).await;
    assert_ne!(status, 200, "{body}");
    assert!(!stack.provider_admin("only").await["ejected_until"].is_null());
    let before = stack.mock_requests(&url, "/v1/chat/completions", None).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", false)).await).await;
    assert_ne!(body["error"]["code"], "no_provider_available", "{status} {body}");
    assert!(
        stack.mock_requests(&url, "/v1/chat/completions", None).await > before,
        "panic routing: the ejected provider is still asked"
    );
    stack.set_mock_faults(&url, "").await;
    ask(&stack).await;
    assert!(stack.provider_admin("only").await["ejected_until"].is_null(), "a success brings it back");
}

/// Issue 46 item 2: the failure that ejects a provider is recorded before
/// the retry is planned, so the retry never goes to the provider that
/// failure just ejected (it used to wait its backoff and try it again).
#[tokio::test]
async fn a_retry_never_goes_to_the_provider_its_failure_ejected() {
    let (stack, _bad_mock, bad_url) =
        bad_and_good(OutlierConfig { consecutive_failures: 1, ..Default::default() }).await;
    stack.set_mock_faults(&bad_url, "status=500").await;
    let body = ask(&stack).await;
    assert_eq!(
        stack.mock_requests(&bad_url, "/v1/chat/completions", None).await,
        1,
        "one failed attempt on it, no retry there: {body}"
    );
    assert!(!stack.provider_admin("bad").await["ejected_until"].is_null());
    let path = r#"iop_edge_retry_paths_total{path="lower_priority"}"#;
    assert_eq!(stack.metric(path).await, 1.0);
}

/// Issue 46 item 1: half-open recovery through real processes. While the
/// preferred provider keeps failing, requests sent back to back reach it
/// only as one trial per ejection time; once it is fixed, the next trial
/// returns it, within the longest ejection.
#[tokio::test]
async fn an_ejected_provider_gets_one_trial_per_ejection_and_returns_after_its_fix() {
    const BASE_MS: u64 = 1_000;
    let (stack, _bad_mock, bad_url) = bad_and_good(OutlierConfig {
        consecutive_failures: 2,
        base_ejection_ms: BASE_MS,
        max_ejection_ms: 2 * BASE_MS,
        ..Default::default()
    })
    .await;
    stack.set_mock_faults(&bad_url, "status=500").await;
    // Back to back for a while: its two failures, then one trial per
    // ejection time (1 s, then 2 s), each a failure that ejects it again.
    let started = std::time::Instant::now();
    let mut asked = 0;
    while stack.provider_admin("bad").await["ejections"].as_u64() < Some(3) {
        ask(&stack).await;
        asked += 1;
        assert!(started.elapsed() < WAIT, "no third ejection after {asked} requests");
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let trials = stack.mock_requests(&bad_url, "/v1/chat/completions", None).await - 2;
    assert!(trials <= (elapsed_ms / BASE_MS + 1) as usize, "{trials} trials in {elapsed_ms} ms ({asked} requests)");
    assert!(asked > trials + 2, "the other requests went to the healthy provider");

    // Fixed: the next trial succeeds and it takes traffic again.
    stack.set_mock_faults(&bad_url, "").await;
    let fixed = std::time::Instant::now();
    wait_until("back in selection", WAIT, || async {
        ask(&stack).await;
        stack.provider_admin("bad").await["consecutive_failures"] == 0
            && stack.provider_admin("bad").await["ejected_until"].is_null()
            && !stack.provider_admin("bad").await["on_trial"].as_bool().unwrap_or(true)
    })
    .await;
    let bad_before = stack.mock_requests(&bad_url, "/v1/chat/completions", None).await;
    ask(&stack).await;
    assert_eq!(
        stack.mock_requests(&bad_url, "/v1/chat/completions", None).await,
        bad_before + 1,
        "the preferred provider answers again"
    );
    eprintln!("back {:?} after the fix (the longest ejection is {} ms)", fixed.elapsed(), 2 * BASE_MS);
}
