//! What clients send survives the trip to the provider and back, through
//! both adapters (issue 13): tool choice, structured output, sampling
//! options and reasoning, checked in the request the provider received
//! (`iop-mock-provider`'s request log) and in each API's answer.

mod common;

use common::*;
use serde_json::{Value, json};

const OLLAMA: &str = "/api/chat";
const OPENAI: &str = "/v1/chat/completions";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}])
}

#[tokio::test]
async fn chat_options_reach_both_providers_or_fail_typed() {
    let stack = Stack::start(StackOptions::default()).await;
    let request = |model: &str, extra: Value| {
        let mut body = chat_body(model, "hi", false);
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let stack = &stack;
        async move { stack.post("/v1/chat/completions", &body).await }
    };
    let everything = json!({
        "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "parallel_tool_calls": false,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true, "schema": {"type": "object"}}},
        "top_k": 20, "presence_penalty": 0.5, "frequency_penalty": 0.25, "seed": 7,
        "reasoning_effort": "high",
    });
    let (status, _) = json_body(request("mock-openai", everything.clone()).await).await;
    assert_eq!(status, 200);
    let sent = stack.last_provider_request(OPENAI).await;
    assert_eq!(sent["tool_choice"], json!({"type": "function", "function": {"name": "lookup"}}));
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["response_format"]["json_schema"]["strict"], true);
    assert_eq!((&sent["top_k"], &sent["presence_penalty"], &sent["seed"]), (&json!(20), &json!(0.5), &json!(7)));
    assert_eq!(sent["reasoning_effort"], "high");

    // Ollama cannot enforce a named tool together with the caller's own
    // response format (both need its one `format`): a 400 that says so,
    // never silence.
    let (status, body) = json_body(request("mock-ollama", everything).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("tool_choice"), "{body}");
    let honoured = json!({
        "tools": tools(), "tool_choice": "none",
        "response_format": {"type": "json_object"}, "top_k": 20, "presence_penalty": 0.5,
        "reasoning_effort": "low",
    });
    let (status, _) = json_body(request("mock-ollama", honoured).await).await;
    assert_eq!(status, 200);
    let sent = stack.last_provider_request(OLLAMA).await;
    assert!(sent.get("tools").is_none(), "tool_choice none sends no tools: {sent}");
    assert_eq!(sent["format"], "json");
    assert_eq!(sent["options"]["top_k"], 20);
    assert_eq!(sent["think"], true);

    let (status, body) = json_body(request("mock-openai", json!({"logprobs": true})).await).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("logprobs")), "{body}");
}

#[tokio::test]
async fn reasoning_comes_back_in_every_apis_shape_from_both_providers() {
    let stack = Stack::start(StackOptions::default()).await;
    let thinking = "Thinking about: why";
    for model in ["mock-ollama", "mock-openai"] {
        let mut chat = chat_body(model, "why", false);
        chat["reasoning_effort"] = json!("medium");
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["message"]["reasoning_content"], thinking, "{model}: {body}");
        assert!(body["choices"][0]["message"]["content"].as_str().unwrap().starts_with("Hello from"));

        chat["stream"] = json!(true);
        let events = sse_events(stack.post("/v1/chat/completions", &chat).await).await;
        let streamed: String = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(streamed, thinking, "{model}");

        let messages = json!({"model": model, "max_tokens": 100, "thinking": {"type": "enabled", "budget_tokens": 2048},
                              "messages": [{"role": "user", "content": "why"}]});
        let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["content"][0], json!({"type": "thinking", "thinking": thinking, "signature": ""}));
        assert_eq!(body["content"][1]["type"], "text");

        let responses = json!({"model": model, "input": "why", "reasoning": {"effort": "low"}});
        let (status, body) = json_body(stack.post("/v1/responses", &responses).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["output"][0]["type"], "reasoning");
        assert_eq!(body["output"][0]["content"][0]["text"], thinking);
        assert_eq!(body["output"][1]["type"], "message");
    }
    // Without the switch, no reasoning.
    let (_, body) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "why", false)).await).await;
    assert!(body["choices"][0]["message"].get("reasoning_content").is_none(), "{body}");
}

#[tokio::test]
async fn messages_and_responses_carry_tool_choice_and_clients_can_hand_back_reasoning() {
    let stack = Stack::start(StackOptions::default()).await;
    let anthropic_tools = json!([{"name": "lookup", "input_schema": {"type": "object"}}]);
    let messages = json!({
        "model": "mock-openai", "max_tokens": 100, "top_k": 5,
        "tools": anthropic_tools, "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "ok"}]},
            {"role": "user", "content": "again"}
        ],
    });
    let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
    assert_eq!(status, 200, "{body}");
    let sent = stack.last_provider_request(OPENAI).await;
    assert_eq!(
        (&sent["tool_choice"], &sent["parallel_tool_calls"], &sent["top_k"]),
        (&json!("required"), &json!(false), &json!(5))
    );
    assert!(!sent.to_string().contains("sig"), "earlier thinking is not sent back: {sent}");

    let responses = json!({
        "model": "mock-openai", "store": false,
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"role": "user", "content": "again"}
        ],
    });
    let (status, body) = json_body(stack.post("/v1/responses", &responses).await).await;
    assert_eq!(status, 200, "{body}");
    // The response object echoes what the client asked for.
    assert_eq!((&body["tool_choice"], &body["parallel_tool_calls"]), (&json!("auto"), &json!(true)), "{body}");
    assert_eq!(body["tools"][0]["name"], "lookup", "{body}");
    let sent = stack.last_provider_request(OPENAI).await;
    assert_eq!(sent["tool_choice"], "auto");
    assert_eq!(sent["response_format"]["type"], "json_schema");
    assert!(!sent.to_string().contains("opaque"));
}

/// Images from every API reach both providers (as Ollama `images` or
/// OpenAI `image_url` parts; the mock counts them in its echo); an image URL
/// cannot reach Ollama and says so, and neither can an image reach an Ollama
/// model whose capabilities lack `vision` (the node reports them, and the
/// Edge refuses before any provider is called).
#[tokio::test]
async fn images_reach_both_providers_from_every_api() {
    let text_only = provider("text-only", iop_proto::config::Adapter::Ollama, "text-model", "mock-text", "");
    let stack = Stack::start(StackOptions { extra_providers: vec![text_only], ..Default::default() }).await;
    // A 1x1 PNG.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let data_url = format!("data:image/png;base64,{png}");
    for model in ["mock-ollama", "mock-openai"] {
        let chat = json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": data_url}},
            {"type": "image_url", "image_url": {"url": data_url, "detail": "low"}}
        ]}]});
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert!(body["choices"][0]["message"]["content"].as_str().unwrap().ends_with("[images: 2]"), "{model}: {body}");

        let messages = json!({"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
            {"type": "text", "text": "and this"}
        ]}]});
        let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert!(body["content"][0]["text"].as_str().unwrap().ends_with("[images: 1]"), "{model}: {body}");

        let responses = json!({"model": model, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "and that"}, {"type": "input_image", "image_url": data_url}
        ]}]});
        let (status, body) = json_body(stack.post("/v1/responses", &responses).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert!(body["output"][0]["content"][0]["text"].as_str().unwrap().ends_with("[images: 1]"), "{model}: {body}");
    }
    let sent = stack.last_provider_request(OLLAMA).await;
    assert_eq!(sent["messages"][0]["images"], json!([png]), "Ollama gets the image's base64");

    stack.wait_accepts_images("text-only", false).await;
    let requests_before = stack.mock_stats().await["requests_total"].clone();
    let to_text_only = json!({"model": "mock-text", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": data_url}}
    ]}]});
    let (status, body) = json_body(stack.post("/v1/chat/completions", &to_text_only).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{body}");
    assert_eq!(body["error"]["code"], "unsupported_content", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("does not accept images"), "{body}");
    assert_eq!(stack.mock_stats().await["requests_total"], requests_before, "the model was never asked");
    let text = json!({"model": "mock-text", "messages": [{"role": "user", "content": "just text"}]});
    assert_eq!(json_body(stack.post("/v1/chat/completions", &text).await).await.0, 200);

    let by_url = json!({"model": "mock-ollama", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    ]}]});
    let (status, body) = json_body(stack.post("/v1/chat/completions", &by_url).await).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("URLs"), "{body}");
    let mut to_openai = by_url.clone();
    to_openai["model"] = json!("mock-openai");
    let (status, _) = json_body(stack.post("/v1/chat/completions", &to_openai).await).await;
    assert_eq!(status, 200, "an OpenAI-compatible provider fetches URLs itself");
    assert_eq!(
        stack.last_provider_request(OPENAI).await["messages"][0]["content"][0]["image_url"]["url"],
        "https://example.com/cat.png"
    );
}

/// Documents (issue 45): Claude Code's Read of a PDF (a `document` in a
/// `tool_result`), a text document, Responses `input_file` and Chat `file`
/// reach both providers as labelled text; an unreadable PDF is a 400 naming
/// the block and the provider is never asked. With it, Claude Code's
/// `stream-json` thinking (`display: "updates"`) streams the reasoning.
#[tokio::test]
async fn documents_reach_both_providers_as_text_and_display_updates_streams_thinking() {
    use base64::Engine as _;
    let stack = Stack::start(StackOptions::default()).await;
    let pdf = base64::engine::general_purpose::STANDARD.encode(one_page_pdf("Invoice total 42 EUR"));
    let sent_text = |sent: &Value| sent["messages"].to_string();
    for (model, path) in [("mock-ollama", OLLAMA), ("mock-openai", OPENAI)] {
        let messages = json!({"model": model, "max_tokens": 50, "messages": [
            {"role": "user", "content": "read invoice.pdf"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "invoice.pdf"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}}
                ]},
                {"type": "document", "title": "notes.txt", "source": {"type": "text", "media_type": "text/plain", "data": "remember the VAT"}},
                {"type": "text", "text": "summarize"}
            ]}
        ]});
        let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        let sent = sent_text(&stack.last_provider_request(path).await);
        assert!(sent.contains("<document type=\\\"PDF\\\" pages=\\\"1\\\">\\nInvoice total 42 EUR"), "{model}: {sent}");
        assert!(
            sent.contains("<document name=\\\"notes.txt\\\" type=\\\"text\\\">\\nremember the VAT"),
            "{model}: {sent}"
        );

        let data_url = format!("data:application/pdf;base64,{pdf}");
        let responses = json!({"model": model, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "total?"}, {"type": "input_file", "filename": "invoice.pdf", "file_data": data_url}
        ]}]});
        let (status, body) = json_body(stack.post("/v1/responses", &responses).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        let sent = sent_text(&stack.last_provider_request(path).await);
        assert!(sent.contains("invoice.pdf") && sent.contains("Invoice total 42 EUR"), "{model}: {sent}");

        let chat = json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "total?"}, {"type": "file", "file": {"filename": "invoice.pdf", "file_data": data_url}}
        ]}]});
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert!(sent_text(&stack.last_provider_request(path).await).contains("Invoice total 42 EUR"), "{model}");

        // `display: "updates"` (Claude Code's stream-json): thinking deltas
        // stream as they come.
        let thinking = json!({"model": model, "max_tokens": 100, "stream": true,
            "thinking": {"type": "enabled", "budget_tokens": 2048, "display": "updates"},
            "messages": [{"role": "user", "content": "why"}]});
        let response = stack.post("/v1/messages", &thinking).await;
        assert_eq!(response.status().as_u16(), 200, "{model}");
        let text = response.text().await.unwrap();
        let streamed: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|e| e["delta"]["type"] == "thinking_delta")
            .map(|e| e["delta"]["thinking"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(streamed, "Thinking about: why", "{model}: {text}");
        let adaptive = json!({"model": model, "max_tokens": 100,
            "thinking": {"type": "adaptive", "display": "updates"}, "messages": [{"role": "user", "content": "why"}]});
        let (status, body) = json_body(stack.post("/v1/messages", &adaptive).await).await;
        assert_eq!(status, 200, "{model}: {body}");
    }

    let requests_before = stack.mock_stats().await["requests_total"].clone();
    let broken = json!({"model": "mock-ollama", "max_tokens": 50, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "read"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "bm90IGEgcGRm"}}
    ]}]});
    let (status, body) = json_body(stack.post("/v1/messages", &broken).await).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["message"], "messages.0.content.1: PDF cannot be read (malformed or truncated)", "{body}");
    assert_eq!(stack.mock_stats().await["requests_total"], requests_before, "the model was never asked");
}

/// A request too long for a route's model moves to the route's
/// larger-context fallback before the first byte; other 4xx never move.
#[tokio::test]
async fn a_context_length_error_moves_the_request_to_the_fallback_model() {
    let mut small = provider("small", iop_proto::config::Adapter::Openai, "mock@context_window=5", "mock-small", "");
    small.priority = 0;
    let large = provider("large", iop_proto::config::Adapter::Ollama, "mock", "mock-large", "");
    let strict = provider("strict", iop_proto::config::Adapter::Openai, "mock@status=400", "mock-strict", "");
    let mut tunnel = provider("tunnel", iop_proto::config::Adapter::Openai, "mock@context_window=5", "mock-tunnel", "");
    tunnel.mode = iop_proto::config::ProviderMode::Tunnel;
    let stack = Stack::start(StackOptions {
        extra_providers: vec![small, large, strict, tunnel],
        context_fallbacks: vec![
            ("mock-small", "mock-large"),
            ("mock-strict", "mock-large"),
            ("mock-tunnel", "mock-large"),
        ],
        ..Default::default()
    })
    .await;
    let short = chat_body("mock-small", "hi", false);
    let (status, body) = json_body(stack.post("/v1/chat/completions", &short).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "mock@context_window=5", "a short prompt stays on the small model");

    let long = chat_body("mock-small", "one two three four five six seven", false);
    for stream in [false, true] {
        let mut request = long.clone();
        request["stream"] = json!(stream);
        let response = stack.post("/v1/chat/completions", &request).await;
        assert_eq!(response.status(), 200, "stream={stream}");
        if stream {
            assert!(streamed_text(&sse_events(response).await).ends_with("seven"));
        } else {
            let (_, body) = json_body(response).await;
            assert!(body["choices"][0]["message"]["content"].as_str().unwrap().ends_with("seven"), "{body}");
            assert_eq!(body["model"], "mock", "the fallback's model answered");
        }
    }
    assert_eq!(stack.metric("iop_edge_attempts_total{provider=\"small\",outcome=\"context_fallback\"}").await, 2.0);
    assert_eq!(stack.last_provider_request(OLLAMA).await["model"], "mock", "the fallback's provider answered");

    // A tunnel-mode provider's relayed error is read the same way.
    let mut long_tunnel = long.clone();
    long_tunnel["model"] = json!("mock-tunnel");
    let (status, body) = json_body(stack.post("/v1/chat/completions", &long_tunnel).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "mock", "the fallback answered: {body}");

    // Any other client error is the client's, never retried elsewhere.
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-strict", "hi", false)).await).await;
    assert_eq!(status, 400);
    assert_eq!(stack.metric("iop_edge_attempts_total{provider=\"strict\",outcome=\"context_fallback\"}").await, 0.0);
}

/// `count_tokens` asks the provider's tokenizer where it has one (llama.cpp's
/// `/apply-template` + `/tokenize`: the count equals the chat's own input
/// tokens) and answers an estimate, flagged as one, where it has none
/// (Ollama), in Anthropic's shape either way.
#[tokio::test]
async fn count_tokens_is_exact_through_a_tokenizer_and_an_estimate_otherwise() {
    let stack = Stack::start(StackOptions::default()).await;
    let request = |model: &str, text: &str| {
        json!({"model": model, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
               "messages": [{"role": "user", "content": text}]})
    };
    let count = |body: Value| {
        let request = stack.client.post(stack.url("/v1/messages/count_tokens")).json_body(&body);
        async move { request.send().await.unwrap() }
    };

    // Exact: the OpenAI-compatible provider's tokenizer, asked over the
    // rendered chat template.
    let text = "count these five words please";
    let response = count(request("mock-openai", text)).await;
    assert_eq!(response.headers()["iop-token-count"], "exact");
    let (status, exact) = json_body(response).await;
    assert_eq!(status, 200, "{exact}");
    let mut chat = request("mock-openai", text);
    chat["max_tokens"] = json!(16);
    let (status, answered) = json_body(stack.post("/v1/messages", &chat).await).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(exact["input_tokens"], answered["usage"]["input_tokens"], "the count is the chat's own");
    assert_eq!(exact, json!({"input_tokens": 7}));
    let template = stack.last_provider_request("/apply-template").await;
    assert_eq!(template["messages"][1]["content"], text, "the template saw the request's messages");
    assert_eq!(template["model"], "mock");

    // Estimate: Ollama has no tokenizer; nothing is generated.
    let before = stack.mock_stats().await["requests_total"].clone();
    let response = count(request("mock-ollama", "hello there")).await;
    assert_eq!(response.headers()["iop-token-count"], "estimate");
    let (status, short) = json_body(response).await;
    assert_eq!(status, 200, "{short}");
    let (_, long) = json_body(count(request("mock-ollama", &"word ".repeat(400))).await).await;
    assert!(long["input_tokens"].as_u64().unwrap() > short["input_tokens"].as_u64().unwrap() + 400, "{long}");
    assert_eq!(stack.mock_stats().await["requests_total"], before, "counting generates nothing");

    let unknown = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    let (status, body) = json_body(count(unknown).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("not_found_error")));
}

trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json").body(serde_json::to_vec(body).unwrap())
    }
}

/// What well-known clients send (`e2e/fixtures/clients/`, written from their
/// public docs) is parsed and answered through both adapters, or refused
/// with the documented typed error where the provider cannot honour it.
#[tokio::test]
async fn real_client_request_shapes_are_answered() {
    let stack = Stack::start(StackOptions::default()).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/clients");
    let cases = [
        ("claude_code.json", "/v1/messages"),
        ("codex_cli.json", "/v1/responses"),
        ("open_webui.json", "/v1/chat/completions"),
        ("continue.json", "/v1/chat/completions"),
        ("instructor.json", "/v1/chat/completions"),
    ];
    for (file, path) in cases {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        for model in ["mock-ollama", "mock-openai"] {
            let mut body = fixture.clone();
            body["model"] = json!(model);
            let response = stack.post(path, &body).await;
            let status = response.status().as_u16();
            // Codex asks for one tool call at a time: Ollama keeps the first
            // (issue 45 item 3) and the answer says so.
            let first_kept = response.headers().get("iop-parallel-tool-calls").cloned();
            let text = response.text().await.unwrap();
            assert_eq!(status, 200, "{file} {model}: {text}");
            let codex_on_ollama = file == "codex_cli.json" && model == "mock-ollama";
            assert_eq!(first_kept.is_some(), codex_on_ollama, "{file} {model}");
            let failed = ["event: error", "response.failed", "data: {\"error\""].iter().any(|e| text.contains(e));
            assert!(!failed, "{file} {model}: {text}");
            let done = match path {
                "/v1/messages" => "event: message_stop",
                "/v1/responses" => "event: response.completed",
                _ if body["stream"] == true => "data: [DONE]",
                _ => "\"finish_reason\":\"stop\"",
            };
            assert!(text.contains(done), "{file} {model}: {text}");
        }
    }
}

/// Embeddings through the ordinary routing to both providers, in OpenAI's
/// shape (float or base64), in input order.
#[tokio::test]
async fn embeddings_come_back_from_both_providers() {
    let stack = Stack::start(StackOptions::default()).await;
    let expected: Vec<Vec<f32>> =
        ["hello world", "bye"].iter().map(|t| iop_e2e::mock_provider::embedding(t).to_vec()).collect();
    for model in ["mock-ollama", "mock-openai"] {
        let body = json!({"model": model, "input": ["hello world", "bye"]});
        let (status, answer) = json_body(stack.post("/v1/embeddings", &body).await).await;
        assert_eq!(status, 200, "{model}: {answer}");
        let got: Vec<Vec<f32>> = answer["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect();
        assert_eq!(got, expected, "{model}");
        assert_eq!(answer["object"], "list");
        assert!(answer["usage"]["prompt_tokens"].as_u64().unwrap() >= 3, "{model}: {answer}");

        let base64 = json!({"model": model, "input": "bye", "encoding_format": "base64"});
        let (status, answer) = json_body(stack.post("/v1/embeddings", &base64).await).await;
        assert_eq!(status, 200);
        assert!(answer["data"][0]["embedding"].is_string(), "{answer}");
    }
    let sized = json!({"model": "mock-openai", "input": "bye", "dimensions": 4});
    let (status, answer) = json_body(stack.post("/v1/embeddings", &sized).await).await;
    assert_eq!((status, answer["data"][0]["embedding"].as_array().map(Vec::len)), (200, Some(4)));
    assert_eq!(stack.last_provider_request("/v1/embeddings").await["dimensions"], 4);
    let sized = json!({"model": "mock-ollama", "input": "bye", "dimensions": 4});
    let (status, _) = json_body(stack.post("/v1/embeddings", &sized).await).await;
    assert_eq!(status, 400, "Ollama cannot enforce dimensions");
    let tokens = json!({"model": "mock-ollama", "input": [[1, 2, 3]]});
    let (status, body) = json_body(stack.post("/v1/embeddings", &tokens).await).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("input[0]")));
}

/// The official openai and anthropic SDKs, unmodified, exercise every
/// client-fidelity item through both adapters (`e2e/sdk/fidelity.py`).
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_sdks_exercise_every_field_through_both_adapters() {
    let small = provider("small", iop_proto::config::Adapter::Openai, "mock@context_window=5", "mock-small", "");
    let large = provider("large", iop_proto::config::Adapter::Ollama, "mock", "mock-large", "");
    let stack = Stack::start(StackOptions {
        extra_providers: vec![small, large],
        context_fallbacks: vec![("mock-small", "mock-large")],
        ..Default::default()
    })
    .await;
    run_script("fidelity.py", &[stack.url("").trim_end_matches('/')]).await;
    assert_eq!(stack.metric("iop_edge_attempts_total{provider=\"small\",outcome=\"context_fallback\"}").await, 1.0);
}

/// Issue 45 item 3: `parallel_tool_calls: false` (Chat, Responses) and
/// `disable_parallel_tool_use` (Messages) are no-ops without tools on both
/// adapters (Codex's compaction sends `tools: []` with it), and with tools
/// on Ollama the first of the provider's calls is kept, the rest dropped,
/// and `iop-parallel-tool-calls: first-kept` says so, streamed or not.
#[tokio::test]
async fn one_tool_call_at_a_time_is_a_no_op_without_tools_and_first_kept_on_ollama() {
    let script =
        "scripts:\n  two:\n    - tool_calls: [{name: lookup, arguments: {q: a}}, {name: other, arguments: {}}]\n";
    let stack = Stack::start(StackOptions { mock_script: Some(script), ..Default::default() }).await;
    let first_kept =
        |r: &reqwest::Response| r.headers().get("iop-parallel-tool-calls").map(|v| v.to_str().unwrap().to_owned());
    for model in ["mock-ollama", "mock-openai"] {
        let compaction = [
            (
                "/v1/chat/completions",
                json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                             "tools": [], "parallel_tool_calls": false}),
            ),
            (
                "/v1/responses",
                json!({"model": model, "input": "summarize", "tools": [], "parallel_tool_calls": false,
                                     "stream": true}),
            ),
            (
                "/v1/messages",
                json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
                                    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
            ),
        ];
        for (path, body) in compaction {
            let response = stack.post(path, &body).await;
            let (status, header) = (response.status().as_u16(), first_kept(&response));
            let text = response.text().await.unwrap();
            assert_eq!((status, header), (200, None), "{path} {model}: {text}");
        }
        let sent = stack.last_provider_entry(if model == "mock-ollama" { OLLAMA } else { OPENAI }).await;
        assert!(sent["body"].get("parallel_tool_calls").is_none() && sent["body"].get("tools").is_none(), "{sent}");
    }
    let two = json!([
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]);
    let chat = json!({"model": "mock-ollama", "messages": [{"role": "user", "content": "iop-mock-script:two"}],
                      "tools": two, "parallel_tool_calls": false});
    let response = stack.post("/v1/chat/completions", &chat).await;
    assert_eq!(first_kept(&response).as_deref(), Some("first-kept"));
    let (status, body) = json_body(response).await;
    assert_eq!(status, 200, "{body}");
    let calls = body["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!((calls.len(), &calls[0]["function"]["name"]), (1, &json!("lookup")), "{body}");
    // Without the option both calls come back, and no header.
    let mut both = chat.clone();
    both.as_object_mut().unwrap().remove("parallel_tool_calls");
    let response = stack.post("/v1/chat/completions", &both).await;
    assert_eq!(first_kept(&response), None);
    let (_, body) = json_body(response).await;
    assert_eq!(body["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 2, "{body}");
    // Streamed, through Messages.
    let messages = json!({"model": "mock-ollama", "max_tokens": 64, "stream": true,
        "messages": [{"role": "user", "content": "iop-mock-script:two"}],
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}, {"name": "other", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
    let response = stack.post("/v1/messages", &messages).await;
    assert_eq!(first_kept(&response).as_deref(), Some("first-kept"));
    let text = response.text().await.unwrap();
    assert_eq!(text.matches("\"type\":\"tool_use\"").count(), 1, "{text}");
    assert!(text.contains("\"name\":\"lookup\"") && !text.contains("\"name\":\"other\""), "{text}");
}

/// Issue 45 item 4: Codex under a model name it knows (the recorded
/// `codex-0.171.0-gpt-5.5.json` fixture): its `custom` apply_patch tool is a
/// function of one string to the provider, the model's call of it comes back
/// as a `custom_tool_call` with `input` (streamed and not), the hosted
/// `tool_search` and `web_search` are dropped and named, and the
/// `custom_tool_call` / `custom_tool_call_output` handed back reach the
/// provider as a call and its result; then the compaction request. Both
/// adapters.
#[tokio::test]
async fn codex_custom_tools_round_trip_through_both_adapters() {
    let script = "scripts:\n  codex-patch:\n    - tool_calls: [{name: apply_patch, arguments: {input: \"*** Begin Patch\\n*** Add File: hello.txt\\n+hello\\n*** End Patch\\n\"}}]\n";
    let stack = Stack::start(StackOptions { mock_script: Some(script), ..Default::default() }).await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../edge/src/ingress/fixtures/codex-0.171.0-gpt-5.5.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n";
    for (model, provider_path) in [("mock-ollama", OLLAMA), ("mock-openai", OPENAI)] {
        for stream in [false, true] {
            let mut first = fixture["first_turn"].clone();
            (first["model"], first["stream"]) = (json!(model), json!(stream));
            let response = stack.post("/v1/responses", &first).await;
            let dropped = response.headers().get("iop-dropped-tools").map(|v| v.to_str().unwrap().to_owned());
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            assert_eq!(status, 200, "{model} {stream}: {text}");
            assert_eq!(dropped.as_deref(), Some("tool_search, web_search"), "{model}");
            let output = if stream {
                assert!(text.contains("event: response.custom_tool_call_input.delta"), "{text}");
                assert!(text.contains("event: response.custom_tool_call_input.done"), "{text}");
                assert!(!text.contains("response.function_call_arguments"), "{text}");
                let completed =
                    text.lines().rev().find(|l| l.starts_with("data: ") && l.contains("response.completed"));
                let completed: Value = serde_json::from_str(&completed.unwrap()["data: ".len()..]).unwrap();
                completed["response"]["output"].clone()
            } else {
                serde_json::from_str::<Value>(&text).unwrap()["output"].clone()
            };
            let call = output.as_array().unwrap().iter().find(|item| item["type"] != "reasoning").unwrap();
            assert_eq!(
                (&call["type"], &call["name"], &call["input"]),
                (&json!("custom_tool_call"), &json!("apply_patch"), &json!(patch)),
                "{output}"
            );
            assert!(call["call_id"].as_str().is_some_and(|id| !id.is_empty()), "{call}");
            let sent = stack.last_provider_request(provider_path).await;
            let tool =
                sent["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "apply_patch").unwrap();
            assert_eq!(tool["function"]["parameters"]["properties"]["input"]["type"], "string", "{tool}");
            assert!(tool["function"]["description"].as_str().unwrap().contains("lark grammar"), "{tool}");
            let names: Vec<&str> =
                sent["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
            assert!(!names.iter().any(|n| n.contains("search")), "{names:?}");
        }
        let mut round_trip = fixture["tool_round_trip"].clone();
        round_trip["model"] = json!(model);
        let response = stack.post("/v1/responses", &round_trip).await;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{model}: {text}");
        let sent = stack.last_provider_request(provider_path).await;
        let messages = sent["messages"].as_array().unwrap();
        let result = &messages[messages.len() - 1];
        assert_eq!(result["role"], "tool", "{sent}");
        assert!(result["content"].as_str().unwrap().contains("A hello.txt"), "{result}");
        let call = &messages[messages.len() - 2]["tool_calls"][0];
        let arguments = match &call["function"]["arguments"] {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap(),
            other => other.clone(),
        };
        assert_eq!(call["function"]["name"], "apply_patch", "{call}");
        assert!(arguments["input"].as_str().unwrap().starts_with("*** Begin Patch"), "{call}");

        let mut compaction = fixture["compaction"].clone();
        compaction["model"] = json!(model);
        let response = stack.post("/v1/responses", &compaction).await;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{model}: {text}");
    }
}
