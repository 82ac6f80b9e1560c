//! A lock-free histogram for the per-token path.
//!
//! prometheus-client's `Histogram` takes a write lock on every observation,
//! and one histogram is shared by every stream of a (model, class, tier): the
//! observer records each inter-token gap, so that lock would be taken per
//! token across cores. Here an observation is three relaxed atomic adds; the
//! exposition is the same as prometheus-client's (it is encoded through the
//! same encoder).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Bucket upper bounds (the last is `f64::MAX`, written as `+Inf`) and counts.
#[derive(Debug)]
struct Inner {
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts, one per bound.
    counts: Vec<AtomicU64>,
    /// Sum of observations in nanoseconds (observations are seconds).
    sum_nanos: AtomicU64,
}

#[derive(Debug, Clone)]
pub(crate) struct AtomicHistogram(Arc<Inner>);

impl AtomicHistogram {
    pub(crate) fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Vec<f64> = bounds.into_iter().chain(std::iter::once(f64::MAX)).collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram(Arc::new(Inner { bounds, counts, sum_nanos: AtomicU64::new(0) }))
    }

    /// Record one value in seconds.
    pub(crate) fn observe(&self, v: f64) {
        let i = self.0.bounds.partition_point(|b| *b < v);
        self.0.counts[i.min(self.0.counts.len() - 1)].fetch_add(1, Ordering::Relaxed);
        self.0.sum_nanos.fetch_add((v * 1e9).round().max(0.0) as u64, Ordering::Relaxed);
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self.0.bounds.iter().zip(&self.0.counts).map(|(b, c)| (*b, c.load(Ordering::Relaxed))).collect();
        // The count is the buckets' total, so a scrape never sees them disagree.
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn exposition_matches_prometheus_client_histogram() {
        let bounds = [0.01, 0.05, 0.3, 1.0];
        let (ours, theirs) = (AtomicHistogram::new(bounds), Histogram::new(bounds));
        for v in [0.0, 0.01, 0.011, 0.05, 0.2, 0.3, 0.30001, 2.5, 100.0] {
            ours.observe(v);
            theirs.observe(v);
        }
        let text = |h: Box<dyn Fn(&mut Registry)>| {
            let mut r = Registry::default();
            h(&mut r);
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &r).expect("encode");
            s
        };
        let a = text(Box::new(move |r| r.register("h", "x", ours.clone())));
        let b = text(Box::new(move |r| r.register("h", "x", theirs.clone())));
        assert_eq!(a, b);
        assert!(a.contains("h_bucket{le=\"0.3\"} 6"), "{a}");
    }
}
