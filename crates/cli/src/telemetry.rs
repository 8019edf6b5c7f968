//! `[telemetry]`: the OTLP exporter the gateway's spans go to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use oncegate_config::TelemetryConfig;
use oncegate_gateway::Traces;
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

/// How long stopping waits for the last spans: a collector that hangs must not hold the
/// gateway's exit (a supervisor's grace period is spent on the events, not on traces).
const LAST_SPANS: Duration = Duration::from_secs(1);

/// The exporter while it runs: stopping it sends what is still batched.
pub(crate) struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// Sends the spans still batched (within [`LAST_SPANS`]) and stops.
    pub(crate) fn stop(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(LAST_SPANS) {
            tracing::warn!(%error, "the last spans could not be exported within {LAST_SPANS:?}");
        }
    }
}

/// An exporter whose failures are counted (`oncegate_trace_export_failures_total`) and said
/// (a WARN at most once a minute, with how many failed since): a collector that refuses or
/// is unreachable is never silent.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    failed_since_said: AtomicU64,
    said_at_secs: AtomicU64,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => metrics::counter!("oncegate_trace_spans_exported_total").increment(spans),
            Err(error) => {
                metrics::counter!("oncegate_trace_export_failures_total").increment(1);
                metrics::counter!("oncegate_trace_spans_dropped_total").increment(spans);
                let failed = self.failed_since_said.fetch_add(1, Ordering::Relaxed) + 1;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                let said = self.said_at_secs.load(Ordering::Relaxed);
                if now >= said + 60
                    && self
                        .said_at_secs
                        .compare_exchange(said, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    self.failed_since_said.store(0, Ordering::Relaxed);
                    tracing::warn!(%error, failed, "spans could not be exported to telemetry.otlp_endpoint (counted in oncegate_trace_export_failures_total); they are dropped, events are not");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The gateway's spans, exported as `config` says; `None` when traces are off.
pub(crate) fn start(config: &TelemetryConfig) -> anyhow::Result<Option<(Traces, Exporting)>> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint.clone())
        .with_timeout(config.timeout)
        .build()
        .context("start the OTLP exporter (telemetry.otlp_endpoint)")?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Counted {
            inner: exporter,
            failed_since_said: AtomicU64::new(0),
            said_at_secs: AtomicU64::new(0),
        })
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("oncegate");
    for name in [
        "oncegate_trace_export_failures_total",
        "oncegate_trace_spans_dropped_total",
        "oncegate_trace_spans_exported_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    tracing::info!(endpoint = %oncegate_core::redact::url(endpoint), share = config.sample_ratio, "traces: one per event (its id is the event's key), exported over OTLP/HTTP");
    let traces = Traces::new(opentelemetry::global::BoxedTracer::new(Box::new(tracer)))
        .sampled(config.sample_ratio);
    Ok(Some((traces, Exporting { provider })))
}
