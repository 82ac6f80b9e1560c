//! A lock-free histogram for the per-token path.
//!
//! prometheus-client's `Histogram` takes a write lock on every observation,
//! and one histogram is shared by every stream of a (model, class, tier): the
//! observer records each inter-token gap, so that lock would be taken per
//! token across cores. Here an observation is three relaxed atomic adds; the
//! exposition is the same as prometheus-client's (it is encoded through the
//! same encoder).
//!
//! A [`HistogramFamily`] gives each series its own bucket layout, and a
//! series whose layout must grow (a reload changed its class's target) keeps
//! every bucket it had: the grown series counts on in its new layout and
//! still exposes what the old one counted, under the same bounds.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Bucket upper bounds (the last is `f64::MAX`, written as `+Inf`) and counts.
#[derive(Debug)]
struct Inner {
    bounds: Vec<f64>,
    /// Per-bucket (not cumulative) counts, one per bound.
    counts: Vec<AtomicU64>,
    /// Sum of observations in nanoseconds (observations are seconds).
    sum_nanos: AtomicU64,
    /// The histogram this one grew from: requests that looked it up before
    /// still write there; its counts are exposed with this one's (every one
    /// of its bounds is one of this one's).
    older: Option<Arc<Inner>>,
}

#[derive(Debug, Clone)]
pub(crate) struct AtomicHistogram(Arc<Inner>);

impl AtomicHistogram {
    pub(crate) fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        Self::with_older(bounds, None)
    }

    fn with_older(bounds: impl IntoIterator<Item = f64>, older: Option<Arc<Inner>>) -> Self {
        let bounds: Vec<f64> = bounds.into_iter().chain(std::iter::once(f64::MAX)).collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram(Arc::new(Inner { bounds, counts, sum_nanos: AtomicU64::new(0), older }))
    }

    /// Does this histogram have every bound of `bounds`?
    fn covers(&self, bounds: &[f64]) -> bool {
        bounds.iter().all(|b| self.0.bounds.iter().any(|x| x == b))
    }

    /// A histogram with this one's bounds and `more`, exposing this one's
    /// counts (and those written to it from now on) with its own.
    fn grown(&self, more: &[f64]) -> AtomicHistogram {
        let mut bounds: Vec<f64> = self.0.bounds.iter().chain(more).copied().filter(|b| *b < f64::MAX).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        AtomicHistogram::with_older(bounds, Some(self.0.clone()))
    }

    /// Record one value in seconds.
    pub(crate) fn observe(&self, v: f64) {
        let i = self.0.bounds.partition_point(|b| *b < v);
        self.0.counts[i.min(self.0.counts.len() - 1)].fetch_add(1, Ordering::Relaxed);
        self.0.sum_nanos.fetch_add((v * 1e9).round().max(0.0) as u64, Ordering::Relaxed);
    }

    /// Values recorded here (not in the histogram it grew from).
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut buckets: Vec<(f64, u64)> = self.0.bounds.iter().map(|b| (*b, 0)).collect();
        let mut sum_nanos = 0u64;
        let mut next = Some(&self.0);
        while let Some(h) = next {
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                // An older layout's bounds are all in the newest one.
                let i = buckets.partition_point(|(x, _)| x < b).min(buckets.len() - 1);
                buckets[i].1 += c.load(Ordering::Relaxed);
            }
            sum_nanos = sum_nanos.wrapping_add(h.sum_nanos.load(Ordering::Relaxed));
            next = h.older.as_ref();
        }
        // The count is the buckets' total, so a scrape never sees them disagree.
        let count = buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(sum_nanos as f64 / 1e9, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Histograms by label set, each with the bucket layout it was asked for.
///
/// [`get_or_create`](HistogramFamily::get_or_create) returns the series of
/// a label set; asked with bounds the series lacks, it replaces the series
/// with one grown by them (see [`AtomicHistogram`]), so bounds are only ever
/// added: a `le` series, once exposed, stays and never goes back.
pub(crate) struct HistogramFamily<L> {
    series: Arc<RwLock<HashMap<L, AtomicHistogram>>>,
}

impl<L> Clone for HistogramFamily<L> {
    fn clone(&self) -> Self {
        HistogramFamily { series: self.series.clone() }
    }
}

impl<L> Default for HistogramFamily<L> {
    fn default() -> Self {
        HistogramFamily { series: Arc::default() }
    }
}

impl<L: Clone + Hash + Eq> HistogramFamily<L> {
    /// The series of `labels`, with at least `bounds`.
    pub(crate) fn get_or_create(&self, labels: &L, bounds: &[f64]) -> AtomicHistogram {
        if let Some(h) = self.series.read().unwrap_or_else(|p| p.into_inner()).get(labels).filter(|h| h.covers(bounds)) {
            return h.clone();
        }
        let mut map = self.series.write().unwrap_or_else(|p| p.into_inner());
        let h = match map.get(labels) {
            Some(h) if h.covers(bounds) => return h.clone(),
            Some(h) => h.grown(bounds),
            None => AtomicHistogram::new(bounds.iter().copied()),
        };
        map.insert(labels.clone(), h.clone());
        h
    }
}

impl<L> TypedMetric for HistogramFamily<L> {
    const TYPE: MetricType = MetricType::Histogram;
}

impl<L: EncodeLabelSet + std::fmt::Debug> EncodeMetric for HistogramFamily<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let map = self.series.read().unwrap_or_else(|p| p.into_inner());
        for (labels, h) in map.iter() {
            h.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl<L: std::fmt::Debug> std::fmt::Debug for HistogramFamily<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistogramFamily").finish_non_exhaustive()
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
