//! OpenTelemetry traces for the Edge and the node, kept small: W3C
//! `traceparent` parsing and formatting, spans with the attributes the
//! caller sets, and a batched OTLP/HTTP (protobuf) exporter
//! ([`export`]). With no endpoint configured the [`Tracer`] is off: spans
//! are inert values (no clock read, no allocation for attributes, no
//! background task) that still carry nothing across the wire.
//!
//! Written here rather than taken from the OpenTelemetry Rust SDK
//! (`opentelemetry` + `opentelemetry_sdk` + `opentelemetry-otlp`): that
//! path adds about ten crates to both binaries (`opentelemetry-http`,
//! `opentelemetry-proto`, `futures-executor`, `rand`, ...), and its default
//! batch processor runs on a thread of its own with reqwest's blocking
//! client, a second runtime in a process that already has tokio. What IOP
//! needs is small (W3C context, spans with attributes, one batched
//! OTLP/HTTP exporter) and uses the `prost`, `reqwest` and `tokio` the tree
//! already has. The e2e test decodes the export with the official
//! `opentelemetry-proto` messages, so the wire format is checked against
//! the published protos, not against this crate.
//!
//! Sampling is parent-based: a span whose parent's `traceparent` says
//! "not sampled" records nothing (its children neither); every other span
//! is recorded. What a span carries is the caller's choice, from closed
//! sets: ids, model and provider names, token counts, outcomes, never
//! prompts, answers, keys or paths.

pub mod export;
pub mod otlp;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use export::{Exporter, ExporterConfig};

/// A span's identity as it crosses a process boundary (W3C trace context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

/// Longest `traceparent` accepted: version 00 is exactly 55 characters; a
/// future version may append fields, which are ignored.
pub const MAX_TRACEPARENT_LEN: usize = 512;

impl SpanContext {
    /// Parses a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), strictly:
    /// lowercase hex, non-zero ids, version not `ff`, bounded length.
    /// Anything else is `None` (the caller starts a new trace). Pure.
    pub fn parse(value: &str) -> Option<Self> {
        if value.len() < 55 || value.len() > MAX_TRACEPARENT_LEN || !value.is_ascii() {
            return None;
        }
        let b = value.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&value[0..2])?[0];
        // Version 00 has exactly four fields; a later one may add fields
        // after a dash. Version ff is invalid.
        if version == 0xff || (version == 0 && value.len() != 55) || (value.len() > 55 && b[55] != b'-') {
            return None;
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let span_id = hex::<8>(&value[36..52])?;
        let flags = hex::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The `traceparent` (version 00) naming this span as the parent. Pure.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }
}

/// `N` bytes from exactly `2 * N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
}

/// A span's kind (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// Where finished spans go; cheap to clone. [`Tracer::off`] drops nothing
/// because it records nothing.
#[derive(Clone, Default)]
pub struct Tracer {
    exporter: Option<Arc<export::Sink>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("on", &self.is_on()).finish()
    }
}

impl Tracer {
    /// Records nothing.
    pub fn off() -> Self {
        Self { exporter: None }
    }

    pub fn is_on(&self) -> bool {
        self.exporter.is_some()
    }

    /// A span named `name` (a fixed name: attributes carry the variable
    /// parts), child of `parent` when there is one, else a new trace's root.
    pub fn start(&self, name: &'static str, kind: Kind, parent: Option<SpanContext>) -> Span {
        let Some(sink) = &self.exporter else { return Span { inner: None } };
        let sampled = parent.is_none_or(|p| p.sampled);
        let context =
            SpanContext { trace_id: parent.map_or_else(new_trace_id, |p| p.trace_id), span_id: new_span_id(), sampled };
        let data = SpanData {
            context,
            parent: parent.map(|p| p.span_id),
            remote_parent: false,
            name,
            kind,
            start_wall: SystemTime::now(),
            start: Instant::now(),
            attributes: Vec::new(),
            events: Vec::new(),
            error: None,
        };
        Span { inner: Some(Box::new(Recording { data, sink: sink.clone() })) }
    }

    /// A span whose parent came from another process (a `traceparent`,
    /// untrusted: see [`SpanContext::parse`]; malformed means a new root).
    pub fn start_remote(&self, name: &'static str, kind: Kind, traceparent: &str) -> Span {
        let parent = SpanContext::parse(traceparent);
        let mut span = self.start(name, kind, parent);
        if let Some(recording) = &mut span.inner {
            recording.data.remote_parent = parent.is_some();
        }
        span
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..);
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let id = fastrand::u64(..);
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// One span: exported when it ends (dropped, or [`Span::end`]). Inert when
/// the tracer is off.
#[derive(Default)]
pub struct Span {
    inner: Option<Box<Recording>>,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Span").field("context", &self.context()).finish()
    }
}

struct Recording {
    data: SpanData,
    sink: Arc<export::Sink>,
}

/// A finished span, as the exporter receives it.
#[derive(Debug, Clone)]
pub struct SpanData {
    pub context: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub remote_parent: bool,
    pub name: &'static str,
    pub kind: Kind,
    pub start_wall: SystemTime,
    pub start: Instant,
    pub attributes: Vec<(&'static str, Value)>,
    pub events: Vec<(&'static str, SystemTime)>,
    /// The closed error code, when the span failed.
    pub error: Option<String>,
}

impl Span {
    /// A span that records nothing.
    pub fn none() -> Self {
        Self { inner: None }
    }

    /// This span's identity, to parent children with; `None` when off.
    pub fn context(&self) -> Option<SpanContext> {
        self.inner.as_ref().map(|r| r.data.context)
    }

    /// The `traceparent` to send with a call made within this span; empty
    /// when tracing is off (the wire's "not traced").
    pub fn traceparent(&self) -> String {
        self.context().map(|c| c.traceparent()).unwrap_or_default()
    }

    /// Sets (or replaces) attribute `key`.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(r) = &mut self.inner {
            let value = value.into();
            match r.data.attributes.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => r.data.attributes.push((key, value)),
            }
        }
    }

    /// Whether attribute `key` was set.
    pub fn has(&self, key: &str) -> bool {
        self.inner.as_ref().is_some_and(|r| r.data.attributes.iter().any(|(k, _)| *k == key))
    }

    /// Marks the span failed with a closed `code` (also `error.type`).
    pub fn fail(&mut self, code: &str) {
        if let Some(r) = &mut self.inner {
            r.data.error = Some(code.to_string());
        }
        self.set("error.type", code.to_string());
    }

    /// An event named `name` at `at` (a monotonic instant, placed on the
    /// wall clock relative to the span's start).
    pub fn event_at(&mut self, name: &'static str, at: Instant) {
        if let Some(r) = &mut self.inner {
            let wall = r.data.start_wall + at.saturating_duration_since(r.data.start);
            r.data.events.push((name, wall));
        }
    }

    /// A child span that started at `at` (when the parent noticed later
    /// that it had begun), e.g. the stream after a first byte.
    pub fn child_since(&self, name: &'static str, kind: Kind, at: Instant) -> Span {
        let Some(r) = &self.inner else { return Span::none() };
        let tracer = Tracer { exporter: Some(r.sink.clone()) };
        let mut child = tracer.start(name, kind, Some(r.data.context));
        if let Some(c) = &mut child.inner {
            c.data.start_wall = r.data.start_wall + at.saturating_duration_since(r.data.start);
            c.data.start = at;
        }
        child
    }

    /// Ends the span now (dropping it does the same).
    pub fn end(self) {}
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(r) = self.inner.take()
            && r.data.context.sampled
        {
            let Recording { data, sink } = *r;
            sink.push(data, SystemTime::now());
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub(crate) fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
