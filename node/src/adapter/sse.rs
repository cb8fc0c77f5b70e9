//! Server-sent events field parsing, fed one line at a time by the shared
//! [`LineSplitter`](super::lines::LineSplitter).
//!
//! Only `data` matters to us: `event`, `id` and `retry` fields and `:`
//! comments are ignored. Several `data` lines in one event are joined with
//! `\n`; a blank line dispatches the event. One event's data is bounded like
//! one line (a provider that never ends its event cannot grow it forever).

use super::error::AdapterError;
use super::lines::MAX_LINE_BYTES;

#[derive(Debug)]
pub(crate) struct SseParser {
    data: String,
    has_data: bool,
    max_data: usize,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::with_max_data(MAX_LINE_BYTES)
    }

    pub(crate) fn with_max_data(max_data: usize) -> Self {
        Self { data: String::new(), has_data: false, max_data }
    }

    /// Feeds one line (without terminator). Returns the event's data when the
    /// line is the blank line that ends an event carrying data; an event whose
    /// data grows past the bound is `TooLarge`.
    pub(crate) fn line(&mut self, line: &str) -> Result<Option<String>, AdapterError> {
        let data = self.accumulate(line);
        if self.data.len() > self.max_data {
            return Err(AdapterError::TooLarge(format!(
                "provider sent an event with more than {} bytes of data",
                self.max_data
            )));
        }
        Ok(data)
    }

    fn accumulate(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // comment / keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        None
    }

    /// At end of body: an event whose terminating blank line never came. We
    /// are lenient and dispatch it (some servers end with a bare
    /// `data: [DONE]`).
    pub(crate) fn finish(&mut self) -> Option<String> {
        self.dispatch()
    }

    fn dispatch(&mut self) -> Option<String> {
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(std::mem::take(&mut self.data))
    }
}

#[cfg(test)]
mod tests {
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
}
