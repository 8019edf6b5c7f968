//! The checks of every `[[source]]`.

use crate::checks::{Severity, plain_http_off_host, scheme_of};
use crate::*;
use std::collections::HashSet;

/// Every `[[source]]`: names, apps, secrets, transports.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let mut names = HashSet::new();
    let mut apps = HashSet::new();
    for (i, source) in config.sources.iter().enumerate() {
        let label = source_label(&config.sources, i);
        let at = |field: &str| format!("{label}.{field}");
        if source.name.is_empty()
            || !source
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            report(
                Severity::Error,
                &at("name"),
                format!(
                    "{:?}: use letters, digits, '-' and '_' only (it becomes the URL path)",
                    source.name
                ),
            );
        }
        if !names.insert(source.name.clone()) {
            report(
                Severity::Error,
                &at("name"),
                format!(
                    "{:?} is used by two sources; names must differ",
                    source.name
                ),
            );
        }
        let id_field = match source.platform {
            PlatformConfig::Wecom(_) => "corp_id",
            PlatformConfig::WecomAibot(_) => "bot_id",
            PlatformConfig::WecomSuite(_) => "suite_id",
            PlatformConfig::Dingtalk(_) => "app_key",
            _ => "app_id",
        };
        let template = crate::WecomSettings::is_template(&source.platform);
        if source.app_id().trim().is_empty() && !template {
            report(
                Severity::Error,
                &at(id_field),
                "empty; every source names its app".into(),
            );
        }
        if !template && !apps.insert(source.identity()) {
            report(
                Severity::Error,
                &at(id_field),
                format!(
                    "{:?} appears twice for one platform: both sources would share one app's \
                     events (a WeCom corp's apps differ by agent_id)",
                    source.app_id()
                ),
            );
        }
        let secrets: Vec<(&str, &Option<crate::Secret>)> = match &source.platform {
            PlatformConfig::Feishu(s) | PlatformConfig::Lark(s) => vec![
                ("encrypt_key", &s.encrypt_key),
                ("verification_token", &s.verification_token),
                ("app_secret", &s.app_secret),
            ],
            PlatformConfig::Wecom(crate::WecomSettings {
                token,
                encoding_aes_key,
                ..
            })
            | PlatformConfig::Wechat(crate::WechatSettings {
                token,
                encoding_aes_key,
                ..
            }) => vec![("token", token), ("encoding_aes_key", encoding_aes_key)],
            PlatformConfig::WecomSuite(suite) => vec![
                ("token", &suite.token),
                ("encoding_aes_key", &suite.encoding_aes_key),
                ("suite_secret", &suite.suite_secret),
            ],
            PlatformConfig::WecomAibot(aibot) => vec![("secret", &aibot.secret)],
            PlatformConfig::Dingtalk(dingtalk) => {
                if dingtalk.transport == crate::Transport::Websocket {
                    if dingtalk.app_secret.is_none() {
                        report(
                            Severity::Error,
                            &at("app_secret"),
                            "Stream mode registers with the app's Client Secret: set \
                             app_secret"
                                .into(),
                        );
                    }
                } else {
                    for (field, secret) in
                        [("token", &dingtalk.token), ("aes_key", &dingtalk.aes_key)]
                    {
                        if secret.is_none() {
                            report(
                                Severity::Error,
                                &at(field),
                                format!(
                                    "DingTalk signs and encrypts every callback: set the \
                                     subscription's {field} (or transport = \"stream\", which \
                                     needs app_secret instead)"
                                ),
                            );
                        }
                    }
                }
                vec![
                    ("token", &dingtalk.token),
                    ("aes_key", &dingtalk.aes_key),
                    ("app_secret", &dingtalk.app_secret),
                ]
            }
            PlatformConfig::Webhook(webhook) => {
                for (field, secret) in webhook.secrets() {
                    if let Err(message) = secret.resolve() {
                        report(Severity::Error, &at(field), message);
                    }
                }
                Vec::new()
            }
        };
        for (field, secret) in &secrets {
            if let Some(Err(message)) = secret.as_ref().map(crate::Secret::resolve) {
                report(Severity::Error, &at(field), message);
            }
        }
        match &source.platform {
            PlatformConfig::Feishu(feishu) | PlatformConfig::Lark(feishu) => {
                check_feishu_secrets(report, &label, &source.name, feishu);
            }
            PlatformConfig::WecomAibot(aibot) => {
                check_aibot(report, &label, aibot);
                if let Some(max) = config.dispatcher.max_queued {
                    report(
                        Severity::AtRisk,
                        "dispatcher.max_queued",
                        format!(
                            "source {:?} is a WeCom AI bot: WeCom never sends one of its \
                             callbacks again, so they are admitted beyond the bound of {max} \
                             queued events rather than refused and lost (counted in \
                             oncegate_admitted_over_bound_total); the bound holds for the \
                             other sources",
                            source.name
                        ),
                    );
                }
                if let StoreConfig::Redis(redis) = &config.store
                    && redis.spool.is_none()
                {
                    report(
                        Severity::AtRisk,
                        &label,
                        format!(
                            "source {:?} is a WeCom AI bot: WeCom sends each callback once over \
                             the long connection, with no ack to withhold, so a callback that \
                             comes while Redis cannot admit it (an outage longer than about a \
                             minute) is lost; set store.spool to keep such callbacks on disk \
                             until Redis answers",
                            source.name
                        ),
                    );
                }
            }
            PlatformConfig::WecomSuite(suite) => {
                check_suite(report, &label, &source.name, suite);
            }
            PlatformConfig::Webhook(webhook) => {
                super::webhook_check::check_webhook(report, &label, &source.name, webhook)
            }
            PlatformConfig::Dingtalk(dingtalk)
                if dingtalk.transport == crate::Transport::Websocket =>
            {
                if let StoreConfig::Redis(redis) = &config.store
                    && redis.spool.is_none()
                {
                    report(
                        Severity::AtRisk,
                        &label,
                        format!(
                            "source {:?} is DingTalk's Stream mode: a robot message that comes \
                             while Redis cannot admit it is acked with an error, and DingTalk \
                             documents robot messages as pushed once, so it can be lost; set \
                             store.spool to keep such messages on disk until Redis answers \
                             (events are acked LATER and pushed again)",
                            source.name
                        ),
                    );
                }
            }
            PlatformConfig::Dingtalk(_) => {}
            PlatformConfig::Wecom(wecom) if wecom.template => {
                check_template(report, &label, &source.name, wecom);
            }
            PlatformConfig::Wecom(crate::WecomSettings { token, .. })
            | PlatformConfig::Wechat(crate::WechatSettings { token, .. }) => {
                if token.is_none() {
                    report(
                        Severity::Error,
                        &at("token"),
                        "WeCom and WeChat sign every callback with the token; set it".into(),
                    );
                }
            }
        }
        if let PlatformConfig::Wecom(wecom) = &source.platform
            && !wecom.template
            && let Some(secret) = &wecom.secret
        {
            if let Err(message) = secret.resolve() {
                report(Severity::Error, &at("secret"), message);
            }
            if wecom
                .agent_id
                .as_deref()
                .is_none_or(|agent| agent.trim().parse::<i64>().is_err())
            {
                report(
                    Severity::Error,
                    &at("agent_id"),
                    "sending (secret is set) needs agent_id, the app's numeric AgentId".into(),
                );
            }
        }
        plain_transport(&source.platform, &at, report);
        if let PlatformConfig::Wecom(wecom) = &source.platform
            && wecom.encoding_aes_key.is_none()
            && !wecom.template
        {
            report(
                Severity::Error,
                &at("encoding_aes_key"),
                "WeCom encrypts every callback; set the EncodingAESKey".into(),
            );
        }
    }
}

/// A suite's callbacks are all signed and encrypted; its tenants live in the store, under a
/// namespace named by the source.
fn check_suite(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    suite: &crate::SuiteSettings,
) {
    let at = |field: &str| format!("{label}.{field}");
    if suite.token.is_none() {
        report(
            Severity::Error,
            &at("token"),
            "WeCom signs every suite callback with the token; set it".into(),
        );
    }
    if suite.encoding_aes_key.is_none() {
        report(
            Severity::Error,
            &at("encoding_aes_key"),
            "WeCom encrypts every suite callback; set the suite's EncodingAESKey".into(),
        );
    }
    if name.len() > MAX_SUITE_NAME {
        report(
            Severity::Error,
            &at("name"),
            format!(
                "{} characters: a suite's name keys its tenant registry, at most {MAX_SUITE_NAME}",
                name.len()
            ),
        );
    }
}

/// A template's corps bring their own secrets, from the registry: none in the file.
fn check_template(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    wecom: &crate::WecomSettings,
) {
    let at = |field: &str| format!("{label}.{field}");
    let given = [
        ("corp_id", !wecom.corp_id.is_empty()),
        ("agent_id", wecom.agent_id.is_some()),
        ("token", wecom.token.is_some()),
        ("encoding_aes_key", wecom.encoding_aes_key.is_some()),
        ("secret", wecom.secret.is_some()),
    ];
    for (field, _) in given.iter().filter(|(_, given)| *given) {
        report(
            Severity::Error,
            &at(field),
            format!(
                "a template's corps each bring their own {field}: leave it out here and give \
                 it in each corp's settings (oncegate tenants add {name} <corp id> --settings \
                 '{{\"token\": …, \"encoding_aes_key\": …, \"agent_id\": …}}')"
            ),
        );
    }
    if name.len() > MAX_SUITE_NAME {
        report(
            Severity::Error,
            &at("name"),
            format!(
                "{} characters: a template's name keys its tenant registry, at most \
                 {MAX_SUITE_NAME}",
                name.len()
            ),
        );
    }
}

/// The longest name of a source with a tenant registry (`tenants:<name>` is a store namespace).
const MAX_SUITE_NAME: usize = 48;

/// How problems name the source at `i`: `source[<name>]` when its name is usable and its own,
/// else by its place in the file (`source[0]`), which is all a nameless or doubled one has.
fn source_label(sources: &[crate::SourceConfig], i: usize) -> String {
    let name = sources.get(i).map_or("", |source| source.name.as_str());
    let usable = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && sources.iter().filter(|source| source.name == name).count() == 1;
    match usable {
        true => format!("source[{name}]"),
        false => format!("source[{i}]"),
    }
}

/// What a source's settings send or take in clear: a WeChat account in plain mode, a platform
/// domain over `http://` (the app secret and every token in clear).
pub(crate) fn plain_transport(
    platform: &crate::PlatformConfig,
    at: &dyn Fn(&str) -> String,
    report: &mut impl FnMut(Severity, &str, String),
) {
    use crate::PlatformConfig;
    let domain = match platform {
        PlatformConfig::Feishu(feishu) | PlatformConfig::Lark(feishu) => feishu.domain.as_deref(),
        PlatformConfig::Wecom(wecom) => wecom.domain.as_deref(),
        PlatformConfig::WecomAibot(aibot) => aibot.domain.as_deref(),
        PlatformConfig::WecomSuite(suite) => suite.domain.as_deref(),
        PlatformConfig::Dingtalk(dingtalk) => dingtalk.domain.as_deref(),
        PlatformConfig::Webhook(_) => None,
        PlatformConfig::Wechat(wechat) => {
            if wechat.encoding_aes_key.is_none() {
                report(
                    Severity::AtRisk,
                    &at("encoding_aes_key"),
                    "plain mode: the account's callbacks travel and are stored in clear, and \
                     their signature covers only the timestamp and nonce, not the message (a \
                     captured request can carry another body); switch the account to safe \
                     mode and set its EncodingAESKey"
                        .into(),
                );
            }
            if let Some(original_id) = wechat.original_id.as_deref()
                && !original_id.starts_with("gh_")
            {
                report(
                    Severity::Error,
                    &at("original_id"),
                    format!(
                        "{original_id:?} is not an original id: an Official Account's starts \
                         with gh_ (原始ID, in the account's settings); its messages carry it as \
                         ToUserName. Leave it out to check none"
                    ),
                );
            }
            None
        }
    };
    if let Some(domain) = domain.filter(|domain| plain_http_off_host(domain)) {
        report(
            Severity::AtRisk,
            &at("domain"),
            format!(
                "{}: the app secret and every access token go to it in clear; use https:// \
                 (http:// is meant for a server on this machine)",
                scheme_of(domain)
                    .replace("a \"http\" URL", "an http:// URL")
                    .replace("a \"ws\" URL", "a ws:// URL")
            ),
        );
    }
}

/// An AI bot subscribes with its secret, at a WebSocket address.
fn check_aibot(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    aibot: &crate::AibotSettings,
) {
    if aibot.secret.is_none() {
        report(
            Severity::Error,
            &format!("{label}.secret"),
            "the long connection subscribes with the bot's secret (its API settings, 长连接); \
             set it"
                .into(),
        );
    }
    if let Some(domain) = aibot.domain.as_deref()
        && !(domain.starts_with("wss://") || domain.starts_with("ws://"))
    {
        report(
            Severity::Error,
            &format!("{label}.domain"),
            format!(
                "{}: the long connection is a WebSocket; use wss://openws.work.weixin.qq.com \
                 (or ws:// to a server on this machine)",
                scheme_of(domain)
            ),
        );
    }
}

/// A Feishu source needs a secret, or an explicit opt-in to go without.
fn check_feishu_secrets(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    feishu: &crate::FeishuSettings,
) {
    let at = |field: &str| format!("{label}.{field}");
    if let Some(bot) = &feishu.bot_open_id
        && (!bot.starts_with("ou_") || bot.len() < 4 || bot.chars().any(char::is_whitespace))
    {
        report(
            Severity::Error,
            &at("bot_open_id"),
            format!(
                "source {name:?}: bot_open_id {bot:?} is not an open_id; it is the bot's \
                 `ou_…` id as GET /open-apis/bot/v3/info answers it (or leave it out: then any \
                 mention in a group message counts as one of the bot)"
            ),
        );
    }
    if feishu.store_app && feishu.transport == crate::Transport::Websocket {
        report(
            Severity::Error,
            &at("transport"),
            format!(
                "source {name:?} is a store app: Feishu gives store apps no long connection; \
                 remove transport = \"websocket\" and point the app's event URL at \
                 /webhook/{name}"
            ),
        );
    }
    if feishu.store_app && feishu.app_secret.is_none() {
        report(
            Severity::Error,
            &at("app_secret"),
            format!(
                "source {name:?} is a store app: set app_secret, with which the gateway asks \
                 Feishu for the app_ticket and fetches each tenant's token"
            ),
        );
    }
    if feishu.transport == crate::Transport::Websocket {
        check_long_connection(report, label, name, feishu);
        return;
    }
    // app_secret and domain also serve /send; only the connection's own settings are idle.
    for (field, set) in [
        ("pong_grace", feishu.pong_grace.is_some()),
        ("connections", feishu.connections != 1),
        ("instances", feishu.instances != crate::Instances::All),
    ] {
        if set {
            report(
                Severity::Warning,
                &at(field),
                format!(
                    "source {name:?} takes webhooks: {field} is for transport = \"websocket\" \
                     and is not used"
                ),
            );
        }
    }
    let secured = feishu.encrypt_key.is_some() || feishu.verification_token.is_some();
    if !secured && !feishu.allow_unsigned {
        report(
            Severity::Error,
            label,
            format!(
                "source {name:?} has neither encrypt_key nor verification_token: anyone who knows \
                 the URL could send events. Set at least one (both for Feishu), or set \
                 allow_unsigned = true to accept unauthenticated events on purpose"
            ),
        );
    } else if !secured {
        report(
            Severity::AtRisk,
            &at("allow_unsigned"),
            format!(
                "source {name:?} accepts unauthenticated events: anyone who knows the URL can send \
                 them"
            ),
        );
    } else if feishu.allow_unsigned {
        report(
            Severity::Error,
            &at("allow_unsigned"),
            "set together with a secret: remove allow_unsigned, the secret is checked".into(),
        );
    }
}

/// A long connection needs the app secret (the endpoint asks for it), at most 50 connections,
/// and an http(s) domain; the connection, not a token, authenticates its events.
fn check_long_connection(
    report: &mut impl FnMut(Severity, &str, String),
    label: &str,
    name: &str,
    feishu: &crate::FeishuSettings,
) {
    let at = |field: &str| format!("{label}.{field}");
    if feishu.app_secret.is_none() {
        report(
            Severity::Error,
            &at("app_secret"),
            format!(
                "source {name:?} uses the long connection: set app_secret (the app's App \
                 Secret), which the endpoint asks for"
            ),
        );
    }
    if !(1..=50).contains(&feishu.connections) {
        report(
            Severity::Error,
            &at("connections"),
            format!(
                "connections = {}: Feishu allows 1 to 50 long connections per app",
                feishu.connections
            ),
        );
    }
    if let Some(domain) = &feishu.domain
        && !(domain.starts_with("https://") || domain.starts_with("http://"))
    {
        report(
            Severity::Error,
            &at("domain"),
            format!(
                "{} is not an http(s) URL: use https://open.feishu.cn or \
                 https://open.larksuite.com",
                scheme_of(domain)
            ),
        );
    }
    if feishu.allow_unsigned {
        report(
            Severity::Warning,
            &at("allow_unsigned"),
            "the long connection is authenticated by the app secret; allow_unsigned is not used"
                .into(),
        );
    }
}
