//! What each script on an event's way costs Redis, measured alone: a fresh event's admit, a
//! re-delivery's admit, the claims and the completions in the store's batches, the hand-out's
//! group read; beside floors in the same run (a script that only returns, called with the
//! admit's arguments, a bare `SET … PX` of a new key, and the event's own commands sent bare,
//! with no script and no check: the least its keys cost, whatever the scripts do). Redis's CPU (INFO cpu) before and after
//! each step, divided by the events: a cost per event, so no load generator needs to saturate
//! anything. Calls are pipelined 64 deep over one connection, as the store's multiplexed
//! connection does under load. The calls restate the store's arguments; the store's own
//! record reading checks them after each step (state, retention end, token and lease end), so a
//! change of the store's arguments that this copy missed fails the run instead of measuring
//! something else. With `--admit-against FILE` it compares this build's admit script with
//! another revision's instead, in interleaved rounds on the one Redis: on a VM whose speed
//! drifts, two runs on fresh servers differ by more than most changes do.

mod calls;

use anyhow::{Context, bail};
use calls::*;
use clap::Parser;
use oncegate_core::{DedupStore, FencingToken, KeyHash, Record, RecordState};
use oncegate_redis::{RedisConfig, RedisStore};
use redis::{Cmd, Connection, Value};

/// Arguments.
#[derive(Parser)]
#[command(about = "Redis CPU per event of each oncegate script, measured alone")]
struct Args {
    /// An empty Redis (the run writes several keys per event): scripts/redis-scripts starts one.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    url: String,
    /// Events admitted, claimed and completed.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Claims (and completions) per script call, as the store's gathers batch them.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Bytes of each event as the stream stores it.
    #[arg(long, default_value_t = 500)]
    payload: usize,
    /// Instead of the steps: this build's admit script against the admit script in FILE
    /// (record.lua and admit.lua of another revision, concatenated; same arguments and
    /// replies), interleaved in rounds on the one Redis so that a machine's drift falls on both.
    #[arg(long, value_name = "FILE")]
    admit_against: Option<std::path::PathBuf>,
    /// Rounds of the interleaved comparison (each side admits `events / rounds` new events and
    /// re-delivers them per round).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

/// Calls in flight per pipeline round.
const DEPTH: usize = 64;
/// The store's prefix for these keys, and partition 0's hash tag with it.
const PREFIX: &str = "ogscripts";
const PARTITION: &str = "{ogscripts:0}";
const GROUP: &str = "oncegate";
const RETENTION_MS: u64 = 86_400_000;
const NONCE_WINDOW_MS: u64 = 600_000;
/// Requests of one partition signed in one second.
const NONCES_PER_SECOND: u64 = 1_250;
const LEASE_MS: u64 = 30_000;
/// The gateway these scripts run as, owning the partition under this epoch.
const OWNER: &str = "bench";
const EPOCH: u64 = 1;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.events == 0 || args.batch == 0 {
        bail!("--events and --batch must be at least 1");
    }
    let mut con = redis::Client::open(args.url.as_str())?
        .get_connection()
        .with_context(|| format!("connect to {}", args.url))?;
    let keys: u64 = redis::cmd("DBSIZE").query(&mut con)?;
    if keys != 0 {
        bail!(
            "{} holds {keys} keys: this run needs an empty Redis (scripts/redis-scripts starts one)",
            args.url
        );
    }
    let load = |con: &mut Connection, source: &str| -> anyhow::Result<String> {
        Ok(redis::cmd("SCRIPT").arg("LOAD").arg(source).query(con)?)
    };
    let admit = load(&mut con, oncegate_redis::ADMIT_LUA)?;
    let claim = load(&mut con, oncegate_redis::CLAIM_LUA)?;
    let complete = load(&mut con, oncegate_redis::COMPLETE_ACK_LUA)?;
    let floor = load(&mut con, "return 1")?;
    if let Some(path) = &args.admit_against {
        let source = std::fs::read_to_string(path).with_context(|| {
            format!("read the admit script to compare with, {}", path.display())
        })?;
        let against = load(&mut con, &source)?;
        return compare_admits(&mut con, &admit, &against, &args);
    }
    let store = RedisStore::connect(RedisConfig {
        prefix: PREFIX.into(),
        // Benchmarks run on a throwaway Redis without persistence.
        durability: oncegate_redis::RedisDurability::Memory,
        ..RedisConfig::at(&args.url)
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // The partition's owner, as a gateway's heartbeat leaves it: the complete-and-ack script
    // acks only for the owner under its epoch.
    let _: Value = redis::cmd("SET")
        .arg(format!("{PARTITION}:own"))
        .arg(format!("4000000000000,{EPOCH},{OWNER}"))
        .query(&mut con)?;
    let _: Value = redis::cmd("XGROUP")
        .arg(&["CREATE", &format!("{PARTITION}:q"), GROUP, "0", "MKSTREAM"][..])
        .query(&mut con)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let payload = vec![b'x'; args.payload];
    let n = args.events;
    println!(
        "oncegate-redis-scripts: {n} events, {} claims or completions per call, {} B payloads",
        args.batch, args.payload
    );
    println!("{:<46} {:>12} {:>12}", "step", "us/event", "us/call");

    let floor_calls: Vec<Cmd> = (0..n)
        .map(|i| admit_cmd(&floor, i, i, now_ms, &payload))
        .collect();
    let floor_cost = measure(
        &mut con,
        "floor: a script that returns, admit's args",
        1,
        floor_calls,
    )?;
    let set_calls: Vec<Cmd> = (0..n)
        .map(|i| {
            let mut cmd = redis::cmd("SET");
            cmd.arg(format!("{PARTITION}:floor:{i:032x}"))
                .arg("p1800000000000,,,-")
                .arg("PX")
                .arg(RETENTION_MS + oncegate_redis::TTL_SLACK_MS);
            cmd
        })
        .collect();
    measure(&mut con, "floor: SET ... PX of a new key", 1, set_calls)?;
    let bare = bare_commands(&mut con, n, now_ms, &payload)?;

    let admits: Vec<Cmd> = (0..n)
        .map(|i| admit_cmd(&admit, i, i, now_ms, &payload))
        .collect();
    let (fresh, replies) = measure_replies(
        &mut con,
        "admit, a new event (2 keys and a nonce)",
        1,
        admits,
    )?;
    let seqs: Vec<u64> = replies
        .iter()
        .map(|reply| match reply {
            Value::Array(parts) if matches!(parts.first(), Some(Value::Int(1))) => {
                match parts.get(1) {
                    Some(Value::Int(seq)) => Ok(*seq as u64),
                    other => bail!("admit answered {other:?} for a sequence number"),
                }
            }
            other => bail!("admit did not admit a new event: {other:?}"),
        })
        .collect::<anyhow::Result<_>>()?;
    let check = |what: &str, expect: &dyn Fn(usize, usize, &Record) -> bool| {
        check_records(&runtime, &store, n, what, expect)
    };
    check("admit", &|_, _, record| {
        record.state == RecordState::Pending && record.expires_at_ms == now_ms + RETENTION_MS
    })?;
    let redeliveries: Vec<Cmd> = (0..n)
        .map(|i| admit_cmd(&admit, i, n + i, now_ms, &payload))
        .collect();
    let (again, replies) = measure_replies(
        &mut con,
        "admit, a re-delivery (a new nonce)",
        1,
        redeliveries,
    )?;
    // A duplicate of its first key: the path measured is the re-delivery's, not a replay's.
    for reply in &replies {
        match reply {
            Value::Array(parts) if matches!(parts.as_slice(), [Value::Int(0), Value::Int(0)]) => {}
            other => bail!("a re-delivery was not answered as a duplicate: {other:?}"),
        }
    }

    let reads: Vec<Cmd> = (0..n.div_ceil(args.batch))
        .map(|_| {
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg(&["GROUP", GROUP, "bench", "COUNT"][..])
                .arg(args.batch)
                .arg("STREAMS")
                .arg(format!("{PARTITION}:q"))
                .arg(">");
            cmd
        })
        .collect();
    let read = measure(
        &mut con,
        "hand-out: XREADGROUP of a batch",
        args.batch,
        reads,
    )?;

    let batches: Vec<Vec<usize>> = (0..n)
        .collect::<Vec<_>>()
        .chunks(args.batch)
        .map(<[usize]>::to_vec)
        .collect();
    let claims: Vec<Cmd> = batches
        .iter()
        .map(|batch| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&claim)
                .arg(batch.len() + 2)
                .arg(format!("{PARTITION}:token"))
                .arg(format!("{PARTITION}:n"));
            for &i in batch {
                cmd.arg(record_key(i, 0));
            }
            cmd.arg(now_ms).arg(oncegate_redis::TTL_SLACK_MS);
            for _ in batch {
                cmd.arg(LEASE_MS).arg("");
            }
            cmd
        })
        .collect();
    let (claimed, replies) = measure_replies(&mut con, "claim, in batches", args.batch, claims)?;
    let mut tokens = Vec::with_capacity(n);
    for reply in replies {
        match reply {
            Value::Array(grants) => {
                for grant in grants {
                    match grant {
                        Value::Int(token) if token > 0 => tokens.push(token),
                        other => bail!("a claim of a new event was not granted: {other:?}"),
                    }
                }
            }
            other => bail!("claim answered {other:?}"),
        }
    }
    check("claim", &|event, which, record| match which {
        0 => {
            record.state
                == RecordState::Processing {
                    token: FencingToken(tokens[event].unsigned_abs()),
                    lease_until_ms: now_ms + LEASE_MS,
                }
                && record.expires_at_ms == now_ms + RETENTION_MS
        }
        _ => record.state == RecordState::Pending,
    })?;
    let completes: Vec<Cmd> = batches
        .iter()
        .map(|batch| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&complete)
                .arg(batch.len() + 3)
                .arg(format!("{PARTITION}:q"))
                .arg(format!("{PARTITION}:qa"))
                .arg(format!("{PARTITION}:own"));
            for &i in batch {
                cmd.arg(record_key(i, 0));
            }
            cmd.arg(now_ms)
                .arg(oncegate_redis::TTL_SLACK_MS)
                .arg(GROUP)
                .arg(OWNER)
                .arg(EPOCH);
            for &i in batch {
                // Claimed, not lean: the records carry the claims' tokens.
                cmd.arg(tokens[i])
                    .arg(RETENTION_MS)
                    .arg(seqs[i])
                    .arg("-")
                    .arg("0");
            }
            cmd
        })
        .collect();
    let (completed, replies) = measure_replies(
        &mut con,
        "complete and ack, in batches",
        args.batch,
        completes,
    )?;
    let applied = replies
        .iter()
        .flat_map(|reply| match reply {
            Value::Array(each) => each.clone(),
            other => vec![other.clone()],
        })
        // 0 for a record not completed; else 1, or what the replaced record was (its minute
        // and state, for the gateway's counts).
        .filter(|each| matches!(each, Value::Int(code) if *code >= 1))
        .count();
    if applied != n {
        bail!("{applied} of {n} completions were applied");
    }
    check("complete", &|_, which, record| match which {
        0 => {
            matches!(record.state, RecordState::Completed { .. })
                && record.expires_at_ms == now_ms + RETENTION_MS
        }
        _ => record.state == RecordState::Pending,
    })?;
    let left: u64 = redis::cmd("XLEN")
        .arg(format!("{PARTITION}:q"))
        .query(&mut con)?;
    if left != 0 {
        bail!("{left} entries are still in the stream after every ack");
    }
    let total = fresh + 0.3 * again + read + claimed + completed;
    println!(
        "{:<46} {total:>12.2}   ({:.1} x the floor script)",
        "per delivered event, 30 % re-deliveries",
        total / floor_cost
    );
    // The same event's way with every script's logic gone: what the keys alone cost.
    let floor_total = bare.admit + 0.3 * bare.redelivery + read + 2.0 * bare.transition;
    println!(
        "{:<46} {floor_total:>12.2}   (the commands alone, no script: admit, 30 % re-deliveries, hand-out, two transitions)",
        "  floor: per delivered event"
    );
    Ok(())
}
