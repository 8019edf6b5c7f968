//! Several stores on one Redis share the partitions: each takes a fair share, hands partitions
//! over only once their handed-out events are settled, gives everything up when it leaves, and
//! loses it when it goes silent; a former owner's reads, acks, retries and dead letters are
//! refused inside the scripts (the epoch fence).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use oncegate_contract::{block_on, event, key};
use oncegate_core::{
    Admission, DedupStore, Event, EventQueue, PartitionOwner, QueueId, SystemClock,
    event::partition_of,
};
use oncegate_redis::{RedisConfig, RedisStore};

use crate::common;
use common::plain;

/// A store on the test Redis with `partitions`, ownership that lapses quickly (but not while a
/// busy machine runs the other tests beside: heartbeats come every 100 ms).
fn store(prefix: &str, partitions: u16) -> RedisStore {
    let config = RedisConfig {
        partitions,
        ownership: Duration::from_secs(1),
        ..common::config(prefix)
    };
    RedisStore::connect_with_clock(config, SystemClock).expect("connect")
}

/// Pulls nothing from every partition of each store: what a dispatcher's idle loop does, and
/// what drives the stores' heartbeats.
fn tick(stores: &[&RedisStore]) {
    for store in stores {
        for partition in 0..store.partitions() {
            block_on(store.pull(partition, 0)).expect("pull");
        }
    }
}

fn owners(store: &RedisStore) -> Vec<PartitionOwner> {
    block_on(store.owners()).expect("owners")
}

/// Partitions per owning gateway, as Redis has them.
fn shares(store: &RedisStore) -> HashMap<String, usize> {
    let mut shares = HashMap::new();
    for owner in owners(store) {
        if let Some(gateway) = owner.gateway {
            *shares.entry(gateway).or_default() += 1;
        }
    }
    shares
}

/// Ticks `stores` until `done` holds for what `look` sees, for at most `within`.
fn until(stores: &[&RedisStore], within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        tick(stores);
        if done() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sorted_counts(shares: &HashMap<String, usize>) -> Vec<usize> {
    let mut counts: Vec<usize> = shares.values().copied().collect();
    counts.sort_unstable();
    counts
}

#[test]
fn gateways_take_fair_shares_and_take_over_when_one_leaves_or_dies() {
    let prefix = format!("share{}", std::process::id());
    let a = store(&prefix, 16);
    tick(&[&a]);
    assert_eq!(
        sorted_counts(&shares(&a)),
        vec![16],
        "alone, a owns every partition"
    );
    let before: HashMap<u16, u64> = owners(&a).iter().map(|o| (o.partition, o.epoch)).collect();
    let b = store(&prefix, 16);
    let c = store(&prefix, 16);
    until(
        &[&a, &b, &c],
        Duration::from_secs(5),
        "shares of 6, 5 and 5",
        || sorted_counts(&shares(&a)) == vec![5, 5, 6],
    );
    // Every partition that moved was granted under a larger epoch.
    for owner in owners(&a) {
        assert!(owner.gateway.is_some(), "{owner:?}");
        if !owner.here {
            assert!(owner.epoch > before[&owner.partition], "{owner:?}");
        }
    }
    // Each store knows which are its own: the three views agree with Redis.
    let here: Vec<usize> = [&a, &b, &c]
        .iter()
        .map(|s| owners(s).iter().filter(|o| o.here).count())
        .collect();
    assert_eq!(here.iter().sum::<usize>(), 16, "{here:?}");
    // c stops: it gives its partitions up at once, and a and b split them.
    block_on(c.leave()).expect("leave");
    until(
        &[&a, &b],
        Duration::from_secs(4),
        "shares of 8 and 8",
        || sorted_counts(&shares(&a)) == vec![8, 8],
    );
    // A store that left takes nothing, whatever is queued.
    let admitted = block_on(c.admit(
        event("left", Some("c1")),
        &[key("left")],
        Duration::from_secs(60),
    ))
    .expect("admit");
    let Admission::Admitted { id } = admitted else {
        panic!("{admitted:?}")
    };
    assert!(block_on(c.pull(id.partition, 10)).expect("pull").is_empty());
    // b dies (no leave): its partitions come to a when its ownership runs out.
    drop(b);
    let died = Instant::now();
    until(&[&a], Duration::from_secs(5), "a owning all 16", || {
        sorted_counts(&shares(&a)) == vec![16]
    });
    assert!(
        died.elapsed() >= Duration::from_millis(900),
        "not before b's ownership ran out"
    );
    let delivered = block_on(a.pull(id.partition, 10)).expect("pull");
    assert_eq!(
        delivered
            .iter()
            .map(|d| &*d.event.event_id)
            .collect::<Vec<_>>(),
        vec!["left"]
    );
}

/// A gateway that joins gets its share within a few heartbeats, not rounds: with the default
/// ownership (10 s) rounds come every second, and the newcomer, finding nothing free in its
/// first round, used to wait for the owner's next round and then its own second one.
#[test]
fn a_join_settles_well_within_one_round() {
    let prefix = format!("join{}", std::process::id());
    let store = || {
        let config = RedisConfig {
            partitions: 16,
            ownership: Duration::from_secs(10),
            ..common::config(&prefix)
        };
        RedisStore::connect_with_clock(config, SystemClock).expect("connect")
    };
    let a = store();
    until(&[&a], Duration::from_secs(5), "a owning all 16", || {
        sorted_counts(&shares(&a)) == vec![16]
    });
    let b = store();
    let joined = Instant::now();
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "shares of 8 and 8",
        || sorted_counts(&shares(&a)) == vec![8, 8],
    );
    let took = joined.elapsed();
    assert!(took < Duration::from_millis(800), "the join took {took:?}");
    for gateway in [&a, &b] {
        block_on(gateway.leave()).expect("leave");
    }
}

/// A chat whose events land in `partition` of `partitions`.
fn chat_in(partition: u16, partitions: u16) -> String {
    (0..)
        .map(|n| format!("oc_{n}"))
        .find(|chat| {
            let probe: Event = event("probe", Some(chat));
            partition_of(probe.order_hash(), partitions) == partition
        })
        .expect("some chat lands in every partition")
}

fn admit(store: &RedisStore, id: &str, chat: &str) -> QueueId {
    match block_on(store.admit(event(id, Some(chat)), &[key(id)], Duration::from_secs(60)))
        .expect("admit")
    {
        Admission::Admitted { id } => id,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_partition_is_handed_over_only_after_its_running_handler_and_in_chat_order() {
    let prefix = format!("handover{}", std::process::id());
    let a = store(&prefix, 2);
    // One chat in each partition, each with a running handler and an event behind it.
    let chats = [chat_in(0, 2), chat_in(1, 2)];
    let mut running = Vec::new();
    for (partition, chat) in (0u16..).zip(&chats) {
        admit(&a, &format!("{partition}-first"), chat);
        admit(&a, &format!("{partition}-second"), chat);
        let out = block_on(a.pull(partition, 10)).expect("pull");
        assert_eq!(
            out.iter().map(|d| &*d.event.event_id).collect::<Vec<_>>(),
            vec![format!("{partition}-first")],
            "one event of a chat at a time"
        );
        running.push(out[0].id);
    }
    // b joins: a hands one partition over, but keeps owning it while its handler runs.
    let b = store(&prefix, 2);
    let mut handing = None;
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "a handing a partition over",
        || {
            handing = owners(&a)
                .iter()
                .find(|o| o.handing_over)
                .map(|o| o.partition);
            handing.is_some()
        },
    );
    let handing = handing.expect("handing over");
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(700) {
        tick(&[&a, &b]);
        let view = owners(&a);
        assert!(
            view.iter().all(|o| o.here),
            "a keeps both while both run: {view:?}"
        );
        for partition in 0..2 {
            assert!(block_on(b.pull(partition, 10)).expect("pull").is_empty());
        }
        assert!(
            block_on(a.pull(handing, 10)).expect("pull").is_empty(),
            "nothing new where a hands over"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // That handler ends; then b takes the partition over and hands out the chat's next event.
    assert!(block_on(a.ack(running[usize::from(handing)])).expect("ack"));
    let mut next = Vec::new();
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "b handing out the next event",
        || {
            next.extend(block_on(b.pull(handing, 10)).expect("pull"));
            !next.is_empty()
        },
    );
    assert_eq!(
        next.iter()
            .map(|d| d.event.event_id.to_string())
            .collect::<Vec<_>>(),
        vec![format!("{handing}-second")]
    );
    let view = owners(&a);
    assert!(
        !view[usize::from(handing)].here && view[usize::from(1 - handing)].here,
        "{view:?}"
    );
    assert!(block_on(a.pull(handing, 10)).expect("pull").is_empty());
}

#[test]
fn a_former_owner_can_neither_read_nor_ack_nor_retry_nor_dead_letter() {
    let prefix = format!("fence{}", std::process::id());
    let a = store(&prefix, 1);
    for id in ["f1", "f2", "f3"] {
        admit(&a, id, id);
    }
    let out = block_on(a.pull(0, 10)).expect("pull");
    assert_eq!(out.len(), 3);
    // Another gateway owns the partition now, under its own epoch (a paused owner whose
    // ownership ran out and was granted again, as far as Redis is concerned).
    let mut redis = plain();
    let time: (u64, u64) = redis::cmd("TIME").query(&mut redis).expect("time");
    let owner = format!("{{{prefix}:0}}:own");
    let _: () = redis::cmd("SET")
        .arg(&owner)
        .arg(format!("{},1,intruder", time.0 * 1000 + 60_000))
        .query(&mut redis)
        .expect("set");
    assert!(
        !block_on(a.ack(out[0].id)).expect("ack"),
        "an ack is refused"
    );
    assert!(
        !block_on(a.retry(out[1].id, 0)).expect("retry"),
        "a retry is refused"
    );
    assert!(
        !block_on(a.dead_letter(out[2].id, "gave up")).expect("dead letter"),
        "a dead letter is refused"
    );
    assert!(
        block_on(a.dead_letters(10))
            .expect("dead letters")
            .is_empty()
    );
    let stream = format!("{{{prefix}:0}}:q");
    let length: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query(&mut redis)
        .expect("xlen");
    assert_eq!(length, 3, "every entry stays for the owner");
    let attempts: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{{{prefix}:0}}:qa"))
        .query(&mut redis)
        .expect("hgetall");
    assert!(attempts.is_empty(), "no attempt was counted: {attempts:?}");
    // A new event: a's read is refused inside the script, so it does not land in a's pending
    // list behind the owner's back.
    admit(&a, "f4", "f4");
    assert!(block_on(a.pull(0, 10)).expect("pull").is_empty());
    let pending: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("oncegate")
        .query(&mut redis)
        .expect("xpending");
    assert_eq!(pending.0, 3, "f4 was delivered to nobody");
}

#[test]
fn a_handler_that_outlasts_the_handover_keeps_its_chat_through_its_claim() {
    let prefix = format!("outlast{}", std::process::id());
    let quick = |prefix: &str| {
        let config = RedisConfig {
            partitions: 1,
            ownership: Duration::from_secs(1),
            handover: Duration::from_millis(300),
            ..common::config(prefix)
        };
        RedisStore::connect_with_clock(config, SystemClock).expect("connect")
    };
    let a = quick(&prefix);
    admit(&a, "o1", "oc_outlast");
    admit(&a, "o2", "oc_outlast");
    // Long enough to outlive the whole test on a machine loaded by the rest of the suite (a CI
    // run once took over 30 s here, and b then took the claim over as run out).
    let lease = Duration::from_secs(300);
    let out = block_on(a.pull_claimed(0, 10, lease)).expect("pull");
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0].1, Ok(oncegate_core::Claim::Acquired(_))));
    // b joins; with one partition, it gets it only if it ranks first (names sort): made until
    // one does.
    let mut b = quick(&prefix);
    while b.name() > a.name() {
        b = quick(&prefix);
    }
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "b owning the partition",
        || owners(&b)[0].here,
    );
    // o1 still runs at a (its claim is live): b hands it out with its claim in flight, and
    // holds o2 back behind it.
    let mut seen = Vec::new();
    until(
        &[&a, &b],
        Duration::from_secs(4),
        "b's hand-out of o1",
        || {
            seen.extend(block_on(b.pull_claimed(0, 10, lease)).expect("pull"));
            !seen.is_empty()
        },
    );
    assert_eq!(seen.len(), 1, "o2 waits behind o1");
    assert_eq!(&*seen[0].0.event.event_id, "o1");
    assert!(
        matches!(seen[0].1, Ok(oncegate_core::Claim::InFlight { .. })),
        "{:?}",
        seen[0].1
    );
}

/// A tenant's events counted on every gateway (a per-tenant queue bound): each owner counts
/// its partitions from its own order and publishes them; another gateway reads the published
/// counts. Handed-out events still count, acked ones no longer once their owner has pulled
/// again; a gateway that owns nothing counts them all the same.
#[test]
fn every_gateway_counts_a_tenants_events_in_partitions_owned_elsewhere() {
    let prefix = format!("groups{}", fastrand::u32(..));
    let (a, b) = (store(&prefix, 4), store(&prefix, 4));
    until(&[&a, &b], Duration::from_secs(10), "two owners", || {
        sorted_counts(&shares(&a)) == vec![2, 2]
    });
    let tenant = |id: &str, chat: &str| {
        let mut event = event(id, Some(chat));
        event.tenant = Some(std::sync::Arc::from("T-busy"));
        event
    };
    let group = tenant("probe", "x").group_hash();
    // Two events of the tenant in each partition, admitted through A.
    for partition in 0..4 {
        let chat = chat_in(partition, 4);
        for n in 0..2 {
            let id = format!("g{partition}-{n}");
            let admitted =
                block_on(a.admit(tenant(&id, &chat), &[key(&id)], Duration::from_secs(60)));
            assert!(
                matches!(admitted.expect("admit"), Admission::Admitted { .. }),
                "{id}"
            );
        }
    }
    let counted = |store: &RedisStore| block_on(store.group_queued(group)).expect("count");
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "8 counted on both",
        || counted(&a) == Some(8) && counted(&b) == Some(8),
    );
    // Each owner hands out and acks its partitions' first events (a pull from a partition
    // owned elsewhere hands out nothing).
    let mut acked = 0;
    for store in [&a, &b] {
        for partition in 0..4 {
            for delivery in block_on(store.pull(partition, 1)).expect("pull") {
                assert!(block_on(store.ack(delivery.id)).expect("ack"));
                acked += 1;
            }
        }
    }
    assert_eq!(acked, 4);
    until(
        &[&a, &b],
        Duration::from_secs(5),
        "4 counted on both",
        || counted(&a) == Some(4) && counted(&b) == Some(4),
    );
    // A gateway that owns nothing reads every partition's published count.
    let c = store(&prefix, 4);
    assert_eq!(counted(&c), Some(4));
    assert_eq!(
        block_on(c.busiest_groups(5)).expect("busiest"),
        Some(vec![(group, 4)])
    );
}
