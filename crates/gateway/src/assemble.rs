//! A gateway as a configuration describes it: sources with their secrets, routes with their
//! sinks, the API's callers and senders, the spool and the long connections.

use std::sync::Arc;

use oncegate_config::{Config, SinkKind};
use oncegate_core::Store;

#[cfg(feature = "http-sink")]
use crate::HttpSink;
#[cfg(feature = "long-connection")]
use crate::ingress;
use crate::{
    Gateway, GatewayError, GatewayParts, LinesSink, SharedSink, StaleEvents, api, base, registry,
};

impl<S: Store> Gateway<S> {
    /// Builds the gateway a configuration describes, on `store`.
    pub async fn from_config(config: &Config, store: S) -> Result<Self, GatewayError> {
        let sources = config
            .sources
            .iter()
            .filter(|source| !registry::is_long_connection(source))
            .map(|source| Ok((source.name.clone(), registry::source(source)?)))
            .collect::<Result<Vec<_>, GatewayError>>()?;
        // A build without long connections refuses such a source here.
        let long_sources = config
            .sources
            .iter()
            .filter(|source| registry::is_long_connection(source))
            .map(registry::long_connection)
            .collect::<Result<Vec<_>, GatewayError>>()?;
        let parts = GatewayParts {
            sources,
            admin_token: resolve(&config.server.admin_token, "server.admin_token")?,
            ..GatewayParts::of(config)
        };
        let callers = config
            .api
            .callers
            .iter()
            .map(|caller| {
                let token = caller.token.resolve().map_err(|message| {
                    GatewayError::Config(format!("api.caller {:?} token: {message}", caller.name))
                })?;
                let mut api_caller =
                    api::callers::Caller::new(&caller.name, &caller.namespace, &token);
                api_caller.sends_per_second = caller.sends_per_second;
                api_caller.results = api::results::ResultBudget::new(
                    caller.results_max.unwrap_or(api::results::DEFAULT_RESULTS),
                    caller
                        .result_bytes_max
                        .unwrap_or(api::results::DEFAULT_RESULT_BYTES),
                );
                Ok(api_caller)
            })
            .collect::<Result<Vec<_>, GatewayError>>()?;
        let mut gateway = Self::new(store, parts);
        let shared = gateway.shared_mut()?;
        if let Some(settings) = config.store.encryption() {
            let at_rest =
                Arc::new(base::at_rest::AtRest::new(settings).map_err(GatewayError::Config)?);
            base::at_rest::verify(&at_rest, &shared.store.inner)
                .await
                .map_err(GatewayError::Config)?;
            shared.store.seal_with(at_rest.clone());
            shared.at_rest = Some(at_rest);
        }
        hold_long_connections(shared, long_sources);
        // The checks that said it at start and in check-config are the one place that knows.
        shared.at_risk = oncegate_config::validate(config)
            .into_iter()
            .filter(|problem| problem.severity == oncegate_config::Severity::AtRisk)
            .map(|problem| format!("{}: {}", problem.setting, problem.message))
            .collect();
        // What each caller's results keep of the store, as the ledger says (a restart forgets
        // nothing): read before the first request.
        for caller in &callers {
            match caller
                .results
                .load(&*shared.store, &caller.name, shared.now_ms())
                .await
            {
                Ok(()) | Err(oncegate_core::StoreError::Invalid(_)) => {}
                Err(error) => {
                    tracing::warn!(caller = %caller.name, %error, "the /keys results ledger could not be read: this caller's result budget counts from now")
                }
            }
        }
        shared.api.callers = callers;
        shared.api.key_limits = api::callers::KeyLimits {
            max_lease: config.api.max_lease,
            max_wait: config.api.max_wait,
        };
        #[cfg(feature = "send")]
        add_senders(shared, config)?;
        for route in &config.routes {
            let sink: SharedSink = match route.sink {
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
            };
            let patterns: Vec<&str> = route.events.iter().map(String::as_str).collect();
            let stale = if route.watermark {
                StaleEvents::Drop
            } else {
                StaleEvents::Deliver
            };
            gateway = if route.reply {
                gateway.replying_route(&patterns, sink)?
            } else {
                let retries = crate::Retries {
                    schedule: route.retry_schedule.as_ref().map(|s| s.0.clone()),
                    hold_chat: route.hold_chat,
                };
                gateway.retrying_route(&patterns, sink, stale, retries)?
            };
            if !route.tenants.is_empty() || !route.agents.is_empty() {
                let tenants: Vec<&str> = route.tenants.iter().map(String::as_str).collect();
                let agents: Vec<&str> = route.agents.iter().map(String::as_str).collect();
                gateway = gateway.owned_by(&tenants, &agents)?;
            }
        }
        Ok(gateway)
    }
}

/// Holds `long_sources` (this build has long connections).
#[cfg(feature = "long-connection")]
fn hold_long_connections<S: Store>(
    shared: &mut crate::Shared<base::timed_store::Timed<S>>,
    long_sources: Vec<ingress::longconn::LongSource>,
) {
    shared.ingress.long_sources = long_sources;
}

/// Nothing to hold: a build without long connections refused every such source before.
#[cfg(not(feature = "long-connection"))]
fn hold_long_connections<S: Store>(
    _: &mut crate::Shared<base::timed_store::Timed<S>>,
    long_sources: Vec<std::convert::Infallible>,
) {
    drop(long_sources);
}

/// What `/send/<source>` sends as: each app with its API secret, and each AI bot over its
/// connection (through the gateway that holds it).
#[cfg(feature = "send")]
fn add_senders<S: Store>(
    shared: &mut crate::Shared<base::timed_store::Timed<S>>,
    config: &Config,
) -> Result<(), GatewayError> {
    shared.api.send_timeout = config.api.send_timeout;
    shared.api.max_waiting_sends = config.api.max_waiting_sends;
    for source in &config.sources {
        if let Some(sender) = registry::sender(source, config.api.send_timeout)? {
            shared.api.senders.insert(source.name.clone(), sender);
        }
        // A suite sends as each of its corps, a store app as each of its tenants, with
        // credentials kept in the store.
        if let Some(keeper) = keeper(source, &shared.store, config.api.send_timeout)? {
            shared.api.keepers.insert(source.name.clone(), keeper);
        }
    }
    // An AI bot sends over its connection, through the gateway that holds it.
    #[cfg(feature = "long-connection")]
    for source in &shared.ingress.long_sources {
        if let ingress::longconn::Link::AiBot { bot, outbound, .. } = &source.link {
            let api = oncegate_send::Api::AiBot(oncegate_send::AiBotApi::new(outbound.clone()));
            let scope = bot.bot_id().to_owned();
            shared
                .api
                .senders
                .insert(source.name.clone(), api::send::Sender { api, scope });
        }
    }
    Ok(())
}

/// The keeper of a multi-tenant source's credentials (a WeCom suite, a Feishu store app) with
/// the secret it needs; `None` for any other source.
#[cfg(feature = "send")]
fn keeper<S: Store>(
    source: &oncegate_config::SourceConfig,
    store: &std::sync::Arc<base::timed_store::Timed<S>>,
    timeout: std::time::Duration,
) -> Result<Option<crate::credentials::Keeper>, GatewayError> {
    use crate::credentials::Keeper;
    use oncegate_config::PlatformConfig;
    use std::sync::Arc;
    let _ = (store, timeout);
    Ok(match &source.platform {
        #[cfg(feature = "wecom")]
        PlatformConfig::WecomSuite(settings) => {
            registry::wecom::suite_api(source, settings, timeout)?.map(|api| {
                let keeper = crate::credentials::suite::SuiteKeeper::new(
                    &source.name,
                    api,
                    store.clone(),
                    timeout,
                );
                Keeper::Suite(Arc::new(keeper))
            })
        }
        #[cfg(feature = "feishu")]
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            registry::feishu::store_api(source, settings, timeout)?.map(|api| {
                let keeper = crate::credentials::store_app::StoreAppKeeper::new(
                    &source.name,
                    api,
                    store.clone(),
                );
                Keeper::StoreApp(Arc::new(keeper))
            })
        }
        _ => None,
    })
}

/// An `http` route's sink, signed as its secrets and key say.
#[cfg(feature = "http-sink")]
fn http_sink(route: &oncegate_config::RouteConfig) -> Result<SharedSink, GatewayError> {
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
fn http_sink(_: &oncegate_config::RouteConfig) -> Result<SharedSink, GatewayError> {
    Err(GatewayError::Config(
        "sink = \"http\" needs the `http-sink` feature of oncegate-gateway, which this build \
         leaves out (the oncegate binary has it)"
            .into(),
    ))
}

/// A `kafka` route's producer.
#[cfg(feature = "kafka")]
fn kafka_sink(route: &oncegate_config::RouteConfig) -> Result<SharedSink, GatewayError> {
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
fn kafka_sink(_: &oncegate_config::RouteConfig) -> Result<SharedSink, GatewayError> {
    Err(GatewayError::Config(KAFKA_LEFT_OUT.into()))
}

#[cfg(not(feature = "kafka"))]
const KAFKA_LEFT_OUT: &str = "sink = \"kafka\" needs the `kafka` feature, which this build \
     leaves out (librdkafka is a C build): cargo install --features kafka, or build with \
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

/// A configured secret's value, if set (never empty: resolution refuses that).
fn resolve(
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
