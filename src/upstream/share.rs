//! A replica's hit ratios: a part of a whole, both counted since the start.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;

/// A part of a whole, both counted since the start (and in a pair of
/// counters, once the replica's series exist).
#[derive(Debug, Default)]
pub(super) struct Share {
    whole: AtomicU64,
    part: AtomicU64,
}

impl Share {
    pub(super) fn add(&self, whole: u64, part: u64, counters: Option<(&Counter, &Counter)>) {
        self.whole.fetch_add(whole, Ordering::Relaxed);
        self.part.fetch_add(part, Ordering::Relaxed);
        if let Some((w, p)) = counters {
            w.inc_by(whole);
            p.inc_by(part);
        }
    }

    /// The part over the whole; `None` before any.
    pub(super) fn ratio(&self) -> Option<f64> {
        let whole = self.whole.load(Ordering::Relaxed);
        (whole > 0).then(|| self.part.load(Ordering::Relaxed) as f64 / whole as f64)
    }
}
