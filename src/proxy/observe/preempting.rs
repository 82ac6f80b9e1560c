//! The observed body's half that gives a batch stream's slot up for an
//! interactive request and goes on later (docs/design/preemption.md): the
//! replica request ends, the slot goes back, the stream waits in the batch
//! queue, and its continuation is spliced in as a broken stream's is.

use std::future::Future;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::time::Instant;

use super::{Mode, ObservedBody};
use crate::admission::lease::Requeued;
use crate::admission::preempt::Victim;
use crate::proxy::resume::Break;
use crate::telemetry::labels::PoolLabels;
use crate::telemetry::Outcome;

/// An interactive stream's moment to ask for a batch stream's slot, and
/// the timer that wakes its poller then (set at its first wait).
pub(crate) struct Ask {
    at: Instant,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

/// A preempted stream waiting for a slot again, since when, and its pool.
pub(crate) struct Waiting {
    wait: Requeued,
    since: Instant,
    pool: String,
}

impl<B> ObservedBody<B> {
    /// Enlist this stream (a resumable batch stream holding a slot of a pool
    /// that preempts) as a victim: its prompt's tokens and `max_tokens`.
    pub(crate) fn preemptible(&mut self, prompt: u64, max: Option<u64>) {
        let Some(lease) = self.tracker.lease.as_ref() else { return };
        let v = Arc::new(Victim::new(prompt, max, 0));
        lease.enlist(Arc::downgrade(&v));
        self.victim = Some(v);
    }

    /// An interactive stream: at `at`, with no first token yet, ask a
    /// batch stream on its replica for its slot.
    pub(crate) fn asks_at(&mut self, at: Instant) {
        self.asks = Some(Ask { at, timer: None });
    }

    /// The moment to ask, to the moment while the body is polled: a timer
    /// wakes its poller then (the watchdog looks only every tick). Gone
    /// with the first token.
    pub(super) fn poll_ask(&mut self, cx: &mut Context<'_>) {
        let Some(ask) = self.asks.as_mut() else { return };
        if self.tracker.first_token.is_some() {
            self.asks = None;
            return;
        }
        let at = ask.at;
        let timer = ask.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if timer.as_mut().poll(cx).is_ready() {
            self.ask_if_due(Instant::now());
        }
    }

    /// The watchdog's look at `now` (or the ask's timer's): the moment to
    /// ask has come, and the stream has no first token
    /// (docs/design/preemption.md, rule 1).
    pub(crate) fn ask_if_due(&mut self, now: Instant) {
        if self.asks.as_ref().is_some_and(|a| now >= a.at) {
            self.asks = None;
            if let (None, Some(lease)) = (self.tracker.first_token, self.tracker.lease.as_ref()) {
                lease.ask_for_slot();
            }
        }
    }

    /// Asked to give its slot up: end the replica request, give the slot
    /// back and wait for another. False: not asked, or it cannot be (it has
    /// its finish, nothing was sent, or its text cannot be continued exactly).
    pub(super) fn preempt_if_asked(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(v) = self.victim.as_ref() else { return false };
        if !v.asked(cx.waker()) || self.continuing.is_some() || self.waiting.is_some() || self.done {
            return false;
        }
        let v = v.clone();
        let t = &mut self.tracker;
        let sent = t.first_token.map_or(0, |_| t.gaps + 1);
        let finished = matches!(&self.mode, Mode::Sse { finish_reason: Some(_), .. });
        let exact = self.resume.as_ref().is_some_and(|r| r.exact(sent));
        // Checked before the lease is taken: a stream that goes on where it
        // is keeps its slot to its end.
        let Some(lease) = t.lease.take_if(|_| sent > 0 && !finished && exact) else {
            // It goes on where it is: asked no more.
            v.gave_back();
            self.victim = None;
            return false;
        };
        let pool = self.resume.as_ref().map(|r| r.link.pool().to_string()).unwrap_or_default();
        t.report_gaps();
        // The replica's request ends with its connection (the engine aborts
        // it and frees the slot), then the slot goes to the waiter.
        self.inner = None;
        let wait = lease.requeue();
        v.gave_back();
        t.metrics().preemptions.get_or_create(&PoolLabels { pool: pool.clone() }).inc();
        let id = t.request_id.to_str().unwrap_or("");
        t.span().in_scope(|| {
            tracing::info!(request_id = id, tokens = sent, "batch stream preempted for an interactive request; it goes on later")
        });
        self.waiting = Some(Waiting { wait, since: Instant::now(), pool });
        // Another preemption later would be its second (the new victim counts it).
        self.victim = v.again().map(Arc::new);
        true
    }

    /// Wait for the slot again; then send the continuation on it. A stream
    /// refused a slot (its queue timed out) ends with an error event.
    pub(super) fn poll_waiting(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(w) = self.waiting.as_mut() else { return Poll::Ready(()) };
        let got = ready!(w.wait.as_mut().poll(cx));
        let (since, pool) = (w.since, std::mem::take(&mut w.pool));
        self.waiting = None;
        let mut lease = match got {
            Ok(lease) => lease,
            Err(refusal) => {
                let what = format!("slogate: the stream was paused for interactive requests and got no slot again ({refusal:?})");
                tracing::warn!(request_id = self.tracker.request_id.to_str().unwrap_or(""), "{what}");
                self.tracker.cut = true;
                self.end_with_error(&what, "overloaded", 503, Outcome::stream_error);
                return Poll::Ready(());
            }
        };
        let t = &mut self.tracker;
        let sent = t.first_token.map_or(0, |_| t.gaps + 1);
        let now = Instant::now();
        let deadline = (now + self.timeouts.idle).min(t.start + self.timeouts.total);
        let started = self.resume.as_mut().map(|r| r.start_here(&mut lease, sent, deadline));
        if let Some(v) = &self.victim {
            lease.enlist(Arc::downgrade(v));
            v.sent(sent);
        }
        t.lease = Some(lease);
        match started {
            Some(Ok(pending)) => {
                let prompt = t.prompt_estimate();
                t.metrics().preemption_redone_tokens.get_or_create(&PoolLabels { pool: pool.clone() }).inc_by(prompt + sent);
                t.metrics()
                    .preemption_pause
                    .get_or_create(&PoolLabels { pool }, PAUSE_BOUNDS)
                    .observe(now.duration_since(since).as_secs_f64());
                self.continuing = Some((pending, Break::Preempted));
                self.last_event = now;
                if let Mode::Sse { strip_usage, .. } = self.mode {
                    self.mode = Self::sse_mode(strip_usage);
                }
            }
            _ => {
                self.tracker.cut = true;
                self.end_with_error("slogate: the paused stream could not be continued", "upstream_error", 502, Outcome::stream_error);
            }
        }
        Poll::Ready(())
    }

    /// The client has `n` tokens (a victim is cheaper to redo the fewer).
    pub(super) fn note_sent(&self) {
        if let Some(v) = &self.victim {
            let t = &self.tracker;
            v.sent(t.first_token.map_or(0, |_| t.gaps + 1));
        }
    }
}

/// The pause's histogram bounds, in seconds.
const PAUSE_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
