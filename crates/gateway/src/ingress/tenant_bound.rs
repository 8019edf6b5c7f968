//! `dispatcher.max_queued_per_tenant`: a tenant whose events fill its share of the queue is
//! answered 503 (its platform retries) while every other tenant is admitted as usual. Each
//! tenant's depth is read from the store at most every `TENANT_SAMPLE` per tenant and counted
//! up by this gateway's own admissions in between, so a flood costs the store one read per
//! tenant per sample, not one per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oncegate_core::{Event, Store};

use crate::Shared;

/// How old a tenant's sampled depth may be.
const TENANT_SAMPLE: Duration = Duration::from_millis(100);
/// Samples kept at most; past it, the stale ones go (a tenant's next admission reads again).
const MOST_SAMPLES: usize = 65_536;

/// Each tenant's queue depth as last read, and when.
#[derive(Default)]
pub(crate) struct TenantDepths {
    samples: Mutex<HashMap<u64, (u64, Instant)>>,
}

fn lock(depths: &TenantDepths) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Instant)>> {
    depths
        .samples
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TenantDepths {
    fn fresh(&self, group: u64) -> Option<u64> {
        lock(self)
            .get(&group)
            .filter(|(_, at)| at.elapsed() < TENANT_SAMPLE)
            .map(|(depth, _)| *depth)
    }

    fn keep(&self, group: u64, depth: u64) {
        let mut samples = lock(self);
        if samples.len() >= MOST_SAMPLES {
            samples.retain(|_, (_, at)| at.elapsed() < TENANT_SAMPLE);
        }
        samples.insert(group, (depth, Instant::now()));
    }

    /// One more of `group`'s events is queued (admitted here since the last read).
    pub(crate) fn admitted(&self, group: u64) {
        if let Some((depth, _)) = lock(self).get_mut(&group) {
            *depth += 1;
        }
    }
}

/// The depth of `event`'s tenant when it holds `dispatcher.max_queued_per_tenant` events or
/// more; `None` when it has room, no bound is set, or the store cannot count a tenant's
/// events (check-config says so) or did not answer (the admission then meets the store's own
/// answer).
pub(crate) async fn tenant_full<S: Store>(shared: &Shared<S>, event: &Event) -> Option<u64> {
    let max = shared.timing.dispatcher.max_queued_per_tenant?;
    let group = event.group_hash();
    let depths = &shared.ingress.tenant_depths;
    let depth = match depths.fresh(group) {
        Some(depth) => depth,
        None => {
            let depth = shared.store.group_queued(group).await.ok().flatten()?;
            depths.keep(group, depth);
            depth
        }
    };
    (depth >= max).then_some(depth)
}
