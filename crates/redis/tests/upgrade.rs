//! Records written as hashes by earlier versions are read, fenced and rewritten as strings;
//! a key that holds neither gets a clear refusal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use oncegate_contract::{block_on, event, key};
use oncegate_core::{
    Admission, Claim, DedupStore, FenceCheck, FencingToken, Fingerprint, KeyHash, Lease,
    RecordState, SystemClock,
};
use oncegate_redis::RedisStore;

use crate::common;
use common::plain;

const MINUTE: Duration = Duration::from_secs(60);

fn store(prefix: &str) -> RedisStore {
    RedisStore::connect_with_clock(common::config(prefix), SystemClock).expect("connect")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The record key of `key` in partition 0, as the store names it.
fn record_key(prefix: &str, key: &KeyHash) -> String {
    format!("{{{prefix}:0}}:r:{key}")
}

/// Writes a record the way versions before string records did: a hash of its fields.
fn old_record(redis: &mut redis::Connection, name: &str, fields: &[(&str, &[u8])]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(name);
    for (field, value) in fields {
        cmd.arg(*field).arg(*value);
    }
    let _: i64 = cmd.query(redis).expect("hset");
}

fn kind(redis: &mut redis::Connection, name: &str) -> String {
    redis::cmd("TYPE").arg(name).query(redis).expect("type")
}

fn prefix(test: &str) -> String {
    format!("up{test}{}", std::process::id())
}

#[test]
fn an_old_pending_record_is_claimed_and_completed_as_a_string() {
    let prefix = prefix("p");
    let store = store(&prefix);
    let mut redis = plain();
    let k = key("old-pending");
    let name = record_key(&prefix, &k);
    let expires = (now_ms() + 600_000).to_string();
    old_record(&mut redis, &name, &[("s", b"p"), ("e", expires.as_bytes())]);
    block_on(async {
        let record = store.record(&k, 0).await.expect("record").expect("live");
        assert_eq!(record.state, RecordState::Pending);
        assert_eq!(record.expires_at_ms.to_string(), expires);
        // Still seen: a platform retry of the event is a duplicate.
        let again = store
            .admit(event("old-pending", None), &[k], MINUTE)
            .await
            .expect("admit");
        assert_eq!(again, Admission::Duplicate { key_index: 0 });
        let Claim::Acquired(lease) = store.claim(&k, 0, MINUTE).await.expect("claim") else {
            panic!("an old pending record is claimable")
        };
        assert_eq!(kind(&mut redis, &name), "string", "the claim rewrote it");
        let outcome = Bytes::from_static(b"sent, id 7");
        let done = store
            .complete(&lease, MINUTE, Some(outcome.clone()))
            .await
            .expect("complete");
        assert_eq!(done, FenceCheck::Accepted);
        let claim = store.claim(&k, 0, MINUTE).await.expect("claim again");
        assert_eq!(
            claim,
            Claim::Done {
                outcome: Some(outcome)
            }
        );
        // Counted from the claim on, as this version wrote it: done once, and the pending
        // record nobody counted was not taken away from the count.
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.processing, stats.completed),
            (0, 0, 1)
        );
    });
}

/// A string record of a version before the counts (no leading 0 on its retention end) is not
/// uncounted when this version changes it: the count never held it.
#[test]
fn an_uncounted_string_record_leaves_the_counts_whole() {
    let prefix = prefix("s");
    let store = store(&prefix);
    let mut redis = plain();
    let (old, new) = (key("old-string"), key("new-string"));
    let expires = now_ms() + 600_000;
    let _: () = redis::cmd("SET")
        .arg(record_key(&prefix, &old))
        .arg(format!("p{expires},,,-"))
        .query(&mut redis)
        .expect("set");
    block_on(async {
        let admitted = store
            .admit(event("new-string", None), &[new], MINUTE)
            .await
            .expect("admit");
        assert!(
            matches!(admitted, Admission::Admitted { .. }),
            "{admitted:?}"
        );
        let Claim::Acquired(lease) = store.claim(&old, 0, MINUTE).await.expect("claim") else {
            panic!("the old record is claimable")
        };
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.processing, stats.completed),
            (1, 1, 0)
        );
        store
            .complete(&lease, MINUTE, None)
            .await
            .expect("complete");
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.processing, stats.completed),
            (1, 0, 1)
        );
    });
}

#[test]
fn an_old_lease_still_fences_its_holder() {
    let prefix = prefix("r");
    let store = store(&prefix);
    let mut redis = plain();
    let k = key("old-running");
    let name = record_key(&prefix, &k);
    let now = now_ms();
    let (expires, until) = ((now + 600_000).to_string(), now + 300_000);
    old_record(
        &mut redis,
        &name,
        &[
            ("s", b"r"),
            ("e", expires.as_bytes()),
            ("t", b"4242"),
            ("u", until.to_string().as_bytes()),
        ],
    );
    block_on(async {
        let claim = store.claim(&k, 0, MINUTE).await.expect("claim");
        assert_eq!(claim, Claim::InFlight { until_ms: until });
        let lease = |token| Lease {
            key: k,
            partition: 0,
            token: FencingToken(token),
            until_ms: until,
        };
        let stale = store.complete(&lease(4241), MINUTE, None).await;
        assert_eq!(stale.expect("complete"), FenceCheck::Rejected);
        assert_eq!(
            kind(&mut redis, &name),
            "hash",
            "a refused fence writes nothing"
        );
        let renewed = store.renew(&lease(4242), MINUTE).await.expect("renew");
        assert_eq!(renewed, FenceCheck::Accepted);
        let record = store.record(&k, 0).await.expect("record").expect("live");
        assert!(matches!(
            record.state,
            RecordState::Processing { token: FencingToken(4242), lease_until_ms } if lease_until_ms < until
        ));
        let released = store.release(&lease(4242)).await.expect("release");
        assert_eq!(released, FenceCheck::Accepted);
        let record = store.record(&k, 0).await.expect("record").expect("live");
        assert_eq!(record.state, RecordState::Pending);
        assert_eq!(record.expires_at_ms.to_string(), expires);
    });
}

#[test]
fn an_old_completed_record_keeps_its_outcome_and_fingerprint() {
    let prefix = prefix("c");
    let store = store(&prefix);
    let mut redis = plain();
    let k = key("old-done");
    let name = record_key(&prefix, &k);
    let expires = (now_ms() + 600_000).to_string();
    let mine = Fingerprint::of(b"the payload");
    old_record(
        &mut redis,
        &name,
        &[
            ("s", b"c"),
            ("e", expires.as_bytes()),
            ("o", b"with, commas, and \xff bytes"),
            ("f", &mine.0),
        ],
    );
    block_on(async {
        let other = store
            .claim_with_fingerprint(&k, 0, MINUTE, Some(Fingerprint::of(b"another payload")))
            .await
            .expect("claim");
        assert_eq!(other, Claim::Conflict);
        let same = store
            .claim_with_fingerprint(&k, 0, MINUTE, Some(mine))
            .await
            .expect("claim");
        assert_eq!(
            same,
            Claim::Done {
                outcome: Some(Bytes::from_static(b"with, commas, and \xff bytes"))
            }
        );
        // The counts hold what this version wrote (`lua/counts.lua`): the earlier version's
        // record, which nothing rewrote, is not in them, and answering it took nothing away.
        store
            .admit(event("new-one", None), &[key("new-one")], MINUTE)
            .await
            .expect("admit");
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.completed), (1, 0));
    });
}

#[test]
fn a_record_in_no_known_layout_is_refused_by_name() {
    let prefix = prefix("x");
    let store = store(&prefix);
    let mut redis = plain();
    let k = key("garbage");
    let name = record_key(&prefix, &k);
    let _: () = redis::cmd("SET")
        .arg(&name)
        .arg("not a record")
        .query(&mut redis)
        .expect("set");
    block_on(async {
        let error = store.claim(&k, 0, MINUTE).await.expect_err("refused");
        assert!(
            matches!(&error, oncegate_core::StoreError::Corrupt(why) if why.contains(&name)),
            "corrupt, naming the key: {error:?}"
        );
        let error = store.record(&k, 0).await.expect_err("refused");
        assert!(error.to_string().contains("neither a record"), "{error}");
        // Not an outage: however often it is met, the circuit breaker stays closed for others.
        for _ in 0..8 {
            let _ = store.claim(&k, 0, MINUTE).await;
        }
        let other = store
            .admit(event("fine", None), &[key("fine")], MINUTE)
            .await
            .expect("other keys are served");
        assert!(matches!(other, Admission::Admitted { .. }), "{other:?}");
    });
}
