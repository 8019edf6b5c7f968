//! Checks that every setting makes sense on its own and with the others: each section checks
//! its own settings (beside them, in its module); what spans sections is here.

use std::time::Duration;

use crate::StoreConfig;
use crate::checks::{Problem, Severity, human};
use crate::{Config, api, dedup, dispatcher, route, server, source, store, telemetry};

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
    dedup::check(config, &mut report);
    store::check(config, &mut report);
    source::check(config, &mut report);
    server::check(config, &mut report);
    bounds(config, &mut report);
    api::check(config, &mut report);
    dispatcher::check(config, &mut report);
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
    route::check(config, &mut report);
    telemetry::check(config, &mut report);
    problems.sort_by_key(|p| std::cmp::Reverse(p.severity));
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::plain_http_off_host;
    use crate::source::plain_transport;
    use crate::*;
    use crate::{Secret, SourceConfig};

    #[test]
    fn a_wecom_agent_id_is_taken_as_the_console_shows_it_a_number() {
        let agent = |value: &str| {
            let text = format!(
                "[[source]]\nname = \"w\"\nplatform = \"wecom\"\ncorp_id = \"ww1\"\n\
                 agent_id = {value}\n"
            );
            crate::load_str(&text, std::path::Path::new("t.toml"), Vec::new()).map(|config| {
                match &config.sources[0].platform {
                    crate::PlatformConfig::Wecom(settings) => settings.agent_id.clone(),
                    _ => None,
                }
            })
        };
        assert_eq!(agent("1000002").expect("a number"), Some("1000002".into()));
        assert_eq!(
            agent("\"1000002\"").expect("a string"),
            Some("1000002".into())
        );
        let wrong = agent("true").expect_err("not an id");
        assert!(
            wrong.to_string().contains("as a number (1000002)"),
            "{wrong}"
        );
        let negative = agent("-1").expect_err("not an id");
        assert!(negative.to_string().contains("negative"), "{negative}");
    }

    #[test]
    fn a_routes_priority_is_mentions_unless_said_and_a_bot_id_is_an_open_id() {
        let route = |priority: &str| {
            toml::from_str::<Config>(&format!(
                "[[route]]\nevents = [\"*\"]\nsink = \"stdout\"\n{priority}"
            ))
            .map(|config| config.routes[0].priority)
        };
        assert_eq!(route("").expect("parses"), Priority::Mentions);
        assert_eq!(route("priority = \"all\"").expect("parses"), Priority::All);
        assert_eq!(
            route("priority = \"none\"").expect("parses"),
            Priority::None
        );
        let wrong = route("priority = \"urgent\"").expect_err("refused");
        assert!(wrong.to_string().contains("mentions"), "{wrong}");
        let sources = |bot: &str| -> Vec<String> {
            let text = format!(
                "[[source]]\nname = \"f\"\nplatform = \"feishu\"\napp_id = \"cli_a\"\n\
                 verification_token = \"t\"\nbot_open_id = \"{bot}\"\n"
            );
            let config =
                crate::load_str(&text, std::path::Path::new("t.toml"), Vec::new()).expect("parses");
            errors(&config)
        };
        assert_eq!(
            sources("ou_84aad35d084aa403a838cf73ee18467"),
            Vec::<String>::new()
        );
        for bad in ["", "cli_a", "ou_", "ou_a b"] {
            assert_eq!(sources(bad), ["source[f].bot_open_id"], "{bad:?}");
        }
    }

    #[test]
    fn a_route_names_owners_exactly_and_never_in_its_host() {
        let mut config: Config = toml::from_str(
            r#"
[[route]]
events = ["*"]
tenants = ["wpCorp1", " wpCorp2"]
agents = [""]
sink = "http"
url = "https://{tenant}.example.com/events"
"#,
        )
        .expect("config");
        let found = errors(&config);
        for field in ["route[0].tenants", "route[0].agents", "route[0].url"] {
            assert!(found.contains(&field.to_owned()), "{field}: {found:?}");
        }
        config.routes[0].tenants = vec!["wpCorp1".into()];
        config.routes[0].agents = vec!["1000002".into()];
        config.routes[0].url = Some("https://hooks.example.com/{tenant}/{agent}?a={agent}".into());
        assert!(errors(&config).is_empty(), "{:?}", errors(&config));
        config.routes[0].url = Some("http://127.0.0.1:{tenant}/x".into());
        assert!(errors(&config).contains(&"route[0].url".to_owned()));
    }

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
            retry_schedule: None,
            hold_chat: None,
            priority: Default::default(),
            tenants: Vec::new(),
            agents: Vec::new(),
            brokers: None,
            topic: None,
            kafka: Default::default(),
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
    fn a_store_app_needs_its_secret_and_takes_webhooks_only() {
        let mut config = Config {
            sources: vec![feishu(None, Some(Secret::Inline("t".into())))],
            ..Config::default()
        };
        let settings = feishu_settings(&mut config);
        settings.store_app = true;
        assert_eq!(errors(&config), vec!["source[main].app_secret".to_owned()]);
        let settings = feishu_settings(&mut config);
        settings.app_secret = Some(Secret::Inline("s".into()));
        assert!(errors(&config).is_empty(), "{:?}", errors(&config));
        // Feishu gives store apps no long connection.
        feishu_settings(&mut config).transport = crate::Transport::Websocket;
        assert!(
            errors(&config).contains(&"source[main].transport".to_owned()),
            "{:?}",
            errors(&config)
        );
    }

    #[test]
    fn dingtalks_stream_mode_needs_the_client_secret_not_the_subscriptions_keys() {
        let found = |extra: &str| {
            let text = format!(
                "[[source]]\nname = \"d\"\nplatform = \"dingtalk\"\napp_key = \"dingk\"\n{extra}\n"
            );
            errors(
                &crate::load_str(&text, std::path::Path::new("t.toml"), Vec::new())
                    .expect("parses"),
            )
        };
        assert_eq!(
            found("transport = \"stream\""),
            vec!["source[d].app_secret".to_owned()]
        );
        assert!(found("transport = \"stream\"\napp_secret = \"s\"").is_empty());
        let on_redis = crate::load_str(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\n[[source]]\n\
             name = \"d\"\nplatform = \"dingtalk\"\napp_key = \"k\"\ntransport = \"stream\"\n\
             app_secret = \"s\"\n",
            std::path::Path::new("t.toml"),
            Vec::new(),
        )
        .expect("parses");
        assert!(
            validate(&on_redis)
                .iter()
                .any(|p| p.severity == Severity::AtRisk && p.message.contains("store.spool")),
            "a robot message refused in an outage can be lost, said: {:?}",
            validate(&on_redis)
        );
        assert_eq!(
            found(""),
            vec!["source[d].token".to_owned(), "source[d].aes_key".to_owned()],
            "the HTTP subscription signs and encrypts"
        );
        let plain = crate::load_str(
            "[[source]]\nname = \"d\"\nplatform = \"dingtalk\"\napp_key = \"k\"\n\
             transport = \"stream\"\napp_secret = \"s\"\ndomain = \"http://10.0.0.9:80\"\n",
            std::path::Path::new("t.toml"),
            Vec::new(),
        )
        .expect("parses");
        assert!(
            validate(&plain)
                .iter()
                .any(|p| p.severity == Severity::AtRisk && p.setting == "source[d].domain"),
            "a plain-http domain sends the secret in clear: {:?}",
            validate(&plain)
        );
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
                    && p.severity == Severity::AtRisk)
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
            retry_schedule: None,
            hold_chat: None,
            priority: Default::default(),
            tenants: Vec::new(),
            agents: Vec::new(),
            brokers: None,
            topic: None,
            kafka: Default::default(),
        });
        let said = |config: &Config| -> Vec<(Severity, String)> {
            validate(config)
                .into_iter()
                .filter(|p| p.setting.starts_with("route[0]"))
                .map(|p| (p.severity, p.setting))
                .collect()
        };
        assert_eq!(
            said(&config),
            [(Severity::AtRisk, "route[0].secret".to_owned())]
        );
        // Signed, to this machine: nothing said. Signed, to another host in clear: the events
        // travel readable, said as a risk.
        config.routes[0].secret = Some(Secret::Inline("whsec_c2VjcmV0".into()));
        assert_eq!(said(&config), []);
        config.routes[0].url = Some("http://hooks.example/x".into());
        assert_eq!(
            said(&config),
            [(Severity::AtRisk, "route[0].url".to_owned())]
        );
        config.routes[0].url = Some("https://hooks.example/x".into());
        assert_eq!(said(&config), []);
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
        let new = "secret = \"whsec_c2VjcmV0\"\n";
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
                    && p.severity == Severity::AtRisk
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
            vec![(Severity::AtRisk, "source[bot].domain".to_owned())]
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
    fn a_wecom_template_names_no_corp_and_holds_no_secret() {
        let problems = |sources: &str| -> Vec<(Severity, String)> {
            let config = crate::load_str(sources, std::path::Path::new("t.toml"), Vec::new())
                .expect("parses");
            validate(&config)
                .into_iter()
                .filter(|p| p.setting.starts_with("source["))
                .map(|p| (p.severity, p.setting))
                .collect()
        };
        let template = "[[source]]\nname = \"corps\"\nplatform = \"wecom\"\ntemplate = true\n";
        // Two templates, no corp ids: neither is the other's app.
        assert_eq!(
            problems(&format!("{template}{}", template.replace("corps", "more"))),
            Vec::new()
        );
        assert_eq!(
            problems(&format!(
                "{template}corp_id = \"ww1\"\ntoken = \"t\"\nencoding_aes_key = \"k\"\n"
            )),
            vec![
                (Severity::Error, "source[corps].corp_id".to_owned()),
                (Severity::Error, "source[corps].token".to_owned()),
                (Severity::Error, "source[corps].encoding_aes_key".to_owned()),
            ]
        );
        // Without template, the same source is one corp's, and needs its corp and secrets.
        assert!(
            problems(&template.replace("template = true\n", ""))
                .contains(&(Severity::Error, "source[corps].token".to_owned()))
        );
    }

    #[test]
    fn a_wecom_suite_needs_its_token_and_key_and_a_short_name() {
        let problems = |name: &str, extra: &str| -> Vec<(Severity, String)> {
            let config = crate::load_str(
                &format!(
                    "[[source]]\nname = \"{name}\"\nplatform = \"wecom-suite\"\nsuite_id = \"ww4a\"\n{extra}"
                ),
                std::path::Path::new("t.toml"),
                Vec::new(),
            )
            .expect("parses");
            assert_eq!(config.sources[0].platform(), crate::Platform::WecomSuite);
            assert_eq!(config.sources[0].app_id(), "ww4a");
            validate(&config)
                .into_iter()
                .filter(|p| p.setting.starts_with("source["))
                .map(|p| (p.severity, p.setting))
                .collect()
        };
        let keyed = "token = \"t\"\nencoding_aes_key = \"k\"\nprovider_corp_id = \"wwp\"";
        assert_eq!(problems("suite", keyed), Vec::new());
        assert_eq!(
            problems("suite", ""),
            vec![
                (Severity::Error, "source[suite].token".to_owned()),
                (Severity::Error, "source[suite].encoding_aes_key".to_owned()),
            ]
        );
        let long = "s".repeat(49);
        assert_eq!(
            problems(&long, keyed),
            vec![(Severity::Error, format!("source[{long}].name"))]
        );
        let unknown = crate::load_str(
            "[[source]]\nname = \"s\"\nplatform = \"wecom-suite\"\nsuite_id = \"w\"\ncorp_id = \"x\"\n",
            std::path::Path::new("t.toml"),
            Vec::new(),
        );
        assert!(unknown.is_err(), "corp_id is not a suite's setting");
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
                .all(|(severity, _, _)| *severity == Severity::AtRisk)
        );
        assert!(said[1].2.contains("in clear"), "{}", said[1].2);
    }

    fn problems_of(text: &str) -> Vec<Problem> {
        let config = crate::load_str(text, std::path::Path::new("t.toml"), Vec::new())
            .expect("a configuration");
        validate(&config)
    }

    #[test]
    fn a_route_after_one_that_takes_all_its_events_is_named() {
        let routes = |first: &str, second: &str| {
            problems_of(&format!(
                "[[route]]\n{first}\nsink = \"stdout\"\n\n[[route]]\n{second}\nsink = \"stdout\"\n"
            ))
            .into_iter()
            .filter(|p| p.setting == "route[1].events")
            .map(|p| (p.severity, p.message))
            .collect::<Vec<_>>()
        };
        for (first, second) in [
            ("events = [\"*\"]", "events = [\"message.*\"]"),
            (
                "events = [\"message.*\"]",
                "events = [\"message.text\", \"message.image\"]",
            ),
            ("events = [\"a\", \"b\"]", "events = [\"b\"]"),
            (
                "events = [\"*\"]\ntenants = [\"t1\", \"t2\"]",
                "events = [\"x\"]\ntenants = [\"t2\"]",
            ),
        ] {
            let found = routes(first, second);
            assert_eq!(found.len(), 1, "{first} / {second}: {found:?}");
            assert_eq!(found[0].0, Severity::Warning);
            assert!(found[0].1.contains("never matches: route[0]"), "{found:?}");
        }
        // Routes the first leaves something to: nothing said.
        for (first, second) in [
            ("events = [\"message.*\"]", "events = [\"*\"]"),
            ("events = [\"message.text\"]", "events = [\"message.*\"]"),
            ("events = [\"*\"]\ntenants = [\"t1\"]", "events = [\"*\"]"),
            (
                "events = [\"*\"]\nagents = [\"1\"]",
                "events = [\"*\"]\nagents = [\"2\"]",
            ),
            ("events = [\"a\"]", "events = [\"a\", \"b\"]"),
        ] {
            assert_eq!(routes(first, second), [], "{first} / {second}");
        }
    }

    #[test]
    fn two_callers_with_one_token_are_refused() {
        let callers = |second: &str| {
            problems_of(&format!(
                "[[api.caller]]\nname = \"a\"\ntoken = \"token-one-123\"\n\n\
                 [[api.caller]]\nname = \"b\"\ntoken = \"{second}\"\n"
            ))
            .into_iter()
            .filter(|p| p.setting == "api.caller[1].token")
            .map(|p| (p.severity, p.message))
            .collect::<Vec<_>>()
        };
        let found = callers("token-one-123");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, Severity::Error);
        assert!(
            found[0].1.contains("same token as caller \"a\""),
            "{found:?}"
        );
        assert!(
            !found[0].1.contains("token-one-123"),
            "the token is never said"
        );
        assert_eq!(callers("token-two-456"), []);
    }
}
