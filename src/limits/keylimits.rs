//! A key's own limits as values: the limits in force (its part, in a
//! fleet), which one refused a request and for how long, the quotas as
//! OpenAI's `x-ratelimit-*` headers show them, and the sliding minute they
//! are counted in. Both the instance's own counting ([`super::tenants`])
//! and the limit store ([`super::store`]) speak in these.

use std::time::Duration;

use super::quota::{Exceeded, Kind, Standing};
use crate::config::KeyLimitsConfig;

/// The seconds of a minute's window.
pub(super) const SLOTS: usize = 60;

/// Usage over the last minute, in one-second slots.
#[derive(Debug, Clone)]
pub(super) struct Window {
    /// (second, amount) per slot; a slot holds the second it was last written for.
    slots: [(u64, f64); SLOTS],
}

impl Default for Window {
    fn default() -> Self {
        Window { slots: [(0, 0.0); SLOTS] }
    }
}

impl Window {
    pub(super) fn live(sec: u64, now: u64) -> bool {
        sec + SLOTS as u64 > now
    }

    /// Used within the last minute as of second `now`.
    pub(super) fn used(&self, now: u64) -> f64 {
        self.slots.iter().filter(|(s, _)| Self::live(*s, now)).map(|(_, a)| *a).sum::<f64>().max(0.0)
    }

    pub(super) fn add(&mut self, now: u64, amount: f64) {
        let slot = &mut self.slots[(now % SLOTS as u64) as usize];
        if slot.0 != now {
            *slot = (now, 0.0);
        }
        slot.1 += amount;
    }

    /// Change what second `sec` used, if it is still in the window.
    pub(super) fn adjust(&mut self, sec: u64, now: u64, delta: f64) {
        let slot = &mut self.slots[(sec % SLOTS as u64) as usize];
        if slot.0 == sec && Self::live(sec, now) {
            slot.1 += delta;
        }
    }

    /// Seconds from `now` until at least `need` fits under `limit`.
    pub(super) fn wait_for(&self, now: u64, need: f64, limit: f64) -> u64 {
        let mut used = self.used(now);
        let mut live: Vec<(u64, f64)> = self.slots.iter().copied().filter(|(s, a)| Self::live(*s, now) && *a > 0.0).collect();
        live.sort_by_key(|(s, _)| *s);
        for (s, a) in live {
            if used + need <= limit {
                break;
            }
            used -= a;
            if used + need <= limit {
                return s + SLOTS as u64 - now;
            }
        }
        if used + need <= limit {
            0
        } else {
            SLOTS as u64
        }
    }

    /// Seconds from `now` until nothing used now is in the window.
    pub(super) fn clear_in(&self, now: u64) -> u64 {
        self.slots.iter().filter(|(s, a)| Self::live(*s, now) && *a > 0.0).map(|(s, _)| s + SLOTS as u64 - now).max().unwrap_or(0)
    }
}

/// A key's limits in force (its part, in a fleet).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Limits {
    pub(crate) requests_per_minute: Option<u64>,
    pub(crate) tokens_per_minute: Option<u64>,
    pub(crate) max_concurrent: Option<u64>,
    /// Requests and tokens per day, then per month (see [`super::quota::QUOTAS`]).
    pub(crate) quotas: [Option<u64>; 4],
}

impl Limits {
    pub(super) fn of(c: &KeyLimitsConfig) -> Limits {
        Limits {
            requests_per_minute: c.requests_per_minute,
            tokens_per_minute: c.tokens_per_minute,
            max_concurrent: c.max_concurrent,
            quotas: [c.requests_per_day, c.tokens_per_day, c.requests_per_month, c.tokens_per_month],
        }
    }

    pub(super) fn any(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some() || self.max_concurrent.is_some() || self.has_quotas()
    }

    /// Does it limit tokens (per minute, day or month)?
    pub(crate) fn limits_tokens(&self) -> bool {
        self.tokens_per_minute.is_some() || self.quotas[1].is_some() || self.quotas[3].is_some()
    }

    pub(crate) fn has_quotas(&self) -> bool {
        self.quotas.iter().any(Option::is_some)
    }

    /// This instance's part of the limits when `instances` share them.
    pub(super) fn split(self, instances: usize) -> Limits {
        let part = |v: Option<u64>| v.map(|v| (v / instances.max(1) as u64).max(1));
        Limits {
            requests_per_minute: part(self.requests_per_minute),
            tokens_per_minute: part(self.tokens_per_minute),
            max_concurrent: part(self.max_concurrent),
            quotas: self.quotas.map(part),
        }
    }
}

/// Which of a key's limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Requests,
    Tokens,
    Concurrent,
    /// A day's or a month's quota (which one: [`Limited::quota`]).
    Quota,
}

impl Limit {
    pub(crate) const ALL: [Limit; 4] = [Limit::Requests, Limit::Tokens, Limit::Concurrent, Limit::Quota];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
            Limit::Concurrent => "concurrent",
            Limit::Quota => "quota",
        }
    }
}

/// One limit's state as OpenAI's `x-ratelimit-*` headers show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    /// Until the window holds nothing used so far.
    pub(crate) reset: Duration,
}

/// A limited key's quotas, for the headers of every response it gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RateState {
    pub(crate) requests: Option<Quota>,
    pub(crate) tokens: Option<Quota>,
}

/// Why a key's request was refused before it queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limited {
    pub(crate) limit: Limit,
    /// Whole seconds until it would pass (at least 1).
    pub(crate) retry_after: u64,
    /// The request alone needs more tokens than a minute allows: retrying cannot help.
    pub(crate) too_large: bool,
    pub(crate) reserve: u64,
    pub(crate) state: RateState,
    /// The quota that refused (with [`Limit::Quota`]).
    pub(crate) quota: Option<Exceeded>,
}

/// A request that alone needs more tokens than a whole day's or month's
/// quota: no wait can help.
pub(super) fn too_large_for_quota(limits: &Limits, reserve: u64, unix: u64) -> Option<Exceeded> {
    super::quota::QUOTAS.iter().zip(limits.quotas).find_map(|(&(period, kind), limit)| {
        let limit = limit?;
        (kind == Kind::Tokens && reserve > limit).then(|| Exceeded {
            period,
            kind,
            limit,
            used: 0,
            retry_after: period.window(unix).1.saturating_sub(unix).max(1),
            too_large: true,
        })
    })
}

/// The rate-limit headers' view: for requests and for tokens, whichever
/// limit (the minute's, or a day's or month's quota) has the least left.
pub(crate) fn tightest(mut state: RateState, standing: &[Standing]) -> RateState {
    for q in standing {
        let quota = Quota { limit: q.limit, remaining: q.limit.saturating_sub(q.used), reset: Duration::from_secs(q.reset) };
        let slot = match q.kind {
            Kind::Requests => &mut state.requests,
            Kind::Tokens => &mut state.tokens,
        };
        if slot.is_none_or(|s| quota.remaining < s.remaining) {
            *slot = Some(quota);
        }
    }
    state
}

/// `d` as OpenAI's reset headers write it (`1s`, `6m0s`, `250ms`).
pub(crate) fn reset_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}
