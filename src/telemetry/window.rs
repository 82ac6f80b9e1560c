//! Rolling latency windows: per class, TTFT and ITL percentiles over the
//! last `breaker.window`, from HdrHistograms in rotating sub-windows.
//!
//! Recording is on the request path (once per request for TTFT, once per
//! token gap for ITL), so it must be cheap and must not serialize the cores:
//! a recorder writes into one of several *shards*, picked by thread, each a
//! small mutex that in practice only its own worker thread takes. The
//! publisher (one background task) drains the shards into the current
//! sub-window, drops sub-windows older than the window, and computes the
//! percentiles it publishes as read-only views. Nothing on the request path
//! waits for it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// Values are recorded in microseconds, between 1 µs and 10 min (longer
/// values are clamped), with two significant digits (1 % resolution).
const LOWEST_US: u64 = 1;
const HIGHEST_US: u64 = 600_000_000;
const SIGFIG: u8 = 2;

/// How many sub-windows a window is cut into.
pub(crate) const SUB_WINDOWS: u32 = 10;

fn shard_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).clamp(1, 64) * 2
}

fn shard_index(n: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static ID: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id % n)
}

/// One latency series (TTFT or ITL) of one class.
pub(crate) struct RollingHistogram {
    /// Written by recorders; drained by the publisher. Allocated on first use.
    shards: Box<[Mutex<Option<Histogram<u32>>>]>,
    /// Sub-windows, oldest first, each with the instant it started. Only the
    /// publisher touches these.
    ring: Mutex<VecDeque<(Instant, Histogram<u32>)>>,
    sub_window: Duration,
    window: Duration,
    /// An empty histogram of the right shape, cloned for new shards and
    /// sub-windows (built once, so the request path never constructs one).
    empty: Histogram<u32>,
}

/// Percentiles over a window, published by the publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct WindowStats {
    pub(crate) count: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl RollingHistogram {
    pub(crate) fn new(window: Duration) -> RollingHistogram {
        let window = window.max(Duration::from_millis(10));
        // Constant bounds that HdrHistogram accepts; checked by the tests.
        let empty = Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGFIG).expect("constant histogram bounds are valid");
        RollingHistogram {
            empty,
            shards: (0..shard_count()).map(|_| Mutex::new(None)).collect(),
            ring: Mutex::new(VecDeque::new()),
            sub_window: window / SUB_WINDOWS,
            window,
        }
    }

    /// Record one value. Cheap: one uncontended lock and an array increment.
    pub(crate) fn record(&self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(LOWEST_US, HIGHEST_US);
        let shard = &self.shards[shard_index(self.shards.len())];
        if let Ok(mut h) = shard.lock() {
            let _ = h.get_or_insert_with(|| self.empty.clone()).record(us);
        }
    }

    /// Drain the shards into the current sub-window, rotate, and return the
    /// stats over the window ending at `now`. Called by the publisher only.
    pub(crate) fn publish(&self, now: Instant) -> WindowStats {
        let Ok(mut ring) = self.ring.lock() else { return WindowStats::default() };
        // Drop sub-windows that ended before the window.
        while ring.front().is_some_and(|(start, _)| now.saturating_duration_since(*start) >= self.window + self.sub_window) {
            ring.pop_front();
        }
        let need_new = ring.back().is_none_or(|(start, _)| now.saturating_duration_since(*start) >= self.sub_window);
        let mut drained = false;
        for shard in self.shards.iter() {
            let taken = shard.lock().ok().and_then(|mut h| h.as_mut().filter(|h| !h.is_empty()).map(take));
            if let Some(h) = taken {
                if !drained && need_new {
                    ring.push_back((now, self.empty.clone()));
                }
                drained = true;
                if let Some((_, cur)) = ring.back_mut() {
                    let _ = cur.add(&h);
                }
            }
        }
        stats(ring.iter().map(|(_, h)| h))
    }

    /// Forget everything recorded so far (the breaker closed: what the window
    /// held is about a state already acted on).
    pub(crate) fn reset(&self) {
        if let Ok(mut ring) = self.ring.lock() {
            ring.clear();
        }
        for shard in self.shards.iter() {
            if let Ok(mut h) = shard.lock() {
                if let Some(h) = h.as_mut() {
                    h.reset();
                }
            }
        }
    }
}

/// Take a histogram's contents, leaving an empty one of the same shape.
fn take(h: &mut Histogram<u32>) -> Histogram<u32> {
    let mut fresh = h.clone();
    fresh.reset();
    std::mem::replace(h, fresh)
}

fn stats<'a>(hists: impl Iterator<Item = &'a Histogram<u32>>) -> WindowStats {
    let mut total: Option<Histogram<u32>> = None;
    for h in hists {
        match total.as_mut() {
            None => total = Some(h.clone()),
            Some(t) => {
                let _ = t.add(h);
            }
        }
    }
    match total {
        Some(t) if !t.is_empty() => WindowStats {
            count: t.len(),
            p50: Duration::from_micros(t.value_at_quantile(0.50)),
            p99: Duration::from_micros(t.value_at_quantile(0.99)),
        },
        _ => WindowStats::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn p99_over_the_window_and_old_values_age_out() {
        let w = RollingHistogram::new(Duration::from_secs(30));
        for _ in 0..98 {
            w.record(Duration::from_millis(100));
        }
        for _ in 0..2 {
            w.record(Duration::from_millis(900));
        }
        let t0 = Instant::now();
        let s = w.publish(t0);
        assert_eq!(s.count, 100);
        assert!((s.p50.as_millis() as i64 - 100).abs() <= 1, "{s:?}");
        assert!((s.p99.as_millis() as i64 - 900).abs() <= 9, "{s:?}");
        // 20 s later, fast values only: the slow ones are still in the window.
        tokio::time::advance(Duration::from_secs(20)).await;
        for _ in 0..100 {
            w.record(Duration::from_millis(100));
        }
        let s = w.publish(Instant::now());
        assert_eq!(s.count, 200);
        // 33 s after the first batch (window + one sub-window), it has aged out.
        tokio::time::advance(Duration::from_secs(13)).await;
        let s = w.publish(Instant::now());
        assert_eq!(s.count, 100);
        assert!((s.p99.as_millis() as i64 - 100).abs() <= 1, "{s:?}");
        // And an empty window has no samples.
        tokio::time::advance(Duration::from_secs(40)).await;
        assert_eq!(w.publish(Instant::now()), WindowStats::default());
    }

    #[test]
    fn recording_from_many_threads_loses_nothing() {
        let w = std::sync::Arc::new(RollingHistogram::new(Duration::from_secs(30)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        w.record(Duration::from_micros(100 + i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("recorder thread");
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let s = rt.block_on(async { w.publish(Instant::now()) });
        assert_eq!(s.count, 8000);
    }

    #[tokio::test(start_paused = true)]
    async fn reset_forgets() {
        let w = RollingHistogram::new(Duration::from_secs(30));
        w.record(Duration::from_millis(5));
        w.publish(Instant::now());
        w.record(Duration::from_millis(5));
        w.reset();
        assert_eq!(w.publish(Instant::now()).count, 0);
    }
}
