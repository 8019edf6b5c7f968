//! The one place that names platforms: a configured source becomes its platform's receiver
//! (and, for load generators, its sender).

use std::sync::Arc;

use oncegate_config::{PlatformConfig, Secret, SourceConfig};
use oncegate_core::Sealer;
use oncegate_feishu::{Cloud, FeishuApp};

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

/// A configured Feishu or Lark app, if the source is one.
fn feishu(source: &SourceConfig) -> Result<Option<FeishuApp>, GatewayError> {
    let (cloud, settings) = match &source.platform {
        PlatformConfig::Feishu(settings) => (Cloud::Feishu, settings),
        PlatformConfig::Lark(settings) => (Cloud::Lark, settings),
        PlatformConfig::Wecom(_) | PlatformConfig::Wechat(_) => return Ok(None),
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
        .map(Some)
        .map_err(|error| GatewayError::Config(format!("source {:?}: {error}", source.name)))
}

fn unsupported(config: &SourceConfig) -> GatewayError {
    GatewayError::Config(format!(
        "source {:?}: platform {:?} is not supported by this version yet",
        config.name,
        config.platform()
    ))
}

/// The receiver for one configured source.
pub fn source(config: &SourceConfig) -> Result<SharedSource, GatewayError> {
    match feishu(config)? {
        Some(app) => Ok(Arc::new(app)),
        None => Err(unsupported(config)),
    }
}

/// The sending side of one configured source: what `oncegate simulate` signs with.
pub fn sealer(config: &SourceConfig) -> Result<Arc<dyn Sealer>, GatewayError> {
    match feishu(config)? {
        Some(app) => Ok(Arc::new(app)),
        None => Err(unsupported(config)),
    }
}
