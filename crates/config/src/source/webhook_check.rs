//! The checks of `platform = "webhook"` sources: what `verify = "none"` and the DingTalk robot's
//! scheme risk, and `[source.send]`.

use crate::Severity;

/// A generic source that takes requests unchecked is at risk, said; a secret it would not check
/// is a mistake. The rest (a preset's name, where each value is) is checked where the source is
/// built, and said by check-config from there.
pub(super) fn check_webhook(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    webhook: &crate::WebhookSettings,
) {
    if webhook.preset.as_deref() == Some("dingtalk-robot") && webhook.signed.is_none() {
        report(
            Severity::AtRisk,
            &format!("{label}.preset"),
            format!(
                "source {name:?}: DingTalk's robot signature covers the timestamp and the secret, \
                 not the body, so a request read in transit could carry another message within \
                 the replay window ([replay] max_skew; each signature is taken once); serve it \
                 over HTTPS only, or receive the robot's messages in Stream mode \
                 (platform = \"dingtalk\", transport = \"stream\")"
            ),
        );
    }
    if let Some(send) = &webhook.send {
        check_send(report, label, name, send);
    }
    if webhook.verify != Some(crate::VerifyKind::None) {
        return;
    }
    if webhook.secrets().next().is_some() {
        report(
            Severity::Error,
            &format!("{label}.verify"),
            "a secret is set but verify = \"none\" checks nothing: set verify to how the \
             platform signs (hmac-sha256, token…), or remove the secret"
                .into(),
        );
    } else {
        report(
            Severity::AtRisk,
            &format!("{label}.verify"),
            format!(
                "source {name:?} accepts unauthenticated events (verify = \"none\"): anyone who \
                 knows the URL can send them; where the platform can carry a secret, put one in \
                 the URL and check it (verify = \"token\", signature = \"query:<name>\")"
            ),
        );
    }
}

/// `[source.send]`: a URL the sender can call, pointers it can write, and what it risks.
fn check_send(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    send: &crate::HttpSendSettings,
) {
    if !(send.url.starts_with("https://") || send.url.starts_with("http://")) {
        report(
            Severity::Error,
            &format!("{label}.send.url"),
            "the message API's http(s) URL is needed (url = \"https://…\")".into(),
        );
    } else if crate::checks::plain_http_off_host(&send.url) {
        report(
            Severity::AtRisk,
            &format!("{label}.send.url"),
            format!(
                "source {name:?} sends over plain http to another host: its headers (the API's \
                 credentials) and messages travel in clear; use https"
            ),
        );
    }
    let pointers = send
        .key
        .iter()
        .map(|p| ("key", p))
        .chain(send.set.keys().map(|p| ("set", p)))
        .chain(send.ok.iter().map(|p| ("ok", p)))
        .chain(send.receiver.iter().map(|p| ("receiver", p)));
    for (field, pointer) in pointers {
        if !pointer.starts_with('/') || pointer.len() < 2 {
            report(
                Severity::Error,
                &format!("{label}.send.{field}"),
                format!("{pointer:?} is not a JSON pointer to a field (/client_msg_id)"),
            );
        }
    }
    if send.key.is_empty() {
        report(
            Severity::Warning,
            &format!("{label}.send.key"),
            format!(
                "source {name:?} sends with no idempotency key: a send whose outcome is unknown \
                 (a timeout) is not sent again, since the API could not tell it from a new one; \
                 set key = [\"/client_msg_id\"] (or where the API reads one) if it takes one"
            ),
        );
    }
}
