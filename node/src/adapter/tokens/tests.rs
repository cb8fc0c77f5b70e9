use super::*;
use crate::adapter::fake::{self, Reply};

fn count_run() -> pb::RunRequest {
    pb::RunRequest { count_tokens: true, ..fake::request(vec![fake::user("count me")]) }
}

#[tokio::test]
async fn a_provider_without_a_tokenizer_fails_the_count_as_invalid_and_generates_nothing() {
    let mut missing = fake::serve(Reply::json(404, r#"{"error":"not found"}"#)).await;
    let (result, events) = fake::run(&fake::target(AdapterKind::OpenAi, &missing.base_url), &count_run()).await;
    assert!(
        matches!(&result, Err(AdapterError::InvalidRequest(m)) if m.contains("cannot count tokens") && m.contains("404")),
        "{result:?}"
    );
    assert!(events.is_empty());
    assert_eq!(missing.request().await.path, TEMPLATE_PATH, "the template is asked first");

    // Ollama is not asked at all.
    let (result, events) = fake::run(&fake::target(AdapterKind::Ollama, "http://127.0.0.1:9"), &count_run()).await;
    assert!(matches!(&result, Err(AdapterError::InvalidRequest(m)) if m.contains("Ollama")), "{result:?}");
    assert!(events.is_empty());

    // A provider failing is the provider failing, not a missing tokenizer.
    let broken = fake::serve(Reply::json(500, r#"{"error":"boom"}"#)).await;
    let (result, _) = fake::run(&fake::target(AdapterKind::OpenAi, &broken.base_url), &count_run()).await;
    assert!(matches!(result, Err(AdapterError::HttpStatus { status: 500, .. })), "{result:?}");
}
