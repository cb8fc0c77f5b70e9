//! The one rule for undecodable events in a provider's stream (an SSE
//! `data:` payload or an NDJSON line that is not the JSON the API sends),
//! shared by both adapters' decoders: an isolated one is skipped (and
//! counted), the run fails only after [`MAX_MALFORMED_IN_A_ROW`] in a row or
//! when the stream ends right after one (no valid terminal followed it).

use super::error::AdapterError;

/// Undecodable events in a row that end a run as `provider_protocol`. One
/// bad event amid good ones is a glitch (a proxy that mangled a line, a
/// server bug in one chunk) and the answer around it is still whole, so it
/// is skipped; several in a row mean the provider no longer speaks its
/// format, and going on would only hide that. Three tolerates a short burst
/// while a broken stream still fails within a few events.
pub(crate) const MAX_MALFORMED_IN_A_ROW: u32 = 3;

/// What to do with the stream after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on: the malformed event is dropped.
    Skip,
    /// End the run as `provider_protocol`.
    Fail,
}

/// The malformed events of one stream: how many are in a row now, and how
/// many were skipped in all (what the node's metric counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MalformedRun {
    consecutive: u32,
    skipped: u64,
}

impl MalformedRun {
    /// An undecodable event arrived.
    pub(crate) fn on_malformed(&mut self) -> Verdict {
        self.consecutive += 1;
        if self.consecutive >= MAX_MALFORMED_IN_A_ROW {
            return Verdict::Fail;
        }
        self.skipped += 1;
        Verdict::Skip
    }

    /// A decodable event arrived: the run of malformed ones is over.
    pub(crate) fn on_good(&mut self) {
        self.consecutive = 0;
    }

    /// The stream ended without a terminal event: an answer whose last
    /// event was malformed may have lost its end there, so it fails.
    pub(crate) fn at_end(&self) -> Verdict {
        if self.consecutive > 0 { Verdict::Fail } else { Verdict::Skip }
    }

    /// Malformed events skipped so far.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped
    }

    /// [`Self::on_malformed`] as a decoder acts on it: `Ok` to skip the
    /// event, the run's error otherwise. `what` names the event kind
    /// ("SSE data payload"), `why` is the decode error's summary; neither
    /// quotes the payload (it may hold prompt text).
    pub(crate) fn malformed(&mut self, what: &str, why: &str) -> Result<(), AdapterError> {
        match self.on_malformed() {
            Verdict::Skip => Ok(()),
            Verdict::Fail => Err(AdapterError::Protocol(format!(
                "provider sent {MAX_MALFORMED_IN_A_ROW} invalid {what}s in a row (last: {why})"
            ))),
        }
    }

    /// [`Self::at_end`] as a decoder acts on it.
    pub(crate) fn end(&self, what: &str) -> Result<(), AdapterError> {
        match self.at_end() {
            Verdict::Skip => Ok(()),
            Verdict::Fail => Err(AdapterError::Protocol(format!("stream ended right after an invalid {what}"))),
        }
    }
}

#[cfg(test)]
mod tests;
