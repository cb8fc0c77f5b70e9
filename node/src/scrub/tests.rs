use super::*;

const SECRET: &str = "sk-proj-Zq8vK2mN4pR7tW1xY5aB3cD6eF9gH0jL";

fn scrubber() -> SecretScrubber {
    SecretScrubber::new(SECRET.as_bytes())
}

/// Everything `chunks` stream to, pushed one by one.
fn streamed(scrubber: &SecretScrubber, chunks: &[&str]) -> String {
    let mut stream = scrubber.stream();
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend(stream.push(chunk.as_bytes()));
    }
    out.extend(stream.finish());
    String::from_utf8(out).unwrap()
}

#[test]
fn the_secret_is_redacted_anywhere_and_every_time() {
    let s = scrubber();
    assert_eq!(
        s.scrub_text(&format!("Incorrect API key provided: Bearer {SECRET}.")),
        "Incorrect API key provided: Bearer [credential redacted]."
    );
    assert_eq!(s.scrub_text(SECRET), REDACTED, "the whole text");
    assert_eq!(s.scrub_text(&format!("{SECRET}x")), format!("{REDACTED}x"), "at the start");
    assert_eq!(s.scrub_text(&format!("x{SECRET}")), format!("x{REDACTED}"), "at the end");
    assert_eq!(s.scrub_text(&format!("{SECRET} and {SECRET}")), format!("{REDACTED} and {REDACTED}"), "repeated");
    assert_eq!(s.scrub_text(&format!("{SECRET}{SECRET}")), REDACTED, "back to back: one run");
    assert_eq!(s.scrub_text("nothing to see"), "nothing to see");
    assert_eq!(s.scrub_text(""), "");
}

#[test]
fn a_truncated_secret_is_redacted_while_a_run_of_sixteen_bytes_remains() {
    let s = scrubber();
    let prefix = &SECRET[..MIN_FRAGMENT];
    assert_eq!(s.scrub_text(&format!("key: {prefix}")), format!("key: {REDACTED}"));
    let suffix = &SECRET[SECRET.len() - MIN_FRAGMENT..];
    assert_eq!(s.scrub_text(&format!("key: …{suffix}")), format!("key: …{REDACTED}"));
    let middle = &SECRET[10..30];
    assert_eq!(s.scrub_text(&format!("[{middle}]")), format!("[{REDACTED}]"));
    // Shorter pieces stay: a key's public prefix, a provider's own mask.
    let short = &SECRET[..MIN_FRAGMENT - 1];
    assert_eq!(s.scrub_text(&format!("key: {short}")), format!("key: {short}"));
    assert_eq!(s.scrub_text("sk-proj-****gH0jL"), "sk-proj-****gH0jL");
}

#[test]
fn a_short_secret_is_redacted_whole_and_an_empty_one_changes_nothing() {
    let s = SecretScrubber::new(b"tiny-key");
    assert_eq!(s.scrub_text("a tiny-key and tiny-ke"), format!("a {REDACTED} and tiny-ke"));
    assert_eq!(SecretScrubber::new(b"").scrub_text("anything"), "anything");
}

#[test]
fn a_secret_split_across_chunks_is_caught_at_every_cut() {
    let s = scrubber();
    let body = format!("data: {{\"error\":{{\"message\":\"Bearer {SECRET} is wrong\"}}}}\n\n");
    let expected = body.replace(SECRET, REDACTED);
    for cut in 0..=body.len() {
        assert_eq!(streamed(&s, &[&body[..cut], &body[cut..]]), expected, "cut at {cut}");
    }
    for (a, b) in [(3, 10), (20, 21), (30, 60), (40, 41)] {
        let chunks = [&body[..a], &body[a..b], &body[b..]];
        assert_eq!(streamed(&s, &chunks), expected, "cuts at {a} and {b}");
    }
    let bytewise: Vec<String> = body.chars().map(String::from).collect();
    let bytewise: Vec<&str> = bytewise.iter().map(String::as_str).collect();
    assert_eq!(streamed(&s, &bytewise), expected, "one byte at a time");
    let twice = format!("{SECRET}{SECRET} {SECRET}");
    for cut in 0..=twice.len() {
        let got = streamed(&s, &[&twice[..cut], &twice[cut..]]);
        assert_eq!(got, format!("{REDACTED} {REDACTED}"), "repeated, cut at {cut}");
    }
}

#[test]
fn a_stream_holds_back_only_what_could_begin_the_secret() {
    let s = scrubber();
    let mut stream = s.stream();
    let event = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
    assert_eq!(stream.push(event.as_bytes()), event.as_bytes(), "an SSE event passes at once");
    assert_eq!(stream.push(b"Bearer sk-proj-Zq"), b"Bearer ", "a possible start waits");
    assert_eq!(stream.push(b"X"), b"sk-proj-ZqX", "and goes once it cannot be the secret");
    assert_eq!(stream.push(b"sk-pro"), b"");
    assert_eq!(stream.finish(), b"sk-pro", "the end releases a short tail");
}

#[test]
fn a_failure_message_is_scrubbed() {
    let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, format!("invalid key {SECRET}"));
    scrubber().scrub_failure(&mut failure);
    assert_eq!(failure.message, format!("invalid key {REDACTED}"));
    assert!(!format!("{:?}", scrubber()).contains("sk-"));
}
