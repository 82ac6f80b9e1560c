//! What a pool's queue measures of itself each tick: the interactive
//! demand's recent peak (what the reservation follows) and each tier's
//! service rate (what early rejection and Retry-After use), and the waits
//! Retry-After says (docs/design/seats.md, rules 19 and 20). Plain values
//! over samples, tested without a clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::fair::OverShare;
use super::seats::{AT_SLOTS_HELD, DEMAND_WINDOW};
use crate::config::Tier;

/// How far back a service rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// A rate is claimed only once its samples span this part of the window.
const RATE_WINDOW_FILLED: f64 = 0.8;

/// The samples behind a pool's demand peak and service rates.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    /// Per tier (interactive, batch): (instant, releases so far).
    released: [VecDeque<(Instant, u64)>; 2],
    /// (instant, interactive demand's peak over the tick before).
    demand: VecDeque<(Instant, usize)>,
    /// Since when every tick found the pool prioritised with each replica's
    /// limit at its engine's slots; `None` while it is not.
    at_slots_since: Option<Instant>,
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

    /// Has every tick for [`AT_SLOTS_HELD`] found the pool prioritised
    /// with each replica's limit at its engine's slots, this one
    /// (`at_slots`) included? A limit that just climbed back to the slots
    /// is often cut again within the second (the KV cache bounds the
    /// engine): reserving only the headroom at once would let batch take
    /// the seats chat's next burst needs (docs/design/seats.md rule 4).
    pub(crate) fn at_slots_held(&mut self, now: Instant, at_slots: bool) -> bool {
        if !at_slots {
            self.at_slots_since = None;
            return false;
        }
        now.saturating_duration_since(*self.at_slots_since.get_or_insert(now)) >= AT_SLOTS_HELD
    }

    /// `released` leases of `tier` so far: the tier's slots freed per
    /// second over [`RATE_WINDOW`], once the samples span most of it
    /// (`None` before). Only while requests wait (`busy`): with nobody
    /// waiting, slots free as fast as work arrives, not as fast as the
    /// replicas can serve, and a rate measured then would tell the next
    /// crowd a wait many times too long. An idle tick restarts the
    /// measurement; the caller keeps the last rate until a new one stands.
    pub(crate) fn rate(&mut self, tier: Tier, now: Instant, released: u64, busy: bool) -> Option<f64> {
        let samples = &mut self.released[tier as usize];
        if !busy {
            samples.clear();
            return None;
        }
        samples.push_back((now, released));
        while samples.len() > 2 && samples.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > RATE_WINDOW) {
            samples.pop_front();
        }
        let (&(t0, c0), &(t1, c1)) = (samples.front()?, samples.back()?);
        let dt = t1.saturating_duration_since(t0).as_secs_f64();
        (dt >= RATE_WINDOW.as_secs_f64() * RATE_WINDOW_FILLED).then(|| (c1 - c0) as f64 / dt)
    }
}

/// The wait said when no rate is known yet.
const UNKNOWN_WAIT: Duration = Duration::from_secs(1);

/// How long until the request at `position` in a queue served at `rate`
/// per second gets a slot (a second with no rate known). Retry-After says
/// this, bounded and spread (see `crate::error::retry_after`).
pub(crate) fn queue_wait(position: usize, rate: Option<f64>) -> Duration {
    match rate.filter(|r| *r > 0.0) {
        Some(rate) => Duration::from_secs_f64(((position as f64 + 1.0) / rate).min(3600.0)),
        None => UNKNOWN_WAIT,
    }
}

/// How long until a tenant over its fair part (`over`) is served again
/// when the tier frees `rate` slots per second: its waiters, and one more,
/// at the part of the slots it holds.
pub(crate) fn share_wait(over: &OverShare, rate: Option<f64>) -> Duration {
    let part = over.held.max(1) as f64 / over.slots.max(1) as f64;
    queue_wait(over.waiting, rate.map(|r| r * part.min(1.0)))
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
    fn the_slots_bind_once_every_tick_of_the_hold_found_them_binding() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut r = Rates::default();
        assert!(!r.at_slots_held(t0, true), "the first tick at the slots");
        assert!(!r.at_slots_held(at(9), true), "nine seconds of ten");
        assert!(r.at_slots_held(at(10), true), "held for ten");
        assert!(r.at_slots_held(at(30), true));
        // A limit cut below the slots for one tick starts the hold over.
        assert!(!r.at_slots_held(at(31), false));
        assert!(!r.at_slots_held(at(32), true));
        assert!(!r.at_slots_held(at(41), true));
        assert!(r.at_slots_held(at(42), true));
    }

    #[test]
    fn a_batch_rate_rests_on_a_filled_window() {
        let t0 = Instant::now();
        let mut r = Rates::default();
        let s = Duration::from_secs;
        assert_eq!(r.rate(Tier::Batch, t0, 0, true), None);
        assert_eq!(r.rate(Tier::Batch, t0 + s(2), 10, true), None, "two seconds of five");
        assert_eq!(r.rate(Tier::Batch, t0 + s(4), 20, true), Some(5.0));
        // Old samples leave the window: the rate follows the recent ones.
        assert_eq!(r.rate(Tier::Batch, t0 + s(10), 80, true), Some(10.0));
        // Each tier has its own.
        assert_eq!(r.rate(Tier::Interactive, t0 + s(10), 80, true), None);
        // Nobody waiting: no rate, and the measurement starts over when they wait again.
        assert_eq!(r.rate(Tier::Batch, t0 + s(11), 81, false), None);
        assert_eq!(r.rate(Tier::Batch, t0 + s(12), 81, true), None);
        assert_eq!(r.rate(Tier::Batch, t0 + s(16), 121, true), Some(10.0));
    }

    #[test]
    fn the_wait_is_the_queue_ahead_at_the_drain_rate() {
        let ms = Duration::from_millis;
        assert_eq!(queue_wait(9, None), ms(1000), "no rate yet");
        assert_eq!(queue_wait(9, Some(2.0)), ms(5000));
        assert_eq!(queue_wait(0, Some(100.0)), ms(10));
        assert_eq!(queue_wait(10_000_000, Some(1.0)), ms(3_600_000));
    }

    #[test]
    fn a_tenant_over_its_share_waits_for_its_own_part_of_the_drain() {
        // It holds 12 of 16 slots and has 5 waiting: at 20 slots a second
        // it gets about 15 a second, so its sixth request starts in 0.4 s.
        let over = OverShare { held: 12, part: 5.3, slots: 16, waiting: 5, weight: 1.0, total_weight: 3.0 };
        assert_eq!(share_wait(&over, Some(20.0)), Duration::from_millis(400));
        assert_eq!(share_wait(&over, None), Duration::from_secs(1));
        // Holding nothing yet, it counts as one slot's part.
        let none = OverShare { held: 0, waiting: 0, ..over };
        assert_eq!(share_wait(&none, Some(16.0)), Duration::from_secs(1));
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
