//! What a store promises about the events it acknowledged: said at start, in `check-config`,
//! in `/readyz` and as a gauge, so that no configuration loses events without saying so.

/// What a store keeps of what it acknowledged, as it last found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// The guarantee's name: `fsync` (on disk before the answer), `replicas` (on N replicas
    /// before the answer), `memory` (in memory only).
    pub mode: &'static str,
    /// Whether the store keeps the promise now. When it does not, acknowledgements it cannot
    /// back are refused (503: the platform retries) rather than given.
    pub holds: bool,
    /// What the store keeps, what it checked, and what to change when it does not hold.
    pub detail: String,
    /// What acknowledged events a crash or failover can lose by design (`memory`), in words;
    /// `None` when the mode loses none.
    pub at_risk: Option<String>,
}

impl Durability {
    /// A store that keeps everything in the process: a restart loses what it holds.
    pub fn in_process() -> Self {
        Self {
            mode: "memory",
            holds: true,
            detail: "events live in this process's memory only".into(),
            at_risk: Some(
                "every acknowledged event not yet delivered, and every dedup mark, is lost when \
                 the gateway stops"
                    .into(),
            ),
        }
    }

    /// A store that writes every acknowledged change to its disk before answering.
    pub fn on_disk(detail: impl Into<String>) -> Self {
        Self {
            mode: "fsync",
            holds: true,
            detail: detail.into(),
            at_risk: None,
        }
    }
}
