//! Metrics: what the kernel counts, gathered on the reactor into a
//! [`Snapshot`] that is published whole (a pointer swap under a mutex), and
//! rendered in the Prometheus text format by whoever reads it — the
//! `[metrics] listen` thread, or METRICS for `agentos metrics` — so a
//! scraper never holds the reactor.
//!
//! Names follow the Prometheus conventions: an `agentos_` prefix, base
//! units, `_total` on counters (the encoder adds it), and labels of
//! bounded cardinality only.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// Latency buckets in seconds: 1 ms to about 33 s, doubling.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384, 32.768,
];

/// Upper bounds, in seconds, for work that takes microseconds when all is
/// well: a turn of the reactor.
pub const TURN_BUCKETS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A histogram kept as plain data on the reactor.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), the last one past every bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts one observation.
    pub fn observe(&mut self, value: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// One series' value.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Counter(u64),
    SecondsCounter(f64),
    Gauge(i64),
    Histogram(Histogram),
}

/// One metric: its name (without `_total`), help, unit, and its series.
#[derive(Clone, Debug, PartialEq)]
struct Family {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    series: Vec<(Vec<(&'static str, String)>, Value)>,
}

/// Everything the kernel counts, as of one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    families: Vec<Family>,
}

impl Snapshot {
    /// A counter series (`name` without `_total`).
    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: u64,
    ) {
        self.add(name, help, None, labels, Value::Counter(value));
    }

    /// A counter series of seconds (`name` without `_seconds_total`).
    pub fn seconds_counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        seconds: f64,
    ) {
        let value = Value::SecondsCounter(seconds);
        self.add(name, help, Some(Unit::Seconds), labels, value);
    }

    /// A gauge series.
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: i64,
    ) {
        self.add(name, help, None, labels, Value::Gauge(value));
    }

    /// A histogram series of seconds (`name` without `_seconds`).
    pub fn seconds(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        histogram: &Histogram,
    ) {
        let value = Value::Histogram(histogram.clone());
        self.add(name, help, Some(Unit::Seconds), labels, value);
    }

    /// Every series, now and added later, gains the label `key="value"`
    /// (a fleet's node: series of many nodes meet in one Prometheus).
    pub fn label_every_series(&mut self, key: &'static str, value: &str) {
        for family in &mut self.families {
            for (labels, _) in &mut family.series {
                labels.push((key, value.to_owned()));
            }
        }
    }

    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        labels: &[(&'static str, &str)],
        value: Value,
    ) {
        let labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        match self.families.iter_mut().find(|family| family.name == name) {
            Some(family) => family.series.push((labels, value)),
            None => self.families.push(Family {
                name,
                help,
                unit,
                series: vec![(labels, value)],
            }),
        }
    }
}

/// Where the reactor publishes snapshots and readers take the latest.
#[derive(Clone, Debug, Default)]
pub struct Published(Arc<Mutex<Arc<Snapshot>>>);

impl Published {
    /// Makes `snapshot` the latest.
    pub fn publish(&self, snapshot: Snapshot) {
        let snapshot = Arc::new(snapshot);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
    }

    /// The latest snapshot (the lock is held only to clone a pointer).
    pub fn latest(&self) -> Arc<Snapshot> {
        Arc::clone(&self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The latest snapshot in the Prometheus text format (0.0.4), which
    /// `promtool check metrics` and every Prometheus read.
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
        text
    }
}

/// How often the kernel takes a snapshot.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// Where snapshots are published, and when the next is due.
#[derive(Debug)]
pub struct Publisher {
    pub published: Published,
    next: Instant,
}

impl Publisher {
    /// The first snapshot is due at once.
    pub fn new(now: Instant) -> Publisher {
        Publisher {
            published: Published::default(),
            next: now,
        }
    }

    /// How long until the next snapshot.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        Some(self.next.saturating_duration_since(now))
    }

    /// Whether a snapshot is due now (the next is then a period away).
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + SNAPSHOT_EVERY;
        true
    }
}

/// The content type of [`Published::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = self.latest();
        for family in &snapshot.families {
            let kind = match family.series.first().map(|(_, value)| value) {
                Some(Value::Counter(_) | Value::SecondsCounter(_)) => MetricType::Counter,
                Some(Value::Gauge(_)) => MetricType::Gauge,
                Some(Value::Histogram(_)) => MetricType::Histogram,
                None => continue,
            };
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, family.unit.as_ref(), kind)?;
            for (labels, value) in &family.series {
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let series = metric.encode_family(&labels)?;
                match value {
                    Value::Counter(n) => ConstCounter::new(*n).encode(series)?,
                    Value::SecondsCounter(n) => ConstCounter::new(*n).encode(series)?,
                    Value::Gauge(n) => ConstGauge::new(*n).encode(series)?,
                    Value::Histogram(h) => {
                        let mut series = series;
                        let buckets: Vec<(f64, u64)> = h
                            .bounds
                            .iter()
                            .copied()
                            .chain([f64::INFINITY])
                            .zip(h.counts.iter().copied())
                            .collect();
                        series.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_renders_as_prometheus_text() {
        let published = Published::default();
        let mut snapshot = Snapshot::default();
        snapshot.gauge(
            "agentos_agents",
            "Agents by state.",
            &[("state", "running")],
            3,
        );
        snapshot.gauge(
            "agentos_agents",
            "Agents by state.",
            &[("state", "exited")],
            1,
        );
        snapshot.counter(
            "agentos_exec_runs",
            "EXEC runs ended.",
            &[("outcome", "ok")],
            7,
        );
        let mut latency = Histogram::new(&LATENCY_BUCKETS);
        latency.observe(0.003);
        latency.observe(100.0);
        snapshot.seconds("agentos_exec_run_duration", "EXEC run time.", &[], &latency);
        published.publish(snapshot);
        let text = published.render();
        for line in [
            "# TYPE agentos_agents gauge",
            "agentos_agents{state=\"running\"} 3",
            "agentos_agents{state=\"exited\"} 1",
            "# TYPE agentos_exec_runs_total counter",
            "agentos_exec_runs_total{outcome=\"ok\"} 7",
            "# TYPE agentos_exec_run_duration_seconds histogram",
            "agentos_exec_run_duration_seconds_count 2",
            "agentos_exec_run_duration_seconds_bucket{le=\"0.004\"} 1",
            "agentos_exec_run_duration_seconds_bucket{le=\"+Inf\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
    }

    #[test]
    fn nothing_published_renders_nothing() {
        assert_eq!(Published::default().render(), "");
    }
}
