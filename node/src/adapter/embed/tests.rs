use super::*;
use crate::adapter::fake::{self, Reply};

fn embed_run(dimensions: u32) -> pb::RunRequest {
    let embed = pb::EmbedRequest { inputs: vec!["a".into(), "b".into()], dimensions };
    pb::RunRequest { embed: Some(embed), ..fake::request(Vec::new()) }
}

const TWO_WIDE: &str = r#"{"data":[{"index":1,"embedding":[0.3,0.4]},{"index":0,"embedding":[0.1,0.2]}],
        "usage":{"prompt_tokens":2}}"#;

/// llama.cpp's server ignores `dimensions` and answers the model's full
/// width: a client that asked for 4 dimensions must not be handed 640
/// as if they were what it asked for.
#[tokio::test]
async fn a_provider_that_ignores_dimensions_fails_the_run_as_invalid() {
    let mut provider = fake::serve(Reply::json(200, TWO_WIDE)).await;
    let (result, events) = fake::run(&fake::target(AdapterKind::OpenAi, &provider.base_url), &embed_run(4)).await;
    assert!(
        matches!(&result, Err(AdapterError::InvalidRequest(m)) if m.contains("dimensions") && m.contains("2")),
        "{result:?}"
    );
    assert!(events.is_empty(), "nothing is answered: {events:?}");
    assert_eq!(provider.request().await.json()["dimensions"], 4, "the provider was asked");

    // The width asked for, or none asked for: answered in input order.
    for dimensions in [2, 0] {
        let provider = fake::serve(Reply::json(200, TWO_WIDE)).await;
        let target = fake::target(AdapterKind::OpenAi, &provider.base_url);
        let (result, events) = fake::run(&target, &embed_run(dimensions)).await;
        assert!(result.is_ok(), "{result:?}");
        let Some(pb::run_event::Event::Embeddings(answer)) = events.get(1) else { panic!("{events:?}") };
        assert_eq!(answer.embeddings[0].values, [0.1, 0.2]);
    }
}
