//! The Kafka sink against librdkafka's mock cluster (a real Kafka protocol peer, in this
//! process, on loopback): each event produced keyed by its chat with its idempotency key and
//! type as headers, counted delivered only once the brokers acknowledged it; a gateway killed
//! between the brokers' ack and its completion produces the event once more, with the same key,
//! and no event is lost or out of its chat's order. `cargo test -p oncegate --features kafka
//! --test kafka` (scripts/test runs it). A test binary of its own, run alone: its kill must fall
//! between the brokers' ack and the completion, a window that tests running beside it in one
//! process moved once (the acked events' completions reached the stopped Redis first).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::mocking::MockCluster;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

mod e2e;
mod support;
use e2e::*;
use support::refused_start;

const TOPIC: &str = "chat-events";
const PARTITIONS: i32 = 4;
const BROKERS: i32 = 3;

/// One record read back from the topic.
#[derive(Debug, Clone)]
struct Record {
    partition: i32,
    key: String,
    idempotency_key: String,
    event_type: String,
    event_id: String,
    /// The `oncegate-tenant` header.
    tenant: String,
    topic: String,
}

/// Reads every partition of the topic from its beginning, on a thread of its own, until
/// dropped.
struct Reader {
    records: Arc<Mutex<Vec<Record>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(brokers: &str) -> Self {
        Self::start_on(brokers, &[TOPIC])
    }

    /// Reads every partition of each of `topics`.
    fn start_on(brokers: &str, topics: &[&str]) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "oncegate-test")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut partitions = TopicPartitionList::new();
        for topic in topics {
            for partition in 0..PARTITIONS {
                partitions
                    .add_partition_offset(topic, partition, Offset::Beginning)
                    .expect("partition");
            }
        }
        consumer.assign(&partitions).expect("assign");
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (records, stop) = (records.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let header = |name: &str| {
                        message
                            .headers()
                            .and_then(|headers| {
                                headers.iter().find(|h| h.key == name).and_then(|h| h.value)
                            })
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default()
                    };
                    let body: serde_json::Value =
                        serde_json::from_slice(message.payload().unwrap_or_default())
                            .expect("the record is the JSON envelope");
                    let record = Record {
                        partition: message.partition(),
                        key: String::from_utf8_lossy(message.key().unwrap_or_default())
                            .into_owned(),
                        idempotency_key: header("idempotency-key"),
                        event_type: header("event-type"),
                        tenant: header("oncegate-tenant"),
                        topic: message.topic().to_owned(),
                        event_id: body["event_id"].as_str().unwrap_or_default().to_owned(),
                    };
                    records.lock().expect("records").push(record);
                }
            })
        };
        Self {
            records,
            stop,
            thread: Some(thread),
        }
    }

    fn records(&self) -> Vec<Record> {
        self.records.lock().expect("records").clone()
    }

    async fn wait_for(&self, what: &str, done: impl Fn(&[Record]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(45);
        while !done(&self.records()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {} records",
                self.records().len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A gateway on `redis` whose every event goes to the topic on `brokers`.
fn start_gateway(dir: &std::path::Path, brokers: &str, redis: &OwnRedis) -> Gateway {
    start_gateway_to(dir, brokers, redis, TOPIC)
}

/// A gateway on `redis` whose every event goes to `topic` on `brokers`.
fn start_gateway_to(
    dir: &std::path::Path,
    brokers: &str,
    redis: &OwnRedis,
    topic: &str,
) -> Gateway {
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nprefix = \"kafka\"\npartitions = 4",
        redis.url()
    );
    // The helper's config, its HTTP route for events swapped for the Kafka one.
    let unused: std::net::SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let config = write_config(dir, unused, false, &store, "2s", "500ms");
    let text = std::fs::read_to_string(&config).expect("config");
    let (head, _) = text
        .rsplit_once("[[route]]")
        .expect("the events route is the last");
    let text = format!(
        "{head}[[route]]\nevents = [\"*\"]\nsink = \"kafka\"\nbrokers = \"{brokers}\"\n\
         topic = \"{topic}\"\ntimeout = \"10s\"\n"
    );
    std::fs::write(&config, text).expect("config");
    Gateway::run(&config)
}

/// Posts `ids` (event id, chat) in order, each admitted.
async fn post_all(gateway: &Gateway, events: &[(String, String)], first_ms: u64) {
    let client = client();
    for (i, (id, chat)) in events.iter().enumerate() {
        let created = first_ms + u64::try_from(i).expect("small");
        let (status, body) = post(&client, &gateway.url, &sign(&message(id, chat, created)))
            .await
            .expect("post");
        assert_eq!(status, 200, "{id}: {body}");
    }
}

/// Each chat's events in the topic, by first appearance, are the posted order; every copy of
/// an event is keyed by its chat, on one partition, with one idempotency key.
fn assert_in_chat_order(records: &[Record], posted: &[(String, String)]) {
    let mut keys: HashMap<&str, (&str, i32)> = HashMap::new();
    for record in records {
        let (key, partition) = keys
            .entry(&record.event_id)
            .or_insert((&record.idempotency_key, record.partition));
        assert_eq!(
            (&record.idempotency_key[..], record.partition),
            (*key, *partition),
            "every copy of {} has one idempotency key and partition",
            record.event_id
        );
        assert_eq!(record.event_type, "im.message.receive_v1");
        assert_eq!(
            record.tenant, "t",
            "the event's tenant_key, as routes match it"
        );
        assert!(!record.idempotency_key.is_empty());
    }
    let mut chats: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, chat) in posted {
        chats.entry(chat).or_default().push(id);
    }
    for (chat, expected) in chats {
        let mut seen: Vec<&str> = Vec::new();
        for record in records.iter().filter(|r| r.key == chat) {
            if !seen.contains(&&*record.event_id) {
                seen.push(&record.event_id);
            }
        }
        assert_eq!(
            seen, expected,
            "chat {chat}: first appearances in posted order"
        );
    }
}

fn batch(prefix: &str, chats: usize, per_chat: usize) -> Vec<(String, String)> {
    (0..per_chat)
        .flat_map(|n| {
            (0..chats).map(move |c| (format!("{prefix}-{c}-{n}"), format!("oc_{prefix}_{c}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_topic_once_in_chat_order_and_a_kill_after_the_ack_only_repeats() {
    let cluster = MockCluster::new(BROKERS).expect("mock cluster");
    cluster
        .create_topic(TOPIC, PARTITIONS, BROKERS)
        .expect("topic");
    let brokers = cluster.bootstrap_servers();
    let reader = Reader::start(&brokers);
    let redis = OwnRedis::start();
    let dir = tempfile::tempdir().expect("dir");
    let gateway = start_gateway(dir.path(), &brokers, &redis);

    // Produced once each, keyed by chat, in chat order.
    let first = batch("a", 6, 5);
    post_all(&gateway, &first, 1_000).await;
    reader
        .wait_for("the first batch", |records| records.len() >= first.len())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = reader.records();
    assert_eq!(records.len(), first.len(), "each event once: {records:?}");
    assert_in_chat_order(&records, &first);
    let chats_per_partition: HashMap<i32, usize> =
        records.iter().fold(HashMap::new(), |mut count, r| {
            *count.entry(r.partition).or_default() += 1;
            count
        });
    assert!(
        chats_per_partition.len() > 1,
        "chats spread over partitions: {chats_per_partition:?}"
    );

    // The brokers answer slowly; while the first event of each chat is on its way, the store
    // stops answering: the brokers ack, the gateway cannot complete, and is killed there.
    for broker in 1..=BROKERS {
        cluster
            .broker_round_trip_time(broker, Duration::from_millis(1_500))
            .expect("rtt");
    }
    let second = batch("b", 4, 3);
    post_all(&gateway, &second, 10_000).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.pause(true);
    reader
        .wait_for("the acknowledged heads of the second batch", |records| {
            records
                .iter()
                .filter(|r| r.event_id.starts_with("b-"))
                .count()
                >= 4
        })
        .await;
    // The gateway's completion is stuck behind the paused store: the acked events are not
    // recorded as delivered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.kill9();
    redis.pause(false);
    for broker in 1..=BROKERS {
        cluster
            .broker_round_trip_time(broker, Duration::ZERO)
            .expect("rtt");
    }
    let acked_before_the_kill: Vec<String> = reader
        .records()
        .iter()
        .filter(|r| r.event_id.starts_with("b-"))
        .map(|r| r.event_id.clone())
        .collect();
    let gateway = start_gateway(dir.path(), &brokers, &redis);
    reader
        .wait_for(
            "every event of the second batch after the restart",
            |records| {
                second
                    .iter()
                    .all(|(id, _)| records.iter().any(|r| &r.event_id == id))
            },
        )
        .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let records = reader.records();
    let all: Vec<(String, String)> = first.iter().chain(&second).cloned().collect();
    assert_in_chat_order(&records, &all);
    let count = |id: &str| records.iter().filter(|r| r.event_id == id).count();
    // Every copy of an event carries one idempotency key (checked above); an event the brokers
    // acknowledged before the kill, and whose completion the paused store held up, is
    // produced once more after the restart — one more copy, no more; any other event once.
    let twice: Vec<&String> = acked_before_the_kill
        .iter()
        .filter(|id| count(id) == 2)
        .collect();
    assert!(
        !twice.is_empty(),
        "the kill fell between an ack and its completion: {acked_before_the_kill:?}"
    );
    for (id, _) in &all {
        let most = if acked_before_the_kill.contains(id) {
            2
        } else {
            1
        };
        assert!(
            (1..=most).contains(&count(id)),
            "{id}: {} copies",
            count(id)
        );
    }

    // Brokers down: nothing counts as delivered until they are back and acknowledge.
    for broker in 1..=BROKERS {
        cluster.broker_down(broker).expect("down");
    }
    let third = batch("c", 2, 2);
    post_all(&gateway, &third, 20_000).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stats = gateway.stats().await;
    for broker in 1..=BROKERS {
        cluster.broker_up(broker).expect("up");
    }
    assert!(
        !reader
            .records()
            .iter()
            .any(|r| r.event_id.starts_with("c-")),
        "nothing produced while the brokers were down"
    );
    // This run delivered what it produced of the second batch, and none of the third.
    let produced_after_the_kill = reader
        .records()
        .iter()
        .filter(|r| r.event_id.starts_with("b-"))
        .count()
        - acked_before_the_kill.len();
    assert_eq!(
        stats["gateway"]["delivered"].as_u64(),
        Some(u64::try_from(produced_after_the_kill).expect("small")),
        "{stats}"
    );
    // The topic as a new reader finds it (the first one's fetches do not recover from every
    // broker going down in the mock cluster).
    let before = reader.records().len();
    drop(reader);
    let reader = Reader::start(&brokers);
    reader
        .wait_for("the whole topic, the third batch in it", |records| {
            records.len() >= before + third.len()
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = reader.records();
    let all: Vec<(String, String)> = all.iter().chain(&third).cloned().collect();
    assert_in_chat_order(&records, &all);
    for (id, _) in &third {
        assert_eq!(
            records.iter().filter(|r| &r.event_id == id).count(),
            1,
            "{id}"
        );
    }
    drop(gateway);
}

/// A topic naming `{tenant}`: each tenant's events in a topic of their own (an id Kafka would
/// refuse in a name written out, not passed on), none in another's, each event once, with its
/// tenant's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_naming_the_tenant_takes_that_tenants_events_only() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    // "tenant.b": the `.` is written out, so no id makes `..` or a name Kafka refuses.
    let topics = [("t", "chat.t"), ("tenant.b", "chat.tenant_2Eb")];
    for (_, topic) in topics {
        cluster.create_topic(topic, PARTITIONS, 1).expect("topic");
    }
    let brokers = cluster.bootstrap_servers();
    let reader = Reader::start_on(&brokers, &topics.map(|(_, topic)| topic));
    let redis = OwnRedis::start();
    let dir = tempfile::tempdir().expect("dir");
    let gateway = start_gateway_to(dir.path(), &brokers, &redis, "chat.{tenant}");
    let client = client();
    let mut posted = Vec::new();
    for n in 0..6 {
        let (tenant, _) = topics[n % 2];
        let id = format!("tenanted-{n}");
        let body = message(&id, &format!("oc_{n}"), 1_000 + n as u64).replace(
            "\"tenant_key\":\"t\"",
            &format!("\"tenant_key\":\"{tenant}\""),
        );
        assert!(body.contains(tenant), "{body}");
        let (status, answer) = post(&client, &gateway.url, &sign(&body))
            .await
            .expect("post");
        assert_eq!(status, 200, "{id}: {answer}");
        posted.push((id, tenant));
    }
    reader
        .wait_for("every event", |records| records.len() >= posted.len())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = reader.records();
    assert_eq!(records.len(), posted.len(), "each event once: {records:?}");
    for (id, tenant) in &posted {
        let record = records
            .iter()
            .find(|r| &r.event_id == id)
            .unwrap_or_else(|| panic!("{id} produced: {records:?}"));
        let topic = topics
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, topic)| *topic);
        assert_eq!(
            (Some(&*record.topic), &*record.tenant),
            (topic, *tenant),
            "{id} in its tenant's topic"
        );
    }
    drop(gateway);
}

/// The README's Kafka route passes `check-config`, every setting it shows read by the gateway.
/// It speaks TLS and SCRAM (`kafka-tls`); a build with `kafka` alone checks it with SASL/PLAIN
/// in clear instead, and refuses it as written — `check-config` as `serve` does, naming the
/// feature (before, check-config passed it and only serve refused).
#[test]
fn the_readme_kafka_route_is_valid() {
    let env = [("KAFKA_PASSWORD", "s3cret")];
    #[cfg(feature = "kafka-tls")]
    let route = readme_block("**Kafka** (", &env);
    #[cfg(not(feature = "kafka-tls"))]
    let route = readme_block_as("**Kafka** (", &env, |block| {
        block
            .replace("\"SASL_SSL\"", "\"SASL_PLAINTEXT\"")
            .replace("\"SCRAM-SHA-512\"", "\"PLAIN\"")
    });
    assert!(route.contains("sink = \"kafka\""), "{route}");
    #[cfg(not(feature = "kafka-tls"))]
    {
        let dir = tempfile::tempdir().expect("dir");
        let store = format!("path = \"{}\"", dir.path().join("store").display());
        let unused: std::net::SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let config = write_config(dir.path(), unused, false, &store, "30s", "5s");
        let base = std::fs::read_to_string(&config).expect("config");
        let check = |route: &str| {
            std::fs::write(&config, format!("{base}{route}")).expect("config");
            let checked = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
                .arg("check-config")
                .arg(&config)
                .envs(env)
                .output()
                .expect("check-config");
            let said = String::from_utf8_lossy(&checked.stdout).into_owned();
            assert!(!checked.status.success(), "{said}");
            assert!(
                said.contains(
                    "error: route[2].kafka: TLS to the brokers and SASL/SCRAM need the \
                     `kafka-tls` feature"
                ),
                "{said}"
            );
        };
        // SCRAM in clear is built with TLS only, too.
        check(&route.replace("\"SASL_SSL\"", "\"SASL_PLAINTEXT\""));
        check(&route);
        let refused = refused_start(&config, &env);
        assert!(refused.to_lowercase().contains("ssl"), "{refused}");
    }
}
