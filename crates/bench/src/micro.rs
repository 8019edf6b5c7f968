//! Admits and claims in process: oncegate's stores against the seed design's, per thread.

use super::*;

/// The event ids of one thread: every other operation is a new id, the rest repeat an earlier
/// id of the same thread picked at random, so half the keys are duplicates.
pub(crate) struct Workload {
    pub(crate) state: u64,
    pub(crate) base: u64,
}

impl Workload {
    pub(crate) fn new(thread: u64) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15 ^ (thread + 1),
            base: thread << 40,
        }
    }
    pub(crate) fn id(&mut self, op: u64) -> u64 {
        if op.is_multiple_of(2) {
            return self.base + op / 2;
        }
        // xorshift64
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.base + self.state % (op / 2 + 1)
    }
}

pub(crate) struct Strings {
    pub(crate) platform: Arc<str>,
    pub(crate) app: Arc<str>,
    pub(crate) kind: Arc<str>,
}

impl Strings {
    /// Per thread, as a decoder interns them per connection.
    pub(crate) fn new() -> Self {
        Self {
            platform: Arc::from("feishu"),
            app: Arc::from("cli_bench"),
            kind: Arc::from("im.message.receive_v1"),
        }
    }
    pub(crate) fn event(&self, id: u64) -> Event {
        Event {
            platform: self.platform.clone(),
            app: self.app.clone(),
            tenant: None,
            event_id: format!("ev_{id:016x}").into(),
            event_type: self.kind.clone(),
            created_at_ms: id,
            order_key: Some(format!("oc_{:08x}", id % 4096).into()),
            payload: Bytes::from_static(b"{\"text\":\"hello\"}"),
        }
    }
}

pub(crate) fn run_threads(f: impl Fn(u64) -> u64 + Sync) -> (u64, Duration) {
    let start = Instant::now();
    let done: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let f = &f;
                scope.spawn(move || f(thread))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    (done, start.elapsed())
}

/// Runs the seed's cleanup timer while `f` runs (every second: the seed's 5 minutes, scaled to
/// a benchmark's length so that it runs at all).
pub(crate) fn with_seed_cleanup<T>(seed: &SeedDeduplicator, f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                seed.cleanup(SystemClock.now_ms(), DAY.as_millis() as u64);
            }
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

/// The events each thread will admit, made before the clock starts so that both sides are
/// timed on the store alone.
pub(crate) fn workload_events(ops: u64) -> Vec<Vec<Event>> {
    (0..THREADS)
        .map(|thread| {
            let strings = Strings::new();
            let mut work = Workload::new(thread);
            (0..ops).map(|op| strings.event(work.id(op))).collect()
        })
        .collect()
}

/// Each thread's events, made before the clock starts; a thread takes its own once.
pub(crate) struct PerThread(std::sync::Mutex<Vec<Vec<Event>>>);

impl PerThread {
    pub(crate) fn new(ops: u64) -> Self {
        Self(std::sync::Mutex::new(workload_events(ops)))
    }

    pub(crate) fn take(&self, thread: u64) -> Vec<Event> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.get_mut(thread as usize)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

pub(crate) fn admit_ours(ops: u64) -> f64 {
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    admit_rate(ops, |event, key| {
        matches!(
            ready(store.admit(event, &[key], DAY)),
            Ok(Admission::Admitted { .. })
        )
    })
}

/// Admits per second when each thread hands its events to `admit` (true: admitted), which
/// must admit exactly the half that are new.
pub(crate) fn admit_rate(ops: u64, admit: impl Fn(Event, KeyHash) -> bool + Sync) -> f64 {
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (admitted, elapsed) = run_threads(|thread| {
        let mine = take(thread);
        let mut admitted = 0;
        for event in mine {
            let key = key_for(&event.platform, &event.app, "event_id", &event.event_id);
            if admit(event, key) {
                admitted += 1;
            }
        }
        admitted
    });
    check_half(admitted, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

/// The floor: each thread only hashes the key and moves the event into its own vector (no
/// dedup, no sharing). No store can admit faster than this on these events.
pub(crate) fn admit_floor(ops: u64) -> f64 {
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (_, elapsed) = run_threads(|thread| {
        let mine = take(thread);
        let mut kept = Vec::new();
        for event in mine {
            let key = key_for(&event.platform, &event.app, "event_id", &event.event_id);
            if key.low64() & 1 == 0 {
                kept.push(event);
            }
        }
        std::hint::black_box(&kept);
        kept.len() as u64
    });
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

/// The second floor: [`MinimalStore`], sharded dedup and a partitioned queue with nothing else.
pub(crate) fn admit_minimal(ops: u64) -> f64 {
    let store = MinimalStore::new();
    admit_rate(ops, |event, key| store.admit(event, key))
}

pub(crate) fn admit_seed(ops: u64) -> f64 {
    let seed = SeedDeduplicator::default();
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (admitted, elapsed) = with_seed_cleanup(&seed, || {
        run_threads(|thread| {
            let mine = take(thread);
            let mut admitted = 0;
            for event in mine {
                if seed.admit(event, SystemClock.now_ms()) {
                    admitted += 1;
                }
            }
            admitted
        })
    });
    check_half(admitted, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

pub(crate) fn claim_ours(ops: u64) -> f64 {
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    let (completed, elapsed) = run_threads(|thread| {
        let mut work = Workload::new(thread);
        let mut completed = 0;
        let mut id_text = String::new();
        for op in 0..ops {
            use std::fmt::Write;
            id_text.clear();
            let _ = write!(id_text, "ev_{:016x}", work.id(op));
            let key = key_for("feishu", "cli_bench", "event_id", &id_text);
            if let Ok(Claim::Acquired(lease)) =
                ready(store.claim(&key, key.home(store.partitions()), Duration::from_secs(300)))
                && ready(store.complete(&lease, DAY, None)).is_ok()
            {
                completed += 1;
            }
        }
        completed
    });
    check_half(completed, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

pub(crate) fn claim_seed(ops: u64) -> f64 {
    let seed = SeedDeduplicator::default();
    let (completed, elapsed) = with_seed_cleanup(&seed, || {
        run_threads(|thread| {
            let mut work = Workload::new(thread);
            let mut completed = 0;
            let mut id_text = String::new();
            for op in 0..ops {
                use std::fmt::Write;
                id_text.clear();
                let _ = write!(id_text, "ev_{:016x}", work.id(op));
                let now = SystemClock.now_ms();
                if seed.try_mark_processing(&id_text, now, 300_000) {
                    seed.mark_completed(&id_text, now);
                    completed += 1;
                }
            }
            completed
        })
    });
    check_half(completed, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

pub(crate) fn check_half(done: u64, ops: u64) {
    let expected = ops / 2 * THREADS;
    if done != expected {
        eprintln!(
            "warning: {done} of {} operations took effect, expected {expected}",
            ops * THREADS
        );
    }
}
