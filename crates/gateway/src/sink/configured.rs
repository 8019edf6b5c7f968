//! A `[[route]]`'s sink as its settings describe it: the one place that builds one, at start
//! and on a reload.

use std::sync::Arc;

use oncegate_config::{Config, RouteConfig, SinkKind};

#[cfg(feature = "http-sink")]
use crate::HttpSink;
use crate::{GatewayError, LinesSink, SharedSink};

/// The sink `route` describes.
pub(crate) async fn of_route(route: &RouteConfig) -> Result<SharedSink, GatewayError> {
    Ok(match route.sink {
        SinkKind::Http => http_sink(route)?,
        SinkKind::Kafka => kafka_sink(route)?,
        SinkKind::Stdout => Arc::new(LinesSink::stdout()),
        SinkKind::File => {
            let path = route
                .path
                .as_deref()
                .ok_or_else(|| GatewayError::Config("a file route needs a path".into()))?;
            Arc::new(LinesSink::file(path).await?)
        }
    })
}

/// An `http` route's sink, signed as its secrets and key say.
#[cfg(feature = "http-sink")]
fn http_sink(route: &RouteConfig) -> Result<SharedSink, GatewayError> {
    let url = route
        .url
        .as_deref()
        .ok_or_else(|| GatewayError::Config("an http route needs a url".into()))?;
    let previous = route
        .previous_secrets
        .iter()
        .map(|secret| {
            secret.resolve().map_err(|message| {
                GatewayError::Config(format!("route previous_secrets: {message}"))
            })
        })
        .collect::<Result<Vec<String>, GatewayError>>()?;
    let previous: Vec<&str> = previous.iter().map(String::as_str).collect();
    let sink = HttpSink::new(
        url,
        resolve(&route.secret, "route secret")?.as_deref(),
        route.timeout,
    )?
    .with_previous_secrets(&previous)?
    .with_signing_key_opt(resolve(&route.signing_key, "route signing_key")?.as_deref())?;
    if let Some(public_key) = sink.public_key() {
        tracing::info!(events = ?route.events, %public_key, "the route signs every delivery with v1a too: receivers verify with this public key");
    }
    Ok(Arc::new(sink))
}

/// A build without the HTTP sink refuses `http` routes.
#[cfg(not(feature = "http-sink"))]
fn http_sink(_: &RouteConfig) -> Result<SharedSink, GatewayError> {
    Err(GatewayError::Config(
        "sink = \"http\" needs the `http-sink` feature of oncegate-gateway, which this build \
         leaves out (the oncegate binary has it)"
            .into(),
    ))
}

/// A `kafka` route's producer.
#[cfg(feature = "kafka")]
fn kafka_sink(route: &RouteConfig) -> Result<SharedSink, GatewayError> {
    let needed = |value: &Option<String>, what: &str| {
        value
            .clone()
            .ok_or_else(|| GatewayError::Config(format!("a kafka route needs {what}")))
    };
    let settings = route
        .kafka
        .iter()
        .map(|(name, value)| {
            value
                .resolve()
                .map(|value| (name.clone(), value))
                .map_err(|message| GatewayError::Config(format!("route kafka.{name}: {message}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sink = crate::KafkaSink::new(
        &needed(&route.brokers, "brokers")?,
        &needed(&route.topic, "a topic")?,
        &settings,
        route.timeout,
    )?;
    Ok(Arc::new(sink))
}

/// A build without the Kafka sink refuses `kafka` routes.
#[cfg(not(feature = "kafka"))]
fn kafka_sink(_: &RouteConfig) -> Result<SharedSink, GatewayError> {
    Err(GatewayError::Config(KAFKA_LEFT_OUT.into()))
}

/// Why a build without the Kafka sink refuses `kafka` routes.
#[cfg(not(feature = "kafka"))]
pub(crate) const KAFKA_LEFT_OUT: &str = "sink = \"kafka\" needs the `kafka` feature, which this \
     build leaves out (librdkafka is a C build): cargo install --features kafka, or build with \
     --features kafka";

/// What `config` asks of this build that its features leave out, each an error naming the
/// setting and the feature: `serve` refuses these, and `check-config` (which validates the file
/// alone, `oncegate_config::validate`) says them before a deployment meets them.
pub fn left_out(config: &Config) -> Vec<oncegate_config::Problem> {
    let mut found = Vec::new();
    for (i, route) in config.routes.iter().enumerate() {
        if route.sink != SinkKind::Kafka {
            continue;
        }
        #[cfg(not(feature = "kafka"))]
        found.push(oncegate_config::Problem {
            severity: oncegate_config::Severity::Error,
            setting: format!("route[{i}].sink"),
            message: KAFKA_LEFT_OUT.into(),
        });
        #[cfg(all(feature = "kafka", not(feature = "kafka-tls")))]
        if route.kafka_needs_tls() {
            found.push(oncegate_config::Problem {
                severity: oncegate_config::Severity::Error,
                setting: format!("route[{i}].kafka"),
                message: "TLS to the brokers and SASL/SCRAM need the `kafka-tls` feature, \
                          which this build leaves out (it links the system's OpenSSL): build \
                          with --features kafka-tls"
                    .into(),
            });
        }
        #[cfg(feature = "kafka-tls")]
        let _ = (i, route);
    }
    found
}

/// A configured secret's value, if set (never empty: resolution refuses that), its errors
/// naming `setting`.
pub(crate) fn resolve(
    secret: &Option<oncegate_config::Secret>,
    setting: &str,
) -> Result<Option<String>, GatewayError> {
    secret
        .as_ref()
        .map(|s| {
            s.resolve()
                .map_err(|message| GatewayError::Config(format!("{setting}: {message}")))
        })
        .transpose()
}
