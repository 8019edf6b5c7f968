//! DingTalk sources: an app's HTTP event subscription, or its Stream mode.

use oncegate_config::{DingtalkSettings, SourceConfig};
use oncegate_dingtalk::DingtalkApp;

use super::{platform_error, required};
use crate::GatewayError;

/// The configured DingTalk app.
pub(super) fn app(
    source: &SourceConfig,
    settings: &DingtalkSettings,
) -> Result<DingtalkApp, GatewayError> {
    let token = required(source, &settings.token, "token")?;
    let aes_key = required(source, &settings.aes_key, "aes_key")?;
    DingtalkApp::new(&token, &aes_key, &settings.app_key)
        .map_err(|error| platform_error(source, error))
}

/// The configured app's Stream connection (`transport = "stream"`).
#[cfg(feature = "long-connection")]
pub(super) fn stream(
    source: &SourceConfig,
    settings: &DingtalkSettings,
) -> Result<crate::ingress::longconn::LongSource, GatewayError> {
    let secret = required(source, &settings.app_secret, "app_secret")?;
    let domain = settings
        .domain
        .as_deref()
        .unwrap_or(oncegate_dingtalk_stream::DEFAULT_DOMAIN);
    let connection =
        oncegate_dingtalk_stream::Settings::new(&source.name, domain, &settings.app_key, &secret);
    Ok(crate::ingress::longconn::LongSource::new(
        &source.name,
        oncegate_dingtalk_stream::StreamTransport::new(connection),
        settings.instances,
    ))
}
