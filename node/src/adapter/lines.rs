//! Incremental line splitting for streamed provider bodies (Ollama NDJSON and
//! OpenAI SSE both arrive as lines cut at arbitrary network-chunk borders).

use super::error::AdapterError;

/// Longest line (an NDJSON object, an SSE field) we buffer before failing the
/// run as `response_too_large`. Generous: a single chunk may carry a whole
/// tool call's arguments.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
// A line becomes at most one run event, which the Edge decodes up to this.
const _: () = assert!(MAX_LINE_BYTES < iop_proto::wire::MAX_RUN_EVENT_MESSAGE_BYTES);

/// Turns byte chunks into complete lines. A line ends at `\r\n`, `\n` or a
/// lone `\r`, the three terminators the SSE format allows (NDJSON uses the
/// first two; a JSON encoder never writes a raw `\r` inside an object).
/// Blank lines are returned (SSE needs them); callers that do not care skip
/// them.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    buf: Vec<u8>,
    /// Start of the first line not yet returned.
    start: usize,
    /// Where the next search for a terminator begins (everything in
    /// `start..scan` is known to hold none), so a long line split over many
    /// chunks is scanned once.
    scan: usize,
    /// The last line ended at a `\r` that was the last byte buffered: a `\n`
    /// arriving next belongs to it (`\r\n` cut by the network), not a blank
    /// line of its own.
    after_cr: bool,
    max_line: usize,
}

impl Default for LineSplitter {
    fn default() -> Self {
        Self::new()
    }
}

impl LineSplitter {
    pub(crate) fn new() -> Self {
        Self::with_max_line(MAX_LINE_BYTES)
    }

    pub(crate) fn with_max_line(max_line: usize) -> Self {
        Self { buf: Vec::new(), start: 0, scan: 0, after_cr: false, max_line }
    }

    /// Appends one network chunk.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            // Drop consumed bytes so the buffer never grows with the stream.
            self.buf.drain(..self.start);
            self.scan -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete line (without its terminator), if one is buffered.
    pub(crate) fn next_line(&mut self) -> Result<Option<String>, AdapterError> {
        if self.after_cr && self.start < self.buf.len() {
            self.after_cr = false;
            if self.buf[self.start] == b'\n' {
                self.start += 1;
                self.scan = self.scan.max(self.start);
            }
        }
        match self.buf[self.scan..].iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(offset) => {
                let end = self.scan + offset;
                // Also when the whole line arrived in one chunk: the cap must
                // not depend on where the network cut the stream.
                if end - self.start > self.max_line {
                    return Err(self.line_too_long());
                }
                let line = take_line(&self.buf[self.start..end])?;
                self.start = match self.buf.get(end..end + 2) {
                    Some(b"\r\n") => end + 2,
                    _ => end + 1,
                };
                // Found by the chunking fuzz: only a `\r` that is the last
                // byte buffered waits for its `\n`, not a whole `\r\n`.
                self.after_cr = self.buf[end] == b'\r' && end + 1 == self.buf.len();
                self.scan = self.start;
                Ok(Some(line))
            }
            None => {
                self.scan = self.buf.len();
                if self.buf.len() - self.start > self.max_line {
                    return Err(self.line_too_long());
                }
                Ok(None)
            }
        }
    }

    fn line_too_long(&self) -> AdapterError {
        AdapterError::TooLarge(format!("provider sent a line longer than {} bytes", self.max_line))
    }

    /// At end of body: the final line if it had no trailing newline. Call
    /// after `next_line` returned `None`.
    pub(crate) fn finish(&mut self) -> Result<Option<String>, AdapterError> {
        if self.start >= self.buf.len() {
            return Ok(None);
        }
        let line = take_line(&self.buf[self.start..])?;
        self.start = self.buf.len();
        self.scan = self.start;
        Ok(Some(line))
    }
}

fn take_line(bytes: &[u8]) -> Result<String, AdapterError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| AdapterError::Protocol("provider sent a line that is not valid UTF-8".into()))
}

#[cfg(test)]
mod tests;
