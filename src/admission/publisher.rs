//! The publisher: the one background task that turns what requests
//! recorded into the read-only views the request path reads (each class's
//! TTFT and ITL windows, its breaker and reduction states, each pool's
//! queue upkeep, the error budgets), every [`TICK`] while anything moves.
//!
//! Its cost follows traffic, not time: once every window is empty, every
//! breaker closed, no reduction on and nothing held or queued, the views
//! cannot change until a request arrives, and the publisher rests until one
//! is admitted (its arrival wakes it, and the views are published before
//! the next tick would have been) or until the budgets are due. The rules
//! are docs/design/measurement.md's, 20 and 21.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::breaker::BreakerState;
use super::{ClassControl, Controls, PoolAdmission, TICK};
use crate::config::{Config, Tier};
use crate::telemetry::budget::{self, Sli};
use crate::telemetry::metrics::{Metrics, SloLabels, SloWindowLabels};

/// How often the error budgets are published: they move slowly. Also the
/// longest the publisher rests.
const BUDGETS_EVERY: Duration = Duration::from_secs(5);

/// Per class and SLI: budget left over `slo.window` and burn rate over each
/// burn-alert window, as gauges.
fn publish_budgets(controls: &Controls, config: &Config, metrics: &Metrics, now: Instant) {
    let slo = &config.slo;
    let windows = budget::burn_windows(slo);
    for c in controls.all() {
        if !config.classes.contains_key(&*c.name) {
            continue;
        }
        for (sli, objective) in [(Sli::Latency, slo.latency_objective), (Sli::Availability, slo.availability_objective)] {
            let name = format!("{}-{}", c.name, sli.as_str());
            let total = c.budget.counts(now, slo.window.get());
            metrics.budget_remaining.get_or_create(&SloLabels { slo: name.clone() }).set(budget::remaining(sli, &total, objective));
            for w in &windows {
                let counts = c.budget.counts(now, *w);
                let labels = SloWindowLabels { slo: name.clone(), window: budget::window_label(*w) };
                metrics.burn_rate.get_or_create(&labels).set(budget::burn_rate(sli, &counts, objective));
            }
        }
    }
}

/// One publisher pass at `now`: class views, breaker and reduction
/// transitions, then each pool's queue upkeep.
fn publish_once(controls: &Controls, pools: &[Arc<PoolAdmission>], now: Instant) {
    let mut interactive_at_risk = false;
    for c in controls.all() {
        c.budget.fold(now);
        let ttft = c.publish(now);
        if c.tier == Tier::Interactive && ttft.count > 0 && ttft.p99 > c.ttft_target() {
            interactive_at_risk = true;
        }
    }
    for pool in pools {
        pool.set_interactive_at_risk(interactive_at_risk);
        pool.tick(now);
    }
}

/// What the publisher reads at each tick: the running config and the pools'
/// admissions (a handle on the current snapshot gives both).
pub(crate) type Current = dyn Fn() -> (Arc<Config>, Vec<Arc<PoolAdmission>>) + Send + Sync;

/// The background task that publishes the views every [`TICK`] while
/// anything moves, and rests while nothing can (see the module doc).
pub(crate) fn publisher(
    controls: Arc<Controls>,
    metrics: Arc<Metrics>,
    current: Box<Current>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut budgets_at: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.changed() => return,
            }
            let seen = controls.publisher.pokes();
            let now = Instant::now();
            let (config, pools) = current();
            publish_once(&controls, &pools, now);
            if budgets_at.is_none_or(|at| now.saturating_duration_since(at) >= BUDGETS_EVERY) {
                publish_budgets(&controls, &config, &metrics, now);
                budgets_at = Some(now);
            }
            let rest = controls.publisher.rest(seen, BUDGETS_EVERY, || at_rest(&controls, &pools));
            tokio::select! {
                rested = rest => if rested {
                    // Woken by an arrival (or the budgets): publish now.
                    every.reset_immediately();
                },
                _ = stop.changed() => return,
            }
        }
    })
}

/// Nothing the views show can change with time alone: every class's
/// windows are empty, its breaker closed and not counting, its reduction
/// off; no pool holds or queues a request, nor remembers interactive demand.
fn at_rest(controls: &Controls, pools: &[Arc<PoolAdmission>]) -> bool {
    controls.all().iter().all(|c| c.at_rest()) && pools.iter().all(|p| p.at_rest())
}

impl ClassControl {
    /// Its published windows are empty and its breaker and reduction idle.
    fn at_rest(&self) -> bool {
        let v = self.view();
        v.ttft.count == 0
            && v.itl.count == 0
            && self.breaker.state() == BreakerState::Closed
            && !self.breaker.armed()
            && !self.reduction.active()
    }
}
