use super::*;

#[test]
fn attribute_values_are_closed() {
    assert_eq!(operation(Api::chat_completions), "chat");
    assert_eq!(operation(Api::messages), "chat");
    assert_eq!(operation(Api::responses), "chat");
    assert_eq!(operation(Api::embeddings), "embeddings");
    assert_eq!(api_name(Api::responses), "responses");
    assert_eq!(provider_name(Adapter::Ollama), "ollama");
    assert_eq!(provider_name(Adapter::Openai), "openai");
    let usage = pb::Usage { prompt_tokens: 3, completion_tokens: 5, ..Default::default() };
    assert_eq!(usage_attributes(&usage), [("gen_ai.usage.input_tokens", 3), ("gen_ai.usage.output_tokens", 5)]);
}

#[test]
fn client_traceparent_is_optional_and_never_an_error() {
    let mut headers = ::http::HeaderMap::new();
    assert_eq!(client_parent(&headers), None);
    headers.insert("traceparent", "00-zz-00f067aa0ba902b7-01".parse().unwrap());
    assert_eq!(client_parent(&headers), None);
    headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
    assert_eq!(client_parent(&headers).map(|c| c.span_id[7]), Some(0xb7));
}

#[tokio::test]
async fn the_current_span_is_task_local() {
    assert_eq!(current(), None);
    let parent = SpanContext { trace_id: [1; 16], span_id: [2; 8], sampled: true };
    assert_eq!(scope(Some(parent), async { current() }).await, Some(parent));
}
