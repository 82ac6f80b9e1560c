//! Prometheus metrics (prefix `slogate_`): their names are part of the
//! interface users' dashboards and alert rules depend on (the list is in
//! docs/operations.md); their label sets are in [`super::labels`].
//!
//! A class's latency histograms have buckets at its TTFT and ITL targets and
//! twice each (plus common ones), so `le="0.3"` SLIs work for any config; a
//! reload that adds a class or changes a target adds its buckets.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::histogram::{AtomicHistogram, HistogramFamily};
use super::kv_feeds::{KvFeeds, KvFeedsCollector};
pub(crate) use super::labels::*;
use crate::config::Config;

/// Builds histograms with a fixed bucket list.
#[derive(Clone)]
pub(crate) struct Buckets(Arc<Vec<f64>>);

impl MetricConstructor<AtomicHistogram> for Buckets {
    fn new_metric(&self) -> AtomicHistogram {
        AtomicHistogram::new(self.0.iter().copied())
    }
}

/// Base latency buckets (seconds), before the configured targets are merged in.
pub(super) const LATENCY_BASE: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
pub(super) const ITL_BASE: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5];
/// The endpoint picker's decisions: tenths of a millisecond up.
const EPP_DECISION: &[f64] = &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const E2E_BASE: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0];

/// `base` plus every target and twice every target, sorted and deduplicated
/// at microsecond precision (so `0.3` from `300ms` and `2 x 150ms` is one bucket).
pub(crate) fn buckets_with_targets(base: &[f64], targets: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut micros: Vec<u64> = base.iter().map(|s| (s * 1e6).round() as u64).collect();
    for t in targets {
        micros.push((t * 1e6).round() as u64);
        micros.push((t * 2e6).round() as u64);
    }
    micros.sort_unstable();
    micros.dedup();
    micros.into_iter().filter(|&m| m > 0).map(|m| m as f64 / 1e6).collect()
}

/// Every metric slogate exports.
pub struct Metrics {
    pub(crate) registry: Registry,
    pub(crate) ttft: HistogramFamily<RequestLabels>,
    pub(crate) itl: HistogramFamily<RequestLabels>,
    pub(crate) tpot: HistogramFamily<RequestLabels>,
    pub(crate) e2e: Family<RequestLabels, AtomicHistogram, Buckets>,
    pub(crate) queue_time: HistogramFamily<ClassTierLabels>,
    pub(crate) requests: Family<OutcomeLabels, Counter>,
    pub(crate) slo_breaches: Family<BreachLabels, Counter>,
    pub(crate) prompt_tokens: Family<ModelClassLabels, Counter>,
    /// Of the prompt tokens, those the engines' prefix caches held (their usage's `cached_tokens`).
    pub(crate) cached_prompt_tokens: Family<ModelClassLabels, Counter>,
    pub(crate) generation_tokens: Family<ModelClassLabels, Counter>,
    pub(crate) usage_estimated: Family<ModelClassLabels, Counter>,
    pub(crate) goodput: Family<ClassLabels, Counter>,
    pub(crate) latency_judged: Family<JudgedLabels, Counter>,
    pub(crate) queue_depth: Family<TierOnlyLabels, Gauge>,
    pub(crate) inflight: Family<ReplicaLabels, Gauge>,
    pub(crate) upstream_healthy: Family<ReplicaLabels, Gauge>,
    /// 1 while a pool routes to all its replicas because too few pass their checks.
    pub(crate) pool_panic: Family<PoolLabels, Gauge>,
    /// A pool's seats held by each tier, and those kept for interactive requests.
    pub(crate) pool_seats: Family<PoolTierLabels, Gauge>,
    pub(crate) pool_reserved_seats: Family<PoolLabels, Gauge>,
    /// Slots per replica: the learned limit, or the fixed one.
    pub(crate) replica_limit: Family<ReplicaLabels, Gauge>,
    pub(crate) replica_batch_cut: Family<ReplicaLabels, Gauge>,
    /// Prefix-aware routing: prompt bytes sent to a replica, and those it expected cached there.
    pub(crate) replica_prefix_routed_bytes: Family<ReplicaLabels, Counter>,
    pub(crate) replica_prefix_matched_bytes: Family<ReplicaLabels, Counter>,
    /// What a replica's engine reported: prompt tokens, and those its prefix cache held.
    pub(crate) replica_prompt_tokens: Family<ReplicaLabels, Counter>,
    pub(crate) replica_cached_prompt_tokens: Family<ReplicaLabels, Counter>,
    /// In a fleet: this instance's part of a replica's limit.
    pub(crate) replica_slots: Family<ReplicaLabels, Gauge>,
    /// In a fleet: the other instances by standing.
    pub(crate) fleet_peers: Family<FleetPeerLabels, Gauge>,
    pub(crate) breaker_state: Family<ClassLabels, Gauge>,
    pub(crate) context_reduction_active: Family<ClassLabels, Gauge>,
    pub(crate) ttft_p99: Family<ClassLabels, Gauge<f64, AtomicU64>>,
    pub(crate) context_reduced: Family<ClassLabels, Counter>,
    /// Completed answers by finish reason (`length`: the client's own limit, no breach).
    pub(crate) finish_reasons: Family<super::labels::FinishLabels, Counter>,
    /// Broken streams continued on another replica, and those that were not.
    pub(crate) stream_resumes: Family<ResumeLabels, Counter>,
    pub(crate) stream_unresumed: Family<UnresumedLabels, Counter>,
    /// Batch streams preempted for interactive requests, the pause each
    /// one's client saw, and the tokens their continuations prefilled again.
    pub(crate) preemptions: Family<PoolLabels, Counter>,
    pub(crate) preemption_pause: HistogramFamily<PoolLabels>,
    pub(crate) preemption_redone_tokens: Family<PoolLabels, Counter>,
    /// A replica's predicted time from dispatch to first token against
    /// what came: the error, and how often the first token came later.
    pub(crate) first_token_prediction_error: HistogramFamily<ReplicaLabels>,
    pub(crate) first_token_predicted_late: Family<ReplicaLabels, Counter>,
    pub(crate) budget_remaining: Family<SloLabels, Gauge<f64, AtomicU64>>,
    pub(crate) burn_rate: Family<SloWindowLabels, Gauge<f64, AtomicU64>>,
    pub(crate) reload_failures: Counter,
    pub(crate) reloads: Counter,
    /// Connections open on the data listener.
    pub(crate) open_connections: Gauge,
    /// Request body bytes the data listener's requests hold in memory.
    pub(crate) request_body_bytes_held: Gauge,
    /// Connections that waited to be accepted because `server.max_connections` were open.
    pub(crate) connections_waited: Counter,
    pub(crate) tenant_requests: Family<TenantOutcomeLabels, Counter>,
    pub(crate) tenant_tokens: Family<TenantKindLabels, Counter>,
    pub(crate) tenant_goodput: Family<TenantLabels, Counter>,
    pub(crate) tenant_queue_time: Family<TenantLabels, AtomicHistogram, Buckets>,
    pub(crate) tenant_limited: Family<TenantKindLabels, Counter>,
    /// The limit store (`limits.redis`) answered its last call (1) or not (0).
    pub(crate) limits_store_up: Gauge,
    /// Limit checks the store did not answer in time (the instance's own part was enforced).
    pub(crate) limits_store_errors: Counter,
    /// Access log lines dropped because the writer was behind (the buffer was full).
    pub(crate) access_log_dropped: Counter,
    /// A key's tokens or requests used in the current day or month (`window`, `kind`), where it has such a quota.
    pub(crate) quota_used: Family<QuotaLabels, Gauge>,
    /// Exact prefix routing's event streams, read at each scrape.
    pub(crate) kv_feeds: Arc<KvFeeds>,
    /// As Envoy's endpoint picker: from a whole request to the answer that
    /// picks its replica or refuses it (its queueing included).
    pub(crate) epp_decision: prometheus_client::metrics::histogram::Histogram,
}

/// The request series: latencies, outcomes, tokens, goodput.
fn register_requests(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "time_to_first_token_seconds",
        "Time from request received to the first content-bearing event sent to the client",
        m.ttft.clone(),
    );
    registry.register(
        "inter_token_latency_seconds",
        "Gap between consecutive content-bearing events as delivered to the client",
        m.itl.clone(),
    );
    registry.register("time_per_output_token_seconds", "(e2e - TTFT) / (output_tokens - 1) per request", m.tpot.clone());
    registry.register("e2e_request_latency_seconds", "Time from request received to the end of the response", m.e2e.clone());
    registry.register("queue_time_seconds", "Time spent waiting in the gateway queue", m.queue_time.clone());
    registry.register("requests", "Requests by outcome", m.requests.clone());
    registry.register("slo_breaches", "Requests that breached their class SLO, by kind", m.slo_breaches.clone());
    registry.register("prompt_tokens", "Prompt tokens reported by the replicas", m.prompt_tokens.clone());
    registry.register(
        "cached_prompt_tokens",
        "Of the prompt tokens the replicas reported, those their prefix cache held (usage.prompt_tokens_details.cached_tokens)",
        m.cached_prompt_tokens.clone(),
    );
    registry.register("generation_tokens", "Generated tokens reported by the replicas", m.generation_tokens.clone());
    registry.register(
        "usage_estimated_requests",
        "Requests whose replica reported no usage; their tokens (in prompt_tokens and generation_tokens) are estimated: \
         completion from the content events (or the answer's text, four characters a token), prompt from the body (four bytes a token)",
        m.usage_estimated.clone(),
    );
    registry.register("goodput_requests", "Requests that met both their TTFT and ITL target", m.goodput.clone());
    registry.register(
        "latency_judged_requests",
        "Completed requests judged for the latency SLI, by what judged them (ttft: a token stream's first token and gaps; \
         first_byte: a binary stream's first byte; e2e: a whole answer, against a stream at the targets) and whether within the class's targets",
        m.latency_judged.clone(),
    );
}

/// The queue, connection and replica series, and the fleet's.
fn register_replicas(registry: &mut Registry, m: &Metrics) {
    registry.register("queue_depth", "Requests waiting in the gateway queue", m.queue_depth.clone());
    registry.register("open_connections", "Client connections open on the data listener", m.open_connections.clone());
    registry.register(
        "request_body_bytes_held",
        "Request body bytes held in memory by the data listener's requests (bounded by server.max_buffered_body_bytes)",
        m.request_body_bytes_held.clone(),
    );
    registry.register(
        "connections_waited",
        "Client connections that waited to be accepted because server.max_connections were open",
        m.connections_waited.clone(),
    );
    registry.register("inflight_requests", "Requests holding a slot on a replica (until their stream ends)", m.inflight.clone());
    registry.register("upstream_healthy", "1 when the replica passes its health checks", m.upstream_healthy.clone());
    registry.register(
        "pool_panic",
        "1 while fewer than health.panic_threshold of the pool's replicas pass their checks and all of them are routed to",
        m.pool_panic.clone(),
    );
    registry.register(
        "pool_seats",
        "Slots of the pool's replicas this instance's requests of each tier hold (until their streams end)",
        m.pool_seats.clone(),
    );
    registry.register(
        "pool_reserved_seats",
        "Slots of the pool kept from batch for interactive requests now: the reservation, which follows interactive demand up to reserved_share",
        m.pool_reserved_seats.clone(),
    );
    registry.register(
        "replica_limit",
        "Requests the gateway lets a replica hold at once: learned (max_inflight_per_replica: auto) or fixed",
        m.replica_limit.clone(),
    );
    registry.register(
        "replica_batch_cut",
        "Seats of a replica's learned limit batch requests leave to interactive ones, because interactive first tokens came late under load",
        m.replica_batch_cut.clone(),
    );
    registry.register(
        "replica_prefix_routed_bytes",
        "Prefix-aware routing: prompt bytes sent to the replica",
        m.replica_prefix_routed_bytes.clone(),
    );
    registry.register(
        "replica_prefix_matched_bytes",
        "Prefix-aware routing: of the prompt bytes sent to the replica, those it expected the replica's prefix cache to hold",
        m.replica_prefix_matched_bytes.clone(),
    );
    registry.register("replica_prompt_tokens", "Prompt tokens the replica reported", m.replica_prompt_tokens.clone());
    registry.register(
        "replica_cached_prompt_tokens",
        "Of the prompt tokens the replica reported, those its prefix cache held",
        m.replica_cached_prompt_tokens.clone(),
    );
    registry.register(
        "replica_slots",
        "With fleet peers: the requests this instance may hold on a replica, its part of the replica's limit",
        m.replica_slots.clone(),
    );
    registry.register(
        "fleet_peers",
        "Other instances of the fleet: fresh (heard within peer_timeout), lost, gone (past takeover_after)",
        m.fleet_peers.clone(),
    );
}

/// The class controls' series: breaker, reduction, budgets.
fn register_controls(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "epp_decision_seconds",
        "As Envoy's endpoint picker: time from a whole request to the answer that picks its replica or refuses it (its queueing included)",
        m.epp_decision.clone(),
    );
    registry.register("breaker_state", "TTFT circuit breaker state: 0 closed, 1 half-open, 2 open", m.breaker_state.clone());
    registry.register(
        "context_reduction_active",
        "1 while requests of the class are rewritten to shed context",
        m.context_reduction_active.clone(),
    );
    registry.register("ttft_p99_seconds", "TTFT P99 over the breaker's rolling window", m.ttft_p99.clone());
    registry.register("context_reduced_requests", "Requests rewritten by context reduction", m.context_reduced.clone());
    registry.register(
        "finish_reasons",
        "Completed answers by finish reason (stop, length, tool_calls, content_filter, other)",
        m.finish_reasons.clone(),
    );
    registry.register(
        "error_budget_remaining_ratio",
        "Share of the error budget left over slo.window (since the process started; negative when overspent)",
        m.budget_remaining.clone(),
    );
    registry.register("error_budget_burn_rate", "Bad share over the allowed bad share, per burn-alert window", m.burn_rate.clone());
    registry.register(
        "stream_resumes",
        "Streams that broke on a replica (reason: reset, eof, error_event, stall), continued on another replica",
        m.stream_resumes.clone(),
    );
    registry.register(
        "stream_unresumed",
        "Streams that broke and were not continued on another replica (why: not_exact, finished, attempts, no_replica, failed)",
        m.stream_unresumed.clone(),
    );
    registry.register(
        "preemptions",
        "Batch streams whose slot went to an interactive request, continued later (pools[].preempt)",
        m.preemptions.clone(),
    );
    registry.register(
        "preemption_pause_seconds",
        "From a batch stream's preemption to its continuation going out, as its client waited",
        m.preemption_pause.clone(),
    );
    registry.register(
        "first_token_prediction_error_seconds",
        "How far a replica's first token came from the time predicted at dispatch (the prefill work ahead and the request's own, at the rate the replica's recent first tokens took)",
        m.first_token_prediction_error.clone(),
    );
    registry.register(
        "first_token_predicted_late",
        "First tokens that came later than predicted at dispatch",
        m.first_token_predicted_late.clone(),
    );
    registry.register(
        "preemption_redone_tokens",
        "Tokens a preempted stream's continuation prefilled again (its prompt and what it had sent)",
        m.preemption_redone_tokens.clone(),
    );
}

/// The tenants' series, the limit store's and the access log's.
fn register_tenants(registry: &mut Registry, m: &Metrics) {
    registry.register("tenant_requests", "Requests by tenant (API key name) and outcome", m.tenant_requests.clone());
    registry.register(
        "tenant_tokens",
        "Tokens by tenant, as the replicas reported them (kind: prompt, completion)",
        m.tenant_tokens.clone(),
    );
    registry.register(
        "tenant_goodput_requests",
        "A tenant's requests that met both their class's TTFT and ITL target",
        m.tenant_goodput.clone(),
    );
    registry.register("tenant_queue_time_seconds", "Time a tenant's requests waited in the gateway queue", m.tenant_queue_time.clone());
    registry.register(
        "tenant_limited_requests",
        "A tenant's requests refused by its key's own limits (kind: requests, tokens, concurrent)",
        m.tenant_limited.clone(),
    );
    registry.register(
        "limits_store_up",
        "1 while the limit store (limits.redis) answers; 0: each instance enforces its part of every key's limits",
        m.limits_store_up.clone(),
    );
    registry.register(
        "limits_store_errors",
        "Key limit checks the limit store did not answer within limits.timeout (the instance's part was enforced)",
        m.limits_store_errors.clone(),
    );
    registry.register(
        "access_log_dropped",
        "Access log lines dropped because the writer fell behind (telemetry.access_log.buffer was full)",
        m.access_log_dropped.clone(),
    );
    registry.register(
        "key_quota_used",
        "A key's use of its day or month quota so far (this instance's count, or the limit store's when it answers)",
        m.quota_used.clone(),
    );
}

impl Metrics {
    /// Build the registry, with the gauges of the classes of `config`.
    /// Histogram buckets come from each class's series (`telemetry::series::ClassSeries`).
    pub fn new(config: &Config) -> Metrics {
        let e2e_b = Buckets(Arc::new(buckets_with_targets(E2E_BASE, [])));

        let mut registry = Registry::with_prefix("slogate");
        let m = Metrics {
            ttft: HistogramFamily::default(),
            itl: HistogramFamily::default(),
            tpot: HistogramFamily::default(),
            e2e: Family::new_with_constructor(e2e_b),
            queue_time: HistogramFamily::default(),
            requests: Family::default(),
            slo_breaches: Family::default(),
            prompt_tokens: Family::default(),
            cached_prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            usage_estimated: Family::default(),
            goodput: Family::default(),
            latency_judged: Family::default(),
            queue_depth: Family::default(),
            inflight: Family::default(),
            upstream_healthy: Family::default(),
            pool_panic: Family::default(),
            pool_seats: Family::default(),
            pool_reserved_seats: Family::default(),
            replica_limit: Family::default(),
            replica_batch_cut: Family::default(),
            replica_prefix_routed_bytes: Family::default(),
            replica_prefix_matched_bytes: Family::default(),
            replica_prompt_tokens: Family::default(),
            replica_cached_prompt_tokens: Family::default(),
            replica_slots: Family::default(),
            fleet_peers: Family::default(),
            breaker_state: Family::default(),
            context_reduction_active: Family::default(),
            ttft_p99: Family::default(),
            context_reduced: Family::default(),
            finish_reasons: Family::default(),
            stream_resumes: Family::default(),
            stream_unresumed: Family::default(),
            preemptions: Family::default(),
            preemption_pause: HistogramFamily::default(),
            preemption_redone_tokens: Family::default(),
            first_token_prediction_error: HistogramFamily::default(),
            first_token_predicted_late: Family::default(),
            budget_remaining: Family::default(),
            burn_rate: Family::default(),
            reload_failures: Counter::default(),
            reloads: Counter::default(),
            open_connections: Gauge::default(),
            request_body_bytes_held: Gauge::default(),
            connections_waited: Counter::default(),
            tenant_requests: Family::default(),
            tenant_tokens: Family::default(),
            tenant_goodput: Family::default(),
            tenant_queue_time: Family::new_with_constructor(Buckets(Arc::new(LATENCY_BASE.to_vec()))),
            tenant_limited: Family::default(),
            limits_store_up: Gauge::default(),
            limits_store_errors: Counter::default(),
            access_log_dropped: Counter::default(),
            quota_used: Family::default(),
            kv_feeds: Arc::new(KvFeeds::default()),
            epp_decision: prometheus_client::metrics::histogram::Histogram::new(EPP_DECISION.iter().copied()),
            registry: Registry::default(),
        };
        register_requests(&mut registry, &m);
        register_replicas(&mut registry, &m);
        register_controls(&mut registry, &m);
        register_tenants(&mut registry, &m);
        registry.register_collector(Box::new(KvFeedsCollector(m.kv_feeds.clone())));
        registry.register("config_reloads", "Config reloads applied", m.reloads.clone());
        registry.register("config_reload_failures", "Config reloads rejected (the old config was kept)", m.reload_failures.clone());
        m.start_at_zero(config);
        Metrics { registry, ..m }
    }

    /// The series an alert reads from the start: each class's breaker,
    /// reduction and P99, each tier's queue, at zero.
    fn start_at_zero(&self, config: &Config) {
        for class in config.classes.keys() {
            let l = ClassLabels { class: class.clone() };
            self.breaker_state.get_or_create(&l).set(0);
            self.context_reduction_active.get_or_create(&l).set(0);
            self.ttft_p99.get_or_create(&l).set(0.0);
        }
        for tier in [TierLabel::interactive, TierLabel::batch] {
            self.queue_depth.get_or_create(&TierOnlyLabels { tier }).set(0);
        }
    }

    /// The OpenMetrics text exposition (`application/openmetrics-text`).
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The Prometheus text format 0.0.4 (what `promtool check metrics` and
    /// most scrapers expect): OpenMetrics names counter families without
    /// `_total` in HELP/TYPE and ends with `# EOF`; the classic format does not.
    pub fn encode(&self) -> String {
        openmetrics_to_prometheus(&self.encode_openmetrics())
    }
}

/// Rewrite OpenMetrics text as Prometheus text format 0.0.4.
pub(crate) fn openmetrics_to_prometheus(om: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        om.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let meta = line.strip_prefix("# HELP ").map(|r| ("# HELP ", r)).or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        match meta {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(kind);
                out.push_str(name);
                if counters.contains(name) && !name.ends_with("_total") {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
