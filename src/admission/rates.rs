//! What a pool's queue measures of itself each tick: the interactive
//! demand's recent peak (what the reservation follows) and the batch
//! service rate (what early rejection and Retry-After use). Plain values
//! over samples, tested without a clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::seats::DEMAND_WINDOW;

/// How far back the batch service rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// A rate is claimed only once its samples span this part of the window.
const RATE_WINDOW_FILLED: f64 = 0.8;
/// Retry-After for a queue is kept within this many seconds.
const RETRY_AFTER_MAX_SECS: f64 = 60.0;

/// The samples behind a pool's demand peak and batch rate.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    /// (instant, batch releases so far).
    released: VecDeque<(Instant, u64)>,
    /// (instant, interactive demand's peak over the tick before).
    demand: VecDeque<(Instant, usize)>,
}

impl Rates {
    /// The tick's high mark of interactive requests holding or waiting is
    /// `high`: the peak over [`DEMAND_WINDOW`].
    pub(crate) fn demand_peak(&mut self, now: Instant, high: usize) -> usize {
        self.demand.push_back((now, high));
        while self.demand.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > DEMAND_WINDOW) {
            self.demand.pop_front();
        }
        self.demand.iter().map(|(_, d)| *d).max().unwrap_or(0)
    }

    /// `released` batch leases so far: the batch slots freed per second over
    /// [`RATE_WINDOW`], once the samples span most of it (`None` before).
    pub(crate) fn batch_rate(&mut self, now: Instant, released: u64) -> Option<f64> {
        self.released.push_back((now, released));
        while self.released.len() > 2 && self.released.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > RATE_WINDOW) {
            self.released.pop_front();
        }
        let (&(t0, c0), &(t1, c1)) = (self.released.front()?, self.released.back()?);
        let dt = t1.saturating_duration_since(t0).as_secs_f64();
        (dt >= RATE_WINDOW.as_secs_f64() * RATE_WINDOW_FILLED).then(|| (c1 - c0) as f64 / dt)
    }
}

/// Whole seconds until the request at `position` in a queue served at
/// `rate` per second gets a slot (1 with no rate known).
pub(crate) fn queue_retry_after(position: usize, rate: Option<f64>) -> u64 {
    match rate {
        Some(rate) => ((position as f64 + 1.0) / rate).ceil().clamp(1.0, RETRY_AFTER_MAX_SECS) as u64,
        None => 1,
    }
}

/// Of the waiters `(id, tenant, deadline)`, those that at `rate` per second
/// are served after their deadline. They are served in about their order
/// of arrival (tenants take turns, but the n-th oldest is served about n-th).
pub(crate) fn hopeless(mut waiting: Vec<(u64, u32, Instant)>, rate: f64, now: Instant) -> Vec<(u64, u32)> {
    waiting.sort_unstable_by_key(|w| w.0);
    waiting
        .into_iter()
        .enumerate()
        .filter(|(pos, (_, _, deadline))| now + Duration::from_secs_f64((*pos as f64 + 1.0) / rate) > *deadline)
        .map(|(_, (id, t, _))| (id, t))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demand_peak_is_the_highest_mark_within_the_window() {
        let t0 = Instant::now();
        let mut r = Rates::default();
        assert_eq!(r.demand_peak(t0, 3), 3);
        assert_eq!(r.demand_peak(t0 + Duration::from_secs(10), 1), 3);
        assert_eq!(r.demand_peak(t0 + Duration::from_secs(29), 2), 3);
        // The mark of t0 is older than the window now.
        assert_eq!(r.demand_peak(t0 + Duration::from_secs(31), 0), 2);
    }

    #[test]
    fn a_batch_rate_rests_on_a_filled_window() {
        let t0 = Instant::now();
        let mut r = Rates::default();
        assert_eq!(r.batch_rate(t0, 0), None);
        assert_eq!(r.batch_rate(t0 + Duration::from_secs(2), 10), None, "two seconds of five");
        assert_eq!(r.batch_rate(t0 + Duration::from_secs(4), 20), Some(5.0));
        // Old samples leave the window: the rate follows the recent ones.
        assert_eq!(r.batch_rate(t0 + Duration::from_secs(10), 80), Some(10.0));
    }

    #[test]
    fn retry_after_counts_the_queue_ahead_at_the_rate() {
        assert_eq!(queue_retry_after(9, None), 1);
        assert_eq!(queue_retry_after(9, Some(2.0)), 5);
        assert_eq!(queue_retry_after(0, Some(100.0)), 1);
        assert_eq!(queue_retry_after(10_000, Some(1.0)), 60);
    }

    #[test]
    fn hopeless_waiters_are_those_served_after_their_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        // At 1 per second the n-th oldest gets a slot in n seconds.
        let waiting = vec![(3, 1, now + s(10)), (1, 0, now + s(5)), (2, 1, now + s(1))];
        assert_eq!(hopeless(waiting, 1.0, now), vec![(2, 1)]);
        assert_eq!(hopeless(vec![(1, 0, now + s(1)), (2, 0, now + s(1))], 0.5, now), vec![(1, 0), (2, 0)]);
    }
}
