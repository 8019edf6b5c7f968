//! Key names.

use std::borrow::Cow;

use super::*;

/// A partition's own key names, made once: most calls name one or two of them, and a name
/// made per call was an allocation each.
pub(super) struct PartitionNames {
    stream: String,
    sequence: String,
    attempts: String,
    dead: String,
    dead_index: String,
    tokens: String,
    owner: String,
    groups: String,
    counts: String,
}

impl PartitionNames {
    /// The names of each of `partitions` under `prefix`.
    pub(super) fn all(prefix: &str, partitions: u16) -> Vec<Self> {
        (0..partitions)
            .map(|partition| Self {
                stream: made(prefix, partition, STREAM),
                sequence: made(prefix, partition, SEQUENCE),
                attempts: made(prefix, partition, ATTEMPTS),
                dead: made(prefix, partition, DEAD),
                dead_index: made(prefix, partition, DEAD_INDEX),
                tokens: made(prefix, partition, TOKENS),
                owner: made(prefix, partition, OWNER),
                groups: made(prefix, partition, GROUPS),
                counts: made(prefix, partition, COUNTS),
            })
            .collect()
    }
}

const STREAM: &str = "q";
const SEQUENCE: &str = "qseq";
const ATTEMPTS: &str = "qa";
const DEAD: &str = "dead";
const DEAD_INDEX: &str = "deadidx";
const TOKENS: &str = "token";
const OWNER: &str = "own";
const GROUPS: &str = "qg";
const COUNTS: &str = "n";

/// `{prefix:partition}:suffix`.
fn made(prefix: &str, partition: u16, suffix: &str) -> String {
    format!("{{{prefix}:{partition}}}:{suffix}")
}

/// Key names. Everything one script touches carries its partition's hash tag `{prefix:p}`, so
/// that in a Redis Cluster a partition's records, stream and counters share one slot. A
/// partition beyond the configured ones (a caller's mistake, refused where it matters) gets
/// its name made on the spot.
impl<C> Inner<C> {
    pub(super) fn record_key(&self, key: &KeyHash, partition: u16) -> String {
        format!("{{{}:{partition}}}:r:{key}", self.prefix)
    }
    fn name(
        &self,
        partition: u16,
        kept: fn(&PartitionNames) -> &String,
        suffix: &str,
    ) -> Cow<'_, str> {
        match self.names.get(usize::from(partition)) {
            Some(names) => Cow::Borrowed(kept(names).as_str()),
            None => Cow::Owned(made(&self.prefix, partition, suffix)),
        }
    }
    pub(super) fn stream(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.stream, STREAM)
    }
    pub(super) fn sequence(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.sequence, SEQUENCE)
    }
    pub(super) fn attempts(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.attempts, ATTEMPTS)
    }
    pub(super) fn dead(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.dead, DEAD)
    }
    /// Each dead letter's entry in the dead stream, by its queue seq.
    pub(super) fn dead_index(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.dead_index, DEAD_INDEX)
    }
    pub(super) fn tokens(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.tokens, TOKENS)
    }
    pub(super) fn nonce_bucket(&self, timestamp_secs: u64, partition: u16) -> String {
        format!("{{{}:{partition}}}:nt:{timestamp_secs}", self.prefix)
    }
    /// Who owns the partition, under which epoch, until when (`lua/own.lua`): in the
    /// partition's slot, so that every owner's script can check it.
    pub(super) fn owner(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.owner, OWNER)
    }
    /// Each tenant's events in the partition, as its owner last published them
    /// (`groups.rs`).
    pub(super) fn groups(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.groups, GROUPS)
    }
    /// The partition's records counted by state and by the minute their life ends
    /// (`lua/counts.lua`).
    pub(super) fn counts(&self, partition: u16) -> Cow<'_, str> {
        self.name(partition, |n| &n.counts, COUNTS)
    }
    /// Written just before a `WAIT` for replicas, in the partition's slot (`promise.rs`).
    pub(super) fn replication_mark(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:sync", self.prefix)
    }
    /// The live gateways (`lua/members.lua`).
    pub(super) fn members(&self) -> String {
        format!("{{{}}}:members", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names made once are the names made on the spot, for every partition; a partition
    /// beyond them still gets its name.
    #[test]
    fn kept_names_are_the_made_ones() {
        let names = PartitionNames::all("og", 3);
        assert_eq!(names.len(), 3);
        assert_eq!(names[2].stream, "{og:2}:q");
        // Beyond the table, the same name, made on the spot.
        let beyond = made("og", 7, DEAD_INDEX);
        assert_eq!(beyond, "{og:7}:deadidx");
        for (partition, kept) in (0u16..).zip(&names) {
            assert_eq!(kept.stream, format!("{{og:{partition}}}:q"));
            assert_eq!(kept.sequence, format!("{{og:{partition}}}:qseq"));
            assert_eq!(kept.attempts, format!("{{og:{partition}}}:qa"));
            assert_eq!(kept.dead, format!("{{og:{partition}}}:dead"));
            assert_eq!(kept.dead_index, format!("{{og:{partition}}}:deadidx"));
            assert_eq!(kept.tokens, format!("{{og:{partition}}}:token"));
            assert_eq!(kept.owner, format!("{{og:{partition}}}:own"));
            assert_eq!(kept.counts, format!("{{og:{partition}}}:n"));
        }
    }
}
