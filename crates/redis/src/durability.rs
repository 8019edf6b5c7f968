//! What the Redis behind the store keeps of what the gateway acknowledged: the guarantee the
//! configuration asks for, what the server says it does (read at connect and every
//! `CHECK_EVERY`), and the verdict — refused at start, refused per admission, or warned about,
//! never silent.

use std::collections::HashMap;
use std::time::Duration;

use oncegate_core::Durability;
use redis::Value;

/// The guarantee a Redis store gives for an event it answered 200 for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisDurability {
    /// Every acknowledged write is on the Redis host's disk: the server must run with
    /// `appendonly yes` and `appendfsync always`, or the store refuses to start (and refuses
    /// admissions while a running server stops doing so).
    Fsync,
    /// Every acknowledgement waits (`WAIT`) until `min` replicas have the write, for at most
    /// `wait`; fewer is a refusal (503: the platform retries, the retry is admitted once).
    Replicas {
        /// Replicas that must have each acknowledged write.
        min: u16,
        /// How long an acknowledgement waits for them.
        wait: Duration,
    },
    /// Acknowledged events live in Redis memory (and whatever persistence the server has,
    /// unchecked): allowed, with what it can lose said at start, in `check-config`, in
    /// `/readyz` and by `oncegate_store_durability_holds`.
    Memory,
}

impl RedisDurability {
    /// The mode's name, as the configuration spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Fsync => "fsync",
            Self::Replicas { .. } => "replicas",
            Self::Memory => "memory",
        }
    }
}

/// How often a running store reads again what the server promises: a `CONFIG SET`, a restart
/// with another configuration or a failover to a differently configured replica is noticed
/// within this.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// What one Redis server says it does with writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerPromise {
    /// `CONFIG GET appendonly` (or `INFO persistence`'s `aof_enabled` when CONFIG is refused).
    pub appendonly: Option<bool>,
    /// `CONFIG GET appendfsync`: `always`, `everysec` or `no`.
    pub appendfsync: Option<String>,
    /// `CONFIG GET save`: the snapshot schedule (empty: none).
    pub save: Option<String>,
    /// Why `CONFIG GET` was refused (managed services rename or forbid it).
    pub config_refused: Option<String>,
    /// `INFO replication`'s `role`.
    pub role: Option<String>,
    /// Replicas `INFO replication` lists as `state=online` (one still waiting for its first
    /// sync is connected but confirms nothing); `connected_slaves` when it lists none.
    pub replicas: Option<u64>,
}

impl ServerPromise {
    /// Reads a server's answers: `CONFIG GET appendonly appendfsync save` (or the error it
    /// gave), `INFO persistence` and `INFO replication`.
    pub fn from_answers(
        config: Result<HashMap<String, String>, String>,
        persistence: &str,
        replication: &str,
    ) -> Self {
        let fields = |text: &str| -> HashMap<String, String> {
            text.lines()
                .filter_map(|line| line.trim().split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let persistence = fields(persistence);
        let replication = fields(replication);
        let listed: Vec<&String> = replication
            .iter()
            .filter(|(name, _)| {
                name.strip_prefix("slave")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .map(|(_, value)| value)
            .collect();
        let online = listed
            .iter()
            .filter(|value| value.split(',').any(|field| field == "state=online"))
            .count() as u64;
        let mut promise = Self {
            role: replication.get("role").cloned(),
            replicas: match listed.is_empty() {
                true => replication
                    .get("connected_slaves")
                    .and_then(|n| n.parse().ok()),
                false => Some(online),
            },
            ..Self::default()
        };
        match config {
            Ok(config) => {
                promise.appendonly = config.get("appendonly").map(|v| v == "yes");
                promise.appendfsync = config.get("appendfsync").cloned();
                promise.save = config.get("save").cloned();
            }
            Err(refused) => {
                promise.config_refused = Some(refused);
                promise.appendonly = persistence.get("aof_enabled").map(|v| v == "1");
            }
        }
        promise
    }

    /// The server's persistence in the words of its settings.
    fn described(&self) -> String {
        let appendonly = match self.appendonly {
            Some(true) => "appendonly yes",
            Some(false) => "appendonly no",
            None => "appendonly unknown",
        };
        let fsync = match &self.appendfsync {
            Some(policy) => format!("appendfsync {policy}"),
            None => "appendfsync unknown (CONFIG refused)".into(),
        };
        let save = match self.save.as_deref() {
            Some("") => "no snapshots".to_owned(),
            Some(save) => format!("save \"{save}\""),
            None => "snapshots unknown".to_owned(),
        };
        format!("{appendonly}, {fsync}, {save}")
    }

    /// What a restart of this server loses of what it acknowledged.
    fn restart_loses(&self) -> String {
        match (self.appendonly, self.appendfsync.as_deref()) {
            (Some(true), Some("always")) => {
                "nothing on a Redis restart (appendfsync always)".into()
            }
            (Some(true), Some("everysec")) => {
                "nothing on a Redis process crash, up to about a second of acknowledged events \
                 on a host crash (appendfsync everysec)"
                    .into()
            }
            (Some(true), _) => {
                "acknowledged events the host had not yet written to disk, on a host crash".into()
            }
            (Some(false), _) if self.save.as_deref().is_some_and(|s| !s.is_empty()) => {
                "every acknowledged event since the last snapshot, on a Redis restart (RDB \
                 snapshots only)"
                    .into()
            }
            (Some(false), _) => {
                "every acknowledged event not yet delivered and every dedup mark, on a Redis \
                 restart (persistence is off)"
                    .into()
            }
            (None, _) => "unknown: the server's persistence could not be read".into(),
        }
    }
}

/// What `mode` amounts to on servers that promise `nodes` (every primary of a cluster; one
/// server otherwise): the store's `Durability`.
pub fn judge(mode: RedisDurability, nodes: &[ServerPromise]) -> Durability {
    let weakest = nodes.iter().find(|node| !fsyncs(node)).or(nodes.first());
    let described = weakest.map(ServerPromise::described).unwrap_or_default();
    match mode {
        RedisDurability::Fsync => match weakest.filter(|node| !fsyncs(node)) {
            None if !nodes.is_empty() => Durability {
                mode: mode.name(),
                holds: true,
                detail: format!(
                    "every acknowledged write is on the Redis host's disk before the answer \
                     (checked: {described})"
                ),
                at_risk: None,
            },
            _ => {
                let why = match weakest.and_then(|n| n.config_refused.as_deref()) {
                    Some(refused) => format!(
                        "the Redis refuses CONFIG GET ({refused}), so whether it writes every \
                         change to disk before answering cannot be checked"
                    ),
                    None => format!("the Redis has {described}"),
                };
                Durability {
                    mode: mode.name(),
                    holds: false,
                    detail: format!(
                        "durability = \"fsync\" needs every acknowledged write on disk, but {why}: \
                         run the Redis with appendonly yes and appendfsync always (redis.conf, or \
                         CONFIG SET appendonly yes and CONFIG SET appendfsync always); or choose \
                         durability = \"replicas\" (each acknowledgement waits for min_replicas \
                         replicas) or durability = \"memory\" (acknowledged events can be lost, \
                         said at start and in /readyz)"
                    ),
                    at_risk: None,
                }
            }
        },
        RedisDurability::Replicas { min, wait } => {
            let fewest = nodes
                .iter()
                .map(|node| (node.role.as_deref(), node.replicas.unwrap_or(0)))
                .min_by_key(|(_, replicas)| *replicas);
            let (role, replicas) = fewest.unwrap_or((None, 0));
            let holds = role == Some("master") && replicas >= u64::from(min) && !nodes.is_empty();
            let detail = if holds {
                format!(
                    "every acknowledgement waits until {min} replica{} have the write (WAIT, at \
                     most {} ms; {replicas} connected)",
                    if min == 1 { "" } else { "s" },
                    wait.as_millis()
                )
            } else if role != Some("master") {
                format!(
                    "the server is a {} not a primary: acknowledgements are refused (503) until \
                     the store reaches a primary",
                    role.unwrap_or("server of unknown role")
                )
            } else {
                format!(
                    "only {replicas} of the {min} replica{} durability = \"replicas\" waits for \
                     are connected: acknowledgements are refused (503, the platform retries) \
                     until enough are; connect replicas (replicaof) or lower min_replicas",
                    if min == 1 { "" } else { "s" }
                )
            };
            // Redis's "replication safety when the master has persistence turned off".
            let amnesiac = nodes
                .iter()
                .any(|n| n.appendonly == Some(false) && n.save.as_deref() == Some(""));
            Durability {
                mode: mode.name(),
                holds,
                detail,
                at_risk: amnesiac.then(|| {
                    "everything, if a primary without persistence is restarted (automatically) \
                     before the sentinels or the cluster have failed it over: it comes back \
                     empty and its replicas copy the empty data set; turn on appendonly or \
                     do not restart such primaries automatically"
                        .to_owned()
                }),
            }
        }
        RedisDurability::Memory => {
            let loses = weakest
                .map(ServerPromise::restart_loses)
                .unwrap_or_else(|| "unknown: the server could not be read".into());
            Durability {
                mode: mode.name(),
                holds: true,
                detail: format!(
                    "acknowledged events live in Redis memory; the server has {described}, not \
                     checked to stay so"
                ),
                at_risk: Some(format!(
                    "{loses}; and on a failover, what the replica had not received"
                )),
            }
        }
    }
}

/// The server writes every change to disk before it answers.
fn fsyncs(node: &ServerPromise) -> bool {
    node.appendonly == Some(true) && node.appendfsync.as_deref() == Some("always")
}

/// Reads `CONFIG GET`'s answer as name → value (RESP2 arrays and RESP3 maps alike).
pub(crate) fn config_answer(value: Value) -> Result<HashMap<String, String>, String> {
    redis::from_redis_value::<HashMap<String, String>>(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<HashMap<String, String>, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect())
    }

    const MASTER_ONE: &str = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n";
    const MASTER_NONE: &str = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n";

    #[test]
    fn fsync_holds_only_with_appendfsync_always() {
        let always = ServerPromise::from_answers(
            config(&[
                ("appendonly", "yes"),
                ("appendfsync", "always"),
                ("save", ""),
            ]),
            "aof_enabled:1",
            MASTER_NONE,
        );
        assert!(judge(RedisDurability::Fsync, std::slice::from_ref(&always)).holds);
        for (appendonly, fsync) in [("yes", "everysec"), ("no", "always"), ("yes", "no")] {
            let weak = ServerPromise::from_answers(
                config(&[
                    ("appendonly", appendonly),
                    ("appendfsync", fsync),
                    ("save", ""),
                ]),
                "",
                MASTER_NONE,
            );
            let verdict = judge(RedisDurability::Fsync, &[always.clone(), weak]);
            assert!(!verdict.holds, "{appendonly} {fsync}");
            assert!(
                verdict.detail.contains("appendfsync always")
                    && verdict.detail.contains(&format!("appendfsync {fsync}")),
                "{}",
                verdict.detail
            );
        }
        // No server read at all is no promise.
        assert!(!judge(RedisDurability::Fsync, &[]).holds);
    }

    #[test]
    fn a_refused_config_is_not_taken_for_fsync() {
        let managed = ServerPromise::from_answers(
            Err("ERR unknown command 'CONFIG'".into()),
            "# Persistence\r\naof_enabled:1\r\n",
            MASTER_ONE,
        );
        assert_eq!(managed.appendonly, Some(true));
        let verdict = judge(RedisDurability::Fsync, std::slice::from_ref(&managed));
        assert!(!verdict.holds);
        assert!(
            verdict.detail.contains("refuses CONFIG"),
            "{}",
            verdict.detail
        );
        // The same server is fine for replicas.
        let replicas = RedisDurability::Replicas {
            min: 1,
            wait: Duration::from_millis(500),
        };
        assert!(judge(replicas, &[managed]).holds);
    }

    #[test]
    fn only_online_replicas_count() {
        let syncing = ServerPromise::from_answers(
            config(&[]),
            "",
            "role:master\r\nconnected_slaves:2\r\n\
             slave0:ip=127.0.0.1,port=16704,state=wait_bgsave,offset=0,lag=0\r\n\
             slave1:ip=127.0.0.1,port=16705,state=online,offset=10,lag=0\r\n",
        );
        assert_eq!(syncing.replicas, Some(1));
        let mode = |min| RedisDurability::Replicas {
            min,
            wait: Duration::from_millis(500),
        };
        assert!(judge(mode(1), std::slice::from_ref(&syncing)).holds);
        assert!(!judge(mode(2), &[syncing]).holds);
    }

    #[test]
    fn replicas_hold_with_enough_connected_to_a_primary() {
        let mode = |min| RedisDurability::Replicas {
            min,
            wait: Duration::from_millis(500),
        };
        let one = ServerPromise::from_answers(config(&[]), "", MASTER_ONE);
        let none = ServerPromise::from_answers(config(&[]), "", MASTER_NONE);
        let replica = ServerPromise::from_answers(config(&[]), "", "role:slave\r\n");
        assert!(judge(mode(1), std::slice::from_ref(&one)).holds);
        assert!(!judge(mode(2), std::slice::from_ref(&one)).holds);
        assert!(!judge(mode(1), &[one.clone(), none]).holds);
        let verdict = judge(mode(1), &[replica]);
        assert!(
            !verdict.holds && verdict.detail.contains("slave"),
            "{verdict:?}"
        );
        // A primary that restarts empty is said, with persistence only.
        assert!(judge(mode(1), std::slice::from_ref(&one)).at_risk.is_none());
        let amnesiac = ServerPromise::from_answers(
            config(&[("appendonly", "no"), ("save", "")]),
            "",
            MASTER_ONE,
        );
        let verdict = judge(mode(1), &[amnesiac]);
        assert!(verdict.holds);
        assert!(
            verdict
                .at_risk
                .is_some_and(|r| r.contains("comes back empty")),
            "a primary without persistence"
        );
    }

    #[test]
    fn memory_says_what_a_restart_loses() {
        let cases = [
            (("no", "everysec", ""), "persistence is off"),
            (("no", "everysec", "3600 1"), "since the last snapshot"),
            (("yes", "everysec", ""), "about a second"),
            (("yes", "always", ""), "nothing on a Redis restart"),
        ];
        for ((appendonly, fsync, save), says) in cases {
            let node = ServerPromise::from_answers(
                config(&[
                    ("appendonly", appendonly),
                    ("appendfsync", fsync),
                    ("save", save),
                ]),
                "",
                MASTER_NONE,
            );
            let verdict = judge(RedisDurability::Memory, &[node]);
            assert!(verdict.holds);
            let at_risk = verdict.at_risk.expect("memory always says what is at risk");
            assert!(at_risk.contains(says), "{at_risk}");
        }
    }
}
