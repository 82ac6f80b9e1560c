//! The series a class's requests write, looked up once per request: a
//! class's own (`goodput`, `slo_breaches`, the latency verdicts) and, per
//! model and endpoint kind, a request's ([`RequestSeries`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use prometheus_client::metrics::counter::Counter;

use super::histogram::AtomicHistogram;
use super::metrics::*;
use super::Outcome;
use crate::config::{Endpoint, Tier};

/// A class's request series, per model, per endpoint kind.
type ByModel = HashMap<String, Vec<(Endpoint, Arc<RequestSeries>)>>;

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
    layout: ClassLayout,
    queue_time: OnceLock<AtomicHistogram>,
    goodput: OnceLock<Counter>,
    /// `latency_judged_requests`, per [`Signal`], within (0) or not (1).
    judged: [[OnceLock<Counter>; 2]; 3],
    breaches: [OnceLock<Counter>; BREACH_KINDS],
    /// `finish_reasons`, per [`FinishReason`].
    finishes: [OnceLock<Counter>; 5],
    /// Per model, per endpoint kind.
    by_model: RwLock<ByModel>,
}

/// One (model, class, tier)'s request series. See [`ClassSeries`].
pub(crate) struct RequestSeries {
    labels: RequestLabels,
    layout: ClassLayout,
    ttft: OnceLock<AtomicHistogram>,
    itl: OnceLock<AtomicHistogram>,
    tpot: OnceLock<AtomicHistogram>,
    e2e: OnceLock<AtomicHistogram>,
    outcomes: [OnceLock<Counter>; OUTCOMES],
    prompt_tokens: OnceLock<Counter>,
    cached_prompt_tokens: OnceLock<Counter>,
    generation_tokens: OnceLock<Counter>,
    usage_estimated: OnceLock<Counter>,
}

const OUTCOMES: usize = Outcome::ALL.len();
const BREACH_KINDS: usize = BreachKind::error as usize + 1;

impl ClassSeries {
    /// `finish_reasons_total{class,reason}`.
    pub(crate) fn finish(&self, m: &Metrics, reason: super::labels::FinishReason) -> &Counter {
        self.finishes[reason as usize]
            .get_or_init(|| m.finish_reasons.get_or_create(&super::labels::FinishLabels { class: self.class.clone(), reason }).clone())
    }

    /// The series of `class`, whose latency histograms have buckets at
    /// `ttft` and `itl` (its targets) and twice each.
    pub(crate) fn new(class: &str, tier: Tier, ttft: std::time::Duration, itl: std::time::Duration) -> ClassSeries {
        ClassSeries {
            class: class.to_string(),
            tier: tier.into(),
            layout: ClassLayout::new(ttft, itl),
            queue_time: OnceLock::new(),
            goodput: OnceLock::new(),
            judged: Default::default(),
            breaches: Default::default(),
            finishes: Default::default(),
            by_model: RwLock::new(HashMap::new()),
        }
    }

    /// The series of this class's requests for `model` (a model a pool
    /// serves, or `unknown`) at `endpoint`.
    pub(crate) fn for_request(&self, model: &str, endpoint: Endpoint) -> Arc<RequestSeries> {
        let found = |m: &ByModel| m.get(model).and_then(|v| v.iter().find(|(e, _)| *e == endpoint).map(|(_, s)| s.clone()));
        if let Some(s) = found(&self.by_model.read().unwrap_or_else(|p| p.into_inner())) {
            return s;
        }
        let mut map = self.by_model.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = found(&map) {
            return s;
        }
        let series = Arc::new(RequestSeries {
            labels: RequestLabels { model: model.to_string(), class: self.class.clone(), tier: self.tier, endpoint: endpoint.as_str() },
            layout: self.layout.clone(),
            ttft: OnceLock::new(),
            itl: OnceLock::new(),
            tpot: OnceLock::new(),
            e2e: OnceLock::new(),
            outcomes: Default::default(),
            prompt_tokens: OnceLock::new(),
            cached_prompt_tokens: OnceLock::new(),
            generation_tokens: OnceLock::new(),
            usage_estimated: OnceLock::new(),
        });
        map.entry(model.to_string()).or_default().push((endpoint, series.clone()));
        series
    }

    /// Were these series made for these targets?
    pub(crate) fn has_targets(&self, ttft: std::time::Duration, itl: std::time::Duration) -> bool {
        self.layout.targets == (ttft, itl)
    }

    /// `queue_time_seconds{class,tier}`.
    pub(crate) fn queue_time(&self, m: &Metrics) -> &AtomicHistogram {
        self.queue_time
            .get_or_init(|| m.queue_time.get_or_create(&ClassTierLabels { class: self.class.clone(), tier: self.tier }, &self.layout.ttft))
    }

    pub(crate) fn goodput(&self, m: &Metrics) -> &Counter {
        self.goodput.get_or_init(|| m.goodput.get_or_create(&ClassLabels { class: self.class.clone() }).clone())
    }

    /// `latency_judged_requests_total{class,signal,within}`.
    pub(crate) fn judged(&self, m: &Metrics, signal: Signal, within: bool) -> &Counter {
        self.judged[signal as usize][!within as usize].get_or_init(|| {
            let labels = JudgedLabels { class: self.class.clone(), signal, within: if within { "true" } else { "false" } };
            m.latency_judged.get_or_create(&labels).clone()
        })
    }

    /// Per signal: completed requests it judged since these series were
    /// made, and how many of them were within the targets.
    pub(crate) fn judged_counts(&self) -> [(Signal, u64, u64); 3] {
        let n = |s: Signal, i: usize| self.judged[s as usize][i].get().map_or(0, |c| c.get());
        Signal::ALL.map(|s| (s, n(s, 0) + n(s, 1), n(s, 0)))
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
        self.ttft.get_or_init(|| m.ttft.get_or_create(&self.labels, &self.layout.ttft))
    }

    pub(crate) fn itl(&self, m: &Metrics) -> &AtomicHistogram {
        self.itl.get_or_init(|| m.itl.get_or_create(&self.labels, &self.layout.itl))
    }

    pub(crate) fn tpot(&self, m: &Metrics) -> &AtomicHistogram {
        self.tpot.get_or_init(|| m.tpot.get_or_create(&self.labels, &self.layout.itl))
    }

    pub(crate) fn e2e(&self, m: &Metrics) -> &AtomicHistogram {
        self.e2e.get_or_init(|| m.e2e.get_or_create(&self.labels).clone())
    }

    pub(crate) fn outcome(&self, m: &Metrics, outcome: Outcome) -> &Counter {
        self.outcomes[outcome as usize].get_or_init(|| {
            let l = &self.labels;
            m.requests
                .get_or_create(&OutcomeLabels {
                    model: l.model.clone(),
                    class: l.class.clone(),
                    tier: l.tier,
                    endpoint: l.endpoint,
                    outcome,
                })
                .clone()
        })
    }

    fn model_class(&self) -> ModelClassLabels {
        ModelClassLabels { model: self.labels.model.clone(), class: self.labels.class.clone() }
    }

    pub(crate) fn prompt_tokens(&self, m: &Metrics) -> &Counter {
        self.prompt_tokens.get_or_init(|| m.prompt_tokens.get_or_create(&self.model_class()).clone())
    }

    pub(crate) fn cached_prompt_tokens(&self, m: &Metrics) -> &Counter {
        self.cached_prompt_tokens.get_or_init(|| m.cached_prompt_tokens.get_or_create(&self.model_class()).clone())
    }

    pub(crate) fn generation_tokens(&self, m: &Metrics) -> &Counter {
        self.generation_tokens.get_or_init(|| m.generation_tokens.get_or_create(&self.model_class()).clone())
    }

    pub(crate) fn usage_estimated(&self, m: &Metrics) -> &Counter {
        self.usage_estimated.get_or_init(|| m.usage_estimated.get_or_create(&self.model_class()).clone())
    }
}

/// The bucket bounds of one class's latency histograms.
#[derive(Clone)]
struct ClassLayout {
    targets: (std::time::Duration, std::time::Duration),
    /// TTFT and queue time.
    ttft: Arc<[f64]>,
    /// ITL and time per output token.
    itl: Arc<[f64]>,
}

impl ClassLayout {
    fn new(ttft: std::time::Duration, itl: std::time::Duration) -> ClassLayout {
        ClassLayout {
            targets: (ttft, itl),
            ttft: buckets_with_targets(LATENCY_BASE, [ttft.as_secs_f64()]).into(),
            itl: buckets_with_targets(ITL_BASE, [itl.as_secs_f64()]).into(),
        }
    }
}
