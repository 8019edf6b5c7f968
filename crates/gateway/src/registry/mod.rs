//! The one place that names platforms: a configured source becomes its platform's receiver
//! (and, for load generators, its sender). Each platform is a feature of this crate; a source
//! of a platform this build leaves out is refused with the feature to add.

#[cfg(feature = "dingtalk")]
mod dingtalk;
#[cfg(feature = "feishu")]
pub(crate) mod feishu;
mod first;
pub(crate) mod owner;
#[cfg(feature = "webhook")]
mod webhook;
#[cfg(feature = "wecom")]
pub(crate) mod wecom;

pub(crate) use first::{FirstByRoute, bot_ids};

use std::sync::Arc;

#[cfg(any(
    feature = "feishu",
    feature = "wecom",
    feature = "webhook",
    feature = "dingtalk"
))]
use oncegate_config::Secret;
use oncegate_config::{PlatformConfig, SourceConfig, Transport};
use oncegate_core::Sealer;

use crate::{GatewayError, SharedSource};

/// Resolves a secret of `source` (never empty: resolution refuses that).
#[cfg(any(
    feature = "feishu",
    feature = "wecom",
    feature = "webhook",
    feature = "dingtalk"
))]
fn resolve(
    source: &SourceConfig,
    secret: &Option<Secret>,
    field: &str,
) -> Result<Option<String>, GatewayError> {
    secret
        .as_ref()
        .map(|s| {
            s.resolve().map_err(|message| {
                GatewayError::Config(format!("source {:?} {field}: {message}", source.name))
            })
        })
        .transpose()
}

/// A secret `source` cannot go without.
#[cfg(any(feature = "wecom", feature = "dingtalk"))]
fn required(
    source: &SourceConfig,
    secret: &Option<Secret>,
    field: &str,
) -> Result<String, GatewayError> {
    resolve(source, secret, field)?
        .ok_or_else(|| GatewayError::Config(format!("source {:?} needs {field}", source.name)))
}

fn platform_error(source: &SourceConfig, error: impl std::fmt::Display) -> GatewayError {
    GatewayError::Config(format!("source {:?}: {error}", source.name))
}

/// A source this build cannot serve: it was compiled without `feature`.
#[allow(dead_code)]
fn not_built(source: &SourceConfig, feature: &str) -> GatewayError {
    platform_error(
        source,
        format!(
            "this build of oncegate-gateway leaves out the `{feature}` feature this source needs; \
             build with it (the oncegate binary has every feature)"
        ),
    )
}

/// One configured source's app, of whichever platform: the receiver and the sender.
enum App {
    #[cfg(feature = "feishu")]
    Feishu(oncegate_feishu::FeishuApp),
    #[cfg(feature = "wecom")]
    Wecom(oncegate_wecom::WecomApp),
    #[cfg(feature = "wecom")]
    Wechat(oncegate_wecom::WechatApp),
    #[cfg(feature = "wecom")]
    Suite(oncegate_wecom::WecomSuite),
    #[cfg(feature = "wecom")]
    Corps(oncegate_wecom::WecomCorps),
    #[cfg(feature = "webhook")]
    Webhook(Box<oncegate_webhook::WebhookApp>),
    #[cfg(feature = "dingtalk")]
    Dingtalk(oncegate_dingtalk::DingtalkApp),
}

/// The configured app of `source`.
fn app(source: &SourceConfig) -> Result<App, GatewayError> {
    match &source.platform {
        #[cfg(feature = "feishu")]
        PlatformConfig::Feishu(_) | PlatformConfig::Lark(_) => feishu::app(source).map(App::Feishu),
        #[cfg(feature = "wecom")]
        PlatformConfig::Wecom(settings) if settings.template => {
            Ok(App::Corps(oncegate_wecom::WecomCorps::new()))
        }
        #[cfg(feature = "wecom")]
        PlatformConfig::Wecom(settings) => wecom::wecom(source, settings).map(App::Wecom),
        #[cfg(feature = "wecom")]
        PlatformConfig::Wechat(settings) => wecom::wechat(source, settings).map(App::Wechat),
        #[cfg(feature = "wecom")]
        PlatformConfig::WecomSuite(settings) => wecom::suite(source, settings).map(App::Suite),
        #[cfg(feature = "webhook")]
        PlatformConfig::Webhook(settings) => {
            webhook::app(source, settings).map(|app| App::Webhook(Box::new(app)))
        }
        #[cfg(not(feature = "webhook"))]
        PlatformConfig::Webhook(_) => Err(not_built(source, "webhook")),
        #[cfg(feature = "dingtalk")]
        PlatformConfig::Dingtalk(settings) => dingtalk::app(source, settings).map(App::Dingtalk),
        #[cfg(not(feature = "dingtalk"))]
        PlatformConfig::Dingtalk(_) => Err(not_built(source, "dingtalk")),
        PlatformConfig::WecomAibot(_) => Err(platform_error(
            source,
            "a WeCom AI bot comes over its long connection and takes no webhook",
        )),
        #[cfg(not(feature = "feishu"))]
        PlatformConfig::Feishu(_) | PlatformConfig::Lark(_) => Err(not_built(source, "feishu")),
        #[cfg(not(feature = "wecom"))]
        PlatformConfig::Wecom(_) | PlatformConfig::Wechat(_) | PlatformConfig::WecomSuite(_) => {
            Err(not_built(source, "wecom"))
        }
    }
}

/// Whether `config` is held on a long connection (a Feishu or Lark app with `transport =
/// "websocket"`, a WeCom AI bot).
pub fn is_long_connection(config: &SourceConfig) -> bool {
    match &config.platform {
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            settings.transport == Transport::Websocket
        }
        PlatformConfig::Dingtalk(settings) => settings.transport == Transport::Websocket,
        PlatformConfig::WecomAibot(_) => true,
        PlatformConfig::Wecom(_)
        | PlatformConfig::Wechat(_)
        | PlatformConfig::WecomSuite(_)
        | PlatformConfig::Webhook(_) => false,
    }
}

/// A configured long-connection source: its app (an encrypt key, if set, decrypts pushes;
/// the connection authenticates them) and its connection settings.
#[cfg(feature = "long-connection")]
pub(crate) fn long_connection(
    config: &SourceConfig,
) -> Result<crate::ingress::longconn::LongSource, GatewayError> {
    match &config.platform {
        PlatformConfig::Feishu(_) | PlatformConfig::Lark(_) => feishu::long_connection(config),
        PlatformConfig::WecomAibot(settings) => wecom::ai_bot(config, settings),
        PlatformConfig::Dingtalk(settings) => dingtalk::stream(config, settings),
        _ => Err(platform_error(
            config,
            "only Feishu, Lark, WeCom AI bots and DingTalk (Stream mode) have a long connection",
        )),
    }
}

/// The long connection a build without the `long-connection` feature cannot hold.
#[cfg(not(feature = "long-connection"))]
pub(crate) fn long_connection(
    config: &SourceConfig,
) -> Result<std::convert::Infallible, GatewayError> {
    Err(not_built(config, "long-connection"))
}

/// The sending side of a configured app with its API secret: what `/send/<source>` sends as
/// (a Feishu or Lark app with `app_secret`, a WeCom agent with `secret`); `None` for others.
#[cfg(feature = "send")]
pub(crate) fn sender(
    config: &SourceConfig,
    timeout: std::time::Duration,
) -> Result<Option<crate::api::send::Sender>, GatewayError> {
    // A build with no platform has nothing to send as.
    let _ = timeout;
    match &config.platform {
        #[cfg(feature = "feishu")]
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            feishu::sender(config, settings, timeout)
        }
        #[cfg(feature = "wecom")]
        PlatformConfig::Wecom(settings) => wecom::sender(config, settings, timeout),
        #[cfg(feature = "webhook")]
        PlatformConfig::Webhook(settings) => webhook::sender(config, settings, timeout),
        _ => Ok(None),
    }
}

/// The receiver for one configured source.
#[cfg_attr(
    not(any(
        feature = "feishu",
        feature = "wecom",
        feature = "webhook",
        feature = "dingtalk"
    )),
    allow(unreachable_code)
)]
pub fn source(config: &SourceConfig) -> Result<SharedSource, GatewayError> {
    Ok(match app(config)? {
        #[cfg(feature = "feishu")]
        App::Feishu(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Wecom(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Wechat(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Suite(suite) => Arc::new(suite),
        #[cfg(feature = "wecom")]
        App::Corps(corps) => Arc::new(corps),
        #[cfg(feature = "webhook")]
        App::Webhook(app) => Arc::new(*app),
        #[cfg(feature = "dingtalk")]
        App::Dingtalk(app) => Arc::new(app),
    })
}

/// The sending side of one configured source: what `oncegate simulate` signs with.
#[cfg_attr(
    not(any(
        feature = "feishu",
        feature = "wecom",
        feature = "webhook",
        feature = "dingtalk"
    )),
    allow(unreachable_code)
)]
pub fn sealer(config: &SourceConfig) -> Result<Arc<dyn Sealer>, GatewayError> {
    Ok(match app(config)? {
        #[cfg(feature = "feishu")]
        App::Feishu(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Wecom(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Wechat(app) => Arc::new(app),
        #[cfg(feature = "wecom")]
        App::Suite(_) => {
            return Err(platform_error(
                config,
                "oncegate simulate does not play a WeCom suite's callbacks yet; simulate one of \
                 its corps as a platform = \"wecom\" source",
            ));
        }
        #[cfg(feature = "wecom")]
        App::Corps(_) => {
            return Err(platform_error(
                config,
                "a template's corps are in the registry: simulate one of them as a platform = \
                 \"wecom\" source with its corp_id, token and encoding_aes_key",
            ));
        }
        #[cfg(feature = "dingtalk")]
        App::Dingtalk(app) => Arc::new(app),
        #[cfg(feature = "webhook")]
        App::Webhook(_) => {
            return Err(platform_error(
                config,
                "oncegate simulate does not play generic webhook sources yet; send their \
                 platform's requests (or curl) to /webhook/<source>",
            ));
        }
    })
}

/// What `serve` would refuse of `config`'s sources when it builds them — a key of the wrong
/// length, a domain it cannot use — as `check-config` reports it: each source built here the
/// one way `serve` builds it, and dropped.
pub fn source_problems(config: &oncegate_config::Config) -> Vec<oncegate_config::Problem> {
    config
        .sources
        .iter()
        .filter_map(|source| {
            let built = if is_long_connection(source) {
                long_connection(source).map(|_| ())
            } else {
                self::source(source).map(|_| ())
            };
            #[cfg(feature = "send")]
            let built =
                built.and_then(|()| sender(source, std::time::Duration::from_secs(10)).map(|_| ()));
            built.err().map(|error| {
                let message = error.to_string();
                let named = format!("source {:?}: ", source.name);
                oncegate_config::Problem {
                    severity: oncegate_config::Severity::Error,
                    setting: format!("source[{}]", source.name),
                    message: message.strip_prefix(&named).unwrap_or(&message).to_owned(),
                }
            })
        })
        .collect()
}

/// The keeper of a multi-tenant source's credentials (a WeCom suite, a Feishu store app) with
/// the secret it needs; `None` for any other source.
#[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
pub(crate) fn keeper<S: oncegate_core::Store>(
    source: &oncegate_config::SourceConfig,
    store: &std::sync::Arc<S>,
    timeout: std::time::Duration,
) -> Result<Option<crate::credentials::Keeper>, GatewayError> {
    use crate::credentials::Keeper;
    use oncegate_config::PlatformConfig;
    Ok(match &source.platform {
        #[cfg(feature = "wecom")]
        PlatformConfig::WecomSuite(settings) => {
            wecom::suite_api(source, settings, timeout)?.map(|api| {
                let keeper = crate::credentials::suite::SuiteKeeper::new(
                    &source.name,
                    api,
                    store.clone(),
                    timeout,
                );
                Keeper::Suite(std::sync::Arc::new(keeper))
            })
        }
        #[cfg(feature = "feishu")]
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            feishu::store_api(source, settings, timeout)?.map(|api| {
                let keeper = crate::credentials::store_app::StoreAppKeeper::new(
                    &source.name,
                    api,
                    store.clone(),
                );
                Keeper::StoreApp(std::sync::Arc::new(keeper))
            })
        }
        _ => None,
    })
}
