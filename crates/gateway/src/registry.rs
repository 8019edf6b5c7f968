//! The one place that names platforms: a configured source becomes its platform's receiver
//! (and, for load generators, its sender).

use std::sync::Arc;

use oncegate_config::{PlatformConfig, Secret, SourceConfig, Transport};
use oncegate_core::Sealer;
use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_wecom::{WechatApp, WecomApp};

use crate::ingress::longconn::{Link, LongSource};
use crate::{GatewayError, SharedSource};

/// Resolves a secret of `source` (never empty: resolution refuses that).
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

/// One configured source's app, of whichever platform: the receiver and the sender.
enum App {
    Feishu(FeishuApp),
    Wecom(WecomApp),
    Wechat(WechatApp),
}

fn platform_error(source: &SourceConfig, error: impl std::fmt::Display) -> GatewayError {
    GatewayError::Config(format!("source {:?}: {error}", source.name))
}

/// The configured app of `source`.
fn app(source: &SourceConfig) -> Result<App, GatewayError> {
    let required = |secret: &Option<Secret>, field: &str| {
        resolve(source, secret, field)?
            .ok_or_else(|| GatewayError::Config(format!("source {:?} needs {field}", source.name)))
    };
    match &source.platform {
        PlatformConfig::Feishu(_) | PlatformConfig::Lark(_) => feishu(source).map(App::Feishu),
        PlatformConfig::Wecom(settings) => {
            let token = required(&settings.token, "token")?;
            let key = required(&settings.encoding_aes_key, "encoding_aes_key")?;
            let app = WecomApp::new(&settings.corp_id, &token, &key)
                .map_err(|error| platform_error(source, error))?;
            Ok(App::Wecom(match &settings.agent_id {
                Some(agent) => app.for_agent(agent),
                None => app,
            }))
        }
        PlatformConfig::Wechat(settings) => {
            let token = required(&settings.token, "token")?;
            let key = resolve(source, &settings.encoding_aes_key, "encoding_aes_key")?;
            WechatApp::new(&settings.app_id, &token, key.as_deref())
                .map(|app| match settings.original_id.as_deref() {
                    Some(original_id) => app.with_original_id(original_id),
                    None => app,
                })
                .map(App::Wechat)
                .map_err(|error| platform_error(source, error))
        }
        PlatformConfig::WecomAibot(_) => Err(platform_error(
            source,
            "a WeCom AI bot comes over its long connection and takes no webhook",
        )),
    }
}

/// A configured Feishu or Lark app.
fn feishu(source: &SourceConfig) -> Result<FeishuApp, GatewayError> {
    let (cloud, settings) = match &source.platform {
        PlatformConfig::Feishu(settings) => (Cloud::Feishu, settings),
        PlatformConfig::Lark(settings) => (Cloud::Lark, settings),
        _ => return Err(platform_error(source, "not a Feishu or Lark app")),
    };
    let encrypt_key = resolve(source, &settings.encrypt_key, "encrypt_key")?;
    let verification_token = resolve(source, &settings.verification_token, "verification_token")?;
    if encrypt_key.is_none() && verification_token.is_none() && !settings.allow_unsigned {
        return Err(GatewayError::Config(format!(
            "source {:?} has no secret: set encrypt_key and verification_token, or \
             allow_unsigned = true",
            source.name
        )));
    }
    FeishuApp::new(cloud, &settings.app_id, encrypt_key, verification_token)
        .map_err(|error| platform_error(source, error))
}

/// Whether `config` is held on a long connection (a Feishu or Lark app with `transport =
/// "websocket"`, a WeCom AI bot).
pub fn is_long_connection(config: &SourceConfig) -> bool {
    match &config.platform {
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            settings.transport == Transport::Websocket
        }
        PlatformConfig::WecomAibot(_) => true,
        PlatformConfig::Wecom(_) | PlatformConfig::Wechat(_) => false,
    }
}

/// A configured long-connection source: its app (an encrypt key, if set, decrypts pushes;
/// the connection authenticates them) and its connection settings.
pub(crate) fn long_connection(config: &SourceConfig) -> Result<LongSource, GatewayError> {
    let (cloud, settings) = match &config.platform {
        PlatformConfig::Feishu(settings) => (Cloud::Feishu, settings),
        PlatformConfig::Lark(settings) => (Cloud::Lark, settings),
        PlatformConfig::WecomAibot(settings) => return ai_bot(config, settings),
        _ => {
            return Err(platform_error(
                config,
                "only Feishu, Lark and WeCom AI bots have a long connection",
            ));
        }
    };
    let secret = resolve(config, &settings.app_secret, "app_secret")?.ok_or_else(|| {
        GatewayError::Config(format!(
            "source {:?} uses the long connection and needs app_secret",
            config.name
        ))
    })?;
    let encrypt_key = resolve(config, &settings.encrypt_key, "encrypt_key")?;
    let app = FeishuApp::new(cloud, &settings.app_id, encrypt_key, None)
        .map_err(|error| platform_error(config, error))?;
    let mut connection =
        oncegate_feishu_ws::Settings::new(&config.name, &domain(cloud, settings), &secret);
    connection.connections = settings.connections;
    connection.pong_grace = settings.pong_grace;
    Ok(LongSource::new(
        &config.name,
        Link::Feishu {
            app,
            settings: connection,
        },
        settings.instances,
    ))
}

/// A configured WeCom AI bot: always one gateway of several holds its connection, since WeCom
/// keeps one per bot.
fn ai_bot(
    config: &SourceConfig,
    settings: &oncegate_config::AibotSettings,
) -> Result<LongSource, GatewayError> {
    let secret = resolve(config, &settings.secret, "secret")?.ok_or_else(|| {
        GatewayError::Config(format!(
            "source {:?} needs secret, the bot's secret that subscribes",
            config.name
        ))
    })?;
    let bot = oncegate_wecom::AiBot::new(&settings.bot_id)
        .map_err(|error| platform_error(config, error))?;
    let url = settings
        .domain
        .clone()
        .unwrap_or_else(|| oncegate_wecom_ws::DEFAULT_URL.to_owned());
    let connection = oncegate_wecom_ws::Settings::new(&config.name, &url, &secret);
    Ok(LongSource::new(
        &config.name,
        Link::AiBot {
            bot,
            settings: connection,
            outbound: Arc::new(oncegate_wecom_ws::Outbound::default()),
        },
        oncegate_config::Instances::Leader,
    ))
}

/// The sending side of a configured app with its API secret: what `/send/<source>` sends as
/// (a Feishu or Lark app with `app_secret`, a WeCom agent with `secret`); `None` for others.
pub(crate) fn sender(
    config: &SourceConfig,
    timeout: std::time::Duration,
) -> Result<Option<crate::api::send::Sender>, GatewayError> {
    let (api, scope) = match &config.platform {
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            let cloud = match &config.platform {
                PlatformConfig::Lark(_) => Cloud::Lark,
                _ => Cloud::Feishu,
            };
            let Some(secret) = resolve(config, &settings.app_secret, "app_secret")? else {
                return Ok(None);
            };
            let api = oncegate_send::FeishuApi::new(
                &domain(cloud, settings),
                &settings.app_id,
                &secret,
                timeout,
            )
            .map_err(|error| platform_error(config, error))?;
            (oncegate_send::Api::Feishu(api), settings.app_id.clone())
        }
        PlatformConfig::Wecom(settings) => {
            let Some(secret) = resolve(config, &settings.secret, "secret")? else {
                return Ok(None);
            };
            let agent = settings
                .agent_id
                .as_deref()
                .and_then(|agent| agent.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    platform_error(config, "sending needs agent_id, the app's numeric AgentId")
                })?;
            let options = oncegate_send::wecom::WecomOptions {
                timeout,
                ..Default::default()
            };
            let domain = settings
                .domain
                .clone()
                .unwrap_or_else(|| "https://qyapi.weixin.qq.com".to_owned());
            let api =
                oncegate_send::WecomApi::new(&domain, &settings.corp_id, agent, &secret, options)
                    .map_err(|error| platform_error(config, error))?;
            (
                oncegate_send::Api::Wecom(api),
                format!("{}/{agent}", settings.corp_id),
            )
        }
        PlatformConfig::Wechat(_) | PlatformConfig::WecomAibot(_) => return Ok(None),
    };
    Ok(Some(crate::api::send::Sender { api, scope }))
}

/// The open platform's address of an app: its `domain`, or its cloud's.
fn domain(cloud: Cloud, settings: &oncegate_config::FeishuSettings) -> String {
    settings.domain.clone().unwrap_or_else(|| {
        match cloud {
            Cloud::Feishu => "https://open.feishu.cn",
            Cloud::Lark => "https://open.larksuite.com",
        }
        .to_owned()
    })
}

/// The receiver for one configured source.
pub fn source(config: &SourceConfig) -> Result<SharedSource, GatewayError> {
    Ok(match app(config)? {
        App::Feishu(app) => Arc::new(app),
        App::Wecom(app) => Arc::new(app),
        App::Wechat(app) => Arc::new(app),
    })
}

/// The sending side of one configured source: what `oncegate simulate` signs with.
pub fn sealer(config: &SourceConfig) -> Result<Arc<dyn Sealer>, GatewayError> {
    Ok(match app(config)? {
        App::Feishu(app) => Arc::new(app),
        App::Wecom(app) => Arc::new(app),
        App::Wechat(app) => Arc::new(app),
    })
}
