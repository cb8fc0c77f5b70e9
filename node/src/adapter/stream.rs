//! The stream driver: a provider's body, read chunk by chunk, split into
//! lines, decoded by the adapter's [`StreamDecoder`] and forwarded to the
//! run's sink as it arrives.

use futures_util::StreamExt;
use iop_proto::pb;

use super::error::{AdapterError, stream_cut};
use super::events::{EventSink, Events};
use super::lines::LineSplitter;
use crate::metrics::NodeMetrics;

/// A provider's streaming format, decoded one line at a time. Decoders are
/// pure (no I/O), so the driver owns all awaiting.
pub(super) trait StreamDecoder {
    /// One complete line. Pushes the events it yields; `Some` ends the run.
    fn line(&mut self, line: &str, out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError>;
    /// The body ended without `line` having returned `Some`.
    fn end(&mut self, out: &mut Events) -> Result<pb::FinishReason, AdapterError>;
    /// Undecodable events skipped so far ([`MalformedRun`](super::malformed::MalformedRun)).
    fn malformed_skipped(&self) -> u64;
}

/// Where [`drive`] reports the malformed events a stream skipped.
pub(super) struct Tally<'a> {
    pub(super) provider: &'a str,
    pub(super) metrics: &'a NodeMetrics,
    /// Already reported.
    pub(super) reported: u64,
}

impl Tally<'_> {
    /// Counts and logs the events skipped since the last call: the log names
    /// the provider, never the payload (it may hold prompt text).
    fn report(&mut self, skipped: u64) {
        let new = skipped - self.reported;
        if new > 0 {
            self.reported = skipped;
            self.metrics.provider_malformed_events(self.provider, new);
            tracing::warn!(provider = %self.provider, skipped = new, "skipped a malformed event in the provider's stream");
        }
    }
}

pub(super) async fn drive<D: StreamDecoder>(
    response: reqwest::Response,
    decoder: D,
    sink: &EventSink,
    mut tally: Tally<'_>,
) -> Result<pb::FinishReason, AdapterError> {
    let mut body = response.bytes_stream();
    let mut reader = StreamReader::new(decoder);
    let mut out = Events::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| stream_cut("reading the provider's response", e))?;
        let step = reader.chunk(&chunk, &mut out);
        tally.report(reader.decoder.malformed_skipped());
        forward(sink, &mut out).await?;
        if let Some(reason) = step? {
            return Ok(reason);
        }
    }
    let end = reader.end(&mut out);
    tally.report(reader.decoder.malformed_skipped());
    forward(sink, &mut out).await?;
    end
}

/// The pure half of [`drive`]: a provider's body, chunk by chunk, split into
/// lines and decoded. The events of the lines before an error or the end are
/// in `out` either way (the caller forwards them, then acts on the result).
pub(super) struct StreamReader<D> {
    pub(super) lines: LineSplitter,
    pub(super) decoder: D,
}

impl<D: StreamDecoder> StreamReader<D> {
    fn new(decoder: D) -> Self {
        Self { lines: LineSplitter::new(), decoder }
    }

    /// One network chunk. `Some` ends the run.
    pub(super) fn chunk(&mut self, chunk: &[u8], out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError> {
        self.lines.push(chunk);
        while let Some(line) = self.lines.next_line()? {
            if let Some(reason) = self.decoder.line(&line, out)? {
                return Ok(Some(reason));
            }
        }
        Ok(None)
    }

    /// The body ended (without a chunk having ended the run).
    pub(super) fn end(&mut self, out: &mut Events) -> Result<pb::FinishReason, AdapterError> {
        if let Some(line) = self.lines.finish()?
            && let Some(reason) = self.decoder.line(&line, out)?
        {
            return Ok(reason);
        }
        self.decoder.end(out)
    }
}

async fn forward(sink: &EventSink, events: &mut Events) -> Result<(), AdapterError> {
    for event in events.drain(..) {
        sink.send(event).await.map_err(|_| AdapterError::SinkClosed)?;
    }
    Ok(())
}
