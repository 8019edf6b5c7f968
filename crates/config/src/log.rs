//! `[log]`: how the gateway writes its log.

use serde::{Deserialize, Serialize};

/// `[log]`: the format of the log lines and the instance name every line carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` (one readable line per event) or `json` (one JSON object per line).
    pub format: LogFormat,
    /// This gateway's name on every line; the host's name and the process id when unset.
    pub instance: Option<String>,
}

/// The shape of a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Readable text.
    #[default]
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogConfig {
    /// The instance name lines carry: the configured one, else `<host>:<pid>`.
    pub fn instance_name(&self) -> String {
        match &self.instance {
            Some(name) if !name.trim().is_empty() => name.trim().to_owned(),
            _ => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "oncegate".into());
                format!("{host}:{}", std::process::id())
            }
        }
    }
}
