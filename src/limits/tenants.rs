//! Tenants: the API keys callers come with (or one anonymous tenant when no
//! keys are configured), each with a weight and its own limits: a sliding
//! minute of requests and tokens (tokens reserved at admission, settled to
//! usage at the end), requests at once, day and month quotas. In a fleet
//! each instance enforces its part, or the whole limit in the limit store
//! ([`super::store`]) while it answers. The rules are
//! docs/design/fair-share.md's (rules 9 to 12) and docs/access.md's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::time::Instant;

pub(crate) use super::keylimits::{reset_text, tightest, Limit, Limited, Limits, Quota, RateState};
use super::keylimits::{too_large_for_quota, Window, SLOTS};
use super::quota::{Calendar, Standing};
use super::store::{Store, Verdict};
use super::tenant_series::TenantSeries;
use crate::config::TenantConfig;
use crate::telemetry::accounting::Finished;
use crate::telemetry::metrics::Metrics;

/// A tenant as the queues see it: a stable id and its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Share {
    pub(crate) tenant: u32,
    pub(crate) weight: f64,
}

impl Default for Share {
    fn default() -> Self {
        Share { tenant: 0, weight: 1.0 }
    }
}
pub(crate) use permit::{Permit, Reading};

/// The name of the one tenant of a gateway without keys.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// What a tenant is, as configured.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Settings {
    weight: f64,
    limits: Limits,
}

impl Settings {
    fn of(c: &TenantConfig) -> Settings {
        Settings { weight: c.weight, limits: c.limits.as_ref().map(Limits::of).unwrap_or_default() }
    }
}

/// One tenant; kept across reloads by name (its windows and counters carry over).
pub(crate) struct Tenant {
    pub(crate) name: Arc<str>,
    id: u32,
    /// Its series, made when it is installed (a prepared tenant never
    /// installed shows nothing).
    series: std::sync::OnceLock<TenantSeries>,
    settings: ArcSwap<Settings>,
    /// The fleet's live instances (shared by all tenants of the gateway).
    instances: Arc<AtomicUsize>,
    /// The limit store, when one is configured (shared by all tenants).
    store: Arc<ArcSwapOption<Store>>,
    base: Instant,
    /// The wall clock (seconds since 1970) at `base`: quotas' calendar windows.
    base_unix: u64,
    inner: Mutex<Usage>,
    concurrent: AtomicU64,
    /// Its requests whose bodies are being read (before their permit).
    reading: AtomicU64,
    limited: [AtomicU64; 4],
}

#[derive(Debug, Default)]
struct Usage {
    requests: Window,
    tokens: Window,
    /// Every tenant: tokens served, and requests judged against their SLO (all, met).
    served: Window,
    judged: Window,
    met: Window,
    /// The last second a request was refused by a limit.
    limited_at: Option<u64>,
    /// Its day and month quotas.
    calendar: Calendar,
    /// The quotas as the limit store last said (with a store).
    shared_standing: Vec<Standing>,
}

impl Tenant {
    /// Its series (`None` until it is installed).
    pub(crate) fn series(&self) -> Option<&TenantSeries> {
        self.series.get()
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).field("id", &self.id).finish()
    }
}

impl Tenant {
    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_secs()
    }

    /// The wall clock's second (since 1970, UTC) at `at`.
    pub(crate) fn unix(&self, at: Instant) -> u64 {
        self.base_unix + self.second(at)
    }

    /// Its share of a tier, for the fair queues.
    pub(crate) fn share(&self) -> Share {
        Share { tenant: self.id, weight: self.settings.load().weight }
    }

    pub(crate) fn weight(&self) -> f64 {
        self.settings.load().weight
    }

    /// Its limits in force now: its own, or its part of them in a fleet.
    pub(crate) fn limits(&self) -> Limits {
        self.settings.load().limits.split(self.instances.load(Ordering::Relaxed))
    }

    /// The limits as configured (for the whole fleet).
    pub(crate) fn configured_limits(&self) -> Limits {
        self.settings.load().limits
    }

    /// The limit store in use, if any.
    pub(crate) fn store(&self) -> Option<Arc<Store>> {
        self.store.load_full()
    }

    pub(crate) fn has_limits(&self) -> bool {
        self.settings.load().limits.any()
    }

    pub(crate) fn concurrent(&self) -> u64 {
        self.concurrent.load(Ordering::Relaxed)
    }

    /// Requests refused by each limit so far (requests, tokens, concurrent, quota).
    pub(crate) fn limited_counts(&self) -> [u64; 4] {
        [0, 1, 2, 3].map(|i| self.limited[i].load(Ordering::Relaxed))
    }

    /// Was a request refused by a limit in the last minute?
    pub(crate) fn limited_lately(&self, now: Instant) -> bool {
        let s = self.second(now);
        self.inner.lock().ok().and_then(|u| u.limited_at).is_some_and(|at| Window::live(at, s))
    }

    /// A request of this tenant is over: counted under its outcome and
    /// tokens, its queue time if it got a slot, and served.
    pub(crate) fn finished(&self, f: &Finished) {
        if let Some(m) = self.series() {
            m.outcome(f.outcome).inc();
            if let Some(u) = f.usage {
                m.prompt_tokens.inc_by(u.prompt_tokens);
                m.completion_tokens.inc_by(u.completion_tokens);
            }
            if f.latency_good() {
                m.goodput.inc();
            }
            if f.admitted {
                m.queue_time.observe(f.queued.as_secs_f64());
            }
        }
        self.served(f.end, f.used_tokens().unwrap_or(0), f.judged());
    }

    /// A request of this tenant ended: `tokens` served, and whether it met its class's SLO.
    pub(crate) fn served(&self, now: Instant, tokens: u64, met: Option<bool>) {
        let s = self.second(now);
        if let Ok(mut u) = self.inner.lock() {
            u.served.add(s, tokens as f64);
            if let Some(met) = met {
                u.judged.add(s, 1.0);
                u.met.add(s, met as u64 as f64);
            }
        }
    }

    /// Over the last minute: tokens served, requests judged, requests within their SLO.
    pub(crate) fn last_minute(&self, now: Instant) -> (f64, f64, f64) {
        let s = self.second(now);
        self.inner.lock().map(|u| (u.served.used(s), u.judged.used(s), u.met.used(s))).unwrap_or_default()
    }

    fn quotas(&self, u: &Usage, limits: &Limits, s: u64) -> RateState {
        let quota = |w: &Window, limit: Option<u64>| {
            limit.map(|l| Quota {
                limit: l,
                remaining: (l as f64 - w.used(s)).max(0.0).floor() as u64,
                reset: Duration::from_secs(w.clear_in(s)),
            })
        };
        RateState { requests: quota(&u.requests, limits.requests_per_minute), tokens: quota(&u.tokens, limits.tokens_per_minute) }
    }

    /// The key's quotas now.
    pub(crate) fn rates_now(&self, now: Instant) -> RateState {
        let limits = self.limits();
        let s = self.second(now);
        self.inner.lock().map(|u| self.quotas(&u, &limits, s)).unwrap_or_default()
    }

    /// Before its body is read: with `max_concurrent`, the request counts
    /// as one of the key's running ones (this instance's count against its
    /// part, or against the whole limit with a store), or is refused.
    pub(crate) fn start_reading(self: &Arc<Self>) -> Result<Reading, (u64, RateState)> {
        let shared = self.store().is_some_and(|s| s.is_up());
        let Some(max) = (if shared { self.configured_limits() } else { self.limits() }).max_concurrent else { return Ok(Reading(None)) };
        let before = self.reading.fetch_add(1, Ordering::Relaxed);
        let reading = Reading(Some(self.clone()));
        if before + self.concurrent.load(Ordering::Relaxed) >= max {
            self.count_refusal(Limit::Concurrent);
            let now = Instant::now();
            let state = tightest(self.rates_now(now), &self.quota_standing(now));
            return Err((max, state));
        }
        Ok(reading)
    }

    /// Take one request and `reserve` tokens from the key's limits, or say
    /// which limit refuses and for how long.
    pub(crate) fn admit(self: &Arc<Self>, now: Instant, reserve: u64) -> Result<(Permit, RateState), Limited> {
        let limits = self.limits();
        let s = self.second(now);
        let Ok(mut u) = self.inner.lock() else {
            // A poisoned lock: a panic elsewhere; do not hold the key's traffic for it.
            return Ok((
                Permit {
                    tenant: self.clone(),
                    second: s,
                    reserved: 0,
                    concurrent: false,
                    used: None,
                    refunded: false,
                    shared: None,
                    quota_at: None,
                },
                RateState::default(),
            ));
        };
        let refuse = |u: &mut Usage, limit: Limit, retry_after: u64, too_large: bool| {
            u.limited_at = Some(s);
            self.count_refusal(limit);
            Limited { limit, retry_after: retry_after.max(1), too_large, reserve, state: self.quotas(u, &limits, s), quota: None }
        };
        if let Some(max) = limits.max_concurrent {
            if self.concurrent.load(Ordering::Relaxed) >= max {
                return Err(refuse(&mut u, Limit::Concurrent, 1, false));
            }
        }
        if let Some(rpm) = limits.requests_per_minute {
            if u.requests.used(s) + 1.0 > rpm as f64 {
                let wait = u.requests.wait_for(s, 1.0, rpm as f64);
                return Err(refuse(&mut u, Limit::Requests, wait, false));
            }
        }
        if let Some(tpm) = limits.tokens_per_minute {
            if reserve > tpm {
                return Err(refuse(&mut u, Limit::Tokens, SLOTS as u64, true));
            }
            if u.tokens.used(s) + reserve as f64 > tpm as f64 {
                let wait = u.tokens.wait_for(s, reserve as f64, tpm as f64);
                return Err(refuse(&mut u, Limit::Tokens, wait, false));
            }
        }
        let unix = self.unix(now);
        let standing = match limits.has_quotas().then(|| u.calendar.take(unix, limits.quotas, reserve)) {
            Some(Err(q)) => {
                let mut refused = refuse(&mut u, Limit::Quota, q.retry_after, q.too_large);
                refused.state = tightest(refused.state, &u.calendar.standing(unix, limits.quotas));
                refused.quota = Some(q);
                return Err(refused);
            }
            Some(Ok(standing)) => standing,
            None => Vec::new(),
        };
        u.requests.add(s, 1.0);
        u.tokens.add(s, reserve as f64);
        let concurrent = limits.max_concurrent.is_some();
        if concurrent {
            self.concurrent.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(s) = self.series() {
            s.quotas(&standing);
        }
        let state = tightest(self.quotas(&u, &limits, s), &standing);
        let quota_at = limits.has_quotas().then_some(unix);
        Ok((
            Permit { tenant: self.clone(), second: s, reserved: reserve, concurrent, used: None, refunded: false, shared: None, quota_at },
            state,
        ))
    }

    /// Its quotas as they stand now (for `/slo`): this instance's count.
    /// With a limit store that answers, what it last said (whole quotas).
    pub(crate) fn quota_standing(&self, now: Instant) -> Vec<Standing> {
        let limits = self.limits();
        if !limits.has_quotas() {
            return Vec::new();
        }
        let unix = self.unix(now);
        let shared = self.store().is_some_and(|s| s.is_up());
        self.inner
            .lock()
            .map(|mut u| if shared { u.shared_standing.clone() } else { u.calendar.standing(unix, limits.quotas) })
            .unwrap_or_default()
    }

    /// [`Tenant::admit`] against the key's whole limits in the limit store,
    /// when there is one and it answers; `None`: it is not configured, down,
    /// or did not answer within `limits.timeout` (enforce this instance's part).
    pub(crate) async fn admit_shared(self: &Arc<Self>, now: Instant, reserve: u64) -> Option<Result<(Permit, RateState), Limited>> {
        let store = self.store.load_full().filter(|s| s.is_up())?;
        let limits = self.configured_limits();
        let s = self.second(now);
        let unix = self.unix(now);
        if limits.tokens_per_minute.is_some_and(|tpm| reserve > tpm) {
            // Too large whatever the store holds: no need to ask it.
            let state = RateState {
                tokens: limits.tokens_per_minute.map(|l| Quota { limit: l, remaining: l, reset: Duration::ZERO }),
                ..RateState::default()
            };
            return Some(Err(self.refused(s, Limit::Tokens, SLOTS as u64, true, reserve, state)));
        }
        if let Some(e) = too_large_for_quota(&limits, reserve, unix) {
            let mut refused = self.refused(s, Limit::Quota, e.retry_after, true, reserve, RateState::default());
            refused.quota = Some(e);
            return Some(Err(refused));
        }
        let concurrent = limits.max_concurrent.is_some();
        if concurrent {
            // Counted before the call: the heartbeat reports it meanwhile.
            self.concurrent.fetch_add(1, Ordering::Relaxed);
        }
        let verdict = store.admit(&self.name, &limits, reserve, unix).await;
        let undo = || {
            if concurrent {
                self.concurrent.fetch_sub(1, Ordering::Relaxed);
            }
        };
        match verdict {
            None => {
                undo();
                None
            }
            Some(Verdict::Refused { limit, retry_after, state, quota, standing }) => {
                undo();
                if let Ok(mut u) = self.inner.lock() {
                    u.shared_standing = standing;
                }
                let mut refused = self.refused(s, limit, retry_after, false, reserve, state);
                refused.quota = quota;
                Some(Err(refused))
            }
            Some(Verdict::Granted { second, state, standing }) => {
                if let Some(s) = self.series() {
                    s.quotas(&standing);
                }
                if let Ok(mut u) = self.inner.lock() {
                    u.shared_standing = standing;
                }
                let quota_at = limits.has_quotas().then_some(unix);
                let permit = Permit {
                    tenant: self.clone(),
                    second,
                    reserved: reserve,
                    concurrent,
                    used: None,
                    refunded: false,
                    shared: Some(store),
                    quota_at,
                };
                Some(Ok((permit, state)))
            }
        }
    }

    fn count_refusal(&self, limit: Limit) {
        self.limited[limit as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.series() {
            s.limited[limit as usize].inc();
        }
    }

    /// Record a refusal by `limit` in second `s`.
    fn refused(&self, s: u64, limit: Limit, retry_after: u64, too_large: bool, reserve: u64, state: RateState) -> Limited {
        if let Ok(mut u) = self.inner.lock() {
            u.limited_at = Some(s);
        }
        self.count_refusal(limit);
        Limited { limit, retry_after: retry_after.max(1), too_large, reserve, state, quota: None }
    }
}

/// Every tenant the gateway has known, by name; kept across reloads.
pub(crate) struct Tenants {
    known: Arc<Mutex<Vec<Arc<Tenant>>>>,
    next_id: std::sync::atomic::AtomicU32,
    instances: Arc<AtomicUsize>,
    store: Arc<ArcSwapOption<Store>>,
    /// This process among the limit store's instances.
    instance: String,
    base: Instant,
    base_unix: u64,
    metrics: Arc<Metrics>,
    /// The tenants made for fairness ids so far (at most [`MAX_FLOWS`]).
    flows: AtomicUsize,
}

/// The most fairness ids that become tenants of their own; the rest share
/// [`OTHER_FLOWS`] (each tenant has series of its own).
pub(crate) const MAX_FLOWS: usize = 64;
/// The tenant of the fairness ids past [`MAX_FLOWS`].
pub(crate) const OTHER_FLOWS: &str = "other-fairness-ids";

impl Tenants {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Tenants {
        use std::hash::{BuildHasher, Hasher};
        // A random id (the standard library's hasher seeds are random per process).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        Tenants {
            known: Arc::default(),
            next_id: std::sync::atomic::AtomicU32::new(0),
            instances: Arc::new(AtomicUsize::new(1)),
            store: Arc::default(),
            instance: format!("{:016x}", h.finish()),
            base: Instant::now(),
            base_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            metrics,
            flows: AtomicUsize::new(0),
        }
    }

    /// The tenant of fairness id `id` (a gateway without keys, behind the
    /// Inference Extension): one of its own, weight 1 and no limits, while
    /// fewer than [`MAX_FLOWS`] were made, else the one they share.
    pub(crate) fn flow(&self, id: &str) -> Arc<Tenant> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = known.iter().find(|t| &*t.name == id) {
            return t.clone();
        }
        let name = if self.flows.load(Ordering::Relaxed) < MAX_FLOWS { id } else { OTHER_FLOWS };
        if let Some(t) = known.iter().find(|t| &*t.name == name) {
            return t.clone();
        }
        if name == id {
            self.flows.fetch_add(1, Ordering::Relaxed);
        }
        let t = self.make(name, &TenantConfig::default());
        t.series.get_or_init(|| TenantSeries::new(&self.metrics, &t.name));
        known.push(t.clone());
        t
    }

    /// As [`Tenants::new`], its wall clock starting at `unix` (seconds since 1970).
    #[cfg(test)]
    pub(crate) fn at(metrics: Arc<Metrics>, unix: u64) -> Tenants {
        Tenants { base_unix: unix, ..Tenants::new(metrics) }
    }

    /// The tenant `name` will be under `config` (a reload's prepare step,
    /// which changes nothing live): the one already known (its windows,
    /// counters and limits carry over; the new settings arrive at
    /// [`Tenants::install`]), else a new one.
    pub(crate) fn prepare(&self, name: &str, config: &TenantConfig) -> Arc<Tenant> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = known.iter().find(|t| &*t.name == name) {
            return t.clone();
        }
        drop(known);
        self.make(name, config)
    }

    fn make(&self, name: &str, config: &TenantConfig) -> Arc<Tenant> {
        Arc::new(Tenant {
            name: name.into(),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            series: std::sync::OnceLock::new(),
            settings: ArcSwap::from_pointee(Settings::of(config)),
            instances: self.instances.clone(),
            store: self.store.clone(),
            base: self.base,
            base_unix: self.base_unix,
            inner: Mutex::new(Usage::default()),
            concurrent: AtomicU64::new(0),
            reading: AtomicU64::new(0),
            limited: Default::default(),
        })
    }

    /// The swap step of a reload (cannot fail): each tenant takes its new
    /// weight and limits, and is known from now on.
    pub(crate) fn install<'a>(&self, tenants: impl IntoIterator<Item = (&'a Arc<Tenant>, TenantConfig)>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for (t, c) in tenants {
            t.series.get_or_init(|| TenantSeries::new(&self.metrics, &t.name));
            t.settings.store(Arc::new(Settings::of(&c)));
            if !known.iter().any(|k| Arc::ptr_eq(k, t)) {
                known.push(t.clone());
            }
        }
    }

    /// The limit store `config` names: the one in use when it is the same
    /// (a reload keeps its connection), else a new one (a reload's prepare
    /// step: nothing live changes until [`Tenants::set_store`]).
    pub(crate) fn store_for(&self, config: &crate::config::LimitsConfig) -> Result<Option<Arc<Store>>, super::store::StoreError> {
        if let Some(current) = self.store.load_full().filter(|s| s.serves(config)) {
            return Ok(Some(current));
        }
        let known = Arc::downgrade(&self.known);
        let running = move || -> Vec<(Arc<str>, u64)> {
            let Some(known) = known.upgrade() else { return Vec::new() };
            let known = known.lock().unwrap_or_else(|p| p.into_inner());
            known.iter().filter(|t| t.configured_limits().max_concurrent.is_some()).map(|t| (t.name.clone(), t.concurrent())).collect()
        };
        Store::open(
            config,
            &self.instance,
            self.metrics.limits_store_up.clone(),
            self.metrics.limits_store_errors.clone(),
            Box::new(running),
        )
    }

    /// The swap step: keys' limits are kept in `store` from now on (`None`: by each instance).
    pub(crate) fn set_store(&self, store: Option<Arc<Store>>) {
        match &store {
            None => {
                self.metrics.limits_store_up.set(0);
            }
            // Its worker (settlements, heartbeats) starts now, not when it was opened.
            Some(s) => s.start(),
        }
        self.store.store(store);
    }

    /// The limit store in use, if any.
    pub(crate) fn store(&self) -> Option<Arc<Store>> {
        self.store.load_full()
    }

    /// The fleet's word: `n` instances are live and share every key's limits.
    pub(crate) fn set_instances(&self, n: usize) {
        self.instances.store(n.max(1), Ordering::Relaxed);
    }

    pub(crate) fn instances(&self) -> usize {
        self.instances.load(Ordering::Relaxed)
    }
}

mod permit;
#[cfg(test)]
mod tests;
