//! The observed body's half that continues a broken stream on another
//! replica ([`crate::proxy::resume`]; docs/design/resume.md): starting a
//! continuation where the stream broke, and taking up its body.

use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::time::Instant;

use super::{Mode, ObservedBody};
use crate::proxy::resume::Break;
use crate::telemetry::metrics::{Metrics, ResumeLabels, UnresumedLabels};
use crate::telemetry::Outcome;

/// A stream of `pool` broke (`why`) and was not continued (`not`: why not).
fn unresumed(metrics: &Metrics, pool: String, why: Break, not: &'static str) {
    metrics.stream_unresumed.get_or_create(&UnresumedLabels { pool, reason: why.as_str(), why: not }).inc();
}

impl<B> ObservedBody<B> {
    /// The stream broke (`why`): send its continuation to another replica
    /// if it may be continued (the module docs of [`super::resume`]), or
    /// end it whole if its answer was ([`Self::close_whole`]). False:
    /// neither, and it ends as it broke.
    pub(super) fn resume_stream(&mut self, why: Break) -> bool {
        let Some(r) = self.resume.as_deref_mut() else { return false };
        let pool = r.link.pool().to_string();
        // The answer had its finish: there is nothing to go on with.
        if matches!(&self.mode, Mode::Sse { finish_reason: Some(_), .. }) {
            unresumed(self.tracker.metrics(), pool, why, "finished");
            return self.close_whole(why);
        }
        let t = &mut self.tracker;
        let left = t.lease.as_ref().map(|l| l.replica().label().to_string()).unwrap_or_default();
        t.report_gaps();
        let sent = t.first_token.map_or(0, |_| t.gaps + 1);
        let now = Instant::now();
        let deadline = (now + self.timeouts.idle).min(t.start + self.timeouts.total);
        match r.start(t.lease.as_mut(), sent, deadline) {
            Ok(pending) => {
                t.metrics().stream_resumes.get_or_create(&ResumeLabels { pool, replica: left.clone(), reason: why.as_str() }).inc();
                let to = t.lease.as_ref().map(|l| l.replica().label().to_string()).unwrap_or_default();
                t.span().in_scope(|| tracing::info!(request_id = t.request_id.to_str().unwrap_or(""), from = %left, to = %to, reason = why.as_str(), tokens = sent, "stream broke; continuing it on another replica"));
                self.inner = None;
                self.continuing = Some((pending, why));
                // The continuation's head is due within the idle timeout.
                self.last_event = now;
                if let Mode::Sse { strip_usage, .. } = self.mode {
                    self.mode = Self::sse_mode(strip_usage);
                }
                true
            }
            Err(not) => {
                unresumed(t.metrics(), pool, why, not);
                false
            }
        }
    }

    /// A stream that broke after its finish, when the client did not ask
    /// for usage (or the stream is Anthropic's, whose finish carries it) and
    /// the answer is one choice: the client has all it asked for, and the
    /// stream ends with the `[DONE]` (`message_stop`) the replica did not send
    /// (the partial event after the finish, if any, dropped), counted as
    /// its finish says. False: the client asked for usage it did not get,
    /// or more than one answer; the stream is cut.
    fn close_whole(&mut self, why: Break) -> bool {
        let one = self.resume.as_ref().is_some_and(|r| r.splice.one_choice());
        // Anthropic's `message_delta` told the stop reason and the usage:
        // only its `message_stop` is missing.
        let messages = self.tracker.endpoint() == crate::config::Endpoint::Messages;
        let Mode::Sse { strip_usage, saw_error: false, finish_reason: Some(finish), .. } = &self.mode else {
            return false;
        };
        if !(one && (*strip_usage || messages)) {
            return false;
        }
        let outcome = if finish == "length" { Outcome::length } else { Outcome::ok };
        self.tracker.finish_reason = Some(finish.clone());
        let end: &'static [u8] = if messages { b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n" } else { b"data: [DONE]\n\n" };
        self.end_with(Some(Bytes::from_static(end)), outcome);
        let t = &self.tracker;
        t.span().in_scope(|| {
            tracing::info!(
                request_id = t.request_id.to_str().unwrap_or(""),
                reason = why.as_str(),
                "stream broke after its finish; ended it whole"
            )
        });
        true
    }

    /// Wait for the continuation's response head: then read its body; if
    /// it failed, end as the stream broke.
    pub(super) fn poll_continuing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((pending, why)) = self.continuing.as_mut() else { return Poll::Ready(()) };
        let got = ready!(pending.as_mut().poll(cx));
        let why = *why;
        self.continuing = None;
        match got {
            Ok(body) => {
                self.inner = Some(body);
                self.last_event = Instant::now();
                let due = self.next_deadline(self.last_event);
                self.deadline.as_mut().reset(due);
            }
            Err(e) => {
                let pool = self.resume.as_ref().map(|r| r.link.pool().to_string()).unwrap_or_default();
                unresumed(self.tracker.metrics(), pool, why, "failed");
                let what = format!("slogate: the replica's stream broke ({}) and its continuation failed: {e}", why.as_str());
                tracing::warn!(request_id = self.tracker.request_id.to_str().unwrap_or(""), class = %self.tracker.class().name, "{what}");
                self.tracker.cut = true;
                match why {
                    Break::Stall => self.end_with_error(&what, "timeout", 504, Outcome::timeout),
                    _ => self.end_with_error(&what, "upstream_error", 502, Outcome::stream_error),
                }
            }
        }
        Poll::Ready(())
    }

    /// A stream that ended before its `[DONE]` and without an error.
    pub(super) fn unfinished(&self) -> bool {
        matches!(self.mode, Mode::Sse { saw_done: false, saw_error: false, .. })
    }

    /// The replica sent an error event that was hidden to continue the
    /// stream elsewhere (cleared by asking).
    /// An error event the stream could no longer be continued from, which
    /// the client got, is a break not resumed: counted as such.
    pub(super) fn broke_on_error_event(&mut self) -> bool {
        if let Some(r) = self.resume.as_deref_mut() {
            if let Some(not) = r.splice.take_passed_error() {
                unresumed(self.tracker.metrics(), r.link.pool().to_string(), Break::ErrorEvent, not);
            }
        }
        match &mut self.mode {
            Mode::Sse { broke, .. } => std::mem::take(broke),
            _ => false,
        }
    }
}
