//! The hand-out order's tests: examples and a property test against a model.
use super::*;

#[test]
fn heads_go_out_in_queue_order_and_chains_wait() {
    let mut index = PartitionIndex::new();
    for (seq, order) in [(0, 1), (1, 2), (2, 1), (3, 3), (4, 2)] {
        index.push(seq, order, 0, 10 + seq as usize);
    }
    assert_eq!(
        (index.len(), index.bytes(), index.oldest()),
        (5, 60, Some(0))
    );
    assert_eq!(index.seqs_after(None, 2), vec![0, 1]);
    assert_eq!(index.seqs_after(Some(1), 10), vec![2, 3, 4]);
    assert_eq!(index.seqs_after(Some(4), 10), Vec::<u64>::new());
    assert_eq!(index.take_ready(0, 10), vec![0, 1, 3]);
    assert_eq!(index.take_ready(0, 10), Vec::<u64>::new());
    assert!(index.remove(1));
    assert!(!index.remove(1));
    assert_eq!(index.take_ready(0, 10), vec![4]);
    assert_eq!(
        (index.len(), index.bytes(), index.oldest()),
        (4, 49, Some(0))
    );
    assert!(index.retry(0, 50));
    assert_eq!(
        index.state(0, 1, 10),
        Some(QueuedState::Delayed { until_ms: 50 })
    );
    assert_eq!(index.state(2, 1, 10), Some(QueuedState::Waiting));
    assert_eq!(index.state(4, 2, 10), Some(QueuedState::HandedOut));
    assert_eq!(index.take_ready(49, 10), Vec::<u64>::new());
    assert_eq!(index.take_ready(50, 10), vec![0]);
    assert!(index.remove(0));
    assert_eq!(index.take_ready(50, 10), vec![2]);
    assert_eq!(
        (index.len(), index.bytes(), index.oldest()),
        (3, 39, Some(2))
    );
}

/// A step of the property test.
#[derive(Debug, Clone)]
enum Step {
    /// An event of chain `chain` (its group is the chain's tenant) arrives, marked to go
    /// first (an @-mention) or not.
    Push { chain: u8, first: bool },
    /// Up to `max` heads are taken at `now`.
    Take { max: u8, now: u8 },
    /// The `nth` handed-out head is acked.
    Ack { nth: u8 },
    /// The `nth` handed-out head is retried at `at`.
    Retry { nth: u8, at: u8 },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..24, proptest::bool::weighted(0.2))
            .prop_map(|(chain, first)| Step::Push { chain, first }),
        2 => (1u8..6, 0u8..40).prop_map(|(max, now)| Step::Take { max, now }),
        2 => any::<u8>().prop_map(|nth| Step::Ack { nth }),
        1 => (any::<u8>(), 0u8..40).prop_map(|(nth, at)| Step::Retry { nth, at }),
    ]
}

/// Each group's load as a dispatcher would give it (`None`: at its cap).
struct Loads(HashMap<u64, Option<u32>>, Option<u32>);

impl GroupLoad for Loads {
    fn load(&self, group: u64) -> Option<u32> {
        self.0.get(&group).copied().unwrap_or(Some(0))
    }

    fn cap(&self) -> Option<u32> {
        self.1
    }
}

/// The tenant of a chain: chains 0..16 are one noisy tenant's, the rest one tenant each.
fn group_of(chain: u64) -> u64 {
    if chain < 16 { 100 } else { 200 + chain }
}

proptest::proptest! {
    /// Over random tenants, chains and interleavings, and random loads of each tenant in
    /// other partitions (some tenants held back, a cap for all or none): a chain's events go out one at a time
    /// in the order they came, each exactly once acked; no hand-out goes to a tenant at its
    /// cap; and every hand-out goes to a group whose load (out here and elsewhere) is the
    /// least among those with a head ready then; within that group, to its oldest ready head
    /// marked first if it has one, else to its oldest ready head.
    #[test]
    fn hand_outs_keep_each_chain_in_order_and_go_to_the_least_busy_group(
        steps in proptest::collection::vec(step(), 1..300),
        elsewhere in proptest::collection::vec(0u32..3, 25),
        capped in proptest::collection::vec(proptest::bool::weighted(0.15), 25),
        cap in proptest::option::of(1u32..6),
    ) {
        let at = |group: u64| if group == 100 { 24 } else { (group - 200) as usize };
        let elsewhere = |group: u64| elsewhere[at(group)];
        let capped = |group: u64| capped[at(group)];
        let mut index = PartitionIndex::new();
        // The model: each chain's events not yet acked, in order; the heads out; each
        // chain's retry time; each group's count out.
        let mut chains: HashMap<u64, VecDeque<u64>> = HashMap::new();
        let mut out: Vec<u64> = Vec::new();
        let mut chain_of: HashMap<u64, u64> = HashMap::new();
        let mut not_before: HashMap<u64, u64> = HashMap::new();
        let mut acked: Vec<u64> = Vec::new();
        let mut next_seq = 0u64;
        let mut marked: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for step in steps {
            match step {
                Step::Push { chain, first } => {
                    let chain = u64::from(chain);
                    // Marked as it joins (a store's admission) or after (ranked again at start).
                    if first && next_seq.is_multiple_of(2) {
                        let place = Place { order_hash: chain, group: group_of(chain), first };
                        index.push_at(next_seq, place, 0, 1);
                    } else {
                        index.push_in(next_seq, chain, group_of(chain), 0, 1);
                        if first {
                            proptest::prop_assert!(index.mark_first(next_seq, chain));
                        }
                    }
                    if first {
                        marked.insert(next_seq);
                    }
                    chains.entry(chain).or_default().push_back(next_seq);
                    chain_of.insert(next_seq, chain);
                    next_seq += 1;
                }
                Step::Take { max, now } => {
                    let now = u64::from(now);
                    let busy = |out: &[u64], group: u64| {
                        out.iter().filter(|o| group_of(chain_of[o]) == group).count() as u32
                    };
                    let loads = Loads(
                        chains
                            .keys()
                            .map(|&chain| group_of(chain))
                            .map(|group| {
                                let load = busy(&out, group) + elsewhere(group);
                                (group, (!capped(group)).then_some(load))
                            })
                            .collect(),
                        cap,
                    );
                    let taken = index.take_ranked(now, usize::from(max), &loads);
                    proptest::prop_assert!(taken.len() <= usize::from(max));
                    for seq in taken {
                        let chain = chain_of[&seq];
                        // The chain's first event not acked, and no other of it out.
                        proptest::prop_assert_eq!(chains[&chain].front(), Some(&seq));
                        proptest::prop_assert!(!out.iter().any(|o| chain_of[o] == chain));
                        proptest::prop_assert!(not_before.get(&chain).copied().unwrap_or(0) <= now);
                        // Not capped, and no group with a ready head had less load.
                        proptest::prop_assert!(!capped(group_of(chain)));
                        let load = |group: u64| busy(&out, group) + elsewhere(group);
                        let mine = load(group_of(chain));
                        let full = |group: u64| cap.is_some_and(|cap| load(group) >= cap);
                        proptest::prop_assert!(!full(group_of(chain)), "a group at its cap got more");
                        for (&other, queue) in &chains {
                            let Some(&head) = queue.front() else { continue };
                            let ready = !out.contains(&head)
                                && not_before.get(&other).copied().unwrap_or(0) <= now
                                && !capped(group_of(other))
                                && !full(group_of(other));
                            if ready {
                                proptest::prop_assert!(
                                    load(group_of(other)) >= mine,
                                    "seq {} of group {} went before a ready head of group {} with less load",
                                    seq, group_of(chain), group_of(other)
                                );
                            }
                            if ready && other != chain && group_of(other) == group_of(chain) {
                                // (marked, older) ranks a group's heads.
                                let rank = |seq: u64| (!marked.contains(&seq), seq);
                                proptest::prop_assert!(
                                    rank(seq) < rank(head),
                                    "seq {} (marked {}) went before the ready head {} (marked {}) of its group",
                                    seq, marked.contains(&seq), head, marked.contains(&head)
                                );
                            }
                        }
                        out.push(seq);
                    }
                }
                Step::Ack { nth } => {
                    if out.is_empty() { continue; }
                    let seq = out.remove(usize::from(nth) % out.len());
                    proptest::prop_assert!(index.remove(seq));
                    let chain = chain_of[&seq];
                    proptest::prop_assert_eq!(chains.get_mut(&chain).and_then(VecDeque::pop_front), Some(seq));
                    not_before.remove(&chain);
                    acked.push(seq);
                }
                Step::Retry { nth, at } => {
                    if out.is_empty() { continue; }
                    let seq = out.remove(usize::from(nth) % out.len());
                    proptest::prop_assert!(index.retry(seq, u64::from(at)));
                    not_before.insert(chain_of[&seq], u64::from(at));
                }
            }
            let waiting: usize = chains.values().map(VecDeque::len).sum();
            proptest::prop_assert_eq!(index.len(), waiting);
            // Each tenant's share of the queue, as counted.
            for group in chains.keys().map(|&chain| group_of(chain)) {
                let events: usize = chains
                    .iter()
                    .filter(|(chain, _)| group_of(**chain) == group)
                    .map(|(_, queue)| queue.len())
                    .sum();
                proptest::prop_assert_eq!(index.group_events(group), events as u64);
            }
            proptest::prop_assert_eq!(index.in_flight(), out.len());
        }
        // Everything drains, each event acked once, in chain order.
        for _ in 0..1000 {
            for seq in index.take_ready(u64::MAX, 64) {
                out.push(seq);
            }
            if out.is_empty() { break; }
            for seq in std::mem::take(&mut out) {
                let chain = chain_of[&seq];
                proptest::prop_assert_eq!(chains.get_mut(&chain).and_then(VecDeque::pop_front), Some(seq));
                proptest::prop_assert!(index.remove(seq));
                acked.push(seq);
            }
        }
        proptest::prop_assert!(index.is_empty());
        proptest::prop_assert!(index.groups.is_empty() && index.turns.is_empty());
        acked.sort_unstable();
        proptest::prop_assert_eq!(acked, (0..next_seq).collect::<Vec<_>>());
    }
}

#[test]
fn a_marked_event_passes_its_groups_backlog_but_not_its_own_chats_earlier_events() {
    let mut index = PartitionIndex::new();
    // One tenant's backlog: 20 chats, one event each.
    for seq in 0..20 {
        index.push_in(seq, seq, 1, 0, 1);
    }
    // Chat 50: an event, then an @-mention; chat 51: an @-mention alone.
    index.push_in(20, 50, 1, 0, 1);
    index.push_in(21, 50, 1, 0, 1);
    assert!(index.mark_first(21, 50));
    index.push_in(22, 51, 1, 0, 1);
    assert!(index.mark_first(22, 51));
    assert!(!index.mark_first(99, 51), "no such event");
    // Chat 51's mention goes at once; chat 50's waits for the event before it.
    assert_eq!(index.take_ready(0, 2), vec![22, 0]);
    assert_eq!(index.take_ready(0, 1), vec![1]);
    // Once chat 50's earlier event is out and done, its mention passes the backlog.
    let backlog = index.take_ready(0, 19);
    assert_eq!(
        backlog,
        (2..=20).collect::<Vec<_>>(),
        "chat 50's first event in its turn"
    );
    assert!(index.remove(20));
    assert_eq!(index.take_ready(0, 1), vec![21]);
    // Put back for a retry, it still goes first when due.
    assert!(index.retry(21, 5));
    index.push_in(23, 52, 1, 0, 1);
    assert_eq!(
        index.take_ready(4, 1),
        vec![23],
        "not due yet: the others go"
    );
    assert_eq!(index.take_ready(5, 1), vec![21]);
}

#[test]
fn a_quiet_groups_head_goes_before_a_noisy_groups_backlog() {
    let mut index = PartitionIndex::new();
    // The noisy group: 10 chats, 3 events each, all before the quiet one's.
    for seq in 0..30 {
        index.push_in(seq, seq % 10, 1, 0, 1);
    }
    assert_eq!(index.take_ready(0, 4), vec![0, 1, 2, 3]);
    index.push_in(30, 99, 2, 0, 1);
    // The quiet group has none out: its head goes first, then the noisy backlog.
    assert_eq!(index.take_ready(0, 2), vec![30, 4]);
    // The noisy group, all acked, has fewer out than the quiet one: its turn; then, as
    // busy as each other, the older head first, then the one with fewer out.
    index.push_in(31, 98, 2, 0, 1);
    index.push_in(32, 97, 2, 0, 1);
    for seq in [0, 1, 2, 3, 4] {
        assert!(index.remove(seq));
    }
    assert_eq!(index.in_flight(), 1);
    assert_eq!(index.take_ready(0, 4), vec![5, 6, 31, 7]);
}
