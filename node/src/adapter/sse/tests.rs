use super::*;

fn feed(lines: &[&str]) -> Vec<String> {
    let mut p = SseParser::new();
    let mut out: Vec<String> = lines.iter().filter_map(|l| p.line(l).unwrap()).collect();
    out.extend(p.finish());
    out
}

#[test]
fn data_with_and_without_space() {
    assert_eq!(feed(&["data: {\"a\":1}", "", "data:{\"b\":2}", ""]), vec!["{\"a\":1}", "{\"b\":2}"]);
}

#[test]
fn comments_and_other_fields_are_ignored() {
    assert_eq!(
        feed(&[": keep-alive", "", "event: chunk", "id: 7", "retry: 100", "data: x", "", "event: ping", ""]),
        vec!["x"]
    );
}

#[test]
fn multi_line_data_is_joined_and_pending_event_flushed_at_end() {
    assert_eq!(feed(&["data: a", "data: b", "", "data: [DONE]"]), vec!["a\nb", "[DONE]"]);
}

/// Issue 8 item 5: `data:` lines without the blank line that ends the
/// event cannot accumulate without bound.
#[test]
fn an_event_whose_data_never_ends_is_too_large() {
    let mut p = SseParser::with_max_data(16);
    assert_eq!(p.line("data: 0123456").unwrap(), None);
    assert_eq!(p.line("data: 0123456").unwrap(), None);
    assert!(matches!(p.line("data: 0123456"), Err(AdapterError::TooLarge(_))));
    let mut p = SseParser::with_max_data(16);
    for _ in 0..100 {
        assert_eq!(p.line("data: 0123456").unwrap(), None);
        assert_eq!(p.line("").unwrap().as_deref(), Some("0123456"), "dispatched events free their data");
    }
}

#[test]
fn only_one_leading_space_is_stripped() {
    assert_eq!(feed(&["data:  two", ""]), vec![" two"]);
    assert_eq!(feed(&["data", ""]), vec![""]);
}
