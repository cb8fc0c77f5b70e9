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
mod tests;
