//! Upstream pools: replicas, their health, their connections, and which one
//! serves a request.
//!
//! This room offers replicas and their slots and knows nothing of who asks:
//! [`Pool::pick`] takes a slot on a healthy replica ([`ReplicaSlot`]), and
//! dropping the slot gives it back. Nothing here calls back into admission;
//! admission wraps a slot in its lease and decides who gets the next one.

pub(crate) mod conn;
pub(crate) mod health;
pub(crate) mod limit;
pub(crate) mod tls;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderValue;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::{Balance, InflightLimit, PoolConfig, Tier};
use crate::error::GatewayError;
use crate::telemetry::metrics::{Metrics, ReplicaLabels};

/// One upstream vLLM server.
pub(crate) struct Replica {
    /// Base URL as configured, e.g. `http://127.0.0.1:8000`.
    pub(crate) url: String,
    /// `replicas[].name`, when the config gives one.
    name: Option<String>,
    /// What clients are shown (`x-slogate-replica`, error bodies): the name,
    /// else `<pool>-<position>`, set when a pool with it is built.
    public: ArcSwap<HeaderValue>,
    /// Scheme + authority, used to build request URIs.
    pub(crate) base: http::Uri,
    /// Requests holding a slot here. Invariant: only changed through [`ReplicaSlot`].
    inflight: AtomicUsize,
    /// Of those, the ones without a first token yet, by tier (interactive,
    /// batch): the prefills a request sent here now would wait behind.
    /// Only changed through [`ReplicaSlot`].
    prefilling: [AtomicUsize; 2],
    /// Batch requests holding a slot here. Only changed through [`ReplicaSlot`].
    batch_held: AtomicUsize,
    /// Seats of the limit batch leaves to interactive requests here (the
    /// learned limit's answer to their first tokens coming late under load).
    batch_cut: AtomicUsize,
    /// Slots; set when a config goes live (a reload resizes it in place:
    /// slots above a lowered limit drain, and no new one is taken until the
    /// count is under it).
    max_inflight: AtomicUsize,
    healthy: AtomicBool,
    /// This instance's part of the slots when other instances share the
    /// replica (`fleet`); `usize::MAX` when it is alone.
    allowance: AtomicUsize,
    /// Requests other instances of the fleet hold here (or are assumed to,
    /// for peers not heard lately), as the fleet last published it.
    others_inflight: AtomicUsize,
    /// What the replica runs and queues, as last scraped (all its clients);
    /// `u64::MAX` when the last scrape failed or none was made.
    scraped_total: AtomicU64,
    /// Requests waiting inside vLLM, as last scraped from its `/metrics`
    /// (includes other clients' requests); 0 when not scraped.
    pub(crate) scraped_waiting: AtomicU64,
    /// Models this replica's `/v1/models` listed (raw model objects).
    pub(crate) models: ArcSwap<Vec<serde_json::Value>>,
    inflight_gauge: Gauge,
    healthy_gauge: Gauge,
    /// Keep-alive connections not serving a request now.
    pub(crate) idle: conn::IdleConns,
    /// TLS for an `https://` replica.
    tls: Option<tls::ReplicaTls>,
    /// `Authorization: Bearer <pools[].api_key_env>`, marked sensitive.
    api_key: Option<http::HeaderValue>,
    /// Why the last health check failed (none after one passed).
    health_error: ArcSwap<Option<String>>,
    /// The learned limit (`max_inflight_per_replica: auto`), kept across reloads.
    controller: std::sync::Mutex<limit::Controller>,
    /// The most requests held here since the controller last looked.
    inflight_peak: AtomicUsize,
    /// The replica answered 429 or 503 since the controller last looked.
    refused: AtomicBool,
    /// Interactive requests' dispatch-to-first-token time over their class
    /// target since the controller last looked: sum (in thousandths) and count.
    first_token_share: AtomicU64,
    first_token_n: AtomicU64,
    /// The largest share since the controller last looked (thousandths).
    first_token_max: AtomicU64,
    /// The 90th percentile of that share, tracked (f64 bits; see [`Replica::first_token_p90`]).
    first_token_p90: AtomicU64,
    /// The mean gap between tokens of the streams that ended here lately,
    /// in microseconds (f64 bits, 0 before any; see [`Replica::record_itl`]).
    itl_mean_us: AtomicU64,
    /// When a stream last ended here, in milliseconds after `born`.
    itl_at_ms: AtomicU64,
    /// Requests sent here since the start, and the count and time (ms
    /// after `born`) the controller last looked at it.
    dispatched: AtomicU64,
    dispatched_seen: AtomicU64,
    controlled_at_ms: AtomicU64,
    born: tokio::time::Instant,
    /// `slogate_replica_limit{pool,replica}`.
    limit_gauge: Gauge,
    /// `slogate_replica_batch_cut{pool,replica}`.
    batch_cut_gauge: Gauge,
    /// The limit last logged (a move by a quarter or more is logged).
    logged_limit: AtomicUsize,
}

/// How far the tracked 90th percentile of a replica's first-token share
/// moves per sample (in shares of the class target).
const P90_STEP: f64 = 0.02;
/// How far a replica's mean gap between tokens moves toward each stream's.
const ITL_EWMA: f64 = 0.2;
/// A replica whose streams' mean gap is more than this many times the
/// fastest healthy replica's is slow: interactive requests wait for the others.
const SLOW_GAPS: f64 = 1.5;
/// A replica's mean gap counts for this long after a stream last reported its gaps.
/// Past it the replica is as one never measured, so one marked slow that
/// no batch stream has measured since gets interactive requests again.
const GAPS_FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

impl Replica {
    /// How metrics, traces and the status page label it: its name, else its URL.
    pub(crate) fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.url)
    }

    /// What clients are shown: its name, else `<pool>-<position>`; never the URL.
    pub(crate) fn public_name(&self) -> HeaderValue {
        (**self.public.load()).clone()
    }

    /// [`public_name`](Replica::public_name) as text.
    fn shown(&self) -> String {
        String::from_utf8_lossy(self.public_name().as_bytes()).into_owned()
    }

    fn failed(&self, e: conn::SendError) -> GatewayError {
        GatewayError::Upstream { replica: self.shown(), detail: e.public_message(), url: self.url.clone(), source: Box::new(e) }
    }

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
    fn prefills_ahead(&self, tier: Tier, upstream_priority: bool) -> usize {
        match tier {
            Tier::Interactive if upstream_priority => self.prefilling(Tier::Interactive),
            _ => self.prefilling(Tier::Interactive) + self.prefilling(Tier::Batch),
        }
    }
    /// The replica's limit: learned, or fixed (for the whole fleet when
    /// several instances share it).
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
    /// What the replica runs and queues for all its clients, as last scraped.
    pub(crate) fn scraped_total(&self) -> Option<u64> {
        Some(self.scraped_total.load(Ordering::Relaxed)).filter(|t| *t != u64::MAX)
    }
    pub(crate) fn set_scraped_total(&self, total: Option<f64>) {
        self.scraped_total.store(total.map_or(u64::MAX, |t| t.round() as u64), Ordering::Relaxed);
    }
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
    pub(crate) fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Relaxed);
        self.healthy_gauge.set(up as i64);
    }

    /// Why the replica is not healthy, as its last failed check said.
    pub(crate) fn health_error(&self) -> Option<String> {
        (**self.health_error.load()).clone()
    }
    pub(crate) fn set_health_error(&self, reason: Option<String>) {
        self.health_error.store(Arc::new(reason));
    }

    /// Show this replica's health on its gauge (a replica that just joined:
    /// unhealthy until its first check passes).
    pub(crate) fn publish_health(&self) {
        self.healthy_gauge.set(self.is_healthy() as i64);
    }

    /// Take a slot for a request of `tier` if one is free (`over`: that
    /// many above the slot count). An interactive request may also take a
    /// seat of the replica's limit that no instance of the fleet holds,
    /// beyond this instance's part: parts follow demand a period late, and
    /// an interactive request should not wait while a seat on the replica
    /// stands free because it was another instance's part. A batch request
    /// leaves the batch cut free (this instance's part of it in a fleet).
    fn try_take(&self, over: usize, tier: Tier) -> bool {
        let mut cur = self.inflight.load(Ordering::SeqCst);
        let mut max = self.slots() + over;
        match tier {
            Tier::Interactive => max = max.max(self.max_inflight().saturating_sub(self.others_inflight.load(Ordering::Relaxed))),
            Tier::Batch => {
                let (slots, limit) = (self.slots(), self.max_inflight());
                let cut = self.batch_cut.load(Ordering::Relaxed);
                if cut > 0 && limit > 0 {
                    max = max.min(slots.saturating_sub((cut * slots).div_ceil(limit)));
                }
            }
        }
        loop {
            if cur >= max {
                return false;
            }
            match self.inflight.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    self.inflight_gauge.inc();
                    self.inflight_peak.fetch_max(cur + 1, Ordering::Relaxed);
                    self.dispatched.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// An interactive request sent here got its first token `after` its
    /// dispatch; its class's TTFT target is `target`.
    pub(crate) fn record_first_token(&self, after: std::time::Duration, target: std::time::Duration) {
        let permille = (after.as_secs_f64() / target.as_secs_f64().max(1e-6) * 1000.0) as u64;
        self.first_token_share.fetch_add(permille, Ordering::Relaxed);
        self.first_token_n.fetch_add(1, Ordering::Relaxed);
        self.first_token_max.fetch_max(permille, Ordering::Relaxed);
        // A streaming quantile: up by 0.9 of a step when a sample is above
        // the estimate, down by 0.1 of one when not, so it rests where one
        // sample in ten is above. O(1), no history; follows a change within
        // tens of samples.
        let x = after.as_secs_f64() / target.as_secs_f64().max(1e-6);
        let _ = self.first_token_p90.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            let q = f64::from_bits(bits);
            let next = if x > q { q + P90_STEP * 0.9 } else { (q - P90_STEP * 0.1).max(0.0) };
            Some(next.to_bits())
        });
    }

    /// A stream of any class here had `gaps` gaps between its tokens over
    /// `span` (reported every few gaps, and at its end). The replica's mean
    /// gap moves a fifth of the way to this report's: it follows a replica
    /// that slows down (or recovers) within a second or so. Every class counts: a
    /// replica's step time is the same for all its streams, so batch keeps
    /// it measured while interactive requests go elsewhere.
    pub(crate) fn record_itl(&self, span: std::time::Duration, gaps: u64) {
        if gaps == 0 {
            return;
        }
        let mean = span.as_secs_f64() * 1e6 / gaps as f64;
        // A mean already forgotten starts again from this stream.
        let fresh = self.itl_mean().is_zero();
        let _ = self.itl_mean_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            let m = f64::from_bits(bits);
            Some(if fresh || m == 0.0 { mean } else { m + (mean - m) * ITL_EWMA }.to_bits())
        });
        self.itl_at_ms.store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// The mean gap between tokens of the streams that ended here lately
    /// (zero before any, and once none has ended for [`GAPS_FORGOTTEN_AFTER`]).
    pub(crate) fn itl_mean(&self) -> std::time::Duration {
        let since = self.born.elapsed().saturating_sub(std::time::Duration::from_millis(self.itl_at_ms.load(Ordering::Relaxed)));
        if since > GAPS_FORGOTTEN_AFTER {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_secs_f64(f64::from_bits(self.itl_mean_us.load(Ordering::Relaxed)) / 1e6)
    }

    /// Interactive requests' time from dispatch to first token over their
    /// class's target: its recent 90th percentile (0 before any).
    pub(crate) fn first_token_p90(&self) -> f64 {
        f64::from_bits(self.first_token_p90.load(Ordering::Relaxed))
    }

    /// The replica refused a request (429 or 503).
    pub(crate) fn note_refused(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }

    /// As if the controller had moved the limit to `n`.
    #[cfg(test)]
    pub(crate) fn set_limit(&self, n: usize) {
        self.set_max_inflight(n);
    }

    /// Set the slot count (a fixed limit, or the controller's).
    fn set_max_inflight(&self, n: usize) {
        self.max_inflight.store(n, Ordering::Relaxed);
        self.limit_gauge.set(n as i64);
    }

    /// One period of the learned limit: the replica's load as scraped, and
    /// what the request path noted since the last period.
    /// `demand`: requests wait in the gateway for the pool's slots.
    pub(crate) fn control(&self, pool: &str, load: Load, demand: bool) {
        let n = self.first_token_n.swap(0, Ordering::Relaxed);
        let share = self.first_token_share.swap(0, Ordering::Relaxed);
        let latest = self.first_token_max.swap(0, Ordering::Relaxed);
        // In a fleet the limit is the replica's, for every instance's requests.
        let others = self.others_inflight.load(Ordering::Relaxed);
        // Requests sent in the time of one engine step (the mean gap between
        // tokens): about that many wait in the replica's queue between their
        // arrival and its next step, at any load.
        let now_ms = self.born.elapsed().as_millis() as u64;
        let since = now_ms.saturating_sub(self.controlled_at_ms.swap(now_ms, Ordering::Relaxed));
        let sent = self.dispatched.load(Ordering::Relaxed);
        let sent = sent.saturating_sub(self.dispatched_seen.swap(sent, Ordering::Relaxed));
        let mut in_transit = if since > 0 { sent as f64 * 1000.0 / since as f64 * self.itl_mean().as_secs_f64() } else { 0.0 };
        // In a fleet the others send too, about in proportion to what they hold here.
        let mine = self.inflight();
        if mine > 0 {
            in_transit *= (mine + others) as f64 / mine as f64;
        }
        let sample = limit::Sample {
            waiting: load.waiting,
            running: load.running,
            inflight_peak: self.inflight_peak.swap(self.inflight(), Ordering::Relaxed) + others,
            inflight_now: self.inflight() + others,
            demand,
            refused: self.refused.swap(false, Ordering::Relaxed),
            first_token: (n > 0).then(|| share as f64 / 1000.0 / n as f64),
            first_token_max: (n > 0).then(|| latest as f64 / 1000.0),
            in_transit,
            batch_now: self.batch_held.load(Ordering::Relaxed),
        };
        let (limit, cut) = {
            let mut c = self.controller.lock().unwrap_or_else(|p| p.into_inner());
            let limit = c.update(sample);
            (limit, c.batch_cut())
        };
        let was = self.batch_cut.swap(cut, Ordering::Relaxed);
        self.batch_cut_gauge.set(cut as i64);
        self.set_max_inflight(limit);
        if was == 0 && cut > 0 {
            tracing::info!(pool, replica = %self.label(), limit, batch_cut = cut, "interactive first tokens late under load: batch leaves seats to interactive here");
        }
        let logged = self.logged_limit.load(Ordering::Relaxed);
        if limit * 4 >= logged * 5 || limit * 4 <= logged * 3 {
            self.logged_limit.store(limit, Ordering::Relaxed);
            tracing::info!(pool, replica = %self.label(), from = logged, to = limit, waiting = ?sample.waiting, refused = sample.refused, "learned in-flight limit moved");
        }
    }

    fn load_score(&self) -> u64 {
        self.inflight() as u64 + self.scraped_waiting.load(Ordering::Relaxed)
    }
}

/// What a replica said of its load (its `/metrics`); `None` where it did not say.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    pub(crate) waiting: Option<f64>,
    pub(crate) running: Option<f64>,
}

/// A held slot on one replica: taken by [`Pool::pick`], given back exactly
/// once, when dropped or [released](ReplicaSlot::release) (whichever comes
/// first).
pub(crate) struct ReplicaSlot {
    replica: Arc<Replica>,
    held: bool,
    tier: Tier,
    /// Counted in the replica's `prefilling` of its tier until the first
    /// token arrives or the slot is given back.
    prefilling: bool,
}

impl ReplicaSlot {
    pub(crate) fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    fn new(replica: &Arc<Replica>, tier: Tier) -> ReplicaSlot {
        replica.prefilling[tier as usize].fetch_add(1, Ordering::Relaxed);
        if tier == Tier::Batch {
            replica.batch_held.fetch_add(1, Ordering::Relaxed);
        }
        ReplicaSlot { replica: replica.clone(), held: true, tier, prefilling: true }
    }

    /// The request's first token arrived: its prefill is done (a no-op after the first call).
    pub(crate) fn prefilled(&mut self) {
        if std::mem::take(&mut self.prefilling) {
            self.replica.prefilling[self.tier as usize].fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Give the slot back now (a no-op the second time).
    pub(crate) fn release(&mut self) {
        self.prefilled();
        if std::mem::take(&mut self.held) {
            self.replica.inflight.fetch_sub(1, Ordering::SeqCst);
            self.replica.inflight_gauge.dec();
            if self.tier == Tier::Batch {
                self.replica.batch_held.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for ReplicaSlot {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for ReplicaSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSlot").field("replica", &self.replica.url).field("held", &self.held).finish()
    }
}

/// What [`Pool::pick`] allows beyond a replica's free slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// An interactive request may go this many above the pool's slots
    /// (spread over its healthy replicas).
    Over(usize),
    /// A batch request leaves this many slots to interactive requests on the
    /// replicas they can use (applied while a replica is slow; otherwise the
    /// batch limit does it).
    Leave(usize),
}

/// Why no slot could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PickError {
    /// No replica of the pool is healthy.
    NoHealthy,
    /// Healthy replicas exist, but every slot is taken.
    Saturated,
}

/// Why a pool could not be built; names the part of `pools[i]`.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("replicas[{replica}]: {message}")]
    ReplicaUrl { replica: usize, message: String },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("api_key_env: environment variable {var} is not set, or holds characters a header cannot carry")]
    ApiKey { var: String },
}

/// How a pool's replicas are reached, checked before anything is built:
/// their URLs, TLS (files read, names checked) and API key (read from its
/// environment variable).
pub(crate) struct Access {
    bases: Vec<http::Uri>,
    tls: Vec<Option<tls::ReplicaTls>>,
    api_key: Option<http::HeaderValue>,
}

impl Access {
    pub(crate) fn new(config: &PoolConfig) -> Result<Access, PoolError> {
        let bases = config
            .replicas
            .iter()
            .enumerate()
            .map(|(replica, u)| crate::config::parse_replica_url(&u.url).map_err(|message| PoolError::ReplicaUrl { replica, message }))
            .collect::<Result<Vec<_>, _>>()?;
        let client_tls = tls::client_config(config)?;
        let server_name = config.tls.as_ref().and_then(|t| t.server_name.as_deref());
        let tls = bases.iter().map(|b| tls::for_replica(b, client_tls.as_ref(), server_name)).collect::<Result<Vec<_>, _>>()?;
        let api_key = match &config.api_key_env {
            None => None,
            Some(var) => {
                let key = std::env::var(var).ok().filter(|k| !k.is_empty());
                let mut value = key
                    .and_then(|k| http::HeaderValue::from_str(&format!("Bearer {k}")).ok())
                    .ok_or_else(|| PoolError::ApiKey { var: var.clone() })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Access { bases, tls, api_key })
    }
}

/// What clients see of replica `i` of pool `pool`: its name, else
/// `<pool>-<i + 1>`.
fn public_name(pool: &str, i: usize, name: Option<&str>) -> HeaderValue {
    let shown = match name {
        Some(n) => n.to_string(),
        None => format!("{pool}-{}", i + 1),
    };
    HeaderValue::from_str(&shown).unwrap_or_else(|_| HeaderValue::from(i + 1))
}

/// A named set of replicas serving some models.
pub(crate) struct Pool {
    pub(crate) config: PoolConfig,
    /// The learned limits' parameters (used with `max_inflight_per_replica: auto`).
    limit_params: limit::LimitParams,
    pub(crate) replicas: Vec<Arc<Replica>>,
    /// Models named in the config (without `auto`).
    pub(crate) static_models: HashSet<String>,
    pub(crate) auto: bool,
    rr: AtomicUsize,
    /// Requests waiting in the gateway for this pool's slots, as admission
    /// last published it (its ticks).
    waiting: AtomicUsize,
    /// Requests waiting in the fleet's other instances, as the fleet last published it.
    others_waiting: AtomicUsize,
}

impl Pool {
    /// Admission's tick: `n` requests wait for this pool's slots.
    pub(crate) fn set_waiting(&self, n: usize) {
        self.waiting.store(n, Ordering::Relaxed);
    }

    /// Requests waited for this pool's slots at admission's last tick.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The fleet's tick: the other instances have `n` requests waiting.
    pub(crate) fn set_others_waiting(&self, n: usize) {
        self.others_waiting.store(n, Ordering::Relaxed);
    }

    /// Requests waiting for this pool's replicas in the whole fleet.
    pub(crate) fn fleet_waiting(&self) -> usize {
        self.waiting() + self.others_waiting.load(Ordering::Relaxed)
    }

    /// Build a pool from what [`Access::new`] checked. With `previous`
    /// (the pool of the same name before a reload), replicas with the same
    /// URL, TLS and key are kept as they are (health, in-flight count,
    /// discovered models, open connections), wherever they are in the list;
    /// a new slot count reaches them when the pool goes live
    /// ([`Pool::activate`]), not before.
    pub(crate) fn new(config: PoolConfig, access: Access, metrics: &Metrics, previous: Option<&Pool>) -> Pool {
        let Access { bases, tls: replica_tls, api_key } = access;
        let l = config.learned_limit;
        let limit_params = limit::LimitParams { initial: l.initial as usize, min: l.min as usize, max: l.max as usize };
        let initial = match config.max_inflight_per_replica {
            InflightLimit::Fixed(n) => n as usize,
            InflightLimit::Auto => limit_params.initial,
        };
        let same_access = previous.is_some_and(|p| p.config.tls == config.tls && p.config.api_key_env == config.api_key_env);
        let mut replicas = Vec::with_capacity(config.replicas.len());
        for (i, ((rc, base), tls)) in config.replicas.iter().zip(bases).zip(replica_tls).enumerate() {
            let url = rc.url.trim().trim_end_matches('/');
            let public = public_name(&config.name, i, rc.name.as_deref());
            let kept = previous
                .filter(|_| same_access)
                .and_then(|p| p.replicas.iter().find(|r| r.url == url && r.name.as_deref() == rc.name.as_deref()));
            if let Some(r) = kept {
                r.public.store(Arc::new(public));
                replicas.push(r.clone());
                continue;
            }
            let labels = ReplicaLabels { pool: config.name.clone(), replica: rc.name.as_deref().unwrap_or(url).to_string() };
            let inflight_gauge = metrics.inflight.get_or_create(&labels).clone();
            let healthy_gauge = metrics.upstream_healthy.get_or_create(&labels).clone();
            let limit_gauge = metrics.replica_limit.get_or_create(&labels).clone();
            let batch_cut_gauge = metrics.replica_batch_cut.get_or_create(&labels).clone();
            replicas.push(Arc::new(Replica {
                url: url.to_string(),
                name: rc.name.clone(),
                public: ArcSwap::from_pointee(public),
                base,
                inflight: AtomicUsize::new(0),
                prefilling: [AtomicUsize::new(0), AtomicUsize::new(0)],
                batch_held: AtomicUsize::new(0),
                batch_cut: AtomicUsize::new(0),
                max_inflight: AtomicUsize::new(initial),
                healthy: AtomicBool::new(false),
                allowance: AtomicUsize::new(usize::MAX),
                others_inflight: AtomicUsize::new(0),
                scraped_total: AtomicU64::new(u64::MAX),
                scraped_waiting: AtomicU64::new(0),
                models: ArcSwap::from_pointee(Vec::new()),
                inflight_gauge,
                healthy_gauge,
                idle: conn::IdleConns::default(),
                tls,
                api_key: api_key.clone(),
                health_error: ArcSwap::from_pointee(None),
                controller: std::sync::Mutex::new(limit::Controller::new(limit_params)),
                inflight_peak: AtomicUsize::new(0),
                refused: AtomicBool::new(false),
                first_token_share: AtomicU64::new(0),
                first_token_n: AtomicU64::new(0),
                first_token_max: AtomicU64::new(0),
                first_token_p90: AtomicU64::new(0f64.to_bits()),
                itl_mean_us: AtomicU64::new(0f64.to_bits()),
                itl_at_ms: AtomicU64::new(0),
                dispatched: AtomicU64::new(0),
                dispatched_seen: AtomicU64::new(0),
                controlled_at_ms: AtomicU64::new(0),
                born: tokio::time::Instant::now(),
                limit_gauge,
                batch_cut_gauge,
                logged_limit: AtomicUsize::new(initial),
            }));
        }
        let static_models = config.models.iter().filter(|m| *m != "auto").cloned().collect();
        let auto = config.models.iter().any(|m| m == "auto");
        Pool {
            replicas,
            static_models,
            auto,
            config,
            limit_params,
            rr: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            others_waiting: AtomicUsize::new(0),
        }
    }

    /// Does this pool serve `model`?
    pub(crate) fn serves(&self, model: &str) -> bool {
        self.static_models.contains(model)
            || (self.auto
                && self.replicas.iter().any(|r| r.models.load().iter().any(|m| m.get("id").and_then(|v| v.as_str()) == Some(model))))
    }

    /// Model objects for `/v1/models`: discovered ones as the replicas gave
    /// them, static ones synthesised.
    pub(crate) fn model_objects(&self) -> Vec<serde_json::Value> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for m in &self.config.models {
            if m != "auto" && seen.insert(m.clone()) {
                out.push(serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "slogate"}));
            }
        }
        if self.auto {
            for r in &self.replicas {
                for m in r.models.load().iter() {
                    if let Some(id) = m.get("id").and_then(|v| v.as_str()) {
                        if seen.insert(id.to_string()) {
                            out.push(m.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// This pool went live (a start or a reload's swap): its replicas take
    /// its slot count (a fixed one, or their learned one under this pool's
    /// bounds), and their gauges say what they are.
    pub(crate) fn activate(&self) {
        for r in &self.replicas {
            let n = match self.config.max_inflight_per_replica {
                InflightLimit::Fixed(n) => n as usize,
                InflightLimit::Auto => {
                    let mut c = r.controller.lock().unwrap_or_else(|p| p.into_inner());
                    c.set_params(self.limit_params);
                    c.limit()
                }
            };
            r.set_max_inflight(n);
            r.publish_health();
        }
    }

    /// Are this pool's limits learned?
    pub(crate) fn learns_limits(&self) -> bool {
        self.config.max_inflight_per_replica == InflightLimit::Auto
    }

    /// The recent 90th percentile of interactive requests' dispatch-to-first-token
    /// time over their class's target, across the healthy replicas (their mean).
    pub(crate) fn first_token_p90(&self) -> f64 {
        let (sum, n) = self.replicas.iter().filter(|r| r.is_healthy()).fold((0.0, 0usize), |(s, n), r| (s + r.first_token_p90(), n + 1));
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }

    pub(crate) fn healthy_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).count()
    }

    /// This instance's slots on healthy replicas.
    pub(crate) fn capacity(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.slots()).sum()
    }

    /// Pick a healthy replica with a free slot for a request of `tier`,
    /// skipping `exclude`, and take the slot; `room`: how far an interactive
    /// request may go above the slots, or what a batch request leaves free.
    ///
    /// `least_loaded` ranks replicas first by the prefills the request would
    /// wait behind (requests sent there without a first token yet; see
    /// [`Replica::prefills_ahead`]), then by in-flight plus vLLM's waiting
    /// queue. Time to first token is mostly the prefill work ahead of a
    /// request, not how many streams decode beside it: two replicas with the
    /// same in-flight count differ by whole steps in what a new request
    /// waits if one is in the middle of a burst of prefills.
    pub(crate) fn pick(&self, exclude: Option<&Arc<Replica>>, room: Room, tier: Tier) -> Result<ReplicaSlot, PickError> {
        let (over, reserved) = match room {
            Room::Over(over) => (over.div_ceil(self.healthy_count().max(1)), 0),
            Room::Leave(reserved) => (0, reserved),
        };
        let n = self.replicas.len();
        let start = self.rr.fetch_add(1, Ordering::Relaxed);
        let mut any_healthy = false;
        let candidates = (0..n).map(|i| &self.replicas[(start + i) % n]).filter(|r| {
            let ok = r.is_healthy() && exclude.is_none_or(|e| !Arc::ptr_eq(e, r));
            any_healthy |= ok;
            ok
        });
        match self.config.balance {
            Balance::RoundRobin => {
                for r in candidates {
                    if r.try_take(over, tier) {
                        return Ok(ReplicaSlot::new(r, tier));
                    }
                }
            }
            Balance::LeastLoaded => {
                // Each replica's rank read once: other requests move the
                // counts while this one sorts, and a key that changes
                // between comparisons is not an order (the sort panics on
                // that). Stable sort keeps the rotating start as the tie-breaker.
                let priority = self.config.upstream_priority;
                let mut ranked: Vec<_> =
                    candidates.map(|r| ((false, r.prefills_ahead(tier, priority), r.load_score()), r.itl_mean(), r)).collect();
                // A replica is slow while its streams' mean gap is more than
                // SLOW_GAPS times the fastest healthy one's. Interactive goes
                // only to the others (on a slow one it would miss its ITL
                // whatever it waited: better to wait for a slot where it
                // will not); batch goes to a slow one first.
                let fastest = ranked.iter().map(|(_, m, _)| *m).filter(|m| !m.is_zero()).min();
                let (mut any_slow, mut fast_slots, mut fast_batch) = (false, 0, 0);
                for (rank, m, r) in &mut ranked {
                    let slow = fastest.is_some_and(|f| *m > f.mul_f64(SLOW_GAPS));
                    rank.0 = slow == (tier == Tier::Interactive);
                    any_slow |= slow;
                    if !slow {
                        fast_slots += r.slots();
                        fast_batch += r.batch_held.load(Ordering::Relaxed);
                    }
                }
                // While a replica is slow, interactive requests can use only
                // the others: the seats reserved for them must be there. Batch
                // takes a seat on those only while it leaves `reserved` of
                // their slots to interactive (the slow ones are its own).
                let batch_may_take_fast = !any_slow || fast_batch + reserved < fast_slots;
                ranked.sort_by_key(|(rank, ..)| *rank);
                for ((away, ..), _, r) in ranked {
                    if away && tier == Tier::Interactive {
                        break;
                    }
                    // (For batch the replicas ranked away are the fast ones.)
                    if away && tier == Tier::Batch && !batch_may_take_fast {
                        break;
                    }
                    if r.try_take(over, tier) {
                        return Ok(ReplicaSlot::new(r, tier));
                    }
                }
            }
        }
        Err(if any_healthy { PickError::Saturated } else { PickError::NoHealthy })
    }
}

/// What a request's attempts are made on: the replica its slot is on now,
/// and a way to move the slot to another healthy replica for a retry.
/// Admission's lease implements it; this room never sees the lease.
pub(crate) trait Attempts {
    fn replica(&self) -> &Arc<Replica>;
    /// Move to a slot on another healthy replica; false when there is none.
    fn move_to_another(&mut self) -> bool;
}

/// Send a request to the replica `on` holds a slot on, retrying once on
/// another healthy replica when the request never reached it (connecting,
/// TLS or the HTTP handshake failed) or when it answered 5xx before any byte
/// reached the client (it refused the work). A request written to a replica
/// that then failed without answering is not sent again: the replica may be
/// generating it, and a second one would generate it twice. `request` builds the
/// request for a replica; the response headers must arrive by `deadline`
/// (`start` is when the gateway got the request, for the error message).
pub(crate) async fn send_with_retry<A: Attempts>(
    pool: &Pool,
    on: &mut A,
    request: impl Fn(&Replica) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, GatewayError>,
    start: tokio::time::Instant,
    deadline: tokio::time::Instant,
) -> Result<http::Response<conn::UpstreamBody>, GatewayError> {
    let connect_timeout = pool.config.timeouts.connect.get();
    let mut retried = false;
    loop {
        let replica = on.replica().clone();
        let req = request(&replica)?;
        let sent = tokio::time::timeout_at(deadline, conn::send(&replica, req, connect_timeout)).await;
        if let Ok(Ok(resp)) = &sent {
            if matches!(resp.status(), http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE) {
                // The learned limit backs off from a replica that refuses work.
                replica.note_refused();
            }
        }
        let failure = match sent {
            Err(_) => return Err(GatewayError::UpstreamTimeout { replica: replica.shown(), after: crate::config::Dur(deadline - start) }),
            Ok(Ok(resp)) if resp.status().is_server_error() && !retried => {
                if !on.move_to_another() {
                    return Ok(resp);
                }
                tracing::info!(replica = %replica.url, status = %resp.status(), "replica answered 5xx before any byte was sent; retrying on another replica");
                retried = true;
                continue;
            }
            Ok(Ok(resp)) => return Ok(resp),
            Ok(Err(e)) if e.was_sent() => return Err(replica.failed(e)),
            Ok(Err(e)) => replica.failed(e),
        };
        if retried || !on.move_to_another() {
            return Err(failure);
        }
        tracing::info!(error = %failure.for_log(), "retrying on another replica");
        retried = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Two healthy replicas (nothing listens) with `slots` each, least loaded.
    fn two(slots: u32, upstream_priority: bool) -> Pool {
        let cfg = PoolConfig {
            replicas: vec!["http://127.0.0.1:9".into(), "http://127.0.0.1:10".into()],
            max_inflight_per_replica: InflightLimit::Fixed(slots),
            balance: Balance::LeastLoaded,
            upstream_priority,
            ..PoolConfig::default()
        };
        let metrics = Metrics::new(&Config::default());
        let access = Access::new(&cfg).expect("access");
        let pool = Pool::new(cfg, access, &metrics, None);
        for r in &pool.replicas {
            r.set_healthy(true);
        }
        pool
    }

    fn on(slot: &ReplicaSlot) -> &str {
        &slot.replica().url
    }

    #[tokio::test(start_paused = true)]
    async fn interactive_waits_for_a_replica_whose_gaps_are_not_slow_and_batch_goes_to_the_slow_one() {
        use std::time::Duration;
        let pool = two(2, false);
        let (slow, fast) = (&pool.replicas[0], &pool.replicas[1]);
        // Before any stream ended, nothing changes the order.
        let picks: Vec<String> =
            (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).to_string()).collect();
        assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "no gaps measured yet: {picks:?}");
        // Streams of 100 gaps: 90 ms apart on one replica, 40 ms on the other (more than 1.5x).
        slow.record_itl(Duration::from_millis(9000), 100);
        fast.record_itl(Duration::from_millis(4000), 100);
        assert!(slow.itl_mean().abs_diff(Duration::from_millis(90)) < Duration::from_micros(1), "{:?}", slow.itl_mean());
        for _ in 0..4 {
            // Whichever replica the rotation starts from.
            let i = pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot");
            assert_eq!(on(&i), fast.url, "interactive where the gaps are short");
            let b = pool.pick(None, Room::Over(0), Tier::Batch).expect("slot");
            assert_eq!(on(&b), slow.url, "batch leaves that replica to interactive");
        }
        // The fast replica full: interactive waits for it (it would miss its
        // ITL on the slow one); batch still takes the slow one.
        let held: Vec<_> = (0..2).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).collect();
        assert!(held.iter().all(|s| on(s) == fast.url));
        assert!(matches!(pool.pick(None, Room::Over(0), Tier::Interactive), Err(PickError::Saturated)));
        assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")), slow.url);
        // The fast replica gone: the slow one serves interactive too.
        fast.set_healthy(false);
        assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")), slow.url);
        fast.set_healthy(true);
        drop(held);
        // The slow replica recovers: its batch streams bring its mean back near the other's.
        for _ in 0..10 {
            slow.record_itl(Duration::from_millis(4000), 100);
        }
        assert!(slow.itl_mean() < Duration::from_millis(60), "{:?}", slow.itl_mean());
        let picks: Vec<String> =
            (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).to_string()).collect();
        assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "both serve interactive again: {picks:?}");
        // Slow again, then nothing ends there for longer than the gaps are
        // remembered (no batch to measure it): interactive tries it again.
        slow.record_itl(Duration::from_millis(90_000), 100);
        fast.record_itl(Duration::from_millis(4000), 100);
        assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")), slow.url, "slow again");
        tokio::time::advance(GAPS_FORGOTTEN_AFTER + Duration::from_secs(1)).await;
        fast.record_itl(Duration::from_millis(4000), 100);
        assert_eq!(slow.itl_mean(), Duration::ZERO, "forgotten");
        let picks: Vec<String> =
            (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).to_string()).collect();
        assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "{picks:?}");
        slow.record_itl(Duration::from_millis(4000), 100);
        assert!(slow.itl_mean().abs_diff(Duration::from_millis(40)) < Duration::from_micros(1), "measured anew");
        // A little slower (1.4x) is not slow.
        for _ in 0..20 {
            slow.record_itl(Duration::from_millis(5600), 100);
        }
        let picks: Vec<String> =
            (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).to_string()).collect();
        assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "{picks:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn late_first_tokens_under_load_set_the_replicas_batch_cut_and_its_gauge() {
        use std::time::Duration;
        let cfg = PoolConfig {
            replicas: vec!["http://127.0.0.1:9".into()],
            max_inflight_per_replica: InflightLimit::Auto,
            upstream_priority: true,
            ..PoolConfig::default()
        };
        let metrics = Metrics::new(&Config::default());
        let access = Access::new(&cfg).expect("access");
        let pool = Pool::new(cfg, access, &metrics, None);
        let r = &pool.replicas[0];
        r.set_healthy(true);
        let (target, idle) = (Duration::from_millis(300), Load { waiting: Some(0.0), running: Some(1.0) });
        let batch = pool.pick(None, Room::Over(0), Tier::Batch).expect("slot");
        r.record_first_token(Duration::from_millis(100), target);
        r.control("p", idle, false);
        assert_eq!((r.batch_cut.load(Ordering::Relaxed), r.batch_cut_gauge.get()), (0, 0));
        // Over the target and over twice the best so far, batch on the replica: load.
        r.record_first_token(Duration::from_millis(450), target);
        r.control("p", idle, false);
        let cut = r.batch_cut.load(Ordering::Relaxed);
        assert_eq!(cut, 2, "a tenth of the starting limit of 16, rounded up");
        assert_eq!(r.batch_cut_gauge.get(), 2);
        assert_eq!(r.max_inflight(), 16, "the limit itself holds");
        drop(batch);
    }

    #[test]
    fn batch_leaves_a_replicas_batch_cut_to_interactive_requests() {
        let pool = two(10, false);
        let (a, b) = (&pool.replicas[0], &pool.replicas[1]);
        // Four of each replica's ten seats are left to interactive requests
        // (in a fleet, this instance's part of them: 2 of its 5 slots).
        a.batch_cut.store(4, Ordering::Relaxed);
        b.batch_cut.store(4, Ordering::Relaxed);
        let batch: Vec<_> = (0..12).map(|_| pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")).collect();
        assert!(matches!(pool.pick(None, Room::Over(0), Tier::Batch), Err(PickError::Saturated)));
        assert_eq!((a.inflight(), b.inflight()), (6, 6));
        let chat: Vec<_> = (0..8).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).collect();
        assert!(matches!(pool.pick(None, Room::Over(0), Tier::Interactive), Err(PickError::Saturated)));
        drop(chat);
        a.set_fleet_share(Some((5, 5)));
        b.set_fleet_share(Some((5, 5)));
        drop(batch);
        let batch: Vec<_> = (0..6).map(|_| pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")).collect();
        assert!(matches!(pool.pick(None, Room::Over(0), Tier::Batch), Err(PickError::Saturated)));
        assert_eq!((a.inflight(), b.inflight()), (3, 3));
        drop(batch);
        // The cut gone, batch takes every slot again.
        a.batch_cut.store(0, Ordering::Relaxed);
        let on_a: Vec<_> = (0..5).filter_map(|_| pool.pick(Some(b), Room::Over(0), Tier::Batch).ok()).collect();
        assert_eq!(on_a.len(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_replica_is_slow_batch_leaves_the_reserved_seats_on_the_others() {
        use std::time::Duration;
        let pool = two(4, false);
        let (slow, fast) = (&pool.replicas[0], &pool.replicas[1]);
        // Nothing slow: `Leave` is the batch limit's business, not the pick's.
        let all: Vec<_> = (0..8).map(|_| pool.pick(None, Room::Leave(3), Tier::Batch).expect("slot")).collect();
        assert_eq!(all.iter().filter(|s| on(s) == fast.url).count(), 4);
        drop(all);
        slow.record_itl(Duration::from_millis(9000), 100);
        fast.record_itl(Duration::from_millis(4000), 100);
        // Three seats reserved: batch fills the slow replica, then takes
        // one seat of the fast one's four and no more.
        let batch: Vec<_> = (0..5).map(|_| pool.pick(None, Room::Leave(3), Tier::Batch).expect("slot")).collect();
        assert_eq!(batch.iter().filter(|s| on(s) == slow.url).count(), 4);
        assert_eq!(fast.batch_held.load(Ordering::Relaxed), 1);
        assert!(matches!(pool.pick(None, Room::Leave(3), Tier::Batch), Err(PickError::Saturated)));
        // The reserved seats are interactive's.
        let chat: Vec<_> = (0..3).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot")).collect();
        assert!(chat.iter().all(|s| on(s) == fast.url));
        // Interactive's demand falls (less reserved): batch may take more of the fast replica.
        drop(chat);
        let more = pool.pick(None, Room::Leave(1), Tier::Batch).expect("slot");
        assert_eq!(on(&more), fast.url);
        assert_eq!(fast.batch_held.load(Ordering::Relaxed), 2);
        // Each batch seat is counted off once, when given back.
        drop(more);
        drop(batch);
        assert_eq!((fast.batch_held.load(Ordering::Relaxed), slow.batch_held.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn a_new_request_goes_where_fewer_prefills_are_ahead_of_it_even_with_more_streams() {
        let pool = two(8, false);
        // Three streams decoding on one replica, one request still prefilling on the other.
        let mut decoding: Vec<ReplicaSlot> = (0..4).map(|_| pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")).collect();
        let prefilling = decoding.pop().expect("four");
        let busy = on(&prefilling).to_string();
        decoding.retain(|s| on(s) != busy);
        for s in &mut decoding {
            s.prefilled();
        }
        let quiet = on(&decoding[0]).to_string();
        assert!(decoding.len() > prefilling.replica().inflight(), "more streams on {quiet} than on {busy}");
        for tier in [Tier::Interactive, Tier::Batch] {
            let next = pool.pick(None, Room::Over(0), tier).expect("slot");
            assert_eq!(on(&next), quiet, "{tier:?}: the replica with no prefill in progress");
        }
        // Once the prefill is done, streams count again.
        let mut prefilling = prefilling;
        prefilling.prefilled();
        let mut counts = HashSet::new();
        for _ in 0..2 {
            counts.insert(on(&pool.pick(None, Room::Over(0), Tier::Batch).expect("slot")).to_string());
        }
        assert_eq!(counts, HashSet::from([busy]), "fewest streams now");
    }

    #[test]
    fn with_upstream_priority_an_interactive_request_waits_only_behind_interactive_prefills() {
        for priority in [true, false] {
            let pool = two(8, priority);
            let (ra, rb) = (pool.replicas[0].clone(), pool.replicas[1].clone());
            // Two batch prefills on one replica, one interactive prefill on the other.
            let _batch: Vec<ReplicaSlot> = (0..2).map(|_| pool.pick(Some(&ra), Room::Over(0), Tier::Batch).expect("slot")).collect();
            let _chat = pool.pick(Some(&rb), Room::Over(0), Tier::Interactive).expect("slot");
            let next = pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot");
            // vLLM with priority scheduling runs the interactive request
            // before both batch prefills; first come, first served, it waits for both.
            let want = if priority { &rb } else { &ra };
            assert_eq!(on(&next), want.url, "upstream_priority {priority}");
        }
    }

    #[test]
    fn in_a_fleet_an_interactive_request_may_take_a_seat_no_instance_holds() {
        let pool = two(8, false);
        let (ra, rb) = (pool.replicas[0].clone(), pool.replicas[1].clone());
        // This instance's part: 2 of each replica's 8; the others hold 5 on each.
        for r in [&ra, &rb] {
            r.set_fleet_share(Some((2, 5)));
        }
        let _mine: Vec<ReplicaSlot> = (0..4).map(|_| pool.pick(None, Room::Over(0), Tier::Batch).expect("within the part")).collect();
        assert_eq!(pool.pick(None, Room::Over(0), Tier::Batch).err(), Some(PickError::Saturated), "batch keeps to its part");
        // One seat on each replica is nobody's: interactive takes them, then no more.
        let _i1 = pool.pick(None, Room::Over(0), Tier::Interactive).expect("a free seat");
        let _i2 = pool.pick(None, Room::Over(0), Tier::Interactive).expect("the other free seat");
        assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive).err(), Some(PickError::Saturated), "2 + 5 + 1 = 8: full");
        assert_eq!((ra.inflight(), rb.inflight()), (3, 3));
    }

    #[test]
    fn the_prefill_count_falls_once_at_the_first_token_or_at_release() {
        let pool = two(8, false);
        let mut s = pool.pick(None, Room::Over(0), Tier::Interactive).expect("slot");
        let r = s.replica().clone();
        assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (1, 1));
        s.prefilled();
        s.prefilled();
        assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (0, 1));
        drop(s);
        assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (0, 0));
        // Given back before any token (a refusal, a client gone): counted off once.
        let mut s = pool.pick(None, Room::Over(0), Tier::Batch).expect("slot");
        let r = s.replica().clone();
        assert_eq!(r.prefilling(Tier::Batch), 1);
        s.release();
        s.release();
        drop(s);
        assert_eq!((r.prefilling(Tier::Batch), r.inflight()), (0, 0));
    }
}
