//! Property tests: for any run (text, tool-call pieces with any index, id
//! and arguments, usage, and any ending), what a streaming client puts
//! together from the stream equals the non-streaming answer, for all three
//! APIs; and when one fails, the other fails with the same error. Both sides
//! render from one `Transcript`, so this holds by construction; the test
//! keeps it that way.

use iop_proto::pb;
use pb::run_event::Event;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::error::ApiError;
use super::{anthropic_messages as messages, openai_chat as chat, openai_responses as responses};

fn event() -> impl Strategy<Value = Event> {
    let text = "[a-z ]{0,3}".prop_map(|text| Event::Text(pb::TextDelta { text }));
    let reasoning = "[a-z ]{0,3}".prop_map(|text| Event::Reasoning(pb::ReasoningDelta { text }));
    let piece = prop::sample::select(vec!["", "{", "}", "\"k\":", "1", "{}", "{\"k\":1}", "[1]"]);
    let tool = (0u32..3, prop::sample::select(vec!["", "a", "b"]), prop::sample::select(vec!["", "f", "g"]), piece)
        .prop_map(|(index, id, name, arguments)| {
            Event::ToolCall(pb::ToolCallDelta {
                index,
                id: id.into(),
                name: name.into(),
                arguments_delta: arguments.into(),
            })
        });
    let usage = (0u32..50, 0u32..50).prop_map(|(prompt_tokens, completion_tokens)| {
        Event::Usage(pb::Usage { prompt_tokens, completion_tokens, ..Default::default() })
    });
    prop_oneof![
        1 => Just(Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() })),
        4 => text,
        2 => reasoning,
        4 => tool,
        1 => usage,
    ]
}

fn ending() -> impl Strategy<Value = Option<Event>> {
    let reason = prop::sample::select(vec![
        pb::FinishReason::Stop,
        pb::FinishReason::Length,
        pb::FinishReason::ToolCalls,
        pb::FinishReason::ContentFilter,
    ]);
    prop_oneof![
        6 => reason.prop_map(|r| Some(Event::Completed(pb::RunCompleted { finish_reason: r.into() }))),
        1 => Just(Some(Event::Failed(pb::RunFailed {
            failure: Some(pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "stalled")),
        }))),
        1 => Just(Some(Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::Deadline.into() }))),
        1 => Just(None),
    ]
}

fn run() -> impl Strategy<Value = Vec<Event>> {
    (prop::collection::vec(event(), 0..12), ending()).prop_map(|(mut events, end)| {
        events.extend(end);
        events
    })
}

/// What a client can compare: the answer, or the error code it got
/// (`None`: the stream just ended without an answer).
type Outcome = Result<Value, Option<String>>;

/// Removes what is made up per response (ids, timestamps, sequence numbers).
fn strip(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in ["id", "call_id", "item_id", "created", "created_at", "sequence_number"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

fn whole(result: Result<Value, ApiError>, code: impl Fn(&ApiError) -> String) -> Outcome {
    match result {
        Ok(mut value) => {
            strip(&mut value);
            Ok(value)
        }
        Err(e) => Err(Some(code(&e))),
    }
}

/// Both failed (the stream may also just end: a cancel shows nothing), or
/// both answered the same.
fn agree(streamed: &Outcome, whole: &Outcome) -> bool {
    match (streamed, whole) {
        (Ok(a), Ok(b)) => a == b,
        (Err(None), Err(_)) => true,
        (Err(Some(a)), Err(Some(b))) => a == b,
        _ => false,
    }
}

// ------------------------------------------------------------ Chat

fn chat_streamed(events: &[Event]) -> Outcome {
    let mut renderer = chat::ChunkRenderer::new(chat::ResponseMeta::new("m".into(), 1), true);
    let (mut content, mut calls, mut finish, mut usage) = (String::new(), Vec::<(String, String)>::new(), None, None);
    let mut reasoning = String::new();
    for payload in events.iter().flat_map(|e| renderer.render(e)) {
        let chunk: Value = serde_json::from_str(&payload).unwrap();
        if let Some(error) = chunk.get("error") {
            return Err(Some(error["code"].as_str().unwrap().to_string()));
        }
        let Some(choice) = chunk["choices"].get(0) else {
            usage = Some(chunk["usage"].clone());
            continue;
        };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        reasoning.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                calls.push((call["function"]["name"].as_str().unwrap().to_string(), String::new()));
            }
            calls[index].1.push_str(call["function"]["arguments"].as_str().unwrap());
        }
        if !choice["finish_reason"].is_null() {
            finish = Some(choice["finish_reason"].clone());
        }
    }
    let finish = finish.ok_or(None)?;
    let tool_calls: Vec<Value> =
        calls.iter().map(|(name, arguments)| json!({"name": name, "arguments": arguments})).collect();
    Ok(
        json!({"content": content, "reasoning": reasoning, "tool_calls": tool_calls, "finish_reason": finish, "usage": usage}),
    )
}

fn chat_whole(events: &[Event]) -> Outcome {
    let mut aggregator = chat::CompletionAggregator::new(chat::ResponseMeta::new("m".into(), 1));
    events.iter().for_each(|e| aggregator.push(e));
    let body = whole(aggregator.finish(), |e| e.code().to_string())?;
    let message = &body["choices"][0]["message"];
    let tool_calls: Vec<Value> = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
        .collect();
    Ok(json!({
        "content": message["content"].as_str().unwrap_or(""),
        "reasoning": message["reasoning_content"].as_str().unwrap_or(""),
        "tool_calls": tool_calls,
        "finish_reason": body["choices"][0]["finish_reason"],
        "usage": body["usage"],
    }))
}

// ------------------------------------------------------------ Anthropic

fn messages_streamed(events: &[Event]) -> Outcome {
    let mut renderer = messages::EventRenderer::new(messages::ResponseMeta::new("m".into()));
    let mut content: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let (mut stop_reason, mut usage) = (None, None);
    for (name, data) in events.iter().flat_map(|e| renderer.render(e)) {
        let data: Value = serde_json::from_str(&data).unwrap();
        match name {
            "error" => return Err(Some(data["error"].to_string())),
            "content_block_start" => {
                let mut block = data["content_block"].clone();
                strip(&mut block);
                content.push(block);
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = data["index"].as_u64().unwrap() as usize;
                match data["delta"]["type"].as_str() {
                    Some("text_delta") => {
                        let text = format!(
                            "{}{}",
                            content[i]["text"].as_str().unwrap(),
                            data["delta"]["text"].as_str().unwrap()
                        );
                        content[i]["text"] = text.into();
                    }
                    Some("thinking_delta") => {
                        let thinking = content[i]["thinking"].as_str().unwrap().to_string();
                        content[i]["thinking"] = (thinking + data["delta"]["thinking"].as_str().unwrap()).into();
                    }
                    _ => partial[i].push_str(data["delta"]["partial_json"].as_str().unwrap()),
                }
            }
            "content_block_stop" => {
                let i = data["index"].as_u64().unwrap() as usize;
                if content[i]["type"] == "tool_use" && !partial[i].is_empty() {
                    content[i]["input"] = serde_json::from_str(&partial[i]).unwrap();
                }
            }
            "message_delta" => {
                stop_reason = Some(data["delta"]["stop_reason"].clone());
                usage = Some(data["usage"].clone());
            }
            _ => {}
        }
    }
    let stop_reason = stop_reason.ok_or(None)?;
    Ok(json!({"content": content, "stop_reason": stop_reason, "usage": usage}))
}

fn messages_whole(events: &[Event]) -> Outcome {
    let mut aggregator = messages::MessageAggregator::new(messages::ResponseMeta::new("m".into()));
    events.iter().for_each(|e| aggregator.push(e));
    let body = whole(aggregator.finish(), |e| e.anthropic_body()["error"].to_string())?;
    Ok(json!({"content": body["content"], "stop_reason": body["stop_reason"], "usage": body["usage"]}))
}

// ------------------------------------------------------------ Responses

fn responses_meta() -> responses::ResponseMeta {
    responses::ResponseMeta::new("m".into(), 1, None, None)
}

fn responses_streamed(events: &[Event]) -> Outcome {
    let mut renderer = responses::EventRenderer::new(responses_meta());
    // What the deltas add up to, by output index.
    let mut deltas: Vec<String> = Vec::new();
    for (name, data) in events.iter().flat_map(|e| renderer.render(e)) {
        let data: Value = serde_json::from_str(&data).unwrap();
        match name {
            "response.output_item.added" => deltas.push(String::new()),
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta" => {
                let i = data["output_index"].as_u64().unwrap() as usize;
                deltas[i].push_str(data["delta"].as_str().unwrap());
            }
            "response.failed" => return Err(Some(data["response"]["error"]["code"].as_str().unwrap().to_string())),
            "response.completed" | "response.incomplete" => {
                let mut response = data["response"].clone();
                // The final object repeats exactly what the deltas said.
                for (i, item) in response["output"].as_array().unwrap().iter().enumerate() {
                    let said = item["arguments"].as_str().or(item["content"][0]["text"].as_str()).unwrap();
                    assert_eq!(said, deltas[i], "output {i}: {response}");
                }
                strip(&mut response);
                return Ok(response);
            }
            _ => {}
        }
    }
    Err(None)
}

fn responses_whole(events: &[Event]) -> Outcome {
    let mut aggregator = responses::ResponseAggregator::new(responses_meta());
    events.iter().for_each(|e| aggregator.push(e));
    whole(aggregator.finish(), |e| e.code().to_string())
}

proptest! {
    #[test]
    fn fuzz_chat_streamed_and_whole_answers_agree(events in run()) {
        let (streamed, whole) = (chat_streamed(&events), chat_whole(&events));
        prop_assert!(agree(&streamed, &whole), "{events:?}\nstreamed: {streamed:?}\nwhole: {whole:?}");
    }

    #[test]
    fn fuzz_messages_streamed_and_whole_answers_agree(events in run()) {
        let (streamed, whole) = (messages_streamed(&events), messages_whole(&events));
        prop_assert!(agree(&streamed, &whole), "{events:?}\nstreamed: {streamed:?}\nwhole: {whole:?}");
    }

    #[test]
    fn fuzz_responses_streamed_and_whole_answers_agree(events in run()) {
        let (streamed, whole) = (responses_streamed(&events), responses_whole(&events));
        prop_assert!(agree(&streamed, &whole), "{events:?}\nstreamed: {streamed:?}\nwhole: {whole:?}");
    }
}
