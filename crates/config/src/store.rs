//! `[store]`: where records and the queue live.

use std::path::PathBuf;
use std::time::Duration;

use oncegate_core::redact::url as redact_url;
use serde::{Deserialize, Serialize};

use crate::checks::{Severity, scheme_of};
use crate::duration_opt;
use crate::*;

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

    /// What encrypts values at rest, if anything (the memory backend keeps nothing at rest).
    pub fn encryption(&self) -> Option<&EncryptionSettings> {
        match self {
            StoreConfig::Embedded(s) => s.encryption.as_ref(),
            StoreConfig::Memory(_) => None,
            StoreConfig::Redis(s) => s.encryption.as_ref(),
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
pub(crate) fn variant<T: serde::de::DeserializeOwned, E: serde::de::Error>(
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
    /// Payloads, results and credentials encrypted at rest.
    pub encryption: Option<EncryptionSettings>,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        Self {
            path: PathBuf::from("data/oncegate"),
            partitions: DEFAULT_PARTITIONS,
            max_records: 10_000_000,
            cache_mb: None,
            encryption: None,
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
    /// Payloads, results and credentials encrypted at rest.
    pub encryption: Option<EncryptionSettings>,
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
            encryption: None,
        }
    }
}

/// `[store]`: partitions, and each backend's own settings.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let partitions = config.store.partitions();
    if partitions == 0 || partitions > 4096 {
        report(
            Severity::Error,
            "store.partitions",
            format!("{partitions} partitions; use between 1 and 4096 (16 is the default)"),
        );
    }
    if let Some(encryption) = config.store.encryption() {
        crate::encryption::check(encryption, "store.encryption", report);
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
            durability(redis, report);
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
