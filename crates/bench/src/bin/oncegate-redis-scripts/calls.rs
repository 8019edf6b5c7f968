//! The Redis calls the benchmark makes and measures: bare commands, the scripts, their
//! replies and the server's CPU.

use super::*;

/// Redis CPU per event of an event's own commands sent bare, pipelined, without a script or
/// any check: the least that keeping its keys costs, whatever the scripts do around them.
pub(crate) struct Bare {
    /// A new event: its nonce added to a second's set, two records written with expiry, its
    /// entry appended to a stream.
    pub(crate) admit: f64,
    /// A re-delivery: its nonce added, its first record read.
    pub(crate) redelivery: f64,
    /// A transition of one record (a claim, a completion): read, then written with expiry.
    pub(crate) transition: f64,
}

pub(crate) fn bare_commands(
    con: &mut Connection,
    n: usize,
    now_ms: u64,
    payload: &[u8],
) -> anyhow::Result<Bare> {
    let record = |i: usize, which: usize| format!("{PARTITION}:floor:{which}:{i:032x}");
    let ttl = RETENTION_MS + oncegate_redis::TTL_SLACK_MS;
    let mut admits = Vec::with_capacity(4 * n);
    for i in 0..n {
        let mut nonce = redis::cmd("SADD");
        nonce
            .arg(nonce_set("floornt", now_ms, i))
            .arg(&(i as u128).to_be_bytes()[..]);
        admits.push(nonce);
        for which in 0..2 {
            let mut set = redis::cmd("SET");
            set.arg(record(i, which))
                .arg("p1800000000000,,,-")
                .arg("PX")
                .arg(ttl);
            admits.push(set);
        }
        let mut add = redis::cmd("XADD");
        add.arg(format!("{PARTITION}:floorq"))
            .arg(format!("0-{}", i + 1))
            .arg("k")
            .arg(key_hash(i, 0).to_string())
            .arg("o")
            .arg(i as u64 * 7919)
            .arg("e")
            .arg(payload);
        admits.push(add);
    }
    let admit = measure_quietly(con, admits)? / n as f64;
    let mut again = Vec::with_capacity(2 * n);
    for i in 0..n {
        let mut nonce = redis::cmd("SADD");
        nonce
            .arg(nonce_set("floornt", now_ms, n + i))
            .arg(&((n + i) as u128).to_be_bytes()[..]);
        again.push(nonce);
        again.push(redis::cmd("GET").arg(record(i, 0)).clone());
    }
    let redelivery = measure_quietly(con, again)? / n as f64;
    let mut transitions = Vec::with_capacity(2 * n);
    for i in 0..n {
        transitions.push(redis::cmd("GET").arg(record(i, 0)).clone());
        let mut set = redis::cmd("SET");
        set.arg(record(i, 0))
            .arg(format!(
                "r1800000000000,{},{},-",
                now_ms * 1000 + i as u64,
                now_ms + LEASE_MS
            ))
            .arg("PX")
            .arg(ttl);
        transitions.push(set);
    }
    let transition = measure_quietly(con, transitions)? / n as f64;
    for (label, figure) in [
        ("floor: a new event's commands, no script", admit),
        ("floor: a re-delivery's commands, no script", redelivery),
        ("floor: one transition's GET and SET, no script", transition),
    ] {
        println!("{label:<46} {figure:>12.2}");
    }
    let _: () = redis::cmd("DEL")
        .arg(format!("{PARTITION}:floorq"))
        .query(con)?;
    Ok(Bare {
        admit,
        redelivery,
        transition,
    })
}

/// Runs `calls` pipelined and returns Redis's CPU for them, in µs.
pub(crate) fn measure_quietly(con: &mut Connection, calls: Vec<Cmd>) -> anyhow::Result<f64> {
    let before = redis_cpu(con)?;
    pipelined(con, calls)?;
    Ok((redis_cpu(con)? - before) * 1e6)
}

/// Admits of new events and their re-deliveries by `ours` and `theirs` in interleaved rounds
/// (ABBA), each round's Redis CPU going to its side; prints each side's µs per event.
pub(crate) fn compare_admits(
    con: &mut Connection,
    ours: &str,
    theirs: &str,
    args: &Args,
) -> anyhow::Result<()> {
    let rounds = args.rounds.max(1);
    let per_round = (args.events / rounds).max(1);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let payload = vec![b'x'; args.payload];
    // [side][new, re-delivery]: Redis CPU seconds.
    let mut spent = [[0f64; 2]; 2];
    let mut next_event = 0;
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let sha = [ours, theirs][side];
            let events: Vec<usize> = (next_event..next_event + per_round).collect();
            next_event += per_round;
            // Nonces apart from the events', so that each re-delivery's is new.
            let fresh: Vec<Cmd> = events
                .iter()
                .map(|&i| admit_cmd(sha, i, i, now_ms, &payload))
                .collect();
            let again: Vec<Cmd> = events
                .iter()
                .map(|&i| admit_cmd(sha, i, usize::MAX / 2 + i, now_ms, &payload))
                .collect();
            for (step, calls) in [fresh, again].into_iter().enumerate() {
                let before = redis_cpu(con)?;
                let replies = pipelined(con, calls)?;
                spent[side][step] += redis_cpu(con)? - before;
                for reply in replies {
                    let Value::Array(parts) = &reply else {
                        bail!("admit answered {reply:?}");
                    };
                    let expected = if step == 0 { 1 } else { 0 };
                    if !matches!(parts.first(), Some(Value::Int(code)) if *code == expected) {
                        bail!("side {side}, step {step}: admit answered {reply:?}");
                    }
                }
            }
        }
    }
    let events = (per_round * rounds) as f64;
    println!(
        "admit scripts interleaved: {rounds} rounds of {per_round} events a side, {} B payloads",
        args.payload
    );
    println!(
        "{:<46} {:>12} {:>12}",
        "us of Redis CPU per event", "this build", "against"
    );
    for (step, label) in [
        "admit, a new event (2 keys and a nonce)",
        "admit, a re-delivery (a new nonce)",
    ]
    .into_iter()
    .enumerate()
    {
        println!(
            "{label:<46} {:>12.2} {:>12.2}",
            spent[0][step] * 1e6 / events,
            spent[1][step] * 1e6 / events
        );
    }
    Ok(())
}

/// Sends `calls` pipelined `DEPTH` deep; every reply.
pub(crate) fn pipelined(con: &mut Connection, calls: Vec<Cmd>) -> anyhow::Result<Vec<Value>> {
    let mut replies = Vec::with_capacity(calls.len());
    for round in calls.chunks(DEPTH) {
        let mut pipe = redis::pipe();
        for call in round {
            pipe.add_command(call.clone());
        }
        let answers: Vec<Value> = pipe.query(con).context("a call failed")?;
        replies.extend(answers);
    }
    Ok(replies)
}

/// The admit script's call for event `event` with nonce `nonce` (a new nonce re-delivers).
pub(crate) fn admit_cmd(sha: &str, event: usize, nonce: usize, now_ms: u64, payload: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(6)
        .arg(record_key(event, 0))
        .arg(record_key(event, 1))
        .arg(format!("{PARTITION}:q"))
        .arg(format!("{PARTITION}:qseq"))
        .arg(nonce_set("nt", now_ms, nonce))
        // Last: an earlier build's script, which counts nothing, runs on the same keys.
        .arg(format!("{PARTITION}:n"))
        .arg(now_ms)
        .arg(RETENTION_MS)
        .arg(2)
        .arg(key_hash(event, 0).to_string())
        .arg(event as u64 * 7919)
        .arg(payload)
        .arg(oncegate_redis::TTL_SLACK_MS)
        .arg(NONCE_WINDOW_MS)
        .arg(&(nonce as u128).to_be_bytes()[..]);
    cmd
}

/// The set nonce `nonce` goes to (`kind` "nt", as the store names it): the nonces of one
/// second's requests share a set, about a partition's share of 20 000 requests a second (16
/// partitions), 1 250 a set.
pub(crate) fn nonce_set(kind: &str, now_ms: u64, nonce: usize) -> String {
    format!(
        "{PARTITION}:{kind}:{}",
        now_ms / 1000 + nonce as u64 / NONCES_PER_SECOND
    )
}

/// The key hash of event `event`'s key `which` (0 its first, 1 its second).
pub(crate) fn key_hash(event: usize, which: usize) -> KeyHash {
    KeyHash(((event * 2 + which) as u128).to_be_bytes())
}

/// The Redis key of that record, named as the store names it.
pub(crate) fn record_key(event: usize, which: usize) -> String {
    format!("{PARTITION}:r:{}", key_hash(event, which))
}

/// Reads the records of the first, a middle and the last event (both keys) through the store
/// and fails unless `expect(event, which, record)` holds for each.
pub(crate) fn check_records(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    events: usize,
    what: &str,
    expect: &dyn Fn(usize, usize, &Record) -> bool,
) -> anyhow::Result<()> {
    for event in [0, events / 2, events - 1] {
        for which in [0, 1] {
            let record = runtime
                .block_on(store.record(&key_hash(event, which), 0))
                .with_context(|| format!("read event {event}'s record after {what}"))?;
            match record {
                Some(record) if expect(event, which, &record) => {}
                other => bail!(
                    "after {what}, the store reads event {event}'s key {which} as {other:?}: \
                     the arguments here no longer match the store's"
                ),
            }
        }
    }
    Ok(())
}

/// Redis's CPU seconds so far (user and system).
pub(crate) fn redis_cpu(con: &mut Connection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(con)?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys").then(|| value.parse::<f64>().ok())?
        })
        .sum())
}

pub(crate) fn measure(
    con: &mut Connection,
    label: &str,
    per_call: usize,
    calls: Vec<Cmd>,
) -> anyhow::Result<f64> {
    Ok(measure_replies(con, label, per_call, calls)?.0)
}

/// Runs `calls` pipelined, prints Redis's CPU per event (`per_call` events per call) and per
/// call, and returns the first with every reply.
pub(crate) fn measure_replies(
    con: &mut Connection,
    label: &str,
    per_call: usize,
    calls: Vec<Cmd>,
) -> anyhow::Result<(f64, Vec<Value>)> {
    let count = calls.len();
    let before = redis_cpu(con)?;
    let replies = pipelined(con, calls).with_context(|| label.to_owned())?;
    let spent = redis_cpu(con)? - before;
    let per_call_us = spent * 1e6 / count as f64;
    let per_event = per_call_us / per_call as f64;
    println!("{label:<46} {per_event:>12.2} {per_call_us:>12.2}");
    Ok((per_event, replies))
}
