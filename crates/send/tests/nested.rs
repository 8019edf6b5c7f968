//! A WeCom suite's corps bursting at once, against WeCom's own counting (`shared/protocols/
//! tenants.md` §3.1): 30 messages a minute and 1 000 an hour to one member, 10 000 calls a
//! minute and 150 000 an hour per corp, 40 000 a minute for the service provider's address,
//! all its corps together. Each send spends the budgets `Api::prepare` names for it and the
//! suite's shared ones, all or none, as the gateway takes them (`api/budget.rs`: a budget that
//! says wait has the calls taken before it given back); each call reaches WeCom up to 250 ms
//! after its grant. Whatever the corps' sizes, concurrency and arrival: no count WeCom keeps is
//! ever over, every message goes out once, and a small corp that arrives during a flood is
//! served about as soon as it would be alone.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use oncegate_core::rates::LocalRates;
use oncegate_core::{KeyHash, Rate, RateAdjust, RateVerdict};
use oncegate_send::limits::{WECOM_ISV, WECOM_ISV_HOUR};
use oncegate_send::wecom::WecomOptions;
use oncegate_send::{Api, WecomApi};
use proptest::prelude::*;
use serde_json::json;

/// How long a call takes before its sender sends the next.
const CALL_US: u64 = 20_000;

/// One corp: its messages (each to a member, by index), how many senders send them at once,
/// and when it starts.
#[derive(Debug, Clone)]
struct Corp {
    members: Vec<u32>,
    senders: usize,
    start_us: u64,
}

/// Each corp's sends: when each reached WeCom (its member, the corp) and when the last did.
struct Outcome {
    /// (arrival µs, corp, member).
    arrivals: Vec<(u64, usize, u32)>,
    /// Each corp's last grant.
    finished: Vec<u64>,
    /// Messages sent per corp.
    sent: Vec<usize>,
}

/// The budgets of a send to `member` from `api` (a corp's): what the API names, within the
/// corp's scope, then (`shared`) the suite's.
fn budgets(api: &Api, member: u32, shared: bool) -> Vec<(KeyHash, Rate)> {
    let scope = api.scope().expect("scope");
    let body = json!({"touser": format!("m{member}"), "msgtype": "text", "text": {"content": "x"}});
    let prepared = api.prepare(body, "k".into()).expect("prepare");
    prepared
        .budgets
        .iter()
        .map(|(name, rate)| (KeyHash::of(&[&scope, name]), *rate))
        .chain(
            [("isv", WECOM_ISV), ("isv-hour", WECOM_ISV_HOUR)]
                .map(|(name, rate)| (KeyHash::of(&["suite:tj1", name]), rate))
                .into_iter()
                .filter(|_| shared),
        )
        .collect()
}

/// Corp `corp`'s API (nothing is called: it names the budgets).
fn api(corp: usize) -> Api {
    let id = format!("wwcorp{corp:03}");
    let api = WecomApi::new(
        "http://127.0.0.1:9",
        &id,
        1_000_002,
        "s",
        WecomOptions::default(),
    );
    Api::Wecom(api.expect("api"))
}

/// Every budget or none, as the gateway takes them: the wait when one says wait.
fn take_all(rates: &LocalRates, budgets: &[(KeyHash, Rate)], now: u64) -> Option<u64> {
    for (i, (bucket, rate)) in budgets.iter().enumerate() {
        if let RateVerdict::Wait(wait) = rates.take(bucket, *rate, now) {
            for (bucket, rate) in &budgets[..i] {
                rates.adjust(bucket, RateAdjust::GiveBack(*rate), now);
            }
            return Some(wait.as_micros() as u64);
        }
    }
    None
}

/// Runs the corps' senders to the end: each takes the next message of its corp, waits for its
/// budgets, and sends. Senders woken at one instant go in the order `order` gives them.
fn run(corps: &[Corp], jitters: &[u64], order: u64, shared: bool) -> Outcome {
    let rates = LocalRates::default();
    let apis: Vec<Api> = (0..corps.len()).map(api).collect();
    let mut cache: HashMap<(usize, u32), Vec<(KeyHash, Rate)>> = HashMap::new();
    let mut next = vec![0usize; corps.len()];
    let mut out = Outcome {
        arrivals: Vec::new(),
        finished: vec![0; corps.len()],
        sent: vec![0; corps.len()],
    };
    // (time, tie-break, corp, the message it holds).
    let mut woken = BinaryHeap::new();
    let mut tie = order;
    let mut shuffle = || {
        tie = tie
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tie >> 11
    };
    for (c, corp) in corps.iter().enumerate() {
        for _ in 0..corp.senders {
            if next[c] < corp.members.len() {
                woken.push(Reverse((corp.start_us, shuffle(), c, next[c])));
                next[c] += 1;
            }
        }
    }
    while let Some(Reverse((now, _, c, message))) = woken.pop() {
        let member = corps[c].members[message];
        let budgets = cache
            .entry((c, member))
            .or_insert_with(|| budgets(&apis[c], member, shared));
        if let Some(wait) = take_all(&rates, budgets, now) {
            woken.push(Reverse((now + wait, shuffle(), c, message)));
            continue;
        }
        let jitter = jitters[out.arrivals.len() % jitters.len()];
        out.arrivals.push((now + jitter, c, member));
        out.sent[c] += 1;
        out.finished[c] = now;
        if next[c] < corps[c].members.len() {
            woken.push(Reverse((now + CALL_US, shuffle(), c, next[c])));
            next[c] += 1;
        }
    }
    out
}

/// The most of `times` (sorted) inside any window of `window`.
fn most_in_any(times: &[u64], window: Duration) -> usize {
    let window = window.as_micros() as u64;
    let (mut most, mut first) = (0, 0);
    for (last, at) in times.iter().enumerate() {
        while *at - times[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

fn sorted(arrivals: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut times: Vec<u64> = arrivals.collect();
    times.sort_unstable();
    times
}

/// A corp's messages: `count`, to `count / per_member` members (one at least), in turn.
fn corp(count: u32, per_member: u32, senders: usize, start_us: u64) -> Corp {
    let members = (count / per_member).max(1);
    Corp {
        members: (0..count).map(|i| i % members).collect(),
        senders,
        start_us,
    }
}

fn corps() -> impl Strategy<Value = Vec<Corp>> {
    // Floods from the start, more than the provider's 40 000 a minute together; small corps
    // arriving during them.
    let floods = prop::collection::vec((5_000u32..6_000, 1u32..4, 4usize..6), 9..11);
    let small = prop::collection::vec((1u32..30, 1u32..10, 1usize..3, 0u64..30_000_000), 91..96);
    (floods, small).prop_map(|(floods, small)| {
        let mut corps: Vec<Corp> = floods
            .into_iter()
            .map(|(count, per, senders)| corp(count, per, senders, 0))
            .collect();
        corps.extend(
            small
                .into_iter()
                .map(|(count, per, senders, start)| corp(count, per, senders, start)),
        );
        corps.truncate(100);
        corps
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3))]

    #[test]
    fn a_suites_corps_stay_within_every_count_and_none_is_starved(
        corps in corps(),
        jitters in prop::collection::vec(0u64..250_000, 1..32),
        order in any::<u64>(),
    ) {
        let out = run(&corps, &jitters, order, true);
        let minute = Duration::from_secs(60);
        let hour = Duration::from_secs(3600);

        // Every message once.
        for (c, corp) in corps.iter().enumerate() {
            prop_assert_eq!(out.sent[c], corp.members.len(), "corp {}", c);
        }
        let total: usize = corps.iter().map(|corp| corp.members.len()).sum();
        prop_assert_eq!(out.arrivals.len(), total);

        // The provider's address: all corps together.
        let all = sorted(out.arrivals.iter().map(|(at, ..)| *at));
        let most = most_in_any(&all, minute);
        prop_assert!(most <= 40_000, "{} calls in a minute from the provider", most);
        prop_assert!(most_in_any(&all, hour) <= 1_200_000);
        prop_assert!(most > 38_000, "the shared budget was put to the test: {}", most);

        // Each corp, and each member.
        let mut by_corp: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut by_member: HashMap<(usize, u32), Vec<u64>> = HashMap::new();
        for (at, c, member) in &out.arrivals {
            by_corp.entry(*c).or_default().push(*at);
            by_member.entry((*c, *member)).or_default().push(*at);
        }
        for (c, times) in by_corp.iter_mut() {
            times.sort_unstable();
            let most = most_in_any(times, minute);
            prop_assert!(most <= 10_000, "corp {}: {} calls in a minute", c, most);
            prop_assert!(most_in_any(times, hour) <= 150_000);
        }
        for ((c, member), times) in by_member.iter_mut() {
            times.sort_unstable();
            let most = most_in_any(times, minute);
            prop_assert!(most <= 30, "corp {} member {}: {} in a minute", c, member, most);
            prop_assert!(most_in_any(times, hour) <= 1_000);
        }

        // A small corp that arrives during the floods is served about as soon as it would be
        // alone: its own budgets decide, not the others' backlog.
        for (c, corp) in corps.iter().enumerate().filter(|(_, corp)| corp.members.len() < 30) {
            let alone = run(&[Corp { start_us: 0, ..corp.clone() }], &jitters, order, true);
            let took = out.finished[c] - corp.start_us;
            let took_alone = alone.finished[0];
            prop_assert!(
                took <= took_alone + 5_000_000,
                "corp {} ({} messages): {} ms among the floods, {} ms alone",
                c, corp.members.len(), took / 1000, took_alone / 1000
            );
        }
        // The floods progress: each is done within what the provider's budget allows for all.
        let floods_done = out.finished.iter().max().copied().unwrap_or(0);
        let all_at_the_shared_rate = total as u64 * WECOM_ISV.emission_us();
        prop_assert!(
            floods_done <= all_at_the_shared_rate + 60_000_000,
            "the last send at {} s; the shared budget alone allows all by {} s",
            floods_done / 1_000_000, all_at_the_shared_rate / 1_000_000
        );
    }
}

/// The property above catches a suite without its shared budget: floods that pass 40 000
/// calls a minute together.
#[test]
fn without_the_shared_budget_the_provider_is_over() {
    let floods: Vec<Corp> = (0..9).map(|_| corp(6_000, 2, 6, 0)).collect();
    let out = run(&floods, &[0], 1, false);
    let all = sorted(out.arrivals.iter().map(|(at, ..)| *at));
    assert!(most_in_any(&all, Duration::from_secs(60)) > 40_000);
}
