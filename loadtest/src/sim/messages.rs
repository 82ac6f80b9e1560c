//! Anthropic's Messages API as vLLM serves it (`POST /v1/messages`):
//! the whole message, or its events streamed (`message_start` with the
//! prompt's usage, a `content_block_delta` per token, `message_delta` with
//! the stop reason and the output's usage, `message_stop`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::ctx::Ctx;
use super::engine::{Event, Finish, Rejected, SeqRequest};
use super::prompt::{estimate_tokens, WORDS};
use super::reply::{engine_event, json_resp, typed_event as event, SimBody};

/// Anthropic's error shape, as vLLM's `/v1/messages` answers.
fn error(status: StatusCode, ty: &str, message: &str) -> http::Response<SimBody> {
    json_resp(status, &json!({"type": "error", "error": {"type": ty, "message": message}}))
}

fn stop_reason(f: Finish) -> &'static str {
    if f == Finish::Length {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// `POST /v1/messages`.
pub(crate) async fn create(req: http::Request<Incoming>, ctx: Arc<Ctx>) -> http::Response<SimBody> {
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid JSON");
    };
    let model = v.get("model").and_then(|m| m.as_str()).unwrap_or("");
    if model != ctx.cfg.model {
        return error(StatusCode::NOT_FOUND, "not_found_error", &format!("model: {model}"));
    }
    let Some(messages) = v.get("messages") else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "messages: Field required");
    };
    let Some(asked) = v.get("max_tokens").and_then(|m| m.as_u64()) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "max_tokens: Field required");
    };
    let prompt_tokens = (estimate_tokens(messages) + v.get("system").map_or(0, estimate_tokens)).max(1);
    if prompt_tokens >= ctx.cfg.max_model_len {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "prompt is too long");
    }
    let max_tokens = (asked as u32).min(ctx.cfg.max_model_len - prompt_tokens).max(1);
    let rx = match ctx.engine.submit(SeqRequest::new(prompt_tokens, max_tokens)) {
        Ok(rx) => rx,
        Err(Rejected::QueueFull) => return error(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", "waiting queue is full"),
        Err(Rejected::TooLong(m)) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", &m),
        Err(Rejected::Stopped) => return error(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", "engine stopped"),
    };
    let id = format!("msg_{:016x}", ctx.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let shape = Shape { id, model: ctx.cfg.model.clone(), prompt_tokens };
    if v.get("stream").and_then(|s| s.as_bool()) == Some(true) {
        let body = Events { rx, shape, started: false, done: false };
        let mut r = http::Response::new(body.boxed());
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream; charset=utf-8"));
        return r;
    }
    let mut rx = rx;
    let (mut text, mut generated, mut reason) = (String::new(), 0, "end_turn");
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { index, finish } => {
                text.push_str(WORDS[index as usize % WORDS.len()]);
                generated = index + 1;
                if let Some(f) = finish {
                    reason = stop_reason(f);
                    break;
                }
            }
            Event::Error(m) => return error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", &m),
            Event::Cut => return error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "simulated cut"),
        }
    }
    json_resp(
        StatusCode::OK,
        &json!({"id": shape.id, "type": "message", "role": "assistant", "model": shape.model,
                "content": [{"type": "text", "text": text}], "stop_reason": reason, "stop_sequence": null,
                "usage": {"input_tokens": shape.prompt_tokens, "output_tokens": generated}}),
    )
}

struct Shape {
    id: String,
    model: String,
    prompt_tokens: u32,
}

struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    started: bool,
    done: bool,
}

impl Body for Events {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let mut buf = BytesMut::new();
        if !this.started {
            this.started = true;
            let s = &this.shape;
            event(
                &mut buf,
                "message_start",
                &json!({"type": "message_start", "message": {"id": s.id, "type": "message", "role": "assistant", "model": s.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": s.prompt_tokens, "output_tokens": 0}}}),
            );
            event(
                &mut buf,
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            return Poll::Ready(Some(Ok(Frame::data(buf.freeze()))));
        }
        let ev = match engine_event(&mut this.rx, &mut this.done, cx) {
            Ok(ev) => ev,
            Err(polled) => return polled,
        };
        match ev {
            Event::Token { index, finish } => {
                let word = WORDS[index as usize % WORDS.len()];
                event(
                    &mut buf,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
                );
                if let Some(f) = finish {
                    event(&mut buf, "content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
                    event(
                        &mut buf,
                        "message_delta",
                        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(f), "stop_sequence": null},
                        "usage": {"output_tokens": index + 1}}),
                    );
                    event(&mut buf, "message_stop", &json!({"type": "message_stop"}));
                    this.done = true;
                }
            }
            Event::Error(m) => {
                event(&mut buf, "error", &json!({"type": "error", "error": {"type": "api_error", "message": m}}));
                this.done = true;
            }
            Event::Cut => {}
        }
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}
