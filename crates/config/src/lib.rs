//! The configuration: one TOML file, every value overridable from `ONCEGATE_*` environment
//! variables, and a validation that names every invalid or contradictory setting.

mod api;
mod checks;
mod dedup;
mod dispatcher;
mod duration;
mod duration_opt;
mod encryption;
mod kafka;
mod load;
mod log;
mod retries;
mod route;
mod server;
mod source;
mod store;
mod telemetry;
mod validate;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use api::*;
pub use checks::{Problem, Severity};
pub use dedup::*;
pub use dispatcher::*;
pub use encryption::{EncryptionKey, EncryptionSettings, MAX_KEY_ID};
pub use kafka::{KAFKA_FIXED, kafka_topic};
pub use load::*;
pub use log::{LogConfig, LogFormat};
pub use retries::{RetrySchedule, STANDARD_WEBHOOKS_SCHEDULE};
pub use route::*;
pub use server::*;
pub use source::*;
pub use store::*;
pub use telemetry::TelemetryConfig;
/// A TOML value, as `[source.send]`'s fixed fields and result codes are written.
pub use toml::Value as TomlValue;
pub use validate::validate;

/// How long Feishu keeps re-delivering an event it got no answer for: retries after 15 s, 5 min,
/// 1 h and 6 h, spread over about 7.3 hours. Dedup retention must outlast it.
pub const PLATFORM_RETRY_SPAN: Duration = Duration::from_secs(7 * 3600 + 18 * 60);

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where records and the queue live.
    pub store: StoreConfig,
    /// Event-id and business-key dedup.
    pub dedup: DedupConfig,
    /// Processing leases.
    pub lease: LeaseConfig,
    /// Webhook timestamp and nonce checks.
    pub replay: ReplayConfig,
    /// The platforms' apps this gateway receives events for.
    #[serde(rename = "source")]
    pub sources: Vec<SourceConfig>,
    /// The HTTP listeners.
    pub server: ServerConfig,
    /// How admitted events are handed to routes.
    pub dispatcher: DispatcherConfig,
    /// Where events go, by event type.
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// The API for bots behind the gateway (business keys).
    pub api: ApiConfig,
    /// The log's format and instance name.
    pub log: LogConfig,
    /// Where traces go (OTLP); none by default.
    pub telemetry: TelemetryConfig,
}

impl Config {
    /// The first route for `event_type`, if any.
    pub fn route_for(&self, event_type: &str) -> Option<(usize, &RouteConfig)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, route)| route.matches(event_type))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_names_its_place_but_never_quotes_the_line() {
        let text = "[server]\nadmin_token = \"s3cr3t-admin-token\n";
        let error =
            load_str(text, Path::new("oncegate.toml"), []).expect_err("an unterminated string");
        let said = error.to_string();
        assert!(
            said.contains("oncegate.toml") && said.contains("line 2"),
            "{said}"
        );
        assert!(!said.contains("s3cr3t"), "the line is not quoted: {said}");
    }

    #[test]
    fn a_number_out_of_range_is_said_as_its_range_not_its_rust_type() {
        for (text, range) in [
            ("[store]\npartitions = 70000\n", "from 0 to 65535"),
            ("[store]\npartitions = -1\n", "from 0 to 65535"),
            (
                "[replay]\nmax_nonces = \"many\"\n",
                "a whole number, 0 or more",
            ),
        ] {
            let said = load_str(text, Path::new("oncegate.toml"), [])
                .expect_err(text)
                .to_string();
            assert!(said.contains(range), "{text}: {said}");
            assert!(!said.contains("expected u"), "{text}: {said}");
        }
    }
    use std::path::{Path, PathBuf};

    fn parse(text: &str) -> Result<Config, LoadError> {
        load_str(text, Path::new("test.toml"), Vec::new())
    }

    #[test]
    fn defaults_are_the_embedded_store_and_a_day_of_retention() {
        let config = load(None, Vec::new()).expect("defaults");
        let StoreConfig::Embedded(store) = &config.store else {
            panic!("embedded by default: {:?}", config.store)
        };
        assert_eq!(store.path, PathBuf::from("data/oncegate"));
        assert_eq!(config.dedup.retention, Duration::from_secs(86_400));
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = load(
            None,
            vec![
                ("ONCEGATE_STORE__PATH".into(), "/tmp/x.redb".into()),
                ("ONCEGATE_STORE__PARTITIONS".into(), "4".into()),
                ("ONCEGATE_DEDUP__RETENTION".into(), "36h".into()),
                ("ONCEGATE_REPLAY__ENABLED".into(), "false".into()),
                ("UNRELATED".into(), "1".into()),
            ],
        )
        .expect("load");
        let StoreConfig::Embedded(store) = &config.store else {
            panic!("embedded: {:?}", config.store)
        };
        assert_eq!(store.path, PathBuf::from("/tmp/x.redb"));
        assert_eq!(config.store.partitions(), 4);
        assert_eq!(config.dedup.retention, Duration::from_secs(36 * 3600));
        assert!(!config.replay.enabled);
    }

    #[test]
    fn misspelt_settings_are_named() {
        let error = parse("[dedup]\nretension = \"24h\"\n").expect_err("unknown key");
        let message = error.to_string();
        assert!(message.contains("retension"), "{message}");
        let error = parse("[dedup]\nretention = \"a day\"\n").expect_err("bad duration");
        assert!(error.to_string().contains("a day"), "{error}");
        let error = load(
            None,
            vec![("ONCEGATE_STORE__PARTITIONS".into(), "many".into())],
        )
        .expect_err("bad env");
        assert!(error.to_string().contains("partitions"), "{error}");
    }

    /// The container image sets the admin token's source as a variable (a mounted file need
    /// not name it): the inline table reads as a secret from the environment.
    #[test]
    fn a_variable_can_name_a_secrets_source() {
        let config = load_str(
            "[server]\nadmin_listen = \"0.0.0.0:9090\"\n",
            Path::new("mounted.toml"),
            vec![(
                "ONCEGATE_SERVER__ADMIN_TOKEN".to_owned(),
                "{ env = \"ONCEGATE_ADMIN_TOKEN\" }".to_owned(),
            )],
        )
        .expect("load");
        assert_eq!(
            config.server.admin_token,
            Some(Secret::Env {
                env: "ONCEGATE_ADMIN_TOKEN".into()
            })
        );
    }

    /// A variable that does not fit the file's store (the systemd unit's store path under a
    /// Redis configuration) is named, not the file.
    #[test]
    fn a_variable_that_breaks_the_file_is_blamed_not_the_file() {
        let text = "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n";
        let env = vec![
            (
                "ONCEGATE_STORE__PATH".to_owned(),
                "/var/lib/oncegate".to_owned(),
            ),
            ("ONCEGATE_DEDUP__RETENTION".to_owned(), "36h".to_owned()),
        ];
        let error = load_str(text, Path::new("redis.toml"), env).expect_err("path under redis");
        let message = error.to_string();
        assert!(
            message.starts_with("environment variable ONCEGATE_STORE__PATH: ")
                && message.contains("unknown field `path`")
                && message.contains("not in redis.toml"),
            "{message}"
        );
        // The file's own mistake is still the file's.
        let error = load_str(
            "[dedup]\nretension = \"24h\"\n",
            Path::new("own.toml"),
            vec![("ONCEGATE_DEDUP__RETENTION".to_owned(), "36h".to_owned())],
        )
        .expect_err("the file's typo");
        assert!(error.to_string().starts_with("own.toml: "), "{error}");
    }

    #[test]
    fn a_variable_that_switches_the_backend_drops_the_files_store_settings() {
        let text = "[store]\nbackend = \"embedded\"\npath = \"/data/x.redb\"\n";
        let env = [
            ("ONCEGATE_STORE__BACKEND".to_owned(), "redis".to_owned()),
            (
                "ONCEGATE_STORE__URL".to_owned(),
                "redis://redis:6379".to_owned(),
            ),
        ];
        let config = load_str(text, Path::new("f.toml"), env).expect("loads");
        assert!(
            matches!(&config.store, StoreConfig::Redis(settings) if settings.url == "redis://redis:6379"),
            "{:?}",
            config.store
        );
        // The same backend keeps the file's settings beside the variable's.
        let env = [("ONCEGATE_STORE__BACKEND".to_owned(), "embedded".to_owned())];
        let config = load_str(text, Path::new("f.toml"), env).expect("loads");
        assert!(
            matches!(&config.store, StoreConfig::Embedded(settings) if settings.path == Path::new("/data/x.redb")),
            "{:?}",
            config.store
        );
    }

    #[test]
    fn the_defaults_file_is_the_codes_defaults() {
        assert_eq!(parse("").expect("defaults"), Config::default());
        // A file sets what it names and keeps every other default.
        let config = parse("[server]\nbody_limit = 2048\n").expect("config");
        assert_eq!(config.server.body_limit, 2048);
        assert_eq!(config.server.listen, ServerConfig::default().listen);
        // Another backend replaces the default store section.
        let config = parse("[store]\nbackend = \"memory\"\n").expect("memory");
        assert_eq!(config.store, StoreConfig::Memory(MemorySettings::default()));
        let config = load_str(
            "",
            Path::new("env.toml"),
            vec![
                ("ONCEGATE_STORE__BACKEND".into(), "redis".into()),
                ("ONCEGATE_STORE__URL".into(), "redis://r:1".into()),
            ],
        )
        .expect("redis from the environment");
        assert!(matches!(&config.store, StoreConfig::Redis(r) if r.url == "redis://r:1"));
    }

    #[test]
    fn each_backend_takes_only_its_own_settings() {
        let config =
            parse("[store]\nbackend = \"redis\"\nurl = \"redis://r:6379\"\nspool = \"s.redb\"\n")
                .expect("redis");
        let StoreConfig::Redis(redis) = &config.store else {
            panic!("{:?}", config.store)
        };
        assert_eq!(
            (redis.url.as_str(), redis.spool.is_some()),
            ("redis://r:6379", true)
        );
        for (text, field) in [
            ("[store]\nspool = \"s.redb\"\n", "spool"),
            ("[store]\nbackend = \"memory\"\npath = \"x.redb\"\n", "path"),
            ("[store]\nbackend = \"redis\"\ncache_mb = 4\n", "cache_mb"),
        ] {
            let error = parse(text).expect_err(text).to_string();
            assert!(error.contains(field), "{text}: {error}");
        }
        let error = parse("[store]\nbackend = \"postgres\"\n").expect_err("unknown backend");
        assert!(error.to_string().contains("redis"), "{error}");
    }

    #[test]
    fn each_platform_takes_only_its_own_settings() {
        let config = parse(
            "[[source]]\nname = \"w\"\nplatform = \"wecom\"\ncorp_id = \"ww1\"\ntoken = \"t\"\nencoding_aes_key = \"k\"\n\n[[source]]\nname = \"f\"\nplatform = \"lark\"\napp_id = \"cli_1\"\nencrypt_key = \"e\"\n",
        )
        .expect("sources");
        assert_eq!(
            (config.sources[0].platform(), config.sources[0].app_id()),
            (Platform::Wecom, "ww1")
        );
        assert_eq!(
            (config.sources[1].platform(), config.sources[1].app_id()),
            (Platform::Lark, "cli_1")
        );
        for (text, expected) in [
            (
                "[[source]]\nname = \"f\"\nplatform = \"feishu\"\ncorp_id = \"x\"\n",
                "corp_id",
            ),
            ("[[source]]\nname = \"f\"\napp_id = \"x\"\n", "set platform"),
            ("[[source]]\nname = \"f\"\nplatform = \"slack\"\n", "slack"),
        ] {
            let error = parse(text).expect_err(text).to_string();
            assert!(
                error.contains(expected) && error.contains("\"f\""),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn debug_output_hides_secrets_and_url_credentials() {
        let config = parse(
            "[store]\nbackend = \"redis\"\nurl = \"redis://:hunter2@r:6379\"\n\n[[route]]\nevents = [\"*\"]\nsink = \"http\"\nurl = \"https://u:pw1@h/x?api_key=k3y\"\nsecret = \"whsec_c2VjcmV0\"\n\n[[source]]\nname = \"f\"\nplatform = \"feishu\"\napp_id = \"cli_1\"\nencrypt_key = \"s3cret-key\"\n",
        )
        .expect("config");
        let shown = format!("{config:?}");
        for secret in ["hunter2", "pw1", "k3y", "whsec_c2VjcmV0", "s3cret-key"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("redis://r:6379") && shown.contains("https://h/x"),
            "{shown}"
        );
    }

    #[test]
    fn secrets_come_from_files_and_environment() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cret\n").expect("write");
        assert_eq!(
            Secret::File { file: file.clone() }.resolve(),
            Ok("s3cret".into())
        );
        assert!(
            Secret::Env {
                env: "ONCEGATE_TEST_SURELY_UNSET".into()
            }
            .resolve()
            .expect_err("unset")
            .contains("ONCEGATE_TEST_SURELY_UNSET")
        );
    }
}
