//! Key names.

use super::*;

/// Key names. Everything one script touches carries its partition's hash tag `{prefix:p}`, so
/// that in a Redis Cluster a partition's records, stream and counters share one slot.
impl<C> Inner<C> {
    pub(super) fn record_key(&self, key: &KeyHash, partition: u16) -> String {
        format!("{{{}:{partition}}}:r:{key}", self.prefix)
    }
    pub(super) fn stream(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:q", self.prefix)
    }
    pub(super) fn sequence(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:qseq", self.prefix)
    }
    pub(super) fn attempts(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:qa", self.prefix)
    }
    pub(super) fn dead(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:dead", self.prefix)
    }
    /// Each dead letter's entry in the dead stream, by its queue seq.
    pub(super) fn dead_index(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:deadidx", self.prefix)
    }
    pub(super) fn tokens(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:token", self.prefix)
    }
    /// The set of the nonces of the requests signed at `timestamp_secs`.
    pub(super) fn nonce_bucket(&self, timestamp_secs: u64, partition: u16) -> String {
        format!("{{{}:{partition}}}:nt:{timestamp_secs}", self.prefix)
    }
    pub(super) fn owner(&self, partition: u16) -> String {
        format!("{}:own:{partition}", self.prefix)
    }
    /// A `SCAN` pattern for every record key.
    pub(super) fn records_pattern(&self) -> String {
        let mut escaped = String::with_capacity(self.prefix.len() + 8);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        format!("{{{escaped}:*}}:r:*")
    }
}
