use super::fake::assignment;
use super::*;

#[tokio::test]
async fn execute_rejects_a_mismatched_adapter_and_a_closed_sink() {
    let client = http_client();
    let target = ProviderTarget::from_assignment(&assignment(1, "m", "http://127.0.0.1:9")).unwrap();
    let request = pb::RunRequest { adapter: pb::AdapterKind::Openai.into(), ..Default::default() };
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    assert!(matches!(
        execute(&client, &target, &request, None, &tx, &NodeMetrics::new()).await,
        Err(AdapterError::InvalidRequest(_))
    ));
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    drop(rx);
    assert!(matches!(
        execute(&client, &target, &pb::RunRequest::default(), None, &tx, &NodeMetrics::new()).await,
        Err(AdapterError::SinkClosed)
    ));
}

/// Issue 8 item 7: a client-facing failure never names the provider's
/// (internal) address.
#[tokio::test]
async fn an_unreachable_provider_is_reported_without_its_address() {
    for adapter in [AdapterKind::Ollama, AdapterKind::OpenAi] {
        let base_url = fake::refused_base_url().await;
        let (result, _) = fake::run(&fake::target(adapter, &base_url), &fake::request(vec![fake::user("hi")])).await;
        let failure = result.unwrap_err().to_failure();
        assert_eq!(failure.kind(), pb::FailureKind::ProviderUnreachable);
        let host = base_url.trim_start_matches("http://");
        assert!(!failure.message.contains(host), "{adapter:?}: {}", failure.message);
        assert!(!failure.message.contains("127.0.0.1"), "{adapter:?}: {}", failure.message);
    }
}

#[test]
fn execute_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let client = http_client();
    let target = ProviderTarget::from_assignment(&assignment(1, "m", "http://127.0.0.1:9")).unwrap();
    let request = pb::RunRequest::default();
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let metrics = NodeMetrics::new();
    let fut = execute(&client, &target, &request, None, &tx, &metrics);
    assert_send(&fut);
}
