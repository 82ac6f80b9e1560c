//! The Responses API as vLLM serves it: `POST /v1/responses`, whole or
//! streamed (typed events), with vLLM's store. A stored response (`store`,
//! on by default) lives in this replica's memory only: a follow-up naming
//! it (`previous_response_id`) continues its conversation here, and on any
//! other replica is a 404, as on vLLM; so are its own routes (retrieve,
//! delete, cancel, input items). `background: true` answers at once and
//! generates on; retrieve shows how far it got.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::ctx::Ctx;
use super::engine::{Event, Finish, Rejected, SeqRequest};
use super::prompt::{estimate_tokens, WORDS};
use super::reply::{engine_event, error, json_resp, typed_event, SimBody};
use super::stored::Stored;

fn not_found(id: &str) -> http::Response<SimBody> {
    error(StatusCode::NOT_FOUND, &format!("Response with id '{id}' not found."), "invalid_request_error")
}

/// The response object as the API shows it.
fn object(id: &str, s: &Stored) -> Value {
    let output = if s.text.is_empty() {
        json!([])
    } else {
        json!([{"type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": s.status,
                "content": [{"type": "output_text", "text": s.text, "annotations": []}]}])
    };
    let mut v = json!({"id": id, "object": "response", "created_at": s.created, "model": s.model, "status": s.status, "output": output,
                       "usage": {"input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "total_tokens": s.input_tokens + s.output_tokens}});
    if s.status == "incomplete" {
        v["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    v
}

/// `POST /v1/responses`.
pub(crate) async fn create(req: http::Request<Incoming>, ctx: Arc<Ctx>) -> http::Response<SimBody> {
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return error(StatusCode::BAD_REQUEST, "invalid JSON", "BadRequestError") };
    let model = v.get("model").and_then(|m| m.as_str()).unwrap_or("");
    if model != ctx.cfg.model {
        return error(StatusCode::NOT_FOUND, &format!("The model `{model}` does not exist."), "NotFoundError");
    }
    let Some(input) = v.get("input") else { return error(StatusCode::BAD_REQUEST, "`input` is required", "BadRequestError") };
    let before = match v.get("previous_response_id").and_then(|p| p.as_str()) {
        Some(prev) => match ctx.responses.get(prev) {
            Some(s) => s.conversation_tokens,
            None => return not_found(prev),
        },
        None => 0,
    };
    let instructions = v.get("instructions").map_or(0, estimate_tokens);
    let prompt_tokens = (before + instructions + estimate_tokens(input)).max(1);
    if prompt_tokens >= ctx.cfg.max_model_len {
        return error(StatusCode::BAD_REQUEST, "the conversation is longer than the model's context", "BadRequestError");
    }
    let asked = v.get("max_output_tokens").and_then(|m| m.as_u64()).map(|m| m as u32);
    let max_tokens = asked.unwrap_or(ctx.cfg.default_max_tokens).min(ctx.cfg.max_model_len - prompt_tokens).max(1);
    let rx = match ctx.engine.submit(SeqRequest::new(prompt_tokens, max_tokens)) {
        Ok(rx) => rx,
        Err(Rejected::QueueFull) => return error(StatusCode::SERVICE_UNAVAILABLE, "waiting queue is full", "ServiceUnavailableError"),
        Err(Rejected::TooLong(m)) => return error(StatusCode::BAD_REQUEST, &m, "BadRequestError"),
        Err(Rejected::Stopped) => return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped", "ServiceUnavailableError"),
    };
    let id = format!("resp_{:016x}{:016x}", rand::random::<u64>(), ctx.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let stored = Stored {
        conversation_tokens: prompt_tokens,
        input_tokens: prompt_tokens,
        output_tokens: 0,
        text: String::new(),
        status: "in_progress",
        created: super::reply::now_secs(),
        model: ctx.cfg.model.clone(),
    };
    let store = v.get("store").and_then(|s| s.as_bool()) != Some(false);
    let keep = ctx.clone();
    if store {
        ctx.responses.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), stored.clone());
    }
    let progress = Progress { ctx: keep, id: id.clone(), stored, store };
    if v.get("background").and_then(|b| b.as_bool()) == Some(true) && store {
        let shown = object(&id, &progress.stored);
        tokio::spawn(progress.collect(rx));
        return json_resp(StatusCode::OK, &shown);
    }
    if v.get("stream").and_then(|s| s.as_bool()) == Some(true) {
        let body = Events { rx, progress, sent_created: false, done: false, seq: 0 };
        let mut r = http::Response::new(body.boxed());
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream; charset=utf-8"));
        return r;
    }
    match progress.collect(rx).await {
        Ok(shown) => json_resp(StatusCode::OK, &shown),
        Err(m) => error(StatusCode::INTERNAL_SERVER_ERROR, &m, "InternalServerError"),
    }
}

/// A response being made, and where it is kept.
struct Progress {
    ctx: Arc<Ctx>,
    id: String,
    stored: Stored,
    store: bool,
}

impl Progress {
    fn token(&mut self, index: u32, finish: Option<Finish>) -> &'static str {
        let word = WORDS[index as usize % WORDS.len()];
        self.stored.text.push_str(word);
        self.stored.output_tokens = index + 1;
        if let Some(f) = finish {
            self.stored.status = if f == Finish::Length { "incomplete" } else { "completed" };
            self.stored.conversation_tokens = self.stored.input_tokens + self.stored.output_tokens;
        }
        self.keep();
        word
    }

    fn keep(&self) {
        if !self.store {
            return;
        }
        let now = self.stored.clone();
        // A cancelled response stays cancelled.
        self.ctx.responses.update(&self.id, |s| {
            if s.status != "cancelled" {
                *s = now;
            }
        });
    }

    async fn collect(mut self, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Value, String> {
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Token { index, finish } => {
                    self.token(index, finish);
                    if finish.is_some() {
                        break;
                    }
                }
                Event::Error(m) => return Err(m),
                Event::Cut => return Err("simulated cut".into()),
            }
        }
        Ok(object(&self.id, &self.stored))
    }
}

/// A streamed response: `response.created`, a `response.output_text.delta`
/// per token, then `response.completed` (or `incomplete`) with its usage.
struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    progress: Progress,
    sent_created: bool,
    done: bool,
    seq: u64,
}

impl Events {
    fn event(&mut self, buf: &mut BytesMut, kind: &str, mut v: Value) {
        self.seq += 1;
        v["type"] = kind.into();
        v["sequence_number"] = self.seq.into();
        typed_event(buf, kind, &v);
    }
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
        if !this.sent_created {
            this.sent_created = true;
            let created = json!({"response": object(&this.progress.id, &this.progress.stored)});
            this.event(&mut buf, "response.created", created);
            return Poll::Ready(Some(Ok(Frame::data(buf.freeze()))));
        }
        let ev = match engine_event(&mut this.rx, &mut this.done, cx) {
            Ok(ev) => ev,
            Err(polled) => return polled,
        };
        match ev {
            Event::Token { index, finish } => {
                let word = this.progress.token(index, finish);
                let item = format!("msg_{}", this.progress.id);
                this.event(
                    &mut buf,
                    "response.output_text.delta",
                    json!({"item_id": item, "output_index": 0, "content_index": 0, "delta": word, "logprobs": []}),
                );
                if finish.is_some() {
                    let end = if this.progress.stored.status == "incomplete" { "response.incomplete" } else { "response.completed" };
                    let whole = json!({"response": object(&this.progress.id, &this.progress.stored)});
                    this.event(&mut buf, end, whole);
                    this.done = true;
                }
            }
            Event::Error(m) => {
                this.event(&mut buf, "error", json!({"code": "server_error", "message": m, "param": null}));
                this.done = true;
            }
            Event::Cut => {}
        }
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}

/// A stored response's own routes: `GET` and `DELETE /v1/responses/{id}`,
/// `POST .../cancel`, `GET .../input_items`; `None`: not one of them.
pub(crate) fn stored(method: &Method, path: &str, ctx: &Ctx) -> Option<http::Response<SimBody>> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, what) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(s) = ctx.responses.get(id) else { return Some(not_found(id)) };
    Some(match (method, what) {
        (&Method::GET, "") => json_resp(StatusCode::OK, &object(id, &s)),
        (&Method::DELETE, "") => {
            ctx.responses.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
            json_resp(StatusCode::OK, &json!({"id": id, "object": "response", "deleted": true}))
        }
        (&Method::POST, "cancel") => {
            ctx.responses.update(id, |s| {
                if s.status == "in_progress" {
                    s.status = "cancelled";
                }
            });
            json_resp(StatusCode::OK, &object(id, &ctx.responses.get(id).unwrap_or(s)))
        }
        (&Method::GET, "input_items") => json_resp(StatusCode::OK, &json!({"object": "list", "data": [], "has_more": false})),
        _ => return None,
    })
}
