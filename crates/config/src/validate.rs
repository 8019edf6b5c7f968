//! Checks that every setting makes sense on its own and with the others.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use crate::{Config, PLATFORM_RETRY_SPAN, PlatformConfig, StoreConfig};

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Works, but probably not as meant.
    Warning,
    /// The gateway refuses to start.
    Error,
}

/// One problem with one setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// The setting, e.g. `dedup.retention`.
    pub setting: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{label}: {}: {}", self.setting, self.message)
    }
}

fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// How a URL that is refused is named in messages: by its scheme, never with its credentials.
fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => format!("a {:?} URL", scheme.chars().take(16).collect::<String>()),
        None => "the value (no scheme://)".to_owned(),
    }
}

/// `url` is `http://` to a host other than this machine: what goes to it travels in clear.
fn plain_http_off_host(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("ws://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    !(host == "localhost" || host == "::1" || host.starts_with("127."))
}

/// What a source's settings send or take in clear: a WeChat account in plain mode, a platform
/// domain over `http://` (the app secret and every token in clear).
fn plain_transport(
    platform: &crate::PlatformConfig,
    at: &dyn Fn(&str) -> String,
    report: &mut impl FnMut(Severity, &str, String),
) {
    use crate::PlatformConfig;
    let domain = match platform {
        PlatformConfig::Feishu(feishu) | PlatformConfig::Lark(feishu) => feishu.domain.as_deref(),
        PlatformConfig::Wecom(wecom) => wecom.domain.as_deref(),
        PlatformConfig::WecomAibot(aibot) => aibot.domain.as_deref(),
        PlatformConfig::Wechat(wechat) => {
            if wechat.encoding_aes_key.is_none() {
                report(
                    Severity::Warning,
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
            Severity::Warning,
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
            Severity::Warning,
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

/// The largest value each numeric setting may take: beyond these a setting is a typo, and some
/// (a concurrency of 3e18) would make the gateway fail at run time instead of at start.
fn bounds(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let count =
        |report: &mut dyn FnMut(Severity, &str, String), setting: &str, value: u64, max: u64| {
            if value > max {
                report(
                    Severity::Error,
                    setting,
                    format!("{value} is more than the largest sensible value, {max}"),
                );
            }
        };
    let time = |report: &mut dyn FnMut(Severity, &str, String),
                setting: &str,
                value: Duration,
                max: Duration| {
        if value > max {
            report(
                Severity::Error,
                setting,
                format!(
                    "{} is longer than the longest sensible value, {}",
                    human(value),
                    human(max)
                ),
            );
        }
    };
    const HOUR: Duration = Duration::from_secs(3600);
    let d = &config.dispatcher;
    count(
        report,
        "dispatcher.concurrency",
        d.concurrency as u64,
        100_000,
    );
    count(
        report,
        "dispatcher.max_attempts",
        u64::from(d.max_attempts),
        1_000,
    );
    time(report, "dispatcher.backoff_max", d.backoff_max, 24 * HOUR);
    time(
        report,
        "dispatcher.shutdown_grace",
        d.shutdown_grace,
        HOUR / 6,
    );
    if d.max_queued == Some(0) {
        report(
            Severity::Error,
            "dispatcher.max_queued",
            "a bound of zero refuses every event; leave it out for no bound".into(),
        );
    }
    count(
        report,
        "dispatcher.max_queued",
        d.max_queued.unwrap_or(0),
        1_000_000_000,
    );
    time(
        report,
        "dedup.retention",
        config.dedup.retention,
        30 * 24 * HOUR,
    );
    count(
        report,
        "replay.max_nonces",
        config.replay.max_nonces as u64,
        100_000_000,
    );
    match &config.store {
        StoreConfig::Memory(memory) => {
            count(
                report,
                "store.max_records",
                memory.max_records,
                1_000_000_000,
            );
        }
        StoreConfig::Embedded(embedded) => {
            count(
                report,
                "store.max_records",
                embedded.max_records,
                1_000_000_000,
            );
        }
        StoreConfig::Redis(redis) => {
            count(report, "store.spool_max", redis.spool_max, 100_000_000);
            time(
                report,
                "store.ownership",
                redis.ownership.unwrap_or_default(),
                HOUR / 6,
            );
            time(
                report,
                "store.handover",
                redis.handover.unwrap_or_default(),
                HOUR,
            );
        }
    }
    let server = &config.server;
    count(
        report,
        "server.body_limit",
        server.body_limit as u64,
        64 << 20,
    );
    count(
        report,
        "server.max_connections",
        server.max_connections as u64,
        1_000_000,
    );
    if server.max_connections == 0 {
        report(
            Severity::Error,
            "server.max_connections",
            "zero connections serve nothing; 1024 is the default".into(),
        );
    }
    for (setting, value, max) in [
        ("server.header_timeout", server.header_timeout, HOUR / 12),
        ("server.body_timeout", server.body_timeout, HOUR / 12),
        ("server.log_interval", server.log_interval, HOUR),
    ] {
        if value < Duration::from_millis(100) {
            report(
                Severity::Error,
                setting,
                format!(
                    "{} is too short to be useful; use at least 100ms",
                    human(value)
                ),
            );
        }
        time(report, setting, value, max);
    }
    for (i, route) in config.routes.iter().enumerate() {
        time(
            report,
            &format!("route[{i}].timeout"),
            route.timeout,
            HOUR / 6,
        );
    }
}

/// The API's callers: named once each, with a token that resolves, and a bounded lease.
fn check_api(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let mut names = std::collections::HashSet::new();
    for (i, caller) in config.api.callers.iter().enumerate() {
        let at = |field: &str| format!("api.caller[{i}].{field}");
        if caller.name.trim().is_empty() || !names.insert(caller.name.as_str()) {
            report(
                Severity::Error,
                &at("name"),
                format!(
                    "{:?}: every caller needs a name of its own (logs and metrics tell them apart)",
                    caller.name
                ),
            );
        }
        if caller.namespace.trim().is_empty() {
            report(
                Severity::Error,
                &at("namespace"),
                "is empty: leave it out for \"default\"".into(),
            );
        }
        if let Err(message) = caller.token.resolve() {
            report(Severity::Error, &at("token"), message);
        }
        if caller.results_max == Some(0) || caller.result_bytes_max == Some(0) {
            report(
                Severity::Error,
                &at(if caller.results_max == Some(0) {
                    "results_max"
                } else {
                    "result_bytes_max"
                }),
                "0 would refuse every result: leave it out for the default".into(),
            );
        }
    }
    if config.api.max_lease < Duration::from_secs(1)
        || config.api.max_lease > Duration::from_secs(24 * 3600)
    {
        report(
            Severity::Error,
            "api.max_lease",
            format!(
                "{}: between 1s and 24h (a lease outliving its holder blocks the key that long)",
                human(config.api.max_lease)
            ),
        );
    }
    if !(1..=1_000_000).contains(&config.api.max_waiting_sends) {
        report(
            Severity::Error,
            "api.max_waiting_sends",
            format!("{}: between 1 and 1000000", config.api.max_waiting_sends),
        );
    }
    if config.api.max_wait > Duration::from_secs(300) {
        report(
            Severity::Error,
            "api.max_wait",
            format!(
                "{}: at most 5m (a caller waiting longer holds a connection that long)",
                human(config.api.max_wait)
            ),
        );
    }
}

/// Every problem of `config`, errors first.
pub fn validate(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut report = |severity: Severity, setting: &str, message: String| {
        problems.push(Problem {
            severity,
            setting: setting.to_owned(),
            message,
        });
    };

    if config.dedup.retention < PLATFORM_RETRY_SPAN {
        report(
            Severity::Error,
            "dedup.retention",
            format!(
                "{} is shorter than the platform's retry span (Feishu re-delivers for about {}: \
                 after 15 s, 5 min, 1 h and 6 h); a late retry would be taken for a new event. \
                 Use at least {}; 24h is the default",
                human(config.dedup.retention),
                human(PLATFORM_RETRY_SPAN),
                human(PLATFORM_RETRY_SPAN)
            ),
        );
    }
    if config.dedup.business_keys.is_some() {
        report(
            Severity::Warning,
            "dedup.business_keys",
            "has no effect: business keys are claimed through the API ([api], /keys); remove \
             the line"
                .into(),
        );
    }
    if !config.dedup.event_id && !config.replay.enabled {
        report(
            Severity::Error,
            "dedup",
            "every dedup layer is switched off (dedup.event_id and replay.enabled are both \
             false): every platform retry would run again. Remove dedup.event_id (it is always \
             on)"
            .into(),
        );
    } else if !config.dedup.event_id {
        report(
            Severity::Error,
            "dedup.event_id",
            "event-id dedup cannot be switched off: platform retries and resent frames would \
             run again. It is the layer everything else relies on; remove the line"
                .into(),
        );
    }
    if config.dedup.message_id && !config.dedup.event_id {
        report(
            Severity::Error,
            "dedup.message_id",
            "message-id dedup is an addition to event-id dedup, which is off".into(),
        );
    }
    if config.lease.duration.is_zero() {
        report(
            Severity::Error,
            "lease.duration",
            "a zero lease lets every worker claim every event at once; use e.g. \"5m\"".into(),
        );
    }
    if config.lease.renew_every.is_zero() {
        report(
            Severity::Error,
            "lease.renew_every",
            "must be more than zero; use about a fifth of lease.duration".into(),
        );
    } else if config.lease.renew_every >= config.lease.duration {
        report(
            Severity::Error,
            "lease.renew_every",
            format!(
                "{} is not shorter than lease.duration ({}): a lease would run out before its \
                 renewal and a second worker could take a running event. Use about a fifth of \
                 the lease",
                human(config.lease.renew_every),
                human(config.lease.duration)
            ),
        );
    }
    if config.lease.duration > config.dedup.retention {
        report(
            Severity::Error,
            "lease.duration",
            format!(
                "{} is longer than dedup.retention ({}); a record must outlive its lease",
                human(config.lease.duration),
                human(config.dedup.retention)
            ),
        );
    }
    if config.replay.enabled {
        if config.replay.max_skew.is_zero() {
            report(
                Severity::Error,
                "replay.max_skew",
                "a zero skew refuses every request; use e.g. \"5m\"".into(),
            );
        } else if config.replay.max_skew > Duration::from_secs(3600) {
            report(
                Severity::Error,
                "replay.max_skew",
                format!(
                    "{} lets a captured request be replayed for that long; use at most 1h \
                     (5m is usual)",
                    human(config.replay.max_skew)
                ),
            );
        }
        if config.replay.max_nonces == 0 {
            report(
                Severity::Error,
                "replay.max_nonces",
                "zero nonces refuses every request; use e.g. 100000".into(),
            );
        }
    }
    let partitions = config.store.partitions();
    if partitions == 0 || partitions > 4096 {
        report(
            Severity::Error,
            "store.partitions",
            format!("{partitions} partitions; use between 1 and 4096 (16 is the default)"),
        );
    }
    match &config.store {
        StoreConfig::Memory(memory) => {
            if memory.max_records == 0 {
                report(
                    Severity::Error,
                    "store.max_records",
                    "zero records can hold nothing; leave it out for the default".into(),
                );
            }
        }
        StoreConfig::Embedded(embedded) => {
            if embedded.max_records == 0 {
                report(
                    Severity::Error,
                    "store.max_records",
                    "zero records can hold nothing; leave it out for the default".into(),
                );
            }
            if embedded.cache_mb.is_some() {
                report(
                    Severity::Warning,
                    "store.cache_mb",
                    "the embedded store keeps its records in memory and journals every change: \
                     it has no page cache any more, so cache_mb is not used; remove it"
                        .into(),
                );
            }
        }
        StoreConfig::Redis(redis) => {
            if redis.url.trim().is_empty() {
                report(
                    Severity::Error,
                    "store.url",
                    "backend = \"redis\" needs a url, e.g. \"redis://127.0.0.1:6379\"".into(),
                );
            } else if redis.url.starts_with("redis+sentinel://") {
                if redis.cluster {
                    report(
                        Severity::Error,
                        "store.cluster",
                        "a redis+sentinel:// URL names a primary the sentinels watch, not a                          cluster: leave cluster out"
                            .into(),
                    );
                }
            } else if let Some(bad) = redis
                .url
                .split(',')
                .map(str::trim)
                .find(|url| !(url.starts_with("redis://") || url.starts_with("rediss://")))
            {
                report(
                    Severity::Error,
                    "store.url",
                    // Not the URL itself: it may carry a password.
                    format!(
                        "{} is not a redis://, rediss:// or redis+sentinel:// URL",
                        scheme_of(bad)
                    ),
                );
            }
            durability(redis, &mut report);
            if redis
                .ownership
                .is_some_and(|o| o < Duration::from_millis(200))
            {
                report(
                    Severity::Error,
                    "store.ownership",
                    "below 200ms partitions would change hands between two pulls; 10s is the \
                     default"
                        .into(),
                );
            }
            if redis.spool.is_some() && redis.spool_max == 0 {
                report(
                    Severity::Error,
                    "store.spool_max",
                    "a spool of zero admissions holds nothing; leave it out for 1000000".into(),
                );
            }
        }
    }
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
            _ => "app_id",
        };
        if source.app_id().trim().is_empty() {
            report(
                Severity::Error,
                &at(id_field),
                "empty; every source names its app".into(),
            );
        }
        if !apps.insert(source.identity()) {
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
            PlatformConfig::WecomAibot(aibot) => vec![("secret", &aibot.secret)],
        };
        for (field, secret) in &secrets {
            if let Some(Err(message)) = secret.as_ref().map(crate::Secret::resolve) {
                report(Severity::Error, &at(field), message);
            }
        }
        match &source.platform {
            PlatformConfig::Feishu(feishu) | PlatformConfig::Lark(feishu) => {
                check_feishu_secrets(&mut report, &label, &source.name, feishu);
            }
            PlatformConfig::WecomAibot(aibot) => {
                check_aibot(&mut report, &label, aibot);
                if let StoreConfig::Redis(redis) = &config.store
                    && redis.spool.is_none()
                {
                    report(
                        Severity::Warning,
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
        plain_transport(&source.platform, &at, &mut report);
        if let PlatformConfig::Wecom(wecom) = &source.platform
            && wecom.encoding_aes_key.is_none()
        {
            report(
                Severity::Error,
                &at("encoding_aes_key"),
                "WeCom encrypts every callback; set the EncodingAESKey".into(),
            );
        }
    }
    for (what, address) in [
        ("server.listen", &config.server.listen),
        ("server.admin_listen", &config.server.admin_listen),
    ] {
        if address.parse::<std::net::SocketAddr>().is_err() {
            report(
                Severity::Error,
                what,
                format!("{address:?} is not an address and port, e.g. \"127.0.0.1:8080\""),
            );
        }
    }
    if config.server.listen == config.server.admin_listen && !config.server.listen.ends_with(":0") {
        report(
            Severity::Error,
            "server.admin_listen",
            "the same address as server.listen; the admin API needs its own listener".into(),
        );
    }
    if config.server.body_limit < 1024 {
        report(
            Severity::Error,
            "server.body_limit",
            format!(
                "{} bytes cannot hold a callback; use at least 65536",
                config.server.body_limit
            ),
        );
    }
    if let Some(Err(message)) = config
        .server
        .admin_token
        .as_ref()
        .map(crate::Secret::resolve)
    {
        report(Severity::Error, "server.admin_token", message);
    }
    let admin_public = config
        .server
        .admin_listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|address| !address.ip().is_loopback());
    if admin_public && config.server.admin_token.is_none() {
        report(
            Severity::Error,
            "server.admin_token",
            format!(
                "server.admin_listen {:?} is reachable from other machines, and the admin API \
                 shows records and dead letters: set admin_token (e.g. {{ env = \"ONCEGATE_ADMIN_TOKEN\" }}) \
                 or listen on 127.0.0.1",
                config.server.admin_listen
            ),
        );
    }
    bounds(config, &mut report);
    check_api(config, &mut report);
    if config.dispatcher.concurrency == 0 {
        report(
            Severity::Error,
            "dispatcher.concurrency",
            "zero handlers can run nothing; use e.g. 64".into(),
        );
    }
    if config.dispatcher.max_attempts == 0 {
        report(
            Severity::Error,
            "dispatcher.max_attempts",
            "must be at least 1".into(),
        );
    }
    if config.dispatcher.backoff_base > config.dispatcher.backoff_max {
        report(
            Severity::Error,
            "dispatcher.backoff_base",
            format!(
                "{} is longer than dispatcher.backoff_max ({})",
                human(config.dispatcher.backoff_base),
                human(config.dispatcher.backoff_max)
            ),
        );
    }
    if config.sources.is_empty() && config.api.callers.is_empty() {
        report(
            Severity::Warning,
            "source",
            "no [[source]] and no [[api.caller]]: the gateway takes no events and serves no API \
             (add a source: README \"Platforms\"; in a container, mount a configuration that has one)"
                .into(),
        );
    }
    if !config.sources.is_empty() && config.routes.is_empty() {
        report(
            Severity::Warning,
            "route",
            "no [[route]]: events are admitted and acknowledged but go nowhere".into(),
        );
    }
    for (i, route) in config.routes.iter().enumerate() {
        let at = |field: &str| format!("route[{i}].{field}");
        if route.events.is_empty() || route.events.iter().any(|e| e.trim().is_empty()) {
            report(
                Severity::Error,
                &at("events"),
                "name at least one event type (exact, a prefix ending in *, or *)".into(),
            );
        }
        match route.sink {
            crate::SinkKind::Http => match &route.url {
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                Some(url) => report(
                    Severity::Error,
                    &at("url"),
                    format!("{} is not an http:// or https:// URL", scheme_of(url)),
                ),
                None => report(
                    Severity::Error,
                    &at("url"),
                    "sink = \"http\" needs a url".into(),
                ),
            },
            crate::SinkKind::File => {
                if route.path.is_none() {
                    report(
                        Severity::Error,
                        &at("path"),
                        "sink = \"file\" needs a path".into(),
                    );
                }
            }
            crate::SinkKind::Stdout => {}
        }
        if route.sink != crate::SinkKind::Http && (route.url.is_some() || route.secret.is_some()) {
            report(
                Severity::Error,
                &at("url"),
                "url and secret belong to sink = \"http\"".into(),
            );
        }
        let named = route
            .secret
            .iter()
            .map(|secret| ("secret".to_owned(), secret));
        let previous = route
            .previous_secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| (format!("previous_secrets[{i}]"), secret));
        for (field, secret) in named.chain(previous) {
            match secret.resolve() {
                Err(message) => report(Severity::Error, &at(&field), message),
                Ok(value) if !value.starts_with("whsec_") => report(
                    Severity::Error,
                    &at(&field),
                    "a Standard Webhooks secret is \"whsec_\" followed by base64".into(),
                ),
                Ok(_) => {}
            }
        }
        if let Some(key) = &route.signing_key {
            match key.resolve() {
                Err(message) => report(Severity::Error, &at("signing_key"), message),
                Ok(value) if !value.starts_with("whsk_") => report(
                    Severity::Error,
                    &at("signing_key"),
                    "an asymmetric signing key is \"whsk_\" followed by the base64 of an \
                     Ed25519 key"
                        .into(),
                ),
                Ok(_) => {}
            }
            if route.sink != crate::SinkKind::Http {
                report(
                    Severity::Error,
                    &at("signing_key"),
                    "signing_key belongs to sink = \"http\"".into(),
                );
            }
        }
        if !route.previous_secrets.is_empty() && route.secret.is_none() {
            report(
                Severity::Error,
                &at("previous_secrets"),
                "secrets being rotated out need the new one: set secret".into(),
            );
        }
        if route.sink == crate::SinkKind::Http
            && route.secret.is_none()
            && route.signing_key.is_none()
        {
            report(
                Severity::Warning,
                &at("secret"),
                "an http route without a secret sends unsigned requests: the receiver cannot \
                 tell them from forgeries. Set secret = \"whsec_...\""
                    .into(),
            );
        }
        if route.timeout.is_zero() {
            report(
                Severity::Error,
                &at("timeout"),
                "a zero timeout fails every delivery".into(),
            );
        }
        let cards = route
            .events
            .iter()
            .any(|e| e == "card.action.trigger" || e == "url.preview.get");
        if cards && route.sink != crate::SinkKind::Http {
            report(
                Severity::Error,
                &at("sink"),
                "card callbacks are answered with the sink's reply, so they need sink = \"http\""
                    .into(),
            );
        }
        if route.reply && route.sink != crate::SinkKind::Http {
            report(
                Severity::Error,
                &at("reply"),
                "a passive reply is the sink's answer, so reply = true needs sink = \"http\""
                    .into(),
            );
        }
        if route.reply && route.watermark {
            report(
                Severity::Error,
                &at("watermark"),
                "a replying route handles events as they arrive, not in chat order: \
                 a watermark cannot apply; use a queued route for these events"
                    .into(),
            );
        }
    }
    problems.sort_by_key(|p| std::cmp::Reverse(p.severity));
    problems
}

/// `store.durability` and its companions; what `memory` can lose is said here, and again with
/// the server's own settings at start and by `check-config`.
fn durability(redis: &crate::RedisSettings, report: &mut impl FnMut(Severity, &str, String)) {
    use crate::RedisDurabilityMode as Mode;
    match redis.durability {
        Mode::Replicas => {
            if redis.min_replicas == 0 {
                report(
                    Severity::Error,
                    "store.min_replicas",
                    "durability = \"replicas\" waits for at least one replica; set \
                     min_replicas = 1 or more"
                        .into(),
                );
            }
            let wait = redis.replica_wait.unwrap_or(Duration::from_millis(500));
            if wait.is_zero() || wait > Duration::from_millis(1500) {
                report(
                    Severity::Error,
                    "store.replica_wait",
                    "between 1ms and 1500ms (each Redis call has 2s); 500ms is the default".into(),
                );
            }
        }
        Mode::Fsync | Mode::Memory => {
            if redis.min_replicas != 1 || redis.replica_wait.is_some() {
                report(
                    Severity::Warning,
                    "store.min_replicas",
                    "min_replicas and replica_wait apply to durability = \"replicas\" only; \
                     they have no effect here"
                        .into(),
                );
            }
        }
    }
    if redis.durability == Mode::Memory {
        report(
            Severity::Warning,
            "store.durability",
            "durability = \"memory\": acknowledged events live in Redis memory and are lost \
             with it (a Redis restart without persistence, a failover before the replica \
             received them); the platform will not send them again. Choose \"fsync\" or \
             \"replicas\" to keep them"
                .into(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Secret, SourceConfig};

    #[test]
    fn a_replying_route_needs_http_and_no_watermark() {
        let route = |sink, watermark| crate::RouteConfig {
            events: vec!["message.text".into()],
            sink,
            url: Some("http://127.0.0.1:1/reply".into()),
            secret: None,
            previous_secrets: Vec::new(),
            signing_key: None,
            path: Some("x.jsonl".into()),
            timeout: Duration::from_secs(1),
            watermark,
            reply: true,
        };
        let mut config = Config::default();
        config.routes.push(route(crate::SinkKind::File, false));
        config.routes[0].url = None;
        assert_eq!(errors(&config), ["route[0].reply"]);
        config.routes[0] = route(crate::SinkKind::Http, true);
        config.routes[0].path = None;
        assert_eq!(errors(&config), ["route[0].watermark"]);
        config.routes[0].watermark = false;
        assert_eq!(errors(&config), Vec::<String>::new());
    }

    fn errors(config: &Config) -> Vec<String> {
        validate(config)
            .into_iter()
            .filter(|p| p.severity == Severity::Error)
            .map(|p| p.setting)
            .collect()
    }

    #[test]
    fn the_defaults_are_valid() {
        // Valid, and said to serve nothing until a source (or an API caller) is added.
        let said: Vec<String> = validate(&Config::default())
            .into_iter()
            .map(|p| format!("{:?} {}", p.severity, p.setting))
            .collect();
        assert_eq!(said, ["Warning source"]);
    }

    fn redis(url: &str) -> crate::RedisSettings {
        crate::RedisSettings {
            url: url.into(),
            ..crate::RedisSettings::default()
        }
    }

    #[test]
    fn a_spool_needs_room() {
        let mut settings = redis("redis://127.0.0.1:6379");
        settings.spool = Some("spool.redb".into());
        let mut config = Config {
            store: StoreConfig::Redis(settings.clone()),
            ..Config::default()
        };
        assert_eq!(errors(&config), Vec::<String>::new());
        settings.spool_max = 0;
        config.store = StoreConfig::Redis(settings);
        assert_eq!(errors(&config), ["store.spool_max"]);
    }

    #[test]
    fn retention_shorter_than_the_retry_span_is_refused() {
        let mut config = Config::default();
        config.dedup.retention = Duration::from_secs(6 * 3600);
        let problems: Vec<_> = validate(&config)
            .into_iter()
            .filter(|p| p.setting != "source")
            .collect();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].setting, "dedup.retention");
        assert!(problems[0].message.contains("7h 18m"), "{}", problems[0]);
        config.dedup.retention = PLATFORM_RETRY_SPAN;
        assert_eq!(errors(&config), Vec::<String>::new());
    }

    #[test]
    fn all_layers_off_is_refused() {
        let mut config = Config::default();
        config.dedup.event_id = false;
        config.dedup.message_id = false;
        config.replay.enabled = false;
        assert_eq!(errors(&config), vec!["dedup".to_owned()]);
    }

    #[test]
    fn contradictions_are_each_named() {
        let mut config = Config::default();
        config.lease.renew_every = Duration::from_secs(600);
        config.store = StoreConfig::Memory(crate::MemorySettings {
            partitions: 0,
            ..crate::MemorySettings::default()
        });
        config.replay.max_skew = Duration::from_secs(86_400);
        let mut found = errors(&config);
        found.sort();
        assert_eq!(
            found,
            vec!["lease.renew_every", "replay.max_skew", "store.partitions",]
        );
        let mut config = Config {
            store: StoreConfig::Redis(redis("")),
            ..Config::default()
        };
        assert_eq!(errors(&config), vec!["store.url"]);
        config.store = StoreConfig::Redis(redis("http://:pw@x"));
        let problems = validate(&config);
        assert_eq!(problems[0].setting, "store.url");
        assert!(!problems[0].message.contains("pw"), "{}", problems[0]);
        config.store = StoreConfig::Redis(redis("redis://127.0.0.1:6379"));
        assert_eq!(errors(&config), Vec::<String>::new());
    }

    #[test]
    fn sources_are_checked() {
        let source = |name: &str, app: &str| SourceConfig {
            name: name.into(),
            platform: PlatformConfig::Feishu(crate::FeishuSettings {
                app_id: app.into(),
                encrypt_key: Some(Secret::Inline("k".into())),
                verification_token: Some(Secret::Env {
                    env: "ONCEGATE_TEST_UNSET_TOKEN".into(),
                }),
                ..crate::FeishuSettings::default()
            }),
        };
        let config = Config {
            sources: vec![
                source("a", "cli_1"),
                source("a", "cli_1"),
                source("b c", ""),
            ],
            ..Config::default()
        };
        let found = errors(&config);
        assert!(found.contains(&"source[1].name".to_owned()), "{found:?}");
        assert!(found.contains(&"source[1].app_id".to_owned()), "{found:?}");
        assert!(found.contains(&"source[2].name".to_owned()), "{found:?}");
        assert!(found.contains(&"source[2].app_id".to_owned()), "{found:?}");
        // Named twice: by place, not by the name both share.
        assert!(
            found.contains(&"source[0].verification_token".to_owned()),
            "{found:?}"
        );
    }

    fn feishu(encrypt_key: Option<Secret>, token: Option<Secret>) -> SourceConfig {
        SourceConfig {
            name: "main".into(),
            platform: PlatformConfig::Feishu(crate::FeishuSettings {
                app_id: "cli_1".into(),
                encrypt_key,
                verification_token: token,
                ..crate::FeishuSettings::default()
            }),
        }
    }

    #[test]
    fn a_long_connection_needs_its_secret_and_at_most_fifty_connections() {
        let mut config = Config {
            sources: vec![feishu(None, None)],
            ..Config::default()
        };
        let settings = feishu_settings(&mut config);
        settings.transport = crate::Transport::Websocket;
        settings.connections = 51;
        settings.domain = Some("open.feishu.cn".into());
        let found = errors(&config);
        for field in ["app_secret", "connections", "domain"] {
            assert!(
                found.contains(&format!("source[main].{field}")),
                "{field}: {found:?}"
            );
        }
        // No encrypt key or token is asked of it: the connection authenticates.
        assert!(!found.contains(&"source[main]".to_owned()), "{found:?}");
        let settings = feishu_settings(&mut config);
        settings.app_secret = Some(Secret::Inline("s".into()));
        settings.connections = 50;
        settings.domain = Some("https://open.larksuite.com".into());
        assert!(errors(&config).is_empty(), "{:?}", errors(&config));
        // A webhook source with long-connection settings is told they are not used.
        let settings = feishu_settings(&mut config);
        settings.transport = crate::Transport::Webhook;
        settings.connections = 3;
        settings.verification_token = Some(Secret::Inline("t".into()));
        let warned: Vec<String> = validate(&config)
            .into_iter()
            .filter(|p| p.severity == Severity::Warning)
            .map(|p| p.setting)
            .collect();
        assert!(
            warned.contains(&"source[main].connections".to_owned()),
            "{warned:?}"
        );
        assert!(
            !warned.contains(&"source[main].app_secret".to_owned()),
            "the app secret sends: {warned:?}"
        );
    }

    fn feishu_settings(config: &mut Config) -> &mut crate::FeishuSettings {
        match &mut config.sources[0].platform {
            PlatformConfig::Feishu(settings) => settings,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_empty_secret_is_an_error_naming_the_source_and_setting() {
        // Removed with the test, not left in the temporary folder.
        let dir = tempfile::tempdir().expect("dir");
        let newline = dir.path().join("newline");
        std::fs::write(&newline, "\n").expect("write");
        // An empty environment variable is tested through the binary (crates/cli/tests).
        for (key, token) in [
            (
                Secret::Inline(String::new()),
                Secret::File {
                    file: newline.clone(),
                },
            ),
            (
                Secret::File {
                    file: newline.clone(),
                },
                Secret::Inline("  ".into()),
            ),
        ] {
            let config = Config {
                sources: vec![feishu(Some(key), Some(token))],
                ..Config::default()
            };
            let problems: Vec<Problem> = validate(&config)
                .into_iter()
                .filter(|p| p.severity == Severity::Error)
                .collect();
            let settings: Vec<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
            assert_eq!(
                settings,
                [
                    "source[main].encrypt_key",
                    "source[main].verification_token"
                ],
                "{problems:?}"
            );
            assert!(
                problems.iter().all(|p| p.message.contains("empty")),
                "{problems:?}"
            );
        }
    }

    #[test]
    fn a_source_without_secrets_needs_an_explicit_opt_in() {
        let mut config = Config {
            sources: vec![feishu(None, None)],
            ..Config::default()
        };
        assert_eq!(errors(&config), ["source[main]"]);
        feishu_settings(&mut config).allow_unsigned = true;
        assert_eq!(errors(&config), Vec::<String>::new());
        assert!(
            validate(&config)
                .iter()
                .any(|p| p.setting == "source[main].allow_unsigned"
                    && p.severity == Severity::Warning)
        );
        feishu_settings(&mut config).verification_token = Some(Secret::Inline("t".into()));
        assert_eq!(errors(&config), ["source[main].allow_unsigned"]);
    }

    #[test]
    fn numeric_settings_are_bounded() {
        let mut config = Config::default();
        config.dispatcher.concurrency = 3_000_000_000_000_000_000;
        config.dispatcher.max_attempts = u32::MAX;
        config.dispatcher.max_queued = Some(0);
        config.server.body_limit = usize::MAX;
        config.server.max_connections = 0;
        config.server.header_timeout = Duration::from_secs(86_400);
        config.replay.max_nonces = usize::MAX;
        let mut found = errors(&config);
        found.sort();
        found.dedup();
        assert_eq!(
            found,
            [
                "dispatcher.concurrency",
                "dispatcher.max_attempts",
                "dispatcher.max_queued",
                "replay.max_nonces",
                "server.body_limit",
                "server.header_timeout",
                "server.max_connections",
            ]
        );
    }

    #[test]
    fn a_public_admin_listener_needs_a_token_and_unsigned_http_routes_warn() {
        let mut config = Config::default();
        config.server.admin_listen = "0.0.0.0:9090".into();
        assert_eq!(errors(&config), ["server.admin_token"]);
        config.server.admin_token = Some(Secret::Inline("t0ken".into()));
        assert_eq!(errors(&config), Vec::<String>::new());
        config.routes.push(crate::RouteConfig {
            events: vec!["*".into()],
            sink: crate::SinkKind::Http,
            url: Some("http://127.0.0.1:1/x".into()),
            secret: None,
            previous_secrets: Vec::new(),
            signing_key: None,
            path: None,
            timeout: Duration::from_secs(1),
            watermark: false,
            reply: false,
        });
        assert!(
            validate(&config)
                .iter()
                .any(|p| p.setting == "route[0].secret" && p.severity == Severity::Warning)
        );
    }

    #[test]
    fn secrets_being_rotated_out_are_webhook_secrets_beside_a_new_one() {
        let problems = |route: &str| -> Vec<(Severity, String)> {
            let config = crate::load_str(
                &format!("[[route]]\nevents = [\"*\"]\nsink = \"http\"\nurl = \"https://h.example/x\"\n{route}"),
                std::path::Path::new("t.toml"),
                Vec::new(),
            )
            .expect("parses");
            validate(&config)
                .into_iter()
                .filter(|p| p.setting.starts_with("route[0]"))
                .map(|p| (p.severity, p.setting))
                .collect()
        };
        let new = "secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";
        assert_eq!(
            problems(&format!("{new}previous_secrets = [\"whsec_b2xk\"]")),
            Vec::new()
        );
        assert_eq!(
            problems(&format!(
                "{new}previous_secrets = [\"whsec_b2xk\", \"plain\"]"
            )),
            vec![(Severity::Error, "route[0].previous_secrets[1]".to_owned())]
        );
        assert!(
            problems("previous_secrets = [\"whsec_b2xk\"]")
                .contains(&(Severity::Error, "route[0].previous_secrets".to_owned()))
        );
    }

    #[test]
    fn an_ai_bot_on_redis_without_a_spool_is_told_what_it_can_lose() {
        let warned = |store: &str| -> bool {
            let config = crate::load_str(
                &format!(
                    "{store}\n[[source]]\nname = \"bot\"\nplatform = \"wecom-aibot\"\nbot_id = \"aib1\"\nsecret = \"s\"\n"
                ),
                std::path::Path::new("t.toml"),
                Vec::new(),
            )
            .expect("parses");
            validate(&config).iter().any(|p| {
                p.setting == "source[bot]"
                    && p.severity == Severity::Warning
                    && p.message.contains("store.spool")
            })
        };
        assert!(warned(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\""
        ));
        assert!(!warned(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nspool = \"s.redb\""
        ));
        assert!(!warned(""), "the embedded store admits on this machine");
    }

    #[test]
    fn an_ai_bot_needs_its_secret_and_a_websocket_address() {
        let config_of = |extra: &str| {
            crate::load_str(
                &format!(
                    "[[source]]\nname = \"bot\"\nplatform = \"wecom-aibot\"\nbot_id = \"aib1\"\n{extra}"
                ),
                std::path::Path::new("t.toml"),
                Vec::new(),
            )
            .expect("parses")
        };
        let problems = |extra: &str| -> Vec<(Severity, String)> {
            validate(&config_of(extra))
                .into_iter()
                .filter(|p| p.setting.starts_with("source[bot]"))
                .map(|p| (p.severity, p.setting))
                .collect()
        };
        assert_eq!(problems("secret = \"s\""), Vec::new());
        assert_eq!(
            problems(""),
            vec![(Severity::Error, "source[bot].secret".to_owned())]
        );
        assert_eq!(
            problems("secret = \"s\"\ndomain = \"https://openws.work.weixin.qq.com\""),
            vec![(Severity::Error, "source[bot].domain".to_owned())]
        );
        assert_eq!(
            problems("secret = \"s\"\ndomain = \"ws://openws.example\""),
            vec![(Severity::Warning, "source[bot].domain".to_owned())]
        );
        assert_eq!(
            problems("secret = \"s\"\ndomain = \"ws://127.0.0.1:9\""),
            Vec::new()
        );
        let config = config_of("secret = \"s\"");
        assert_eq!(config.sources[0].platform(), crate::Platform::WecomAibot);
        assert_eq!(config.sources[0].app_id(), "aib1");
        let unknown = crate::load_str(
            "[[source]]\nname = \"bot\"\nplatform = \"wecom-aibot\"\nbot_id = \"b\"\ncorp_id = \"x\"\n",
            std::path::Path::new("t.toml"),
            Vec::new(),
        );
        assert!(unknown.is_err(), "corp_id is not an AI bot's setting");
    }

    #[test]
    fn an_original_id_must_be_one() {
        let at = |field: &str| format!("source[oa].{field}");
        for (original_id, refused) in [("wx0123456789abcdef", true), ("gh_0123456789ab", false)] {
            let mut said = Vec::new();
            let mut report = |severity: Severity, setting: &str, message: String| {
                said.push((severity, setting.to_owned(), message));
            };
            let wechat = crate::PlatformConfig::Wechat(crate::WechatSettings {
                encoding_aes_key: Some(crate::Secret::Inline("k".into())),
                original_id: Some(original_id.into()),
                ..crate::WechatSettings::default()
            });
            plain_transport(&wechat, &at, &mut report);
            let errors = said
                .iter()
                .filter(|(severity, setting, _)| {
                    *severity == Severity::Error && setting == "source[oa].original_id"
                })
                .count();
            assert_eq!(errors > 0, refused, "{original_id}: {said:?}");
        }
    }

    #[test]
    fn plain_transports_are_warned_about() {
        assert!(plain_http_off_host("http://open.feishu.cn"));
        assert!(plain_http_off_host("http://user:pw@10.0.0.1:8080/x"));
        for local in [
            "http://127.0.0.1:9000",
            "http://localhost",
            "http://[::1]:80/",
            "https://open.feishu.cn",
        ] {
            assert!(!plain_http_off_host(local), "{local}");
        }
        let mut said = Vec::new();
        let mut report = |severity: Severity, setting: &str, message: String| {
            said.push((severity, setting.to_owned(), message));
        };
        let at = |field: &str| format!("source[main].{field}");
        let wechat = crate::PlatformConfig::Wechat(crate::WechatSettings::default());
        plain_transport(&wechat, &at, &mut report);
        let feishu = crate::PlatformConfig::Feishu(crate::FeishuSettings {
            domain: Some("http://open.feishu.cn".into()),
            ..crate::FeishuSettings::default()
        });
        plain_transport(&feishu, &at, &mut report);
        let settings: Vec<&str> = said.iter().map(|(_, s, _)| s.as_str()).collect();
        assert_eq!(
            settings,
            ["source[main].encoding_aes_key", "source[main].domain"]
        );
        assert!(
            said.iter()
                .all(|(severity, _, _)| *severity == Severity::Warning)
        );
        assert!(said[1].2.contains("in clear"), "{}", said[1].2);
    }
}
