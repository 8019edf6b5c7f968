//! Ranked hand-outs: each store reads an event's tenant (its group) as the dispatcher does, and
//! hands out to the tenant the dispatcher's load finds least busy, never past a cap.

use super::*;
use oncegate_core::{Event, GroupLoad, Loads};

/// A dispatcher's view of each group's handlers running, and a cap for all.
struct Load(HashMap<u64, u32>, Option<u32>);

impl GroupLoad for Load {
    fn load(&self, group: u64) -> Option<u32> {
        let load = self.0.get(&group).copied().unwrap_or(0);
        (self.1.is_none_or(|cap| load < cap)).then_some(load)
    }

    fn cap(&self) -> Option<u32> {
        self.1
    }
}

fn of(tenant: &str, id: &str, chat: &str) -> Event {
    let mut event = event(id, Some(chat));
    event.tenant = Some(std::sync::Arc::from(tenant));
    event
}

/// In one partition, a busy tenant's backlog admitted before a quiet tenant's event and an
/// idle one's: the ranked hand-out serves the least loaded first, `next_group` names that
/// tenant, and a tenant at the cap gets nothing while another has a ready event.
pub fn ranked_pulls_serve_the_least_loaded_tenant<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let tenants = ["busy", "busy", "busy", "quiet", "idle"];
        let admitted_ids: Vec<(oncegate_core::QueueId, Event)> =
            in_one_partition(&store, tenants.len(), |at, chat| {
                let id = format!("fair{chat}");
                let event = of(tenants[at], &id, &format!("chat-{chat}"));
                (id, event)
            })
            .await
            .into_iter()
            .map(|(queued, _, event)| (queued, event))
            .collect();
        let partition = admitted_ids[0].0.partition;
        let group = |at: usize| admitted_ids[at].1.group_hash();
        let (busy, quiet, idle) = (group(0), group(3), group(4));
        assert!(busy != quiet && quiet != idle && busy != idle);
        // The busy tenant runs 5 handlers elsewhere, the quiet one 1, the idle one none.
        let load = |cap| -> Loads {
            std::sync::Arc::new(Load(HashMap::from([(busy, 5), (quiet, 1)]), cap))
        };
        assert_eq!(
            store
                .next_group(partition, &load(None))
                .await
                .expect("next"),
            Some(idle),
            "the idle tenant's event is next"
        );
        // Each tenant's share of the queue, where the store counts it: every store does once
        // it has looked at the partition (a shared one counts from its owners' orders).
        for (tenant, events) in [(busy, 3), (quiet, 1), (idle, 1)] {
            let counted = store.group_queued(tenant).await.expect("group queued");
            assert_eq!(counted, Some(events));
        }
        // The busiest first, ties by group: what a tenants view shows.
        let mut quiet_ones = [quiet, idle];
        quiet_ones.sort_unstable();
        assert_eq!(
            store.busiest_groups(2).await.expect("busiest"),
            Some(vec![(busy, 3), (quiet_ones[0], 1)])
        );
        let pulled = store
            .pull_claimed_ranked(partition, 2, LEASE, &load(None))
            .await
            .expect("pull");
        let ids: Vec<_> = pulled.iter().map(|(d, _)| d.id).collect();
        assert_eq!(
            ids,
            vec![admitted_ids[4].0, admitted_ids[3].0],
            "the idle tenant's, then the quiet one's, before the busy backlog"
        );
        for (delivery, _) in &pulled {
            assert_eq!(
                delivery.event.group_hash(),
                admitted_ids
                    .iter()
                    .find(|(id, _)| *id == delivery.id)
                    .map(|(_, e)| e.group_hash())
                    .expect("admitted")
            );
        }
        // The busy tenant at a cap of 5: nothing for it.
        assert_eq!(
            store
                .next_group(partition, &load(Some(5)))
                .await
                .expect("next"),
            None
        );
        assert!(
            store
                .pull_ranked(partition, 3, &load(Some(5)))
                .await
                .expect("pull")
                .is_empty()
        );
        // A cap of 7 leaves it room for two: two of its three, oldest first.
        let pulled = store
            .pull_ranked(partition, 3, &load(Some(7)))
            .await
            .expect("pull");
        assert_eq!(
            pulled.iter().map(|d| d.id).collect::<Vec<_>>(),
            vec![admitted_ids[0].0, admitted_ids[1].0]
        );
        // Handed out, they are still queued; acked, they are not.
        assert_eq!(store.group_queued(busy).await.expect("counted"), Some(3));
        assert!(store.ack(admitted_ids[0].0).await.expect("ack"));
        assert!(store.retry(admitted_ids[1].0, 0).await.expect("retry"));
        assert_eq!(store.group_queued(busy).await.expect("counted"), Some(2));
        assert_eq!(store.group_queued(idle).await.expect("counted"), Some(1));
        let busiest = store.busiest_groups(10).await.expect("busiest");
        assert_eq!(busiest.as_deref().and_then(|b| b.first()), Some(&(busy, 2)));
    });
}
