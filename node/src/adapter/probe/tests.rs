use super::*;
use crate::adapter::fake::{self, Reply};
use crate::adapter::http_client;

#[tokio::test]
async fn one_metadata_call_per_adapter_decides() {
    let client = http_client();
    // Ollama: /api/show for the exact tag.
    let mut ok = fake::serve(Reply::json(200, r#"{"details":{}}"#)).await;
    let target = fake::target(AdapterKind::Ollama, &ok.base_url);
    assert_eq!(probe(&client, &target).await, Probe::available());
    let req = ok.request().await;
    assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/api/show"));
    assert_eq!(req.json()["model"], "test-model");

    // OpenAI-compatible: any 2xx listing is healthy, even one that does
    // not name the target (llama.cpp serves whatever it loaded).
    let mut ok = fake::serve(Reply::json(200, r#"{"object":"list","data":[{"id":"other"}]}"#)).await;
    let target = fake::target(AdapterKind::OpenAi, &ok.base_url);
    assert_eq!(probe(&client, &target).await, Probe::available());
    let req = ok.request().await;
    assert_eq!((req.method.as_str(), req.path.as_str()), ("GET", "/v1/models"));
}

#[tokio::test]
async fn a_managed_credential_providers_401_means_up() {
    let client = http_client();
    for adapter in [AdapterKind::Ollama, AdapterKind::OpenAi] {
        for status in [401, 403] {
            let keyed = fake::serve(Reply::json(status, r#"{"error":"unauthorized"}"#)).await;
            let mut target = fake::target(adapter, &keyed.base_url);
            assert_eq!(probe(&client, &target).await.failure, Some(ProbeFailure::Status(status)));
            target.credential_profile = Some("key".into());
            assert_eq!(probe(&client, &target).await, Probe::available());
        }
    }
}

#[tokio::test]
async fn failures_are_unavailable_with_a_reason() {
    let client = http_client();
    for adapter in [AdapterKind::Ollama, AdapterKind::OpenAi] {
        let missing = fake::serve(Reply::json(404, r#"{"error":"model not found"}"#)).await;
        let verdict = probe(&client, &fake::target(adapter, &missing.base_url)).await;
        assert_eq!(verdict.health, pb::ProviderHealth::Unavailable);
        assert_eq!(verdict.failure, Some(ProbeFailure::Status(404)));

        let refused = fake::refused_base_url().await;
        let verdict = probe(&client, &fake::target(adapter, &refused)).await;
        assert_eq!(verdict.health, pb::ProviderHealth::Unavailable);
        let failure = verdict.failure.unwrap();
        assert_eq!(failure.label(), "unreachable");
        assert!(!failure.to_string().contains("127.0.0.1"), "no address in the reason: {failure}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_answers_is_unknown() {
    let client = http_client();
    let (base_url, _dropped) = fake::serve_hanging_headers().await;
    let verdict = probe(&client, &fake::target(AdapterKind::OpenAi, &base_url)).await;
    assert_eq!(verdict, Probe::failed(ProbeFailure::TimedOut));
    assert_eq!(verdict.health, pb::ProviderHealth::Unknown);
}
