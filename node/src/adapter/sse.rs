//! Server-sent events field parsing, fed one line at a time by the shared
//! [`LineSplitter`](super::lines::LineSplitter).
//!
//! Only `data` matters to us: `event`, `id` and `retry` fields and `:`
//! comments are ignored. Several `data` lines in one event are joined with
//! `\n`; a blank line dispatches the event.

#[derive(Debug, Default)]
pub(crate) struct SseParser {
    data: String,
    has_data: bool,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds one line (without terminator). Returns the event's data when the
    /// line is the blank line that ends an event carrying data.
    pub(crate) fn line(&mut self, line: &str) -> Option<String> {
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
        let mut out: Vec<String> = lines.iter().filter_map(|l| p.line(l)).collect();
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

    #[test]
    fn only_one_leading_space_is_stripped() {
        assert_eq!(feed(&["data:  two", ""]), vec![" two"]);
        assert_eq!(feed(&["data", ""]), vec![""]);
    }
}
