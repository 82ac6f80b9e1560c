//! Learned replica limits against the simulator (an engine that runs a
//! fixed number of sequences at once and queues the rest, as vLLM does):
//! the limit finds the replica's capacity and the replica stops queueing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::*;
use loadtest::sim::{SimConfig, SimServer};

/// A replica that runs 6 sequences at once, in 5 ms steps.
async fn small_replica() -> SimServer {
    let cfg = SimConfig { max_num_seqs: 6, step_base_ms: 5.0, decode_per_seq_ms: 0.0, prefill_per_token_ms: 0.0, ..SimConfig::default() };
    SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator")
}

fn limit(m: &str) -> f64 {
    metric(m, "slogate_replica_limit", &[]).unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_learned_limit_finds_the_replicas_capacity_and_its_queue_empties() {
    let sim = small_replica().await;
    // Twenty clients on a replica that runs six: the limit is under test, not
    // shedding (with shed_late, what waits past chat's target is refused).
    let tiers = "tiers:\n  interactive: { shed_late: false }";
    let yaml = gateway_config(&[sim.url()]).section(tiers).yaml().replace("models: [m1]", "models: [auto]").replace(
        "health: { interval: 100ms",
        "scrape_metrics: 100ms\n    learned_limit: { initial: 16, min: 1, max: 64 }\n    health: { interval: 100ms",
    );
    let gw = start_gateway(&yaml).await;
    assert_eq!(limit(&metrics_text(&gw).await), 32.0, "it starts at twice learned_limit.initial (slow start)");
    // Twenty clients, each streaming 40-token answers back to back: more
    // than the replica runs at once.
    let stop = Arc::new(AtomicBool::new(false));
    let body = r#"{"model":"sim-llama-8b","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":40,"ignore_eos":true}"#;
    let clients: Vec<_> = (0..20)
        .map(|_| {
            let (stop, addr) = (stop.clone(), gw.data());
            tokio::spawn(async move {
                let mut failed = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (s, _, _) = post(addr, "/v1/chat/completions", body, &[]).await;
                    failed += usize::from(s != 200);
                }
                failed
            })
        })
        .collect();
    // It comes down to the replica's 6, and what was sent under the higher
    // limit drains.
    wait_until("the limit comes down to about the replica's 6 and the backlog drains", || async {
        let m = metrics_text(&gw).await;
        let l = limit(&m);
        (4.0..=9.0).contains(&l) && metric(&m, "slogate_inflight_requests", &[]).is_some_and(|n| n <= l)
    })
    .await;
    // Settled: it stays near the capacity while the load lasts (probing one
    // or two above it now and then), and the replica's own queue stays short.
    let mut waited = Vec::new();
    for _ in 0..12 {
        let m = metrics_text(&gw).await;
        let l = limit(&m);
        assert!((4.0..=10.0).contains(&l), "the learned limit left the capacity: {l}");
        let (_, text) = get(sim.addr, "/metrics").await;
        let waiting: f64 = text
            .lines()
            .filter(|l| l.starts_with("vllm:num_requests_waiting"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        waited.push(waiting);
        // The next sample after ten more requests (a few scrape periods).
        let done = requests_with_outcome(&gw, "length").await;
        wait_until("ten more requests", || async { requests_with_outcome(&gw, "length").await >= done + 10.0 }).await;
    }
    let mean = waited.iter().sum::<f64>() / waited.len() as f64;
    assert!(mean <= 1.5, "the replica queued {mean} requests itself on average: {waited:?}");
    let (_, slo) = get(gw.admin_addr, "/slo.json").await;
    assert!(slo.contains("\"limit_learned\": true"), "{slo}");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        assert_eq!(c.await.expect("client"), 0, "no request failed");
    }
    assert_quiescent(&gw).await;
}

/// A number fixes the limit: the gauge shows it and nothing learns.
#[tokio::test]
async fn a_fixed_limit_is_exported_as_it_is() {
    let sim = small_replica().await;
    let yaml = gateway_config(&[sim.url()]).pool("max_inflight_per_replica: 3").yaml().replace("models: [m1]", "models: [auto]");
    let gw = start_gateway(&yaml).await;
    assert_eq!(limit(&metrics_text(&gw).await), 3.0);
    let (_, slo) = get(gw.admin_addr, "/slo.json").await;
    let v: serde_json::Value = serde_json::from_str(&slo).expect("json");
    assert_eq!(v["pools"][0]["replicas"][0]["max_inflight"], 3);
    assert_eq!(v["pools"][0]["replicas"][0]["limit_learned"], false);
}

/// A stand-in for llama.cpp's server (`llama-server --parallel 3 --metrics`):
/// its `/health`, `/props` (`total_slots`, unless `declares` is false: an
/// older server), `/metrics` under its names, `/v1/models`, and a short
/// completion for any POST. Counts the `/props` requests.
struct LlamaServer {
    addr: std::net::SocketAddr,
    props: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl LlamaServer {
    async fn start(declares: bool) -> LlamaServer {
        use http_body_util::Full;
        use hyper::body::Bytes;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let props = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = props.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (status, body) = match (req.method().as_str(), req.uri().path()) {
                            ("GET", "/health") => (200, r#"{"status":"ok"}"#.to_string()),
                            ("GET", "/props") => {
                                counted.fetch_add(1, Ordering::SeqCst);
                                if declares {
                                    (200, r#"{"total_slots":3,"model_alias":"m1","endpoint_slots":true}"#.to_string())
                                } else {
                                    (404, r#"{"error":{"code":404,"message":"File Not Found"}}"#.to_string())
                                }
                            }
                            ("GET", "/metrics") => (200, "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n".to_string()),
                            ("GET", "/v1/models") => (200, r#"{"object":"list","data":[{"id":"m1","object":"model"}]}"#.to_string()),
                            ("POST", _) => (
                                200,
                                r#"{"id":"c1","object":"text_completion","created":1,"model":"m1","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#.to_string(),
                            ),
                            _ => (404, String::new()),
                        };
                        async move {
                            let resp = hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .header("content-length", body.len())
                                .body(Full::new(Bytes::from(body)))
                                .expect("response");
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                });
            }
        });
        LlamaServer { addr, props, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn props_asked(&self) -> usize {
        self.props.load(Ordering::SeqCst)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn llama_gateway(url: &str, engine: &str) -> String {
    gateway_config(&[url.to_string()])
        .pool("max_inflight_per_replica: auto")
        .pool("scrape_metrics: 100ms")
        .pool("learned_limit: { initial: 16, min: 1, max: 64 }")
        .pool(&format!("engine: {engine}"))
        .yaml()
}

/// llama.cpp's server says how many requests it runs at once (`/props`
/// `total_slots`): the learned limit is within them from the first
/// request, where slow start would have offered 32, and the status page
/// says so.
#[tokio::test]
async fn a_limit_learned_in_front_of_llama_cpp_stays_within_the_slots_it_declares() {
    let server = LlamaServer::start(true).await;
    let gw = start_gateway(&llama_gateway(&server.url(), "llamacpp")).await;
    // Ready means a first health check passed, and /props is read before it.
    assert_eq!(limit(&metrics_text(&gw).await), 3.0, "the limit starts within the engine's 3 slots, not at slow start's 32");
    let (_, slo) = get(gw.admin_addr, "/slo.json").await;
    let v: serde_json::Value = serde_json::from_str(&slo).expect("json");
    assert_eq!(v["pools"][0]["replicas"][0]["engine_slots"], 3, "{slo}");
    // Traffic (the controller's periods) does not take it past them.
    for _ in 0..20 {
        let (s, _, _) = post(gw.data(), "/v1/completions", r#"{"model":"m1","prompt":"hi","max_tokens":1}"#, &[]).await;
        assert_eq!(s, 200);
    }
    assert!(limit(&metrics_text(&gw).await) <= 3.0);
}

/// In an `engine: auto` pool the load scrape finds llama.cpp's metric
/// names, and the next check reads its slots; a vLLM pool never asks, and
/// a server that does not answer `/props` leaves the limit as it was.
#[tokio::test]
async fn an_auto_pool_reads_the_slots_once_it_sees_llama_cpp_and_others_are_not_asked() {
    let server = LlamaServer::start(true).await;
    let gw = start_gateway(&llama_gateway(&server.url(), "auto")).await;
    let (s, _, _) = post(gw.data(), "/v1/completions", r#"{"model":"m1","prompt":"hi","max_tokens":1}"#, &[]).await;
    assert_eq!(s, 200);
    wait_until("the limit within the 3 slots llama.cpp declares", || async { limit(&metrics_text(&gw).await) == 3.0 }).await;

    let vllm = LlamaServer::start(true).await;
    let gw = start_gateway(&llama_gateway(&vllm.url(), "vllm")).await;
    let (s, _, _) = post(gw.data(), "/v1/completions", r#"{"model":"m1","prompt":"hi","max_tokens":1}"#, &[]).await;
    assert_eq!(s, 200);
    // Its first check (before ready) and the load scrapes the request woke.
    wait_until("a load scrape after the request", || async { metrics_text(&gw).await.contains("slogate_replica_limit") }).await;
    assert_eq!(vllm.props_asked(), 0, "a vLLM pool does not ask for llama.cpp's /props");
    assert_eq!(limit(&metrics_text(&gw).await), 32.0, "slow start's offer, no slots declared");

    let old = LlamaServer::start(false).await;
    let gw = start_gateway(&llama_gateway(&old.url(), "llamacpp")).await;
    assert!(old.props_asked() >= 1);
    assert_eq!(limit(&metrics_text(&gw).await), 32.0, "no slots said: slow start's offer");
    let (_, slo) = get(gw.admin_addr, "/slo.json").await;
    assert!(!slo.contains("engine_slots"), "{slo}");
}
