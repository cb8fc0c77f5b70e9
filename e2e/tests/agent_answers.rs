//! What coding agents read in an answer (issue 27 item 4), through a real
//! Edge, node and mock provider on both adapters: a truncated Responses
//! answer marks its message `incomplete`; `reasoning.summary` turns the
//! provider's reasoning into a summary (Codex CLI's request shape);
//! Anthropic streams carry the input token count.

mod common;

use common::*;
use serde_json::{Value, json};

/// The `data:` payloads of a Responses or Messages stream, as JSON.
async fn typed_events(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let data = |event: &str| event.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string);
    text.split("\n\n").filter_map(data).map(|d| serde_json::from_str(&d).unwrap()).collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[tokio::test]
async fn truncated_responses_mark_the_message_incomplete_on_both_adapters() {
    let stack = Stack::start(StackOptions::default()).await;
    for model in ["mock-ollama", "mock-openai"] {
        let request = json!({"model": model, "input": "hi", "max_output_tokens": 2});
        let (status, body) = json_body(stack.post("/v1/responses", &request).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(
            (body["status"].as_str(), body["output"][0]["status"].as_str()),
            (Some("incomplete"), Some("incomplete"))
        );
        assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(body["output"][0]["content"][0]["text"], "Hello from", "{model}");

        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let events = typed_events(stack.post("/v1/responses", &streamed).await).await;
        let done = of_type(&events, "response.output_item.done");
        assert_eq!(done.len(), 1, "{model}");
        assert_eq!(done[0]["item"]["status"], "incomplete", "{model}");
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.incomplete", "{model}");
        assert_eq!(last["response"]["output"][0]["status"], "incomplete", "{model}");

        // Not cut: completed.
        let (_, body) = json_body(stack.post("/v1/responses", &json!({"model": model, "input": "hi"})).await).await;
        assert_eq!(
            (body["status"].as_str(), body["output"][0]["status"].as_str()),
            (Some("completed"), Some("completed"))
        );
    }
}

#[tokio::test]
async fn codex_reasoning_summary_comes_back_as_a_summary_on_both_adapters() {
    let stack = Stack::start(StackOptions::default()).await;
    let thinking = "Thinking about: why";
    for model in ["mock-ollama", "mock-openai"] {
        // Codex CLI sends these on every request.
        let request = json!({"model": model, "input": "why", "store": false,
            "reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"]});
        let (status, body) = json_body(stack.post("/v1/responses", &request).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        let item = &body["output"][0];
        assert_eq!(item["type"], "reasoning", "{model}: {body}");
        assert_eq!(item["summary"], json!([{"type": "summary_text", "text": thinking}]), "{model}");
        assert!(item.get("content").is_none() && item.get("encrypted_content").is_none(), "{item}");

        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let events = typed_events(stack.post("/v1/responses", &streamed).await).await;
        assert_eq!(of_type(&events, "response.reasoning_summary_part.added").len(), 1, "{model}");
        let deltas: String = of_type(&events, "response.reasoning_summary_text.delta")
            .iter()
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, thinking, "{model}");
        assert_eq!(of_type(&events, "response.reasoning_summary_text.done")[0]["text"], thinking);
        assert_eq!(of_type(&events, "response.reasoning_summary_part.done")[0]["part"]["text"], thinking);
        assert!(of_type(&events, "response.reasoning_text.delta").is_empty(), "{model}");

        // Without `summary`: the raw text as content, as before.
        let plain = json!({"model": model, "input": "why", "reasoning": {"effort": "low"}});
        let (_, body) = json_body(stack.post("/v1/responses", &plain).await).await;
        assert_eq!(
            (&body["output"][0]["summary"], &body["output"][0]["content"][0]["text"]),
            (&json!([]), &json!(thinking))
        );
    }
}

/// Both adapters report usage with the last chunk, so `message_start`
/// carries 0 input tokens and `message_delta` the count (as the
/// non-streaming body does).
#[tokio::test]
async fn anthropic_streams_carry_the_input_tokens_in_message_delta() {
    let stack = Stack::start(StackOptions::default()).await;
    for model in ["mock-ollama", "mock-openai"] {
        let request =
            json!({"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "one two three"}]});
        let (_, whole) = json_body(stack.post("/v1/messages", &request).await).await;
        let input = whole["usage"]["input_tokens"].as_u64().unwrap();
        assert!(input > 0, "{whole}");
        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let events = typed_events(stack.post("/v1/messages", &streamed).await).await;
        assert_eq!(events[0]["type"], "message_start", "{model}");
        assert_eq!(events[0]["message"]["usage"]["input_tokens"], 0, "{model}");
        let delta = of_type(&events, "message_delta");
        assert_eq!(delta[0]["usage"], whole["usage"], "{model}");
    }
}
