//! `Once` around a side effect, on Redis: two instances of a service (here two stores in one
//! process, as two machines would open them) are asked to charge the same order, each several
//! times at once; the card is charged once and every caller gets the same receipt.
//!
//! ```text
//! ONCEGATE_REDIS_URL=redis://127.0.0.1:6379 cargo run -p oncegate-once --example redis_once
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncegate_core::{EventQueue, KeyHash};
use oncegate_once::{Once, OnceKey, Outcome};
use oncegate_redis::{RedisConfig, RedisStore};

/// Charges `order` through `once`: the payment provider is called only by the caller that
/// holds the order's key; everyone else gets its receipt.
async fn charge(
    once: &Once<RedisStore>,
    order: &str,
    charges: &AtomicU32,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let key = KeyHash::of(&["shop", "charge", order]);
    // A business key's record lives in its home partition: every instance finds it there.
    let key = OnceKey::new(key, key.home(once.store().partitions())).payload(order.as_bytes());
    let outcome = once
        .run(key, Duration::from_secs(10), |_lease| async {
            charges.fetch_add(1, Ordering::SeqCst); // the payment provider's call
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, std::io::Error>(Some(format!("receipt for {order}").into()))
        })
        .await?;
    match outcome {
        Outcome::Ran(Some(receipt)) | Outcome::Done(Some(receipt)) => {
            Ok(String::from_utf8_lossy(&receipt).into_owned())
        }
        other => Err(format!("not charged: {other:?}").into()),
    }
}

/// Runs the example against the Redis at `url`, under `prefix`; answers how many charges were
/// made for how many orders.
pub(crate) async fn run(
    url: &str,
    prefix: &str,
) -> Result<(u32, u32), Box<dyn std::error::Error + Send + Sync>> {
    let config = RedisConfig {
        prefix: prefix.to_owned(),
        ..RedisConfig::at(url)
    };
    // Two instances: two stores, two `Once`s, one Redis.
    let instances = [
        Once::new(Arc::new(RedisStore::connect_async(config.clone()).await?)),
        Once::new(Arc::new(RedisStore::connect_async(config).await?)),
    ];
    let charges = Arc::new(AtomicU32::new(0));
    let orders = 20;
    let mut calls = tokio::task::JoinSet::new();
    for order in 0..orders {
        for instance in &instances {
            for _ in 0..3 {
                let (once, charges) = (instance.clone(), charges.clone());
                calls.spawn(async move {
                    let order = format!("order-{order}");
                    let receipt = charge(&once, &order, &charges).await?;
                    assert_eq!(receipt, format!("receipt for {order}"));
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                });
            }
        }
    }
    while let Some(call) = calls.join_next().await {
        call??;
    }
    Ok((charges.load(Ordering::SeqCst), orders))
}

/// What the binary says for `url`: the line for stdout when the example ran, or the words for
/// stderr when it could not — what failed and how to point it at a Redis, not a `Debug` dump.
pub(crate) async fn report(url: &str, prefix: &str) -> Result<String, String> {
    match run(url, prefix).await {
        Ok((charges, orders)) => Ok(format!(
            "{orders} orders, each asked 6 times on 2 instances: {charges} charges"
        )),
        Err(error) => Err(format!(
            "redis_once: {error}\nThe example needs a Redis: start one (redis-server) or set \
             ONCEGATE_REDIS_URL to yours, e.g. ONCEGATE_REDIS_URL=redis://127.0.0.1:6379"
        )),
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let url = std::env::var("ONCEGATE_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    match report(&url, &format!("example{}", std::process::id())).await {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(words) => {
            eprintln!("{words}");
            std::process::ExitCode::FAILURE
        }
    }
}
