//! Generic webhook sources (`platform = "webhook"`): a preset's spec, changed by each setting
//! the source writes, with its secrets.

use oncegate_config::{
    AnswerType, HandshakeSettings, KeyEncoding as KeyIn, SignatureEncoding, SourceConfig,
    TimeUnit as UnitIn, VerifyKind, WebhookSettings,
};
use oncegate_webhook::{
    Answer, Ed25519, Encoding, Fields, Handshake, Hash, Hmac, KeyEncoding, Location, PRESETS, Spec,
    Template, Time, TimeUnit, Verify, WebhookApp, preset,
};

use super::{platform_error, resolve};
use crate::GatewayError;

/// The configured generic source.
pub(super) fn app(
    source: &SourceConfig,
    settings: &WebhookSettings,
) -> Result<WebhookApp, GatewayError> {
    let fail = |field: &str, error: &dyn std::fmt::Display| {
        platform_error(source, format!("{field}: {error}"))
    };
    let at = |field: &str, text: &str| Location::parse(text).map_err(|e| fail(field, &e));
    let mut spec = match settings.preset.as_deref() {
        Some(name) => preset(name).ok_or_else(|| {
            fail(
                "preset",
                &format!(
                    "{name:?} is not a preset; the presets: {}",
                    PRESETS.join(", ")
                ),
            )
        })?,
        None => Spec {
            platform: "webhook".into(),
            verify: Verify::Nothing,
            timestamp: None,
            fields: Fields::default(),
            handshakes: Vec::new(),
            success: Answer::Text(String::new()),
        },
    };
    if let Some(name) = &settings.platform_name {
        spec.platform = name.clone();
    }
    spec.verify = verify(settings, spec.verify, &at, &fail)?;
    if spec.verify == Verify::Nothing && settings.verify != Some(VerifyKind::None) {
        return Err(platform_error(
            source,
            "nothing checks this source's requests: set verify (hmac-sha256, token…) with \
             signature and secret, or verify = \"none\" to take unauthenticated events on purpose",
        ));
    }
    time(
        &mut spec.timestamp,
        ("timestamp", settings.timestamp.as_deref()),
        settings.timestamp_unit,
        &at,
    )?;
    fields(settings, &mut spec.fields, &at)?;
    if let Some(handshakes) = &settings.handshake {
        spec.handshakes = handshakes
            .iter()
            .map(|h| handshake(h, &at, &fail))
            .collect::<Result<_, _>>()?;
    }
    if let Some(body) = &settings.answer {
        spec.success = answer(body, settings.answer_type);
    }
    let mut secrets = Vec::new();
    if let Some(secret) = resolve(source, &settings.secret, "secret")? {
        secrets.push(secret);
    }
    for previous in &settings.previous_secrets {
        secrets.push(
            previous
                .resolve()
                .map_err(|message| fail("previous_secrets", &message))?,
        );
    }
    WebhookApp::new(spec, source.app_id(), secrets).map_err(|error| platform_error(source, error))
}

type At<'a> = dyn Fn(&str, &str) -> Result<Location, GatewayError> + 'a;
type Fail<'a> = dyn Fn(&str, &dyn std::fmt::Display) -> GatewayError + 'a;

/// The preset's check with the settings' changes.
fn verify(
    settings: &WebhookSettings,
    preset: Verify,
    at: &At<'_>,
    fail: &Fail<'_>,
) -> Result<Verify, GatewayError> {
    let signature = settings
        .signature
        .as_deref()
        .map(|text| at("signature", text))
        .transpose()?;
    let hash = match settings.verify {
        Some(VerifyKind::None) => return Ok(Verify::Nothing),
        Some(VerifyKind::Token) => {
            let from_preset = match preset {
                Verify::Token { at } => Some(at),
                _ => None,
            };
            let at = signature.or(from_preset).ok_or_else(|| {
                fail(
                    "signature",
                    &"verify = \"token\" needs where the token is (header:…, query:…)",
                )
            })?;
            return Ok(Verify::Token { at });
        }
        Some(VerifyKind::Ed25519) => {
            let mut ed25519 = match preset {
                Verify::Ed25519(ed25519) => ed25519,
                _ => Ed25519 {
                    signature: signature.clone().ok_or_else(|| {
                        fail(
                            "signature",
                            &"an ed25519 check needs where the signature is (header:…)",
                        )
                    })?,
                    signed: Template::body(),
                },
            };
            if let Some(signature) = signature {
                ed25519.signature = signature;
            }
            if let Some(text) = &settings.signed {
                ed25519.signed = Template::parse(text).map_err(|e| fail("signed", &e))?;
            }
            return Ok(Verify::Ed25519(ed25519));
        }
        Some(VerifyKind::HmacSha1) => Some(Hash::Sha1),
        Some(VerifyKind::HmacSha256) => Some(Hash::Sha256),
        Some(VerifyKind::HmacSha512) => Some(Hash::Sha512),
        None => None,
    };
    let mut hmac = match (preset, hash) {
        (Verify::Hmac(hmac), _) => hmac,
        (Verify::Ed25519(mut ed25519), None) => {
            if let Some(signature) = signature {
                ed25519.signature = signature;
            }
            if let Some(text) = &settings.signed {
                ed25519.signed = Template::parse(text).map_err(|e| fail("signed", &e))?;
            }
            return Ok(Verify::Ed25519(ed25519));
        }
        (Verify::Token { at }, None) => {
            return Ok(Verify::Token {
                at: signature.unwrap_or(at),
            });
        }
        (_, None) => return Ok(Verify::Nothing),
        (_, Some(hash)) => Hmac {
            hash,
            signature: signature.clone().ok_or_else(|| {
                fail(
                    "signature",
                    &"a signature check needs where the signature is (header:…)",
                )
            })?,
            signed: Template::body(),
            encoding: Encoding::Hex,
            prefix: String::new(),
            separator: None,
            key: KeyEncoding::Text,
        },
    };
    if let Some(hash) = hash {
        hmac.hash = hash;
    }
    if let Some(signature) = signature {
        hmac.signature = signature;
    }
    if let Some(text) = &settings.signed {
        hmac.signed = Template::parse(text).map_err(|e| fail("signed", &e))?;
    }
    if let Some(encoding) = settings.encoding {
        hmac.encoding = match encoding {
            SignatureEncoding::Hex => Encoding::Hex,
            SignatureEncoding::Base64 => Encoding::Base64,
        };
    }
    if let Some(prefix) = &settings.prefix {
        hmac.prefix = prefix.clone();
    }
    if let Some(separator) = &settings.separator {
        let mut chars = separator.chars();
        hmac.separator = match (chars.next(), chars.next()) {
            (Some(c), None) => Some(c),
            _ => return Err(fail("separator", &"one character")),
        };
    }
    if let Some(key) = settings.key {
        hmac.key = match key {
            KeyIn::Text => KeyEncoding::Text,
            KeyIn::Base64 => KeyEncoding::Base64,
        };
    }
    Ok(Verify::Hmac(hmac))
}

fn unit_of(unit: UnitIn) -> TimeUnit {
    match unit {
        UnitIn::Seconds => TimeUnit::Seconds,
        UnitIn::Milliseconds => TimeUnit::Milliseconds,
    }
}

fn fields(
    settings: &WebhookSettings,
    fields: &mut Fields,
    at: &At<'_>,
) -> Result<(), GatewayError> {
    let list = |field: &str, texts: &[String]| {
        texts
            .iter()
            .map(|t| at(field, t))
            .collect::<Result<Vec<_>, _>>()
    };
    if let Some(id) = &settings.id {
        fields.id = list("id", id)?;
    }
    if let Some(fingerprint) = &settings.fingerprint {
        fields.fingerprint = list("fingerprint", fingerprint)?;
    }
    if let Some(event_type) = &settings.event_type {
        fields.event_type = list("type", event_type)?;
    }
    if let Some(chat) = &settings.chat {
        fields.chat = Some(at("chat", chat)?);
    }
    if let Some(tenant) = &settings.tenant {
        fields.tenant = Some(at("tenant", tenant)?);
    }
    time(
        &mut fields.created_at,
        ("created_at", settings.created_at.as_deref()),
        settings.created_at_unit,
        at,
    )?;
    Ok(())
}

/// A time the preset reads (or not), moved to `text` and given `unit` where these are set.
fn time(
    time: &mut Option<Time>,
    (field, text): (&str, Option<&str>),
    unit: Option<UnitIn>,
    at: &At<'_>,
) -> Result<(), GatewayError> {
    if let Some(text) = text {
        *time = Some(Time {
            at: at(field, text)?,
            unit: time.as_ref().map_or(TimeUnit::Seconds, |t| t.unit),
        });
    }
    if let (Some(unit), Some(time)) = (unit, time.as_mut()) {
        time.unit = unit_of(unit);
    }
    Ok(())
}

fn answer(body: &str, kind: Option<AnswerType>) -> Answer {
    match kind {
        Some(AnswerType::Json) => Answer::Json(body.to_owned()),
        _ => Answer::Text(body.to_owned()),
    }
}

fn handshake(
    settings: &HandshakeSettings,
    at: &At<'_>,
    fail: &Fail<'_>,
) -> Result<Handshake, GatewayError> {
    let answer = match (&settings.echo, &settings.answer) {
        (Some(echo), None) => Answer::Echo(at("handshake.echo", echo)?),
        (None, Some(body)) => answer(body, settings.answer_type),
        _ => {
            return Err(fail(
                "handshake",
                &"each handshake answers with echo (where the value is) or answer (a fixed body)",
            ));
        }
    };
    Ok(Handshake {
        when: at("handshake.when", &settings.when)?,
        equals: settings.equals.clone(),
        answer,
    })
}

/// What `/send/<source>` sends through for a generic source with `[source.send]`: the
/// platform's message API as configured; `None` without one.
#[cfg(feature = "send")]
pub(super) fn sender(
    source: &SourceConfig,
    settings: &WebhookSettings,
    timeout: std::time::Duration,
) -> Result<Option<crate::api::send::Sender>, GatewayError> {
    let Some(send) = &settings.send else {
        return Ok(None);
    };
    let fail = |error: &dyn std::fmt::Display| platform_error(source, format!("send: {error}"));
    let headers = send
        .headers
        .iter()
        .map(|(name, secret)| {
            let value = secret
                .resolve()
                .map_err(|message| fail(&format!("headers.{name}: {message}")))?;
            Ok((name.clone(), value))
        })
        .collect::<Result<Vec<_>, GatewayError>>()?;
    let json =
        |value: &oncegate_config::TomlValue| serde_json::to_value(value).map_err(|e| fail(&e));
    let values =
        |list: &[oncegate_config::TomlValue]| list.iter().map(json).collect::<Result<Vec<_>, _>>();
    let set = send
        .set
        .iter()
        .map(|(pointer, value)| Ok((pointer.clone(), json(value)?)))
        .collect::<Result<Vec<_>, GatewayError>>()?;
    let ok_at = match &send.ok {
        Some(at) if send.ok_values.is_empty() => Some((at.clone(), vec![serde_json::json!(0)])),
        Some(at) => Some((at.clone(), values(&send.ok_values)?)),
        None => None,
    };
    let spec = oncegate_send::HttpApiSpec {
        url: send.url.clone(),
        headers,
        key_at: send.key.clone(),
        key_max: send.key_max.unwrap_or(32),
        set,
        dedups: send.dedups.unwrap_or(!send.key.is_empty()),
        ok_at,
        retry_codes: values(&send.retry_values)?,
        receiver_at: send.receiver.clone(),
        per_receiver: send
            .per_receiver_per_minute
            .map(|n| oncegate_send::Budget::per_minute(n, n.clamp(1, 5))),
        per_app: send.per_second.map(oncegate_send::Budget::per_second),
    };
    let scope = settings
        .app_id
        .clone()
        .unwrap_or_else(|| source.name.clone());
    let api = oncegate_send::HttpApi::new(spec, &scope, timeout).map_err(|e| fail(&e))?;
    Ok(crate::api::send::Sender::of(oncegate_send::Api::Http(api)))
}
