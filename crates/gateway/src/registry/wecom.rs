//! WeCom and WeChat sources: the webhook apps, the AI bot's long connection, the sender.

use oncegate_config::SourceConfig;
use oncegate_wecom::{WechatApp, WecomApp, WecomSuite};

use super::{platform_error, required, resolve};
use crate::GatewayError;
#[cfg(feature = "long-connection")]
use crate::ingress::longconn::LongSource;

/// A WeCom app (one agent of a corp, when `agent_id` is set).
pub(super) fn wecom(
    source: &SourceConfig,
    settings: &oncegate_config::WecomSettings,
) -> Result<WecomApp, GatewayError> {
    let token = required(source, &settings.token, "token")?;
    let key = required(source, &settings.encoding_aes_key, "encoding_aes_key")?;
    let app = WecomApp::new(&settings.corp_id, &token, &key)
        .map_err(|error| platform_error(source, error))?;
    Ok(match &settings.agent_id {
        Some(agent) => app.for_agent(agent),
        None => app,
    })
}

/// A WeCom third-party suite, for every corp of its tenant registry.
pub(super) fn suite(
    source: &SourceConfig,
    settings: &oncegate_config::SuiteSettings,
) -> Result<WecomSuite, GatewayError> {
    let token = required(source, &settings.token, "token")?;
    let key = required(source, &settings.encoding_aes_key, "encoding_aes_key")?;
    WecomSuite::new(
        &settings.suite_id,
        settings.provider_corp_id.as_deref(),
        &token,
        &key,
    )
    .map_err(|error| platform_error(source, error))
}

/// A WeChat Official Account.
pub(super) fn wechat(
    source: &SourceConfig,
    settings: &oncegate_config::WechatSettings,
) -> Result<WechatApp, GatewayError> {
    let token = required(source, &settings.token, "token")?;
    let key = resolve(source, &settings.encoding_aes_key, "encoding_aes_key")?;
    WechatApp::new(&settings.app_id, &token, key.as_deref())
        .map(|app| match settings.original_id.as_deref() {
            Some(original_id) => app.with_original_id(original_id),
            None => app,
        })
        .map_err(|error| platform_error(source, error))
}

/// A configured WeCom AI bot: always one gateway of several holds its connection, since WeCom
/// keeps one per bot.
#[cfg(feature = "long-connection")]
pub(super) fn ai_bot(
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
    let scope = bot.bot_id().to_owned();
    let transport = oncegate_wecom_ws::AiBotTransport::new(bot, connection);
    // The bot sends over its connection, through the gateway that holds it.
    #[cfg(feature = "send")]
    let sender = crate::api::send::Sender {
        api: oncegate_send::Api::AiBot(oncegate_send::AiBotApi::new(transport.outbound())),
        scope,
        shared: Vec::new(),
    };
    #[cfg(not(feature = "send"))]
    let _ = scope;
    let source = LongSource::new(&config.name, transport, oncegate_config::Instances::Leader);
    #[cfg(feature = "send")]
    let source = source.with_sender(sender);
    Ok(source)
}

/// The sending side of a WeCom agent with `secret`.
#[cfg(feature = "send")]
pub(super) fn sender(
    config: &SourceConfig,
    settings: &oncegate_config::WecomSettings,
    timeout: std::time::Duration,
) -> Result<Option<crate::api::send::Sender>, GatewayError> {
    let api = {
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
        let api = oncegate_send::WecomApi::new(&domain, &settings.corp_id, agent, &secret, options)
            .map_err(|error| platform_error(config, error))?;
        oncegate_send::Api::Wecom(api)
    };
    Ok(crate::api::send::Sender::of(api))
}

/// A suite's own API, when its `suite_secret` is set: what exchanges authorisation codes and
/// fetches each corp's token.
#[cfg(feature = "send")]
pub(crate) fn suite_api(
    config: &SourceConfig,
    settings: &oncegate_config::SuiteSettings,
    timeout: std::time::Duration,
) -> Result<Option<oncegate_send::WecomSuiteApi>, GatewayError> {
    let Some(secret) = resolve(config, &settings.suite_secret, "suite_secret")? else {
        return Ok(None);
    };
    let domain = settings
        .domain
        .clone()
        .unwrap_or_else(|| "https://qyapi.weixin.qq.com".to_owned());
    oncegate_send::WecomSuiteApi::new(&domain, &settings.suite_id, &secret, timeout)
        .map(Some)
        .map_err(|error| platform_error(config, error))
}
