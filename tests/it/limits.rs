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
