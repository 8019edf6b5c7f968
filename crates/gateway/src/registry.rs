//! The one place that names platforms: a configured source becomes its platform's receiver.

use std::sync::Arc;

use oncegate_config::{Platform, SourceConfig};
use oncegate_feishu::FeishuApp;

use crate::{GatewayError, SharedSource};

/// A source's secrets, resolved (never empty: configuration refuses that).
pub(crate) struct Secrets {
    pub(crate) encrypt_key: Option<String>,
    pub(crate) verification_token: Option<String>,
}

/// The receiver for one configured source.
pub(crate) fn source(
    config: &SourceConfig,
    secrets: Secrets,
) -> Result<SharedSource, GatewayError> {
    let setup = |error: &dyn std::fmt::Display| {
        GatewayError::Config(format!("source {:?}: {error}", config.name))
    };
    match config.platform {
        Platform::Feishu | Platform::Lark => {
            let lark = config.platform == Platform::Lark;
            let app = FeishuApp::new(
                lark,
                &config.app_id,
                secrets.encrypt_key,
                secrets.verification_token,
            )
            .map_err(|error| setup(&error))?;
            Ok(Arc::new(app))
        }
        Platform::Wecom | Platform::Wechat => Err(setup(&format!(
            "platform {:?} is not supported by this version yet",
            config.platform
        ))),
    }
}
