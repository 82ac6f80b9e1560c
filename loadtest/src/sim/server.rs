//! The simulator's HTTP side: vLLM's OpenAI API shapes over the engine.
//!
//! Streams are what vLLM sends: the role-only chunk with empty content comes
//! with the first token, each token is one `chat.completion.chunk` event, the
//! last token carries `finish_reason`, the usage event (`choices: []`) comes
//! only with `stream_options.include_usage` (and usage rides on every chunk
//! with `continuous_usage_stats`), then `data: [DONE]`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::config::{FaultConfig, SimConfig};
pub(crate) use super::ctx::Ctx;
use super::engine::{Engine, Event, Faults, Rejected, SeqRequest, StreamFault};
use super::metrics::SimMetrics;
pub use super::prompt::estimate_tokens;
use super::prompt::prompt_blocks;
pub(crate) use super::prompt::WORDS;
pub(crate) use super::reply::{engine_event, error, full, json_resp, now_secs, SimBody};
use crate::unix_nanos;

/// A running simulated replica.
pub struct SimServer {
    pub addr: SocketAddr,
    https: bool,
    pub engine: Engine,
    pub metrics: Arc<SimMetrics>,
    exit: watch::Sender<bool>,
    tasks: Arc<Mutex<JoinSet<()>>>,
    /// Where it publishes KV events, if it does.
    pub kv_events: Option<super::kv_events::Bound>,
}

impl SimServer {
    /// Bind `addr` (use port 0 for any) and serve.
    pub async fn start(cfg: SimConfig, addr: SocketAddr) -> std::io::Result<SimServer> {
        Self::start_with_tls(cfg, addr, None).await
    }

    /// [`SimServer::start`], serving HTTPS when `tls` is given (a replica
    /// behind TLS, for benchmarks of what TLS costs the gateway).
    pub async fn start_with_tls(cfg: SimConfig, addr: SocketAddr, tls: Option<tokio_rustls::TlsAcceptor>) -> std::io::Result<SimServer> {
        let https = tls.is_some();
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let cfg = Arc::new(cfg);
        let metrics = Arc::new(SimMetrics::new(&cfg.model, cfg.kv_blocks, cfg.block_size));
        let faults = Arc::new(Faults::new(cfg.faults.clone()));
        let tokens = match &cfg.tokenizer {
            Some(t) => Some(Arc::new(prompt::PromptTokens::load(t, None).map_err(std::io::Error::other)?)),
            None => None,
        };
        let (kv, kv_events) = match cfg.kv_events_port {
            Some(_) if tokens.is_none() => return Err(std::io::Error::other("KV events need a tokenizer (their blocks carry token ids)")),
            Some(port) => {
                let at = |p: u16| format!("tcp://{}:{p}", addr.ip());
                let (c, bound) = super::kv_events::start(&at(port), cfg.kv_events_replay_port.map(at).as_deref(), cfg.block_size).await?;
                (Some(c), Some(bound))
            }
            None => (None, None),
        };
        let (engine, engine_task) = Engine::start_publishing(cfg.clone(), metrics.clone(), faults, kv);
        let (exit, mut exit_rx) = watch::channel(false);
        let ctx = Arc::new(Ctx {
            cfg,
            tokens,
            engine: engine.clone(),
            metrics: metrics.clone(),
            exit: exit.clone(),
            next_id: AtomicU64::new(1),
            responses: Default::default(),
        });
        let tasks = Arc::new(Mutex::new(JoinSet::new()));
        let conns = tasks.clone();
        let accept = async move {
            loop {
                let (stream, _) = tokio::select! {
                    r = listener.accept() => match r {
                        Ok(x) => x,
                        Err(_) => continue,
                    },
                    _ = exit_rx.wait_for(|e| *e) => break,
                };
                let _ = stream.set_nodelay(true);
                let ctx = ctx.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let ctx = ctx.clone();
                    async move { Ok::<_, Infallible>(handle(req, ctx).await) }
                });
                let tls = tls.clone();
                conns.lock().unwrap_or_else(|e| e.into_inner()).spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                            }
                        }
                    }
                });
            }
            // Exit fault or stop: the listener closes, connections are cut, the engine stops.
            engine_task.abort();
            conns.lock().unwrap_or_else(|e| e.into_inner()).abort_all();
        };
        tasks.lock().unwrap_or_else(|e| e.into_inner()).spawn(accept);
        Ok(SimServer { addr, https, engine, metrics, exit, tasks, kv_events })
    }

    pub fn url(&self) -> String {
        format!("{}://{}", if self.https { "https" } else { "http" }, self.addr)
    }

    /// Replace the fault settings at run time.
    pub fn set_faults(&self, f: FaultConfig) {
        apply_faults(&self.engine, &self.exit, f);
    }

    /// Turns true when the replica stops.
    pub fn exit_signal(&self) -> watch::Receiver<bool> {
        self.exit.subscribe()
    }

    /// Wait until the replica stops (the exit fault, or [`SimServer::stop`]).
    pub async fn stopped(&self) {
        let mut rx = self.exit.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Stop serving: close the listener and cut every connection.
    pub fn stop(&self) {
        let _ = self.exit.send(true);
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        let _ = self.exit.send(true);
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).abort_all();
    }
}

/// Install fault settings; the exit fault stops the replica.
fn apply_faults(engine: &Engine, exit: &watch::Sender<bool>, f: FaultConfig) {
    let stop = f.exit;
    engine.faults.set(f);
    if stop {
        let _ = exit.send(true);
    }
}

async fn handle(req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<SimBody> {
    let path = req.uri().path().to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health") => {
            let delay = ctx.engine.faults.get().health_delay_secs;
            if delay > 0.0 {
                tokio::time::sleep(std::time::Duration::from_secs_f64(delay)).await;
            }
            if ctx.engine.faults.get().health_fail {
                error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy (simulated)", "ServiceUnavailableError")
            } else {
                full(StatusCode::OK, "application/json", Bytes::new())
            }
        }
        (Method::GET, "/v1/models") => {
            let m = &ctx.cfg.model;
            let body = json!({"object": "list", "data": [{"id": m, "object": "model", "created": now_secs(), "owned_by": "vllm", "root": m, "parent": null, "max_model_len": ctx.cfg.max_model_len}]});
            json_resp(StatusCode::OK, &body)
        }
        (Method::GET, "/metrics") => {
            full(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", Bytes::from(ctx.metrics.encode()))
        }
        (Method::GET, "/admin/faults") => json_resp(StatusCode::OK, &serde_json::to_value(ctx.engine.faults.get()).unwrap_or(Value::Null)),
        (Method::POST, "/admin/faults") => {
            let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            match serde_json::from_slice::<FaultConfig>(&body) {
                Ok(f) => {
                    let shown = serde_json::to_value(&f).unwrap_or(Value::Null);
                    apply_faults(&ctx.engine, &ctx.exit, f);
                    json_resp(StatusCode::OK, &shown)
                }
                Err(e) => error(StatusCode::BAD_REQUEST, &format!("invalid faults: {e}"), "BadRequestError"),
            }
        }
        (Method::POST, "/v1/chat/completions") => completion(req, ctx, true).await,
        (Method::POST, "/v1/completions") => completion(req, ctx, false).await,
        (Method::POST, "/v1/embeddings") => embeddings(req, ctx).await,
        (Method::POST, "/v1/responses") => super::responses::create(req, ctx).await,
        (Method::POST, "/v1/messages") => super::messages::create(req, ctx).await,
        (m, p) => super::responses::stored(&m, p, &ctx).unwrap_or_else(|| error(StatusCode::NOT_FOUND, "Not Found", "NotFoundError")),
    }
}

/// What a completion request asks for, as the engine reads it.
struct Asked<'a> {
    prompt_v: &'a Value,
    /// The prompt's token ids, where the model's tokenizer is given.
    ids: Option<Vec<u32>>,
    prompt_tokens: u32,
    max_tokens: u32,
    ignore_eos: bool,
    stream: bool,
    include_usage: bool,
    continuous: bool,
    priority: i64,
}

/// The request `v` read as vLLM reads it, or vLLM's answer refusing it
/// (another model, no prompt, a prompt over the context).
fn asked<'a>(v: &'a Value, ctx: &Ctx, chat: bool) -> Result<Asked<'a>, Box<Response<SimBody>>> {
    let model = v.get("model").and_then(|m| m.as_str()).unwrap_or("");
    if model != ctx.cfg.model {
        return Err(Box::new(error(StatusCode::NOT_FOUND, &format!("The model `{model}` does not exist."), "NotFoundError")));
    }
    let prompt_v = if chat { v.get("messages") } else { v.get("prompt") };
    let Some(prompt_v) = prompt_v else {
        let field = if chat { "messages" } else { "prompt" };
        return Err(Box::new(error(StatusCode::BAD_REQUEST, &format!("`{field}` is required"), "BadRequestError")));
    };
    // As vLLM counts them where the model's tokenizer is given.
    let ids = ctx.tokens.as_ref().and_then(|t| {
        let raw = serde_json::to_vec(prompt_v).ok()?;
        if chat {
            t.of_messages(&raw)
        } else {
            t.of_prompt(&raw)
        }
    });
    let prompt_tokens = ids.as_ref().map_or_else(|| estimate_tokens(prompt_v), |ids| (ids.len() as u32).max(1));
    if prompt_tokens >= ctx.cfg.max_model_len {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!(
                "This model's maximum context length is {} tokens. However, you requested {prompt_tokens} tokens in the messages.",
                ctx.cfg.max_model_len
            ),
            "BadRequestError",
        )));
    }
    let asked = v.get("max_completion_tokens").or_else(|| v.get("max_tokens")).and_then(|m| m.as_u64()).map(|m| m as u32);
    let max_tokens = asked.unwrap_or(ctx.cfg.default_max_tokens).min(ctx.cfg.max_model_len - prompt_tokens).max(1);
    let ignore_eos = v.get("ignore_eos").and_then(|b| b.as_bool()).unwrap_or(false);
    let stream = v.get("stream").and_then(|b| b.as_bool()).unwrap_or(false);
    let include_usage = v.pointer("/stream_options/include_usage").and_then(|b| b.as_bool()).unwrap_or(false);
    let continuous = v.pointer("/stream_options/continuous_usage_stats").and_then(|b| b.as_bool()).unwrap_or(false);
    let priority = v.get("priority").and_then(|p| p.as_i64()).unwrap_or(0);
    Ok(Asked { prompt_v, ids, prompt_tokens, max_tokens, ignore_eos, stream, include_usage, continuous, priority })
}

/// The faults the engine is set to draw for a request of `max_tokens`: where
/// it would stop of itself (unless `ignore_eos`), an HTTP error (`true`:
/// 500, `false`: 503), or a stream that errs or is cut at a token.
fn draw_faults(ctx: &Ctx, max_tokens: u32, ignore_eos: bool) -> (Option<u32>, Option<StreamFault>, Option<bool>) {
    let faults = ctx.engine.faults.get();
    {
        let mut rng = rand::rng();
        let natural = match (ignore_eos, ctx.cfg.natural_stop) {
            (false, Some((lo, hi))) if hi >= lo && lo > 0.0 => {
                Some(((max_tokens as f64) * rng.random_range(lo..=hi)).ceil().max(1.0) as u32)
            }
            _ => None,
        };
        let http_fault = (faults.error_rate > 0.0 && rng.random::<f64>() < faults.error_rate).then(|| rng.random::<bool>());
        let at = rng.random_range(1..=max_tokens.max(2) - 1);
        let fault = if faults.stream_error_rate > 0.0 && rng.random::<f64>() < faults.stream_error_rate {
            Some(StreamFault::ErrorAt(at))
        } else if faults.cut_rate > 0.0 && rng.random::<f64>() < faults.cut_rate {
            Some(StreamFault::CutAt(at))
        } else {
            None
        };
        (natural, fault, http_fault)
    }
}

async fn completion(req: Request<Incoming>, ctx: Arc<Ctx>, chat: bool) -> Response<SimBody> {
    let rx_ns = ctx.cfg.stamp_events.then(unix_nanos);
    let body = match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return error(StatusCode::BAD_REQUEST, "could not read body", "BadRequestError"),
    };
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid JSON: {e}"), "BadRequestError"),
    };
    let Asked { prompt_v, ids, prompt_tokens, max_tokens, ignore_eos, stream, include_usage, continuous, priority } =
        match asked(&v, &ctx, chat) {
            Ok(a) => a,
            Err(refused) => return *refused,
        };
    let (natural_len, fault, http_fault) = draw_faults(&ctx, max_tokens, ignore_eos);
    if let Some(is_500) = http_fault {
        return if is_500 {
            error(StatusCode::INTERNAL_SERVER_ERROR, "simulated internal error", "InternalServerError")
        } else {
            error(StatusCode::SERVICE_UNAVAILABLE, "simulated overload", "ServiceUnavailableError")
        };
    }
    let bs = ctx.cfg.block_size.max(1);
    let (block_hashes, token_ids) = match ids {
        Some(ids) => (crate::sim::cache::token_block_hashes(&ids, bs as usize, (prompt_tokens / bs) as usize), Arc::from(ids)),
        None => (prompt_blocks(prompt_v, prompt_tokens, bs), Arc::from(Vec::new())),
    };
    let cached = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seq = SeqRequest { prompt_tokens, max_tokens, natural_len, priority, fault, block_hashes, cached: cached.clone(), token_ids };
    let rx = match ctx.engine.submit(seq) {
        Ok(rx) => rx,
        Err(Rejected::QueueFull) => return error(StatusCode::SERVICE_UNAVAILABLE, "waiting queue is full", "ServiceUnavailableError"),
        Err(Rejected::TooLong(m)) => return error(StatusCode::BAD_REQUEST, &m, "BadRequestError"),
        Err(Rejected::Stopped) => return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped", "ServiceUnavailableError"),
    };
    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    let shape = Shape {
        id: if chat { format!("chatcmpl-{id:016x}") } else { format!("cmpl-{id:016x}") },
        chat,
        created: now_secs(),
        model: ctx.cfg.model.clone(),
        prompt_tokens,
        cached,
        rx_ns,
    };
    if stream {
        let body = StreamBody { rx, shape, include_usage, continuous, generated: 0, done: false };
        let mut r = Response::new(body.boxed());
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
        return r;
    }
    collect_answer(rx, shape).await
}

struct Shape {
    id: String,
    chat: bool,
    created: u64,
    model: String,
    prompt_tokens: u32,
    /// The prompt tokens found in the prefix cache (known once scheduled).
    cached: Arc<std::sync::atomic::AtomicU32>,
    /// With `stamp_events`: when the request arrived.
    rx_ns: Option<u64>,
}

impl Shape {
    fn usage(&self, completion: u32) -> Value {
        let cached = self.cached.load(Ordering::Relaxed);
        json!({"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + completion, "completion_tokens": completion,
               "prompt_tokens_details": {"cached_tokens": cached}})
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice]});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        if let Some(rx) = self.rx_ns {
            v["sim_rx_ns"] = rx.into();
            v["sim_t_ns"] = unix_nanos().into();
        }
        v
    }
}

fn sse(buf: &mut BytesMut, v: &Value) {
    buf.extend_from_slice(b"data: ");
    buf.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
    buf.extend_from_slice(b"\n\n");
}

struct StreamBody {
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    include_usage: bool,
    continuous: bool,
    generated: u32,
    done: bool,
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        let ev = match engine_event(&mut this.rx, &mut this.done, cx) {
            Ok(ev) => ev,
            Err(polled) => return polled,
        };
        let mut buf = BytesMut::new();
        match ev {
            Event::Token { index, finish } => {
                this.generated = index + 1;
                let usage = |s: &Self| s.continuous.then(|| s.shape.usage(s.generated));
                let word = WORDS[index as usize % WORDS.len()];
                let reason = finish.map(|f| Value::String(f.as_str().into())).unwrap_or(Value::Null);
                if this.shape.chat {
                    if index == 0 {
                        let role =
                            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                        sse(&mut buf, &this.shape.chunk(role, this.continuous.then(|| this.shape.usage(0))));
                    }
                    let mut choice = json!({"index": 0, "delta": {"content": word}, "logprobs": null, "finish_reason": reason});
                    if finish.is_some() {
                        choice["stop_reason"] = Value::Null;
                    }
                    sse(&mut buf, &this.shape.chunk(choice, usage(this)));
                } else {
                    let choice = json!({"index": 0, "text": word, "logprobs": null, "finish_reason": reason, "stop_reason": null});
                    sse(&mut buf, &this.shape.chunk(choice, usage(this)));
                }
                if finish.is_some() {
                    if this.include_usage {
                        let mut u = this.shape.chunk(Value::Null, Some(this.shape.usage(this.generated)));
                        u["choices"] = json!([]);
                        sse(&mut buf, &u);
                    }
                    buf.extend_from_slice(b"data: [DONE]\n\n");
                    this.done = true;
                }
            }
            Event::Error(msg) => {
                sse(
                    &mut buf,
                    &json!({"error": {"object": "error", "message": msg, "type": "InternalServerError", "param": null, "code": 500}}),
                );
                buf.extend_from_slice(b"data: [DONE]\n\n");
                this.done = true;
            }
            Event::Cut => {}
        }
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}

async fn collect_answer(mut rx: mpsc::UnboundedReceiver<Event>, shape: Shape) -> Response<SimBody> {
    let mut text = String::new();
    let mut generated = 0;
    let mut reason = "stop";
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { index, finish } => {
                text.push_str(WORDS[index as usize % WORDS.len()]);
                generated = index + 1;
                if let Some(f) = finish {
                    reason = f.as_str();
                    break;
                }
            }
            Event::Error(m) => return error(StatusCode::INTERNAL_SERVER_ERROR, &m, "InternalServerError"),
            Event::Cut => return error(StatusCode::INTERNAL_SERVER_ERROR, "simulated cut", "InternalServerError"),
        }
    }
    let choice = if shape.chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []}, "logprobs": null, "finish_reason": reason, "stop_reason": null})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason, "stop_reason": null})
    };
    let object = if shape.chat { "chat.completion" } else { "text_completion" };
    json_resp(
        StatusCode::OK,
        &json!({"id": shape.id, "object": object, "created": shape.created, "model": shape.model, "choices": [choice], "usage": shape.usage(generated)}),
    )
}

async fn embeddings(req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<SimBody> {
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid JSON", "BadRequestError");
    };
    if v.get("model").and_then(|m| m.as_str()) != Some(ctx.cfg.model.as_str()) {
        return error(StatusCode::NOT_FOUND, "The model does not exist.", "NotFoundError");
    }
    let inputs: Vec<Value> = match v.get("input") {
        Some(Value::Array(a)) => a.clone(),
        Some(x @ Value::String(_)) => vec![x.clone()],
        _ => return error(StatusCode::BAD_REQUEST, "`input` is required", "BadRequestError"),
    };
    let tokens: u32 = inputs.iter().map(estimate_tokens).sum();
    let dim = ctx.cfg.embedding_dim;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, _)| json!({"index": i, "object": "embedding", "embedding": (0..dim).map(|d| ((i + d) % 7) as f64 / 7.0).collect::<Vec<_>>()}))
        .collect();
    json_resp(
        StatusCode::OK,
        &json!({"id": "embd-1", "object": "list", "created": now_secs(), "model": ctx.cfg.model, "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}),
    )
}
