//! A gateway as a configuration describes it: sources with their secrets, routes with their
//! sinks, the API's callers and senders, the spool and the long connections.

use std::sync::Arc;

use oncegate_config::Config;
use oncegate_core::Store;

#[cfg(feature = "long-connection")]
use crate::ingress;
use crate::{Gateway, GatewayError, GatewayParts, api, base, registry};

impl<S: Store> Gateway<S> {
    /// Builds the gateway a configuration describes, on `store`.
    pub async fn from_config(config: &Config, store: S) -> Result<Self, GatewayError> {
        // A build without long connections refuses such a source here.
        let long_sources = config
            .sources
            .iter()
            .filter(|source| registry::is_long_connection(source))
            .map(registry::long_connection)
            .collect::<Result<Vec<_>, GatewayError>>()?;
        let parts = GatewayParts {
            admin_token: crate::sink::configured::resolve(
                &config.server.admin_token,
                "server.admin_token",
            )?,
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
        shared
            .at_risk
            .store(Arc::new(crate::reload::at_risk(config)));
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
        {
            shared.api.send_timeout = config.api.send_timeout;
            shared.api.max_waiting_sends = config.api.max_waiting_sends;
        }
        // Sources, senders and routes: what a reload builds again.
        let dynamic = crate::reload::build::build(config, shared, false).await?;
        crate::reload::build::install(shared, dynamic);
        #[cfg(all(feature = "send", feature = "long-connection"))]
        add_connection_senders(shared);
        *shared
            .reload
            .config
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(config.clone());
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

/// A long connection that carries its sends (an AI bot's) sends through the gateway that holds
/// it: its sender is the connection's (static, as the connection is).
#[cfg(all(feature = "send", feature = "long-connection"))]
fn add_connection_senders<S: Store>(shared: &mut crate::Shared<base::timed_store::Timed<S>>) {
    let senders: Vec<_> = shared
        .ingress
        .long_sources
        .iter_mut()
        .filter_map(|source| Some((source.name.clone(), source.sender.take()?)))
        .collect();
    for (name, sender) in senders {
        shared.api.add_sender(name, sender);
    }
}
