//! A replica's parts, each a concern of its own: its slots, its health,
//! what it reports, how it is reached, what the learned limit reads, and
//! what routing reads. `Replica` (`replica.rs`) is composed of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderValue;

use super::share::Share;
use super::{conn, limit, tls};
use crate::config::Tier;
use crate::sync::AtomicF64;

/// Its slots: how many there are, this instance's part of them, and who holds them (interactive, batch, prefilling).
pub(crate) struct Seats {
    /// Requests holding a slot here. Invariant: only changed through `ReplicaSlot`.
    pub(super) inflight: AtomicUsize,
    /// Of those, the ones without a first token yet, by tier (interactive,
    /// batch): the prefills a request sent here now would wait behind.
    /// Only changed through `ReplicaSlot`.
    pub(super) prefilling: [AtomicUsize; 2],
    /// Of those, the prompt bytes prefix-aware routing expected the cache
    /// not to hold, by tier: the prefill work a request sent here now would
    /// wait behind. Only changed through `ReplicaSlot`.
    pub(super) prefill_bytes: [AtomicU64; 2],
    /// Batch requests holding a slot here. Only changed through `ReplicaSlot`.
    pub(super) batch_held: AtomicUsize,
    /// Seats of the limit batch leaves to interactive requests here (the
    /// learned limit's answer to their first tokens coming late under load).
    pub(super) batch_cut: AtomicUsize,
    /// Slots; set when a config goes live (a reload resizes it in place:
    /// slots above a lowered limit drain, and no new one is taken until the
    /// count is under it).
    pub(super) max_inflight: AtomicUsize,
    /// This instance's part of the slots when other instances share the
    /// replica (`fleet`); `usize::MAX` when it is alone.
    pub(super) allowance: AtomicUsize,
    /// Requests other instances of the fleet hold here (or are assumed to,
    /// for peers not heard lately), as the fleet last published it.
    pub(super) others_inflight: AtomicUsize,
}

impl Seats {
    pub(crate) fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Requests of `tier` held here that have no first token yet.
    pub(crate) fn prefilling(&self, tier: Tier) -> usize {
        self.prefilling[tier as usize].load(Ordering::Relaxed)
    }

    /// What a request of `tier` sent here now would wait behind before its
    /// own prefill: with `upstream_priority` an interactive request waits
    /// only for the interactive prefills (vLLM runs them before any batch
    /// one it has not started), otherwise for all of them.
    pub(crate) fn prefills_ahead(&self, tier: Tier, upstream_priority: bool) -> usize {
        match tier {
            Tier::Interactive if upstream_priority => self.prefilling(Tier::Interactive),
            _ => self.prefilling(Tier::Interactive) + self.prefilling(Tier::Batch),
        }
    }

    /// [`Seats::prefills_ahead`] in prompt bytes not expected cached.
    pub(crate) fn prefill_bytes_ahead(&self, tier: Tier, upstream_priority: bool) -> u64 {
        let of = |t: Tier| self.prefill_bytes[t as usize].load(Ordering::Relaxed);
        match tier {
            Tier::Interactive if upstream_priority => of(Tier::Interactive),
            _ => of(Tier::Interactive) + of(Tier::Batch),
        }
    }

    /// The limit: learned, or fixed (for the whole fleet when several
    /// instances share the replica).
    pub(crate) fn max_inflight(&self) -> usize {
        self.max_inflight.load(Ordering::Relaxed)
    }

    /// The slots this instance may hold: the limit, or its part of it in a fleet.
    pub(crate) fn slots(&self) -> usize {
        self.max_inflight().min(self.allowance.load(Ordering::Relaxed))
    }

    /// The fleet's word: this instance may hold `n` requests here, the
    /// others hold `others` (`None`: the instance is alone again).
    pub(crate) fn set_fleet_share(&self, share: Option<(usize, usize)>) {
        let (n, others) = share.unwrap_or((usize::MAX, 0));
        self.allowance.store(n, Ordering::Relaxed);
        self.others_inflight.store(others, Ordering::Relaxed);
    }
}

/// Whether it is routed to, and why.
pub(crate) struct Health {
    /// Routed to: it passes its checks, or its pool is in panic.
    pub(super) healthy: AtomicBool,
    /// Whether it passes, and why it was last taken out or brought back.
    pub(crate) verdict: super::verdict::Verdict,
    /// Why the last health check failed (none after one passed).
    pub(super) health_error: ArcSwap<Option<String>>,
}

impl Health {
    /// Requests may be sent here: it passes its checks, or its pool is in panic.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// It passes its checks (and its traffic has not failed since).
    pub(crate) fn is_passing(&self) -> bool {
        self.verdict.passing()
    }

    /// Route to it or not, whatever its verdict (its pool's panic).
    pub(crate) fn set_routed(&self, routed: bool) {
        self.healthy.store(routed, Ordering::Relaxed);
    }

    /// Why it is not healthy, as its last failed check said.
    pub(crate) fn error(&self) -> Option<String> {
        (**self.health_error.load()).clone()
    }

    pub(crate) fn set_error(&self, reason: Option<String>) {
        self.health_error.store(Arc::new(reason));
    }
}

/// What its own `/metrics` and `/v1/models` said when last read.
pub(crate) struct Readings {
    /// What the replica runs and queues, as last scraped (all its clients);
    /// `u64::MAX` when the last scrape failed or none was made.
    pub(super) scraped_total: AtomicU64,
    /// Requests waiting inside vLLM, as last scraped from its `/metrics`
    /// (includes other clients' requests); 0 when not scraped.
    pub(crate) scraped_waiting: AtomicU64,
    /// Tokens its KV cache holds, as its `/metrics` says; 0 when unknown.
    pub(super) cache_tokens: AtomicU64,
    /// Models this replica's `/v1/models` listed (raw model objects).
    pub(crate) models: ArcSwap<Vec<serde_json::Value>>,
}

impl Readings {
    /// What the replica runs and queues for all its clients, as last scraped.
    pub(crate) fn scraped_total(&self) -> Option<u64> {
        Some(self.scraped_total.load(Ordering::Relaxed)).filter(|t| *t != u64::MAX)
    }

    pub(crate) fn set_scraped_total(&self, total: Option<f64>) {
        self.scraped_total.store(total.map_or(u64::MAX, |t| t.round() as u64), Ordering::Relaxed);
    }
}

/// How it is reached: idle connections, TLS, its key.
pub(crate) struct Connection {
    /// Keep-alive connections not serving a request now.
    pub(crate) idle: conn::IdleConns,
    /// TLS for an `https://` replica.
    pub(super) tls: Option<tls::ReplicaTls>,
    /// `Authorization: Bearer <pools[].api_key_env>`, marked sensitive.
    pub(super) api_key: Option<http::HeaderValue>,
}

/// What the learned limit reads of it since it last looked, and the controller itself.
pub(crate) struct LimitSignals {
    /// The learned limit (`max_inflight_per_replica: auto`), kept across reloads.
    pub(super) controller: std::sync::Mutex<limit::Controller>,
    /// The most requests held here since the controller last looked.
    pub(super) inflight_peak: AtomicUsize,
    /// The replica answered 429 or 503 since the controller last looked.
    pub(super) refused: AtomicBool,
    /// Interactive requests' dispatch-to-first-token time over their class
    /// target since the controller last looked: sum (in thousandths) and count.
    pub(super) first_token_share: AtomicU64,
    pub(super) first_token_n: AtomicU64,
    /// The largest share since the controller last looked (thousandths).
    pub(super) first_token_max: AtomicU64,
    /// The 90th percentile of that share, tracked (see [`Replica::first_token_p90`]).
    pub(super) first_token_p90: AtomicF64,
    /// Requests sent here since the start, and the count and time (ms
    /// after `born`) the controller last looked at it.
    pub(super) dispatched: AtomicU64,
    pub(super) dispatched_seen: AtomicU64,
    pub(super) controlled_at_ms: AtomicU64,
    /// The limit last logged (a move by a quarter or more is logged).
    pub(super) logged_limit: AtomicUsize,
}

/// The replica's time from dispatch to first token as a function of the
/// prefill work there, learned from its first tokens: the step's time
/// (its mean gap between tokens) plus the work ahead and its own, at the
/// rate recent first tokens took over their work (a ratio of running
/// means, so a cached prompt's near-zero work does not blow up the rate).
/// docs/design/preemption.md, rule 13.
#[derive(Default)]
pub(crate) struct FirstTokenModel {
    /// Running mean of (time to first token − the step), microseconds.
    excess_us: AtomicF64,
    /// Running mean of the prefill work, KiB.
    work_kib: AtomicF64,
    samples: AtomicU64,
}

/// How far the model's means move toward each first token.
const MODEL_EWMA: f64 = 0.1;
/// First tokens learned from before the model predicts.
const MODEL_WARMUP: u64 = 3;

impl FirstTokenModel {
    /// The time to first token predicted for `work` bytes of prefill (the
    /// work ahead and the request's own) with a step of `step_us`; `None`
    /// before the model has learned from a few first tokens.
    pub(crate) fn predict(&self, work: u64, step_us: f64) -> Option<std::time::Duration> {
        if self.samples.load(Ordering::Relaxed) < MODEL_WARMUP {
            return None;
        }
        let (excess, mean_work) = (self.excess_us.load(), self.work_kib.load());
        let scaled = if mean_work > 1e-3 { excess * (work as f64 / 1024.0) / mean_work } else { excess };
        Some(std::time::Duration::from_secs_f64((step_us + scaled).max(0.0) / 1e6))
    }

    /// A first token after `took` for `work` bytes of prefill, the step at `step_us`.
    pub(crate) fn learn(&self, work: u64, took: std::time::Duration, step_us: f64) {
        let excess = (took.as_secs_f64() * 1e6 - step_us).max(0.0);
        let kib = work as f64 / 1024.0;
        let first = self.samples.fetch_add(1, Ordering::Relaxed) == 0;
        let ewma = |m: &AtomicF64, v: f64| m.store(if first { v } else { m.load() + MODEL_EWMA * (v - m.load()) });
        ewma(&self.excess_us, excess);
        ewma(&self.work_kib, kib);
    }
}

/// What routing reads of how it serves: its prefix cache's hits, the gaps between its tokens, when it last delivered.
pub(crate) struct RoutingStats {
    /// Prefix-aware routing's estimate: prompt bytes sent here, and of them
    /// those it expected the replica's cache to hold.
    pub(super) expected_hits: Share,
    /// What the engine reported of the requests served here: prompt tokens,
    /// and of them those its prefix cache held.
    pub(super) reported_hits: Share,
    /// The mean gap between tokens of the streams that ended here lately,
    /// in microseconds (f64 bits, 0 before any; see [`Replica::record_itl`]).
    pub(super) itl_mean_us: AtomicF64,
    /// When a stream last ended here, in milliseconds after `born`.
    pub(super) itl_at_ms: AtomicU64,
    /// When this replica last delivered tokens (a first token, or a report
    /// of gaps), in milliseconds after `born`; 0: never.
    pub(super) delivered_at_ms: AtomicU64,
    /// Its time to first token, learned (predicted at dispatch, judged at the first token).
    pub(super) first_token: FirstTokenModel,
}

/// Where requests go: its scheme and authority, and the `Host` they carry.
pub(crate) struct Address {
    /// Scheme + authority, used to build request URIs.
    pub(crate) base: http::Uri,
    /// `Host` as requests to this replica carry it (`base`'s authority),
    /// made once.
    pub(crate) host: Option<HeaderValue>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::FirstTokenModel;

    /// Silent until it has learned; then the step plus the work at the
    /// rate learned: twice the work, twice the time over the step.
    #[test]
    fn the_first_token_model_predicts_the_step_plus_the_work_at_its_rate() {
        let m = FirstTokenModel::default();
        let step = 20_000.0; // 20 ms
                             // 40 ms over the step for 64 KiB, three times.
        for _ in 0..3 {
            assert_eq!(m.predict(64 * 1024, step), None, "nothing predicted before it learned");
            m.learn(64 * 1024, Duration::from_millis(60), step);
        }
        let at = |kib: u64| m.predict(kib * 1024, step).expect("learned").as_secs_f64() * 1000.0;
        assert!((at(64) - 60.0).abs() < 0.01, "{}", at(64));
        assert!((at(128) - 100.0).abs() < 0.01, "{}", at(128));
        assert!((at(0) - 20.0).abs() < 0.01, "no work: the step alone, {}", at(0));
        // A slower replica: it moves toward it.
        for _ in 0..40 {
            m.learn(64 * 1024, Duration::from_millis(120), step);
        }
        assert!((at(64) - 120.0).abs() < 2.0, "{}", at(64));
        // A prompt the cache held (no work) does not blow the rate up.
        m.learn(0, Duration::from_millis(25), step);
        assert!(at(64) < 130.0, "{}", at(64));
    }
}
