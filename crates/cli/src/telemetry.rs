//! `[telemetry]`: the OTLP exporter the gateway's spans go to.

use anyhow::Context;
use oncegate_config::TelemetryConfig;
use oncegate_gateway::Traces;
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The exporter while it runs: stopping it sends what is still batched.
pub(crate) struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// Sends the spans still batched (within the export timeout) and stops.
    pub(crate) fn stop(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the last spans could not be exported");
        }
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
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("oncegate");
    tracing::info!(endpoint = %oncegate_core::redact::url(endpoint), share = config.sample_ratio, "traces: one per event (its id is the event's key), exported over OTLP/HTTP");
    let traces = Traces::new(opentelemetry::global::BoxedTracer::new(Box::new(tracer)))
        .sampled(config.sample_ratio);
    Ok(Some((traces, Exporting { provider })))
}
