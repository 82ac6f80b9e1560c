//! Simulator faults, switched at run time through `POST /admin/faults`.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use loadtest::sim::{Profile, SimConfig, SimServer};
use tokio::time::Instant;

type C = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> C {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn call(c: &C, method: &str, url: String, body: &str) -> Result<(u16, String), hyper_util::client::legacy::Error> {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = c.request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn sim(cfg: SimConfig) -> SimServer {
    SimServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim")
}

const STREAM: &str =
    r#"{"model":"sim-llama-8b","messages":[{"role":"user","content":"hello there"}],"max_tokens":12,"ignore_eos":true,"stream":true}"#;

async fn set(c: &C, s: &SimServer, faults: &str) {
    let (status, body) = call(c, "POST", format!("{}/admin/faults", s.url()), faults).await.expect("admin");
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_fail_and_recovery_switch_at_run_time() {
    let (s, c) = (sim(Profile::Llama8bH100.config()).await, client());
    assert_eq!(call(&c, "GET", format!("{}/health", s.url()), "").await.expect("health").0, 200);
    set(&c, &s, r#"{"health_fail": true}"#).await;
    assert_eq!(call(&c, "GET", format!("{}/health", s.url()), "").await.expect("health").0, 503);
    let (_, shown) = call(&c, "GET", format!("{}/admin/faults", s.url()), "").await.expect("get");
    assert!(shown.contains("\"health_fail\":true"), "{shown}");
    set(&c, &s, "{}").await;
    assert_eq!(call(&c, "GET", format!("{}/health", s.url()), "").await.expect("health").0, 200);
    assert_eq!(call(&c, "POST", format!("{}/admin/faults", s.url()), r#"{"bogus": 1}"#).await.expect("bad").0, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_error_fault_sends_an_error_event_then_done() {
    let (s, c) = (sim(Profile::Llama8bH100.config()).await, client());
    set(&c, &s, r#"{"stream_error_rate": 1.0}"#).await;
    let (status, body) = call(&c, "POST", format!("{}/v1/chat/completions", s.url()), STREAM).await.expect("stream");
    assert_eq!(status, 200, "errors arrive inside an HTTP 200 stream");
    assert!(body.contains(r#"data: {"error":"#) && body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("finish_reason\":\"length"), "the stream stopped before its end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_holds_tokens_and_slowdown_stretches_steps() {
    let (s, c) = (sim(Profile::Llama8bH100.config()).await, client());
    let t = Instant::now();
    call(&c, "POST", format!("{}/v1/chat/completions", s.url()), STREAM).await.expect("baseline");
    let baseline = t.elapsed();
    set(&c, &s, r#"{"stall_secs": 0.6}"#).await;
    let t = Instant::now();
    call(&c, "POST", format!("{}/v1/chat/completions", s.url()), STREAM).await.expect("stalled");
    assert!(t.elapsed() >= Duration::from_millis(600), "no tokens during the stall: {:?}", t.elapsed());
    set(&c, &s, r#"{"slowdown": 8.0}"#).await;
    let steps_before = s.engine.stats.steps.load(std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    call(&c, "POST", format!("{}/v1/chat/completions", s.url()), STREAM).await.expect("slow");
    let steps = s.engine.stats.steps.load(std::sync::atomic::Ordering::Relaxed) - steps_before;
    // 12 tokens = 12 steps of at least 8 x 6 ms.
    assert_eq!(steps, 12);
    assert!(t.elapsed() >= Duration::from_millis(12 * 48), "slowed steps: {:?} (baseline {baseline:?})", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_fault_stops_the_replica() {
    let (s, c) = (sim(Profile::Llama8bH100.config()).await, client());
    let addr = s.addr;
    // The replica may drop the connection while answering: either way it stops.
    let _ = call(&c, "POST", format!("{}/admin/faults", s.url()), r#"{"exit": true}"#).await;
    tokio::time::timeout(Duration::from_secs(5), s.stopped()).await.expect("stops");
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_queue_answers_503_and_unknown_models_404() {
    let cfg = SimConfig { max_waiting: Some(0), ..Profile::Llama8bH100.config() };
    let (s, c) = (sim(cfg).await, client());
    let (status, body) = call(&c, "POST", format!("{}/v1/chat/completions", s.url()), STREAM).await.expect("full");
    assert_eq!(status, 503, "{body}");
    let (status, body) =
        call(&c, "POST", format!("{}/v1/chat/completions", s.url()), &STREAM.replace("sim-llama-8b", "nope")).await.expect("404");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"object\":\"error\""), "vLLM's error shape: {body}");
}
