//! The child process of the journal store's kill -9 test.
//!
//! `oncegate-crash-child <store> <first id> <count>` admits events `first..first+count` (each
//! with two keys), from 16 concurrent tasks, while a consumer claims, completes and acks them.
//! It prints `A id` after an admit returned Admitted, `D id` after Duplicate, and `K id` after
//! an ack returned true; odd ids are completed as the dispatcher does, by `complete_and_ack`
//! (which does not wait for the sync), printing `L id`; `B` ends each batch of deliveries (the
//! next batch's steps all start after it). Each line is flushed before the next step; it runs
//! until killed.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admission, Claim, DedupStore, Event, EventQueue, FenceCheck, key_for};
use oncegate_journal::JournalConfig;

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn event(id: u64) -> Event {
    Event {
        platform: Arc::from("feishu"),
        app: Arc::from("cli_crash"),
        tenant: None,
        event_id: format!("e{id}").into(),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: id,
        order_key: Some(format!("chat-{}", id % 13).into()),
        payload: Bytes::from(vec![b'x'; (id % 200) as usize]),
    }
}

/// Claims, completes and acks one delivery, printing `K id` once acked.
async fn handle(store: Arc<oncegate_journal::JournalStore>, delivery: oncegate_core::Delivery) {
    let lease = match store
        .claim(
            &delivery.key,
            delivery.id.partition,
            Duration::from_millis(300),
        )
        .await
    {
        // A killed run's lease that ran out is taken over.
        Ok(Claim::Acquired(lease) | Claim::TookOver(lease)) => lease,
        // Done before the crash: only the ack was lost.
        Ok(Claim::Done { .. }) => {
            if let Ok(true) = store.ack(delivery.id).await {
                say(format!("K {}", &delivery.event.event_id[1..]));
            }
            return;
        }
        // A killed run's lease: wait for it to run out.
        Ok(Claim::InFlight { until_ms }) => {
            let _ = store.retry(delivery.id, until_ms).await;
            return;
        }
        // No fingerprints here, so no conflict: both are a retry.
        Ok(Claim::Conflict) | Err(_) => {
            let _ = store.retry(delivery.id, 0).await;
            return;
        }
    };
    let id: u64 = delivery.event.event_id[1..].parse().unwrap_or(0);
    if id % 2 == 1 {
        if let Ok(FenceCheck::Accepted) = store
            .complete_and_ack(&lease, Duration::from_secs(86_400), None, delivery.id)
            .await
        {
            say(format!("L {id}"));
        }
        return;
    }
    if let Ok(FenceCheck::Accepted) = store
        .complete(&lease, Duration::from_secs(86_400), None)
        .await
        && let Ok(true) = store.ack(delivery.id).await
    {
        say(format!("K {}", &delivery.event.event_id[1..]));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(first), Some(count)) = (
        args.get(1),
        args.get(2).and_then(|a| a.parse::<u64>().ok()),
        args.get(3).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: oncegate-crash-child <store folder> <first id> <count>");
        std::process::exit(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start tokio: {error}");
            std::process::exit(1);
        }
    };
    // Snapshots often, as the test's reopen expects: kills land in them too.
    let mut config = JournalConfig::at(path);
    config.snapshot_after_bytes = 256 << 10;
    let store = match oncegate_journal::open(config) {
        Ok(store) => Arc::new(store),
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async move {
        let next = Arc::new(AtomicU64::new(first));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (store, next) = (store.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= first + count {
                        break;
                    }
                    let keys = [
                        key_for("feishu", "cli_crash", "event_id", &format!("e{id}")),
                        key_for("feishu", "cli_crash", "message_id", &format!("m{id}")),
                    ];
                    match store
                        .admit(event(id), &keys, Duration::from_secs(86_400))
                        .await
                    {
                        Ok(Admission::Admitted { .. }) => say(format!("A {id}")),
                        Ok(Admission::Duplicate { .. }) => say(format!("D {id}")),
                        Ok(Admission::Replayed) => eprintln!("admit {id}: no nonce was given"),
                        Err(error) => eprintln!("admit {id}: {error}"),
                    }
                }
            }));
        }
        let consumer = {
            let store = store.clone();
            tokio::spawn(async move {
                loop {
                    let mut idle = true;
                    for partition in 0..store.partitions() {
                        let Ok(batch) = store.pull(partition, 8).await else {
                            continue;
                        };
                        let mut handled = Vec::new();
                        for delivery in batch {
                            idle = false;
                            // Each event on its own task: their journal waits overlap.
                            handled.push(tokio::spawn(handle(store.clone(), delivery)));
                        }
                        let any = !handled.is_empty();
                        for task in handled {
                            let _ = task.await;
                        }
                        if any {
                            say("B".into());
                        }
                    }
                    if idle {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        };
        for task in tasks {
            let _ = task.await;
        }
        say("FINISHED".into());
        let _ = consumer.await;
    });
}
