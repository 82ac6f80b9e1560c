//! A replica's parts, each a concern of its own: its slots, its health,
//! what it reports, how it is reached, what the learned limit reads, and
//! what routing reads. `Replica` (`replica.rs`) is composed of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;

use super::first_token::{FirstTokenModel, Outlook};
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
    /// Of those holding a slot here, interactive requests in a seat lent of
    /// the fleet's other instances' reserved parts (fleet.md rule 9): the
    /// pool's lent seats are their sum over its replicas, and they are in
    /// `inflight` here already. Only changed through `ReplicaSlot`.
    pub(super) lent: AtomicUsize,
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
    /// The replica's limit for the whole fleet (the smallest any instance
    /// learned, fleet.md rule 4); `usize::MAX` when alone or not yet heard.
    pub(super) fleet_limit: AtomicUsize,
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

    /// The replica's limit for every instance's requests together: the
    /// fleet's (fleet.md rule 4), within this instance's own; its own alone.
    pub(crate) fn shared_limit(&self) -> usize {
        self.max_inflight().min(self.fleet_limit.load(Ordering::Relaxed))
    }

    /// Does this instance share the replica with a fleet (its part of the
    /// slots set by the fleet's word)?
    pub(crate) fn in_fleet(&self) -> bool {
        self.allowance.load(Ordering::Relaxed) != usize::MAX
    }

    /// The fleet's word: this instance may hold `n` requests here, the
    /// others hold `others` (`None`: the instance is alone again).
    pub(crate) fn set_fleet_share(&self, share: Option<(usize, usize)>) {
        let (n, others) = share.unwrap_or((usize::MAX, 0));
        self.allowance.store(n, Ordering::Relaxed);
        self.others_inflight.store(others, Ordering::Relaxed);
        if share.is_none() {
            self.fleet_limit.store(usize::MAX, Ordering::Relaxed);
        }
    }

    /// The fleet's limit for the replica, as this instance last computed it.
    pub(crate) fn set_fleet_limit(&self, limit: usize) {
        self.fleet_limit.store(limit, Ordering::Relaxed);
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
    /// The most requests any scrape saw running inside it (its slots,
    /// once it ran them all); 0 when none said.
    pub(super) most_running: AtomicU64,
    /// Models this replica's `/v1/models` listed (raw model objects).
    pub(crate) models: ArcSwap<Vec<serde_json::Value>>,
    /// The load scrape's rest while nothing is sent here, poked by each dispatch.
    pub(super) scrape: crate::sync::Rest,
    /// Its `/metrics` has llama.cpp's server's names (an `engine: auto`
    /// pool learns so from its load scrape).
    pub(super) llamacpp: AtomicBool,
}

impl Readings {
    /// What the replica runs and queues for all its clients, as last scraped.
    pub(crate) fn scraped_total(&self) -> Option<u64> {
        Some(self.scraped_total.load(Ordering::Relaxed)).filter(|t| *t != u64::MAX)
    }

    pub(crate) fn set_scraped_total(&self, total: Option<f64>) {
        self.scraped_total.store(total.map_or(u64::MAX, |t| t.round() as u64), Ordering::Relaxed);
    }

    /// The most requests any scrape saw running inside it (0: none said).
    pub(crate) fn most_running(&self) -> u64 {
        self.most_running.load(Ordering::Relaxed)
    }

    /// A scrape said `running` requests run inside it.
    pub(crate) fn saw_running(&self, running: f64) {
        self.most_running.fetch_max(running.max(0.0).round() as u64, Ordering::Relaxed);
    }

    /// It failed its checks: it may come back as another engine (restarted
    /// with fewer slots), so the most it was seen running is learned again
    /// from its next scrapes, and until then nothing says its limit reaches
    /// its slots.
    pub(crate) fn forget_running(&self) {
        self.most_running.store(0, Ordering::Relaxed);
    }

    /// Does it run (nearly) as many requests as it was ever seen running,
    /// its slots, as last scraped (what it ran and queued, less what it
    /// queued)? Within a sixteenth: a slot that just freed is refilled at
    /// the engine's next steps. True where its metrics did not say what it
    /// runs: nothing says it has slots free.
    pub(crate) fn runs_its_slots(&self) -> bool {
        let most = self.most_running();
        let Some(total) = self.scraped_total().filter(|_| most > 0) else { return true };
        let now = total.saturating_sub(self.scraped_waiting.load(Ordering::Relaxed));
        now * RUNS_ITS_SLOTS_DIV >= most * (RUNS_ITS_SLOTS_DIV - 1)
    }
}

/// [`Readings::runs_its_slots`]: within one in this many of the most seen.
const RUNS_ITS_SLOTS_DIV: u64 = 16;

/// How it is reached: idle connections, TLS, its key.
pub(crate) struct Connection {
    /// Keep-alive connections not serving a request now.
    pub(crate) idle: conn::IdleConns,
    /// TLS for an `https://` replica.
    pub(super) tls: Option<tls::ReplicaTls>,
    /// `Authorization: Bearer <pools[].api_key_env>`, marked sensitive.
    pub(super) api_key: Option<http::HeaderValue>,
}

impl Connection {
    /// `Authorization` for its requests (`pools[].api_key_env`), if its pool has a key.
    pub(crate) fn authorization(&self) -> Option<&HeaderValue> {
        self.api_key.as_ref()
    }

    /// TLS for an `https://` replica.
    pub(crate) fn tls(&self) -> Option<&tls::ReplicaTls> {
        self.tls.as_ref()
    }

    /// Close the idle connections that have idled too long.
    pub(crate) fn sweep_idle(&self) {
        self.idle.sweep();
    }
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
    /// Its median, tracked alike (see [`Replica::first_token_p50`]).
    pub(super) first_token_p50: AtomicF64,
    /// Requests sent here since the start, and the count and time (ms
    /// after `born`) the controller last looked at it.
    pub(super) dispatched: AtomicU64,
    pub(super) dispatched_seen: AtomicU64,
    pub(super) controlled_at_ms: AtomicU64,
    /// The limit last logged (a move by a quarter or more is logged).
    pub(super) logged_limit: AtomicUsize,
}

/// How far the tracked 90th percentile (and median) of a replica's
/// first-token share moves per sample (in shares of the class target).
pub(super) const QUANTILE_STEP: f64 = 0.02;

/// Move the streaming estimate `est` of quantile `q` toward sample `x`: up
/// by `q` of a step when the sample is above it, down by the rest of one
/// when not, so it rests where a share `1 - q` of the samples is above.
fn track(est: &AtomicF64, x: f64, q: f64) {
    est.update(|e| Some(if x > e { e + QUANTILE_STEP * q } else { (e - QUANTILE_STEP * (1.0 - q)).max(0.0) }));
}

/// What the request path noted for the learned limit over one period.
pub(crate) struct Period {
    /// Interactive first tokens' mean and largest share of their target.
    pub(crate) first_token: Option<f64>,
    pub(crate) first_token_max: Option<f64>,
    /// Requests sent here, and over how many milliseconds.
    pub(crate) sent: u64,
    pub(crate) since_ms: u64,
    /// The most held here (by this instance).
    pub(crate) inflight_peak: usize,
    pub(crate) refused: bool,
}

impl LimitSignals {
    /// A slot was taken: `held` are held now.
    pub(crate) fn taken(&self, held: usize) {
        self.inflight_peak.fetch_max(held, Ordering::Relaxed);
        self.dispatched.fetch_add(1, Ordering::Relaxed);
    }

    /// An interactive first token `after` dispatch, its class's target `target`.
    pub(crate) fn first_token(&self, after: std::time::Duration, target: std::time::Duration) {
        let x = after.as_secs_f64() / target.as_secs_f64().max(1e-6);
        let permille = (x * 1000.0) as u64;
        self.first_token_share.fetch_add(permille, Ordering::Relaxed);
        self.first_token_n.fetch_add(1, Ordering::Relaxed);
        self.first_token_max.fetch_max(permille, Ordering::Relaxed);
        // A streaming quantile: up by 0.9 of a step when a sample is above
        // the estimate, down by 0.1 of one when not, so it rests where one
        // sample in ten is above. O(1), no history; follows a change within
        // tens of samples.
        track(&self.first_token_p90, x, 0.9);
        // The median alike: half a step either way.
        track(&self.first_token_p50, x, 0.5);
    }

    /// The tracked 90th percentile of interactive first tokens' share of their target.
    pub(crate) fn first_token_p90(&self) -> f64 {
        self.first_token_p90.load()
    }

    /// The tracked median of interactive first tokens' share of their target.
    pub(crate) fn first_token_p50(&self) -> f64 {
        self.first_token_p50.load()
    }

    /// The replica refused a request (429 or 503).
    pub(crate) fn note_refused(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }

    /// What was noted since the last period, which ends now (`now_ms`
    /// after the replica was made, `held` its slots held now).
    pub(crate) fn period(&self, now_ms: u64, held: usize) -> Period {
        let n = self.first_token_n.swap(0, Ordering::Relaxed);
        let share = self.first_token_share.swap(0, Ordering::Relaxed);
        let latest = self.first_token_max.swap(0, Ordering::Relaxed);
        let since_ms = now_ms.saturating_sub(self.controlled_at_ms.swap(now_ms, Ordering::Relaxed));
        let sent = self.dispatched.load(Ordering::Relaxed);
        Period {
            first_token: (n > 0).then(|| share as f64 / 1000.0 / n as f64),
            first_token_max: (n > 0).then(|| latest as f64 / 1000.0),
            sent: sent.saturating_sub(self.dispatched_seen.swap(sent, Ordering::Relaxed)),
            since_ms,
            inflight_peak: self.inflight_peak.swap(held, Ordering::Relaxed),
            refused: self.refused.swap(false, Ordering::Relaxed),
        }
    }

    /// The controller, for a moment (a panic elsewhere poisons nothing it holds).
    pub(crate) fn controller(&self) -> std::sync::MutexGuard<'_, limit::Controller> {
        self.controller.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limit moved to `limit`: the one last logged, if it moved by a
    /// quarter or more since (and this one is now the logged one).
    pub(crate) fn moved_from(&self, limit: usize) -> Option<usize> {
        let logged = self.logged_limit.load(Ordering::Relaxed);
        (limit * 4 >= logged * 5 || limit * 4 <= logged * 3).then(|| {
            self.logged_limit.store(limit, Ordering::Relaxed);
            logged
        })
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
    /// What the interactive requests sent here lately ask of it.
    pub(super) outlook: Outlook,
}

/// The share of the interactive target a batch prompt leaves an
/// interactive request sent after it (rule 14): its own prefill and the
/// step are in the prediction; the rest is for what the prediction does
/// not see (a slot to wait for, requests of other gateways, the noise).
const HOLD_AT: f64 = 0.5;

/// How far a replica's mean gap between tokens moves toward each stream's.
pub(super) const ITL_EWMA: f64 = 0.2;
/// A replica's mean gap counts for this long after a stream last reported its gaps.
/// Past it the replica is as one never measured, so one marked slow that
/// no batch stream has measured since gets interactive requests again.
pub(super) const GAPS_FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Its clocks count milliseconds since the replica was made: `age` is that time now.
fn ms(age: std::time::Duration) -> u64 {
    age.as_millis() as u64
}

impl RoutingStats {
    /// Prefix-aware routing sent a prompt of `bytes` here, expecting `matched` of them cached.
    pub(crate) fn routed(&self, bytes: u64, matched: u64, series: Option<(&Counter, &Counter)>) {
        self.expected_hits.add(bytes, matched, series);
    }

    /// The engine reported `prompt` tokens for a request served here, `cached` of them from its prefix cache.
    pub(crate) fn served_prompt(&self, prompt: u64, cached: u64, series: Option<(&Counter, &Counter)>) {
        self.reported_hits.add(prompt, cached, series);
    }

    /// Since the start: the share of the prompt bytes sent here that
    /// prefix-aware routing expected cached, and the share of prompt tokens
    /// the engine reported cached (`None` before any).
    pub(crate) fn hit_ratios(&self) -> (Option<f64>, Option<f64>) {
        (self.expected_hits.ratio(), self.reported_hits.ratio())
    }

    /// A stream's mean gap `mean_us` reported at `age`: the replica's mean
    /// moves toward it (or starts from it, once forgotten).
    pub(crate) fn record_itl(&self, mean_us: f64, age: std::time::Duration) {
        let fresh = self.itl_mean(age).is_zero();
        self.itl_mean_us.update(|m| Some(if fresh || m == 0.0 { mean_us } else { m + (mean_us - m) * ITL_EWMA }));
        self.itl_at_ms.store(ms(age), Ordering::Relaxed);
        self.delivered(age);
    }

    /// Tokens came from the replica at `age`.
    pub(crate) fn delivered(&self, age: std::time::Duration) {
        self.delivered_at_ms.store(ms(age).max(1), Ordering::Relaxed);
    }

    /// Did it deliver tokens within `window` before `age`?
    pub(crate) fn delivered_within(&self, window: std::time::Duration, age: std::time::Duration) -> bool {
        let at = self.delivered_at_ms.load(Ordering::Relaxed);
        at > 0 && age.saturating_sub(std::time::Duration::from_millis(at)) <= window
    }

    /// The mean gap at `age`: zero before any, and once none was reported
    /// for [`GAPS_FORGOTTEN_AFTER`].
    pub(crate) fn itl_mean(&self, age: std::time::Duration) -> std::time::Duration {
        let since = age.saturating_sub(std::time::Duration::from_millis(self.itl_at_ms.load(Ordering::Relaxed)));
        if since > GAPS_FORGOTTEN_AFTER {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_secs_f64(self.itl_mean_us.load() / 1e6)
    }

    /// The first token predicted for `work` bytes of prefill, at `age`.
    pub(crate) fn predict_first_token(&self, work: u64, age: std::time::Duration) -> Option<std::time::Duration> {
        self.first_token.predict(work, self.itl_mean(age).as_secs_f64() * 1e6)
    }

    /// A first token `took` after dispatch for `work` bytes of prefill, at `age`: learned.
    pub(crate) fn learn_first_token(&self, work: u64, took: std::time::Duration, age: std::time::Duration) {
        self.first_token.learn(work, took, self.itl_mean(age).as_secs_f64() * 1e6);
    }

    /// Would a batch prompt of `work` bytes sent here at `age`, with
    /// `ahead` bytes of prefill already ahead of it, leave an interactive
    /// request sent right after it its first token within `HOLD_AT` of its
    /// target (the outlook's)? True where no interactive request came
    /// lately or nothing is predicted yet (docs/design/preemption.md, rule 14).
    pub(crate) fn leaves_interactive_time(&self, ahead: u64, work: u64, age: std::time::Duration) -> bool {
        let Some((target, theirs)) = self.outlook.get(age) else { return true };
        self.predict_first_token(ahead + work + theirs, age).is_none_or(|p| p <= target.mul_f64(HOLD_AT))
    }
}

/// Where requests go: its scheme and authority, and the `Host` they carry.
pub(crate) struct Address {
    /// Scheme + authority, used to build request URIs.
    pub(crate) base: http::Uri,
    /// `Host` as requests to this replica carry it (`base`'s authority),
    /// made once.
    pub(crate) host: Option<HeaderValue>,
}
