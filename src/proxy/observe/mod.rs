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

mod resuming;

use super::json::read_json_outcome;
use super::resume::{Break, Continuing, Resume};
use super::tracker::Tracker;
use crate::config::{PoolConfig, ServerConfig};
use crate::error::BoxError;
use crate::telemetry::Outcome;
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
        /// The stream's last chunk with text: the next ones are read by it.
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
    },
    /// A JSON body: keep the chunks (cheap clones) to read usage at the
    /// end (`usage_only`: only usage is read, from the tail when it is there).
    Json { chunks: Vec<Bytes>, size: usize, usage_only: bool },
    /// Forward as is; the outcome was decided from the status.
    Passthrough,
    /// A binary answer sent as it is made (speech): its first byte is its
    /// first token; forwarded as is.
    Audio,
}

const JSON_KEEP_LIMIT: usize = 16 << 20;

/// Keep a JSON body's chunk (a cheap clone) to read at its end; past
/// [`JSON_KEEP_LIMIT`] the body is passed on unread (`usize::MAX` marks it).
fn keep_json(chunks: &mut Vec<Bytes>, size: &mut usize, data: &Bytes) {
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
    pub(super) tracker: Tracker,
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
    /// What the first-token timeout counts from: the request's arrival, or
    /// when it was sent to a second replica because the first sent no
    /// response head in time.
    first_from: Instant,
}

impl<B> ObservedBody<B> {
    /// Observe a `text/event-stream` body.
    pub(crate) fn sse(inner: B, tracker: Tracker, timeouts: StreamTimeouts, strip_usage: bool) -> Self {
        Self::new(inner, Self::sse_mode(strip_usage), tracker, timeouts)
    }

    /// Observe a `text/event-stream` body that `resume` continues on another replica if it breaks.
    pub(crate) fn resumable(inner: B, tracker: Tracker, timeouts: StreamTimeouts, strip_usage: bool, resume: Resume<B>) -> Self {
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
        }
    }

    /// Observe a JSON body (non-streaming completion or embeddings);
    /// `usage_only`: an answer with no finish to read (embeddings, rerank),
    /// whose usage comes last.
    pub(crate) fn json(inner: B, tracker: Tracker, timeouts: StreamTimeouts, usage_only: bool) -> Self {
        Self::new(inner, Mode::Json { chunks: Vec::new(), size: 0, usage_only }, tracker, timeouts)
    }

    /// Observe a binary answer made as it is sent (speech audio): TTFT at its
    /// first byte, then e2e and bytes.
    pub(crate) fn audio(inner: B, mut tracker: Tracker, timeouts: StreamTimeouts) -> Self {
        tracker.set_streaming(true);
        Self::new(inner, Mode::Audio, tracker, timeouts)
    }

    /// Forward a body whose outcome is already set (error statuses, other paths).
    pub(crate) fn passthrough(inner: B, tracker: Tracker, timeouts: StreamTimeouts) -> Self {
        Self::new(inner, Mode::Passthrough, tracker, timeouts)
    }

    fn new(inner: B, mode: Mode, tracker: Tracker, timeouts: StreamTimeouts) -> Self {
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
            Mode::Sse { parser, memo, strip_usage, pending, saw_done, saw_error, finish_reason, broke } => {
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
                    if *broke {
                        // After an error event hidden for a continuation: nothing more of this replica's.
                        cuts.push((at.0, at.1, None));
                        return;
                    }
                    let Some(d) = d else { return };
                    let info = match splice.as_deref_mut() {
                        Some(s) => {
                            s.note_ids(d);
                            s.read(d)
                        }
                        None => memo.analyze(d),
                    };
                    if info.error && splice.as_ref().is_some_and(|s| s.may_resume()) {
                        *broke = true;
                        cuts.push((at.0, at.1, None));
                        return;
                    }
                    if info.content {
                        // Every content event in this read is delivered now.
                        tracker.content_event(now);
                    }
                    if let Some(u) = info.usage {
                        tracker.usage = Some(splice.as_ref().map_or(u, |s| s.usage(u)));
                    }
                    if let Some(f) = &info.finish_reason {
                        *saw_error |= f == "error";
                        *finish_reason = Some(f.clone());
                    }
                    *saw_error |= info.error;
                    *saw_done |= info.done;
                    if strip && info.usage_only {
                        cuts.push((at.0, at.1, None));
                    } else if let Some(s) = splice.as_ref().filter(|s| s.spliced()) {
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
                let outcome = read_json_outcome(&whole, *usage_only, &mut self.tracker);
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

    /// Stop reading the replica (dropping its body cancels its request) and
    /// end with `outcome`; a stream's client gets an error event (a partial
    /// event was never sent, so it starts on an event boundary) and `[DONE]`.
    fn end_with_error(&mut self, message: &str, kind: &str, code: u16, outcome: Outcome) {
        self.inner = None;
        if let Mode::Sse { pending, .. } = &mut self.mode {
            *pending = BytesMut::new();
            let event = error_event(message, kind, code, &self.tracker.request_id);
            self.tracker.bytes_out += event.len() as u64;
            self.trailer = Some(event);
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
        if self.event_too_large() {
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

/// What the client gets of a read (`data`, after the `pending` bytes
/// held from earlier reads): the events that completed in it, up to
/// `complete_end` of `data`, less those `cuts` remove (or with what they
/// put instead); the rest of `data` is held.
fn splice_read(pending: &mut BytesMut, data: Bytes, cuts: Vec<(usize, usize, Option<Bytes>)>, complete_end: usize) -> Option<Bytes> {
    let p = pending.len();
    if cuts.is_empty() && p == 0 && complete_end == data.len() {
        return Some(data);
    }
    let mut buf = BytesMut::with_capacity(p + complete_end);
    // Offsets are in `pending ++ data`.
    let append = |buf: &mut BytesMut, a: usize, b: usize| {
        if a < p {
            buf.extend_from_slice(&pending[a..b.min(p)]);
        }
        if b > p {
            buf.extend_from_slice(&data[a.max(p) - p..b - p]);
        }
    };
    let mut pos = 0;
    for (s, e, instead) in cuts {
        append(&mut buf, pos, s);
        if let Some(instead) = instead {
            buf.extend_from_slice(&instead);
        }
        pos = e;
    }
    append(&mut buf, pos, complete_end + p);
    pending.clear();
    pending.extend_from_slice(&data[complete_end..]);
    Some(buf.freeze()).filter(|b| !b.is_empty())
}

/// An SSE error event in OpenAI's error form (with the request's id), then `[DONE]`.
fn error_event(message: &str, kind: &str, code: u16, id: &http::HeaderValue) -> Bytes {
    let id = id.to_str().ok().filter(|i| !i.is_empty());
    let json = crate::error::error_body(message, kind, None, code, id);
    let mut ev = BytesMut::with_capacity(json.len() + 32);
    ev.extend_from_slice(b"data: ");
    ev.extend_from_slice(&json);
    ev.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    ev.freeze()
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
            ready!(this.poll_continuing(cx));
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
                        if let Some(out) = this.on_frame(data, ended) {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
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
mod tests {
    use std::collections::VecDeque;

    use http_body_util::BodyExt;

    use std::sync::Arc;

    use super::*;
    use crate::proxy::fixtures::{cut_into_reads, fixture};
    use crate::proxy::tracker::GAPS_REPORTED_EVERY;
    use crate::proxy::watchdog::Watched;

    /// A body that yields the given chunks, then stays pending or ends.
    struct Chunks {
        q: VecDeque<Bytes>,
        hang: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            match self.q.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None if self.hang => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    const TIMEOUTS: StreamTimeouts = StreamTimeouts {
        first_token: Duration::from_secs(5),
        idle: Duration::from_secs(5),
        total: Duration::from_secs(60),
        max_event: 1 << 20,
        send: Duration::from_secs(30),
    };

    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    const TOK: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    const FIN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    async fn run(chunks: Vec<Bytes>, strip: bool) -> (Bytes, String) {
        let (metrics, class) = fixture();
        let tracker = Tracker::new(metrics.clone(), class, Instant::now());
        let body = ObservedBody::sse(Chunks { q: chunks.into(), hang: false }, tracker, TIMEOUTS, strip);
        let out = body.collect().await.expect("body").to_bytes();
        (out, metrics.encode())
    }

    #[tokio::test]
    async fn usage_event_is_cut_at_every_split_point_and_nothing_else_changes() {
        let with_usage = format!("{ROLE}: ka\n\n{TOK}{TOK}{TOK}{FIN}{USAGE}{DONE}");
        let expected = format!("{ROLE}: ka\n\n{TOK}{TOK}{TOK}{FIN}{DONE}");
        let whole = Bytes::from(with_usage.clone());
        for a in 0..=whole.len() {
            for b in [a, (a + 7).min(whole.len()), (a + 40).min(whole.len())] {
                let chunks = vec![whole.slice(..a), whole.slice(a..b), whole.slice(b..)];
                let (out, metrics) = run(chunks, true).await;
                assert_eq!(String::from_utf8_lossy(&out), expected, "split at {a},{b}");
                assert!(metrics.contains("slogate_generation_tokens_total{model=\"unknown\",class=\"chat\"} 3"), "usage read at {a},{b}");
                assert!(
                    metrics.contains("slogate_inter_token_latency_seconds_count{model=\"unknown\",class=\"chat\",tier=\"interactive\",endpoint=\"other\"} 2"),
                    "{a},{b}"
                );
            }
        }
        let bytes: Vec<Bytes> = (0..whole.len()).map(|i| whole.slice(i..i + 1)).collect();
        assert_eq!(String::from_utf8_lossy(&run(bytes, true).await.0), expected);
        // Without stripping, bytes are forwarded untouched.
        assert_eq!(run(vec![whole.clone()], false).await.0, whole);
    }

    /// Found by the SSE property (`tests/it/fuzz_properties.rs`): a blank line
    /// ended by CRLF that the reads split between CR and LF, followed by the
    /// usage event, lost its LF when the usage event was cut.
    #[tokio::test]
    async fn a_crlf_split_before_a_usage_event_keeps_its_lf() {
        let usage = USAGE.as_bytes();
        for chunks in [vec![&b"\r"[..], &b"\n"[..], usage, DONE.as_bytes()], vec![&b"\r"[..], &[b"\n", usage].concat(), DONE.as_bytes()]] {
            let chunks: Vec<Bytes> = chunks.into_iter().map(Bytes::copy_from_slice).collect();
            let (out, _) = run(chunks, true).await;
            assert_eq!(String::from_utf8_lossy(&out), format!("\r\n{DONE}"));
        }
    }

    #[tokio::test]
    async fn outcome_is_recorded_exactly_once_when_the_body_is_dropped_midway() {
        let (metrics, class) = fixture();
        let tracker = Tracker::new(metrics.clone(), class, Instant::now());
        let mut body =
            ObservedBody::sse(Chunks { q: vec![Bytes::from(ROLE), Bytes::from(TOK)].into(), hang: true }, tracker, TIMEOUTS, true);
        body.frame().await.expect("frame").expect("ok");
        drop(body);
        let text = metrics.encode();
        assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
        assert_eq!(text.matches("slogate_requests_total{").count(), 1);
    }

    /// A JSON answer without usage has its completion estimated from its
    /// text, four characters a token; content that is not a string counts
    /// nothing and does not make the answer unreadable.
    #[test]
    fn a_json_answer_without_usage_is_estimated_from_its_text() {
        let (metrics, class) = fixture();
        let mut t = Tracker::new(metrics, class, Instant::now());
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"h\u00e9llo there"},"finish_reason":"stop"},{"message":{"content":[{"type":"text","text":"x"}]}},{"text":"abcd"}]}"#;
        assert_eq!(read_json_outcome(body, false, &mut t), Outcome::ok);
        // "héllo there" is 11 characters, "abcd" 4: 15, so 4 tokens.
        assert_eq!(t.answer_estimate, Some(4));
    }

    /// The text is not read unless it is counted, but an answer whose text
    /// is not UTF-8 (or whose string is cut) is still no usable answer.
    #[test]
    fn an_answer_whose_text_is_not_utf8_is_an_upstream_error() {
        let (metrics, class) = fixture();
        let mut t = Tracker::new(metrics, class, Instant::now());
        let usage = br#"],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#;
        let mut body = br#"{"choices":[{"text":"ok "#.to_vec();
        body.extend_from_slice(&[0xff, 0xfe, b'"', b'}']);
        body.extend_from_slice(usage);
        assert_eq!(read_json_outcome(&body, false, &mut t), Outcome::upstream_error);
        let cut = br#"{"choices":[{"text":"no end}],"usage":{"prompt_tokens":2}}"#;
        assert_eq!(read_json_outcome(cut, false, &mut t), Outcome::upstream_error);
        let fine = br#"{"choices":[{"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#;
        assert_eq!(read_json_outcome(fine, false, &mut t), Outcome::length);
        assert_eq!((t.answer_estimate, t.usage.map(|u| u.completion_tokens)), (None, Some(3)), "with usage, no estimate");
    }

    /// An embeddings answer's usage is read from its end, and an answer
    /// whose end is not its usage is read whole, with the same result.
    #[test]
    fn an_embeddings_answers_usage_is_read_from_its_end() {
        let (metrics, class) = fixture();
        let usage = |body: &[u8]| {
            let mut t = Tracker::new(metrics.clone(), class.clone(), Instant::now());
            (read_json_outcome(body, true, &mut t), t.usage.map(|u| (u.prompt_tokens, u.completion_tokens)))
        };
        let at_end = br#"{"object":"list","data":[{"index":0,"embedding":[0.1,-0.2,3e-5]}],"usage": {"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null} }"#;
        assert_eq!(usage(at_end), (Outcome::ok, Some((12, 0))));
        let in_middle = br#"{"usage":{"prompt_tokens":3,"total_tokens":3},"data":[{"embedding":[1]}],"object":"list"}"#;
        assert_eq!(usage(in_middle), (Outcome::ok, Some((3, 0))), "read whole");
        let quoted = br#"{"data":[{"text":"a "usage":{"prompt_tokens":99}"}],"usage":{"prompt_tokens":4}}"#;
        assert_eq!(usage(quoted), (Outcome::ok, Some((4, 0))), "a quoted pattern is not a member");
        assert_eq!(usage(br#"{"data":[1,2],"usage":{"prompt_tokens":4}"#).0, Outcome::upstream_error, "cut short");
        assert_eq!(usage(b"<html>usage</html>").0, Outcome::upstream_error);
    }

    #[tokio::test(start_paused = true)]
    async fn first_token_timeout_ends_the_stream_with_an_error_event() {
        let (metrics, class) = fixture();
        let tracker = Tracker::new(metrics.clone(), class, Instant::now());
        let start = Instant::now();
        let body = ObservedBody::sse(Chunks { q: vec![Bytes::from(ROLE)].into(), hang: true }, tracker, TIMEOUTS, true);
        let out = body.collect().await.expect("body").to_bytes();
        assert_eq!(start.elapsed(), TIMEOUTS.first_token, "fires exactly at the first-token deadline");
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with(ROLE) && text.contains("no first token within 5s") && text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(metrics.encode().contains("outcome=\"timeout\"} 1"));
    }

    /// A replica with data always ready, that notes when it is dropped
    /// (the request to it cancelled).
    struct Endless(Arc<std::sync::atomic::AtomicBool>);

    impl Body for Endless {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(TOK)))))
        }
    }

    impl Drop for Endless {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A client that takes one frame and then no more: the server stops
    /// polling the body. The deadline that comes first still ends it, from
    /// the watchdog's timer: the replica's request is dropped and the
    /// request accounted for at that moment, with no poll.
    async fn unread(timeouts: StreamTimeouts, wait: Duration) -> (bool, String) {
        let (metrics, class) = fixture();
        let tracker = Tracker::new(metrics.clone(), class, Instant::now());
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let list = Arc::new(crate::sync::Watchlist::default());
        let mut body = Watched::new(ObservedBody::sse(Endless(dropped.clone()), tracker, timeouts, false), &list);
        body.frame().await.expect("a frame").expect("ok");
        tokio::time::advance(wait).await;
        // Let the watchdog run.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let out = (dropped.load(std::sync::atomic::Ordering::SeqCst), metrics.encode());
        drop(body);
        out
    }

    #[tokio::test(start_paused = true)]
    async fn the_total_timeout_fires_for_a_body_nobody_polls() {
        let t = StreamTimeouts {
            first_token: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            total: Duration::from_secs(4),
            ..TIMEOUTS
        };
        let (dropped, text) = unread(t, Duration::from_millis(3900)).await;
        assert!(!dropped && !text.contains("slogate_requests_total{"), "nothing ends before the deadline: {text}");
        let (dropped, text) = unread(t, Duration::from_millis(4100)).await;
        assert!(dropped, "the replica's request is cancelled");
        assert!(text.contains("outcome=\"timeout\"} 1"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_for_the_send_timeout_is_cancelled() {
        let t = StreamTimeouts {
            first_token: Duration::from_secs(600),
            idle: Duration::from_secs(600),
            total: Duration::from_secs(3600),
            send: Duration::from_secs(10),
            ..TIMEOUTS
        };
        let (dropped, text) = unread(t, Duration::from_millis(10_100)).await;
        assert!(dropped, "the replica's request is cancelled");
        assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
    }

    /// A body whose chunks arrive at given times after its start (for
    /// paused-time tests: the times are exact), then ends or hangs.
    struct Timed {
        start: Instant,
        q: VecDeque<(Duration, Bytes)>,
        sleep: Option<Pin<Box<Sleep>>>,
        hang: bool,
    }

    impl Timed {
        fn new(chunks: Vec<(u64, &str)>, hang: bool) -> Self {
            let q = chunks.into_iter().map(|(ms, b)| (Duration::from_millis(ms), Bytes::from(b.to_string()))).collect();
            Timed { start: Instant::now(), q, sleep: None, hang }
        }
    }

    impl Body for Timed {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let Some(&(at, _)) = self.q.front() else {
                return if self.hang { Poll::Pending } else { Poll::Ready(None) };
            };
            let due = self.start + at;
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
            Poll::Ready(self.q.pop_front().map(|(_, b)| Ok(Frame::data(b))))
        }
    }

    /// A sample's value in the exposition: `NAME{...class="chat"...} VALUE`.
    fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("class=\"chat\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    async fn observe_timed(chunks: Vec<(u64, &str)>, hang: bool, timeouts: StreamTimeouts) -> (String, String) {
        let (metrics, class) = fixture();
        let mut tracker = Tracker::new(metrics.clone(), class, Instant::now());
        tracker.set_streaming(true);
        let body = ObservedBody::sse(Timed::new(chunks, hang), tracker, timeouts, true);
        let out = body.collect().await.expect("body").to_bytes();
        (String::from_utf8_lossy(&out).into_owned(), metrics.encode())
    }

    #[tokio::test(start_paused = true)]
    async fn ttft_and_itl_are_the_exact_times_of_the_content_events() {
        // Role chunk at once, a keep-alive at 100 ms, content at 400 ms and
        // 900 ms: TTFT is 400 ms (not 0, not 900), the one gap 500 ms.
        let (_, m) = observe_timed(
            vec![(0, ROLE), (100, ": ka\n\n"), (400, TOK), (900, TOK), (900, FIN), (900, USAGE), (900, DONE)],
            false,
            TIMEOUTS,
        )
        .await;
        assert_eq!(sample(&m, "slogate_time_to_first_token_seconds_sum"), 0.4);
        assert_eq!(sample(&m, "slogate_time_to_first_token_seconds_count"), 1.0);
        assert_eq!(sample(&m, "slogate_inter_token_latency_seconds_sum"), 0.5);
        assert_eq!(sample(&m, "slogate_inter_token_latency_seconds_count"), 1.0);
        assert_eq!(sample(&m, "slogate_e2e_request_latency_seconds_sum"), 0.9);
        // TPOT = (e2e - TTFT) / (3 tokens - 1) = 0.25 s.
        assert_eq!(sample(&m, "slogate_time_per_output_token_seconds_sum"), 0.25);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_reports_its_gaps_to_its_replica_while_it_runs_and_at_its_end() {
        use crate::config::{InflightLimit, PoolConfig, Tier, TiersConfig};
        use crate::upstream::{Access, Pool};
        let (metrics, class) = fixture();
        let cfg = PoolConfig {
            replicas: vec!["http://127.0.0.1:9".into()],
            max_inflight_per_replica: InflightLimit::Fixed(4),
            ..PoolConfig::default()
        };
        let pool = Pool::new(cfg.clone(), Access::new(&cfg).expect("access"), None);
        let replica = pool.replicas[0].clone();
        replica.set_healthy(true);
        let admission = Arc::new(crate::admission::queue::PoolAdmission::new(Arc::new(pool), TiersConfig::default(), &metrics));
        let mut tracker = Tracker::new(metrics.clone(), class, Instant::now());
        tracker.attach_lease(admission.try_lease(Tier::Interactive).expect("a slot"), Duration::ZERO);
        let tick = |t: &mut Tracker, ms: u64| {
            let now = t.last_token.map_or(Instant::now(), |l| l + Duration::from_millis(ms));
            t.content_event(now);
        };
        tick(&mut tracker, 0);
        for _ in 0..GAPS_REPORTED_EVERY - 1 {
            tick(&mut tracker, 40);
        }
        assert_eq!(replica.itl_mean(), Duration::ZERO, "nothing reported before the first {GAPS_REPORTED_EVERY} gaps");
        tick(&mut tracker, 40);
        assert_eq!(replica.itl_mean(), Duration::from_millis(40), "the stream still runs");
        // The replica slows down: the next report moves its mean a fifth of the way to 90 ms.
        for _ in 0..GAPS_REPORTED_EVERY {
            tick(&mut tracker, 90);
        }
        assert_eq!(replica.itl_mean(), Duration::from_millis(50));
        // The end reports what is left (4 gaps of 140 ms), once.
        for _ in 0..4 {
            tick(&mut tracker, 140);
        }
        drop(tracker);
        assert_eq!(replica.itl_mean(), Duration::from_millis(68));
        assert_eq!(replica.inflight(), 0, "the slot given back");
    }

    #[tokio::test(start_paused = true)]
    async fn more_than_one_gap_in_a_hundred_over_the_itl_target_is_an_itl_breach() {
        // 101 tokens, 100 gaps of 10 ms; `slow` of them 60 ms (chat's target is 50 ms).
        for (slow, breach) in [(1, false), (2, true)] {
            let mut chunks = vec![(0u64, ROLE)];
            let mut t = 0;
            for i in 0..101 {
                if i > 0 {
                    t += if i <= slow { 60 } else { 10 };
                }
                chunks.push((t, TOK));
            }
            chunks.extend([(t, FIN), (t, DONE)]);
            let (_, m) = observe_timed(chunks, false, TIMEOUTS).await;
            let itl_breaches =
                m.lines().any(|l| l.starts_with("slogate_slo_breaches_total{") && l.contains("kind=\"itl\"") && l.ends_with(" 1"));
            assert_eq!(itl_breaches, breach, "{slow} slow gaps of 100");
            let goodput = m.lines().any(|l| l.starts_with("slogate_goodput_requests_total{") && l.ends_with(" 1"));
            assert_eq!(goodput, !breach, "{slow} slow gaps of 100: goodput\n{m}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_total_timeout_ends_a_stream_that_still_flows() {
        // A token every 500 ms for ever; idle and first-token budgets never
        // run out, the 2 s total does: the stream ends exactly then.
        let total =
            StreamTimeouts { first_token: Duration::from_secs(5), idle: Duration::from_secs(5), total: Duration::from_secs(2), ..TIMEOUTS };
        let chunks: Vec<(u64, &str)> = std::iter::once((0, ROLE)).chain((1..20).map(|i| (i * 500, TOK))).collect();
        let start = Instant::now();
        let (out, m) = observe_timed(chunks, true, total).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2), "ended at the total timeout");
        assert_eq!(out.matches("\"x\"").count(), 4, "the tokens of 0.5-2.0 s were delivered: {out}");
        assert!(out.contains("exceeded the total timeout of 2s") && out.ends_with("data: [DONE]\n\n"), "{out}");
        assert!(m.contains("outcome=\"timeout\"} 1"), "{m}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Usage stripping leaves exactly the replica's bytes without the
        /// usage event, however the stream is cut into reads.
        #[test]
        fn stripping_leaves_exactly_the_replicas_bytes_minus_the_usage_event(
            tokens in 0usize..6,
            keepalives in proptest::collection::vec(0usize..8, 0..3),
            cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..8),
        ) {
            let mut events: Vec<&str> = vec![ROLE];
            events.extend(std::iter::repeat_n(TOK, tokens));
            for k in &keepalives {
                events.insert((*k).min(events.len()), ": keep-alive\n\n");
            }
            events.push(FIN);
            let expected = format!("{}{DONE}", events.concat());
            events.push(USAGE);
            events.push(DONE);
            let whole = Bytes::from(events.concat());
            let chunks = cut_into_reads(&whole, cuts.iter().map(|c| c.index(whole.len() + 1)).collect());
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
            let (out, _) = rt.block_on(run(chunks, true));
            proptest::prop_assert_eq!(String::from_utf8_lossy(&out), expected);
        }
    }
}
