//! Error budgets and burn rates, per class, from the gateway's own outcomes.
//!
//! Two SLIs per class: latency (requests that completed within
//! both the class's TTFT and ITL targets, over completed requests) and
//! availability (as [`Outcome::sli`] says: `ok` and `length` good; the
//! gateway's and the fleet's failures bad; `client_error` and `cancelled`
//! not counted). Counts live in time buckets, never per
//! request: one-minute buckets for the burn-rate windows (up to the longest
//! `slo.burn_alerts` window) and one-hour buckets for the budget window
//! (`slo.window`, 28 d by default), so memory is constant. The request path
//! adds to four atomics of the current minute; the publisher folds them into
//! the buckets. Budgets restart empty when the process starts (`since`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::telemetry::{Outcome, SliClass};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// good/valid counts of the two SLIs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) latency_good: u64,
    pub(crate) latency_valid: u64,
    pub(crate) avail_good: u64,
    pub(crate) avail_valid: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.latency_good += o.latency_good;
        self.latency_valid += o.latency_valid;
        self.avail_good += o.avail_good;
        self.avail_valid += o.avail_valid;
    }
}

/// Which SLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sli {
    Latency,
    Availability,
}

impl Sli {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Sli::Latency => "latency",
            Sli::Availability => "availability",
        }
    }
    fn of(self, c: &Counts) -> (u64, u64) {
        match self {
            Sli::Latency => (c.latency_good, c.latency_valid),
            Sli::Availability => (c.avail_good, c.avail_valid),
        }
    }
}

struct Buckets {
    /// (minute index since start, counts), oldest first.
    minutes: VecDeque<(u64, Counts)>,
    /// (hour index since start, counts), oldest first.
    hours: VecDeque<(u64, Counts)>,
    keep_minutes: u64,
    keep_hours: u64,
    /// The totals as of the last fold: a fold adds what came since.
    folded: Counts,
}

/// Totals since start, for the status page's history (each point is the
/// difference of two).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) latency_good: u64,
    pub(crate) latency_valid: u64,
    /// Requests the gateway took (all but refusals and client errors).
    pub(crate) admitted: u64,
    /// Refused: 429 (breaker, queue, shed, key limits) and 503 (no replica).
    pub(crate) refused: u64,
}

/// One class's budget counters.
pub(crate) struct Budget {
    /// Counts since start, never reset: latency good, latency valid,
    /// availability good, availability valid, admitted, refused. The
    /// buckets hold their differences between folds; [`Tally`] reads them.
    totals: [AtomicU64; 6],
    buckets: Mutex<Buckets>,
    started: Instant,
    since: SystemTime,
}

impl Budget {
    /// `longest_burn_window`: the longest window a burn rate is asked for;
    /// `budget_window`: `slo.window`.
    pub(crate) fn new(longest_burn_window: Duration, budget_window: Duration) -> Budget {
        Budget {
            totals: Default::default(),
            buckets: Mutex::new(Buckets {
                minutes: VecDeque::new(),
                hours: VecDeque::new(),
                keep_minutes: longest_burn_window.as_secs().div_ceil(60) + 1,
                keep_hours: budget_window.as_secs().div_ceil(3600) + 1,
                folded: Counts::default(),
            }),
            started: Instant::now(),
            since: SystemTime::now(),
        }
    }

    /// How long this budget has been counting.
    pub(crate) fn uptime(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// When counting started (process start).
    pub(crate) fn since(&self) -> SystemTime {
        self.since
    }

    /// Count one finished request. Five relaxed atomic adds at most.
    pub(crate) fn record(&self, outcome: Outcome, latency_ok: bool) {
        let add = |i: usize| self.totals[i].fetch_add(1, Ordering::Relaxed);
        if outcome.completed() {
            add(1);
            if latency_ok {
                add(0);
            }
        }
        if outcome.sli() != SliClass::Excluded {
            add(3);
            if outcome.sli() == SliClass::Good {
                add(2);
            }
        }
        match outcome {
            Outcome::rejected | Outcome::unavailable => add(5),
            Outcome::client_error => 0,
            _ => add(4),
        };
    }

    /// The totals since start.
    pub(crate) fn tally(&self) -> Tally {
        let t = |i: usize| self.totals[i].load(Ordering::Relaxed);
        Tally { latency_good: t(0), latency_valid: t(1), admitted: t(4), refused: t(5) }
    }

    /// Fold what was counted since the last fold into the buckets of `now` (the publisher).
    pub(crate) fn fold(&self, now: Instant) {
        let Ok(mut guard) = self.buckets.lock() else { return };
        let b = &mut *guard;
        // Read under the lock: two folds never count the same requests.
        let t = |i: usize| self.totals[i].load(Ordering::Relaxed);
        let total = Counts { latency_good: t(0), latency_valid: t(1), avail_good: t(2), avail_valid: t(3) };
        let f = std::mem::replace(&mut b.folded, total);
        let c = Counts {
            latency_good: total.latency_good - f.latency_good,
            latency_valid: total.latency_valid - f.latency_valid,
            avail_good: total.avail_good - f.avail_good,
            avail_valid: total.avail_valid - f.avail_valid,
        };
        let age = now.saturating_duration_since(self.started);
        let minute = age.as_secs() / MINUTE.as_secs();
        let hour = age.as_secs() / HOUR.as_secs();
        for (ring, idx) in [(&mut b.minutes, minute), (&mut b.hours, hour)] {
            match ring.back_mut() {
                Some((i, counts)) if *i == idx => counts.add(&c),
                _ => ring.push_back((idx, c)),
            }
        }
        let (km, kh) = (b.keep_minutes, b.keep_hours);
        while b.minutes.front().is_some_and(|(i, _)| minute.saturating_sub(*i) >= km) {
            b.minutes.pop_front();
        }
        while b.hours.front().is_some_and(|(i, _)| hour.saturating_sub(*i) >= kh) {
            b.hours.pop_front();
        }
    }

    /// Counts over the last `window` (minute resolution up to the burn
    /// windows, hour resolution beyond), as of the last fold.
    pub(crate) fn counts(&self, now: Instant, window: Duration) -> Counts {
        let mut out = Counts::default();
        let Ok(b) = self.buckets.lock() else { return out };
        let age = now.saturating_duration_since(self.started);
        // The newest buckets whose index is within `n` of the current one.
        let mut sum = |ring: &VecDeque<(u64, Counts)>, current: u64, n: u64| {
            for (_, c) in ring.iter().rev().take_while(|(i, _)| current - i < n) {
                out.add(c);
            }
        };
        if window.as_secs().div_ceil(60) < b.keep_minutes {
            sum(&b.minutes, age.as_secs() / 60, window.as_secs().div_ceil(60).max(1));
        } else {
            sum(&b.hours, age.as_secs() / 3600, window.as_secs().div_ceil(3600).max(1));
        }
        out
    }

    /// Buckets held (for the constant-memory test).
    #[cfg(test)]
    pub(crate) fn bucket_count(&self) -> usize {
        self.buckets.lock().map(|b| b.minutes.len() + b.hours.len()).unwrap_or(0)
    }
}

/// Burn rate of an SLI over some counts: the bad share over the allowed bad
/// share (`1 - objective`). 0 with no valid requests.
pub(crate) fn burn_rate(sli: Sli, c: &Counts, objective: f64) -> f64 {
    let (good, valid) = sli.of(c);
    if valid == 0 {
        return 0.0;
    }
    let bad = (valid - good.min(valid)) as f64 / valid as f64;
    bad / (1.0 - objective).max(1e-9)
}

/// The budget left over the budget window: 1 - consumed (negative when overspent).
pub(crate) fn remaining(sli: Sli, c: &Counts, objective: f64) -> f64 {
    1.0 - burn_rate(sli, c, objective)
}

/// SLI ratio (good / valid), 1 with no valid requests.
pub(crate) fn ratio(sli: Sli, c: &Counts) -> f64 {
    let (good, valid) = sli.of(c);
    if valid == 0 {
        1.0
    } else {
        good as f64 / valid as f64
    }
}

/// The distinct windows of `slo.burn_alerts` (long and short), shortest first.
pub(crate) fn burn_windows(slo: &crate::config::SloConfig) -> Vec<Duration> {
    let mut w: Vec<Duration> = slo.burn_alerts.iter().flat_map(|a| [a.long.get(), a.short.get()]).collect();
    w.sort();
    w.dedup();
    w
}

/// A window as written in labels: `5m`, `1h`, `3d`.
pub(crate) fn window_label(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s % 86_400 == 0 {
        format!("{}d", s / 86_400)
    } else if s > 0 && s % 3600 == 0 {
        format!("{}h", s / 3600)
    } else if s > 0 && s % 60 == 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burn_rates_over_windows_and_constant_memory() {
        let b = Budget::new(Duration::from_secs(3 * 86_400), Duration::from_secs(28 * 86_400));
        // 99.9 % objective; one hour of 1 % errors, then healthy traffic.
        for _ in 0..60 {
            for i in 0..100 {
                b.record(if i == 0 { Outcome::upstream_error } else { Outcome::ok }, true);
            }
            b.record(Outcome::cancelled, false);
            b.record(Outcome::client_error, false);
            tokio::time::advance(MINUTE).await;
            b.fold(Instant::now());
        }
        let now = Instant::now();
        let h = b.counts(now, HOUR);
        assert_eq!((h.avail_good, h.avail_valid), (5940, 6000), "cancelled and client errors are not counted");
        assert!((burn_rate(Sli::Availability, &h, 0.999) - 10.0).abs() < 1e-9);
        let m5 = b.counts(now, Duration::from_secs(300));
        assert_eq!(m5.avail_valid, 500);
        // Latency: completed requests only.
        assert_eq!((h.latency_good, h.latency_valid), (5940, 5940));
        // A month of minutes later, memory has not grown past the windows.
        for _ in 0..(31 * 24 * 60) {
            b.record(Outcome::ok, true);
            tokio::time::advance(MINUTE).await;
            b.fold(Instant::now());
        }
        assert!(b.bucket_count() <= (3 * 1440 + 1) + (28 * 24 + 1), "{}", b.bucket_count());
        let now = Instant::now();
        assert_eq!(burn_rate(Sli::Availability, &b.counts(now, HOUR), 0.999), 0.0);
        let month = b.counts(now, Duration::from_secs(28 * 86_400));
        // Hour resolution: the 28-day window is 28 days to within an hour.
        assert!(month.avail_valid.abs_diff(28 * 24 * 60) <= 60, "{month:?}");
        assert!((remaining(Sli::Availability, &month, 0.999) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn labels() {
        assert_eq!(window_label(Duration::from_secs(300)), "5m");
        assert_eq!(window_label(Duration::from_secs(3600)), "1h");
        assert_eq!(window_label(Duration::from_secs(3 * 86_400)), "3d");
        assert_eq!(window_label(Duration::from_secs(45)), "45s");
    }
}
