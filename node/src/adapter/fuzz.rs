//! Property tests for the readers of provider bytes: the line splitter
//! (NDJSON and SSE lines), the SSE field parser and the Ollama and OpenAI
//! stream decoders behind them. Whatever a provider sends, cut into network
//! chunks anywhere, nothing panics, the line cap is a typed error, and the
//! same bytes give the same lines, events and outcome however they are cut.
//!
//! Each property runs proptest's default 256 cases; more with
//! `PROPTEST_CASES=100000 cargo nextest run -p iop-node --profile fuzz fuzz`.

use iop_proto::pb;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

use super::events::Events;
use super::lines::LineSplitter;
use super::sse::SseParser;
use super::stream::{StreamDecoder, StreamReader};
use super::{AdapterError, ollama, openai};

// ------------------------------------------------------------ helpers

/// `bytes` cut at the (sorted, deduplicated) positions `cuts` picks.
fn chunks<'a>(bytes: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in at {
        out.push(&bytes[start..cut]);
        start = cut;
    }
    out.push(&bytes[start..]);
    out
}

fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..12)
}

/// Everything a reader gave before it stopped, and how it stopped: `Err` is
/// the failure as it would go on the wire (kind and message).
type Outcome<T> = (Vec<T>, Result<(), pb::ExecutionFailure>);

/// Lines of `chunks` through a splitter capped at `max_line`, then its end.
fn split_lines(chunks: &[&[u8]], max_line: usize) -> Outcome<String> {
    let mut splitter = LineSplitter::with_max_line(max_line);
    let mut lines = Vec::new();
    let mut run = || -> Result<(), AdapterError> {
        for chunk in chunks {
            splitter.push(chunk);
            while let Some(line) = splitter.next_line()? {
                lines.push(line);
            }
        }
        lines.extend(splitter.finish()?);
        Ok(())
    };
    let result = run().map_err(|e| e.to_failure());
    (lines, result)
}

/// SSE event data of `chunks`, through the splitter and the field parser.
fn sse_events(chunks: &[&[u8]]) -> Outcome<String> {
    let mut splitter = LineSplitter::new();
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut run = || -> Result<(), AdapterError> {
        let mut feed = |line: String, events: &mut Vec<String>| -> Result<(), AdapterError> {
            events.extend(parser.line(&line)?);
            Ok(())
        };
        for chunk in chunks {
            splitter.push(chunk);
            while let Some(line) = splitter.next_line()? {
                feed(line, &mut events)?;
            }
        }
        if let Some(line) = splitter.finish()? {
            feed(line, &mut events)?;
        }
        events.extend(parser.finish());
        Ok(())
    };
    let result = run().map_err(|e| e.to_failure());
    (events, result)
}

/// What a provider stream decodes to, as `drive` would run it: the events
/// and the finish reason or the failure.
type Decoded = (Events, Result<pb::FinishReason, pb::ExecutionFailure>);
type DecodeFn = fn(&[&[u8]], usize) -> Decoded;

fn decode<D: StreamDecoder>(decoder: D, chunks: &[&[u8]], max_line: usize) -> Decoded {
    let mut reader = StreamReader { lines: LineSplitter::with_max_line(max_line), decoder };
    let mut out = Events::new();
    for chunk in chunks {
        match reader.chunk(chunk, &mut out) {
            Ok(None) => {}
            Ok(Some(reason)) => return (out, Ok(reason)),
            Err(e) => return (out, Err(e.to_failure())),
        }
    }
    let end = reader.end(&mut out).map_err(|e| e.to_failure());
    (out, end)
}

fn decode_ollama(chunks: &[&[u8]], max_line: usize) -> Decoded {
    decode(ollama::Decoder::new("fallback", "run-1"), chunks, max_line)
}

fn decode_openai(chunks: &[&[u8]], max_line: usize) -> Decoded {
    decode(openai::Decoder::new("fallback"), chunks, max_line)
}

// ------------------------------------------------------------ strategies

/// Bytes that make lines interesting: terminators, a lone `\r`, invalid
/// UTF-8 and multi-byte characters (whose bytes a cut can separate).
fn line_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        3 => prop::collection::vec(b'a'..=b'e', 1..6),
        2 => Just(b"\n".to_vec()),
        1 => Just(b"\r\n".to_vec()),
        1 => Just(b"\r".to_vec()),
        1 => Just("\u{e9}\u{1f600}".as_bytes().to_vec()),
        1 => Just(vec![0xff]),
        1 => Just(vec![0xe2, 0x82]),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// Text for event data and JSON strings: anything but line terminators.
fn data_text() -> impl Strategy<Value = String> {
    // Mapped, not filtered: a filter's rejects add up past proptest's
    // limit in long fuzz runs (`PROPTEST_CASES=50000`).
    let no_terminator = |c: char| if c == '\n' || c == '\r' { ' ' } else { c };
    prop::collection::vec(any::<char>().prop_map(no_terminator), 0..10).prop_map(String::from_iter)
}

/// One SSE event: its data lines, and how each line is written.
#[derive(Debug, Clone)]
struct SseEvent {
    data: Vec<(String, u8)>,
    /// Lines without data put before, between and after the data lines.
    noise: Vec<(Index, u8)>,
    end: &'static str,
}

fn sse_event() -> impl Strategy<Value = SseEvent> {
    (
        prop::collection::vec((data_text(), any::<u8>()), 1..4),
        prop::collection::vec((any::<Index>(), any::<u8>()), 0..3),
        terminator(),
    )
        .prop_map(|(data, noise, end)| SseEvent { data, noise, end })
}

/// The event's text (ending with the blank line unless `last_unterminated`)
/// and the data it must dispatch.
fn render_sse(event: &SseEvent, last_unterminated: bool) -> (String, String) {
    let mut lines: Vec<String> = event
        .data
        .iter()
        .map(|(value, style)| match style % 3 {
            // Exactly one space after the colon is part of the syntax.
            1 if !value.starts_with(' ') => format!("data:{value}"),
            2 if value.is_empty() => "data".to_string(),
            _ => format!("data: {value}"),
        })
        .collect();
    for (at, kind) in &event.noise {
        let noise = match kind % 5 {
            0 => ": keep-alive".to_string(),
            1 => "event: message".to_string(),
            2 => "id: 7".to_string(),
            3 => "retry: 1000".to_string(),
            _ => "x-unknown-field: data: no".to_string(),
        };
        lines.insert(at.index(lines.len() + 1), noise);
    }
    let end = event.end;
    let mut text: String = lines.iter().map(|l| format!("{l}{end}")).collect();
    if !last_unterminated {
        text.push_str(end);
    }
    let data = event.data.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>().join("\n");
    (text, data)
}

/// Lines an Ollama stream may carry, valid or not.
fn ollama_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => data_text().prop_map(|t| json!({"model": "m", "message": {"role": "assistant", "content": t}, "done": false}).to_string()),
        1 => data_text().prop_map(|name| json!({"message": {"tool_calls": [{"function": {"name": name, "arguments": {"a": 1}}}]}, "done": false}).to_string()),
        1 => prop::sample::select(vec!["stop", "length", "unload"]).prop_map(|r| json!({"done": true, "done_reason": r, "prompt_eval_count": 3, "eval_count": 5}).to_string()),
        1 => Just(json!({"error": "model not found"}).to_string()),
        1 => Just(String::new()),
        1 => Just("   ".to_string()),
        1 => data_text(),
        1 => Just(r#"{"message":{"content":"cut"#.to_string()),
    ]
}

/// Lines an OpenAI-compatible SSE stream may carry, valid or not.
fn openai_line() -> impl Strategy<Value = String> {
    let chunk = |v: Value| format!("data: {v}");
    prop_oneof![
        4 => data_text().prop_map(move |t| chunk(json!({"model": "m", "choices": [{"delta": {"content": t}}]}))),
        1 => (any::<u32>(), data_text()).prop_map(move |(i, a)| chunk(json!({"choices": [{"delta": {"tool_calls": [{"index": i % 4, "id": "c", "function": {"name": "f", "arguments": a}}]}}]}))),
        1 => prop::sample::select(vec!["stop", "length", "tool_calls", "content_filter", "other"]).prop_map(move |r| chunk(json!({"choices": [{"delta": {}, "finish_reason": r}]}))),
        1 => Just(chunk(json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}))),
        1 => Just(chunk(json!({"error": {"message": "overloaded"}}))),
        2 => Just(String::new()),
        1 => Just("data: [DONE]".to_string()),
        1 => Just(": keep-alive".to_string()),
        1 => Just("event: ping".to_string()),
        1 => data_text().prop_map(|t| format!("data: {t}")),
        1 => Just(r#"data: {"choices":[{"delta":{"content":"cut"#.to_string()),
    ]
}

/// The three line terminators SSE allows (NDJSON uses the first two).
fn terminator() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]
}

fn join_lines(lines: &[String], end: &str) -> Vec<u8> {
    lines.iter().map(|l| format!("{l}{end}")).collect::<String>().into_bytes()
}

/// Caps small enough that generated lines cross them, or the real one.
fn max_line() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(16 * 1024 * 1024), 1 => 1usize..48]
}

proptest! {
    /// Lines do not depend on where the chunks were cut, and are the input
    /// split at `\r\n`, `\n` or a lone `\r`, up to the first line that is
    /// over the cap (a typed error) or not UTF-8 (a protocol error).
    #[test]
    fn fuzz_lines_are_independent_of_chunking(bytes in line_bytes(), cuts in cuts(), max_line in max_line()) {
        let whole = split_lines(&[&bytes], max_line);
        let cut = split_lines(&chunks(&bytes, &cuts), max_line);
        prop_assert_eq!(&cut, &whole);

        // The model: split, stop at the first bad line. (The cap's
        // failure kind is whatever the splitter reports for an over-long line.)
        let too_long = {
            let mut s = LineSplitter::with_max_line(0);
            s.push(b"x");
            s.next_line().expect_err("over the cap").to_failure().kind()
        };
        let mut pieces: Vec<&[u8]> = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < bytes.len() {
            if bytes[i] == b'\n' || bytes[i] == b'\r' {
                pieces.push(&bytes[start..i]);
                i += if bytes[i..].starts_with(b"\r\n") { 2 } else { 1 };
                start = i;
            } else {
                i += 1;
            }
        }
        if start < bytes.len() {
            pieces.push(&bytes[start..]);
        }
        let mut expected = Vec::new();
        let mut failure = None;
        for piece in pieces {
            if piece.len() > max_line {
                failure = Some(too_long);
                break;
            }
            match std::str::from_utf8(piece) {
                Ok(line) => expected.push(line.to_string()),
                Err(_) => {
                    failure = Some(pb::FailureKind::ProviderProtocol);
                    break;
                }
            }
        }
        prop_assert_eq!(&whole.0, &expected);
        prop_assert_eq!(whole.1.as_ref().err().map(|f| f.kind()), failure);
        prop_assert!(whole.0.iter().all(|l| l.len() <= max_line && !l.contains(['\n', '\r'])));
    }

    /// SSE: generated events, with comments and other fields around their
    /// data lines, LF, CRLF or CR, cut anywhere, dispatch exactly their data.
    #[test]
    fn fuzz_sse_events_round_trip(events in prop::collection::vec(sse_event(), 0..5), unterminated in any::<bool>(), cuts in cuts()) {
        let mut text = String::new();
        let mut expected = Vec::new();
        for (i, event) in events.iter().enumerate() {
            let (t, data) = render_sse(event, unterminated && i + 1 == events.len());
            text.push_str(&t);
            expected.push(data);
        }
        let (got, result) = sse_events(&chunks(text.as_bytes(), &cuts));
        prop_assert!(result.is_ok(), "{:?}", result);
        prop_assert_eq!(got, expected);
    }

    /// SSE over arbitrary bytes: no panic, and the same events however cut.
    #[test]
    fn fuzz_sse_is_independent_of_chunking(bytes in line_bytes(), data in prop::collection::vec(data_text(), 0..4), cuts in cuts()) {
        let mut bytes = bytes;
        for d in data {
            bytes.extend_from_slice(format!("data: {d}\n").as_bytes());
        }
        prop_assert_eq!(sse_events(&chunks(&bytes, &cuts)), sse_events(&[&bytes]));
    }

    /// Ollama NDJSON: any mix of valid, broken and foreign lines, cut
    /// anywhere, decodes to the same events and the same end.
    #[test]
    fn fuzz_ollama_decoder_is_independent_of_chunking(
        lines in prop::collection::vec(ollama_line(), 0..8),
        end in terminator(),
        cuts in cuts(),
        max_line in max_line(),
    ) {
        let bytes = join_lines(&lines, end);
        prop_assert_eq!(decode_ollama(&chunks(&bytes, &cuts), max_line), decode_ollama(&[&bytes], max_line));
    }

    #[test]
    fn fuzz_openai_decoder_is_independent_of_chunking(
        lines in prop::collection::vec(openai_line(), 0..10),
        end in terminator(),
        cuts in cuts(),
        max_line in max_line(),
    ) {
        let bytes = join_lines(&lines, end);
        prop_assert_eq!(decode_openai(&chunks(&bytes, &cuts), max_line), decode_openai(&[&bytes], max_line));
    }

    /// Arbitrary bytes into both decoders: no panic, chunking does not
    /// matter, and a failure is the provider's fault (protocol), never ours.
    #[test]
    fn fuzz_decoders_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256), cuts in cuts()) {
        let decoders: [DecodeFn; 2] = [decode_ollama, decode_openai];
        for decode in decoders {
            let whole = decode(&[&bytes], 1024);
            prop_assert_eq!(&decode(&chunks(&bytes, &cuts), 1024), &whole);
            if let Err(f) = &whole.1 {
                prop_assert_eq!(f.kind(), pb::FailureKind::ProviderProtocol, "{:?}", f);
            }
        }
    }

    /// A well-formed answer of text pieces, in either provider's format and
    /// cut anywhere, decodes to exactly those pieces, the usage and the finish reason.
    #[test]
    fn fuzz_decoders_keep_a_valid_answer(
        pieces in prop::collection::vec(data_text(), 0..6),
        length in any::<bool>(),
        usage in (0..1000u64, 0..1000u64),
        cuts in cuts(),
    ) {
        let reason = if length { "length" } else { "stop" };
        let mut expected = vec![pb::run_event::Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() })];
        expected.extend(pieces.iter().filter(|p| !p.is_empty()).map(|p| super::events::text(p)));
        expected.push(super::events::usage(usage.0, usage.1));
        let finish = if length { pb::FinishReason::Length } else { pb::FinishReason::Stop };

        let mut ndjson: Vec<String> = pieces
            .iter()
            .map(|p| json!({"model": "m", "message": {"role": "assistant", "content": p}, "done": false}).to_string())
            .collect();
        if ndjson.is_empty() {
            ndjson.push(json!({"model": "m", "message": {"content": ""}, "done": false}).to_string());
        }
        ndjson.push(json!({"model": "m", "done": true, "done_reason": reason, "prompt_eval_count": usage.0, "eval_count": usage.1}).to_string());
        let bytes = join_lines(&ndjson, "\n");
        prop_assert_eq!(decode_ollama(&chunks(&bytes, &cuts), 16 * 1024 * 1024), (expected.clone(), Ok(finish)));

        let mut sse: Vec<String> = vec![format!("data: {}", json!({"model": "m", "choices": [{"delta": {"role": "assistant"}}]})), String::new()];
        for p in &pieces {
            sse.push(format!("data: {}", json!({"model": "m", "choices": [{"delta": {"content": p}}]})));
            sse.push(String::new());
        }
        sse.push(format!("data: {}", json!({"model": "m", "choices": [{"delta": {}, "finish_reason": reason}]})));
        sse.push(String::new());
        sse.push(format!("data: {}", json!({"model": "m", "choices": [], "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1}})));
        sse.push(String::new());
        sse.push("data: [DONE]".into());
        sse.push(String::new());
        let bytes = join_lines(&sse, "\r\n");
        prop_assert_eq!(decode_openai(&chunks(&bytes, &cuts), 16 * 1024 * 1024), (expected, Ok(finish)));
    }

    /// Issue 27 item 3: the answer to a forced tool choice, a JSON object
    /// whose text the model streams in pieces cut anywhere (inside strings
    /// and escapes too), arrives as exactly one tool call with the compact
    /// arguments, never as text; mixed with any other lines it decodes the
    /// same however the bytes are cut.
    #[test]
    fn fuzz_forced_tool_answer_is_one_call_however_streamed(
        arguments in prop::collection::btree_map("[a-z]{1,4}", data_text(), 0..4),
        pretty in any::<bool>(),
        splits in prop::collection::vec(any::<Index>(), 0..6),
        noise in prop::collection::vec(ollama_line(), 0..6),
        cuts in cuts(),
    ) {
        let forced = || ollama::Decoder::new("fallback", "run-1").forcing(Some(super::forced_tool::ForcedTool::Named("f".into())));
        let value = serde_json::to_value(&arguments).unwrap();
        let text = if pretty { serde_json::to_string_pretty(&value).unwrap() } else { value.to_string() };
        let chars: Vec<char> = text.chars().collect();
        let mut at: Vec<usize> = splits.iter().map(|i| i.index(chars.len() + 1)).collect();
        at.extend([0, chars.len()]);
        at.sort_unstable();
        at.dedup();
        let mut ndjson: Vec<String> = at
            .windows(2)
            .map(|w| chars[w[0]..w[1]].iter().collect::<String>())
            .map(|p| json!({"model": "m", "message": {"role": "assistant", "content": p}, "done": false}).to_string())
            .collect();
        ndjson.push(json!({"done": true, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 5}).to_string());
        let bytes = join_lines(&ndjson, "\n");
        let expected = vec![
            pb::run_event::Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() }),
            super::events::tool_call(0, "call_run-1_0", "f", &value.to_string()),
            super::events::usage(3, 5),
        ];
        let decoded = decode(forced(), &chunks(&bytes, &cuts), 16 * 1024 * 1024);
        prop_assert_eq!(decoded, (expected, Ok(pb::FinishReason::ToolCalls)));

        let bytes = join_lines(&noise, "\n");
        prop_assert_eq!(decode(forced(), &chunks(&bytes, &cuts), 1024), decode(forced(), &[&bytes], 1024));
    }
}

// ------------------------------------- what the Edge sends: run requests

/// JSON text for a tool call's arguments or a tool's schema, and whether
/// both adapters must accept it (`None`: arbitrary text, could be either).
fn json_text() -> impl Strategy<Value = (String, Option<bool>)> {
    prop_oneof![
        Just((r#"{"a":[1,{"b":null}]}"#.to_string(), Some(true))),
        Just((String::new(), Some(true))),
        Just(("  ".to_string(), Some(true))),
        Just(("[1]".to_string(), Some(false))),
        Just(("\"x\"".to_string(), Some(false))),
        Just(("{".to_string(), Some(false))),
        Just(("{\"a\":1e400}".to_string(), Some(false))),
        data_text().prop_map(|t| (t, None)),
    ]
}

/// A float option: fine, or one no provider can take.
fn float_option() -> impl Strategy<Value = (Option<f32>, bool)> {
    prop_oneof![
        Just((None, true)),
        (0.0..2.0f32).prop_map(|f| (Some(f), true)),
        prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY]).prop_map(|f| (Some(f), false)),
    ]
}

/// A run request with any roles (unknown `i32`s too), tool-call arguments
/// and schemas of every kind, and options with non-finite floats; whether
/// both adapters must translate it, and whether its assistant tool-call
/// arguments are JSON objects (Ollama's API takes them parsed, the OpenAI
/// one as the text the client sent).
fn run_request() -> impl Strategy<Value = (pb::RunRequest, Option<bool>, Option<bool>)> {
    let call = (data_text(), data_text(), json_text())
        .prop_map(|(id, name, (arguments_json, ok))| (pb::ToolCall { id, name, arguments_json }, ok));
    let message =
        (prop_oneof![4 => 0..5i32, 1 => any::<i32>()], data_text(), prop::collection::vec(call, 0..3), data_text())
            .prop_map(|(role, content, calls, tool_call_id)| {
                let (tool_calls, oks): (Vec<_>, Vec<_>) = calls.into_iter().unzip();
                // Only an assistant's calls are translated.
                let args_ok = if role == i32::from(pb::Role::Assistant) { all_ok(oks) } else { Some(true) };
                let role_ok = (1..=4).contains(&role);
                (pb::ChatMessage { role, content, tool_calls, tool_call_id, images: Vec::new() }, role_ok, args_ok)
            });
    let tool = (data_text(), data_text(), json_text()).prop_map(|(name, description, (parameters_json, ok))| {
        (pb::ToolDefinition { name, description, parameters_json }, ok)
    });
    let options = prop::option::of((
        prop::option::of(any::<u32>()),
        float_option(),
        float_option(),
        prop::collection::vec(data_text(), 0..3),
        prop::option::of(any::<i64>()),
    ));
    (prop::collection::vec(message, 0..4), prop::collection::vec(tool, 0..3), options).prop_map(
        |(messages, tools, options)| {
            let roles_ok = messages.iter().all(|(_, role_ok, _)| *role_ok);
            let args_ok = all_ok(messages.iter().map(|(_, _, ok)| *ok).collect());
            let messages = messages.into_iter().map(|(m, _, _)| m).collect();
            let (tools, tool_oks): (Vec<_>, Vec<_>) = tools.into_iter().unzip();
            let (options, options_ok) = match options {
                None => (None, true),
                Some((max_tokens, (temperature, t_ok), (top_p, p_ok), stop, seed)) => (
                    Some(pb::GenerationOptions { max_tokens, temperature, top_p, stop, seed, ..Default::default() }),
                    t_ok && p_ok,
                ),
            };
            let ok = and(all_ok(tool_oks), Some(roles_ok && options_ok));
            let request = pb::RunRequest { run_id: "r".into(), messages, tools, options, ..Default::default() };
            (request, ok, args_ok)
        },
    )
}

fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn all_ok(oks: Vec<Option<bool>>) -> Option<bool> {
    oks.into_iter().fold(Some(true), and)
}

proptest! {
    /// Any run request the Edge could send: a provider body (a JSON object
    /// for the assigned model, one message per message, streaming) or an
    /// invalid-request failure, never a panic; a request without a bad role,
    /// argument, schema or option is always translated.
    #[test]
    fn fuzz_request_bodies_for_any_run_request((request, ok, args_ok) in run_request()) {
        use super::AdapterKind::{Ollama, OpenAi};
        for adapter in [Ollama, OpenAi] {
            let target = super::fake::target(adapter, "http://127.0.0.1:1");
            let (body, ok) = match adapter {
                Ollama => (ollama::request_body(&target, &request).map(|(body, _)| body), and(ok, args_ok)),
                OpenAi => (openai::request_body(&target, &request), ok),
            };
            match body {
                Ok(body) => {
                    prop_assert!(ok != Some(false), "{adapter:?} accepted {request:?}");
                    let body: Value = serde_json::from_slice(&body).expect("a JSON body");
                    prop_assert_eq!(&body["model"], "test-model");
                    prop_assert_eq!(&body["stream"], true);
                    // The OpenAI-compatible body joins every system message into one leading one.
                    let system = request.messages.iter().filter(|m| m.role == i32::from(pb::Role::System)).count();
                    let expected = match adapter {
                        Ollama => request.messages.len(),
                        OpenAi => request.messages.len() - system + usize::from(system > 0),
                    };
                    prop_assert_eq!(body["messages"].as_array().map(Vec::len), Some(expected));
                }
                Err(e) => {
                    prop_assert_eq!(e.to_failure().kind(), pb::FailureKind::InvalidRequest, "{:?}", e);
                    prop_assert!(ok != Some(true), "{adapter:?} rejected a valid request: {e}");
                }
            }
        }
    }

    /// Any provider assignment: rejected with a reason, or a target whose
    /// URLs parse and stay on the assigned host.
    #[test]
    fn fuzz_provider_assignment(
        adapter in prop_oneof![0..4i32, any::<i32>()],
        pieces in prop::collection::vec(prop::sample::select(vec![
            "http://", "https://", "ftp://", "localhost", "127.0.0.1", "[::1]", ":11434", ":99999", ":", "/v1", "/", "//",
            "?q=1", "#f", "user:pw@", " ", "%", "\u{e9}", "..",
        ]), 0..6),
        model in data_text(),
    ) {
        let assignment = pb::ProviderAssignment {
            provider_id: "p".into(),
            adapter,
            target_model: model,
            base_url: pieces.concat(),
            response_stall_timeout_ms: 0,
            credential_profile: String::new(),
            capacity: 0,
            keep_warm: false,
        };
        match super::ProviderTarget::from_assignment(&assignment) {
            Ok(target) => {
                prop_assert!(!target.base_url.ends_with('/'), "{}", target.base_url);
                let base = reqwest::Url::parse(&target.base_url);
                let url = reqwest::Url::parse(&target.url("/api/chat"));
                prop_assert!(base.is_ok() && url.is_ok(), "{}", target.base_url);
                let (base, url) = (base.unwrap(), url.unwrap());
                prop_assert!(matches!(url.scheme(), "http" | "https"));
                prop_assert_eq!(url.origin(), base.origin());
                prop_assert!(url.path().ends_with("/api/chat"));
            }
            Err(e) => prop_assert_eq!(e.to_failure().kind(), pb::FailureKind::InvalidRequest),
        }
    }
}
