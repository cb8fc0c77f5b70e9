use super::*;

fn drain(s: &mut LineSplitter) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(line) = s.next_line().unwrap() {
        out.push(line);
    }
    out
}

/// Every line of `bytes` pushed in two chunks, cut at `cut`.
fn lines_cut_at(bytes: &[u8], cut: usize) -> Vec<String> {
    let mut s = LineSplitter::new();
    s.push(&bytes[..cut]);
    let mut lines = drain(&mut s);
    s.push(&bytes[cut..]);
    lines.extend(drain(&mut s));
    lines.extend(s.finish().unwrap());
    lines
}

#[test]
fn lines_split_across_chunks_are_reassembled() {
    let mut s = LineSplitter::new();
    s.push(b"{\"a\":");
    assert!(drain(&mut s).is_empty());
    s.push(b"1}\n{\"b\"");
    assert_eq!(drain(&mut s), vec!["{\"a\":1}"]);
    s.push(b":2}\r\n\n{\"c\":3}\n{\"d\"");
    assert_eq!(drain(&mut s), vec!["{\"b\":2}", "", "{\"c\":3}"]);
    s.push(b":4}");
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.finish().unwrap().as_deref(), Some("{\"d\":4}"));
    assert_eq!(s.finish().unwrap(), None);
}

#[test]
fn every_split_point_gives_the_same_lines() {
    let text = "data: {\"x\":\"h\u{e9}llo\"}\r\n\r\n: comment\ndata: [DONE]\n\nlast";
    let want = vec!["data: {\"x\":\"h\u{e9}llo\"}", "", ": comment", "data: [DONE]", "", "last"];
    for cut in 0..=text.len() {
        assert_eq!(lines_cut_at(text.as_bytes(), cut), want, "cut at {cut}");
    }
}

/// SSE allows a lone `\r` as a terminator; `\r\r` is a line and a blank
/// line, and `\r\n` cut between its bytes is still one terminator.
#[test]
fn a_lone_carriage_return_ends_a_line() {
    let text = b"data: a\r\rdata: b\r\n\r\ndata: c\rlast";
    let want = vec!["data: a", "", "data: b", "", "data: c", "last"];
    for cut in 0..=text.len() {
        assert_eq!(lines_cut_at(text, cut), want, "cut at {cut}");
    }
    // A `\r` that ends the buffer gives its line at once (an SSE event
    // is not held back waiting for a `\n` that may never come).
    let mut s = LineSplitter::new();
    s.push(b"data: now\r");
    assert_eq!(drain(&mut s), vec!["data: now"]);
    s.push(b"\n\n");
    assert_eq!(drain(&mut s), vec![""], "the `\\n` completes `\\r\\n`; then one blank line");
}

#[test]
fn byte_at_a_time_works_and_buffer_stays_small() {
    let mut s = LineSplitter::new();
    let mut lines = Vec::new();
    for _ in 0..1000 {
        for b in b"{\"n\":1}\n" {
            s.push(std::slice::from_ref(b));
            lines.extend(drain(&mut s));
        }
    }
    assert_eq!(lines.len(), 1000);
    assert!(s.buf.len() < 64, "consumed bytes are released");
}

#[test]
fn trailing_newline_leaves_nothing_to_finish() {
    let mut s = LineSplitter::new();
    s.push(b"one\n");
    assert_eq!(drain(&mut s), vec!["one"]);
    assert_eq!(s.finish().unwrap(), None);
}

/// Found by `fuzz_lines_are_independent_of_chunking`: a line over the cap
/// that arrived whole, with its newline, in one chunk (or was completed
/// by one) was accepted; cut before its newline it failed.
#[test]
fn an_overlong_line_fails_however_it_is_cut() {
    for chunks in [&[&b"0123456789\n"[..]][..], &[b"01234567", b"89\n"], &[b"0123456789", b"\n"]] {
        let mut s = LineSplitter::with_max_line(8);
        let mut result = Ok(None);
        for chunk in chunks {
            s.push(chunk);
            result = s.next_line();
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(AdapterError::TooLarge(_))), "{chunks:?}: {result:?}");
    }
    let mut s = LineSplitter::with_max_line(8);
    s.push(b"01234567\n");
    assert_eq!(s.next_line().unwrap().as_deref(), Some("01234567"), "exactly the cap is fine");
}

#[test]
fn overlong_line_is_too_large_and_bad_utf8_a_protocol_error() {
    let mut s = LineSplitter::with_max_line(8);
    s.push(b"0123456789");
    assert!(matches!(s.next_line(), Err(AdapterError::TooLarge(_))));

    let mut s = LineSplitter::new();
    s.push(b"\xff\xfe\n");
    assert!(matches!(s.next_line(), Err(AdapterError::Protocol(_))));
}
