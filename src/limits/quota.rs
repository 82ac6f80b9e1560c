//! Quotas over long windows: a key's requests and tokens per calendar day
//! and per calendar month, in UTC (`auth.keys[].limits.requests_per_day`,
//! `tokens_per_day`, `requests_per_month`, `tokens_per_month`).
//!
//! Rules (docs/access.md, rules 7 to 12):
//! 1. A window is a calendar period, not a sliding one: the day's quota
//!    comes back whole at 00:00 UTC, the month's on the first. A refusal's
//!    Retry-After is the time until the window ends.
//! 2. Tokens are reserved at admission (the prompt estimate plus the most
//!    the request may generate) and settled to the replica's usage when it
//!    ends, in the window they were reserved in: a key cannot overrun its
//!    quota by starting many requests at once, and it overruns it by at most
//!    what one request uses beyond its reservation.
//! 3. With the limit store (`limits.redis`) the counts live there, shared by
//!    every instance and kept across restarts. Without it each instance
//!    counts its part (the quota over the live instances) in memory, and a
//!    restart forgets what was used.

/// A calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Period {
    Day,
    Month,
}

impl Period {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The window holding second `unix` (seconds since 1970, UTC): its
    /// number (days since 1970, or year * 12 + month - 1) and the second it ends.
    pub(crate) fn window(self, unix: u64) -> (u64, u64) {
        let day = unix / 86_400;
        match self {
            Period::Day => (day, (day + 1) * 86_400),
            Period::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                let end = days_from_civil(ny, nm, 1).max(0) as u64 * 86_400;
                ((y * 12 + i64::from(m) - 1).max(0) as u64, end)
            }
        }
    }
}

/// The year, month and day of a day number (days since 1970-01-01), in the
/// proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The day number of a date; the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What a quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Requests,
    Tokens,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
        }
    }
}

/// The four quotas a key may have, in the order the limit store takes them.
pub(crate) const QUOTAS: [(Period, Kind); 4] =
    [(Period::Day, Kind::Requests), (Period::Day, Kind::Tokens), (Period::Month, Kind::Requests), (Period::Month, Kind::Tokens)];

/// One quota's count in its current window.
#[derive(Debug, Clone, Copy, Default)]
struct Count {
    window: u64,
    used: f64,
}

/// A key's use of its quotas, in this instance's memory.
#[derive(Debug, Default, Clone)]
pub(crate) struct Calendar {
    counts: [Count; 4],
}

/// Why a quota refused: which one, its limit and use, and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub(crate) period: Period,
    pub(crate) kind: Kind,
    pub(crate) limit: u64,
    pub(crate) used: u64,
    /// Seconds until the window ends (at least 1).
    pub(crate) retry_after: u64,
    /// The request alone needs more than the whole quota.
    pub(crate) too_large: bool,
}

/// One quota's state after a check, for the rate-limit headers and `/slo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    pub(crate) period: Period,
    pub(crate) kind: Kind,
    pub(crate) limit: u64,
    pub(crate) used: u64,
    /// Seconds until the window ends.
    pub(crate) reset: u64,
}

impl Calendar {
    fn count(&mut self, i: usize, unix: u64) -> &mut Count {
        let (window, _) = QUOTAS[i].0.window(unix);
        let c = &mut self.counts[i];
        if c.window != window {
            *c = Count { window, used: 0.0 };
        }
        c
    }

    /// Take one request and `reserve` tokens at second `unix` from every
    /// quota in `limits` (in [`QUOTAS`] order; `None`: no such quota), or
    /// say which refuses; nothing is taken then.
    pub(crate) fn take(&mut self, unix: u64, limits: [Option<u64>; 4], reserve: u64) -> Result<Vec<Standing>, Exceeded> {
        let need = |k: Kind| if k == Kind::Requests { 1 } else { reserve };
        for (i, limit) in limits.iter().enumerate() {
            let Some(limit) = *limit else { continue };
            let (period, kind) = QUOTAS[i];
            let used = self.count(i, unix).used.max(0.0) as u64;
            if used.saturating_add(need(kind)) > limit {
                let (_, end) = period.window(unix);
                let retry_after = end.saturating_sub(unix).max(1);
                return Err(Exceeded { period, kind, limit, used, retry_after, too_large: need(kind) > limit });
            }
        }
        for (i, limit) in limits.iter().enumerate() {
            if limit.is_some() {
                self.count(i, unix).used += need(QUOTAS[i].1) as f64;
            }
        }
        Ok(self.standing(unix, limits))
    }

    /// A request taken at second `taken` ended at `unix`: its tokens were
    /// `delta` more than reserved (fewer: negative); `refund`: it never
    /// reached a replica, so its request does not count either. Only the
    /// windows it was taken in change.
    pub(crate) fn settle(&mut self, taken: u64, unix: u64, delta: f64, refund: bool) {
        for (i, (period, kind)) in QUOTAS.iter().enumerate() {
            let (then, _) = period.window(taken);
            let c = self.count(i, unix);
            if c.window != then {
                continue;
            }
            match kind {
                Kind::Tokens => c.used += delta,
                Kind::Requests if refund => c.used -= 1.0,
                Kind::Requests => {}
            }
        }
    }

    /// Each quota in `limits` as it stands at second `unix`.
    pub(crate) fn standing(&mut self, unix: u64, limits: [Option<u64>; 4]) -> Vec<Standing> {
        let mut out = Vec::new();
        for (i, limit) in limits.iter().enumerate() {
            let Some(limit) = *limit else { continue };
            let (period, kind) = QUOTAS[i];
            let used = self.count(i, unix).used.max(0.0) as u64;
            out.push(Standing { period, kind, limit, used, reset: period.window(unix).1.saturating_sub(unix) });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds since 1970 of a UTC date and time.
    fn at(y: i64, m: u32, d: u32, hms: u64) -> u64 {
        days_from_civil(y, m, d) as u64 * 86_400 + hms
    }

    #[test]
    fn the_calendar_is_gregorian() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        for (y, m, d) in [(2000, 2, 29), (2024, 2, 29), (2026, 11, 27), (2100, 3, 1), (1999, 12, 31)] {
            assert_eq!(civil_from_days(days_from_civil(y, m, d)), (y, m, d));
        }
        assert_eq!(days_from_civil(2024, 3, 1) - days_from_civil(2024, 2, 1), 29);
        assert_eq!(days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 1), 28);
    }

    #[test]
    fn windows_end_at_midnight_and_on_the_first() {
        let t = at(2026, 11, 27, 13 * 3600);
        assert_eq!(Period::Day.window(t).1, at(2026, 11, 28, 0));
        assert_eq!(Period::Month.window(t).1, at(2026, 12, 1, 0));
        assert_eq!(Period::Month.window(at(2026, 12, 31, 86_399)).1, at(2027, 1, 1, 0));
        assert_ne!(Period::Month.window(at(2026, 12, 31, 86_399)).0, Period::Month.window(at(2027, 1, 1, 0)).0);
    }

    #[test]
    fn a_day_quota_refuses_until_midnight_and_comes_back_whole() {
        let mut c = Calendar::default();
        let limits = [None, Some(1000), None, Some(5000)];
        let t = at(2026, 11, 27, 23 * 3600);
        c.take(t, limits, 600).expect("600 of 1000");
        let no = c.take(t + 10, limits, 600).expect_err("1200 > 1000");
        assert_eq!((no.period, no.kind, no.used, no.retry_after, no.too_large), (Period::Day, Kind::Tokens, 600, 3590, false));
        // Settled to what it used: the rest comes back.
        c.settle(t, t + 20, -400.0, false);
        c.take(t + 30, limits, 600).expect("200 + 600 fits");
        // A new day: whole again; the month keeps counting.
        let next = at(2026, 11, 28, 0);
        let s = c.take(next, limits, 900).expect("a new day");
        assert_eq!(s.iter().map(|q| (q.period, q.used)).collect::<Vec<_>>(), vec![(Period::Day, 900), (Period::Month, 1700)]);
        // A settle for yesterday's request leaves today's count alone.
        c.settle(t, next + 1, -600.0, true);
        assert_eq!(c.standing(next + 1, limits)[0].used, 900);
        assert_eq!(c.standing(next + 1, limits)[1].used, 1100, "the month is the same window");
        assert!(c.take(next, limits, 1001).expect_err("alone over the day").too_large);
    }

    #[test]
    fn request_quotas_count_requests_and_refunds() {
        let mut c = Calendar::default();
        let limits = [Some(2), None, Some(3), None];
        let t = at(2026, 11, 27, 0);
        c.take(t, limits, 10_000).expect("1");
        c.take(t, limits, 10_000).expect("2");
        assert_eq!(c.take(t, limits, 0).expect_err("3 > 2 a day").period, Period::Day);
        c.settle(t, t, 0.0, true);
        c.take(t, limits, 0).expect("a refunded request gave its place back");
        let tomorrow = t + 86_400;
        c.take(tomorrow, limits, 0).expect("a new day; the month's third (the refunded one gave its place back)");
        assert_eq!(c.take(tomorrow, limits, 0).expect_err("the month's 3 are used").period, Period::Month);
    }
}
