//! DingTalk sources: an app's HTTP event subscription.

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
