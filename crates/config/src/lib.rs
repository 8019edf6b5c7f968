//! The configuration: one TOML file, every value overridable from `ONCEGATE_*` environment
//! variables, and a validation that names every invalid or contradictory setting.

mod duration;
mod duration_opt;
mod log;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oncegate_core::redact::url as redact_url;
use serde::{Deserialize, Serialize};

pub use log::{LogConfig, LogFormat};
pub use validate::{Problem, Severity, validate};

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
}

/// `[api]`: business keys over HTTP for handlers in any language. Served only when a caller
/// is configured: it is never open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Where the API listens.
    pub listen: String,
    /// The longest lease a caller may take on a key.
    #[serde(with = "duration")]
    pub max_lease: Duration,
    /// The longest a claim may wait for another holder's result, and a send for its rate
    /// budget.
    #[serde(with = "duration")]
    pub max_wait: Duration,
    /// How long one call to a platform's API may take; past it the outcome is unknown.
    #[serde(with = "duration")]
    pub send_timeout: Duration,
    /// Sends that may wait for their rate budgets at once; more are answered 503.
    pub max_waiting_sends: usize,
    /// Who may call, each with a token of its own.
    #[serde(rename = "caller")]
    pub callers: Vec<CallerConfig>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9191".into(),
            max_lease: Duration::from_secs(3600),
            max_wait: Duration::from_secs(30),
            send_timeout: Duration::from_secs(10),
            max_waiting_sends: 1000,
            callers: Vec::new(),
        }
    }
}

/// `[[api.caller]]`: one caller of the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    /// The caller's name, for logs and metrics.
    pub name: String,
    /// Its bearer token.
    pub token: Secret,
    /// Callers of one namespace share their keys (a Python and a Node handler of one shop).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Sends per second this caller may make (its own budget, apart from the platforms');
    /// beyond it `/send` answers 429 with Retry-After at once. Unbounded unless set.
    #[serde(default)]
    pub sends_per_second: Option<u32>,
    /// Results of `/keys/complete` this caller may have kept at once (they live for
    /// `dedup.retention`); beyond it a result is refused with 429. 100 000 unless set.
    #[serde(default)]
    pub results_max: Option<u64>,
    /// Bytes of such results this caller may have kept at once; 64 MiB unless set.
    #[serde(default)]
    pub result_bytes_max: Option<u64>,
}

fn default_namespace() -> String {
    "default".into()
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where platforms send callbacks (`/webhook/<source>`).
    pub listen: String,
    /// Health, readiness, metrics and the admin API.
    pub admin_listen: String,
    /// Required as `Authorization: Bearer <token>` on `/admin/*`, if set.
    pub admin_token: Option<Secret>,
    /// The largest accepted callback body, in bytes.
    pub body_limit: usize,
    /// Most connections open at once on each listener; beyond it new ones are closed at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers; a kept-alive connection that
    /// sends no next request within it is closed.
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body.
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// Refused requests and repeated failures are logged as one summary per interval.
    #[serde(with = "duration")]
    pub log_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_listen: "127.0.0.1:9090".into(),
            admin_token: None,
            body_limit: 1024 * 1024,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// `[dispatcher]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherConfig {
    /// Handlers running at once, over all partitions.
    pub concurrency: usize,
    /// Attempts before an event goes to the dead letters.
    pub max_attempts: u32,
    /// The first retry's delay; it doubles per attempt, with jitter.
    #[serde(with = "duration")]
    pub backoff_base: Duration,
    /// The longest retry delay.
    #[serde(with = "duration")]
    pub backoff_max: Duration,
    /// On shutdown, how long running handlers may finish before their leases are released.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Most events waiting in the queue; beyond it ingress answers 503 and records nothing
    /// (the platform retries). No bound when absent.
    pub max_queued: Option<u64>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            concurrency: 256,
            max_attempts: 8,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            max_queued: None,
        }
    }
}

/// Where a route's events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// POST to `url`, signed the Standard Webhooks way.
    Http,
    /// JSON lines on standard output.
    Stdout,
    /// JSON lines appended to `path`.
    File,
}

/// `[[route]]`: events whose type matches go to one sink.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Event types: exact (`im.message.receive_v1`), a prefix (`im.message.*`) or `*`.
    pub events: Vec<String>,
    /// The sink.
    pub sink: SinkKind,
    /// The HTTP sink's URL.
    pub url: Option<String>,
    /// The HTTP sink's Standard Webhooks secret (`whsec_` + base64).
    pub secret: Option<Secret>,
    /// Secrets being rotated out: every delivery is signed with each of them too (one `v1`
    /// signature per secret in `webhook-signature`), so that a receiver still checking an old
    /// secret verifies while it moves to the new one. Remove them once it has.
    #[serde(default)]
    pub previous_secrets: Vec<Secret>,
    /// An Ed25519 key (`whsk_` + base64) that signs every delivery too, as a `v1a` signature:
    /// receivers verify with its public key (`whpk_…`, shown by `GET /admin/routes`) and, unlike
    /// with a shared secret, cannot sign themselves.
    pub signing_key: Option<Secret>,
    /// The file sink's path.
    pub path: Option<PathBuf>,
    /// The HTTP sink's timeout per attempt.
    #[serde(with = "duration", default = "default_sink_timeout")]
    pub timeout: Duration,
    /// Drop an event older than one already applied for its chat.
    #[serde(default)]
    pub watermark: bool,
    /// The HTTP sink's answer is the platform's passive reply (WeCom, WeChat): matching events
    /// are handled as they arrive, within the platform's deadline, instead of queued.
    #[serde(default)]
    pub reply: bool,
}

/// The URL without credentials, the secret hidden.
impl std::fmt::Debug for RouteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteConfig")
            .field("events", &self.events)
            .field("sink", &self.sink)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("secret", &self.secret)
            .field("previous_secrets", &self.previous_secrets)
            .field("signing_key", &self.signing_key)
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .field("watermark", &self.watermark)
            .field("reply", &self.reply)
            .finish()
    }
}

fn default_sink_timeout() -> Duration {
    Duration::from_secs(10)
}

impl RouteConfig {
    /// Whether `event_type` is one of this route's.
    pub fn matches(&self, event_type: &str) -> bool {
        event_type_matches(&self.events, event_type)
    }
}

/// Whether `event_type` matches one of `patterns`: exact, `prefix*`, or `*`.
pub fn event_type_matches(patterns: &[String], event_type: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => event_type.starts_with(prefix),
            None => pattern == event_type,
        })
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

/// `[store]`: where records and the queue live. `backend` picks the variant (embedded when
/// absent); each backend has only its own settings, so a setting of another backend is an
/// unknown field.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum StoreConfig {
    /// One redb file on this machine (the default).
    Embedded(EmbeddedSettings),
    /// In process memory; forgets everything on restart.
    Memory(MemorySettings),
    /// A shared Redis, for several gateway instances.
    Redis(RedisSettings),
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Embedded(EmbeddedSettings::default())
    }
}

impl StoreConfig {
    /// The backend's name, as configured.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreConfig::Embedded(_) => "embedded",
            StoreConfig::Memory(_) => "memory",
            StoreConfig::Redis(_) => "redis",
        }
    }

    /// Queue partitions.
    pub fn partitions(&self) -> u16 {
        match self {
            StoreConfig::Embedded(s) => s.partitions,
            StoreConfig::Memory(s) => s.partitions,
            StoreConfig::Redis(s) => s.partitions,
        }
    }
}

/// By hand rather than serde's internally tagged enums: those lose the name of a field whose
/// value is wrong, and a message must name it.
impl<'de> Deserialize<'de> for StoreConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let backend = match table.remove("backend") {
            None => "embedded".to_owned(),
            Some(toml::Value::String(name)) => name,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "backend = {other}: expected \"embedded\", \"memory\" or \"redis\""
                )));
            }
        };
        let settings = toml::Value::Table(table);
        let context = format!("backend = \"{backend}\"");
        match backend.as_str() {
            "embedded" => variant(settings, &context).map(StoreConfig::Embedded),
            "memory" => variant(settings, &context).map(StoreConfig::Memory),
            "redis" => variant(settings, &context).map(StoreConfig::Redis),
            other => Err(D::Error::custom(format!(
                "backend = {other:?}: expected \"embedded\", \"memory\" or \"redis\""
            ))),
        }
    }
}

/// The settings of one variant (a backend, a platform) from their table; an error names
/// `context` and the field.
fn variant<T: serde::de::DeserializeOwned, E: serde::de::Error>(
    settings: toml::Value,
    context: &str,
) -> Result<T, E> {
    serde_path_to_error::deserialize(settings).map_err(
        |error: serde_path_to_error::Error<toml::de::Error>| {
            E::custom(format!(
                "{context}: {}: {}",
                error.path(),
                error.inner().message()
            ))
        },
    )
}

const DEFAULT_PARTITIONS: u16 = 16;

/// `[store] backend = "embedded"`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedSettings {
    /// The store's folder (created 0700): its journal segments and snapshots.
    pub path: PathBuf,
    /// Queue partitions; fixed when the folder is created.
    pub partitions: u16,
    /// The most records held in memory; beyond it the record due soonest is evicted early
    /// (counted).
    pub max_records: u64,
    /// The earlier (redb) store's page cache: no longer used; accepted with a warning.
    pub cache_mb: Option<u64>,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data/oncegate"),
            partitions: DEFAULT_PARTITIONS,
            max_records: 10_000_000,
            cache_mb: None,
        }
    }
}

/// `[store] backend = "memory"`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySettings {
    /// Queue partitions.
    pub partitions: u16,
    /// The most records held; beyond it the record due soonest is evicted early (counted).
    pub max_records: u64,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            partitions: DEFAULT_PARTITIONS,
            max_records: 10_000_000,
        }
    }
}

/// `[store] backend = "redis"` (its `Debug` shows the URL without credentials)
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://host:port`; with `cluster = true`, one or more of the cluster's nodes,
    /// separated by commas.
    pub url: String,
    /// `url` names a Redis Cluster.
    pub cluster: bool,
    /// Queue partitions; fixed when the prefix is first used.
    pub partitions: u16,
    /// The key prefix (several deployments can share one Redis).
    pub prefix: Option<String>,
    /// How long a gateway keeps a partition without a heartbeat before another takes it over
    /// (a killed gateway's partitions move after this).
    #[serde(with = "duration_opt", default)]
    pub ownership: Option<Duration>,
    /// How long a gateway that hands a partition over (another gateway joined) waits for its
    /// running handlers there before it lets go; a handler still running then keeps its
    /// event's claim, and that one chat waits for the claim's lease.
    #[serde(with = "duration_opt", default)]
    pub handover: Option<Duration>,
    /// A local file where accepted requests wait while Redis cannot be reached (answered 200
    /// instead of 503) and are admitted, in order, when it answers again. Off by default:
    /// until then the file is the events' only copy.
    pub spool: Option<PathBuf>,
    /// Most admissions the spool holds; beyond that requests get 503 again.
    pub spool_max: u64,
    /// What an acknowledged event survives: `fsync` (the default: the Redis must run with
    /// appendonly yes and appendfsync always), `replicas` (every acknowledgement waits for
    /// `min_replicas` replicas) or `memory` (allowed, with what it can lose said).
    pub durability: RedisDurabilityMode,
    /// With `durability = "replicas"`: how many replicas must have each acknowledged write.
    pub min_replicas: u16,
    /// With `durability = "replicas"`: how long an acknowledgement waits for them before it
    /// is refused with 503 (500ms when left out).
    #[serde(with = "duration_opt", default)]
    pub replica_wait: Option<Duration>,
}

/// `[store] durability` for Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisDurabilityMode {
    /// Every acknowledged write is on the Redis host's disk.
    #[default]
    Fsync,
    /// Every acknowledged write is on `min_replicas` replicas.
    Replicas,
    /// Acknowledged events may live in Redis memory only.
    Memory,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("cluster", &self.cluster)
            .field("partitions", &self.partitions)
            .field("prefix", &self.prefix)
            .field("ownership", &self.ownership)
            .field("handover", &self.handover)
            .field("spool", &self.spool)
            .field("spool_max", &self.spool_max)
            .field("durability", &self.durability)
            .field("min_replicas", &self.min_replicas)
            .field("replica_wait", &self.replica_wait)
            .finish()
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            cluster: false,
            partitions: DEFAULT_PARTITIONS,
            prefix: None,
            ownership: None,
            handover: None,
            spool: None,
            spool_max: 1_000_000,
            durability: RedisDurabilityMode::Fsync,
            min_replicas: 1,
            replica_wait: None,
        }
    }
}

/// `[dedup]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupConfig {
    /// How long a seen event id is remembered.
    #[serde(with = "duration")]
    pub retention: Duration,
    /// Event-id dedup is always on; `false` is refused. Kept so that files that say `true`
    /// still load.
    pub event_id: bool,
    /// Also dedup on an event's secondary keys (Feishu's `message_id`: it can resend a message
    /// under a new event id).
    pub message_id: bool,
    /// Read by nothing: there is no business-key API yet. Accepted with a warning so that
    /// older files still load.
    pub business_keys: Option<bool>,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            event_id: true,
            message_id: true,
            business_keys: None,
        }
    }
}

/// `[lease]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long a claim holds without renewal.
    #[serde(with = "duration")]
    pub duration: Duration,
    /// How often a running handler's lease is renewed.
    #[serde(with = "duration")]
    pub renew_every: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(300),
            renew_every: Duration::from_secs(60),
        }
    }
}

/// `[replay]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplayConfig {
    /// Check request timestamps and nonces.
    pub enabled: bool,
    /// The largest accepted distance between a request's timestamp and now.
    #[serde(with = "duration")]
    pub max_skew: Duration,
    /// Nonces remembered at most, per half of the window.
    pub max_nonces: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_skew: Duration::from_secs(300),
            max_nonces: 1_000_000,
        }
    }
}

/// The platform of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// Feishu (China).
    Feishu,
    /// Lark (international Feishu).
    Lark,
    /// WeCom (企业微信).
    Wecom,
    /// WeChat official accounts.
    Wechat,
    /// A WeCom AI bot (智能机器人) on its long connection.
    #[serde(rename = "wecom-aibot")]
    WecomAibot,
}

/// A secret: inline, from an environment variable, or from a file. Its `Debug` never shows
/// an inline value.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Secret {
    /// Written in the file (fine for tests, not for production).
    Inline(String),
    /// Read from an environment variable.
    Env {
        /// The variable.
        env: String,
    },
    /// Read from a file (trailing newline removed).
    File {
        /// The file.
        file: PathBuf,
    },
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Inline(<hidden>)"),
            Secret::Env { env } => f.debug_struct("Env").field("env", env).finish(),
            Secret::File { file } => f.debug_struct("File").field("file", file).finish(),
        }
    }
}

impl Secret {
    /// The secret's value. A value that is empty or only whitespace is an error, never "no
    /// secret": an empty Kubernetes secret or a blank template must not switch checks off.
    pub fn resolve(&self) -> Result<String, String> {
        let (value, origin) = match self {
            Secret::Inline(value) => (value.clone(), "the inline value".to_owned()),
            Secret::Env { env } => (
                std::env::var(env).map_err(|_| format!("environment variable {env} is not set"))?,
                format!("environment variable {env}"),
            ),
            Secret::File { file } => (
                std::fs::read_to_string(file)
                    .map(|text| text.trim_end_matches(['\n', '\r']).to_owned())
                    .map_err(|error| format!("cannot read {}: {error}", file.display()))?,
                format!("file {}", file.display()),
            ),
        };
        if value.trim().is_empty() {
            return Err(format!(
                "{origin} is empty: an empty secret would switch its check off; set a value, \
                 or remove the setting"
            ));
        }
        Ok(value)
    }
}

/// `[[source]]`: one app on one platform. `platform` picks the variant; each platform has its
/// own settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceConfig {
    /// The name, used in the route `/webhook/<name>` and in metrics.
    pub name: String,
    /// The platform and its settings.
    #[serde(flatten)]
    pub platform: PlatformConfig,
}

/// A source's platform with the settings that platform needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "platform", rename_all = "lowercase")]
pub enum PlatformConfig {
    /// Feishu (China).
    Feishu(FeishuSettings),
    /// Lark (international Feishu).
    Lark(FeishuSettings),
    /// WeCom (企业微信).
    Wecom(WecomSettings),
    /// WeChat Official Accounts.
    Wechat(WechatSettings),
    /// A WeCom AI bot (智能机器人) on its long connection: oncegate dials WeCom.
    #[serde(rename = "wecom-aibot")]
    WecomAibot(AibotSettings),
}

/// A Feishu or Lark app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeishuSettings {
    /// The app id (`cli_…`).
    pub app_id: String,
    /// The encrypt key: callbacks are signed and encrypted with it.
    pub encrypt_key: Option<Secret>,
    /// The verification token in every callback's body.
    pub verification_token: Option<Secret>,
    /// Accept requests with no authentication at all (no encrypt key, no token). Only for local
    /// experiments: anyone who knows the URL can send events.
    pub allow_unsigned: bool,
    /// How events arrive: Feishu posts them (`webhook`), or oncegate dials Feishu's long
    /// connection (`websocket`, needs no public address).
    pub transport: Transport,
    /// The app secret: the long connection's endpoint asks for it.
    pub app_secret: Option<Secret>,
    /// Where the long connection's endpoint is: `https://open.feishu.cn` (Feishu) or
    /// `https://open.larksuite.com` (Lark) unless set (a local server, a proxy).
    pub domain: Option<String>,
    /// Long connections held per gateway (Feishu allows 50 per app, and gives each event to
    /// one of them).
    pub connections: usize,
    /// Which gateways of several hold the long connections.
    pub instances: Instances,
    /// How long past a ping interval a connection may stay silent before it is dialled anew;
    /// unset: half the interval, between 5 s and 60 s.
    #[serde(with = "duration_opt")]
    pub pong_grace: Option<Duration>,
}

/// How a Feishu source's events arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// HTTP callbacks to `/webhook/<name>`.
    #[default]
    Webhook,
    /// The long connection (长连接).
    Websocket,
}

/// Which of several gateways hold a source's long connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Instances {
    /// Every gateway connects; Feishu spreads the events over them and the shared store
    /// (Redis) catches redeliveries that reach another gateway.
    #[default]
    All,
    /// One gateway holds them, through a lease in the store; another takes over when it stops.
    Leader,
}

impl Default for FeishuSettings {
    fn default() -> Self {
        Self {
            app_id: String::new(),
            encrypt_key: None,
            verification_token: None,
            allow_unsigned: false,
            transport: Transport::Webhook,
            app_secret: None,
            domain: None,
            connections: 1,
            instances: Instances::All,
            pong_grace: None,
        }
    }
}

/// A WeCom app (self-built app or third-party suite).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WecomSettings {
    /// The corp id (the receive id checked in every decrypted message).
    pub corp_id: String,
    /// The app's AgentID: callbacks naming another agent are refused. A corp's apps each have
    /// their own token and key, so each is its own source.
    pub agent_id: Option<String>,
    /// The callback token, signing every callback.
    pub token: Option<Secret>,
    /// The 43-character EncodingAESKey.
    pub encoding_aes_key: Option<Secret>,
    /// The app's Secret: `/send/<source>` sends as this agent with it (needs `agent_id`).
    pub secret: Option<Secret>,
    /// WeCom's API address: `https://qyapi.weixin.qq.com` unless set (a local server, a proxy).
    pub domain: Option<String>,
}

/// A WeChat Official Account.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WechatSettings {
    /// The app id (`wx…`).
    pub app_id: String,
    /// The account's original id (原始ID, `gh_…`): what its messages carry as `ToUserName`.
    /// Optional: when set, a message addressed to another account is refused; without it
    /// `ToUserName` is not checked (in safe mode the receive id inside the ciphertext binds a
    /// message to the app id).
    pub original_id: Option<String>,
    /// The token, signing every callback.
    pub token: Option<Secret>,
    /// The EncodingAESKey of safe mode; plain mode without it.
    pub encoding_aes_key: Option<Secret>,
}

/// A WeCom AI bot on its long connection (API mode, 长连接): no public callback URL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AibotSettings {
    /// The bot's id (`aibotid`, the Bot ID of its API settings).
    pub bot_id: String,
    /// The bot's secret (its API settings' Secret), sent when subscribing.
    pub secret: Option<Secret>,
    /// The long connection's address: `wss://openws.work.weixin.qq.com` unless set (a local
    /// server, a proxy).
    pub domain: Option<String>,
}

impl SourceConfig {
    /// The platform.
    pub fn platform(&self) -> Platform {
        match self.platform {
            PlatformConfig::Feishu(_) => Platform::Feishu,
            PlatformConfig::Lark(_) => Platform::Lark,
            PlatformConfig::Wecom(_) => Platform::Wecom,
            PlatformConfig::Wechat(_) => Platform::Wechat,
            PlatformConfig::WecomAibot(_) => Platform::WecomAibot,
        }
    }

    /// What makes two sources the same app: the platform, the app id and, on WeCom, the agent.
    pub fn identity(&self) -> (Platform, &str, Option<&str>) {
        let agent = match &self.platform {
            PlatformConfig::Wecom(s) => s.agent_id.as_deref(),
            _ => None,
        };
        (self.platform(), self.app_id(), agent)
    }

    /// The app's id on its platform (Feishu app id, WeCom corp id, WeChat app id).
    pub fn app_id(&self) -> &str {
        match &self.platform {
            PlatformConfig::Feishu(s) | PlatformConfig::Lark(s) => &s.app_id,
            PlatformConfig::Wecom(s) => &s.corp_id,
            PlatformConfig::Wechat(s) => &s.app_id,
            PlatformConfig::WecomAibot(s) => &s.bot_id,
        }
    }
}

/// By hand, like [`StoreConfig`]: the platform picks the settings, and errors name the field.
impl<'de> Deserialize<'de> for SourceConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let name = match table.remove("name") {
            Some(toml::Value::String(name)) => name,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "name = {other}: expected a string"
                )));
            }
            None => return Err(D::Error::custom("missing field `name`")),
        };
        let platform = match table.remove("platform") {
            Some(toml::Value::String(platform)) => platform,
            _ => {
                return Err(D::Error::custom(format!(
                    "source {name:?}: set platform = \"feishu\", \"lark\", \"wecom\", \"wecom-aibot\" \
                     or \"wechat\""
                )));
            }
        };
        let settings = toml::Value::Table(table);
        let context = format!("source {name:?} (platform = \"{platform}\")");
        let platform = match platform.as_str() {
            "feishu" => variant(settings, &context).map(PlatformConfig::Feishu),
            "lark" => variant(settings, &context).map(PlatformConfig::Lark),
            "wecom" => variant(settings, &context).map(PlatformConfig::Wecom),
            "wechat" => variant(settings, &context).map(PlatformConfig::Wechat),
            "wecom-aibot" => variant(settings, &context).map(PlatformConfig::WecomAibot),
            other => {
                return Err(D::Error::custom(format!(
                    "source {name:?}: platform = {other:?}: expected \"feishu\", \"lark\", \
                     \"wecom\", \"wecom-aibot\" or \"wechat\""
                )));
            }
        }?;
        Ok(SourceConfig { name, platform })
    }
}

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        message: String,
    },
    /// An environment override does not fit.
    #[error("environment variable {name}: {message}")]
    Env {
        /// The variable.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads `path` (or only defaults, if `None`) and applies `ONCEGATE_*` variables from `env`.
///
/// `ONCEGATE_STORE__PATH=/var/lib/oncegate.redb` sets `store.path`: sections and keys are
/// separated by a double underscore. Values are read as TOML where they parse (numbers, booleans)
/// and as strings otherwise.
pub fn load(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, LoadError> {
    let origin = path.map_or_else(|| PathBuf::from("<defaults>"), Path::to_path_buf);
    let text = match path {
        Some(path) => std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?,
        None => String::new(),
    };
    load_str(&text, &origin, env)
}

/// The commented file of every default, which a configuration is laid over.
pub const DEFAULTS: &str = include_str!("../defaults.toml");

/// `over` laid onto `base`: tables merge key by key, anything else is replaced.
fn lay_over(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above))
                if !names_another_variant(below, &above) =>
            {
                lay_over(below, above);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// A section that names another `backend` than the one below replaces it whole: each backend
/// has only its own settings.
fn names_another_variant(below: &toml::Table, above: &toml::Table) -> bool {
    above
        .get("backend")
        .is_some_and(|backend| below.get("backend") != Some(backend))
}

/// Reads configuration text (`origin` names it in errors), applies `ONCEGATE_*` variables from
/// `env` to it, and lays the result over [`DEFAULTS`], as [`load`] does for a file.
pub fn load_str(
    text: &str,
    origin: &Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, LoadError> {
    let origin = origin.to_path_buf();
    let mut table: toml::Table = toml::from_str(text).map_err(|error| LoadError::Parse {
        path: origin.clone(),
        message: error.to_string(),
    })?;
    let overrides: BTreeMap<String, String> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with("ONCEGATE_") && name.contains("__"))
        .collect();
    // The variables are one more layer, laid over the file as the file is over the defaults: a
    // variable naming another store backend replaces the file's store section. Each is also
    // tried on the file itself, which refuses one that reaches into a value.
    let mut from_env = toml::Table::new();
    let mut checked = table.clone();
    for (name, value) in &overrides {
        apply_override(&mut checked, name, value)?;
        apply_override(&mut from_env, name, value)?;
    }
    let file = table.clone();
    lay_over(&mut table, from_env);
    let error = match layered(table)? {
        Ok(config) => return Ok(config),
        Err(error) => error,
    };
    // Blamed on what brought it: the file alone, or else the variable that breaks it.
    if overrides.is_empty() || layered(file.clone())?.is_err() {
        return Err(LoadError::Parse {
            path: origin,
            message: error,
        });
    }
    for (name, value) in &overrides {
        let mut alone = toml::Table::new();
        apply_override(&mut alone, name, value)?;
        let mut table = file.clone();
        lay_over(&mut table, alone);
        if let Err(message) = layered(table)? {
            return Err(LoadError::Env {
                name: name.clone(),
                message: format!(
                    "{message} (set by the environment variable, not in {})",
                    origin.display()
                ),
            });
        }
    }
    // Only their combination fails.
    Err(LoadError::Env {
        name: overrides.keys().cloned().collect::<Vec<_>>().join(", "),
        message: format!("{error} (set by these environment variables together)"),
    })
}

/// `table` laid over [`DEFAULTS`] and read as a configuration: the reading's error as text.
fn layered(table: toml::Table) -> Result<Result<Config, String>, LoadError> {
    let mut layered: toml::Table = toml::from_str(DEFAULTS).map_err(|error| LoadError::Parse {
        path: PathBuf::from("<built-in defaults>"),
        message: error.to_string(),
    })?;
    lay_over(&mut layered, table);
    Ok(Config::deserialize(toml::Value::Table(layered)).map_err(|error| error.to_string()))
}

fn apply_override(table: &mut toml::Table, name: &str, value: &str) -> Result<(), LoadError> {
    let env_error = |message: String| LoadError::Env {
        name: name.to_owned(),
        message,
    };
    let path: Vec<String> = name["ONCEGATE_".len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(env_error(
            "expected ONCEGATE_<SECTION>__<KEY>, e.g. ONCEGATE_STORE__PATH".into(),
        ));
    }
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let (last, sections) = path
        .split_last()
        .ok_or_else(|| env_error("names no setting".into()))?;
    let mut current = table;
    for section in sections {
        let entry = current
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| env_error(format!("{section} is not a section")))?;
    }
    current.insert(last.clone(), parsed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
