//! A scripted mock vLLM replica: its scripts, its state, and the SSE chunks
//! vLLM sends.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::*;

/// One step of a scripted response body.
#[derive(Clone, Debug)]
pub enum Step {
    Send(Bytes),
    Wait(Duration),
    /// Wait until the test opens the gate (no timing involved).
    Until(Gate),
    /// Cut the connection (the body errors mid-stream).
    Abort,
}

/// A gate a scripted response waits at until the test opens it; once open it
/// stays open. How a test holds a replica slot for exactly as long as it needs.
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<(AtomicBool, tokio::sync::Notify)>);

impl Gate {
    pub fn open(&self) {
        self.0 .0.store(true, Ordering::SeqCst);
        self.0 .1.notify_waiters();
    }

    pub fn is_open(&self) -> bool {
        self.0 .0.load(Ordering::SeqCst)
    }

    pub async fn passed(&self) {
        loop {
            let notified = self.0 .1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}

/// A scripted response.
#[derive(Clone, Debug)]
pub struct Script {
    pub status: u16,
    pub content_type: &'static str,
    /// Delay before the response headers.
    pub header_delay: Duration,
    pub steps: Vec<Step>,
}

pub type ScriptFn = Arc<dyn Fn(&serde_json::Value) -> Script + Send + Sync>;

impl Script {
    /// A 200 `text/event-stream` answer made of `steps`.
    pub fn sse(steps: Vec<Step>) -> Script {
        Script { status: 200, content_type: "text/event-stream", header_delay: Duration::ZERO, steps }
    }

    /// An `application/json` answer with `status` made of `steps`.
    pub fn json_steps(status: u16, steps: Vec<Step>) -> Script {
        Script { status, content_type: "application/json", header_delay: Duration::ZERO, steps }
    }

    /// An `application/json` answer with `status` and `body` (none when empty).
    pub fn json(status: u16, body: &str) -> Script {
        let steps = if body.is_empty() { Vec::new() } else { vec![Step::Send(Bytes::from(body.to_string()))] };
        Self::json_steps(status, steps)
    }

    /// This answer to every request.
    pub fn always(self) -> ScriptFn {
        Arc::new(move |_| self.clone())
    }
}

pub struct MockState {
    pub calls: AtomicUsize,
    pub cancelled: AtomicUsize,
    pub completed: AtomicUsize,
    pub healthy: AtomicBool,
    /// How long `/health` takes to answer (a replica slow under load), and
    /// how many health checks came.
    pub health_delay: Mutex<Duration>,
    pub health_checks: AtomicUsize,
    pub script: Mutex<ScriptFn>,
    pub bodies: Mutex<Vec<serde_json::Value>>,
    /// Every POST's body as received (a multipart form is no JSON).
    pub raw_bodies: Mutex<Vec<Bytes>>,
    /// Request headers of every POST, in order.
    pub headers: Mutex<Vec<http::HeaderMap>>,
    /// The path of every POST, in order.
    pub paths: Mutex<Vec<String>>,
    pub model: String,
    /// Connections that carried at least one POST (health checks and model
    /// discovery use connections of their own).
    pub post_connections: AtomicUsize,
    /// Fired by [`Mock::close_idle_connections`].
    close_idle: tokio::sync::Notify,
    /// Connections that carried a POST, closed by the mock's side.
    pub closed_post_connections: AtomicUsize,
    /// The gate a held slot's stream waits at (see [`Mock::hold_slot`]).
    hold: Mutex<Gate>,
    /// The key the replica was started with (`vllm serve --api-key`).
    pub api_key: Option<String>,
    /// Every request with a key configured: its method and path, and
    /// whether it carried the right key.
    pub keyed: Mutex<Vec<(String, bool)>>,
    /// TLS handshakes, and how many of them resumed a session.
    pub tls_handshakes: AtomicUsize,
    pub tls_resumed: AtomicUsize,
    /// What `/metrics` says the replica runs (`vllm:num_requests_running`); not said when `None`.
    pub running: Mutex<Option<u64>>,
    /// What `/metrics` says waits in the replica (`vllm:num_requests_waiting`).
    pub waiting: AtomicUsize,
    /// `/metrics` requests served.
    pub scrapes: AtomicUsize,
}

/// How a mock replica is started; see [`Mock::start_with`].
#[derive(Clone, Default)]
pub struct MockOptions {
    /// The model it serves (`m1` when none).
    pub model: Option<String>,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Require `Authorization: Bearer <key>` as vLLM does with `--api-key`:
    /// on `/v1/*` (its `/health` and `/metrics` are open), answering 401
    /// without it.
    pub api_key: Option<String>,
}

pub struct Mock {
    pub addr: SocketAddr,
    /// Serves HTTPS.
    https: bool,
    pub state: Arc<MockState>,
    tasks: Arc<Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Mock {
    pub async fn start(script: ScriptFn) -> Mock {
        Self::start_with_model("m1", script).await
    }

    pub async fn start_with_model(model: &str, script: ScriptFn) -> Mock {
        Self::start_with(script, MockOptions { model: Some(model.to_string()), ..MockOptions::default() }).await
    }

    pub async fn start_with(script: ScriptFn, opts: MockOptions) -> Mock {
        let model = opts.model.as_deref().unwrap_or("m1");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(MockState {
            calls: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            health_delay: Mutex::new(Duration::ZERO),
            health_checks: AtomicUsize::new(0),
            script: Mutex::new(script),
            bodies: Mutex::new(Vec::new()),
            raw_bodies: Mutex::new(Vec::new()),
            headers: Mutex::new(Vec::new()),
            paths: Mutex::new(Vec::new()),
            model: model.to_string(),
            post_connections: AtomicUsize::new(0),
            close_idle: tokio::sync::Notify::new(),
            closed_post_connections: AtomicUsize::new(0),
            hold: Mutex::new(Gate::default()),
            api_key: opts.api_key.clone(),
            keyed: Mutex::new(Vec::new()),
            tls_handshakes: AtomicUsize::new(0),
            tls_resumed: AtomicUsize::new(0),
            running: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            scrapes: AtomicUsize::new(0),
        });
        let https = opts.tls.is_some();
        let acceptor = opts.tls.map(tokio_rustls::TlsAcceptor::from);
        let tasks = Arc::new(Mutex::new(JoinSet::new()));
        let (st, ts) = (state.clone(), tasks.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let acceptor = acceptor.clone();
                ts.lock().expect("lock").spawn(async move {
                    match acceptor {
                        None => serve_mock_connection(stream, st).await,
                        Some(a) => {
                            // A failed handshake (an untrusted client) ends the connection.
                            let Ok(tls) = a.accept(stream).await else { return };
                            st.tls_handshakes.fetch_add(1, Ordering::SeqCst);
                            if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                                st.tls_resumed.fetch_add(1, Ordering::SeqCst);
                            }
                            serve_mock_connection(tls, st).await
                        }
                    }
                });
            }
        });
        Mock { addr, state, tasks, accept, https }
    }

    pub fn url(&self) -> String {
        format!("{}://{}", if self.https { "https" } else { "http" }, self.addr)
    }

    pub fn set_script(&self, f: ScriptFn) {
        *self.state.script.lock().expect("lock") = f;
    }

    pub fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    /// Close every idle connection from the replica's side, as a server
    /// with a short keep-alive timeout does (vLLM's closes after 5 s).
    pub fn close_idle_connections(&self) {
        self.state.close_idle.notify_waiters();
    }

    /// Hold a replica slot through the gateway at `addr`: a streamed chat
    /// completion whose replica sends its role chunk and then waits, holding
    /// the slot, until [`HeldSlot::release`] (or until the holder is dropped,
    /// which hangs up). Returns once the gateway has admitted it and the
    /// replica answered, whatever other scripts the mock has.
    pub async fn hold_slot(&self, to: impl To) -> HeldSlot {
        self.hold_slot_as(to, &[]).await
    }

    /// [`Mock::hold_slot`] with request headers (e.g. `x-slo-class`).
    pub async fn hold_slot_as(&self, to: impl To, headers: &[(&str, &str)]) -> HeldSlot {
        let gate = Gate::default();
        *self.state.hold.lock().expect("lock") = gate.clone();
        let body = format!(
            r#"{{"model":"{}","messages":[{{"role":"user","content":"hi"}}],"stream":true,"user":"{HOLD_SLOT}"}}"#,
            self.state.model
        );
        let resp = client().request(post_req(to, "/v1/chat/completions", &body, headers)).await.expect("holder");
        assert_eq!(resp.status(), 200, "the holder got a slot");
        HeldSlot { body: Some(resp.into_body()), gate }
    }

    /// Stop accepting and cut every open connection: connects are refused.
    pub fn kill(&self) {
        self.accept.abort();
        self.tasks.lock().expect("lock").abort_all();
    }
}

/// Serve one connection of a mock replica (plain or TLS).
async fn serve_mock_connection<IO>(stream: IO, st: Arc<MockState>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let posted = Arc::new(AtomicBool::new(false));
    let (st2, posted2) = (st.clone(), posted.clone());
    let svc = hyper::service::service_fn(move |req| {
        let (st, posted) = (st2.clone(), posted2.clone());
        async move {
            if req.method() == http::Method::POST && !posted.swap(true, Ordering::SeqCst) {
                st.post_connections.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, Infallible>(mock_handle(req, st).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    let mut conn = std::pin::pin!(conn);
    let close = st.close_idle.notified();
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = close => {}
    }
    // Like a keep-alive timeout: an idle connection closes at
    // once, without a `Connection: close` header.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
    if posted.load(Ordering::SeqCst) {
        st.closed_post_connections.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `user` of a request that [`Mock::hold_slot`] sends.
const HOLD_SLOT: &str = "slogate-test-hold-slot";

/// A stream holding a replica slot; see [`Mock::hold_slot`].
pub struct HeldSlot {
    body: Option<Incoming>,
    gate: Gate,
}

impl HeldSlot {
    /// Let the replica finish the stream; its whole body, as the client got it.
    pub async fn release(mut self) -> String {
        self.gate.open();
        let body = self.body.take().expect("body");
        let bytes = body.collect().await.expect("held stream completes").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Hang up without reading further (a client that went away).
    pub fn hang_up(mut self) {
        self.body.take();
    }
}

struct ChannelBody(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

type MockBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn mock_handle(req: Request<Incoming>, st: Arc<MockState>) -> Response<MockBody> {
    let path = req.uri().path().to_string();
    if let Some(key) = &st.api_key {
        let right = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {key}"));
        st.keyed.lock().expect("lock").push((format!("{} {path}", req.method()), right));
        if !right && path.starts_with("/v1/") {
            return simple(401, "application/json", r#"{"error":"Unauthorized"}"#);
        }
    }
    // A stored response's own routes (vLLM's) go to the script, as
    // `{"__method": ..., "__path": ...}`.
    let stored = path.starts_with("/v1/responses/");
    let method = req.method().to_string();
    if req.method() == http::Method::GET && !stored {
        return match path.as_str() {
            "/health" => {
                st.health_checks.fetch_add(1, Ordering::SeqCst);
                let delay = *st.health_delay.lock().expect("lock");
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let code = if st.healthy.load(Ordering::SeqCst) { 200 } else { 503 };
                simple(code, "application/json", "{}")
            }
            "/v1/models" => simple(
                200,
                "application/json",
                &format!(r#"{{"object":"list","data":[{{"id":"{}","object":"model","owned_by":"vllm","max_model_len":4096}}]}}"#, st.model),
            ),
            "/metrics" => {
                st.scrapes.fetch_add(1, Ordering::SeqCst);
                let waiting = st.waiting.load(Ordering::SeqCst);
                let mut text = format!("vllm:num_requests_waiting{{model_name=\"m1\"}} {waiting}.0\n");
                if let Some(n) = *st.running.lock().expect("lock") {
                    text.push_str(&format!("vllm:num_requests_running{{model_name=\"m1\"}} {n}.0\n"));
                }
                simple(200, "text/plain", &text)
            }
            _ => simple(404, "application/json", "{}"),
        };
    }
    st.calls.fetch_add(1, Ordering::SeqCst);
    st.headers.lock().expect("lock").push(req.headers().clone());
    st.paths.lock().expect("lock").push(path.clone());
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    st.raw_bodies.lock().expect("lock").push(body.clone());
    let json: serde_json::Value = if stored {
        serde_json::json!({"__method": method, "__path": path})
    } else {
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)
    };
    let script = if json.get("user").and_then(|u| u.as_str()) == Some(HOLD_SLOT) {
        let gate = st.hold.lock().expect("lock").clone();
        let mut s = vllm_stream(&json, 1, Duration::ZERO, "stop");
        s.steps.insert(1, Step::Until(gate));
        s
    } else {
        let f = st.script.lock().expect("lock").clone();
        f(&json)
    };
    st.bodies.lock().expect("lock").push(json);
    if !script.header_delay.is_zero() {
        tokio::time::sleep(script.header_delay).await;
    }
    // A whole JSON answer goes out as vLLM sends it: one body with
    // Content-Length (uvicorn does not chunk a response it has whole).
    if script.content_type == "application/json" && script.steps.iter().all(|s| matches!(s, Step::Send(_))) {
        let mut whole = Vec::new();
        for step in &script.steps {
            if let Step::Send(b) = step {
                whole.extend_from_slice(b);
            }
        }
        st.completed.fetch_add(1, Ordering::SeqCst);
        let mut resp = simple(script.status, script.content_type, "");
        *resp.body_mut() = Full::new(Bytes::from(whole)).map_err(|n| match n {}).boxed();
        return resp;
    }
    let (tx, rx) = mpsc::channel(4);
    let st2 = st.clone();
    tokio::spawn(async move {
        for step in script.steps {
            match step {
                Step::Wait(d) => {
                    // Like uvicorn, notice a client that went away while idle.
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = tx.closed() => {
                            st2.cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                Step::Until(gate) => {
                    tokio::select! {
                        _ = gate.passed() => {}
                        _ = tx.closed() => {
                            st2.cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                Step::Send(b) => {
                    if tx.send(Ok(b)).await.is_err() {
                        st2.cancelled.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
                Step::Abort => {
                    let _ = tx.send(Err(std::io::Error::other("scripted abort"))).await;
                    return;
                }
            }
        }
        st2.completed.fetch_add(1, Ordering::SeqCst);
    });
    let mut resp = Response::new(ChannelBody(rx).boxed());
    *resp.status_mut() = StatusCode::from_u16(script.status).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(script.content_type));
    resp
}

fn simple(code: u16, ct: &'static str, body: &str) -> Response<MockBody> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).map_err(|n| match n {}).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
    r
}

// ---- vLLM-shaped stream builders ----

pub fn event(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

pub fn role_chunk() -> Bytes {
    event(
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    )
}

pub fn content_chunk(text: &str) -> Bytes {
    event(&format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":null}}]}}"#
    ))
}

pub fn finish_chunk(reason: &str) -> Bytes {
    event(&format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{{"index":0,"delta":{{"content":""}},"logprobs":null,"finish_reason":"{reason}"}}]}}"#
    ))
}

pub fn usage_chunk(prompt: u64, completion: u64) -> Bytes {
    event(&format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[],"usage":{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion}}}}}"#,
        prompt + completion
    ))
}

pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

pub fn wants_usage(req: &serde_json::Value) -> bool {
    req.pointer("/stream_options/include_usage").and_then(|v| v.as_bool()) == Some(true)
}

/// A vLLM-like stream: role chunk, `n` tokens `gap` apart, finish, usage if asked, [DONE].
pub fn vllm_stream(req: &serde_json::Value, n: usize, gap: Duration, finish: &str) -> Script {
    let mut steps = vec![Step::Send(role_chunk())];
    for i in 0..n {
        if !gap.is_zero() {
            steps.push(Step::Wait(gap));
        }
        steps.push(Step::Send(content_chunk(&format!("t{i} "))));
    }
    steps.push(Step::Send(finish_chunk(finish)));
    if wants_usage(req) {
        steps.push(Step::Send(usage_chunk(7, n as u64)));
    }
    steps.push(Step::Send(done()));
    Script { status: 200, content_type: "text/event-stream; charset=utf-8", header_delay: Duration::ZERO, steps }
}

pub fn json_answer(text: &str, finish: &str, prompt: u64, completion: u64) -> Script {
    let body = format!(
        r#"{{"id":"cmpl-1","object":"chat.completion","created":1,"model":"m1","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"{finish}"}}],"usage":{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion}}}}}"#,
        prompt + completion
    );
    Script { status: 200, content_type: "application/json", header_delay: Duration::ZERO, steps: vec![Step::Send(Bytes::from(body))] }
}

pub fn script(f: impl Fn(&serde_json::Value) -> Script + Send + Sync + 'static) -> ScriptFn {
    Arc::new(f)
}

/// A stream script for streaming requests, a JSON answer otherwise.
pub fn standard(n: usize, gap: Duration) -> ScriptFn {
    script(move |req| {
        if req.get("stream").and_then(|v| v.as_bool()) == Some(true) {
            vllm_stream(req, n, gap, "stop")
        } else {
            json_answer("hello", "stop", 7, 3)
        }
    })
}

/// One typed SSE event as vLLM's Responses API sends it: an `event:` line
/// naming its type, and the same `type` in its data.
pub fn typed_event(kind: &str, fields: &str) -> Bytes {
    let sep = if fields.is_empty() { "" } else { "," };
    Bytes::from(format!("event: {kind}\ndata: {{\"type\":\"{kind}\"{sep}{fields}}}\n\n"))
}

/// How a scripted Responses stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponsesEnd {
    /// `response.completed` with usage (12 input tokens, one output token a word).
    Completed,
    /// `response.incomplete`: the output token limit cut it.
    Incomplete,
    /// Nothing after the last delta: the stream is cut.
    Cut,
    /// `response.failed`.
    Failed,
}

/// A Responses API answer as vLLM streams it (`stream: true`): created, in
/// progress, the message item and its part, one `response.output_text.delta`
/// per word with `gap` between them, the done events, then `end`. No `[DONE]`.
pub fn responses_stream(words: &[&str], gap: Duration, end: ResponsesEnd) -> Script {
    let text: String = words.concat();
    let usage = format!(r#""usage":{{"input_tokens":12,"output_tokens":{},"total_tokens":{}}}"#, words.len(), 12 + words.len());
    let resp =
        |status: &str, extra: &str| format!(r#""response":{{"id":"resp_1","object":"response","status":"{status}","model":"m1"{extra}}}"#);
    let mut steps = vec![
        Step::Send(typed_event("response.created", &format!(r#""sequence_number":0,{}"#, resp("in_progress", "")))),
        Step::Send(typed_event("response.in_progress", &format!(r#""sequence_number":1,{}"#, resp("in_progress", "")))),
        Step::Send(typed_event(
            "response.output_item.added",
            r#""output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}"#,
        )),
        Step::Send(typed_event(
            "response.content_part.added",
            r#""item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}"#,
        )),
    ];
    for (i, w) in words.iter().enumerate() {
        if i > 0 && !gap.is_zero() {
            steps.push(Step::Wait(gap));
        }
        let delta = serde_json::to_string(w).expect("a word");
        steps.push(Step::Send(typed_event(
            "response.output_text.delta",
            &format!(r#""item_id":"msg_1","output_index":0,"content_index":0,"delta":{delta},"logprobs":[]"#),
        )));
    }
    let text_json = serde_json::to_string(&text).expect("text");
    let output = format!(
        r#","output":[{{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{{"type":"output_text","text":{text_json},"annotations":[]}}]}}],{usage}"#
    );
    match end {
        ResponsesEnd::Cut => return Script::sse(steps),
        ResponsesEnd::Completed => {
            steps.push(Step::Send(typed_event(
                "response.output_text.done",
                &format!(r#""item_id":"msg_1","output_index":0,"content_index":0,"text":{text_json},"logprobs":[]"#),
            )));
            steps.push(Step::Send(typed_event("response.completed", &resp("completed", &output))));
        }
        ResponsesEnd::Incomplete => {
            let extra = format!(r#","incomplete_details":{{"reason":"max_output_tokens"}}{output}"#);
            steps.push(Step::Send(typed_event("response.incomplete", &resp("incomplete", &extra))));
        }
        ResponsesEnd::Failed => {
            steps.push(Step::Send(typed_event(
                "response.failed",
                &resp("failed", r#","error":{"code":"server_error","message":"the engine failed"}"#),
            )));
        }
    }
    Script::sse(steps)
}

/// A whole (non-streaming) Responses API answer, as vLLM sends it.
pub fn responses_json(text: &str, status: &str) -> Script {
    let text_json = serde_json::to_string(text).expect("text");
    Script::json(
        200,
        &format!(
            r#"{{"id":"resp_1","object":"response","created_at":1700000000,"model":"m1","status":"{status}","output":[{{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{{"type":"output_text","text":{text_json},"annotations":[]}}]}}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{{"input_tokens":12,"output_tokens":3,"total_tokens":15,"input_tokens_details":{{"cached_tokens":0}},"output_tokens_details":{{"reasoning_tokens":0}}}}}}"#
        ),
    )
}

/// A transcription stream as vLLM sends it (`stream=true` in the form):
/// `transcription.chunk` objects with a content delta per word, then the
/// finish, the usage when asked, and `[DONE]`.
pub fn transcription_stream(words: &[&str]) -> Script {
    let chunk = |delta: &str, finish: &str| {
        Bytes::from(
            format!(
                r#"data: {{"id":"trsc-1","object":"transcription.chunk","created":1700000000,"model":"whisper","choices":[{{"delta":{{"content":{delta}}},"finish_reason":{finish},"stop_reason":null}}]}}"#
            ) + "\n\n",
        )
    };
    let mut steps: Vec<Step> = words.iter().map(|w| Step::Send(chunk(&serde_json::to_string(w).expect("word"), "null"))).collect();
    steps.push(Step::Send(chunk(r#""""#, r#""stop""#)));
    steps.push(Step::Send(done()));
    Script::sse(steps)
}

/// A multipart form as the OpenAI SDK sends a transcription (`model`, maybe
/// `stream`, then the file), with its content type.
pub fn transcription_form(model: Option<&str>, stream: bool, audio: &[u8]) -> (String, Vec<u8>) {
    let boundary = "slogate-test-boundary-7MA4YWxkTrZu0gW";
    let mut b = Vec::new();
    let mut field = |name: &str, value: &str| {
        b.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes())
    };
    if let Some(m) = model {
        field("model", m);
    }
    if stream {
        field("stream", "true");
    }
    b.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"speech.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
        )
        .as_bytes(),
    );
    b.extend_from_slice(audio);
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), b)
}

/// Read one HTTP/1.1 request (its head, then `content-length` bytes of
/// body) from a raw replica's connection, keeping what follows in `buf`:
/// the head, lowercased, or `None` once the connection ends.
pub async fn read_raw_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return Some(head);
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
