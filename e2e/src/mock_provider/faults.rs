//! The fault knobs (see *Fault knobs* in the [`super`] docs): [`Faults`],
//! parsed from `k=v,k=v` specs and merged from the process defaults, the
//! model name's `@` suffix and the `x-mock-faults` header, and the wait that
//! a delay knob asks for.

use std::str::FromStr;
use std::time::Duration;

use axum::body::Bytes;
use http::HeaderMap;

use super::residency::base_model;

/// Header carrying per-request fault knobs (`k=v,k=v`).
pub const FAULTS_HEADER: &str = "x-mock-faults";

/// All knob names accepted by [`parse_faults`].
pub const KNOBS: &[&str] = &[
    "headers_delay_ms",
    "first_token_delay_ms",
    "chunk_delay_ms",
    "end_delay_ms",
    "stall_after",
    "cut_after",
    "malformed_at",
    "malformed_run",
    "malformed_end",
    "no_done",
    "status",
    "retry_after",
    "error_code",
    "fail_times",
    "never_answer",
    "exit",
    "words",
    "hold",
    "context_window",
    "sse_line_end",
    "echo_auth",
    "set_cookie",
    "repeat_prefill",
    "text_only",
];

pub(super) const MALFORMED_JSON: &str = r#"{"broken":"#;

/// Fault knobs; `None` means "not set" so that sources can be merged.
/// Also usable as clap flags (`--stall-after 2`, `--no-done`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Faults {
    /// Wait this many milliseconds before sending response headers.
    #[arg(long, value_name = "MS")]
    pub headers_delay_ms: Option<u64>,
    /// After the headers, wait this many milliseconds before the first content chunk.
    #[arg(long, value_name = "MS")]
    pub first_token_delay_ms: Option<u64>,
    /// Wait this many milliseconds between content chunks.
    #[arg(long, value_name = "MS")]
    pub chunk_delay_ms: Option<u64>,
    /// After the reply's end (its last bytes, `[DONE]` included), keep the
    /// body open this many milliseconds before it ends.
    #[arg(long, value_name = "MS")]
    pub end_delay_ms: Option<u64>,
    /// Send N content chunks, then stall (connection stays open, nothing more is sent).
    #[arg(long, value_name = "N")]
    pub stall_after: Option<usize>,
    /// Send N content chunks, then abort the body (no final chunk, no `[DONE]`).
    #[arg(long, value_name = "N")]
    pub cut_after: Option<usize>,
    /// Replace the Nth (1-based) content chunk with invalid JSON.
    #[arg(long, value_name = "N")]
    pub malformed_at: Option<usize>,
    /// Make N content chunks in a row invalid JSON, from `malformed_at` (default 1).
    #[arg(long, value_name = "N")]
    pub malformed_run: Option<usize>,
    /// Replace the reply's end (finish chunk, usage, `[DONE]`; Ollama's done
    /// line) with one invalid-JSON event: the body ends right after it.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub malformed_end: Option<bool>,
    /// OpenAI streams only: omit the final `data: [DONE]`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub no_done: Option<bool>,
    /// Answer at once with this HTTP status (400..=599) and an error body.
    #[arg(long, value_name = "CODE")]
    pub status: Option<u16>,
    /// With `status`: send a `Retry-After: SECS` header.
    #[arg(long, value_name = "SECS")]
    pub retry_after: Option<u64>,
    /// With `status`: the OpenAI error body's `code` (`content_policy_violation`);
    /// Ollama's plain-string errors carry none.
    #[arg(long, value_name = "CODE")]
    pub error_code: Option<String>,
    /// With `status`: only the first N requests carrying this exact knob
    /// set fail, later ones answer normally ("fails once, then answers").
    #[arg(long, value_name = "N")]
    pub fail_times: Option<u64>,
    /// Never send response headers (hold until the client disconnects).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub never_answer: Option<bool>,
    /// Exit the process (status 3) upon receiving a chat or embeddings request.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub exit: Option<bool>,
    /// Reply with `w1 w2 … wN` instead of the echo text.
    #[arg(long, value_name = "N")]
    pub words: Option<usize>,
    /// Hold the request (before the headers) until `POST /mock/release/NAME`;
    /// the other knobs apply after that. A test-controlled stall.
    #[arg(long, value_name = "NAME")]
    pub hold: Option<String>,
    /// A prompt longer than N words is refused with a 400 whose error says
    /// the context length was exceeded (as OpenAI and vLLM word it).
    #[arg(long, value_name = "N")]
    pub context_window: Option<u64>,
    /// OpenAI streams only: end SSE lines with `\n` (the default), `\r\n`
    /// or a lone `\r`, the three terminators the SSE format allows.
    #[arg(long, value_enum)]
    pub sse_line_end: Option<LineEnd>,
    /// Errors quote the request's `Authorization` header, as OpenAI's
    /// `Incorrect API key provided: …` does: with `status`, its error body;
    /// otherwise a non-streamed request gets a 401 saying so, and a stream
    /// sends its first content chunk, then an error event with the quote,
    /// written as two body chunks that split the key in the middle.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub echo_auth: Option<bool>,
    /// Chat answers carry `set-cookie: mock-session=…` and an
    /// `x-ratelimit-remaining-requests` header, as hosted APIs send them.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub set_cookie: Option<bool>,
    /// Like llama.cpp's server: the continuation of a prefilled assistant
    /// turn (`words`) starts with the prefill itself.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub repeat_prefill: Option<bool>,
    /// A request carrying an image is refused as llama.cpp's server without
    /// a vision projector refuses it: 500 `image input is not supported`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub text_only: Option<bool>,
}

/// An SSE line terminator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LineEnd {
    #[default]
    Lf,
    Crlf,
    Cr,
}

impl LineEnd {
    fn bytes(self) -> &'static [u8] {
        match self {
            LineEnd::Lf => b"\n",
            LineEnd::Crlf => b"\r\n",
            LineEnd::Cr => b"\r",
        }
    }

    /// `bytes` (SSE text ending its lines with `\n`) with each `\n` written
    /// as this terminator. A JSON payload holds no raw `\n`, so every one is
    /// a line end.
    pub(super) fn apply(self, bytes: Bytes) -> Bytes {
        if self == LineEnd::Lf {
            return bytes;
        }
        let mut out = Vec::with_capacity(bytes.len() + 8);
        for &b in bytes.iter() {
            if b == b'\n' {
                out.extend_from_slice(self.bytes());
            } else {
                out.push(b);
            }
        }
        Bytes::from(out)
    }
}

/// A fault spec that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    #[error("unknown fault knob `{0}` (known knobs: {known})", known = KNOBS.join(", "))]
    UnknownKnob(String),
    #[error("invalid value `{value}` for fault knob `{knob}`: {reason}")]
    BadValue { knob: String, value: String, reason: &'static str },
}

fn bad_value(knob: &str, value: impl ToString, reason: &'static str) -> FaultError {
    FaultError::BadValue { knob: knob.to_owned(), value: value.to_string(), reason }
}

/// Parses `k=v,k2=v2` (flags may omit `=true`; blanks are ignored).
///
/// # Errors
/// An unknown knob, a missing or unparsable value, or a value out of range.
pub fn parse_faults(spec: &str) -> Result<Faults, FaultError> {
    let mut faults = Faults::default();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once('=') {
            Some((knob, value)) => faults.set(knob.trim(), Some(value.trim()))?,
            None => faults.set(item, None)?,
        }
    }
    faults.validate()?;
    Ok(faults)
}

impl Faults {
    /// `self` overridden by every knob that is set in `over`.
    #[must_use]
    pub fn merged(&self, over: &Faults) -> Faults {
        Faults {
            headers_delay_ms: over.headers_delay_ms.or(self.headers_delay_ms),
            first_token_delay_ms: over.first_token_delay_ms.or(self.first_token_delay_ms),
            chunk_delay_ms: over.chunk_delay_ms.or(self.chunk_delay_ms),
            end_delay_ms: over.end_delay_ms.or(self.end_delay_ms),
            stall_after: over.stall_after.or(self.stall_after),
            cut_after: over.cut_after.or(self.cut_after),
            malformed_at: over.malformed_at.or(self.malformed_at),
            malformed_run: over.malformed_run.or(self.malformed_run),
            malformed_end: over.malformed_end.or(self.malformed_end),
            no_done: over.no_done.or(self.no_done),
            status: over.status.or(self.status),
            retry_after: over.retry_after.or(self.retry_after),
            error_code: over.error_code.clone().or_else(|| self.error_code.clone()),
            fail_times: over.fail_times.or(self.fail_times),
            never_answer: over.never_answer.or(self.never_answer),
            exit: over.exit.or(self.exit),
            words: over.words.or(self.words),
            hold: over.hold.clone().or_else(|| self.hold.clone()),
            context_window: over.context_window.or(self.context_window),
            sse_line_end: over.sse_line_end.or(self.sse_line_end),
            echo_auth: over.echo_auth.or(self.echo_auth),
            set_cookie: over.set_cookie.or(self.set_cookie),
            repeat_prefill: over.repeat_prefill.or(self.repeat_prefill),
            text_only: over.text_only.or(self.text_only),
        }
    }

    /// Checks value ranges that the types alone do not express.
    ///
    /// # Errors
    /// `status` outside 400..=599, `malformed_at=0` or `malformed_run=0`.
    pub fn validate(&self) -> Result<(), FaultError> {
        if let Some(code) = self.status
            && !(400..=599).contains(&code)
        {
            return Err(bad_value("status", code, "expected an HTTP error status in 400..=599"));
        }
        if self.malformed_at == Some(0) {
            return Err(bad_value("malformed_at", 0, "chunks are numbered from 1"));
        }
        if self.malformed_run == Some(0) {
            return Err(bad_value("malformed_run", 0, "a run has at least one chunk"));
        }
        Ok(())
    }

    fn set(&mut self, knob: &str, value: Option<&str>) -> Result<(), FaultError> {
        match knob {
            "headers_delay_ms" => self.headers_delay_ms = Some(number(knob, value)?),
            "first_token_delay_ms" => self.first_token_delay_ms = Some(number(knob, value)?),
            "chunk_delay_ms" => self.chunk_delay_ms = Some(number(knob, value)?),
            "end_delay_ms" => self.end_delay_ms = Some(number(knob, value)?),
            "stall_after" => self.stall_after = Some(number(knob, value)?),
            "cut_after" => self.cut_after = Some(number(knob, value)?),
            "malformed_at" => self.malformed_at = Some(number(knob, value)?),
            "malformed_run" => self.malformed_run = Some(number(knob, value)?),
            "malformed_end" => self.malformed_end = Some(flag(knob, value)?),
            "no_done" => self.no_done = Some(flag(knob, value)?),
            "status" => self.status = Some(number(knob, value)?),
            "retry_after" => self.retry_after = Some(number(knob, value)?),
            "fail_times" => self.fail_times = Some(number(knob, value)?),
            "never_answer" => self.never_answer = Some(flag(knob, value)?),
            "exit" => self.exit = Some(flag(knob, value)?),
            "echo_auth" => self.echo_auth = Some(flag(knob, value)?),
            "set_cookie" => self.set_cookie = Some(flag(knob, value)?),
            "repeat_prefill" => self.repeat_prefill = Some(flag(knob, value)?),
            "text_only" => self.text_only = Some(flag(knob, value)?),
            "words" => self.words = Some(number(knob, value)?),
            "context_window" => self.context_window = Some(number(knob, value)?),
            "sse_line_end" => {
                let end = value.and_then(|v| <LineEnd as clap::ValueEnum>::from_str(v, true).ok());
                self.sse_line_end =
                    Some(end.ok_or_else(|| bad_value(knob, value.unwrap_or(""), "expected lf, crlf or cr"))?);
            }
            "error_code" => {
                let code =
                    value.filter(|v| !v.is_empty()).ok_or_else(|| bad_value(knob, "", "expected `error_code=CODE`"))?;
                self.error_code = Some(code.to_owned());
            }
            "hold" => {
                let name =
                    value.filter(|v| !v.is_empty()).ok_or_else(|| bad_value(knob, "", "expected `hold=NAME`"))?;
                self.hold = Some(name.to_owned());
            }
            _ => return Err(FaultError::UnknownKnob(knob.to_owned())),
        }
        Ok(())
    }
}

impl Faults {
    /// Whether the `n`th (1-based) content chunk is sent as invalid JSON.
    pub(super) fn malformed(&self, n: usize) -> bool {
        if self.malformed_at.is_none() && self.malformed_run.is_none() {
            return false;
        }
        let at = self.malformed_at.unwrap_or(1);
        (at..at.saturating_add(self.malformed_run.unwrap_or(1))).contains(&n)
    }

    /// Whether any malformed knob is set (a whole body is then invalid).
    pub(super) fn any_malformed(&self) -> bool {
        self.malformed_at.is_some() || self.malformed_run.is_some() || on(self.malformed_end)
    }
}

/// Whether a flag knob is on.
pub(super) fn on(flag: Option<bool>) -> bool {
    flag == Some(true)
}

fn number<T: FromStr>(knob: &str, value: Option<&str>) -> Result<T, FaultError> {
    let value = value.ok_or_else(|| bad_value(knob, "", "expected `knob=NUMBER`"))?;
    value.parse().map_err(|_| bad_value(knob, value, "expected a non-negative integer"))
}

fn flag(knob: &str, value: Option<&str>) -> Result<bool, FaultError> {
    match value {
        None | Some("" | "true" | "1") => Ok(true),
        Some("false" | "0") => Ok(false),
        Some(other) => Err(bad_value(knob, other, "expected true or false")),
    }
}

/// Effective knobs for one request: defaults < model suffix < header.
pub(super) fn request_faults(defaults: &Faults, model: &str, headers: &HeaderMap) -> Result<Faults, String> {
    let mut faults = defaults.clone();
    if let Some(spec) = model.strip_prefix(base_model(model)).and_then(|rest| rest.strip_prefix('@')) {
        let over = parse_faults(spec).map_err(|e| format!("model `{model}`: {e}"))?;
        faults = faults.merged(&over);
    }
    for value in headers.get_all(FAULTS_HEADER) {
        let spec = value.to_str().map_err(|_| format!("{FAULTS_HEADER} header is not valid UTF-8"))?;
        let over = parse_faults(spec).map_err(|e| format!("{FAULTS_HEADER} header: {e}"))?;
        faults = faults.merged(&over);
    }
    Ok(faults)
}

/// Whether the mock's model `model` (with its `@knobs`) reads images under
/// the fault `defaults`, as its metadata endpoints say (Ollama's
/// `capabilities`, LM Studio's `type`, llama.cpp's `modalities`): not when
/// it is `text_only` (a knob of its name, or the default) or its base name
/// starts with `text`. Its chat endpoints still answer it.
pub(super) fn reads_images(defaults: &Faults, model: &str) -> bool {
    let text_only = request_faults(defaults, model, &HeaderMap::new()).is_ok_and(|f| on(f.text_only));
    !text_only && !base_model(model).starts_with("text")
}

pub(super) async fn sleep_ms(ms: Option<u64>) {
    if let Some(ms) = ms.filter(|ms| *ms > 0) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

#[cfg(test)]
mod tests;
