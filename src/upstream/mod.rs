//! Upstream pools: replicas, their health, their slots, and which one serves
//! a request.
//!
//! A [`Lease`] is a replica's concurrency slot plus its load count. It is
//! taken before the request is sent and travels inside the response body; it
//! is released exactly once, by `Drop`, when the stream ends or the client
//! goes away, never when the response headers arrive.

pub mod conn;
pub mod health;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::gauge::Gauge;

use crate::admission::queue::AdmissionQueue;
use crate::config::{Balance, PoolConfig, Tier, TiersConfig};
use crate::telemetry::metrics::{Metrics, ReplicaLabels, TierLabel, TierOnlyLabels};

/// The pooled HTTP/1 client used for one pool's replicas.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Build a pooled client: TCP_NODELAY, the pool's connect timeout.
pub fn build_client(cfg: &PoolConfig) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.timeouts.connect.get()));
    http.set_keepalive(Some(std::time::Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(http)
}

/// One upstream vLLM server.
pub struct Replica {
    pub pool: String,
    /// Base URL as configured, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    /// Scheme + authority, used to build request URIs.
    pub base: http::Uri,
    /// Requests holding a slot here. Invariant: only changed through [`Lease`].
    inflight: AtomicUsize,
    max_inflight: usize,
    healthy: AtomicBool,
    /// Requests waiting inside vLLM, as last scraped from its `/metrics`
    /// (includes other clients' requests); 0 when not scraped.
    pub scraped_waiting: AtomicU64,
    /// Models this replica's `/v1/models` listed (raw model objects).
    pub models: ArcSwap<Vec<serde_json::Value>>,
    inflight_gauge: Gauge,
    healthy_gauge: Gauge,
    /// Keep-alive connections not serving a request now.
    pub idle: conn::IdleConns,
}

impl Replica {
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }
    pub fn max_inflight(&self) -> usize {
        self.max_inflight
    }
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
    pub(crate) fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Relaxed);
        self.healthy_gauge.set(up as i64);
    }

    /// Take a slot if one is free.
    fn try_take(&self) -> bool {
        let mut cur = self.inflight.load(Ordering::SeqCst);
        loop {
            if cur >= self.max_inflight {
                return false;
            }
            match self.inflight.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    self.inflight_gauge.inc();
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    fn load_score(&self) -> u64 {
        self.inflight() as u64 + self.scraped_waiting.load(Ordering::Relaxed)
    }
}

/// A held slot on one replica; dropping it frees the slot and hands it to
/// the next queued request.
pub struct Lease {
    replica: Arc<Replica>,
    pool: Arc<Pool>,
    tier: Tier,
}

impl Lease {
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }
    pub fn tier(&self) -> Tier {
        self.tier
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.replica.inflight.fetch_sub(1, Ordering::SeqCst);
        self.replica.inflight_gauge.dec();
        if self.tier == Tier::Batch {
            self.pool.queue.batch_inflight().fetch_sub(1, Ordering::SeqCst);
        }
        self.pool.queue.released(&self.pool, self.tier);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("replica", &self.replica.url).finish()
    }
}

/// Why no lease could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickError {
    /// No replica of the pool is healthy.
    NoHealthy,
    /// Healthy replicas exist, but every slot is taken.
    Saturated,
}

/// A named set of replicas serving some models.
pub struct Pool {
    pub config: PoolConfig,
    pub replicas: Vec<Arc<Replica>>,
    pub client: UpstreamClient,
    /// Models named in the config (without `auto`).
    pub static_models: HashSet<String>,
    pub auto: bool,
    rr: AtomicUsize,
    reserved_share: f64,
    /// Requests waiting for a slot, by tier.
    /// Kept across reloads (by pool name), with the batch slot count.
    pub queue: Arc<AdmissionQueue>,
}

impl Pool {
    /// Build a pool. With `previous` (the pool of the same name before a
    /// reload), replicas with the same URL and slot count are kept as they
    /// are (health, in-flight count, discovered models), and so is the queue.
    pub fn new(config: PoolConfig, tiers: &TiersConfig, metrics: &Metrics, previous: Option<&Pool>) -> Result<Pool, String> {
        let mut replicas = Vec::with_capacity(config.replicas.len());
        for url in &config.replicas {
            let kept = previous.and_then(|p| {
                p.replicas.iter().find(|r| r.url == url.trim_end_matches('/') && r.max_inflight == config.max_inflight_per_replica as usize)
            });
            if let Some(r) = kept {
                replicas.push(r.clone());
                continue;
            }
            let base = crate::config::parse_replica_url(url)?;
            let labels = ReplicaLabels { pool: config.name.clone(), replica: url.trim_end_matches('/').to_string() };
            let inflight_gauge = metrics.inflight.get_or_create(&labels).clone();
            let healthy_gauge = metrics.upstream_healthy.get_or_create(&labels).clone();
            healthy_gauge.set(0);
            replicas.push(Arc::new(Replica {
                pool: config.name.clone(),
                url: url.trim_end_matches('/').to_string(),
                base,
                inflight: AtomicUsize::new(0),
                max_inflight: config.max_inflight_per_replica as usize,
                healthy: AtomicBool::new(false),
                scraped_waiting: AtomicU64::new(0),
                models: ArcSwap::from_pointee(Vec::new()),
                inflight_gauge,
                healthy_gauge,
                idle: conn::IdleConns::default(),
            }));
        }
        let static_models = config.models.iter().filter(|m| *m != "auto").cloned().collect();
        let auto = config.models.iter().any(|m| m == "auto");
        let depth = |tier| metrics.queue_depth.get_or_create(&TierOnlyLabels { tier }).clone();
        let queue = match previous {
            Some(p) => {
                p.queue.set_tiers(tiers.clone());
                p.queue.clone()
            }
            None => Arc::new(AdmissionQueue::new(tiers.clone(), depth(TierLabel::interactive), depth(TierLabel::batch))),
        };
        Ok(Pool {
            client: build_client(&config),
            replicas,
            static_models,
            auto,
            config,
            rr: AtomicUsize::new(0),
            reserved_share: tiers.interactive.reserved_share.clamp(0.0, 1.0),
            queue,
        })
    }

    /// Does this pool serve `model`?
    pub fn serves(&self, model: &str) -> bool {
        self.static_models.contains(model)
            || (self.auto
                && self.replicas.iter().any(|r| r.models.load().iter().any(|m| m.get("id").and_then(|v| v.as_str()) == Some(model))))
    }

    /// Model objects for `/v1/models`: discovered ones as the replicas gave
    /// them, static ones synthesised.
    pub fn model_objects(&self) -> Vec<serde_json::Value> {
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

    pub fn healthy_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).count()
    }

    /// Slots on healthy replicas.
    pub fn capacity(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.max_inflight).sum()
    }

    /// The most slots batch may hold: all but the interactive reserved share.
    pub fn batch_limit(&self) -> usize {
        let cap = self.capacity();
        let limit = (cap as f64 * (1.0 - self.reserved_share)).floor() as usize;
        if self.reserved_share < 1.0 && cap > 0 {
            limit.max(1)
        } else {
            limit
        }
    }

    pub fn queue_timeout(&self, tier: Tier) -> std::time::Duration {
        self.queue.timeout(tier)
    }

    pub fn batch_inflight(&self) -> usize {
        self.queue.batch_inflight().load(Ordering::SeqCst)
    }

    /// Take a slot for a request of `tier` now, if one is free: a healthy
    /// replica (skipping `exclude`) with a free slot, and for batch, room
    /// under the batch limit. Does not queue.
    pub fn try_lease(self: &Arc<Self>, tier: Tier, exclude: Option<&Arc<Replica>>) -> Result<Lease, PickError> {
        if tier == Tier::Batch {
            let limit = self.batch_limit();
            let reserved =
                self.queue.batch_inflight().fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1)).is_ok();
            if !reserved {
                return Err(if self.healthy_count() == 0 { PickError::NoHealthy } else { PickError::Saturated });
            }
        }
        let picked = self.pick(exclude);
        match picked {
            Ok(replica) => Ok(Lease { replica, pool: self.clone(), tier }),
            Err(e) => {
                if tier == Tier::Batch {
                    self.queue.batch_inflight().fetch_sub(1, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    /// Pick a healthy replica with a free slot, skipping `exclude`, and take the slot.
    fn pick(&self, exclude: Option<&Arc<Replica>>) -> Result<Arc<Replica>, PickError> {
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
                    if r.try_take() {
                        return Ok(r.clone());
                    }
                }
            }
            Balance::LeastLoaded => {
                let mut ranked: Vec<&Arc<Replica>> = candidates.collect();
                // Stable sort keeps the rotating start as the tie-breaker.
                ranked.sort_by_key(|r| r.load_score());
                for r in ranked {
                    if r.try_take() {
                        return Ok(r.clone());
                    }
                }
            }
        }
        Err(if any_healthy { PickError::Saturated } else { PickError::NoHealthy })
    }
}
