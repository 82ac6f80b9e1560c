//! What a finished request adds to the class's metrics, budgets and
//! rolling window: one function over a plain record, so every path that
//! ends a request (a stream's end, a hang-up, an error before the headers)
//! is counted the same way.
//!
//! Live measurements (TTFT at the first token, each gap) are recorded by the
//! observer as they happen; this is what can only be decided at the end.

use std::time::Duration;

use sse::Usage;
use tokio::time::Instant;

use super::budget::Budget;
use super::metrics::{Metrics, Signal};
use super::series::{ClassSeries, RequestSeries};
use super::window::RollingHistogram;
use super::Outcome;

/// One finished request, as measured.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub(crate) outcome: Outcome,
    /// What judges it for the latency SLI: a stream's first token or byte,
    /// or the whole answer's time (not streamed).
    pub(crate) signal: Signal,
    /// The stream ended before `[DONE]`.
    pub(crate) cut: bool,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    /// When the first content-bearing event went to the client.
    pub(crate) first_token: Option<Instant>,
    /// Gaps between content events, and how many were over the ITL target.
    pub(crate) gaps: u64,
    pub(crate) gaps_over: u64,
    pub(crate) usage: Option<Usage>,
    /// `usage` is slogate's estimate: the replica reported none.
    pub(crate) usage_estimated: bool,
    /// The class's targets.
    pub(crate) ttft_target: Duration,
    pub(crate) itl_target: Duration,
    /// It held a replica slot (admitted past the gateway's queue), after
    /// waiting `queued` for it.
    pub(crate) admitted: bool,
    pub(crate) queued: Duration,
}

impl Finished {
    /// Streamed: judged by its first token or byte, not its whole time.
    pub(crate) fn streaming(&self) -> bool {
        self.signal != Signal::e2e
    }

    pub(crate) fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t - self.start)
    }

    pub(crate) fn e2e(&self) -> Duration {
        self.end - self.start
    }

    /// Prompt and completion tokens, when known.
    pub(crate) fn used_tokens(&self) -> Option<u64> {
        self.usage.map(|u| u.prompt_tokens + u.completion_tokens)
    }

    /// A whole answer (no first token to judge) came as fast as a stream at
    /// the class's targets would have: TTFT target plus ITL target per token.
    pub(crate) fn answer_in_time(&self) -> bool {
        let tokens = u32::try_from(self.output_tokens()).unwrap_or(u32::MAX);
        self.e2e() <= self.ttft_target + self.itl_target.saturating_mul(tokens)
    }

    /// Its verdict for an SLI of requests: `None` when its outcome is
    /// excluded (a client's error, a hang-up), else [`Finished::latency_good`].
    pub(crate) fn judged(&self) -> Option<bool> {
        (self.outcome.sli() != super::SliClass::Excluded).then(|| self.latency_good())
    }

    fn output_tokens(&self) -> u64 {
        self.usage.map(|u| u.completion_tokens).unwrap_or(0)
    }

    /// TTFT within target (or no token at all), and at most 1 % of the gaps
    /// over the ITL target.
    fn ttft_ok(&self) -> bool {
        self.ttft().is_none_or(|t| t <= self.ttft_target)
    }

    fn itl_ok(&self) -> bool {
        self.gaps_over <= self.gaps / 100
    }

    /// Good for the latency SLI: completed within the class's targets. A
    /// non-streaming answer is on time if a stream at the targets would have
    /// finished by now.
    pub(crate) fn latency_good(&self) -> bool {
        if !self.outcome.completed() {
            return false;
        }
        if self.streaming() {
            self.ttft().is_some() && self.ttft_ok() && self.itl_ok()
        } else {
            self.e2e() <= self.ttft_target + self.itl_target * (self.output_tokens().saturating_sub(1) as u32)
        }
    }
}

/// Where a class's end-of-request numbers go.
pub(crate) struct Sinks<'a> {
    pub(crate) metrics: &'a Metrics,
    /// The request's own series (its model's).
    pub(crate) series: &'a RequestSeries,
    pub(crate) class: &'a ClassSeries,
    pub(crate) budget: &'a Budget,
    /// The class's rolling TTFT window (the breaker's input).
    pub(crate) ttft_window: &'a RollingHistogram,
}

/// Count one finished request. Relaxed atomic adds and histogram
/// observations only: never waits.
pub(crate) fn account(f: &Finished, to: &Sinks<'_>) {
    let m = to.metrics;
    to.series.outcome(m, f.outcome).inc();
    let ttft = f.ttft();
    if ttft.is_none() && f.outcome == Outcome::timeout {
        // No first token within the timeout: the caller waited this long
        // for one, and the breaker's window should know it.
        to.ttft_window.record(f.e2e());
    }
    let completed = f.outcome.completed();
    if completed {
        to.series.e2e(m).observe(f.e2e().as_secs_f64());
    }
    if let Some(u) = f.usage {
        to.series.prompt_tokens(m).inc_by(u.prompt_tokens);
        // Beside prompt_tokens even at 0 (an engine that does not report
        // them, vLLM without --enable-prompt-tokens-details), so a ratio of
        // the two is defined.
        to.series.cached_prompt_tokens(m).inc_by(u.cached_tokens);
        to.series.generation_tokens(m).inc_by(u.completion_tokens);
        if f.usage_estimated {
            to.series.usage_estimated(m).inc();
        }
    }
    let out_tokens = f.output_tokens();
    if let (Some(ttft), true) = (ttft, completed && out_tokens > 1) {
        to.series.tpot(m).observe(f.e2e().saturating_sub(ttft).as_secs_f64() / (out_tokens - 1) as f64);
    }
    if !f.ttft_ok() {
        to.class.breach(m, super::metrics::BreachKind::ttft).inc();
    }
    if !f.itl_ok() {
        to.class.breach(m, super::metrics::BreachKind::itl).inc();
    }
    if let Some(kind) = f.outcome.breach(f.cut) {
        to.class.breach(m, kind).inc();
    }
    let good = f.latency_good();
    if completed {
        to.class.judged(m, f.signal, good).inc();
    }
    to.budget.record(f.outcome, good);
    if good {
        to.class.goodput(m).inc();
    }
}

#[cfg(test)]
impl Finished {
    /// A request that took 2 s, its first token at 200 ms, 100 tokens in 99
    /// gaps within target, against 300 ms TTFT and 50 ms ITL; admitted after
    /// no wait.
    pub(crate) fn example(outcome: Outcome, streaming: bool) -> Finished {
        let start = Instant::now();
        Finished {
            outcome,
            signal: if streaming { Signal::ttft } else { Signal::e2e },
            cut: false,
            start,
            end: start + Duration::from_millis(2000),
            first_token: Some(start + Duration::from_millis(200)),
            gaps: 99,
            gaps_over: 0,
            usage: Some(Usage::new(10, 100)),
            usage_estimated: false,
            ttft_target: Duration::from_millis(300),
            itl_target: Duration::from_millis(50),
            admitted: true,
            queued: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(outcome: Outcome, streaming: bool) -> Finished {
        Finished::example(outcome, streaming)
    }

    #[tokio::test(start_paused = true)]
    async fn latency_good_needs_a_completed_answer_within_both_targets() {
        assert!(finished(Outcome::ok, true).latency_good());
        assert!(finished(Outcome::length, true).latency_good());
        // Not completed: never good, however fast.
        for o in [Outcome::stream_error, Outcome::cancelled, Outcome::timeout] {
            assert!(!finished(o, true).latency_good(), "{o:?}");
        }
        // TTFT over target.
        let mut late = finished(Outcome::ok, true);
        late.first_token = Some(late.start + Duration::from_millis(301));
        assert!(!late.latency_good());
        // A stream with no content event at all is not on time.
        let mut empty = finished(Outcome::ok, true);
        empty.first_token = None;
        assert!(!empty.latency_good());
        // ITL: 1 gap in 100 over target is allowed, 2 are not.
        let mut gaps = finished(Outcome::ok, true);
        gaps.gaps = 100;
        gaps.gaps_over = 1;
        assert!(gaps.latency_good());
        gaps.gaps_over = 2;
        assert!(!gaps.latency_good(), "the ITL breach rule: more than 1 % of gaps over target");
        // Non-streaming: 300 ms + 99 x 50 ms = 5.25 s for 100 tokens.
        let mut json = finished(Outcome::ok, false);
        json.first_token = None;
        json.end = json.start + Duration::from_millis(5250);
        assert!(json.latency_good());
        json.end = json.start + Duration::from_millis(5251);
        assert!(!json.latency_good(), "goodput's negative case: one ms past what a stream at target would take");
    }
}
