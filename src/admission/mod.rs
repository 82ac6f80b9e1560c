//! Admission control: the breaker gate of a class, the two-tier queue in
//! front of a pool's slots, the lease on a slot, and the per-class control
//! state they read.
//!
//! [`admit`] is the request path's admission stage. Data flows one way: the
//! observer (after the proxy) records TTFT and ITL into a class's
//! [`ClassControl`] windows; the [`publisher`] task turns those into
//! read-only views (P99, breaker state, reduction on/off) every [`TICK`];
//! the request path reads the views with atomic loads and never waits on
//! the publisher.
//!
//! This room owns the slots' accounting (the [`Lease`], the tier shares, the
//! queues, one [`PoolAdmission`] per pool); `upstream` only offers replicas
//! and their slots.

pub(crate) mod breaker;
pub(crate) mod fair;
pub(crate) mod lease;
pub(crate) mod preempt;
mod publisher;
pub(crate) mod queue;
pub(crate) mod rates;
pub(crate) mod seats;
pub(crate) mod waiting;

pub(crate) use lease::{Claim, Lease, Refusal};
pub(crate) use publisher::{publisher, Current};
pub(crate) use queue::PoolAdmission;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use indexmap::IndexMap;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use crate::config::{ClassConfig, Config, Dur, Tier};
use crate::error::GatewayError;
use crate::limits::Tenants;
use crate::sync::{AtomicF64, Rest};
use crate::telemetry::accounting::Finished;
use crate::telemetry::budget::Budget;
use crate::telemetry::metrics::{ClassLabels, Metrics};
use crate::telemetry::series::ClassSeries;
use crate::telemetry::window::{RollingHistogram, WindowStats};
use crate::telemetry::Outcome;
use breaker::{Breaker, BreakerParams, BreakerState, Gate, ProbeTicket, ReductionTrigger, TriggerParams};

/// How often the publisher refreshes the views.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// The last published view of one class.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClassView {
    pub(crate) ttft: WindowStats,
    pub(crate) itl: WindowStats,
}

/// Everything admission and reduction know about one class.
pub(crate) struct ClassControl {
    pub(crate) name: Arc<str>,
    pub(crate) tier: Tier,
    target_ttft_us: AtomicU64,
    /// `breaker.trip_ratio` (for the 429's message).
    trip_ratio: AtomicF64,
    pub(crate) ttft: RollingHistogram,
    pub(crate) itl: RollingHistogram,
    pub(crate) breaker: Breaker,
    pub(crate) reduction: ReductionTrigger,
    /// Error-budget counters (latency and availability SLIs).
    pub(crate) budget: Budget,
    view: Mutex<ClassView>,
    /// The series its requests write, looked up once per request rather
    /// than per write; replaced when a reload changes the class's targets
    /// (the new ones have buckets at them).
    pub(crate) series: ArcSwap<ClassSeries>,
    metrics: Arc<Metrics>,
    /// The breaker was armed (P99 above threshold, counting) at the last tick.
    was_armed: std::sync::atomic::AtomicBool,
    /// Its series, made when it is installed (a prepared class never
    /// installed shows nothing).
    gauges: std::sync::OnceLock<ClassGauges>,
    /// The publisher's rest, poked by each request admitted here.
    publisher: Arc<Rest>,
}

/// A class's own gauges.
struct ClassGauges {
    ttft_p99: Gauge<f64, AtomicU64>,
    breaker: Gauge,
    reduction: Gauge,
}

impl ClassControl {
    fn new(name: &str, class: &ClassConfig, config: &Config, metrics: &Arc<Metrics>, publisher: Arc<Rest>) -> ClassControl {
        let window = config.breaker.window.get();
        ClassControl {
            name: name.into(),
            tier: class.tier,
            target_ttft_us: AtomicU64::new(class.ttft.get().as_micros() as u64),
            trip_ratio: AtomicF64::new(config.breaker.trip_ratio),
            ttft: RollingHistogram::new(window),
            itl: RollingHistogram::new(window),
            breaker: Breaker::new(BreakerParams::new(&config.breaker, class.ttft.get())),
            reduction: ReductionTrigger::new(trigger_params(class, config)),
            budget: Budget::new(
                config.slo.burn_alerts.iter().map(|a| a.long.get()).max().unwrap_or(Duration::from_secs(3600)),
                config.slo.window.get(),
            ),
            view: Mutex::new(ClassView::default()),
            series: ArcSwap::from_pointee(ClassSeries::new(name, class.tier, class.ttft.get(), class.itl.get())),
            metrics: metrics.clone(),
            was_armed: false.into(),
            gauges: std::sync::OnceLock::new(),
            publisher,
        }
    }

    fn update(&self, class: &ClassConfig, config: &Config) {
        if !self.series.load().has_targets(class.ttft.get(), class.itl.get()) {
            self.series.store(Arc::new(ClassSeries::new(&self.name, self.tier, class.ttft.get(), class.itl.get())));
        }
        self.target_ttft_us.store(class.ttft.get().as_micros() as u64, Ordering::Relaxed);
        self.trip_ratio.store(config.breaker.trip_ratio);
        self.breaker.set_params(BreakerParams::new(&config.breaker, class.ttft.get()));
        self.reduction.set_params(trigger_params(class, config));
    }

    /// Installed: its series exist from now on, showing its state.
    fn go_live(&self) -> &ClassGauges {
        self.gauges.get_or_init(|| {
            let labels = ClassLabels { class: self.name.to_string() };
            let g = ClassGauges {
                ttft_p99: self.metrics.ttft_p99.get_or_create(&labels).clone(),
                breaker: self.metrics.breaker_state.get_or_create(&labels).clone(),
                reduction: self.metrics.context_reduction_active.get_or_create(&labels).clone(),
            };
            g.breaker.set(self.breaker.state() as i64);
            g.reduction.set(self.reduction.active() as i64);
            g
        })
    }

    fn observe_queue_time(&self, waited: Duration) {
        self.series.load().queue_time(&self.metrics).observe(waited.as_secs_f64());
    }

    pub(crate) fn ttft_target(&self) -> Duration {
        Duration::from_micros(self.target_ttft_us.load(Ordering::Relaxed))
    }

    /// The last published window stats.
    pub(crate) fn view(&self) -> ClassView {
        self.view.lock().map(|v| *v).unwrap_or_default()
    }

    /// Refresh the views at `now`; log every transition. Returns the TTFT stats.
    fn publish(&self, now: Instant) -> WindowStats {
        let ttft = self.ttft.publish(now);
        let itl = self.itl.publish(now);
        if let Ok(mut v) = self.view.lock() {
            *v = ClassView { ttft, itl };
        }
        let gauges = self.go_live();
        gauges.ttft_p99.set(ttft.p99.as_secs_f64());
        if let Some(t) = self.breaker.tick(now, &ttft) {
            gauges.breaker.set(t.to as i64);
            match t.to {
                BreakerState::Open => tracing::warn!(
                    class = %self.name, from = t.from.as_str(), to = t.to.as_str(),
                    ttft_p99_ms = ttft.p99.as_millis() as u64, target_ms = self.ttft_target().as_millis() as u64, samples = ttft.count,
                    "breaker opened: new requests of this class get 429"
                ),
                _ => tracing::info!(class = %self.name, from = t.from.as_str(), to = t.to.as_str(), "breaker state changed"),
            }
            if t.to == BreakerState::Closed {
                // What the window holds is about the episode just handled.
                self.ttft.reset();
                self.itl.reset();
            }
        }
        let armed = self.breaker.armed();
        if armed != self.was_armed.swap(armed, Ordering::Relaxed) {
            if armed {
                tracing::warn!(
                    class = %self.name, ttft_p99_ms = ttft.p99.as_millis() as u64, target_ms = self.ttft_target().as_millis() as u64,
                    "TTFT P99 above the breaker's trip threshold; it opens if this lasts trip_after"
                );
            } else if self.breaker.state() == BreakerState::Closed {
                tracing::info!(class = %self.name, ttft_p99_ms = ttft.p99.as_millis() as u64, "TTFT P99 back under the breaker's trip threshold");
            }
        }
        if let Some(on) = self.reduction.tick(now, &ttft) {
            gauges.reduction.set(on as i64);
            tracing::info!(class = %self.name, active = on, ttft_p99_ms = ttft.p99.as_millis() as u64, "context reduction {}", if on { "on" } else { "off" });
        }
        ttft
    }
}

fn trigger_params(class: &ClassConfig, config: &Config) -> TriggerParams {
    TriggerParams {
        target: class.ttft.get(),
        ratio: config.context_reduction.trigger_ratio,
        after: config.context_reduction.trigger_after.get(),
        min_samples: config.breaker.min_samples as u64,
    }
}

/// The controls of every class, kept across config reloads (by class name).
pub(crate) struct Controls {
    classes: Mutex<IndexMap<String, Arc<ClassControl>>>,
    metrics: Arc<Metrics>,
    /// Every tenant known, kept across reloads.
    pub(crate) tenants: Arc<Tenants>,
    /// The publisher's rest while nothing moves (see [`publisher`]).
    publisher: Arc<Rest>,
}

impl Controls {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Controls {
        Controls {
            classes: Mutex::new(IndexMap::new()),
            tenants: Arc::new(Tenants::new(metrics.clone())),
            metrics,
            publisher: Arc::default(),
        }
    }

    /// The control class `name` will have under `config` (a reload's prepare
    /// step, which changes nothing live): the running one when the class
    /// keeps its tier (its windows, breaker and budgets carry over; the new
    /// parameters arrive at [`Controls::install`]), else a new one. A class
    /// that changed tier starts afresh: its tier decides its queue-time
    /// series and the at-risk check.
    pub(crate) fn prepare(&self, name: &str, class: &ClassConfig, config: &Config) -> Arc<ClassControl> {
        let map = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(name).filter(|c| c.tier == class.tier) {
            Some(c) => c.clone(),
            None => Arc::new(ClassControl::new(name, class, config, &self.metrics, self.publisher.clone())),
        }
    }

    /// The swap step (cannot fail): from now on `classes` are the controls,
    /// with `config`'s parameters. Requests still running keep the control
    /// they started with.
    pub(crate) fn install<'a>(&self, classes: impl IntoIterator<Item = &'a Arc<ClassControl>>, config: &Config) {
        let mut map = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        for c in classes {
            if let Some(cc) = config.classes.get(&*c.name) {
                c.update(cc, config);
            }
            c.go_live();
            map.insert(c.name.to_string(), c.clone());
        }
    }

    pub(crate) fn all(&self) -> Vec<Arc<ClassControl>> {
        self.classes.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
}

/// A half-open breaker's probe: judged at its first token, or by how the
/// request ended; dropped unjudged, it gives its place back. Travels in the
/// response body with the lease.
pub(crate) struct Probe {
    control: Arc<ClassControl>,
    ticket: Option<ProbeTicket>,
}

impl Probe {
    /// The first token came after `ttft`.
    pub(crate) fn first_token(mut self, ttft: Duration) {
        if let Some(t) = self.ticket.take() {
            self.control.breaker.probe_done(t, Some(ttft <= self.control.ttft_target()));
        }
    }

    /// A non-streaming request ended: `in_time` says whether it was as fast
    /// as the class's targets allow for what it generated.
    pub(crate) fn judged(mut self, in_time: bool) {
        if let Some(t) = self.ticket.take() {
            self.control.breaker.probe_done(t, Some(in_time));
        }
    }

    /// The request is over, as `f` says: a whole answer is judged by its
    /// time against the targets for what it generated; anything else ended
    /// before its first token (a probe is judged at its first token otherwise).
    pub(crate) fn finished(self, f: &Finished) {
        if !f.streaming() && f.outcome.completed() {
            self.judged(f.answer_in_time());
        } else {
            self.ended(f.outcome);
        }
    }

    /// The request ended as `outcome` before its first token.
    pub(crate) fn ended(mut self, outcome: Outcome) {
        if let Some(t) = self.ticket.take() {
            // One past the target without a token is already slow; one that
            // says nothing about latency gives its place back.
            self.control.breaker.probe_done(t, outcome.judges_latency().then_some(false));
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.control.breaker.probe_done(t, None);
        }
    }
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("class", &self.control.name).finish()
    }
}

/// A request that may go to its pool: its slot, how long it waited for it,
/// and its probe when a half-open breaker let it through as one.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) lease: Lease,
    pub(crate) waited: Duration,
    pub(crate) probe: Option<Probe>,
}

/// The admission stage: the class's breaker gate, then a slot on `pool`
/// (maybe after a wait in its tier's queue, served fairly among tenants by
/// `claim`; `tenant` names them in refusals). A refusal is the error the
/// client gets (429 with Retry-After, or 503). A probe of a request that
/// does not stream is judged when it ends, not at a first token.
pub(crate) async fn admit(
    control: &Arc<ClassControl>,
    pool: &Arc<PoolAdmission>,
    tenant: &str,
    streaming: bool,
    body_bytes: u64,
    claim: Claim,
    key: Option<Arc<crate::upstream::prefix::RouteKey>>,
) -> Result<Admitted, GatewayError> {
    // Wakes the publisher if it rests: the views this request writes move from now on.
    control.publisher.poke();
    let probe = match control.breaker.admit() {
        Gate::Pass => None,
        Gate::Probe(ticket) => {
            if !streaming {
                control.breaker.judge_at_end(ticket);
            }
            Some(Probe { control: control.clone(), ticket: Some(ticket) })
        }
        Gate::Reject { retry_after, spread } => {
            // Everyone refused while it is open is told to come back after
            // it half-opens, spread over one more open period: they return
            // at about the rate they arrived, not in one wave at the probes.
            let retry_after = crate::error::retry_after(retry_after + spread.mul_f64(fastrand::f64()));
            return Err(GatewayError::Rejected {
                message: format!(
                    "SLO class `{}` is shedding load: the TTFT P99 of its requests within their tenants' shares has stayed above {} x its {} ms target; retry in {:.1} s",
                    control.name,
                    control.trip_ratio.load(),
                    control.ttft_target().as_millis(),
                    retry_after.as_secs_f64()
                ),
                code: "breaker_open",
                retry_after,
            });
        }
    };
    let (tier, short) = (control.tier, claim.short);
    match pool.admit(tier, body_bytes, claim, key).await {
        Ok(granted) => {
            control.observe_queue_time(granted.waited);
            // What batch leaves room for: the streams' first tokens (a
            // short request's seat is beside them, preemption.md rule 14).
            if tier == Tier::Interactive && !short {
                granted.lease.interactive_target(control.ttft_target());
            }
            Ok(Admitted { lease: granted.lease, waited: granted.waited, probe })
        }
        Err(refusal) => {
            match refusal {
                Refusal::Timeout { .. } => {
                    // The caller waited this long without a first token: a TTFT
                    // sample for the breaker's window (an overloaded pool shows
                    // up here first), and its queue time.
                    let waited = pool.timeout(tier);
                    control.ttft.record(waited);
                    control.observe_queue_time(waited);
                }
                Refusal::Late { .. } => {
                    // It would have had its first token at its target at best.
                    control.ttft.record(control.ttft_target());
                }
                // A tenant over its share waited for its own excess: its
                // signal, not the class's (docs/design/fair-share.md, rule 19).
                _ => {}
            }
            if let Some(p) = probe {
                p.ended(Outcome::rejected);
            }
            Err(refusal_error(refusal, pool, tier, tenant))
        }
    }
}

fn refusal_error(r: Refusal, admission: &PoolAdmission, tier: Tier, tenant: &str) -> GatewayError {
    let pool = admission.pool();
    let name = &pool.config.name;
    let t = tier.as_str();
    let Some(retry_after) = r.retry_after().map(|d| crate::error::retry_after(admission.schedule(tier, d))) else {
        return GatewayError::NoHealthyReplica { pool: name.clone() };
    };
    let (message, code) = match r {
        Refusal::NoHealthy => return GatewayError::NoHealthyReplica { pool: name.clone() },
        Refusal::QueueFull { .. } => (format!("the {t} queue of pool `{name}` is full"), "queue_full"),
        Refusal::QueueBytesFull { .. } => {
            (format!("the {t} queue of pool `{name}` holds its tiers.{t}.queue_max_bytes of request bodies"), "queue_full")
        }
        Refusal::Shed { .. } => (format!("batch work is shed while interactive requests wait for pool `{name}`"), "shed"),
        Refusal::Timeout { .. } => {
            (format!("no slot on pool `{name}` within the {t} queue timeout of {}", Dur(admission.timeout(tier))), "queue_timeout")
        }
        Refusal::Late { expected, .. } => (
            format!(
                "no slot on pool `{name}` in time for this request's TTFT target: its replicas take {} ms to a first token now",
                expected.as_millis()
            ),
            "queue_timeout",
        ),
        Refusal::Hopeless { .. } => {
            (format!("pool `{name}` cannot serve this {t} request before its queue timeout at the current rate"), "queue_timeout")
        }
        Refusal::Deadline { deadline, .. } => (
            format!("no slot on pool `{name}` before this request's deadline of {} ms at the current rate", deadline.as_millis()),
            "deadline_exceeded",
        ),
        Refusal::OverShare { over, why, .. } => (over_share_message(tenant, name, t, &over, why), "tenant_over_share"),
    };
    let message = format!("{message}; retry in {:.1} s", retry_after.as_secs_f64());
    GatewayError::Rejected { message, code, retry_after }
}

/// Why a tenant over its share was refused, naming the share.
fn over_share_message(tenant: &str, pool: &str, tier: &str, over: &fair::OverShare, why: lease::OverWhy) -> String {
    let what = match why {
        lease::OverWhy::Full => "the queue is full",
        lease::OverWhy::Displaced => "its place in the full queue went to a tenant within its share",
        lease::OverWhy::Late => "it could not start in time for its class's TTFT target",
        lease::OverWhy::Timeout => "it waited the queue timeout",
    };
    format!(
        "key `{tenant}` holds {} of pool `{pool}`'s {} {tier} slots, at or over its fair share of {:.1} (weight {} of {} among the keys active); \
         requests beyond a key's share are refused first when slots are short, and {what}",
        over.held, over.slots, over.part, over.weight, over.total_weight
    )
}

impl Claim {
    /// A request of `tenant` in the class of `control`, its prompt
    /// estimated at `tokens`; `fair` when keys are configured; `short` when
    /// it holds a slot for milliseconds.
    pub(crate) fn of(tenant: &crate::limits::Tenant, control: &ClassControl, tokens: u64, fair: bool, short: bool) -> Claim {
        let ttft = (control.tier == Tier::Interactive).then(|| control.ttft_target());
        Claim { share: tenant.share(), tokens, fair, ttft, short, deadline: None, resumed: false }
    }
}

#[cfg(test)]
mod tests;
