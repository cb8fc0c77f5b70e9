//! The batched OTLP/HTTP exporter: finished spans go into a bounded queue
//! (a full queue drops the span, counted, never blocks a request); one
//! task sends them as `ExportTraceServiceRequest` protobuf to
//! `<endpoint>/v1/traces` every schedule delay or as soon as a batch is
//! full, and flushes what is left when asked to stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prost::Message;
use tokio::sync::{mpsc, oneshot};

use crate::otlp;
use crate::{Kind, SpanData, Tracer, Value, unix_nanos};

/// Spans waiting for export; past this, new spans are dropped.
pub const QUEUE_CAPACITY: usize = 2048;
/// Spans per export request.
pub const MAX_BATCH: usize = 512;
/// The default schedule delay (OpenTelemetry's `OTEL_BSP_SCHEDULE_DELAY`).
pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_secs(5);
/// Bound of one export request.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the exporter needs.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// The collector's base URL (`telemetry.otlp_endpoint`).
    pub endpoint: String,
    /// `service.name` of every span (`iop-edge`, `iop-node`).
    pub service_name: &'static str,
    pub service_version: &'static str,
    /// At most this long between a span's end and its export.
    pub schedule_delay: Duration,
}

impl ExporterConfig {
    /// The config for `endpoint`, with the schedule delay from the standard
    /// `OTEL_BSP_SCHEDULE_DELAY` (milliseconds) when it is set and valid.
    pub fn from_env(endpoint: &str, service_name: &'static str, service_version: &'static str) -> Self {
        let delay = std::env::var("OTEL_BSP_SCHEDULE_DELAY").ok();
        Self {
            endpoint: endpoint.to_string(),
            service_name,
            service_version,
            schedule_delay: schedule_delay(delay.as_deref()),
        }
    }
}

/// `OTEL_BSP_SCHEDULE_DELAY` (milliseconds, 1 to 60000), else the default. Pure.
pub fn schedule_delay(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| (1..=60_000).contains(ms))
        .map_or(DEFAULT_SCHEDULE_DELAY, Duration::from_millis)
}

/// `<endpoint>/v1/traces` (OTLP/HTTP's signal path). Pure.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// The sending side of the queue, shared by every span of a tracer.
pub(crate) struct Sink {
    pub(crate) queue: mpsc::Sender<(SpanData, SystemTime)>,
    pub(crate) dropped: Arc<AtomicU64>,
}

impl Sink {
    pub(crate) fn push(&self, span: SpanData, end: SystemTime) {
        if self.queue.try_send((span, end)).is_err() && self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!("trace export queue full or stopped: spans are being dropped");
        }
    }
}

/// The running exporter: stop it with [`Exporter::shutdown`] so that the
/// last spans are sent.
pub struct Exporter {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    pub(crate) dropped: Arc<AtomicU64>,
}

impl Exporter {
    /// The tracer of a process whose config names `endpoint`
    /// (`telemetry.otlp_endpoint`) and, when it names one, the exporter
    /// feeding it; with none, tracing is off and nothing runs.
    pub fn for_endpoint(
        endpoint: Option<&str>,
        service_name: &'static str,
        service_version: &'static str,
    ) -> (Tracer, Option<Exporter>) {
        match endpoint {
            Some(endpoint) => {
                let (tracer, exporter) = Self::start(ExporterConfig::from_env(endpoint, service_name, service_version));
                (tracer, Some(exporter))
            }
            None => (Tracer::off(), None),
        }
    }

    /// Starts the export task (on the current Tokio runtime) and returns
    /// the tracer that feeds it.
    pub fn start(config: ExporterConfig) -> (Tracer, Exporter) {
        let (queue, spans) = mpsc::channel(QUEUE_CAPACITY);
        let dropped = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = oneshot::channel();
        // reqwest panics without a process-wide crypto provider: IOP's
        // (ring), as the binaries install it (a no-op when one is set).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = match reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build() {
            Ok(http) => http,
            Err(error) => {
                tracing::warn!(error = %error, "trace export off: no HTTP client");
                let task = tokio::spawn(async {});
                return (Tracer::off(), Exporter { stop: None, task, dropped });
            }
        };
        let task = tokio::spawn(run(config, http, spans, stopped));
        let sink = Arc::new(Sink { queue, dropped: dropped.clone() });
        (Tracer { exporter: Some(sink) }, Exporter { stop: Some(stop), task, dropped })
    }

    /// Sends what is queued and stops, within `bound`. Spans ending later
    /// are dropped.
    pub async fn shutdown(mut self, bound: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(bound, &mut self.task).await.is_err() {
            tracing::warn!("trace export did not finish within its shutdown bound");
            self.task.abort();
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(dropped, "spans were dropped (export queue full)");
        }
    }
}

async fn run(
    config: ExporterConfig,
    http: reqwest::Client,
    mut spans: mpsc::Receiver<(SpanData, SystemTime)>,
    mut stopped: oneshot::Receiver<()>,
) {
    let url = traces_url(&config.endpoint);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut tick = tokio::time::interval(config.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            span = spans.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    if batch.len() >= MAX_BATCH {
                        send(&http, &url, &config, &mut batch).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => send(&http, &url, &config, &mut batch).await,
            _ = &mut stopped => break,
        }
    }
    // Flush: what is queued now, in batches.
    spans.close();
    while let Some(span) = spans.recv().await {
        batch.push(span);
        if batch.len() >= MAX_BATCH {
            send(&http, &url, &config, &mut batch).await;
        }
    }
    send(&http, &url, &config, &mut batch).await;
}

async fn send(http: &reqwest::Client, url: &str, config: &ExporterConfig, batch: &mut Vec<(SpanData, SystemTime)>) {
    if batch.is_empty() {
        return;
    }
    let body = encode(config, batch).encode_to_vec();
    let count = batch.len();
    batch.clear();
    let result = http.post(url).header("content-type", "application/x-protobuf").body(body).send().await;
    match result {
        Ok(response) if response.status().is_success() => {}
        Ok(response) => tracing::warn!(status = response.status().as_u16(), spans = count, "trace export refused"),
        // The error names the collector's URL (configured, not a secret).
        Err(error) => tracing::warn!(spans = count, error = %error, "trace export failed"),
    }
}

/// The export request for `spans`. Pure.
pub fn encode(config: &ExporterConfig, spans: &[(SpanData, SystemTime)]) -> otlp::ExportTraceServiceRequest {
    let resource = otlp::Resource {
        attributes: vec![
            key_value("service.name", &Value::Str(config.service_name.to_string())),
            key_value("service.version", &Value::Str(config.service_version.to_string())),
        ],
    };
    let scope = otlp::InstrumentationScope {
        name: config.service_name.to_string(),
        version: config.service_version.to_string(),
    };
    otlp::ExportTraceServiceRequest {
        resource_spans: vec![otlp::ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![otlp::ScopeSpans {
                scope: Some(scope),
                spans: spans.iter().map(|(span, end)| encode_span(span, *end)).collect(),
            }],
        }],
    }
}

fn encode_span(span: &SpanData, end: SystemTime) -> otlp::Span {
    let mut flags = otlp::FLAGS_HAS_REMOTE_KNOWN;
    if span.context.sampled {
        flags |= otlp::FLAGS_SAMPLED;
    }
    if span.remote_parent {
        flags |= otlp::FLAGS_REMOTE_PARENT;
    }
    otlp::Span {
        trace_id: span.context.trace_id.to_vec(),
        span_id: span.context.span_id.to_vec(),
        parent_span_id: span.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: span.name.to_string(),
        kind: match span.kind {
            Kind::Internal => 1,
            Kind::Server => 2,
            Kind::Client => 3,
        },
        start_time_unix_nano: unix_nanos(span.start_wall),
        end_time_unix_nano: unix_nanos(end),
        attributes: span.attributes.iter().map(|(k, v)| key_value(k, v)).collect(),
        events: span
            .events
            .iter()
            .map(|(name, at)| otlp::Event {
                time_unix_nano: unix_nanos(*at),
                name: name.to_string(),
                attributes: vec![],
            })
            .collect(),
        status: Some(match &span.error {
            Some(code) => otlp::Status { message: code.clone(), code: 2 },
            None => otlp::Status { message: String::new(), code: 0 },
        }),
        flags,
    }
}

fn key_value(key: &str, value: &Value) -> otlp::KeyValue {
    use otlp::any_value::Value as V;
    let value = match value {
        Value::Str(s) => V::StringValue(s.clone()),
        Value::Int(i) => V::IntValue(*i),
        Value::Bool(b) => V::BoolValue(*b),
    };
    otlp::KeyValue { key: key.to_string(), value: Some(otlp::AnyValue { value: Some(value) }) }
}
