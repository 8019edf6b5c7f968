//! Feishu and Lark sources: the webhook app, the long connection, the sender.

use oncegate_config::{PlatformConfig, SourceConfig};
use oncegate_feishu::{Cloud, FeishuApp};

use super::{platform_error, resolve};
use crate::GatewayError;
#[cfg(feature = "long-connection")]
use crate::ingress::longconn::LongSource;

/// A configured Feishu or Lark app.
pub(super) fn app(source: &SourceConfig) -> Result<FeishuApp, GatewayError> {
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
    let app = FeishuApp::new(cloud, &settings.app_id, encrypt_key, verification_token)
        .map_err(|error| platform_error(source, error))?;
    Ok(if settings.store_app {
        app.store_app()
    } else {
        app
    })
}

/// A store app's own API (its ticket and its tenants' tokens), when it is one with a secret.
#[cfg(feature = "send")]
pub(crate) fn store_api(
    config: &SourceConfig,
    settings: &oncegate_config::FeishuSettings,
    timeout: std::time::Duration,
) -> Result<Option<oncegate_send::FeishuStoreApi>, GatewayError> {
    if !settings.store_app {
        return Ok(None);
    }
    let cloud = match &config.platform {
        PlatformConfig::Lark(_) => Cloud::Lark,
        _ => Cloud::Feishu,
    };
    let Some(secret) = resolve(config, &settings.app_secret, "app_secret")? else {
        return Ok(None);
    };
    oncegate_send::FeishuStoreApi::new(&domain(cloud, settings), &settings.app_id, &secret, timeout)
        .map(Some)
        .map_err(|error| platform_error(config, error))
}

/// A configured long-connection source: its app (an encrypt key, if set, decrypts pushes;
/// the connection authenticates them) and its connection settings.
#[cfg(feature = "long-connection")]
pub(super) fn long_connection(config: &SourceConfig) -> Result<LongSource, GatewayError> {
    let (cloud, settings) = match &config.platform {
        PlatformConfig::Feishu(settings) => (Cloud::Feishu, settings),
        PlatformConfig::Lark(settings) => (Cloud::Lark, settings),
        _ => return Err(platform_error(config, "not a Feishu or Lark app")),
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
        oncegate_feishu_ws::FeishuTransport::new(app, connection),
        settings.instances,
    ))
}

/// The sending side of a Feishu or Lark app with `app_secret`.
#[cfg(feature = "send")]
pub(super) fn sender(
    config: &SourceConfig,
    settings: &oncegate_config::FeishuSettings,
    timeout: std::time::Duration,
) -> Result<Option<crate::api::send::Sender>, GatewayError> {
    // A store app sends as one tenant at a time (`/send/<source>/<tenant>`), never as itself.
    if settings.store_app {
        return Ok(None);
    }
    let api = {
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
        oncegate_send::Api::Feishu(api)
    };
    Ok(crate::api::send::Sender::of(api))
}

/// The open platform's address of an app: its `domain`, or its cloud's.
#[cfg(any(feature = "send", feature = "long-connection"))]
pub(super) fn domain(cloud: Cloud, settings: &oncegate_config::FeishuSettings) -> String {
    settings.domain.clone().unwrap_or_else(|| {
        match cloud {
            Cloud::Feishu => "https://open.feishu.cn",
            Cloud::Lark => "https://open.larksuite.com",
        }
        .to_owned()
    })
}
