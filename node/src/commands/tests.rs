use super::*;
use crate::adapter::ProviderTarget;
use crate::adapter::fake::{self, Reply};

fn providers(ollama_base: &str) -> Providers {
    let target = |id: &str, adapter, base: &str| ProviderTarget::new(id, adapter, "llama3.2:3b", base).unwrap();
    Providers::from([
        ("ollama".to_owned(), Ok(target("ollama", AdapterKind::Ollama, ollama_base))),
        ("openai".to_owned(), Ok(target("openai", AdapterKind::OpenAi, ollama_base))),
        ("broken".to_owned(), Err("bad assignment".to_owned())),
    ])
}

fn expect_error(result: CommandResult, code: CommandErrorCode) -> String {
    match result {
        CommandResult::Error(e) if e.code() == code => e.message,
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn each_allowed_call_hits_its_path_and_method() {
    let http = adapter::http_client();
    let mut provider = fake::serve(Reply::json(200, r#"{"ok":true}"#)).await;
    let providers = providers(&provider.base_url);
    let calls = [
        (OllamaApiCall::Tags, "GET", "/api/tags"),
        (OllamaApiCall::Ps, "GET", "/api/ps"),
        (OllamaApiCall::Version, "GET", "/api/version"),
        (OllamaApiCall::Show, "POST", "/api/show"),
    ];
    for (call, method, path) in calls {
        match ollama_api(&http, &providers, "ollama", call.into()).await {
            CommandResult::OllamaApi(r) => assert_eq!((r.status, r.body.as_slice()), (200, &br#"{"ok":true}"#[..])),
            other => panic!("{call:?}: {other:?}"),
        }
        let seen = provider.request().await;
        assert_eq!((seen.method.as_str(), seen.path.as_str()), (method, path), "{call:?}");
        if call == OllamaApiCall::Show {
            assert_eq!(seen.json(), serde_json::json!({"model": "llama3.2:3b"}));
            assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        } else {
            assert!(seen.body.is_empty(), "{call:?} sends no body");
        }
    }
}

#[tokio::test]
async fn provider_status_is_passed_back_as_is() {
    let http = adapter::http_client();
    let provider = fake::serve(Reply::json(404, r#"{"error":"model not found"}"#)).await;
    match ollama_api(&http, &providers(&provider.base_url), "ollama", OllamaApiCall::Show.into()).await {
        CommandResult::OllamaApi(r) => {
            assert_eq!((r.status, r.body.as_slice()), (404, &br#"{"error":"model not found"}"#[..]))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn targets_other_than_an_assigned_ollama_provider_are_invalid() {
    let http = adapter::http_client();
    let mut provider = fake::serve(Reply::json(200, "{}")).await;
    let providers = providers(&provider.base_url);
    for id in ["openai", "broken", "unknown"] {
        let message = expect_error(
            ollama_api(&http, &providers, id, OllamaApiCall::Tags.into()).await,
            CommandErrorCode::InvalidTarget,
        );
        assert!(message.contains(id), "{message}");
    }
    // Nothing reached the provider.
    assert!(tokio::time::timeout(Duration::from_millis(20), provider.request()).await.is_err());
}

#[tokio::test]
async fn unknown_and_unspecified_calls_are_unsupported() {
    let http = adapter::http_client();
    let providers = providers("http://127.0.0.1:9");
    for call in [0, 99] {
        expect_error(ollama_api(&http, &providers, "ollama", call).await, CommandErrorCode::Unsupported);
    }
}

#[tokio::test]
async fn unreachable_provider_is_a_provider_failure() {
    let http = adapter::http_client();
    let providers = providers(&fake::refused_base_url().await);
    let message = expect_error(
        ollama_api(&http, &providers, "ollama", OllamaApiCall::Version.into()).await,
        CommandErrorCode::ProviderFailed,
    );
    assert!(message.contains("/api/version"), "{message}");
}

#[tokio::test]
async fn oversized_bodies_are_truncated() {
    let http = adapter::http_client();
    let chunk = vec![b'x'; 256 * 1024];
    let provider = fake::serve(Reply::chunks(200, "application/json", vec![chunk; 6])).await;
    match ollama_api(&http, &providers(&provider.base_url), "ollama", OllamaApiCall::Tags.into()).await {
        CommandResult::OllamaApi(r) => {
            assert_eq!(r.status, 200);
            assert_eq!(r.body.len(), OLLAMA_API_BODY_LIMIT);
            assert!(r.body.iter().all(|&b| b == b'x'));
        }
        other => panic!("{other:?}"),
    }
}
