//! Shared values ([`StateStore`]): per namespace, a generation and the values by name, each
//! change journaled as the value's new state with the generation after it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::state::{self, MAX_LIST};
use oncegate_core::{Changed, Expect, StateStore, Versioned};

use super::*;

/// The most values one namespace holds (what a registry of tenants and their tokens needs,
/// many times over).
const MAX_VALUES: usize = 1_000_000;

/// The shared values of every namespace.
#[derive(Debug, Default)]
pub(crate) struct States {
    spaces: BTreeMap<String, Space>,
}

#[derive(Debug, Default)]
struct Space {
    generation: u64,
    values: BTreeMap<String, Versioned>,
}

fn live(value: &Versioned, now_ms: u64) -> bool {
    value.expires_at_ms.is_none_or(|at| at > now_ms)
}

impl States {
    /// A change replayed from the journal (or a snapshot): every change states the value's new
    /// state outright, so replaying one twice, or over a later state, changes nothing.
    pub(crate) fn apply(
        &mut self,
        namespace: &str,
        name: &str,
        value: Option<Bytes>,
        version: u64,
        expires_at_ms: u64,
    ) {
        let space = self.spaces.entry(namespace.to_owned()).or_default();
        space.generation = space.generation.max(version);
        if name.is_empty() {
            return;
        }
        let newer = space.values.get(name).is_none_or(|v| v.version <= version);
        if !newer {
            return;
        }
        match value {
            Some(value) => {
                space.values.insert(
                    name.to_owned(),
                    Versioned {
                        version,
                        value,
                        expires_at_ms: (expires_at_ms != 0).then_some(expires_at_ms),
                    },
                );
            }
            None => {
                space.values.remove(name);
            }
        }
    }

    /// Every live value and each namespace's generation, as changes.
    pub(crate) fn snapshot(&self, now_ms: u64, emit: &mut dyn FnMut(&Change<'_>)) {
        for (namespace, space) in &self.spaces {
            emit(&Change::State {
                namespace: Cow::Borrowed(namespace),
                name: Cow::Borrowed(""),
                value: None,
                version: space.generation,
                expires_at_ms: 0,
            });
            for (name, value) in space.values.iter().filter(|(_, v)| live(v, now_ms)) {
                emit(&Change::State {
                    namespace: Cow::Borrowed(namespace),
                    name: Cow::Borrowed(name),
                    value: Some(value.value.clone()),
                    version: value.version,
                    expires_at_ms: value.expires_at_ms.unwrap_or(0),
                });
            }
        }
    }
}

impl<C: Clock, J: Journal> MemoryStore<C, J> {
    /// Writes (`Some`) or removes (`None`) `name` if its current version meets `expect`.
    async fn change_state(
        &self,
        namespace: &str,
        name: &str,
        value: Option<(Bytes, Option<Duration>)>,
        expect: Expect,
    ) -> Result<Changed, StoreError> {
        state::check(namespace, name, value.as_ref().map(|(v, _)| v.as_ref()))?;
        self.journal.check()?;
        let changed = {
            let now_ms = self.clock.now_ms();
            let mut states = lock(&self.states);
            let space = states.spaces.entry(namespace.to_owned()).or_default();
            let current = space
                .values
                .get(name)
                .filter(|v| live(v, now_ms))
                .map_or(0, |v| v.version);
            if !expect.met_by(current) {
                Changed::Stale(current)
            } else if value.is_some()
                && current == 0
                && !space.values.contains_key(name)
                && space.values.len() >= MAX_VALUES
            {
                return Err(StoreError::Invalid(format!(
                    "state namespace {namespace} holds {MAX_VALUES} values already"
                )));
            } else {
                space.generation += 1;
                let version = space.generation;
                let expires_at_ms = value
                    .as_ref()
                    .and_then(|(_, ttl)| state::expiry(now_ms, *ttl));
                self.journal.append(&Change::State {
                    namespace: Cow::Borrowed(namespace),
                    name: Cow::Borrowed(name),
                    value: value.as_ref().map(|(v, _)| v.clone()),
                    version,
                    expires_at_ms: expires_at_ms.unwrap_or(0),
                });
                match value {
                    Some((value, _)) => {
                        space.values.insert(
                            name.to_owned(),
                            Versioned {
                                version,
                                value,
                                expires_at_ms,
                            },
                        );
                    }
                    None => {
                        space.values.remove(name);
                    }
                }
                Changed::Done(version)
            }
        };
        self.synced(Ok(changed)).await
    }
}

impl<C: Clock, J: Journal> StateStore for MemoryStore<C, J> {
    async fn state_get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Versioned>, StoreError> {
        state::check(namespace, name, None)?;
        let now_ms = self.clock.now_ms();
        let states = lock(&self.states);
        Ok(states
            .spaces
            .get(namespace)
            .and_then(|space| space.values.get(name))
            .filter(|v| live(v, now_ms))
            .cloned())
    }

    async fn state_put(
        &self,
        namespace: &str,
        name: &str,
        value: Bytes,
        expect: Expect,
        ttl: Option<Duration>,
    ) -> Result<Changed, StoreError> {
        self.change_state(namespace, name, Some((value, ttl)), expect)
            .await
    }

    async fn state_remove(
        &self,
        namespace: &str,
        name: &str,
        expect: Expect,
    ) -> Result<Changed, StoreError> {
        self.change_state(namespace, name, None, expect).await
    }

    async fn state_list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Versioned)>, StoreError> {
        state::check(namespace, "-", None)?;
        let now_ms = self.clock.now_ms();
        let states = lock(&self.states);
        let Some(space) = states.spaces.get(namespace) else {
            return Ok(Vec::new());
        };
        let from = match after {
            Some(after) => std::ops::Bound::Excluded(after.to_owned()),
            None => std::ops::Bound::Unbounded,
        };
        Ok(space
            .values
            .range((from, std::ops::Bound::Unbounded))
            .filter(|(_, v)| live(v, now_ms))
            .take(limit.min(MAX_LIST))
            .map(|(name, v)| (name.clone(), v.clone()))
            .collect())
    }

    async fn state_generation(&self, namespace: &str) -> Result<u64, StoreError> {
        state::check(namespace, "-", None)?;
        Ok(lock(&self.states)
            .spaces
            .get(namespace)
            .map_or(0, |space| space.generation))
    }
}
