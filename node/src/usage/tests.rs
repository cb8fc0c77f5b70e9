use super::*;

fn read(content_type: &str, chunks: &[&str]) -> Option<(u32, u32, u32)> {
    let mut reader = TunnelUsage::new(Some(content_type));
    for chunk in chunks {
        reader.push(chunk.as_bytes());
    }
    reader.finish().map(|u| (u.prompt_tokens, u.completion_tokens, u.reasoning_tokens))
}

#[test]
fn reads_each_apis_usage_from_a_json_body() {
    let chat = r#"{"id":"c","choices":[{"message":{"content":"the word usage"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"completion_tokens_details":{"reasoning_tokens":3}}}"#;
    assert_eq!(read("application/json", &[&chat[..20], &chat[20..]]), Some((11, 7, 3)));
    let responses = r#"{"object":"response","output":[],"usage":{"input_tokens":5,"output_tokens":9,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":14}}"#;
    assert_eq!(read("application/json; charset=utf-8", &[responses]), Some((5, 9, 4)));
    let messages = r#"{"type":"message","content":[],"usage":{"input_tokens":12,"output_tokens":2}}"#;
    assert_eq!(read("application/json", &[messages]), Some((12, 2, 0)));
    assert_eq!(read("application/json", &[r#"{"choices":[]}"#]), None);
    assert_eq!(read("application/json", &[r#"{"usage": "not an object"}"#]), None);
    assert_eq!(read("application/json", &[r#"{"usage":{"prompt_tokens":1"#]), None, "cut short");
}

#[test]
fn reads_the_last_counts_of_a_stream() {
    // OpenAI: usage in the last chunk only, split across reads.
    let chat = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,",
        "\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
    ];
    assert_eq!(read("text/event-stream", &chat), Some((4, 2, 0)));
    // Anthropic: input in message_start, the running output in message_delta.
    let messages = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
    ];
    assert_eq!(read("text/event-stream", &messages), Some((20, 15, 0)));
    // Responses: in response.completed; a stream without a final newline.
    let responses = "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":6,\"output_tokens_details\":{\"reasoning_tokens\":2}}}}";
    assert_eq!(read("text/event-stream", &[responses]), Some((3, 6, 2)));
    assert_eq!(read("text/event-stream", &["data: {\"choices\":[]}\n\n"]), None);
}

/// A body or line over the bound is skipped, not kept: memory stays
/// bounded and the next line is still read.
#[test]
fn holds_at_most_the_bound() {
    let big = format!("data: {{\"pad\":\"{}\",\"usage\":{{\"prompt_tokens\":9}}}}\n", "x".repeat(MAX_KEPT));
    let after = "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n";
    assert_eq!(read("text/event-stream", &[&big, after]), Some((1, 1, 0)));
    let mut reader = TunnelUsage::new(Some("application/json"));
    reader.push(big.as_bytes());
    assert!(reader.kept.is_empty() && reader.overflowed);
    assert_eq!(reader.finish(), None);
}

#[test]
fn a_run_the_provider_did_not_count_is_charged_its_deltas_and_its_estimate() {
    use pb::run_event::Event;
    let mut meter = RunMeter::default();
    for event in [
        Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() }),
        Event::Text(pb::TextDelta { text: "one".into() }),
        Event::Text(pb::TextDelta { text: String::new() }),
        Event::Reasoning(pb::ReasoningDelta { text: "hmm".into() }),
        Event::ToolCall(pb::ToolCallDelta { index: 0, name: "f".into(), ..Default::default() }),
        Event::ToolCall(pb::ToolCallDelta { index: 0, arguments_delta: "{}".into(), ..Default::default() }),
    ] {
        meter.observe(&event);
    }
    let usage = meter.unreported(40, true).unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (40, 4), "empty deltas count nothing");
    assert_eq!((usage.input_source(), usage.output_source()), (pb::UsageSource::Estimated, pb::UsageSource::Counted));
    // The provider never had the prompt: only what it generated.
    assert_eq!(meter.unreported(40, false).unwrap().prompt_tokens, 0);
    // Nothing at all: nothing to send.
    assert_eq!(RunMeter::default().unreported(40, false), None);
    // The provider's own report stands (it was sent as it came).
    meter.observe(&Event::Usage(pb::Usage::provider(9, 3, 0)));
    assert_eq!(meter.unreported(40, true), None);
}

#[test]
fn a_tunnel_stream_counts_its_deltas() {
    let mut reader = TunnelUsage::new(Some("text/event-stream"));
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"con",
        "tent\":\"b\"}}]}\n\n: keepalive\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"c\"}}\n\n",
        "data: [DONE]\n\n",
    ];
    for chunk in chunks {
        reader.push(chunk.as_bytes());
    }
    assert_eq!((reader.deltas(), reader.finish()), (3, None));
}

#[test]
fn the_usage_chunk_the_edge_asked_for_is_left_out() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\r\n\r\n",
        "data: [DONE]\n\n",
    );
    let want = concat!("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n", "data: [DONE]\n\n");
    // However the network cuts it.
    for cut in 0..stream.len() {
        let mut filter = UsageChunkFilter::default();
        let mut out = filter.push(&stream.as_bytes()[..cut]);
        out.extend(filter.push(&stream.as_bytes()[cut..]));
        out.extend(filter.finish());
        assert_eq!(String::from_utf8(out).unwrap(), want, "cut at {cut}");
    }
    // A last line without its end passes at the finish.
    let mut filter = UsageChunkFilter::default();
    assert!(filter.push(b"data: [DONE]").is_empty());
    assert_eq!(filter.finish(), b"data: [DONE]");
}

#[test]
fn a_long_line_passes_unread() {
    let mut filter = UsageChunkFilter::default();
    let long = vec![b'x'; MAX_KEPT + 1];
    assert_eq!(filter.push(&long).len(), long.len(), "past the bound it passes at once");
    assert_eq!(filter.push(b"yy\ndata: z\n"), b"yy\ndata: z\n");
}
