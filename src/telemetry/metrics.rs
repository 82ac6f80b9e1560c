//! Prometheus metrics, named exactly as CONTRACT.md says (prefix `slogate_`).
//!
//! Label sets are typed structs. Label values are bounded: `model` is one of
//! the models a pool serves (or `unknown`), `class` one of the configured
//! classes, so random client input cannot create series.
//!
//! Histogram buckets always contain every configured class's TTFT and ITL
//! target and twice each, so `le="0.3"` SLIs work for any config.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::histogram::AtomicHistogram;
use super::Outcome;
use crate::config::{Config, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum TierLabel {
    interactive,
    batch,
}

impl From<Tier> for TierLabel {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Interactive => TierLabel::interactive,
            Tier::Batch => TierLabel::batch,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) model: String,
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) model: String,
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
    pub(crate) outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClassTierLabels {
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ModelClassLabels {
    pub(crate) model: String,
    pub(crate) class: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SloLabels {
    pub(crate) slo: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SloWindowLabels {
    pub(crate) slo: String,
    pub(crate) window: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClassLabels {
    pub(crate) class: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BreachKind {
    ttft,
    itl,
    incomplete,
    timeout,
    error,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct BreachLabels {
    pub(crate) class: String,
    pub(crate) kind: BreachKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ReplicaLabels {
    pub(crate) pool: String,
    pub(crate) replica: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TierOnlyLabels {
    pub(crate) tier: TierLabel,
}

/// The series of one class that its requests write: `goodput` and
/// `slo_breaches` by kind, and per model the [`RequestSeries`].
///
/// A request looks its series up once, by model, instead of once per write:
/// a `Family` lookup builds the label set (a `String` per label) and hashes
/// it, eight times per request. Each series is still created on its first
/// write, as the `Family` lookup would create it, so the exposition is the
/// same. Models are the ones pools serve (and `unknown`): bounded.
pub(crate) struct ClassSeries {
    class: String,
    tier: TierLabel,
    goodput: OnceLock<Counter>,
    breaches: [OnceLock<Counter>; BREACH_KINDS],
    by_model: RwLock<HashMap<String, Arc<RequestSeries>>>,
}

/// One (model, class, tier)'s request series. See [`ClassSeries`].
pub(crate) struct RequestSeries {
    labels: RequestLabels,
    ttft: OnceLock<AtomicHistogram>,
    itl: OnceLock<AtomicHistogram>,
    tpot: OnceLock<AtomicHistogram>,
    e2e: OnceLock<AtomicHistogram>,
    outcomes: [OnceLock<Counter>; OUTCOMES],
    prompt_tokens: OnceLock<Counter>,
    generation_tokens: OnceLock<Counter>,
}

const OUTCOMES: usize = Outcome::stream_error as usize + 1;
const BREACH_KINDS: usize = BreachKind::error as usize + 1;

impl ClassSeries {
    pub(crate) fn new(class: &str, tier: Tier) -> ClassSeries {
        ClassSeries {
            class: class.to_string(),
            tier: tier.into(),
            goodput: OnceLock::new(),
            breaches: Default::default(),
            by_model: RwLock::new(HashMap::new()),
        }
    }

    /// The series of this class's requests for `model` (a model a pool serves, or `unknown`).
    pub(crate) fn for_model(&self, model: &str) -> Arc<RequestSeries> {
        if let Some(s) = self.by_model.read().unwrap_or_else(|p| p.into_inner()).get(model) {
            return s.clone();
        }
        let mut map = self.by_model.write().unwrap_or_else(|p| p.into_inner());
        map.entry(model.to_string())
            .or_insert_with(|| {
                Arc::new(RequestSeries {
                    labels: RequestLabels { model: model.to_string(), class: self.class.clone(), tier: self.tier },
                    ttft: OnceLock::new(),
                    itl: OnceLock::new(),
                    tpot: OnceLock::new(),
                    e2e: OnceLock::new(),
                    outcomes: Default::default(),
                    prompt_tokens: OnceLock::new(),
                    generation_tokens: OnceLock::new(),
                })
            })
            .clone()
    }

    pub(crate) fn goodput(&self, m: &Metrics) -> &Counter {
        self.goodput.get_or_init(|| m.goodput.get_or_create(&ClassLabels { class: self.class.clone() }).clone())
    }

    pub(crate) fn breach(&self, m: &Metrics, kind: BreachKind) -> &Counter {
        self.breaches[kind as usize].get_or_init(|| m.slo_breaches.get_or_create(&BreachLabels { class: self.class.clone(), kind }).clone())
    }
}

impl RequestSeries {
    pub(crate) fn model(&self) -> &str {
        &self.labels.model
    }

    pub(crate) fn ttft(&self, m: &Metrics) -> &AtomicHistogram {
        self.ttft.get_or_init(|| m.ttft.get_or_create(&self.labels).clone())
    }

    pub(crate) fn itl(&self, m: &Metrics) -> &AtomicHistogram {
        self.itl.get_or_init(|| m.itl.get_or_create(&self.labels).clone())
    }

    pub(crate) fn tpot(&self, m: &Metrics) -> &AtomicHistogram {
        self.tpot.get_or_init(|| m.tpot.get_or_create(&self.labels).clone())
    }

    pub(crate) fn e2e(&self, m: &Metrics) -> &AtomicHistogram {
        self.e2e.get_or_init(|| m.e2e.get_or_create(&self.labels).clone())
    }

    pub(crate) fn outcome(&self, m: &Metrics, outcome: Outcome) -> &Counter {
        self.outcomes[outcome as usize].get_or_init(|| {
            let l = &self.labels;
            m.requests.get_or_create(&OutcomeLabels { model: l.model.clone(), class: l.class.clone(), tier: l.tier, outcome }).clone()
        })
    }

    fn model_class(&self) -> ModelClassLabels {
        ModelClassLabels { model: self.labels.model.clone(), class: self.labels.class.clone() }
    }

    pub(crate) fn prompt_tokens(&self, m: &Metrics) -> &Counter {
        self.prompt_tokens.get_or_init(|| m.prompt_tokens.get_or_create(&self.model_class()).clone())
    }

    pub(crate) fn generation_tokens(&self, m: &Metrics) -> &Counter {
        self.generation_tokens.get_or_init(|| m.generation_tokens.get_or_create(&self.model_class()).clone())
    }
}

/// Builds histograms with a fixed bucket list.
#[derive(Clone)]
pub(crate) struct Buckets(Arc<Vec<f64>>);

impl MetricConstructor<AtomicHistogram> for Buckets {
    fn new_metric(&self) -> AtomicHistogram {
        AtomicHistogram::new(self.0.iter().copied())
    }
}

/// Base latency buckets (seconds), before the configured targets are merged in.
const LATENCY_BASE: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const ITL_BASE: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5];
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
    pub(crate) ttft: Family<RequestLabels, AtomicHistogram, Buckets>,
    pub(crate) itl: Family<RequestLabels, AtomicHistogram, Buckets>,
    pub(crate) tpot: Family<RequestLabels, AtomicHistogram, Buckets>,
    pub(crate) e2e: Family<RequestLabels, AtomicHistogram, Buckets>,
    pub(crate) queue_time: Family<ClassTierLabels, AtomicHistogram, Buckets>,
    pub(crate) requests: Family<OutcomeLabels, Counter>,
    pub(crate) slo_breaches: Family<BreachLabels, Counter>,
    pub(crate) prompt_tokens: Family<ModelClassLabels, Counter>,
    pub(crate) generation_tokens: Family<ModelClassLabels, Counter>,
    pub(crate) goodput: Family<ClassLabels, Counter>,
    pub(crate) queue_depth: Family<TierOnlyLabels, Gauge>,
    pub(crate) inflight: Family<ReplicaLabels, Gauge>,
    pub(crate) upstream_healthy: Family<ReplicaLabels, Gauge>,
    pub(crate) breaker_state: Family<ClassLabels, Gauge>,
    pub(crate) context_reduction_active: Family<ClassLabels, Gauge>,
    pub(crate) ttft_p99: Family<ClassLabels, Gauge<f64, AtomicU64>>,
    pub(crate) context_reduced: Family<ClassLabels, Counter>,
    pub(crate) budget_remaining: Family<SloLabels, Gauge<f64, AtomicU64>>,
    pub(crate) burn_rate: Family<SloWindowLabels, Gauge<f64, AtomicU64>>,
    pub(crate) reload_failures: Counter,
    pub(crate) reloads: Counter,
    /// Connections open on the data listener.
    pub(crate) open_connections: Gauge,
    /// Connections that waited to be accepted because `server.max_connections` were open.
    pub(crate) connections_waited: Counter,
    ttft_bounds: Arc<Vec<f64>>,
    itl_bounds: Arc<Vec<f64>>,
}

impl Metrics {
    /// Build the registry. Buckets come from the classes of `config`.
    pub fn new(config: &Config) -> Metrics {
        let ttfts: Vec<f64> = config.classes.values().map(|c| c.ttft.get().as_secs_f64()).collect();
        let itls: Vec<f64> = config.classes.values().map(|c| c.itl.get().as_secs_f64()).collect();
        let ttft_b = Buckets(Arc::new(buckets_with_targets(LATENCY_BASE, ttfts.iter().copied())));
        let itl_b = Buckets(Arc::new(buckets_with_targets(ITL_BASE, itls.iter().copied())));
        let (ttft_bounds, itl_bounds) = (ttft_b.0.clone(), itl_b.0.clone());
        let e2e_b = Buckets(Arc::new(buckets_with_targets(E2E_BASE, [])));
        let queue_b = Buckets(Arc::new(buckets_with_targets(LATENCY_BASE, ttfts.iter().copied())));

        let mut registry = Registry::with_prefix("slogate");
        let m = Metrics {
            ttft: Family::new_with_constructor(ttft_b),
            itl: Family::new_with_constructor(itl_b.clone()),
            tpot: Family::new_with_constructor(itl_b),
            e2e: Family::new_with_constructor(e2e_b),
            queue_time: Family::new_with_constructor(queue_b),
            requests: Family::default(),
            slo_breaches: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            goodput: Family::default(),
            queue_depth: Family::default(),
            inflight: Family::default(),
            upstream_healthy: Family::default(),
            breaker_state: Family::default(),
            context_reduction_active: Family::default(),
            ttft_p99: Family::default(),
            context_reduced: Family::default(),
            budget_remaining: Family::default(),
            burn_rate: Family::default(),
            reload_failures: Counter::default(),
            reloads: Counter::default(),
            open_connections: Gauge::default(),
            connections_waited: Counter::default(),
            ttft_bounds: ttft_bounds.clone(),
            itl_bounds: itl_bounds.clone(),
            registry: Registry::default(),
        };
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
        registry.register("generation_tokens", "Generated tokens reported by the replicas", m.generation_tokens.clone());
        registry.register("goodput_requests", "Requests that met both their TTFT and ITL target", m.goodput.clone());
        registry.register("queue_depth", "Requests waiting in the gateway queue", m.queue_depth.clone());
        registry.register("open_connections", "Client connections open on the data listener", m.open_connections.clone());
        registry.register(
            "connections_waited",
            "Client connections that waited to be accepted because server.max_connections were open",
            m.connections_waited.clone(),
        );
        registry.register("inflight_requests", "Requests holding a slot on a replica (until their stream ends)", m.inflight.clone());
        registry.register("upstream_healthy", "1 when the replica passes its health checks", m.upstream_healthy.clone());
        registry.register("breaker_state", "TTFT circuit breaker state: 0 closed, 1 half-open, 2 open", m.breaker_state.clone());
        registry.register(
            "context_reduction_active",
            "1 while requests of the class are rewritten to shed context",
            m.context_reduction_active.clone(),
        );
        registry.register("ttft_p99_seconds", "TTFT P99 over the breaker's rolling window", m.ttft_p99.clone());
        registry.register("context_reduced_requests", "Requests rewritten by context reduction", m.context_reduced.clone());
        registry.register(
            "error_budget_remaining_ratio",
            "Share of the error budget left over slo.window (since the process started; negative when overspent)",
            m.budget_remaining.clone(),
        );
        registry.register("error_budget_burn_rate", "Bad share over the allowed bad share, per burn-alert window", m.burn_rate.clone());
        registry.register("config_reloads", "Config reloads applied", m.reloads.clone());
        registry.register("config_reload_failures", "Config reloads rejected (the old config was kept)", m.reload_failures.clone());
        for class in config.classes.keys() {
            let l = ClassLabels { class: class.clone() };
            m.breaker_state.get_or_create(&l).set(0);
            m.context_reduction_active.get_or_create(&l).set(0);
            m.ttft_p99.get_or_create(&l).set(0.0);
        }
        for tier in [TierLabel::interactive, TierLabel::batch] {
            m.queue_depth.get_or_create(&TierOnlyLabels { tier }).set(0);
        }
        Metrics { registry, ..m }
    }

    /// Is `secs` a bucket bound of the TTFT (`what == "ttft"`) or ITL histograms?
    pub fn has_bucket(&self, what: &str, secs: f64) -> bool {
        let b = if what == "ttft" { &self.ttft_bounds } else { &self.itl_bounds };
        b.iter().any(|x| (x - secs).abs() < 1e-9)
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
mod tests {
    use super::*;

    #[test]
    fn buckets_contain_every_target_and_twice_it() {
        let b = buckets_with_targets(LATENCY_BASE, [0.3, 0.15, 0.1, 0.4, 3.0, 0.123]);
        for want in [0.3, 0.15, 0.1, 0.4, 3.0, 6.0, 0.8, 0.123, 0.246] {
            assert!(b.contains(&want), "{want} missing from {b:?}");
        }
        assert!(b.windows(2).all(|w| w[0] < w[1]), "sorted and unique: {b:?}");
    }

    #[test]
    fn exposition_has_le_for_each_class_target() {
        let cfg = Config::parse("classes:\n  chat: { tier: interactive, ttft: 300ms, itl: 50ms }\n  odd: { tier: batch, ttft: 1234ms, itl: 77ms }\ndefault_class: chat\n").expect("valid");
        let m = Metrics::new(&cfg);
        let l = RequestLabels { model: "m".into(), class: "chat".into(), tier: TierLabel::interactive };
        m.ttft.get_or_create(&l).observe(0.1);
        m.itl.get_or_create(&l).observe(0.01);
        let text = m.encode();
        for le in ["le=\"0.3\"", "le=\"0.6\"", "le=\"1.234\"", "le=\"2.468\""] {
            assert!(text.lines().any(|x| x.starts_with("slogate_time_to_first_token_seconds_bucket") && x.contains(le)), "{le} missing");
        }
        for le in ["le=\"0.05\"", "le=\"0.1\"", "le=\"0.077\"", "le=\"0.154\""] {
            assert!(text.lines().any(|x| x.starts_with("slogate_inter_token_latency_seconds_bucket") && x.contains(le)), "{le} missing");
        }
    }

    #[test]
    fn class_series_write_the_family_series_and_create_them_on_first_write() {
        let cfg = Config::parse("classes:\n  chat: { tier: interactive, ttft: 300ms, itl: 50ms }\ndefault_class: chat\n").expect("valid");
        let m = Metrics::new(&cfg);
        let c = ClassSeries::new("chat", Tier::Interactive);
        let s = c.for_model("m");
        assert!(Arc::ptr_eq(&s, &c.for_model("m")), "one series set per model");
        assert_eq!(s.model(), "m");
        // Nothing written yet: no request series in the exposition.
        let before = m.encode();
        assert!(!before.contains("slogate_requests_total{"), "{before}");
        assert!(!before.contains("slogate_time_to_first_token_seconds_count{"), "{before}");
        s.outcome(&m, Outcome::ok).inc();
        s.outcome(&m, Outcome::ok).inc();
        s.outcome(&m, Outcome::stream_error).inc();
        s.ttft(&m).observe(0.1);
        s.prompt_tokens(&m).inc_by(7);
        c.breach(&m, BreachKind::itl).inc();
        c.goodput(&m).inc();
        c.for_model("unknown").outcome(&m, Outcome::client_error).inc();
        let text = m.encode();
        for line in [
            r#"slogate_requests_total{model="m",class="chat",tier="interactive",outcome="ok"} 2"#,
            r#"slogate_requests_total{model="m",class="chat",tier="interactive",outcome="stream_error"} 1"#,
            r#"slogate_requests_total{model="unknown",class="chat",tier="interactive",outcome="client_error"} 1"#,
            r#"slogate_time_to_first_token_seconds_count{model="m",class="chat",tier="interactive"} 1"#,
            r#"slogate_prompt_tokens_total{model="m",class="chat"} 7"#,
            r#"slogate_slo_breaches_total{class="chat",kind="itl"} 1"#,
            r#"slogate_goodput_requests_total{class="chat"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // Outcomes, breach kinds and series never written stay absent.
        for absent in
            [r#"outcome="length""#, r#"kind="ttft""#, "slogate_e2e_request_latency_seconds_count{", "slogate_generation_tokens_total{"]
        {
            assert!(!text.contains(absent), "{absent} should not be in\n{text}");
        }
    }
}
