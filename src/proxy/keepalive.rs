//! Keep-alives for streams that wait (`server.queued_keepalive`).
//!
//! A streaming request may wait in its tier's queue for up to its
//! `queue_timeout` (two minutes for batch by default). A load balancer in
//! front of slogate (an AWS ALB, nginx: 60 s by default) cuts a connection
//! that carries no bytes for its idle timeout, and the request is lost while
//! it waits its turn. With a keep-alive interval set, a streaming request
//! still without its response after that interval gets its 200 headers and
//! an SSE comment line (`: queued`), then another every interval, until the
//! response arrives:
//!
//! - a stream: its events follow the comments. The comments are slogate's,
//!   never the replica's, so they do not stop the TTFT clock (that runs
//!   from the request's arrival to its first content event, queue included);
//! - a refusal or an error (queue timeout, breaker, shed, a replica's
//!   error): the stream ends with that error as an OpenAI error event, the
//!   body the error response would have carried, then `[DONE]`. It is
//!   counted with the same outcome as the error response would have been
//!   (`rejected` for a refusal).
//!
//! The trade-off: once the headers are sent the status is committed. A
//! client sees 200 for a request that was then refused, without the
//! Retry-After and rate-limit headers a 429 would carry; it must read the
//! error event (the OpenAI SDKs raise it as an API error).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::error::{BoxError, ProxyBody};

/// The rest of a request's path, from routing to its response.
pub(crate) type Pending = Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>;

/// The comment line sent while the request waits.
const COMMENT: &[u8] = b": queued\n\n";

/// An error body longer than this is cut: an error event is a message, not
/// a payload.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Set by the request path once it knows the request is a stream (after
/// routing): only a stream may have its headers sent early.
#[derive(Clone, Default)]
pub(crate) struct Streams(Arc<Notify>);

impl Streams {
    pub(crate) fn mark(&self) {
        // Kept as a permit until [`Streams::marked`] waits for it.
        self.0.notify_one();
    }

    async fn marked(&self) {
        self.0.notified().await
    }
}

/// Wait for `pending`; if it has waited `every` without its response and
/// is a stream (or once it is known to be one), answer 200 now with a body
/// that sends comments until the response comes.
pub(crate) async fn respond(
    mut pending: Pending,
    every: Duration,
    streams: Streams,
    class: Option<HeaderValue>,
    id: HeaderValue,
) -> Response<ProxyBody> {
    tokio::select! {
        resp = &mut pending => return resp,
        _ = tokio::time::sleep(every) => {}
    }
    tokio::select! {
        resp = &mut pending => resp,
        _ = streams.marked() => committed(pending, every, class, &id),
    }
}

/// The 200 response of a stream whose headers go before its response.
fn committed(pending: Pending, every: Duration, class: Option<HeaderValue>, id: &HeaderValue) -> Response<ProxyBody> {
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let body = KeepaliveBody { state: State::Waiting { pending, ticks, first: true } };
    let mut resp = Response::new(body.boxed_unsync());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(v) = class {
        h.insert(HeaderName::from_static("x-slogate-class"), v);
    }
    h.insert(HeaderName::from_static("x-slogate-keepalive"), HeaderValue::from_static("queued"));
    h.insert(HeaderName::from_static("x-request-id"), id.clone());
    resp
}

struct KeepaliveBody {
    state: State,
}

enum State {
    /// No response yet: comments every tick (the first at once).
    Waiting {
        pending: Pending,
        ticks: Interval,
        first: bool,
    },
    /// A stream: its body, as it comes.
    Streaming(ProxyBody),
    /// Not a stream (an error, or a replica that answered with JSON): read
    /// whole, then sent as one event.
    Reading {
        body: ProxyBody,
        buf: BytesMut,
        error: bool,
    },
    Done,
}

impl KeepaliveBody {
    /// The response arrived: what to do with its body.
    fn arrived(&mut self, resp: Response<ProxyBody>) {
        let is_sse =
            resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"));
        let error = !resp.status().is_success();
        self.state = if is_sse && !error {
            State::Streaming(resp.into_body())
        } else {
            State::Reading { body: resp.into_body(), buf: BytesMut::new(), error }
        };
    }
}

/// A whole non-stream body as the stream's last event, then `[DONE]`. An
/// error body in OpenAI's form (`{"error": ...}`) goes as it is; anything
/// else from a failed request is wrapped in that form.
fn last_event(body: &[u8], error: bool) -> Bytes {
    let is_error_json =
        serde_json::from_slice::<serde_json::Value>(body).ok().is_some_and(|v| v.get("error").is_some_and(|e| e.is_object()));
    let json = if error && !is_error_json {
        let text = String::from_utf8_lossy(body);
        crate::error::error_json(text.trim(), "upstream_error", None, "upstream_error")
    } else {
        body.to_vec()
    };
    let mut ev = BytesMut::with_capacity(json.len() + 32);
    ev.extend_from_slice(b"data: ");
    // An event's data is one line: a JSON body's own newlines are dropped.
    ev.extend(json.iter().copied().filter(|&b| b != b'\n' && b != b'\r'));
    ev.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    ev.freeze()
}

impl Body for KeepaliveBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Waiting { pending, ticks, first } => {
                    if let Poll::Ready(resp) = pending.as_mut().poll(cx) {
                        this.arrived(resp);
                        continue;
                    }
                    if std::mem::take(first) || ticks.poll_tick(cx).is_ready() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(COMMENT)))));
                    }
                    return Poll::Pending;
                }
                State::Streaming(body) => {
                    let polled = Pin::new(body).poll_frame(cx);
                    if matches!(polled, Poll::Ready(None)) {
                        this.state = State::Done;
                    }
                    return polled;
                }
                State::Reading { body, buf, error } => match Pin::new(body).poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(d) = frame.into_data() {
                            let room = MAX_ERROR_BODY.saturating_sub(buf.len());
                            buf.extend_from_slice(&d[..d.len().min(room)]);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        this.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Ready(None) => {
                        let ev = last_event(buf, *error);
                        this.state = State::Done;
                        return Poll::Ready(Some(Ok(Frame::data(ev))));
                    }
                },
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_goes_as_it_is_and_other_bodies_are_wrapped() {
        let err = br#"{"error": {"message": "queued too long", "type": "rate_limit_error", "param": null, "code": "queue_timeout"}}"#;
        let ev = last_event(err, true);
        assert_eq!(&ev[..], [b"data: ".as_slice(), err, b"\n\ndata: [DONE]\n\n"].concat().as_slice());
        let ev = String::from_utf8(last_event(b"Bad Gateway\n", true).to_vec()).expect("utf-8");
        let data = ev.strip_prefix("data: ").and_then(|r| r.split_once("\n\n")).map(|(d, _)| d).expect("an event");
        let v: serde_json::Value = serde_json::from_str(data).expect("the wrapped error is JSON");
        assert_eq!(v["error"]["message"], "Bad Gateway");
        assert_eq!(v["error"]["code"], "upstream_error");
        // A JSON answer with newlines becomes one data line.
        let ev = last_event(b"{\"id\": 1,\n \"choices\": []}\n", false);
        assert_eq!(&ev[..], b"data: {\"id\": 1, \"choices\": []}\n\ndata: [DONE]\n\n");
    }
}
