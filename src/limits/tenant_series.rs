//! A tenant's series: its requests by outcome, tokens, goodput, queue
//! time, refusals by limit and quota use, made when the tenant is installed
//! (the ones per outcome and quota at their first use).

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use super::keylimits::Limit;
use super::quota::Standing;
use crate::telemetry::histogram::AtomicHistogram;
use crate::telemetry::metrics::{Metrics, QuotaLabels, TenantKindLabels, TenantLabels, TenantOutcomeLabels};
use crate::telemetry::Outcome;

/// A tenant's metric series, looked up once (not per request).
pub(crate) struct TenantSeries {
    metrics: Arc<Metrics>,
    name: String,
    outcomes: [std::sync::OnceLock<Counter>; Outcome::ALL.len()],
    pub(crate) prompt_tokens: Counter,
    pub(crate) completion_tokens: Counter,
    pub(crate) goodput: Counter,
    pub(crate) queue_time: AtomicHistogram,
    pub(super) limited: [Counter; 4],
    /// Its quotas' use (`slogate_key_quota_used`), made at their first use.
    quota_used: [std::sync::OnceLock<prometheus_client::metrics::gauge::Gauge>; 4],
}

impl TenantSeries {
    pub(super) fn new(metrics: &Arc<Metrics>, name: &str) -> TenantSeries {
        let tenant = name.to_string();
        let kind = |kind| metrics.tenant_tokens.get_or_create(&TenantKindLabels { tenant: tenant.clone(), kind }).clone();
        let limited =
            |l: Limit| metrics.tenant_limited.get_or_create(&TenantKindLabels { tenant: tenant.clone(), kind: l.as_str() }).clone();
        TenantSeries {
            metrics: metrics.clone(),
            outcomes: Default::default(),
            prompt_tokens: kind("prompt"),
            completion_tokens: kind("completion"),
            goodput: metrics.tenant_goodput.get_or_create(&TenantLabels { tenant: tenant.clone() }).clone(),
            queue_time: metrics.tenant_queue_time.get_or_create(&TenantLabels { tenant: tenant.clone() }).clone(),
            limited: Limit::ALL.map(limited),
            quota_used: Default::default(),
            name: tenant,
        }
    }

    /// The counter of the tenant's requests that ended with `outcome` (made at its first use).
    pub(crate) fn outcome(&self, outcome: Outcome) -> &Counter {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i]
            .get_or_init(|| self.metrics.tenant_requests.get_or_create(&TenantOutcomeLabels { tenant: self.name.clone(), outcome }).clone())
    }

    /// Show quotas' use.
    pub(super) fn quotas(&self, standing: &[Standing]) {
        for q in standing {
            let i = super::quota::QUOTAS.iter().position(|p| *p == (q.period, q.kind)).unwrap_or(0);
            let labels = QuotaLabels { tenant: self.name.clone(), window: q.period.as_str(), kind: q.kind.as_str() };
            self.quota_used[i].get_or_init(|| self.metrics.quota_used.get_or_create(&labels).clone()).set(q.used as i64);
        }
    }
}
