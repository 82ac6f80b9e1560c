//! A pool: its replicas, their slots and health, what the pool has
//! learned (limits, the prefix index, stored responses' owners), and the
//! errors of picking and building one. Picking a replica is `pick.rs`'s;
//! sending, `send.rs`'s.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::{InflightLimit, PoolConfig};
use crate::telemetry::metrics::Metrics;

use super::access::public_name;
use super::{kv_events, limit, owners, prefix, tls, Access, Replica};

/// What [`Pool::pick`] allows beyond a replica's free slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// An interactive request may go this many above the pool's slots
    /// (spread over its healthy replicas).
    Over(usize),
    /// As `Over`, for an interactive request that has waited a fleet
    /// period: in a fleet it may take a seat of a replica's limit that no
    /// instance holds even while other instances have requests waiting
    /// (they had a period to fill their parts; docs/design/fleet.md rule 9).
    Patient(usize),
    /// A batch request leaves this many slots to interactive requests on the
    /// replicas they can use (applied while a replica is slow; otherwise the
    /// batch limit does it).
    Leave(usize),
    /// As `Leave`, and in a fleet the batch request may also take a seat of
    /// a replica's limit that no instance holds (the admission has judged
    /// that the fleet's batch has room for it).
    Unheld(usize),
}

/// Why no slot could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PickError {
    /// No replica of the pool is healthy.
    NoHealthy,
    /// Healthy replicas exist, but every slot is taken.
    Saturated,
    /// A batch prompt is held: where a slot is free, the prefill work ahead
    /// there would make the next interactive request late
    /// (docs/design/preemption.md, rule 14).
    Held,
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
    #[error("prefix.kv_events: {0}")]
    KvEvents(String),
}

/// A named set of replicas serving some models.
pub(crate) struct Pool {
    pub(crate) config: PoolConfig,
    /// The learned limits' parameters (used with `max_inflight_per_replica: auto`).
    limit_params: limit::LimitParams,
    pub(crate) replicas: Vec<Arc<Replica>>,
    /// The replicas' public names in this config (a kept replica whose
    /// position moved takes its new one when the pool goes live).
    publics: Vec<http::HeaderValue>,
    /// Models named in the config (without `auto`).
    pub(crate) static_models: HashSet<String>,
    pub(crate) auto: bool,
    pub(super) rr: AtomicUsize,
    /// Where prompts' prefixes were sent (`balance: prefix_aware`), kept
    /// across a reload that keeps the replicas in their places.
    pub(crate) prefix: Arc<prefix::PrefixIndex>,
    /// Exact mode (`prefix.kv_events`): the replicas' KV events and the
    /// model's tokenizer.
    pub(crate) exact: Option<kv_events::Exact>,
    /// Each replica's URL hashed: what a prompt's home is chosen by, the
    /// same on every instance.
    pub(super) url_keys: Vec<u64>,
    /// Requests waiting in the gateway for this pool's slots, as admission
    /// last published it (its ticks).
    waiting: AtomicUsize,
    /// Requests waiting in the fleet's other instances, as the fleet last published it.
    others_waiting: AtomicUsize,
    /// Seats of the others' reserved parts that their interactive requests
    /// neither hold nor wait for, as the fleet last published it.
    others_reserve_free: AtomicUsize,
    /// Too few replicas pass their checks: all are routed to (see [`Pool::judge`]).
    panic: std::sync::atomic::AtomicBool,
    panic_gauge: std::sync::OnceLock<prometheus_client::metrics::gauge::Gauge>,
    /// Which replica holds each stored response, kept across reloads.
    pub(crate) owners: Arc<owners::Owners>,
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

    /// The fleet's tick: `n` seats of the others' reserved parts stand
    /// unused by their interactive requests.
    pub(crate) fn set_others_reserve_free(&self, n: usize) {
        self.others_reserve_free.store(n, Ordering::Relaxed);
    }

    /// Seats of the others' reserved parts unused by their interactive
    /// requests, as last heard, less those this instance holds lent: what
    /// is left to lend, on all the replicas together. (Two picks at once
    /// may both take the last one: the replica's free seats as last heard
    /// still bound each.)
    pub(super) fn others_reserve_free(&self) -> usize {
        match self.others_reserve_free.load(Ordering::Relaxed) {
            0 => 0,
            free => free.saturating_sub(self.lent()),
        }
    }

    /// The seats of the others' reserved parts this instance's interactive
    /// requests hold, on all the replicas: lending is the pool's, not each
    /// replica's.
    pub(super) fn lent(&self) -> usize {
        self.replicas.iter().map(|r| r.seats.lent.load(Ordering::Relaxed)).sum()
    }

    /// The fleet's other instances have requests waiting for this pool, as last heard.
    pub(super) fn others_wait(&self) -> bool {
        self.others_waiting.load(Ordering::Relaxed) > 0
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
    pub(crate) fn new(config: PoolConfig, access: Access, previous: Option<&Pool>) -> Pool {
        let Access { bases, tls: replica_tls, api_key, exact } = access;
        let l = config.learned_limit;
        // A pool that preempts keeps chat out of the engine's own queue: its
        // limit stays at the ceiling, not one above it (preemption, not a
        // request waiting inside the engine, keeps its slots busy).
        // Where the engine orders its own queue, batch alone probes as before.
        let probe = match (config.preempts(), config.upstream_priority) {
            (false, _) => limit::Probe::Always,
            (true, false) => limit::Probe::Never,
            (true, true) => limit::Probe::WhileBatchAlone,
        };
        let limit_params = limit::LimitParams { initial: l.initial as usize, min: l.min as usize, max: l.max as usize, probe };
        let initial = match config.max_inflight_per_replica {
            InflightLimit::Fixed(n) => n as usize,
            InflightLimit::Auto => limit_params.initial,
        };
        let same_access = previous.is_some_and(|p| p.config.tls == config.tls && p.config.api_key_env == config.api_key_env);
        let mut replicas = Vec::with_capacity(config.replicas.len());
        let mut publics = Vec::with_capacity(config.replicas.len());
        for (i, ((rc, base), tls)) in config.replicas.iter().zip(bases).zip(replica_tls).enumerate() {
            let url = rc.url.trim().trim_end_matches('/');
            let public = public_name(&config.name, i, rc.name.as_deref());
            let kept = previous
                .filter(|_| same_access)
                .and_then(|p| p.replicas.iter().find(|r| r.url == url && r.name.as_deref() == rc.name.as_deref()));
            if let Some(r) = kept {
                // Renamed (its position moved) only when the pool goes live.
                publics.push(public);
                replicas.push(r.clone());
                continue;
            }
            publics.push(public.clone());
            replicas.push(Arc::new(Replica::new(url, rc.name.clone(), public, base, tls, api_key.clone(), initial, limit_params)));
        }
        let url_keys: Vec<u64> = replicas.iter().map(|r| xxhash_rust::xxh3::xxh3_64(r.url.as_bytes())).collect();
        let index_size = config.prefix.index_blocks as usize;
        let prefix = previous
            .filter(|p| p.url_keys == url_keys && p.prefix.capacity() == index_size && p.config.prefix.block == config.prefix.block)
            .map(|p| p.prefix.clone())
            .unwrap_or_else(|| Arc::new(prefix::PrefixIndex::new(index_size)));
        let exact = exact.map(|setup| {
            let before = previous.and_then(|p| p.exact.as_ref().map(|e| (p, e)));
            let kept = |i: usize| before.and_then(|(p, _)| p.replicas.iter().position(|r| Arc::ptr_eq(r, &replicas[i])));
            kv_events::Exact::new(setup, before.map(|(_, e)| e), kept)
        });
        let static_models = config.models.iter().filter(|m| *m != "auto").cloned().collect();
        let auto = config.models.iter().any(|m| m == "auto");
        Pool {
            exact,
            replicas,
            publics,
            static_models,
            auto,
            config,
            limit_params,
            rr: AtomicUsize::new(0),
            prefix,
            url_keys,
            waiting: AtomicUsize::new(0),
            others_waiting: AtomicUsize::new(0),
            others_reserve_free: AtomicUsize::new(0),
            panic: std::sync::atomic::AtomicBool::new(false),
            panic_gauge: std::sync::OnceLock::new(),
            owners: previous.map(|p| p.owners.clone()).unwrap_or_default(),
        }
    }

    /// Does this pool serve `model`?
    pub(crate) fn serves(&self, model: &str) -> bool {
        self.static_models.contains(model)
            || (self.auto
                && self
                    .replicas
                    .iter()
                    .any(|r| r.readings.models.load().iter().any(|m| m.get("id").and_then(|v| v.as_str()) == Some(model))))
    }

    /// Model objects for `/v1/models`: discovered ones as the replicas gave
    /// them, static ones synthesised.
    /// The longest context its replicas state for `model` (`max_model_len`
    /// in their `/v1/models`), once one has answered: the most a request
    /// without an output limit can generate.
    pub(crate) fn max_model_len(&self, model: &str) -> Option<u64> {
        self.replicas
            .iter()
            .filter_map(|r| {
                let models = r.readings.models.load();
                let m = models.iter().find(|m| m.get("id").and_then(|v| v.as_str()) == Some(model))?;
                m.get("max_model_len").and_then(serde_json::Value::as_u64)
            })
            .max()
    }

    pub(crate) fn model_objects(&self) -> Vec<serde_json::Value> {
        let discovered: Vec<serde_json::Value> =
            self.replicas.iter().flat_map(|r| r.readings.models.load().iter().cloned().collect::<Vec<_>>()).collect();
        let id_of = |m: &serde_json::Value| m.get("id").and_then(|v| v.as_str()).map(str::to_string);
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for m in &self.config.models {
            if m != "auto" && seen.insert(m.clone()) {
                // A named model as its replicas describe it (max_model_len,
                // owned_by, root) once one has answered; until then, slogate's.
                // Served under another name, it is shown under the clients' own.
                let served = self.config.served_model.as_deref().unwrap_or(m);
                let mut known = discovered.iter().find(|d| id_of(d).as_deref() == Some(served)).cloned();
                if let Some(k) = known.as_mut().and_then(|k| k.as_object_mut()) {
                    k.insert("id".into(), m.clone().into());
                }
                out.push(known.unwrap_or_else(|| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "slogate"})));
            }
        }
        if self.auto {
            for m in discovered {
                if let Some(id) = id_of(&m) {
                    if seen.insert(id) {
                        out.push(m);
                    }
                }
            }
        }
        out
    }

    /// This pool went live (a start or a reload's swap): its replicas take
    /// its slot count (a fixed one, or their learned one under this pool's
    /// bounds), and their gauges say what they are.
    pub(crate) fn activate(&self, metrics: &Metrics) {
        for (r, public) in self.replicas.iter().zip(&self.publics) {
            r.go_live(metrics, &self.config.name);
            r.public.store(Arc::new(public.clone()));
            let n = match self.config.max_inflight_per_replica {
                InflightLimit::Fixed(n) => n as usize,
                InflightLimit::Auto => {
                    let mut c = r.learning.controller();
                    c.set_params(self.limit_params);
                    c.allowed()
                }
            };
            r.set_max_inflight(n);
            r.publish_health();
        }
        let feeds = self.exact.as_ref().map(|e| e.sources(self.replicas.iter().map(|r| r.label()))).unwrap_or_default();
        metrics.kv_feeds.set(&self.config.name, feeds);
        let gauge = metrics.pool_panic.get_or_create(&crate::telemetry::metrics::PoolLabels { pool: self.config.name.clone() }).clone();
        let _ = self.panic_gauge.set(gauge);
        self.judge();
    }

    /// Too few of the replicas pass their checks: all of them are routed to.
    pub(crate) fn in_panic(&self) -> bool {
        self.panic.load(Ordering::Relaxed)
    }

    /// Route by the replicas' verdicts: to those that pass, or, when fewer
    /// than `health.panic_threshold` of them do (and every one has had its
    /// first check), to all of them that ever passed one, as Envoy's panic
    /// threshold does: a slowdown that fails the checks of most replicas
    /// must not become an outage. A replica that never passed (a wrong key,
    /// an untrusted certificate, not started) would fail every request: it
    /// is not routed to. Called when a verdict changes.
    pub(crate) fn judge(&self) {
        let n = self.replicas.len();
        let passing = self.replicas.iter().filter(|r| r.is_passing()).count();
        let known = self.replicas.iter().all(|r| r.health.verdict.known());
        let panic = known && n > 0 && (passing as f64) < self.config.health.panic_threshold * n as f64;
        for r in &self.replicas {
            r.set_routed(r.is_passing() || (panic && r.health.verdict.ever_passed()));
        }
        if let Some(g) = self.panic_gauge.get() {
            g.set(panic as i64);
        }
        if self.panic.swap(panic, Ordering::Relaxed) != panic {
            let threshold = self.config.health.panic_threshold;
            if panic {
                tracing::warn!(pool = %self.config.name, passing, replicas = n, threshold, "panic: too few replicas pass their health checks; routing to all of them");
            } else {
                tracing::info!(pool = %self.config.name, passing, replicas = n, "panic over: routing to the replicas that pass their health checks");
            }
        }
    }

    /// A request's connection to `replica` failed before its response head
    /// (`refused`: nothing listens there): the second such failure in a
    /// row, or a refused connect, takes it out until its checks pass again,
    /// without waiting for them to fail.
    pub(crate) fn connection_failed(&self, replica: &Replica, refused: bool, why: &str) {
        if !replica.health.verdict.failed(refused) {
            return;
        }
        replica.set_healthy(false);
        let why = format!("its traffic failed: {why}");
        replica.health.verdict.changed("taken out", &why);
        replica.set_health_error(Some(why.clone()));
        tracing::warn!(pool = %self.config.name, replica = %replica.url, reason = %why, "replica taken out");
        self.judge();
    }

    /// Every slot was taken: the healthy replicas whose learned limits are
    /// still in slow start grow now (docs/design/learned-limits.md rule 15).
    /// True if any grew.
    pub(crate) fn grow_on_demand(&self) -> bool {
        self.learns_limits() && self.replicas.iter().filter(|r| r.is_healthy()).fold(false, |grew, r| r.grow_on_demand() | grew)
    }

    /// Are this pool's limits learned?
    pub(crate) fn learns_limits(&self) -> bool {
        self.config.max_inflight_per_replica == InflightLimit::Auto
    }

    /// The recent 90th percentile of interactive requests' dispatch-to-first-token
    /// time over their class's target, across the healthy replicas (their mean).
    pub(crate) fn first_token_p90(&self) -> f64 {
        self.healthy_mean(Replica::first_token_p90)
    }

    /// The same time's recent median, across the healthy replicas (their mean).
    pub(crate) fn first_token_p50(&self) -> f64 {
        self.healthy_mean(Replica::first_token_p50)
    }

    /// The mean of `f` over the healthy replicas (0 without any).
    fn healthy_mean(&self, f: impl Fn(&Replica) -> f64) -> f64 {
        let (sum, n) = self.replicas.iter().filter(|r| r.is_healthy()).fold((0.0, 0usize), |(s, n), r| (s + f(r), n + 1));
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }

    pub(crate) fn healthy_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).count()
    }

    /// Do its replicas order their own queues by tier
    /// (`upstream_priority`), each healthy one with its limit at its
    /// engine's slots ([`Replica::limit_at_its_slots`])? Then the
    /// interactive reservation is its headroom (docs/design/seats.md rule 4).
    pub(crate) fn prioritised_at_its_slots(&self) -> bool {
        let mut healthy = self.replicas.iter().filter(|r| r.is_healthy()).peekable();
        self.config.upstream_priority && healthy.peek().is_some() && healthy.all(|r| r.limit_at_its_slots())
    }

    /// This instance's slots on healthy replicas.
    pub(crate) fn capacity(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.slots()).sum()
    }
}

#[cfg(test)]
mod tests;
