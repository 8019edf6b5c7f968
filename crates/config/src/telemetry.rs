//! `[telemetry]`: where traces go.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checks::{Severity, plain_http_off_host};
use crate::duration;
use crate::*;

/// `[telemetry]`: one trace per event (callback, queue, each delivery) and a span per API
/// call, exported as OTLP over HTTP (protobuf). Off unless `otlp_endpoint` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP traces endpoint, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the spans.
    pub service_name: String,
    /// The share of events traced (0 to 1], chosen by their key, so that every gateway traces
    /// the same events whole; 1 traces all.
    pub sample_ratio: f64,
    /// The longest one export may take.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "oncegate".into(),
            sample_ratio: 1.0,
            timeout: Duration::from_secs(10),
        }
    }
}

/// `[telemetry]`.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let telemetry = &config.telemetry;
    if telemetry.service_name.trim().is_empty() {
        report(
            Severity::Error,
            "telemetry.service_name",
            "name the service the spans come from, e.g. \"oncegate\"".into(),
        );
    }
    if !(telemetry.sample_ratio > 0.0 && telemetry.sample_ratio <= 1.0) {
        report(
            Severity::Error,
            "telemetry.sample_ratio",
            format!(
                "{} is not a share of events: use a number above 0 and at most 1 (0.1 traces one \
                 event in ten); to trace nothing, leave otlp_endpoint out",
                telemetry.sample_ratio
            ),
        );
    }
    let Some(endpoint) = &telemetry.otlp_endpoint else {
        return;
    };
    if endpoint.starts_with("https://") {
        report(
            Severity::Error,
            "telemetry.otlp_endpoint",
            "this build exports over plain HTTP only: run the collector (or its agent) beside \
             the gateway and point otlp_endpoint at it on loopback, e.g. \
             \"http://127.0.0.1:4318/v1/traces\""
                .into(),
        );
    } else if !endpoint.starts_with("http://") {
        report(
            Severity::Error,
            "telemetry.otlp_endpoint",
            "an OTLP/HTTP endpoint is an http:// URL, e.g. \"http://127.0.0.1:4318/v1/traces\""
                .into(),
        );
    } else if plain_http_off_host(endpoint) {
        report(
            Severity::AtRisk,
            "telemetry.otlp_endpoint",
            "spans (event ids, event types, chat partitions; never payloads or secrets) travel \
             unencrypted to another host: prefer a collector agent on loopback"
                .into(),
        );
    }
    if telemetry.timeout.is_zero() {
        report(
            Severity::Error,
            "telemetry.timeout",
            "a zero timeout fails every export".into(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(toml_text: &str) -> Vec<(Severity, String)> {
        let config: Config = toml::from_str(toml_text).expect("config");
        let mut found = Vec::new();
        check(&config, &mut |severity, field, _| {
            found.push((severity, field.to_owned()))
        });
        found
    }

    #[test]
    fn an_otlp_endpoint_is_plain_http_on_loopback_or_said_to_be_off_host() {
        assert_eq!(problems(""), []);
        assert_eq!(
            problems("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/v1/traces\""),
            []
        );
        let field = "telemetry.otlp_endpoint".to_owned();
        assert_eq!(
            problems("[telemetry]\notlp_endpoint = \"http://collector:4318/v1/traces\""),
            [(Severity::AtRisk, field.clone())]
        );
        assert_eq!(
            problems("[telemetry]\notlp_endpoint = \"https://collector/v1/traces\""),
            [(Severity::Error, field.clone())]
        );
        assert_eq!(
            problems("[telemetry]\notlp_endpoint = \"collector:4317\""),
            [(Severity::Error, field)]
        );
        assert_eq!(
            problems("[telemetry]\nsample_ratio = 0.0"),
            [(Severity::Error, "telemetry.sample_ratio".to_owned())]
        );
        assert_eq!(problems("[telemetry]\nsample_ratio = 0.05"), []);
        assert_eq!(
            problems("[telemetry]\nservice_name = \" \""),
            [(Severity::Error, "telemetry.service_name".to_owned())]
        );
    }
}
