//! Test harness: a scripted mock vLLM replica and helpers to run the gateway
//! in-process on 127.0.0.1:0. No fixed ports; no sleeping for timing (the
//! mock's scripted delays are upstream behaviour, and waits are bounded
//! polls for a condition).
#![allow(dead_code)]

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
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use slogate::config::Config;
use slogate::Gateway;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

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
    pub script: Mutex<ScriptFn>,
    pub bodies: Mutex<Vec<serde_json::Value>>,
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
            script: Mutex::new(script),
            bodies: Mutex::new(Vec::new()),
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
    pub async fn hold_slot(&self, addr: SocketAddr) -> HeldSlot {
        self.hold_slot_as(addr, &[]).await
    }

    /// [`Mock::hold_slot`] with request headers (e.g. `x-slo-class`).
    pub async fn hold_slot_as(&self, addr: SocketAddr, headers: &[(&str, &str)]) -> HeldSlot {
        let gate = Gate::default();
        *self.state.hold.lock().expect("lock") = gate.clone();
        let body = format!(
            r#"{{"model":"{}","messages":[{{"role":"user","content":"hi"}}],"stream":true,"user":"{HOLD_SLOT}"}}"#,
            self.state.model
        );
        let resp = client().request(post_req(addr, "/v1/chat/completions", &body, headers)).await.expect("holder");
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
    if req.method() == http::Method::GET {
        return match path.as_str() {
            "/health" => {
                let code = if st.healthy.load(Ordering::SeqCst) { 200 } else { 503 };
                simple(code, "application/json", "{}")
            }
            "/v1/models" => simple(
                200,
                "application/json",
                &format!(r#"{{"object":"list","data":[{{"id":"{}","object":"model","owned_by":"vllm","max_model_len":4096}}]}}"#, st.model),
            ),
            "/metrics" => {
                let mut text = String::from("vllm:num_requests_waiting{model_name=\"m1\"} 0.0\n");
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
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
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

// ---- gateway helpers ----

/// A test gateway's config: both listeners on 127.0.0.1:0, one pool `p`
/// serving `m1` from the given replicas with fast health checks. Fields are
/// added by section, never by editing the YAML text.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    replicas: Vec<String>,
    server: Vec<String>,
    pool: Vec<String>,
    sections: Vec<String>,
}

pub fn gateway_config(replicas: &[String]) -> ConfigBuilder {
    ConfigBuilder { replicas: replicas.to_vec(), server: Vec::new(), pool: Vec::new(), sections: Vec::new() }
}

impl ConfigBuilder {
    /// A field of `server:`, e.g. `"busy_poll: true"`.
    pub fn server(mut self, field: &str) -> Self {
        self.server.push(field.to_string());
        self
    }

    /// A field of the pool, e.g. `"max_inflight_per_replica: 1"`.
    pub fn pool(mut self, field: &str) -> Self {
        self.pool.push(field.to_string());
        self
    }

    /// A top-level section, e.g. `"tiers:\n  interactive: { queue_capacity: 1 }"`.
    pub fn section(mut self, yaml: &str) -> Self {
        self.sections.push(yaml.trim_end().to_string());
        self
    }

    pub fn yaml(&self) -> String {
        let mut y = String::from("server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\n");
        if !self.server.iter().any(|f| f.starts_with("shutdown_grace:")) {
            y.push_str("  shutdown_grace: 10s\n");
        }
        for f in &self.server {
            y.push_str(&format!("  {f}\n"));
        }
        y.push_str("pools:\n  - name: p\n    models: [m1]\n    replicas:\n");
        for r in &self.replicas {
            y.push_str(&format!("      - {r}\n"));
        }
        if !self.pool.iter().any(|f| f.starts_with("health:")) {
            y.push_str("    health: { interval: 100ms, timeout: 1s, unhealthy_after: 2, healthy_after: 2 }\n");
        }
        for f in &self.pool {
            y.push_str(&format!("    {f}\n"));
        }
        for sec in &self.sections {
            y.push_str(sec);
            y.push('\n');
        }
        y
    }

    pub async fn start(&self) -> Gateway {
        start_gateway(&self.yaml()).await
    }
}

/// Config YAML for a gateway on 127.0.0.1:0 in front of `replicas`, with
/// `pool_extra` (indented pool fields, then any top-level sections) appended.
pub fn config_yaml(replicas: &[String], pool_extra: &str) -> String {
    let mut y = gateway_config(replicas).yaml();
    y.push_str(pool_extra);
    y
}

pub async fn start_gateway(yaml: &str) -> Gateway {
    let cfg = Config::parse(yaml).unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{yaml}"));
    let gw = Gateway::start(cfg).await.expect("gateway starts");
    started(&gw);
    let admin = gw.admin_addr;
    wait_until("gateway ready", || async move { get(admin, "/readyz").await.0 == 200 }).await;
    gw
}

/// Poll `cond` every 10 ms until true; fail after 15 s.
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if cond().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Start a streamed chat completion through `addr` and read it until `text`
/// has arrived; the body is returned still open (drop it to hang up).
pub async fn stream_until(addr: SocketAddr, text: &str) -> Incoming {
    let resp = client().request(post_req(addr, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(text) {
        let frame = body.frame().await.expect("frame").expect("ok frame");
        if let Ok(d) = frame.into_data() {
            seen.extend_from_slice(&d);
        }
    }
    body
}

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client that speaks HTTP/2 without TLS (prior knowledge), as gRPC-style
/// clients and proxies in a mesh do.
pub fn client_h2() -> TestClient {
    Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

/// Both protocols a client may use, with their names for assertion messages.
pub fn clients() -> [(&'static str, TestClient); 2] {
    [("HTTP/1.1", client()), ("HTTP/2", client_h2())]
}

pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let resp = client().get(format!("http://{addr}{path}").parse().expect("uri")).await.expect("GET");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub fn post_req(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    // The paths the gateway routes (others are 404/405 and never counted).
    if path.starts_with("/v1/") && path != "/v1/models" {
        count_sent(addr, 1);
    }
    let mut b = Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body.to_string()))).expect("request")
}

/// POST and read the whole response: (status, headers, body).
pub async fn post(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, Bytes) {
    let resp = client().request(post_req(addr, path, body, headers)).await.expect("POST");
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (status, parts.headers, bytes)
}

pub fn chat_body(stream: bool, usage: bool) -> String {
    let opts = if usage { r#","stream_options":{"include_usage":true}"# } else { "" };
    format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"hi"}}],"max_tokens":16,"stream":{stream}{opts}}}"#)
}

/// The sum of the samples in Prometheus text matching `name` and all `labels`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, r)) => (n, r),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            if !labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))) {
                return None;
            }
            value.parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

pub async fn metrics_text(gw: &Gateway) -> String {
    get(gw.admin_addr, "/metrics").await.1
}

pub async fn requests_with_outcome(gw: &Gateway, outcome: &str) -> f64 {
    metric(&metrics_text(gw).await, "slogate_requests_total", &[("outcome", outcome)]).unwrap_or(0.0)
}

// ---- quiescence: every test ends with nothing held and everything counted ----

static SENT: Mutex<Vec<(SocketAddr, usize)>> = Mutex::new(Vec::new());

/// Count `n` requests sent to the data plane at `addr` (`post_req` counts its
/// own; a test that sends by other means, raw TCP or an SDK, says so here).
pub fn count_sent(addr: SocketAddr, n: usize) {
    let mut sent = SENT.lock().expect("lock");
    match sent.iter_mut().find(|(a, _)| *a == addr) {
        Some((_, c)) => *c += n,
        None => sent.push((addr, n)),
    }
}

/// A gateway started: nothing was sent to it yet. (Its address may be one
/// an earlier test's gateway or mock had: ports of closed listeners are reused.)
pub fn started(gw: &Gateway) {
    SENT.lock().expect("lock").retain(|(a, _)| *a != gw.data_addr);
}

pub fn sent_to(addr: SocketAddr) -> usize {
    SENT.lock().expect("lock").iter().find(|(a, _)| *a == addr).map_or(0, |(_, c)| *c)
}

/// The gateway is at rest and its books balance: no request holds a slot,
/// none waits in a queue, and every request sent to it was counted in
/// `slogate_requests_total` exactly once.
pub async fn assert_quiescent(gw: &Gateway) {
    let sent = sent_to(gw.data_addr) as f64;
    let admin = gw.admin_addr;
    let at_rest = |m: &str| {
        let inflight = metric(m, "slogate_inflight_requests", &[]).unwrap_or(0.0);
        let queued = metric(m, "slogate_queue_depth", &[]).unwrap_or(0.0);
        let counted = metric(m, "slogate_requests_total", &[]).unwrap_or(0.0);
        (inflight, queued, counted)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let m = get(admin, "/metrics").await.1;
        let (inflight, queued, counted) = at_rest(&m);
        if inflight == 0.0 && queued == 0.0 && counted == sent {
            break;
        }
        let last = format!("in flight {inflight}, queued {queued}, counted {counted} of {sent} sent");
        assert!(counted <= sent, "more requests counted than sent: {last}");
        assert!(tokio::time::Instant::now() < deadline, "the gateway did not come to rest: {last}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- shared helpers ----

/// The repository's root.
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A program on PATH.
pub fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(bin)).find(|f| f.is_file()))
}

/// The `error` object of an OpenAI error body; fails unless it has all four
/// members (`message`, `type`, `param`, `code`).
pub fn error_body(body: &[u8]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)));
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "OpenAI error body lacks `{k}`: {v}");
    }
    v["error"].clone()
}

/// The `error.code` of an OpenAI error body.
pub fn error_code(body: &[u8]) -> String {
    error_body(body)["code"].as_str().unwrap_or_default().to_string()
}

/// A response header as text.
pub fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A real Redis server (Debian's `redis-server`, which `scripts/test`
/// installs) on a free loopback port, without persistence; stopped on drop.
pub struct Redis {
    pub port: u16,
    child: std::process::Child,
}

impl Redis {
    pub async fn start() -> Redis {
        let bin = which("redis-server").expect("redis-server not found: run scripts/test, which installs Debian's redis-server");
        for _ in 0..5 {
            // A free port: bound and released (a race with another process is retried).
            let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
            let mut child = std::process::Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start redis-server");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // it exited: the port was taken meanwhile
                }
                if Redis::ping(port).await {
                    return Redis { port, child };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Does something answer PING on `port`?
    pub async fn ping(port: u16) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return false };
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        matches!(tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await, Ok(Ok(_))) && &buf == b"+PONG\r\n"
    }

    /// Stop the server now (as an outage would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
