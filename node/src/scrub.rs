//! Keeps a managed credential out of what the node relays from a provider.
//!
//! A provider that rejects (or merely quotes) the key it was sent may echo
//! it in its error text: OpenAI answers `Incorrect API key provided: sk-…`,
//! proxies quote the whole `Authorization` header. Everything the node
//! passes on from a provider call that carried a lease's credential goes
//! through one [`SecretScrubber`]: the failure message of a normalized run
//! (`SecretScrubber::scrub_failure`), and the head and every body byte of a
//! tunnel ([`ScrubStream`], which also catches a secret split across chunks).
//!
//! What is redacted, each maximal run replaced by [`REDACTED`]: every byte
//! that lies in a run of at least [`MIN_FRAGMENT`] consecutive bytes of the
//! secret (all of it when the secret is shorter). That covers the whole
//! secret, repeated or at any boundary, and a secret the provider (or the
//! node's own 500-character cut of error messages) truncated, as long as
//! [`MIN_FRAGMENT`] bytes of it remain. A shorter piece is left alone: 16
//! bytes is longer than the fixed prefixes keys share (`sk-ant-api03-` is
//! 13), so ordinary text that merely names a key's format is not redacted,
//! and a provider's own masked form (`sk-proj-****wxyz`, its last four
//! characters) is what the provider chose to show. Not covered: a secret
//! the provider re-encodes (JSON-escaped `/`, base64, percent-encoding);
//! keys are URL-safe text in practice.

use std::fmt;
use std::sync::Arc;

use iop_proto::pb;
use zeroize::Zeroizing;

/// What a redacted run of the secret becomes.
pub const REDACTED: &str = "[credential redacted]";
/// The shortest run of the secret's bytes that is redacted.
pub const MIN_FRAGMENT: usize = 16;

/// The secret of one lease, and the single rule for removing it from text.
/// Cheap to clone; the secret is zeroized when the last clone is dropped.
#[derive(Clone)]
pub struct SecretScrubber {
    inner: Arc<Secret>,
}

struct Secret {
    bytes: Zeroizing<Vec<u8>>,
    /// Per byte value, where in `bytes` a run of [`SecretScrubber::window`]
    /// bytes starts with it: a stream position is compared only with
    /// those (about one for text), not with every offset of the secret.
    window_starts: Vec<Zeroizing<Vec<u32>>>,
}

impl fmt::Debug for SecretScrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretScrubber([redacted])")
    }
}

impl SecretScrubber {
    pub fn new(secret: &[u8]) -> Self {
        let window = secret.len().min(MIN_FRAGMENT);
        let mut window_starts: Vec<Zeroizing<Vec<u32>>> = (0..256).map(|_| Zeroizing::new(Vec::new())).collect();
        if window > 0 {
            for (start, &byte) in secret[..=secret.len() - window].iter().enumerate() {
                window_starts[usize::from(byte)].push(start as u32);
            }
        }
        Self { inner: Arc::new(Secret { bytes: Zeroizing::new(secret.to_vec()), window_starts }) }
    }

    /// The length of the runs checked: [`MIN_FRAGMENT`], or the whole
    /// secret when it is shorter.
    fn window(&self) -> usize {
        self.inner.bytes.len().min(MIN_FRAGMENT)
    }

    /// Whether `bytes`, [`Self::window`] long, occur somewhere in the secret.
    fn is_window(&self, bytes: &[u8]) -> bool {
        let secret = &self.inner.bytes;
        self.inner.window_starts[usize::from(bytes[0])]
            .iter()
            .any(|&start| &secret[start as usize..start as usize + bytes.len()] == bytes)
    }

    /// Whether `bytes` (of any length) occur somewhere in the secret.
    fn is_fragment(&self, bytes: &[u8]) -> bool {
        bytes.is_empty() || self.inner.bytes.windows(bytes.len()).any(|w| w == bytes)
    }

    /// `text` with every run of the secret redacted.
    pub fn scrub_text(&self, text: &str) -> String {
        let mut stream = self.stream();
        let mut out = stream.push(text.as_bytes());
        out.extend(stream.finish());
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Scrubs the provider text a failure carries (its message).
    pub fn scrub_failure(&self, failure: &mut pb::ExecutionFailure) {
        failure.message = self.scrub_text(&failure.message);
    }

    /// A scrubber for a body that arrives in chunks.
    pub fn stream(&self) -> ScrubStream {
        ScrubStream { scrubber: self.clone(), pending: Zeroizing::new(Vec::new()), marked: 0, in_redaction: false }
    }
}

/// [`SecretScrubber`] over a byte stream: [`ScrubStream::push`] returns the
/// part of the stream that is decided, [`ScrubStream::finish`] the rest.
/// Held back are only the last bytes that could still begin a run of the
/// secret (fewer than [`MIN_FRAGMENT`], and none when the chunk ends in a
/// byte sequence the secret does not contain, as an SSE event's `\n\n`
/// does), so a stream is not delayed by the scrubbing.
pub struct ScrubStream {
    scrubber: SecretScrubber,
    /// Bytes not yet returned.
    pending: Zeroizing<Vec<u8>>,
    /// How many leading bytes of `pending` an earlier run already covers.
    marked: usize,
    /// Whether the last byte returned was redacted (a run that continues
    /// gets no second marker).
    in_redaction: bool,
}

impl fmt::Debug for ScrubStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScrubStream([redacted])")
    }
}

impl ScrubStream {
    /// The next chunk; returns what may be passed on now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        self.drain(false)
    }

    /// The end of the stream; returns what was held back, scrubbed.
    pub fn finish(&mut self) -> Vec<u8> {
        self.drain(true)
    }

    fn drain(&mut self, last: bool) -> Vec<u8> {
        let window = self.scrubber.window();
        let n = self.pending.len();
        if window == 0 {
            return std::mem::take(&mut *self.pending);
        }
        let mut marks = vec![false; n];
        marks[..self.marked].fill(true);
        if n >= window {
            for start in 0..=n - window {
                if self.scrubber.is_window(&self.pending[start..start + window]) {
                    marks[start..start + window].fill(true);
                }
            }
        }
        // The longest tail shorter than a window that the next bytes could
        // complete into a run of the secret.
        let hold_from = if last {
            n
        } else {
            (n.saturating_sub(window - 1)..n).find(|&s| self.scrubber.is_fragment(&self.pending[s..])).unwrap_or(n)
        };
        let mut out = Vec::with_capacity(hold_from);
        for (i, &byte) in self.pending[..hold_from].iter().enumerate() {
            if marks[i] {
                if !self.in_redaction {
                    out.extend_from_slice(REDACTED.as_bytes());
                }
                self.in_redaction = true;
            } else {
                out.push(byte);
                self.in_redaction = false;
            }
        }
        // Runs reaching into the held tail cover a prefix of it.
        self.marked = marks[hold_from..].iter().take_while(|m| **m).count();
        let rest = Zeroizing::new(self.pending[hold_from..].to_vec());
        self.pending = rest;
        out
    }
}

#[cfg(test)]
mod tests;
