//! The one place that names platforms: a configured source becomes its platform's receiver
//! (and, for load generators, its sender).

use std::sync::Arc;

use oncegate_config::{Platform, SourceConfig};
use oncegate_core::Sealer;
use oncegate_feishu::{Cloud, FeishuApp};

use crate::{GatewayError, SharedSource};

/// A source's secrets, resolved: never empty (resolution refuses that), and at least one
/// unless the source allows unsigned requests.
struct Secrets {
    encrypt_key: Option<String>,
    verification_token: Option<String>,
}

fn secrets(config: &SourceConfig) -> Result<Secrets, GatewayError> {
    let resolve = |secret: &Option<oncegate_config::Secret>, field: &str| {
        secret
            .as_ref()
            .map(|s| {
                s.resolve().map_err(|message| {
                    GatewayError::Config(format!("source {:?} {field}: {message}", config.name))
                })
            })
            .transpose()
    };
    let secrets = Secrets {
        encrypt_key: resolve(&config.encrypt_key, "encrypt_key")?,
        verification_token: resolve(&config.verification_token, "verification_token")?,
    };
    if secrets.encrypt_key.is_none()
        && secrets.verification_token.is_none()
        && !config.allow_unsigned
    {
        return Err(GatewayError::Config(format!(
            "source {:?} has no secret: set encrypt_key and verification_token, or \
             allow_unsigned = true",
            config.name
        )));
    }
    Ok(secrets)
}

/// A configured Feishu or Lark app.
fn feishu(config: &SourceConfig) -> Result<Option<FeishuApp>, GatewayError> {
    let cloud = match config.platform {
        Platform::Feishu => Cloud::Feishu,
        Platform::Lark => Cloud::Lark,
        Platform::Wecom | Platform::Wechat => return Ok(None),
    };
    let secrets = secrets(config)?;
    FeishuApp::new(
        cloud,
        &config.app_id,
        secrets.encrypt_key,
        secrets.verification_token,
    )
    .map(Some)
    .map_err(|error| GatewayError::Config(format!("source {:?}: {error}", config.name)))
}

fn unsupported(config: &SourceConfig) -> GatewayError {
    GatewayError::Config(format!(
        "source {:?}: platform {:?} is not supported by this version yet",
        config.name, config.platform
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
