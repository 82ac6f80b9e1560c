//! The SLO status page: `GET /slo` (self-contained HTML that refreshes
//! itself) and `GET /slo.json` (the same data), on the admin listener.
//!
//! Per class: TTFT and ITL P50/P99 over the rolling window against the
//! targets, SLO attainment, budget left and burn rates (latency and
//! availability), breaker and context-reduction state; the queue depths;
//! each replica's health and in-flight count; and the last hour at a
//! glance, per class, drawn as inline SVG from points the [`sampler`] keeps
//! in constant memory. Built from the same views the request path and the
//! metrics use; the page never touches the request path.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::config::Config;
use crate::config::Tier;
use crate::state::App;
use crate::telemetry::budget::{self, Sli};
use crate::telemetry::history::{Point, Sample};

#[derive(Debug, Serialize)]
pub(crate) struct Status {
    pub(crate) generated_at: String,
    /// When the error budgets started counting (the process start).
    pub(crate) budgets_since: String,
    pub(crate) slo: SloSpec,
    pub(crate) classes: Vec<ClassStatus>,
    pub(crate) queues: Queues,
    pub(crate) pools: Vec<PoolStatus>,
    /// Every tenant (API key, or `anonymous`) over the last minute.
    pub(crate) tenants: Vec<TenantStatus>,
    /// With `fleet` peers: this instance's id and its peers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fleet: Option<FleetStatus>,
    pub(crate) history: HistoryStatus,
}

#[derive(Debug, Serialize)]
pub(crate) struct HistoryStatus {
    /// Seconds between two points.
    pub(crate) step_s: f64,
    /// Per class, oldest first (at most 360).
    pub(crate) classes: std::collections::BTreeMap<String, Vec<Point>>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TenantStatus {
    pub(crate) name: String,
    pub(crate) weight: f64,
    /// Its share of the tokens served to all tenants over the last minute.
    pub(crate) share: f64,
    pub(crate) tokens_last_minute: u64,
    /// Requests within their class's SLO over those judged, last minute (1 with none).
    pub(crate) attainment: f64,
    pub(crate) judged_last_minute: u64,
    /// Refused by one of its own limits within the last minute.
    pub(crate) limited: bool,
    /// Its limits as configured; in a fleet each instance enforces its part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) limits: Option<TenantLimits>,
    pub(crate) concurrent: u64,
    /// Requests refused so far, by limit.
    pub(crate) refused: TenantRefused,
    /// Its day and month quotas: what it used of each in the current window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) quotas: Vec<QuotaStatus>,
}

/// One quota of a key, as it stands.
#[derive(Debug, Serialize)]
pub(crate) struct QuotaStatus {
    /// `day` or `month` (UTC calendar windows).
    pub(crate) window: &'static str,
    /// `requests` or `tokens`.
    pub(crate) kind: &'static str,
    pub(crate) limit: u64,
    pub(crate) used: u64,
    /// Seconds until the window ends and the quota comes back whole.
    pub(crate) resets_in_s: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct TenantLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) requests_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tokens_per_minute: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_concurrent: Option<u64>,
    /// The instances sharing them (1 alone).
    pub(crate) instances: usize,
    /// Where they are counted: `store` (the limit store, for every
    /// instance), `store_down` (it is configured but does not answer: this
    /// instance enforces its part) or `instance`.
    pub(crate) kept: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct TenantRefused {
    pub(crate) requests: u64,
    pub(crate) tokens: u64,
    pub(crate) concurrent: u64,
    pub(crate) quota: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct FleetStatus {
    pub(crate) id: String,
    pub(crate) peers: Vec<crate::fleet::PeerView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SloSpec {
    pub(crate) latency_objective: f64,
    pub(crate) availability_objective: f64,
    pub(crate) window: String,
    pub(crate) rolling_window: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ClassStatus {
    pub(crate) name: String,
    pub(crate) tier: &'static str,
    pub(crate) ttft_target_ms: f64,
    pub(crate) itl_target_ms: f64,
    pub(crate) ttft_p50_ms: f64,
    pub(crate) ttft_p99_ms: f64,
    pub(crate) itl_p50_ms: f64,
    pub(crate) itl_p99_ms: f64,
    pub(crate) samples: u64,
    pub(crate) breaker: &'static str,
    pub(crate) context_reduction: bool,
    pub(crate) latency: SliStatus,
    pub(crate) availability: SliStatus,
    /// What judged its completed requests for the latency SLI, since its
    /// series were made: a token stream's first token and gaps, speech's
    /// first audio byte, a whole answer's time.
    pub(crate) signals: Vec<SignalStatus>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SignalStatus {
    pub(crate) signal: crate::telemetry::metrics::Signal,
    pub(crate) judged: u64,
    pub(crate) within: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct SliStatus {
    pub(crate) objective: f64,
    /// good / valid over the SLO window (1 with no traffic).
    pub(crate) attainment: f64,
    pub(crate) good: u64,
    pub(crate) valid: u64,
    pub(crate) budget_remaining: f64,
    pub(crate) burn_rates: Vec<BurnRate>,
}

#[derive(Debug, Serialize)]
pub(crate) struct BurnRate {
    pub(crate) window: String,
    pub(crate) rate: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Queues {
    pub(crate) interactive: usize,
    pub(crate) batch: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct PoolStatus {
    pub(crate) name: String,
    /// `round_robin`, `least_loaded` or `prefix_aware`.
    pub(crate) balance: crate::config::Balance,
    /// Names (blocks and session hints) in the prefix index, and its bound.
    pub(crate) prefix_index: (usize, usize),
    /// Stored responses (the Responses API's) whose replica it knows.
    pub(crate) stored_responses: usize,
    /// Too few replicas pass their checks: all of them are routed to.
    pub(crate) panic: bool,
    pub(crate) replicas: Vec<ReplicaStatus>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ReplicaStatus {
    /// What clients are shown in `x-slogate-replica`.
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) healthy: bool,
    /// Why its last health check failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// When and why it was last taken out or brought back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_change: Option<String>,
    pub(crate) inflight: usize,
    /// Of those, the ones without a first token yet (prefilling or queued in the replica).
    pub(crate) prefilling: usize,
    /// Its slots: learned (`max_inflight_per_replica: auto`) or fixed.
    pub(crate) max_inflight: usize,
    pub(crate) limit_learned: bool,
    /// The requests the engine says it runs at once (llama.cpp's server's
    /// `total_slots`), where it says: a learned limit stays within them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) engine_slots: Option<usize>,
    /// In a fleet: the slots this instance may hold (its part of the limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fleet_slots: Option<usize>,
    /// Of the prompt bytes prefix-aware routing sent here, the share it
    /// expected cached (none before any).
    pub(crate) estimated_hit_ratio: Option<f64>,
    /// Of the prompt tokens the replica reported, the share its prefix
    /// cache held (none before any report).
    pub(crate) reported_hit_ratio: Option<f64>,
    /// Exact mode: what its KV events have brought.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kv_events: Option<crate::telemetry::kv_feeds::FeedSample>,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Collect the status now.
pub(crate) fn collect(app: &App) -> Status {
    let snap = app.snapshot();
    let cfg = &snap.config;
    let now = Instant::now();
    let classes: Vec<ClassStatus> = snap.classifier.classes().iter().map(|c| class_status(c, cfg, now)).collect();
    let since = snap.classifier.classes().iter().map(|c| c.control.budget.since()).fold(SystemTime::now(), SystemTime::min);
    let queues = Queues {
        interactive: snap.pools.iter().map(|p| p.admission.depth(Tier::Interactive)).sum(),
        batch: snap.pools.iter().map(|p| p.admission.depth(Tier::Batch)).sum(),
    };
    Status {
        generated_at: rfc3339(SystemTime::now()),
        budgets_since: rfc3339(since),
        slo: SloSpec {
            latency_objective: cfg.slo.latency_objective,
            availability_objective: cfg.slo.availability_objective,
            window: budget::window_label(cfg.slo.window.get()),
            rolling_window: budget::window_label(cfg.breaker.window.get()),
        },
        classes,
        queues,
        pools: snap.pools.iter().map(|r| pool_status(&r.pool, cfg)).collect(),
        tenants: tenants(app, now),
        history: HistoryStatus { step_s: cfg.slo.history_step.get().as_secs_f64(), classes: app.history.points() },
        fleet: cfg.fleet.enabled().then(|| FleetStatus { id: app.fleet.id().to_string(), peers: app.fleet.peers(&cfg.fleet) }),
    }
}

/// One class: its targets, its rolling percentiles, breaker and
/// reduction, and its two SLIs against their objectives.
fn class_status(c: &crate::classify::Class, cfg: &Config, now: Instant) -> ClassStatus {
    let ctl = &c.control;
    let windows = budget::burn_windows(&cfg.slo);
    let v = ctl.view();
    let total = ctl.budget.counts(now, cfg.slo.window.get());
    let sli = |sli: Sli, objective: f64| {
        let (good, valid) = match sli {
            Sli::Latency => (total.latency_good, total.latency_valid),
            Sli::Availability => (total.avail_good, total.avail_valid),
        };
        SliStatus {
            objective,
            attainment: budget::ratio(sli, &total),
            good,
            valid,
            budget_remaining: budget::remaining(sli, &total, objective),
            burn_rates: windows
                .iter()
                .map(|w| BurnRate {
                    window: budget::window_label(*w),
                    rate: budget::burn_rate(sli, &ctl.budget.counts(now, *w), objective),
                })
                .collect(),
        }
    };
    ClassStatus {
        name: c.name.to_string(),
        tier: c.tier.as_str(),
        ttft_target_ms: ms(c.ttft),
        itl_target_ms: ms(c.itl),
        ttft_p50_ms: ms(v.ttft.p50),
        ttft_p99_ms: ms(v.ttft.p99),
        itl_p50_ms: ms(v.itl.p50),
        itl_p99_ms: ms(v.itl.p99),
        samples: v.ttft.count,
        breaker: ctl.breaker.state().as_str(),
        context_reduction: ctl.reduction.active(),
        latency: sli(Sli::Latency, cfg.slo.latency_objective),
        availability: sli(Sli::Availability, cfg.slo.availability_objective),
        signals: ctl
            .series
            .load()
            .judged_counts()
            .into_iter()
            .map(|(signal, judged, within)| SignalStatus { signal, judged, within })
            .collect(),
    }
}

/// One pool's replicas: health and why not, load, slots.
fn pool_status(p: &crate::upstream::Pool, cfg: &Config) -> PoolStatus {
    PoolStatus {
        name: p.config.name.clone(),
        balance: p.config.balance,
        prefix_index: (p.prefix.len(), p.prefix.capacity()),
        stored_responses: p.owners.len(),
        panic: p.in_panic(),
        replicas: p
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| ReplicaStatus {
                name: String::from_utf8_lossy(r.public_name().as_bytes()).into_owned(),
                url: r.url.clone(),
                healthy: r.is_passing(),
                reason: r.health_error(),
                last_change: r.health.verdict.last_change(),
                inflight: r.inflight(),
                prefilling: r.prefilling(Tier::Interactive) + r.prefilling(Tier::Batch),
                max_inflight: r.max_inflight(),
                limit_learned: p.learns_limits(),
                engine_slots: r.declared_slots(),
                fleet_slots: cfg.fleet.enabled().then(|| r.slots()),
                estimated_hit_ratio: r.hit_ratios().0,
                reported_hit_ratio: r.hit_ratios().1,
                kv_events: p.exact.as_ref().and_then(|e| e.feeds.get(i)).map(|f| crate::telemetry::kv_feeds::FeedSource::sample(&**f)),
            })
            .collect(),
    }
}

/// Sample every class into the history every `slo.history_step` (read at
/// each step, so a reload takes effect), until `stop` changes.
pub(crate) fn sampler(app: std::sync::Arc<App>, mut stop: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            sample(&app);
            let step = app.snapshot().config.slo.history_step.get();
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = stop.changed() => return,
            }
        }
    })
}

/// One point per class now.
fn sample(app: &App) {
    let snap = app.snapshot();
    let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let depth = |tier: Tier| snap.pools.iter().map(|p| p.admission.depth(tier)).sum::<usize>() as u64;
    let samples: Vec<Sample<'_>> = snap
        .classifier
        .classes()
        .iter()
        .map(|c| Sample {
            class: &c.name,
            t,
            tally: c.control.budget.tally(),
            ttft_p99_ms: ms(c.control.view().ttft.p99),
            ttft_target_ms: ms(c.ttft),
            queued: depth(c.tier),
            latency_objective: snap.config.slo.latency_objective,
        })
        .collect();
    app.history.sample(&samples);
}

fn tenants(app: &App, now: Instant) -> Vec<TenantStatus> {
    let snap = app.snapshot();
    let seen: Vec<_> = snap.classifier.tenants().iter().map(|(t, _)| (t.clone(), t.last_minute(now))).collect();
    let total: f64 = seen.iter().map(|(_, (tokens, _, _))| tokens).sum();
    let instances = app.controls.tenants.instances();
    let kept = match app.controls.tenants.store() {
        Some(s) if s.is_up() => "store",
        Some(_) => "store_down",
        None => "instance",
    };
    seen.into_iter()
        .map(|(t, (tokens, judged, met))| {
            let l = t.configured_limits();
            let [requests, tok, concurrent, quota] = t.limited_counts();
            let quotas = t
                .quota_standing(now)
                .into_iter()
                .map(|q| QuotaStatus {
                    window: q.period.as_str(),
                    kind: q.kind.as_str(),
                    limit: q.limit,
                    used: q.used,
                    resets_in_s: q.reset,
                })
                .collect();
            TenantStatus {
                name: t.name.to_string(),
                weight: t.weight(),
                share: if total > 0.0 { tokens / total } else { 0.0 },
                tokens_last_minute: tokens.round() as u64,
                attainment: if judged > 0.0 { met / judged } else { 1.0 },
                judged_last_minute: judged.round() as u64,
                limited: t.limited_lately(now),
                limits: t.has_limits().then_some(TenantLimits {
                    requests_per_minute: l.requests_per_minute,
                    tokens_per_minute: l.tokens_per_minute,
                    max_concurrent: l.max_concurrent,
                    instances,
                    kept,
                }),
                concurrent: t.concurrent(),
                refused: TenantRefused { requests, tokens: tok, concurrent, quota },
                quotas,
            }
        })
        .collect()
}

mod html;
pub(crate) use html::html;
