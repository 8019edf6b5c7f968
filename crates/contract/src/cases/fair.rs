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
            Some(oncegate_core::Next::of(idle)),
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

/// With a rule that puts some events first (an @-mention, as the gateway's routes say): one
/// tenant's backlog of chats, then in chat X an event and an @-mention, then in chat Y an
/// @-mention. Y's mention goes out before the backlog; X's waits for X's earlier event, then
/// passes the backlog too — also once put back for a retry. A second rule is refused.
pub fn a_first_event_passes_its_tenants_backlog_not_its_chats<S: Store>(
    make: impl Fn(ManualClock) -> S,
) {
    let store = make(clock());
    block_on(async {
        let rule = |event: &Event| event.event_id.starts_with("mention");
        store
            .put_first(std::sync::Arc::new(rule))
            .await
            .expect("a rule");
        const BACKLOG: usize = 10;
        // X's chat: that of the last event tried for X's first place, which is the one kept
        // (a place is tried until an event lands in the partition).
        let chat_x = std::cell::RefCell::new(String::new());
        let admitted: Vec<oncegate_core::QueueId> =
            in_one_partition(&store, BACKLOG + 3, |at, chat| {
                let (id, chat) = match at {
                    at if at < BACKLOG => (format!("backlog{chat}"), format!("chat-{chat}")),
                    at if at == BACKLOG => {
                        chat_x.replace(format!("x-{chat}"));
                        (format!("plain-x{chat}"), chat_x.borrow().clone())
                    }
                    at if at == BACKLOG + 1 => {
                        (format!("mention-x{chat}"), chat_x.borrow().clone())
                    }
                    _ => (format!("mention-y{chat}"), format!("y-{chat}")),
                };
                (id.clone(), of("busy", &id, &chat))
            })
            .await
            .into_iter()
            .map(|(queued, _, _)| queued)
            .collect();
        let partition = admitted[0].partition;
        let (backlog, plain_x, mention_x, mention_y) = (
            &admitted[..BACKLOG],
            admitted[BACKLOG],
            admitted[BACKLOG + 1],
            admitted[BACKLOG + 2],
        );
        let unranked = || -> Loads { std::sync::Arc::new(Load(HashMap::new(), None)) };
        let pull = |max: usize| {
            let store = &store;
            async move {
                store
                    .pull_ranked(partition, max, &unranked())
                    .await
                    .expect("pull")
                    .into_iter()
                    .map(|delivery| delivery.id)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            pull(1).await,
            vec![mention_y],
            "Y's mention passes the backlog"
        );
        // X's mention waits behind X's first event: the backlog and X's first, in order.
        let mut rest = backlog.to_vec();
        rest.push(plain_x);
        assert_eq!(
            pull(BACKLOG + 5).await,
            rest,
            "X's mention is not handed out"
        );
        // The backlog put back, X's first done: X's mention goes before all of it.
        for id in backlog {
            assert!(store.retry(*id, 0).await.expect("retry"));
        }
        assert!(store.ack(plain_x).await.expect("ack"));
        assert_eq!(pull(1).await, vec![mention_x]);
        // Retried, it goes first again.
        assert!(store.retry(mention_x, 0).await.expect("retry"));
        assert_eq!(pull(2).await, vec![mention_x, backlog[0]]);
        let again = store.put_first(std::sync::Arc::new(|_: &Event| true)).await;
        assert!(
            matches!(again, Err(oncegate_core::StoreError::Invalid(_))),
            "a second rule: {again:?}"
        );
    });
}
