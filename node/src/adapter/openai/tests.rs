use iop_proto::pb::run_event::Event;
use serde_json::json;

use super::super::AdapterKind;
use super::super::events::{tool_call, usage};
use super::super::fake::{self, Reply};
use super::*;

const SSE: &str = "text/event-stream";

fn target(base_url: &str) -> ProviderTarget {
    fake::target(AdapterKind::OpenAi, base_url)
}

fn started(model: &str) -> Event {
    super::super::events::started(model)
}

fn text(t: &str) -> Event {
    super::super::events::text(t)
}

fn content_chunk(content: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-x-2024",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    )
}

fn finish_chunk(reason: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"model": "gpt-x-2024", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    )
}

const USAGE_CHUNK: &str = "data: {\"model\":\"gpt-x-2024\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3,\"total_tokens\":14}}\n\n";

/// A reasoning model's usage keeps its reasoning count (accounted as
/// `kind=reasoning` at the Edge).
#[tokio::test]
async fn usage_keeps_the_reasoning_tokens() {
    let usage_chunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":9,\"completion_tokens_details\":{\"reasoning_tokens\":6}}}\n\n";
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [content_chunk("ok"), finish_chunk("stop"), usage_chunk.to_owned(), "data: [DONE]\n\n".to_owned()],
    ))
    .await;
    let (_, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    let reported = pb::Usage::provider(4, 9, 6);
    assert_eq!(events.last(), Some(&pb::run_event::Event::Usage(reported)));
}

#[tokio::test]
async fn streams_text_then_usage_and_stop() {
    let first = content_chunk("Hel");
    let (a, b) = first.split_at(25); // a data line split across network chunks
    let mut server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            ": keep-alive\n\n".to_owned(),
            format!("event: message\nid: 1\nretry: 5\n{a}"),
            b.to_owned(),
            content_chunk("lo").replacen("data: ", "data:", 1),
            finish_chunk("stop"),
            USAGE_CHUNK.to_owned(),
            "data: [DONE]\n\n".to_owned(),
        ],
    ))
    .await;
    let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
    assert_eq!(events, vec![started("gpt-x-2024"), text("Hel"), text("lo"), usage(11, 3)]);

    let req = server.request().await;
    assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(req.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        req.json(),
        json!({"model": "test-model", "messages": [{"role": "user", "content": "hi"}],
               "stream": true, "stream_options": {"include_usage": true}})
    );
}

#[tokio::test]
async fn options_are_sent() {
    let mut server = fake::serve(Reply::chunks(200, SSE, [content_chunk("a"), finish_chunk("length")])).await;
    let request = pb::RunRequest {
        options: Some(pb::GenerationOptions {
            max_tokens: Some(64),
            temperature: Some(0.7),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            seed: Some(-3),
            ..Default::default()
        }),
        ..fake::request(vec![fake::user("hi")])
    };
    let (result, _) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Length);
    let body = server.request().await.json();
    assert_eq!(
        (&body["max_tokens"], &body["temperature"], &body["top_p"], &body["stop"], &body["seed"]),
        (&json!(64), &json!(0.7), &json!(0.9), &json!(["END"]), &json!(-3))
    );
}

#[tokio::test]
async fn tool_calls_are_translated_both_ways() {
    let call_chunk = |call: Value| {
        format!(
            "data: {}\n\n",
            json!({"model": "gpt-x", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
        )
    };
    let mut server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            call_chunk(json!({"index": 0, "id": "call_abc", "type": "function",
                          "function": {"name": "get_weather", "arguments": ""}})),
            call_chunk(json!({"index": 0, "function": {"arguments": "{\"city\":"}})),
            call_chunk(json!({"index": 0, "function": {"arguments": "\"Berlin\"}"}})),
            finish_chunk("tool_calls"),
            "data: [DONE]\n\n".to_owned(),
        ],
    ))
    .await;
    let request = pb::RunRequest {
        messages: vec![
            pb::ChatMessage { role: pb::Role::System.into(), content: "be brief".into(), ..Default::default() },
            fake::user("weather in Paris?"),
            pb::ChatMessage {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments_json: r#"{"city":"Paris"}"#.into(),
                }],
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Tool.into(),
                content: "sunny".into(),
                tool_call_id: "call_1".into(),
                ..Default::default()
            },
        ],
        tools: vec![pb::ToolDefinition {
            name: "get_weather".into(),
            description: "Current weather".into(),
            parameters_json: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into(),
        }],
        ..fake::request(vec![])
    };
    let (result, events) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::ToolCalls);
    assert_eq!(
        events,
        vec![
            started("gpt-x"),
            tool_call(0, "call_abc", "get_weather", ""),
            tool_call(0, "", "", "{\"city\":"),
            tool_call(0, "", "", "\"Berlin\"}"),
        ]
    );

    let body = server.request().await.json();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    );
}

#[tokio::test]
async fn http_429_carries_retry_after_and_provider_message() {
    let server = fake::serve(
        Reply::json(
            429,
            r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#,
        )
        .header("retry-after", "2"),
    )
    .await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(e @ AdapterError::HttpStatus { .. }) => {
            let AdapterError::HttpStatus { status, retry_after_ms, message, .. } = &e else { unreachable!() };
            assert_eq!((*status, *retry_after_ms), (429, Some(2000)));
            assert_eq!(message, "Rate limit reached for requests");
            let failure = e.to_failure();
            assert_eq!((failure.provider_status, failure.retry_after_ms), (429, 2000));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_400_preserves_provider_message() {
    let server = fake::serve(
        Reply::json(400, r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error"}}"#)
            .header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"),
    )
    .await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(AdapterError::HttpStatus { status: 400, retry_after_ms: None, message, .. }) => {
            assert_eq!(message, "This model's maximum context length is 8192 tokens")
        }
        other => panic!("{other:?}"),
    }
}

/// Issue 28 item 5: the provider's own code travels on the wire.
#[tokio::test]
async fn http_400_carries_the_providers_own_code() {
    let body = r#"{"error":{"message":"rejected by the safety system","type":"invalid_request_error","code":"content_policy_violation"}}"#;
    let server = fake::serve(Reply::json(400, body)).await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(e @ AdapterError::HttpStatus { status: 400, .. }) => {
            let failure = e.to_failure();
            assert_eq!(failure.provider_code, "content_policy_violation");
            assert!(!failure.context_length_exceeded);
        }
        other => panic!("{other:?}"),
    }
}

/// Issue 28 item 5: headers and a first chunk arrived, then the chunked
/// body broke off: a cut (`provider_stream_cut`), not an unreachable
/// provider, and not the protocol error of a body that ends cleanly
/// without its final chunk (above).
#[tokio::test]
async fn a_body_broken_off_after_the_head_is_a_stream_cut() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let chunk = content_chunk("partial");
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 65536];
        let _ = socket.read(&mut buf).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let body = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
        // Closed without the terminating zero-length chunk.
    });
    let (result, events) = fake::run(&target(&base_url), &fake::request(vec![fake::user("hi")])).await;
    match result {
        Err(e @ AdapterError::StreamCut(_)) => {
            assert_eq!(e.to_failure().kind(), pb::FailureKind::ProviderStreamCut)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events, vec![started("gpt-x-2024"), text("partial")], "what came before the cut was forwarded");
}

#[tokio::test]
async fn connection_refused_is_unreachable() {
    let base = fake::refused_base_url().await;
    assert!(matches!(
        fake::run(&target(&base), &fake::request(vec![fake::user("hi")])).await.0,
        Err(AdapterError::Unreachable(_))
    ));
}

const MALFORMED: &str = "data: {\"secret\": \n\n";

fn malformed_count(metrics: &crate::metrics::NodeMetrics) -> String {
    let text = metrics.encode();
    let line = text.lines().find(|l| l.starts_with("iop_node_provider_malformed_events_total{"));
    line.unwrap_or("none").to_owned()
}

/// Issue 28 item 3: one undecodable event amid good ones is skipped,
/// counted for its provider, and the answer completes with the rest.
#[tokio::test]
async fn one_malformed_event_mid_stream_is_skipped_and_counted() {
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            content_chunk("Hel"),
            MALFORMED.to_owned(),
            content_chunk("lo"),
            MALFORMED.to_owned(),
            finish_chunk("stop"),
            "data: [DONE]\n\n".to_owned(),
        ],
    ))
    .await;
    let metrics = crate::metrics::NodeMetrics::new();
    let request = fake::request(vec![fake::user("hi")]);
    let (result, events) = fake::run_counted(&target(&server.base_url), &request, &metrics).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
    assert_eq!(events, vec![started("gpt-x-2024"), text("Hel"), text("lo")]);
    assert_eq!(malformed_count(&metrics), r#"iop_node_provider_malformed_events_total{provider="p1"} 2"#);
}

/// Three in a row: the provider no longer speaks SSE; the run fails as
/// before, and the error does not quote the payload.
#[tokio::test]
async fn malformed_events_in_a_row_are_a_protocol_error() {
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            content_chunk("ok"),
            MALFORMED.to_owned(),
            MALFORMED.to_owned(),
            MALFORMED.to_owned(),
            content_chunk("never"),
            finish_chunk("stop"),
        ],
    ))
    .await;
    let metrics = crate::metrics::NodeMetrics::new();
    let request = fake::request(vec![fake::user("hi")]);
    let (result, events) = fake::run_counted(&target(&server.base_url), &request, &metrics).await;
    match result {
        Err(e @ AdapterError::Protocol(_)) => {
            assert_eq!(e.to_failure().kind(), pb::FailureKind::ProviderProtocol);
            assert!(!e.to_string().contains("secret"), "{e}");
            assert!(e.to_string().contains("3 invalid SSE data payloads in a row"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events, vec![started("gpt-x-2024"), text("ok")]);
    assert_eq!(malformed_count(&metrics), r#"iop_node_provider_malformed_events_total{provider="p1"} 2"#);
}

/// A malformed last event with no terminal after it fails, even after a
/// finish reason (the event may have been the answer's end); with
/// `[DONE]` after it the answer is whole.
#[tokio::test]
async fn malformed_last_event_without_a_terminal_is_a_protocol_error() {
    for last in [MALFORMED, MALFORMED.trim_end()] {
        let server =
            fake::serve(Reply::chunks(200, SSE, [content_chunk("ok"), finish_chunk("stop"), last.to_owned()])).await;
        let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
        match result {
            Err(AdapterError::Protocol(msg)) => {
                assert_eq!(msg, "stream ended right after an invalid SSE data payload")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(events, vec![started("gpt-x-2024"), text("ok")]);
    }
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [content_chunk("ok"), finish_chunk("stop"), MALFORMED.to_owned(), "data: [DONE]\n\n".to_owned()],
    ))
    .await;
    let (result, _) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
}

#[tokio::test]
async fn error_chunk_is_a_protocol_error_with_its_message() {
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            content_chunk("ok"),
            "data: {\"error\":{\"message\":\"upstream overloaded\",\"type\":\"server_error\"}}\n\n".to_owned(),
        ],
    ))
    .await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(AdapterError::Protocol(msg)) => assert_eq!(msg, "upstream overloaded"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn stream_cut_before_finish_reason_is_a_protocol_error() {
    let server = fake::serve(Reply::chunks(200, SSE, [content_chunk("partial")])).await;
    let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    match result {
        Err(AdapterError::Protocol(msg)) => assert_eq!(msg, "stream ended before the provider's final chunk"),
        other => panic!("{other:?}"),
    }
    assert_eq!(events, vec![started("gpt-x-2024"), text("partial")]);
}

#[tokio::test]
async fn done_without_finish_reason_is_a_protocol_error() {
    let server = fake::serve(Reply::chunks(200, SSE, [content_chunk("partial"), "data: [DONE]\n\n".to_owned()])).await;
    assert!(matches!(
        fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0,
        Err(AdapterError::Protocol(_))
    ));
}

#[tokio::test]
async fn missing_done_after_finish_reason_is_ok() {
    let server = fake::serve(Reply::chunks(
        200,
        SSE,
        [
            content_chunk("all"),
            finish_chunk("stop"),
            USAGE_CHUNK.trim_end().to_owned(), // last event not even blank-line terminated
        ],
    ))
    .await;
    let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
    assert_eq!(events, vec![started("gpt-x-2024"), text("all"), usage(11, 3)]);
}

#[tokio::test]
async fn dropping_the_run_closes_the_provider_connection() {
    fake::assert_drop_closes_connection(
        AdapterKind::OpenAi,
        SSE,
        "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    )
    .await;
}

#[test]
fn finish_reasons_map() {
    for (reason, expected) in [
        ("stop", pb::FinishReason::Stop),
        ("length", pb::FinishReason::Length),
        ("tool_calls", pb::FinishReason::ToolCalls),
        ("function_call", pb::FinishReason::ToolCalls),
        ("content_filter", pb::FinishReason::ContentFilter),
        ("eos", pb::FinishReason::Stop),
    ] {
        assert_eq!(map_finish_reason(reason), expected, "{reason}");
    }
}

#[test]
fn decoder_tolerates_sparse_chunks() {
    let mut d = Decoder::new("fallback");
    let mut out = Vec::new();
    for line in [
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"usage\":null,\"error\":null}",
        "",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]},\"finish_reason\":\"tool_calls\"}]}",
        "",
    ] {
        assert_eq!(d.line(line, &mut out).unwrap(), None);
    }
    assert_eq!(d.line("data: [DONE]", &mut out).unwrap(), None, "dispatched only at the blank line");
    assert_eq!(d.line("", &mut out).unwrap(), Some(pb::FinishReason::ToolCalls));
    assert_eq!(out, vec![started("fallback"), tool_call(0, "", "f", "")]);
}
