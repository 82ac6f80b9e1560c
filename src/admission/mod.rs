//! Admission control: the breaker gate of a class, the two-tier queue in
//! front of a pool's slots, and the per-class control state both read.
//!
//! Data flows one way. The observer (after the proxy) records TTFT and ITL
//! into a class's [`ClassControl`] windows; the [`publisher`] task turns
//! those into read-only views (P99, breaker state, reduction on/off) every
//! [`TICK`]; the request path reads the views with atomic loads and never
//! waits on the publisher.

pub mod breaker;
pub mod queue;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indexmap::IndexMap;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{ClassConfig, Config, Tier};
use crate::state::App;
use crate::telemetry::budget::{self, Budget, Sli};
use crate::telemetry::metrics::{ClassLabels, ClassSeries, ClassTierLabels, Metrics, SloLabels, SloWindowLabels};
use crate::telemetry::window::{RollingHistogram, WindowStats};
use breaker::{Breaker, BreakerParams, BreakerState, ReductionTrigger, TriggerParams};

/// How often the publisher refreshes the views.
pub const TICK: Duration = Duration::from_millis(250);

/// The last published view of one class.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassView {
    pub ttft: WindowStats,
    pub itl: WindowStats,
}

/// Everything admission and reduction know about one class.
pub struct ClassControl {
    pub name: Arc<str>,
    pub tier: Tier,
    target_ttft_us: AtomicU64,
    pub ttft: RollingHistogram,
    pub itl: RollingHistogram,
    pub breaker: Breaker,
    pub reduction: ReductionTrigger,
    /// Error-budget counters (latency and availability SLIs).
    pub budget: Budget,
    view: Mutex<ClassView>,
    /// The series its requests write, looked up once per request rather than per write.
    pub series: ClassSeries,
    /// `queue_time_seconds{class,tier}`, looked up once rather than per request.
    pub queue_time: crate::telemetry::histogram::AtomicHistogram,
    /// The breaker was armed (P99 above threshold, counting) at the last tick.
    was_armed: std::sync::atomic::AtomicBool,
    ttft_p99_gauge: Gauge<f64, AtomicU64>,
    breaker_gauge: Gauge,
    reduction_gauge: Gauge,
}

impl ClassControl {
    fn new(name: &str, class: &ClassConfig, config: &Config, metrics: &Metrics) -> ClassControl {
        let labels = ClassLabels { class: name.to_string() };
        let window = config.breaker.window.get();
        ClassControl {
            name: name.into(),
            tier: class.tier,
            target_ttft_us: AtomicU64::new(class.ttft.get().as_micros() as u64),
            ttft: RollingHistogram::new(window),
            itl: RollingHistogram::new(window),
            breaker: Breaker::new(BreakerParams::new(&config.breaker, class.ttft.get())),
            reduction: ReductionTrigger::new(trigger_params(class, config)),
            budget: Budget::new(
                config.slo.burn_alerts.iter().map(|a| a.long.get()).max().unwrap_or(Duration::from_secs(3600)),
                config.slo.window.get(),
            ),
            view: Mutex::new(ClassView::default()),
            series: ClassSeries::new(name, class.tier),
            queue_time: metrics.queue_time.get_or_create(&ClassTierLabels { class: name.to_string(), tier: class.tier.into() }).clone(),
            was_armed: false.into(),
            ttft_p99_gauge: metrics.ttft_p99.get_or_create(&labels).clone(),
            breaker_gauge: metrics.breaker_state.get_or_create(&labels).clone(),
            reduction_gauge: metrics.context_reduction_active.get_or_create(&labels).clone(),
        }
    }

    fn update(&self, class: &ClassConfig, config: &Config) {
        self.target_ttft_us.store(class.ttft.get().as_micros() as u64, Ordering::Relaxed);
        self.breaker.set_params(BreakerParams::new(&config.breaker, class.ttft.get()));
        self.reduction.set_params(trigger_params(class, config));
    }

    pub fn ttft_target(&self) -> Duration {
        Duration::from_micros(self.target_ttft_us.load(Ordering::Relaxed))
    }

    /// The last published window stats.
    pub fn view(&self) -> ClassView {
        self.view.lock().map(|v| *v).unwrap_or_default()
    }

    /// Refresh the views at `now`; log every transition. Returns the TTFT stats.
    fn publish(&self, now: Instant) -> WindowStats {
        let ttft = self.ttft.publish(now);
        let itl = self.itl.publish(now);
        if let Ok(mut v) = self.view.lock() {
            *v = ClassView { ttft, itl };
        }
        self.ttft_p99_gauge.set(ttft.p99.as_secs_f64());
        if let Some(t) = self.breaker.tick(now, &ttft) {
            self.breaker_gauge.set(t.to as i64);
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
            self.reduction_gauge.set(on as i64);
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
pub struct Controls {
    classes: Mutex<IndexMap<String, Arc<ClassControl>>>,
    metrics: Arc<Metrics>,
}

impl Controls {
    pub fn new(metrics: Arc<Metrics>) -> Controls {
        Controls { classes: Mutex::new(IndexMap::new()), metrics }
    }

    /// The control of class `name`, created or updated for `config`.
    /// Requests still running keep the control they started with.
    pub fn get_or_create(&self, name: &str, class: &ClassConfig, config: &Config) -> Arc<ClassControl> {
        let mut map = self.classes.lock().unwrap_or_else(|p| p.into_inner());
        // Same tier: keep the windows, breaker and budgets, with the new
        // parameters. A class that changed tier starts afresh (its tier
        // decides its queue-time series and the at-risk check).
        if let Some(c) = map.get(name).filter(|c| c.tier == class.tier) {
            c.update(class, config);
            return c.clone();
        }
        let c = Arc::new(ClassControl::new(name, class, config, &self.metrics));
        map.insert(name.to_string(), c.clone());
        c
    }

    pub fn all(&self) -> Vec<Arc<ClassControl>> {
        self.classes.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
}

/// Per class and SLI: budget left over `slo.window` and burn rate over each
/// burn-alert window, as gauges.
pub fn publish_budgets(app: &App, now: Instant) {
    let snap = app.snapshot();
    let slo = &snap.config.slo;
    let windows = budget::burn_windows(slo);
    for c in app.controls.all() {
        if !snap.config.classes.contains_key(&*c.name) {
            continue;
        }
        for (sli, objective) in [(Sli::Latency, slo.latency_objective), (Sli::Availability, slo.availability_objective)] {
            let name = format!("{}-{}", c.name, sli.as_str());
            let total = c.budget.counts(now, slo.window.get());
            app.metrics.budget_remaining.get_or_create(&SloLabels { slo: name.clone() }).set(budget::remaining(sli, &total, objective));
            for w in &windows {
                let counts = c.budget.counts(now, *w);
                let labels = SloWindowLabels { slo: name.clone(), window: budget::window_label(*w) };
                app.metrics.burn_rate.get_or_create(&labels).set(budget::burn_rate(sli, &counts, objective));
            }
        }
    }
}

/// One publisher pass at `now`: class views, breaker and reduction
/// transitions, then each pool's queue upkeep.
pub fn publish_once(app: &App, now: Instant) {
    let snap = app.snapshot();
    let mut interactive_at_risk = false;
    for c in app.controls.all() {
        c.budget.fold(now);
        let ttft = c.publish(now);
        if c.tier == Tier::Interactive && ttft.count > 0 && ttft.p99 > c.ttft_target() {
            interactive_at_risk = true;
        }
    }
    for pool in &snap.pools {
        pool.queue.set_interactive_at_risk(interactive_at_risk);
        pool.queue.tick(pool, now);
    }
}

/// The background task that publishes the views every [`TICK`].
pub fn publisher(app: Arc<App>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0u64;
        loop {
            tokio::select! {
                _ = every.tick() => {
                    let now = Instant::now();
                    publish_once(&app, now);
                    // Budgets move slowly: every 5 s is plenty.
                    if n % 20 == 0 {
                        publish_budgets(&app, now);
                    }
                    n += 1;
                }
                _ = stop.changed() => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;

    #[test]
    fn a_reload_keeps_a_class_control_unless_its_tier_changes() {
        let config = Config::default();
        let metrics = Arc::new(Metrics::new(&config));
        let controls = Controls::new(metrics);
        let chat = config.classes["chat"].clone();
        let first = controls.get_or_create("chat", &chat, &config);
        let tighter = ClassConfig { ttft: Dur::millis(200), ..chat.clone() };
        let again = controls.get_or_create("chat", &tighter, &config);
        assert!(Arc::ptr_eq(&first, &again), "same tier: the same windows and breaker");
        assert_eq!(again.ttft_target(), Duration::from_millis(200));
        let batch = ClassConfig { tier: Tier::Batch, ..chat };
        let moved = controls.get_or_create("chat", &batch, &config);
        assert!(!Arc::ptr_eq(&first, &moved));
        assert_eq!(moved.tier, Tier::Batch);
        assert_eq!(controls.all().len(), 1);
    }
}
