//! The observed response body.
//!
//! [`ObservedBody`] wraps the replica's body. It forwards every frame the
//! moment it arrives (no buffering, no re-chunking), parses SSE on the side,
//! stamps the first content-bearing event (TTFT) and every gap between
//! content events (ITL), enforces the first-token, idle and total timeouts,
//! and owns the request's [`Tracker`]. The tracker holds the replica lease
//! and records exactly one outcome when it is dropped: at end of stream, or
//! when the client goes away (a cancellation, which also drops the upstream
//! body and so cancels the replica's request).
//!
//! The one exception to "forward as it arrives": when the client did not ask
//! for usage, slogate asked the replica for it and must cut the usage event
//! back out. Then the bytes of an event still incomplete at the end of a read
//! are held until the read that completes it; complete events are never held.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

mod events;
mod preempting;
mod reading;
mod resuming;

use super::json::{read_json_outcome, read_message, read_transcription};
use super::resume::{Break, Continuing, Resume};
use super::tracker::Tracker;
use crate::config::{PoolConfig, ServerConfig};
use crate::error::BoxError;
use crate::telemetry::Outcome;
use events::{error_event, limit_event, splice_read};
use reading::{learn_id, read_event, reported};
use sse::{Memo, SseParser};

/// Timeouts applied to a response body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamTimeouts {
    pub(crate) first_token: Duration,
    pub(crate) idle: Duration,
    pub(crate) total: Duration,
    /// The longest one SSE event may be (`pools[].max_event_bytes`).
    pub(crate) max_event: usize,
    /// How long a client may take no bytes while data waits (`server.send_timeout`).
    pub(crate) send: Duration,
}

impl StreamTimeouts {
    /// A pool's stream timeouts and event size limit, and the server's send timeout.
    pub(crate) fn of(pool: &PoolConfig, server: &ServerConfig) -> Self {
        let t = &pool.timeouts;
        StreamTimeouts {
            first_token: t.first_token.get(),
            idle: t.idle.get(),
            total: t.total.get(),
            max_event: usize::try_from(pool.max_event_bytes.0).unwrap_or(usize::MAX),
            send: server.send_timeout.get(),
        }
    }
}

// The body lives in one allocation per request whatever its mode; boxing
// the stream's state would add one.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// `text/event-stream`: parse events, stamp tokens, maybe strip usage.
    Sse {
        parser: SseParser,
        /// The stream's last chunk with text: the next ones are read by it
        /// (through the splice when the stream may be continued).
        memo: Memo,
        strip_usage: bool,
        /// Bytes of an incomplete event, held back: the client gets whole
        /// events only, so an error event slogate adds (a timeout, an event
        /// too large) starts on an event boundary. At most `max_event`.
        pending: BytesMut,
        saw_done: bool,
        saw_error: bool,
        finish_reason: Option<String>,
        /// The replica sent an error event this read, hidden from the
        /// client because the stream is continued elsewhere.
        broke: bool,
        /// A content event was held back: the stream relayed what its
        /// key's limits reserved for it, and slogate ends it.
        limited: bool,
    },
    /// A JSON body: keep the chunks (cheap clones) to read usage at the
    /// end (`usage_only`: only usage is read, from the tail when it is there).
    Json { chunks: JsonChunks, size: usize, usage_only: bool },
    /// Forward as is; the outcome was decided from the status.
    Passthrough,
    /// A binary answer sent as it is made (speech): its first byte is its
    /// first token; forwarded as is.
    Audio,
}

const JSON_KEEP_LIMIT: usize = 16 << 20;

/// A JSON body's chunks: a replica's whole answer most often comes in one
/// read, kept without an allocation of its own.
type JsonChunks = smallvec::SmallVec<[Bytes; 1]>;

/// Keep a JSON body's chunk (a cheap clone) to read at its end; past
/// [`JSON_KEEP_LIMIT`] the body is passed on unread (`usize::MAX` marks it).
fn keep_json(chunks: &mut JsonChunks, size: &mut usize, data: &Bytes) {
    if size.saturating_add(data.len()) <= JSON_KEEP_LIMIT {
        *size += data.len();
        chunks.push(data.clone());
    } else {
        *size = usize::MAX;
        chunks.clear();
    }
}

/// A response body that measures as it forwards. See the module docs.
pub(crate) struct ObservedBody<B> {
    pub(super) inner: Option<B>,
    mode: Mode,
    pub(super) tracker: Box<Tracker>,
    pub(super) timeouts: StreamTimeouts,
    /// Fires at or before the current deadline. It is not moved on every
    /// chunk (a timer operation per token); when it fires, the real deadline
    /// is computed from `last_event` and the timer re-armed if that is later.
    deadline: Pin<Box<Sleep>>,
    pub(super) last_event: Instant,
    /// A last frame to send before ending (held-back bytes, or a timeout event).
    pub(super) trailer: Option<Bytes>,
    pub(super) done: bool,
    /// When a frame was last handed over, while the client has not asked
    /// for the next one (`None` while the body waits for the replica).
    pub(super) handed_over: Option<Instant>,
    /// The task to wake when the watchdog ends the stream.
    pub(super) waker: Option<std::task::Waker>,
    /// How to continue the stream on another replica if it breaks.
    resume: Option<Box<Resume<B>>>,
    /// A continuation on its way, and how the stream broke.
    continuing: Option<(Continuing<B>, Break)>,
    /// A batch stream that may give its slot up (`pools[].preempt`), and
    /// one that did, waiting for a slot again.
    victim: Option<std::sync::Arc<crate::admission::preempt::Victim>>,
    waiting: Option<preempting::Waiting>,
    /// An interactive stream's moment to ask for a batch stream's slot on
    /// its replica, if it has no first token by then.
    asks: Option<preempting::Ask>,
    /// What the first-token timeout counts from: the request's arrival, or
    /// when it was sent to a second replica because the first sent no
    /// response head in time.
    first_from: Instant,
}

impl<B> ObservedBody<B> {
    /// Observe a `text/event-stream` body.
    pub(crate) fn sse(inner: B, tracker: Box<Tracker>, timeouts: StreamTimeouts, strip_usage: bool) -> Self {
        Self::new(inner, Self::sse_mode(strip_usage), tracker, timeouts)
    }

    /// Observe a `text/event-stream` body that `resume` continues on another replica if it breaks.
    pub(crate) fn resumable(inner: B, tracker: Box<Tracker>, timeouts: StreamTimeouts, strip_usage: bool, resume: Resume<B>) -> Self {
        let mut body = Self::sse(inner, tracker, timeouts, strip_usage);
        body.resume = Some(Box::new(resume));
        body
    }

    fn sse_mode(strip_usage: bool) -> Mode {
        Mode::Sse {
            parser: SseParser::new(),
            memo: Memo::new(),
            strip_usage,
            pending: BytesMut::new(),
            saw_done: false,
            saw_error: false,
            finish_reason: None,
            broke: false,
            limited: false,
        }
    }

    /// Observe a JSON body (non-streaming completion or embeddings);
    /// `usage_only`: an answer with no finish to read (embeddings, rerank),
    /// whose usage comes last.
    pub(crate) fn json(inner: B, tracker: Box<Tracker>, timeouts: StreamTimeouts, usage_only: bool) -> Self {
        Self::new(inner, Mode::Json { chunks: JsonChunks::new(), size: 0, usage_only }, tracker, timeouts)
    }

    /// Observe a binary answer made as it is sent (speech audio): TTFT at its
    /// first byte, then e2e and bytes.
    /// The tracker counts it as streamed from routing on.
    pub(crate) fn audio(inner: B, tracker: Box<Tracker>, timeouts: StreamTimeouts) -> Self {
        Self::new(inner, Mode::Audio, tracker, timeouts)
    }

    /// Forward a body whose outcome is already set (error statuses, other paths).
    pub(crate) fn passthrough(inner: B, tracker: Box<Tracker>, timeouts: StreamTimeouts) -> Self {
        Self::new(inner, Mode::Passthrough, tracker, timeouts)
    }

    fn new(inner: B, mode: Mode, tracker: Box<Tracker>, timeouts: StreamTimeouts) -> Self {
        let start = tracker.start();
        let first = if matches!(mode, Mode::Sse { .. }) { timeouts.first_token.min(timeouts.total) } else { timeouts.total };
        ObservedBody {
            inner: Some(inner),
            mode,
            tracker,
            timeouts,
            deadline: Box::pin(tokio::time::sleep_until(start + first)),
            last_event: start,
            trailer: None,
            done: false,
            handed_over: None,
            waker: None,
            resume: None,
            continuing: None,
            victim: None,
            waiting: None,
            asks: None,
            first_from: start,
        }
    }

    /// The request was sent again at `at` (its first replica sent no
    /// response head in time): its first token is due a first-token
    /// timeout from then.
    pub(crate) fn first_token_from(&mut self, at: Instant) {
        self.first_from = at;
        let due = self.next_deadline(self.last_event);
        self.deadline.as_mut().reset(due);
    }

    /// Handle one data chunk; returns what to send to the client now.
    fn on_data(&mut self, data: Bytes) -> Option<Bytes> {
        let now = self.last_event;
        match &mut self.mode {
            Mode::Passthrough => Some(data),
            Mode::Audio => {
                if self.tracker.first_token.is_none() && !data.is_empty() {
                    self.tracker.content_event(now);
                }
                Some(data)
            }
            Mode::Json { chunks, size, .. } => {
                keep_json(chunks, size, &data);
                Some(data)
            }
            Mode::Sse { parser, memo, strip_usage, pending, saw_done, saw_error, finish_reason, broke, limited } => {
                // Offsets below are in `pending ++ data`: events to cut, or
                // to replace (a continuation's, rewritten).
                let p = pending.len();
                let strip = *strip_usage;
                let tracker = &mut self.tracker;
                let mut splice = self.resume.as_deref_mut().map(|r| &mut r.splice);
                let mut cuts: Vec<(usize, usize, Option<Bytes>)> = Vec::new();
                // An LF that ends the CR of the previous read's last block
                // belongs to that block (nothing is pending then): a usage
                // event cut here starts after it.
                let lead = usize::from(p == 0 && parser.expects_lf() && data.first() == Some(&b'\n'));
                let mut prev_end = lead;
                let mut complete: Option<usize> = None;
                parser.feed(&data, |d, end| {
                    let at = (prev_end, end + p);
                    prev_end = end + p;
                    complete = Some(end);
                    if *broke || *limited {
                        // After an error event hidden for a continuation, or
                        // past the key's limits: nothing more of this replica's.
                        cuts.push((at.0, at.1, None));
                        return;
                    }
                    let Some(d) = d else { return };
                    learn_id(tracker, d, true);
                    let info = read_event(splice.as_deref_mut(), d, memo);
                    if info.error && splice.as_ref().is_some_and(|s| s.may_resume()) {
                        *broke = true;
                        cuts.push((at.0, at.1, None));
                        return;
                    }
                    if info.content {
                        if tracker.at_key_budget() {
                            *limited = true;
                            cuts.push((at.0, at.1, None));
                            return;
                        }
                        // Every content event in this read is delivered now.
                        tracker.content_event(now);
                    }
                    if let Some(u) = info.usage {
                        tracker.usage = Some(reported(tracker.usage, splice.as_deref(), u));
                    }
                    *saw_error |= info.error || info.finish_reason.as_deref() == Some("error");
                    if info.finish_reason.is_some() {
                        finish_reason.clone_from(&info.finish_reason);
                    }
                    *saw_done |= info.done;
                    if strip && info.usage_only {
                        cuts.push((at.0, at.1, None));
                    } else if let Some(s) = splice.as_deref_mut().filter(|s| s.spliced()) {
                        cuts.push((at.0, at.1, s.rewrite(d, &info)));
                    }
                });
                let Some(complete_end) = complete else {
                    // No event completed in this read: hold its bytes (but
                    // an LF that ends the last block goes with it, now).
                    pending.extend_from_slice(&data[lead..]);
                    return (lead == 1).then(|| data.slice(..1));
                };
                splice_read(pending, data, cuts, complete_end)
            }
        }
    }

    /// The upstream body ended cleanly: decide the outcome.
    fn on_end(&mut self) {
        match &mut self.mode {
            Mode::Passthrough | Mode::Audio => self.tracker.finish(crate::telemetry::Outcome::ok),
            Mode::Json { size, .. } if *size == usize::MAX => self.tracker.finish(Outcome::ok),
            Mode::Json { chunks, usage_only, .. } => {
                // One chunk (most answers): read in place.
                let whole: std::borrow::Cow<'_, [u8]> = match chunks.as_slice() {
                    [one] => std::borrow::Cow::Borrowed(one),
                    more => std::borrow::Cow::Owned(more.concat()),
                };
                learn_id(&mut self.tracker, &whole, false);
                let outcome = match self.tracker.endpoint() {
                    crate::config::Endpoint::Transcription => read_transcription(&whole, &mut self.tracker),
                    crate::config::Endpoint::Messages => read_message(&whole, &mut self.tracker),
                    _ => read_json_outcome(&whole, *usage_only, &mut self.tracker),
                };
                self.tracker.finish(outcome);
            }
            Mode::Sse { pending, saw_done, saw_error, finish_reason, .. } => {
                if !pending.is_empty() {
                    self.tracker.bytes_out += pending.len() as u64;
                    self.trailer = Some(std::mem::take(pending).freeze());
                }
                let outcome = if *saw_error {
                    Outcome::stream_error
                } else if !*saw_done {
                    self.tracker.cut = true;
                    Outcome::stream_error
                } else if finish_reason.as_deref() == Some("length") {
                    Outcome::length
                } else {
                    Outcome::ok
                };
                self.tracker.finish_reason = finish_reason.clone();
                self.tracker.finish(outcome);
            }
        }
    }

    /// The replica's current event has grown past `max_event` bytes without
    /// ending (a line that never ends): reading on would hold it all.
    fn event_too_large(&self) -> bool {
        matches!(&self.mode, Mode::Sse { pending, .. } if pending.len() > self.timeouts.max_event)
    }

    /// End the stream now, cancelling the upstream request: an error event
    /// (on an event boundary: the partial event is dropped), `stream_error`.
    fn on_event_too_large(&mut self) {
        let what = format!("slogate: an event from the replica exceeded max_event_bytes ({} bytes)", self.timeouts.max_event);
        tracing::warn!(request_id = self.tracker.request_id.to_str().unwrap_or(""), class = %self.tracker.class().name, model = %self.tracker.model(), "{what}");
        self.tracker.cut = true;
        self.end_with_error(&what, "upstream_error", 502, Outcome::stream_error);
    }

    /// The stream relayed what its key's token limits reserved for it: end
    /// it now as a stream capped by its output limit ends, so the SDKs read
    /// a normal end (docs/access.md, rule 10).
    fn on_key_limit(&mut self) {
        let last = limit_event(self.tracker.endpoint(), &self.tracker.request_id, self.tracker.model());
        self.tracker.finish_reason = Some("length".into());
        self.end_with(Some(last), Outcome::quota_exhausted);
    }

    /// Stop reading the replica (dropping its body cancels its request) and
    /// end with `outcome`; a stream's client gets an error event (a partial
    /// event was never sent, so it starts on an event boundary) and `[DONE]`.
    fn end_with_error(&mut self, message: &str, kind: &str, code: u16, outcome: Outcome) {
        let anthropic = self.tracker.endpoint() == crate::config::Endpoint::Messages;
        let event = matches!(self.mode, Mode::Sse { .. }).then(|| error_event(message, kind, code, &self.tracker.request_id, anthropic));
        self.end_with(event, outcome);
    }

    /// Stop reading the replica and end with `outcome`, a stream's partial
    /// event dropped and `last` (whole events) sent after what the client has.
    pub(super) fn end_with(&mut self, last: Option<Bytes>, outcome: Outcome) {
        self.inner = None;
        if let Mode::Sse { pending, .. } = &mut self.mode {
            *pending = BytesMut::new();
        }
        if let Some(last) = last {
            self.tracker.bytes_out += last.len() as u64;
            self.trailer = Some(last);
        }
        self.tracker.finish(outcome);
        self.done = true;
    }

    /// The replica's body ended cleanly: account for it.
    fn end(&mut self) {
        self.inner = None;
        self.on_end();
        self.done = true;
    }

    /// A timeout fired: stop reading upstream (cancelling it) and tell the
    /// client; or, for a stream that stalled after its first token,
    /// continue it on another replica. False: it goes on (continued).
    pub(super) fn on_timeout(&mut self) -> bool {
        let waited_for_first = self.tracker.first_token.is_none();
        let elapsed = self.tracker.start.elapsed();
        let sse = matches!(self.mode, Mode::Sse { .. });
        let stalled = !waited_for_first && elapsed < self.timeouts.total && self.continuing.is_none();
        if sse && stalled && self.resume_stream(Break::Stall) {
            return false;
        }
        self.continuing = None;
        let what = if elapsed >= self.timeouts.total {
            format!("slogate: request exceeded the total timeout of {:?}", self.timeouts.total)
        } else if waited_for_first && sse {
            format!("slogate: no first token within {:?}", self.timeouts.first_token)
        } else {
            format!("slogate: no data from the replica for {:?}", self.timeouts.idle)
        };
        tracing::warn!(request_id = self.tracker.request_id.to_str().unwrap_or(""), class = %self.tracker.class().name, model = %self.tracker.model(), "{what}");
        self.end_with_error(&what, "timeout", 504, Outcome::timeout);
        true
    }

    /// One data frame from the replica (`ended`: its last): measured,
    /// maybe ended; what to send the client.
    fn on_frame(&mut self, data: Bytes, ended: bool) -> Option<Bytes> {
        self.last_event = Instant::now();
        let out = self.on_data(data);
        self.tracker.bytes_out += out.as_ref().map_or(0, |o| o.len() as u64);
        if matches!(self.mode, Mode::Sse { limited: true, .. }) {
            self.on_key_limit();
        } else if self.event_too_large() {
            self.on_event_too_large();
        } else if self.broke_on_error_event() {
            if !self.resume_stream(Break::ErrorEvent) {
                self.tracker.cut = true;
                let what = "slogate: the replica sent an error event and the stream could not be continued";
                self.end_with_error(what, "upstream_error", 502, Outcome::stream_error);
            }
            return out;
        } else if ended {
            self.end();
        }
        if !self.done {
            // Deadlines only move later as events arrive, except when the
            // first token switches from the first-token to the idle budget:
            // only then can the armed timer be too late.
            let due = self.next_deadline(self.last_event);
            if due < self.deadline.deadline() {
                self.deadline.as_mut().reset(due);
            }
        }
        out
    }

    /// The deadline given the last event at `last`.
    pub(super) fn next_deadline(&self, last: Instant) -> Instant {
        let total = self.tracker.start + self.timeouts.total;
        let gap = match self.mode {
            Mode::Sse { .. } if self.tracker.first_token.is_none() => {
                return (self.first_from + self.timeouts.first_token).min(total);
            }
            _ => self.timeouts.idle,
        };
        (last + gap).min(total)
    }
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(t) = this.trailer.take() {
                return Poll::Ready(Some(Ok(Frame::data(t))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            ready!(this.poll_waiting(cx));
            ready!(this.poll_continuing(cx));
            if this.preempt_if_asked(cx) {
                continue;
            }
            this.poll_ask(cx);
            let Some(inner) = this.inner.as_mut() else {
                this.done = true;
                continue;
            };
            match Pin::new(&mut *inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        // A body of known length (a JSON answer with
                        // Content-Length) ends with its last frame: the
                        // server may never poll again, so the end is
                        // accounted for now, not at a poll that returns None.
                        let ended = inner.is_end_stream();
                        let out = this.on_frame(data, ended);
                        this.note_sent();
                        if let Some(out) = out {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Poll::Ready(Some(Err(e))) if matches!(this.mode, Mode::Sse { saw_done: true, .. }) => {
                    // The client has the whole stream: a connection that
                    // fails after `[DONE]` broke nothing.
                    let e: BoxError = e.into();
                    tracing::debug!(request_id = this.tracker.request_id.to_str().unwrap_or(""), error = %e, "replica connection failed after [DONE]");
                    this.end();
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    tracing::warn!(request_id = this.tracker.request_id.to_str().unwrap_or(""), class = %this.tracker.class().name, model = %this.tracker.model(), error = %e, "replica stream failed");
                    // A stream ends as OpenAI's do when they fail (an error
                    // event); any other body is cut, as the replica's was.
                    let sse = matches!(this.mode, Mode::Sse { .. });
                    if sse && this.resume_stream(Break::Reset) {
                        continue;
                    }
                    this.tracker.cut = true;
                    let outcome = if sse { Outcome::stream_error } else { Outcome::upstream_error };
                    this.end_with_error(&format!("slogate: the replica's stream failed: {e}"), "upstream_error", 502, outcome);
                    if sse {
                        continue;
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if !(this.unfinished() && this.resume_stream(Break::Eof)) {
                        this.end();
                    }
                }
                Poll::Pending => loop {
                    ready!(this.deadline.as_mut().poll(cx));
                    let due = this.next_deadline(this.last_event);
                    if Instant::now() >= due {
                        this.on_timeout();
                        break;
                    }
                    this.deadline.as_mut().reset(due);
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailer.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.mode, &self.inner) {
            (Mode::Sse { .. }, _) | (_, None) => SizeHint::default(),
            (_, Some(inner)) => inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
