//! Redis: admits from many callers, and `redis-benchmark`'s ceiling beside them.

use super::*;

/// Admits per second through the Redis backend with `callers` concurrent callers.
pub(crate) fn redis_admits(url: &str, callers: usize, seconds: u64) -> anyhow::Result<f64> {
    let store = Arc::new(oncegate_redis::RedisStore::connect(
        oncegate_redis::RedisConfig {
            prefix: format!("bench{}", std::process::id()),
            // Benchmarks run on a throwaway Redis without persistence.
            durability: oncegate_redis::RedisDurability::Memory,
            ..oncegate_redis::RedisConfig::at(url)
        },
    )?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let requests: u64 = runtime.block_on(async {
        let mut tasks = Vec::new();
        for caller in 0..callers as u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let strings = Strings::new();
                let mut work = Workload::new(caller);
                let mut op = 0;
                while Instant::now() < deadline {
                    let event = strings.event(work.id(op));
                    op += 1;
                    let key = key_for(&strings.platform, &strings.app, "event_id", &event.event_id);
                    let _ = store.admit(event, &[key], DAY).await;
                }
                op
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap_or(0);
        }
        total
    });
    let rate = requests as f64 / start.elapsed().as_secs_f64();
    // What an operator's /admin/stats costs on this many records (counts kept as they change:
    // the same whatever the records held).
    let counting = Instant::now();
    let stats = runtime.block_on(store.stats())?;
    let took = counting.elapsed();
    println!(
        "redis stats over {} records: {:.1} ms",
        stats.pending + stats.processing + stats.completed,
        took.as_secs_f64() * 1e3,
    );
    Ok(rate)
}

/// redis-benchmark running the same admit script by EVAL with `callers` clients, pipelined 16
/// deep, on random keys: the ceiling of this Redis for our script.
pub(crate) fn redis_benchmark_ceiling(url: &str, callers: usize) -> anyhow::Result<f64> {
    let address = url.trim_start_matches("redis://");
    let (host, port) = address.split_once(':').unwrap_or((address, "6379"));
    let port = port.trim_end_matches(|c: char| !c.is_ascii_digit());
    let script = oncegate_redis::ADMIT_LUA;
    let output = std::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", port, "-c", &callers.to_string(), "-n", "300000", "-P", "16", "-r", "100000000", "-q"])
        .args(["EVAL", script, "4", "ceil:r:__rand_int__", "ceil:q:0", "ceil:qseq:0", "ceil:n:0", "1700000000000", "86400000", "1", "00", "1", "payload-of-about-one-hundred-bytes-payload-of-about-one-hundred-bytes-payload-of-about", "60000"])
        .output()
        .context("run redis-benchmark (Debian's redis-tools)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "EVAL ...: 123456.79 requests per second, p50=..."
    let rate = text
        .split("requests per second")
        .next()
        .and_then(|head| head.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("cannot read redis-benchmark's output: {text}"))?;
    Ok(rate)
}
