//! A replica's time to a first token: predicted at dispatch from the
//! prefill work there ([`FirstTokenModel`]), and what the interactive
//! requests sent there lately ask of it ([`Outlook`]), which batch leaves
//! room for on an engine that serves first come, first served.
//! docs/design/preemption.md, rules 13 and 14.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::AtomicF64;

/// The replica's time from dispatch to first token as a function of the
/// prefill work there, learned from its first tokens: the step's time
/// (its mean gap between tokens) plus the work ahead and its own, at the
/// rate recent first tokens took over their work (a ratio of running
/// means, so a cached prompt's near-zero work does not blow up the rate).
/// docs/design/preemption.md, rule 13.
#[derive(Default)]
pub(crate) struct FirstTokenModel {
    /// Running mean of (time to first token − the step), microseconds.
    excess_us: AtomicF64,
    /// Running mean of the prefill work, KiB.
    work_kib: AtomicF64,
    samples: AtomicU64,
}

/// How far the model's means move toward each first token.
const MODEL_EWMA: f64 = 0.1;
/// First tokens learned from before the model predicts.
const MODEL_WARMUP: u64 = 3;

impl FirstTokenModel {
    /// The time to first token predicted for `work` bytes of prefill (the
    /// work ahead and the request's own) with a step of `step_us`; `None`
    /// before the model has learned from a few first tokens.
    pub(crate) fn predict(&self, work: u64, step_us: f64) -> Option<std::time::Duration> {
        if self.samples.load(Ordering::Relaxed) < MODEL_WARMUP {
            return None;
        }
        let (excess, mean_work) = (self.excess_us.load(), self.work_kib.load());
        let scaled = if mean_work > 1e-3 { excess * (work as f64 / 1024.0) / mean_work } else { excess };
        Some(std::time::Duration::from_secs_f64((step_us + scaled).max(0.0) / 1e6))
    }

    /// A first token after `took` for `work` bytes of prefill, the step at `step_us`.
    pub(crate) fn learn(&self, work: u64, took: std::time::Duration, step_us: f64) {
        let excess = (took.as_secs_f64() * 1e6 - step_us).max(0.0);
        let kib = work as f64 / 1024.0;
        let first = self.samples.fetch_add(1, Ordering::Relaxed) == 0;
        let ewma = |m: &AtomicF64, v: f64| m.store(if first { v } else { m.load() + MODEL_EWMA * (v - m.load()) });
        ewma(&self.excess_us, excess);
        ewma(&self.work_kib, kib);
    }
}

/// What the interactive requests sent to a replica lately ask of it: their
/// class's TTFT target and their own prefill work there (prompt bytes its
/// cache was not expected to hold), running means moved an eighth toward
/// each, forgotten [`OUTLOOK_FORGOTTEN_AFTER`] after the last one.
#[derive(Default)]
pub(crate) struct Outlook {
    target_us: AtomicF64,
    work: AtomicF64,
    /// When the last one was sent, in milliseconds after the replica was made; 0: never.
    at_ms: AtomicU64,
}

/// How far the outlook's means move toward each interactive request.
const OUTLOOK_EWMA: f64 = 0.125;
/// With no interactive request sent for this long, batch is alone there:
/// nothing is held for interactive requests (the demand window of the
/// interactive reservation, docs/design/seats.md rule 4).
pub(crate) const OUTLOOK_FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

impl Outlook {
    /// An interactive request with a first-token `target` and `work` bytes
    /// of its own prefill was sent there at `age`.
    pub(crate) fn sent(&self, target: std::time::Duration, work: u64, age: std::time::Duration) {
        let fresh = self.get(age).is_none();
        let ewma = |m: &AtomicF64, v: f64| m.store(if fresh { v } else { m.load() + OUTLOOK_EWMA * (v - m.load()) });
        ewma(&self.target_us, target.as_secs_f64() * 1e6);
        ewma(&self.work, work as f64);
        self.at_ms.store((age.as_millis() as u64).max(1), Ordering::Relaxed);
    }

    /// The interactive requests' mean target and own prefill work at
    /// `age`; `None` when none was sent within [`OUTLOOK_FORGOTTEN_AFTER`].
    pub(crate) fn get(&self, age: std::time::Duration) -> Option<(std::time::Duration, u64)> {
        let at = self.at_ms.load(Ordering::Relaxed);
        let since = age.saturating_sub(std::time::Duration::from_millis(at));
        (at > 0 && since <= OUTLOOK_FORGOTTEN_AFTER)
            .then(|| (std::time::Duration::from_secs_f64(self.target_us.load() / 1e6), self.work.load().round() as u64))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{FirstTokenModel, Outlook};

    /// Silent until it has learned; then the step plus the work at the
    /// rate learned: twice the work, twice the time over the step.
    #[test]
    fn the_first_token_model_predicts_the_step_plus_the_work_at_its_rate() {
        let m = FirstTokenModel::default();
        let step = 20_000.0; // 20 ms
                             // 40 ms over the step for 64 KiB, three times.
        for _ in 0..3 {
            assert_eq!(m.predict(64 * 1024, step), None, "nothing predicted before it learned");
            m.learn(64 * 1024, Duration::from_millis(60), step);
        }
        let at = |kib: u64| m.predict(kib * 1024, step).expect("learned").as_secs_f64() * 1000.0;
        assert!((at(64) - 60.0).abs() < 0.01, "{}", at(64));
        assert!((at(128) - 100.0).abs() < 0.01, "{}", at(128));
        assert!((at(0) - 20.0).abs() < 0.01, "no work: the step alone, {}", at(0));
        // A slower replica: it moves toward it.
        for _ in 0..40 {
            m.learn(64 * 1024, Duration::from_millis(120), step);
        }
        assert!((at(64) - 120.0).abs() < 2.0, "{}", at(64));
        // A prompt the cache held (no work) does not blow the rate up.
        m.learn(0, Duration::from_millis(25), step);
        assert!(at(64) < 130.0, "{}", at(64));
    }

    /// Nothing before the first interactive request; its target and work
    /// at once, then running means; forgotten after a quiet spell, and
    /// the next one starts afresh.
    #[test]
    fn the_outlook_follows_interactive_requests_and_forgets_them() {
        let o = Outlook::default();
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        assert_eq!(o.get(s(1)), None);
        o.sent(ms(300), 800, s(1));
        assert_eq!(o.get(s(2)), Some((ms(300), 800)));
        o.sent(ms(100), 0, s(2));
        assert_eq!(o.get(s(2)), Some((ms(275), 700)), "an eighth of the way");
        assert_eq!(o.get(s(32)), Some((ms(275), 700)), "30 s after the last: still");
        assert_eq!(o.get(s(33)), None, "past it: forgotten");
        o.sent(ms(150), 40, s(40));
        assert_eq!(o.get(s(40)), Some((ms(150), 40)), "afresh");
    }
}
