//! The gateway in-process on 127.0.0.1:0: its config, starting it, waiting
//! for a condition, and clients over HTTP/1.1 and HTTP/2.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slogate::config::Config;
use slogate::Gateway;

/// A test gateway's config: both listeners on 127.0.0.1:0, one pool `p`
/// serving `m1` from the given replicas with fast health checks. Fields are
/// added by section, never by editing the YAML text.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    replicas: Vec<String>,
    models: Vec<String>,
    server: Vec<String>,
    pool: Vec<String>,
    sections: Vec<String>,
}

pub fn gateway_config(replicas: &[String]) -> ConfigBuilder {
    ConfigBuilder { replicas: replicas.to_vec(), models: vec!["m1".into()], server: Vec::new(), pool: Vec::new(), sections: Vec::new() }
}

impl ConfigBuilder {
    /// A field of `server:`, e.g. `"busy_poll: true"`.
    pub fn server(mut self, field: &str) -> Self {
        self.server.push(field.to_string());
        self
    }

    /// The models the pool serves (`m1` unless named).
    pub fn models(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| m.to_string()).collect();
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
        let none = if self.replicas.is_empty() { " []" } else { "" };
        y.push_str(&format!("pools:\n  - name: p\n    models: [{}]\n    replicas:{none}\n", self.models.join(", ")));
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

    pub async fn start(&self) -> Gw {
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

pub async fn start_gateway(yaml: &str) -> Gw {
    let cfg = Config::parse(yaml).unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{yaml}"));
    let gw = started(Gateway::start(cfg).await.expect("gateway starts"));
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
pub async fn stream_until(to: impl To, text: &str) -> Incoming {
    let resp = client().request(post_req(to, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
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

/// A GET request (never counted: the gateway counts inference requests).
pub fn get_req(addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}")).body(Full::new(Bytes::new())).expect("request")
}

/// A POST to `to`: a test gateway (`&gw`, or `gw.data()` to move into a
/// task) counts it as sent; a plain address (a mock, Envoy) counts nothing.
pub fn post_req(to: impl To, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let to = to.target();
    let addr = to.addr;
    // The paths the gateway routes (others are 404/405 and never counted).
    if path.starts_with("/v1/") && path != "/v1/models" {
        to.count_sent(1);
    }
    let mut b = Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body.to_string()))).expect("request")
}

/// POST and read the whole response: (status, headers, body).
pub async fn post(to: impl To, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, Bytes) {
    let resp = client().request(post_req(to, path, body, headers)).await.expect("POST");
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

/// A gateway a test started, with the count of inference requests the
/// test sent it, which [`assert_quiescent`] checks against the gateway's own.
pub struct Gw {
    gw: Gateway,
    sent: &'static AtomicUsize,
}

/// Where a test sends a request: an address, and the count of the test
/// gateway listening there (none for a mock or Envoy). `Copy`, so that a
/// spawned task can take it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    sent: Option<&'static AtomicUsize>,
}

impl Target {
    /// Count `n` requests sent by other means (raw TCP, an SDK, Envoy).
    pub fn count_sent(&self, n: usize) {
        if let Some(s) = self.sent {
            s.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// What a request can be sent to: an address, a target, a test gateway.
pub trait To {
    fn target(&self) -> Target;
}

impl To for SocketAddr {
    fn target(&self) -> Target {
        Target { addr: *self, sent: None }
    }
}

impl To for Target {
    fn target(&self) -> Target {
        *self
    }
}

impl To for Gw {
    fn target(&self) -> Target {
        self.data()
    }
}

impl<T: To + ?Sized> To for &T {
    fn target(&self) -> Target {
        (**self).target()
    }
}

/// A gateway started: nothing was sent to it yet.
pub fn started(gw: Gateway) -> Gw {
    // One counter per test gateway, leaked so that a `Target` is `Copy`
    // and `'static`: a word per gateway, for the test binary's life.
    Gw { gw, sent: Box::leak(Box::new(AtomicUsize::new(0))) }
}

impl Gw {
    /// The data listener as a target that counts what is sent to it.
    pub fn data(&self) -> Target {
        Target { addr: self.gw.data_addr, sent: Some(self.sent) }
    }

    /// Count `n` requests sent by other means (raw TCP, an SDK, Envoy).
    pub fn count_sent(&self, n: usize) {
        self.data().count_sent(n);
    }

    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }

    pub async fn shutdown(self) {
        self.gw.shutdown().await
    }
}

impl Deref for Gw {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gw
    }
}

/// The gateway is at rest and its books balance: no request holds a slot,
/// none waits in a queue, and every request sent to it was counted in
/// `slogate_requests_total` exactly once.
pub async fn assert_quiescent(gw: &Gw) {
    let sent = gw.sent() as f64;
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

/// Run `code` with the OpenAI Python SDK installed by scripts/setup-test-deps,
/// the gateway's `/v1` base URL and `args` as its arguments; its output, once
/// it succeeded.
pub async fn openai_sdk(gw: &Gateway, code: &str, args: &[&std::path::Path]) -> String {
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(py.is_file(), "{} missing: run scripts/setup-test-deps", py.display());
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg("-c")
        .arg(format!("import sys\nfrom openai import OpenAI\nc = OpenAI(base_url=sys.argv[1], api_key=\"unused\", max_retries=0)\n{code}"));
    cmd.arg(format!("http://{}/v1", gw.data_addr)).args(args).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("the SDK script ends").expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "OpenAI SDK:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Two gateways of `alone`'s config started from files in `dir`, then
/// made a fleet of two (`times`: the fleet's period and timeouts) by a
/// reload of each: the gateways and their admin URLs.
pub async fn fleet_of_two(alone: &ConfigBuilder, times: &str, dir: &std::path::Path) -> (Gw, Gw, String, String) {
    let (path_a, path_b) = (dir.join("a.yaml"), dir.join("b.yaml"));
    std::fs::write(&path_a, alone.yaml()).expect("write");
    std::fs::write(&path_b, alone.yaml()).expect("write");
    let a = started(Gateway::start_file(&path_a).await.expect("a starts"));
    let b = started(Gateway::start_file(&path_b).await.expect("b starts"));
    let (url_a, url_b) = (format!("http://{}", a.admin_addr), format!("http://{}", b.admin_addr));
    let fleet = format!("fleet: {{ peers: [\"{url_a}\", \"{url_b}\"], {times} }}");
    for path in [&path_a, &path_b] {
        std::fs::write(path, alone.clone().section(&fleet).yaml()).expect("write");
    }
    a.reload().await.expect("a reloads");
    b.reload().await.expect("b reloads");
    (a, b, url_a, url_b)
}
