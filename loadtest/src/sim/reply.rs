//! How the simulated replica writes answers: JSON, typed events, vLLM's
//! error body, and the engine's next event for a streamed answer.

use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::engine::Event;

pub(crate) type SimBody = BoxBody<Bytes, std::io::Error>;

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn full(status: StatusCode, ct: &'static str, body: Bytes) -> Response<SimBody> {
    let mut r = Response::new(Full::new(body).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    r
}

pub(crate) fn json_resp(status: StatusCode, v: &Value) -> Response<SimBody> {
    full(status, "application/json", Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

/// A typed event (`event: KIND`, then its data), as the Responses API and
/// Anthropic's Messages stream them.
pub(crate) fn typed_event(buf: &mut BytesMut, kind: &str, v: &Value) {
    buf.extend_from_slice(format!("event: {kind}\ndata: ").as_bytes());
    buf.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
    buf.extend_from_slice(b"\n\n");
}

/// The engine's next event for a streamed answer: `Err` holds what the
/// body returns instead (pending; or its end with an error, `done` set,
/// when the engine dropped the request or cut it).
pub(crate) type Polled = Poll<Option<Result<Frame<Bytes>, std::io::Error>>>;

pub(crate) fn engine_event(rx: &mut mpsc::UnboundedReceiver<Event>, done: &mut bool, cx: &mut Context<'_>) -> Result<Event, Polled> {
    match rx.poll_recv(cx) {
        Poll::Pending => Err(Poll::Pending),
        Poll::Ready(None) => {
            *done = true;
            Err(Poll::Ready(Some(Err(std::io::Error::other("engine dropped the request")))))
        }
        Poll::Ready(Some(Event::Cut)) => {
            *done = true;
            Err(Poll::Ready(Some(Err(std::io::Error::other("simulated cut")))))
        }
        Poll::Ready(Some(ev)) => Ok(ev),
    }
}

/// vLLM's error body.
pub(crate) fn error(status: StatusCode, message: &str, ty: &str) -> Response<SimBody> {
    json_resp(status, &json!({"object": "error", "message": message, "type": ty, "param": null, "code": status.as_u16()}))
}
