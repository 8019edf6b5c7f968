//! The gateway's metrics recorder: the Prometheus exporter's, except for `_seconds` histograms,
//! which it keeps itself as atomic counts per bucket. The exporter keeps every histogram sample
//! (with a clock read) until an upkeep folds them into buckets; at the six or seven samples an
//! event takes, that cost the gateway about 5 % of its CPU. Here a sample is a search among the
//! bucket bounds and two atomic additions.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::formatting::{
    sanitize_label_key, sanitize_label_value, write_type_line,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// The buckets of every `_seconds` histogram: 100 µs to an hour (a backlog's age, too).
pub const SECONDS_BUCKETS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// What a histogram's name ends with to be kept here, in [`SECONDS_BUCKETS`].
const SECONDS: &str = "_seconds";

/// One histogram, in shards that threads pick by their own index, so that two workers
/// recording at once do not pull one cache line back and forth.
#[derive(Debug, Default)]
pub(crate) struct Buckets {
    shards: [Shard; SHARDS],
}

/// How many shards a histogram has: more than a small host's cores.
const SHARDS: usize = 8;

/// A count per bucket (the last for values above every bound) and the sum, of the samples
/// recorded by the threads of one shard.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    counts: [AtomicU64; SECONDS_BUCKETS.len() + 1],
    /// The sum of the samples, as the bits of an `f64`.
    sum: AtomicU64,
}

/// This thread's shard, handed out in turn as threads first record.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|index| *index)
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        if value.is_nan() {
            return;
        }
        let shard = &self.shards[shard_index()];
        // The first bound at or above the value: Prometheus buckets are `le`.
        let at = SECONDS_BUCKETS.partition_point(|bound| *bound < value);
        shard.counts[at].fetch_add(1, Ordering::Relaxed);
        let _ = shard
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

impl Buckets {
    /// The count of each bucket (not cumulative), over every shard.
    pub(crate) fn counts(&self) -> [u64; SECONDS_BUCKETS.len() + 1] {
        self.read().0
    }

    /// The count of each bucket (not cumulative) and the sum, over every shard.
    fn read(&self) -> ([u64; SECONDS_BUCKETS.len() + 1], f64) {
        let mut counts = [0u64; SECONDS_BUCKETS.len() + 1];
        let mut sum = 0.0;
        for shard in &self.shards {
            for (total, count) in counts.iter_mut().zip(&shard.counts) {
                *total += count.load(Ordering::Relaxed);
            }
            sum += f64::from_bits(shard.sum.load(Ordering::Relaxed));
        }
        (counts, sum)
    }
}

/// The `_seconds` histograms registered so far, by key.
#[derive(Debug, Clone, Default)]
pub(crate) struct SecondsHistograms {
    registered: Arc<Mutex<HashMap<Key, Arc<Buckets>>>>,
}

impl SecondsHistograms {
    fn handle(&self, key: &Key) -> Histogram {
        let mut registered = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let buckets = registered.entry(key.clone()).or_default().clone();
        Histogram::from_arc(buckets)
    }

    /// Every histogram in the Prometheus text format, by name and then by labels.
    pub(crate) fn render(&self) -> String {
        let mut histograms: Vec<(String, String, Arc<Buckets>)> = {
            let registered = self.registered.lock().unwrap_or_else(|p| p.into_inner());
            registered
                .iter()
                .map(|(key, buckets)| (key.name().to_owned(), labels(key), buckets.clone()))
                .collect()
        };
        histograms.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let mut out = String::new();
        let mut previous: Option<&str> = None;
        for (name, labels, buckets) in &histograms {
            if previous != Some(name.as_str()) {
                write_type_line(&mut out, name, None, None, "histogram");
                previous = Some(name);
            }
            let comma = if labels.is_empty() { "" } else { "," };
            let (counts, sum) = buckets.read();
            let mut total = 0u64;
            for (at, count) in counts.iter().enumerate() {
                total += count;
                match SECONDS_BUCKETS.get(at) {
                    Some(bound) => {
                        let _ = writeln!(
                            out,
                            "{name}_bucket{{{labels}{comma}le=\"{bound}\"}} {total}"
                        );
                    }
                    None => {
                        let _ =
                            writeln!(out, "{name}_bucket{{{labels}{comma}le=\"+Inf\"}} {total}");
                    }
                }
            }
            let braced = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            };
            let _ = writeln!(out, "{name}_sum{braced} {sum}");
            let _ = writeln!(out, "{name}_count{braced} {total}");
        }
        out
    }
}

/// A key's labels as `k="v",…`, escaped, in the key's order.
fn labels(key: &Key) -> String {
    key.labels()
        .map(|label| {
            format!(
                "{}=\"{}\"",
                sanitize_label_key(label.key()),
                sanitize_label_value(label.value())
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The recorder `oncegate serve` installs: `_seconds` histograms here, the rest in Prometheus's.
#[derive(Debug)]
pub struct MetricsRecorder {
    prometheus: PrometheusRecorder,
    seconds: SecondsHistograms,
}

impl Default for MetricsRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsRecorder {
    /// A recorder with nothing registered.
    pub fn new() -> Self {
        Self {
            prometheus: PrometheusBuilder::new().build_recorder(),
            seconds: SecondsHistograms::default(),
        }
    }

    /// Makes this the process's recorder; what renders it is returned.
    pub fn install(self) -> Result<MetricsRender, String> {
        let render = self.render_handle();
        metrics::set_global_recorder(self)
            .map_err(|_| "a metrics recorder was installed before this one".to_owned())?;
        Ok(render)
    }

    /// What renders this recorder's metrics (and runs the exporter's upkeep).
    pub fn render_handle(&self) -> MetricsRender {
        MetricsRender {
            prometheus: self.prometheus.handle(),
            seconds: self.seconds.clone(),
        }
    }
}

/// Renders a [`MetricsRecorder`]'s metrics, from any thread.
#[derive(Debug, Clone)]
pub struct MetricsRender {
    prometheus: PrometheusHandle,
    seconds: SecondsHistograms,
}

impl MetricsRender {
    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = self.prometheus.render();
        out.push_str(&self.seconds.render());
        out
    }

    /// Folds the exporter's pending samples (of histograms not kept here) into its buckets.
    pub fn run_upkeep(&self) {
        self.prometheus.run_upkeep();
    }
}

impl Recorder for MetricsRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.prometheus.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.prometheus.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if key.name().ends_with(SECONDS) {
            self.seconds.handle(key)
        } else {
            self.prometheus.register_histogram(key, metadata)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, line: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line} in {text}"))
    }

    /// Buckets are cumulative and `le`, the sum and count are every sample's, labels are kept
    /// apart, and the exporter still renders what is not a `_seconds` histogram.
    #[test]
    fn seconds_histograms_render_cumulative_le_buckets() {
        let recorder = MetricsRecorder::new();
        let render = recorder.render_handle();
        metrics::with_local_recorder(&recorder, || {
            let admit = metrics::histogram!("oncegate_store_seconds", "op" => "admit");
            for sample in [0.0001, 0.0002, 0.003, 7200.0, f64::NAN] {
                admit.record(sample);
            }
            metrics::histogram!("oncegate_store_seconds", "op" => "pull").record(0.5);
            metrics::histogram!("oncegate_handler_seconds").record(-1.0);
            metrics::counter!("oncegate_delivered_total").increment(3);
        });
        let text = render.render();
        let admit = |le: &str| {
            value(
                &text,
                &format!("oncegate_store_seconds_bucket{{op=\"admit\",le=\"{le}\"}}"),
            )
        };
        assert_eq!(admit("0.0001"), 1.0, "{text}");
        assert_eq!(admit("0.00025"), 2.0);
        assert_eq!(admit("0.0025"), 2.0);
        assert_eq!(admit("0.005"), 3.0);
        assert_eq!(admit("3600"), 3.0);
        assert_eq!(admit("+Inf"), 4.0);
        assert_eq!(
            value(&text, "oncegate_store_seconds_count{op=\"admit\"}"),
            4.0
        );
        let sum = value(&text, "oncegate_store_seconds_sum{op=\"admit\"}");
        assert!((sum - 7200.0033).abs() < 1e-9, "{sum}");
        assert_eq!(
            value(&text, "oncegate_store_seconds_count{op=\"pull\"}"),
            1.0
        );
        assert_eq!(
            value(&text, "oncegate_handler_seconds_bucket{le=\"0.0001\"}"),
            1.0
        );
        assert_eq!(value(&text, "oncegate_handler_seconds_count"), 1.0);
        assert_eq!(value(&text, "oncegate_delivered_total"), 3.0);
        assert_eq!(
            text.matches("# TYPE oncegate_store_seconds histogram")
                .count(),
            1,
            "{text}"
        );
    }

    /// Samples recorded at once from many threads are all counted, and summed.
    #[test]
    fn concurrent_samples_are_all_counted() {
        let recorder = MetricsRecorder::new();
        let render = recorder.render_handle();
        let handle = metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("oncegate_ingress_seconds")
        });
        let threads = 8;
        let each = 20_000;
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let handle = handle.clone();
                scope.spawn(move || {
                    for i in 0..each {
                        // Powers of two: their sums are exact in an f64.
                        handle.record(if (i + thread) % 2 == 0 { 0.25 } else { 2.0 });
                    }
                });
            }
        });
        let text = render.render();
        let total = f64::from(threads * each);
        assert_eq!(value(&text, "oncegate_ingress_seconds_count"), total);
        assert_eq!(
            value(&text, "oncegate_ingress_seconds_bucket{le=\"0.25\"}"),
            total / 2.0
        );
        assert_eq!(
            value(&text, "oncegate_ingress_seconds_sum"),
            total / 2.0 * 2.25
        );
    }
}
