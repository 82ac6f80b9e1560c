//! The status page's recent history: per class, one point every
//! `slo.history_step` (10 s by default) for the last [`POINTS`] steps (an
//! hour): TTFT P99 against its target, the latency SLI's attainment and
//! burn over the step, requests admitted and refused, queue depth. Constant
//! memory: a fixed ring per class; classes gone after a reload are dropped.
//! Sampled by a task of its own, never by the request path.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;

use super::budget::Tally;

/// Points kept per class: an hour at 10 s.
pub(crate) const POINTS: usize = 360;

/// One step of one class.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Point {
    /// Unix seconds at the end of the step.
    pub(crate) t: u64,
    /// Over the rolling window at that moment (0 without samples).
    pub(crate) ttft_p99_ms: f64,
    pub(crate) ttft_target_ms: f64,
    /// Latency SLI over the step: completed requests within target over
    /// completed requests (none when nothing completed).
    pub(crate) attainment: Option<f64>,
    /// The latency budget's burn rate over the step (none when nothing completed).
    pub(crate) burn: Option<f64>,
    pub(crate) admitted: u64,
    pub(crate) refused: u64,
    /// Requests waiting in the class's tier's queues at the end of the step.
    pub(crate) queued: u64,
}

/// What a sample reads of one class now.
pub(crate) struct Sample<'a> {
    pub(crate) class: &'a str,
    pub(crate) t: u64,
    pub(crate) tally: Tally,
    pub(crate) ttft_p99_ms: f64,
    pub(crate) ttft_target_ms: f64,
    pub(crate) queued: u64,
    pub(crate) latency_objective: f64,
}

#[derive(Default)]
struct ClassHistory {
    last: Option<Tally>,
    points: VecDeque<Point>,
}

#[derive(Default)]
pub(crate) struct History {
    classes: Mutex<BTreeMap<String, ClassHistory>>,
}

impl History {
    /// Add one point per class in `samples`; forget classes not among them.
    pub(crate) fn sample(&self, samples: &[Sample<'_>]) {
        let Ok(mut classes) = self.classes.lock() else { return };
        classes.retain(|name, _| samples.iter().any(|s| s.class == name));
        for s in samples {
            let h = classes.entry(s.class.to_string()).or_default();
            // The first sample only sets the baseline: totals since start
            // are not a step.
            let Some(last) = h.last.replace(s.tally) else { continue };
            let d = |now: u64, before: u64| now.saturating_sub(before);
            let (good, valid) = (d(s.tally.latency_good, last.latency_good), d(s.tally.latency_valid, last.latency_valid));
            let attainment = (valid > 0).then(|| good as f64 / valid as f64);
            if h.points.len() == POINTS {
                h.points.pop_front();
            }
            h.points.push_back(Point {
                t: s.t,
                ttft_p99_ms: s.ttft_p99_ms,
                ttft_target_ms: s.ttft_target_ms,
                attainment,
                burn: attainment.map(|a| (1.0 - a) / (1.0 - s.latency_objective).max(1e-9)),
                admitted: d(s.tally.admitted, last.admitted),
                refused: d(s.tally.refused, last.refused),
                queued: s.queued,
            });
        }
    }

    /// Every class's points, oldest first.
    pub(crate) fn points(&self) -> BTreeMap<String, Vec<Point>> {
        let Ok(classes) = self.classes.lock() else { return BTreeMap::new() };
        classes.iter().map(|(k, h)| (k.clone(), h.points.iter().copied().collect())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(class: &str, t: u64, tally: Tally) -> Sample<'_> {
        Sample { class, t, tally, ttft_p99_ms: 100.0, ttft_target_ms: 300.0, queued: 2, latency_objective: 0.99 }
    }

    #[test]
    fn points_are_the_steps_differences_and_the_ring_is_bounded() {
        let h = History::default();
        let tally = |n: u64| Tally { latency_good: 9 * n, latency_valid: 10 * n, admitted: 12 * n, refused: n };
        h.sample(&[sample("chat", 0, tally(0))]);
        assert!(h.points()["chat"].is_empty(), "the first sample is the baseline");
        for i in 1..=(POINTS as u64 + 50) {
            h.sample(&[sample("chat", i * 10, tally(i))]);
        }
        let p = &h.points()["chat"];
        assert_eq!(p.len(), POINTS, "constant memory");
        assert_eq!(p[0].t, 510, "the oldest dropped first");
        let last = p[POINTS - 1];
        assert_eq!((last.admitted, last.refused, last.queued), (12, 1, 2));
        assert_eq!(last.attainment, Some(0.9));
        assert!(last.burn.is_some_and(|b| (b - 10.0).abs() < 1e-9), "10 % bad against a 1 % budget: {:?}", last.burn);
        // A step with nothing completed has no attainment; a class gone is forgotten.
        h.sample(&[sample("chat", 9999, tally(POINTS as u64 + 50))]);
        assert_eq!(h.points()["chat"].last().map(|p| p.attainment), Some(None));
        h.sample(&[sample("batch", 10_000, tally(0))]);
        assert!(!h.points().contains_key("chat"));
    }
}
