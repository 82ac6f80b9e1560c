//! Prefix-aware routing (the default `balance`) in front of simulated vLLM
//! replicas that keep a prefix cache: prompts sharing a system prompt go
//! where it is cached, the engines report it cached, a session hint keeps
//! a conversation on its replica, and gateways of a fleet agree.

use http_body_util::BodyExt;
use loadtest::sim::{SimConfig, SimServer};
use serde_json::Value;

use crate::common::*;

const MODEL: &str = "sim-llama-8b";

async fn replicas(n: usize) -> Vec<SimServer> {
    let mut out = Vec::new();
    for _ in 0..n {
        let cfg = SimConfig { step_base_ms: 1.0, prefill_per_token_ms: 0.001, ..SimConfig::default() };
        out.push(SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator"));
    }
    out
}

async fn gateway(sims: &[SimServer], pool_extra: &[&str]) -> Gw {
    let urls: Vec<String> = sims.iter().map(|s| s.url()).collect();
    let mut b = gateway_config(&urls);
    for f in pool_extra {
        b = b.pool(f);
    }
    start_gateway(&b.yaml().replace("models: [m1]", &format!("models: [{MODEL}]"))).await
}

/// A chat request whose system prompt (2,000 characters, 500 simulator
/// tokens) is `group`'s, and whose question is its own.
fn chat(group: usize, question: usize) -> String {
    let system: String = format!("You are assistant number {group:03}. ").repeat(70)[..2000].to_string();
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("Question {question}: why?")}],
        "max_tokens": 2,
    })
    .to_string()
}

/// Send over HTTP/1.1 or HTTP/2 (alternating with `i`): the replica that
/// served it and the usage the engine reported.
async fn send(addr: impl To, body: &str, headers: &[(&str, &str)], i: usize) -> (String, Value) {
    let (proto, client) = &clients()[i % 2];
    let resp = client.request(post_req(addr, "/v1/chat/completions", body, headers)).await.expect("POST");
    assert_eq!(resp.status(), 200, "{proto}");
    let replica = resp.headers().get("x-slogate-replica").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).expect("JSON answer");
    (replica, v["usage"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_sharing_a_system_prompt_go_where_it_is_cached_and_the_engines_report_it() {
    let sims = replicas(4).await;
    let gw = gateway(&sims, &[]).await;
    let (mut prompt, mut cached) = (0u64, 0u64);
    let mut homes: Vec<std::collections::BTreeSet<String>> = vec![Default::default(); 6];
    for q in 0..5 {
        for (g, home) in homes.iter_mut().enumerate() {
            let (replica, usage) = send(&gw, &chat(g, q), &[], g + q).await;
            home.insert(replica);
            prompt += usage["prompt_tokens"].as_u64().expect("prompt tokens");
            cached += usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached tokens");
        }
    }
    for (g, home) in homes.iter().enumerate() {
        assert_eq!(home.len(), 1, "group {g} went to {home:?}");
    }
    let used: std::collections::BTreeSet<&String> = homes.iter().flatten().collect();
    assert!(used.len() >= 2, "six groups spread over the replicas: {used:?}");
    // Every request after a group's first finds its 500-token system prompt
    // (less the part of a 16-token block it shares with the question).
    assert!(cached as f64 >= 0.75 * prompt as f64, "cached {cached} of {prompt} prompt tokens");
    // The usage is counted as the answer's body ends, just after the client
    // has read it: wait for every request to be counted before comparing.
    assert_quiescent(&gw).await;
    let cached_counted = || async {
        let m = metrics_text(&gw).await;
        metric(&m, "slogate_cached_prompt_tokens_total", &[("model", MODEL)]).unwrap_or(0.0) >= cached as f64
    };
    wait_until("every answer's cached tokens counted", cached_counted).await;
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_cached_prompt_tokens_total", &[("model", MODEL)]), Some(cached as f64), "{m}");
    let routed = metric(&m, "slogate_replica_prefix_routed_bytes_total", &[]).expect("routed bytes");
    let matched = metric(&m, "slogate_replica_prefix_matched_bytes_total", &[]).expect("matched bytes");
    assert!(matched >= 0.7 * routed, "the router expected {matched} of {routed} bytes cached");
    let slo: Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("slo JSON");
    let pool = &slo["pools"][0];
    assert_eq!(pool["balance"], "prefix_aware");
    let reported: Vec<f64> =
        pool["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["reported_hit_ratio"].as_f64()).collect();
    assert!(!reported.is_empty() && reported.iter().all(|r| *r > 0.5), "{pool}");
    // The status page shows both ratios per replica.
    let page = get(gw.admin_addr, "/slo").await.1;
    assert!(page.contains("prefix cache hits (expected / reported)"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_scatters_a_groups_requests_over_the_replicas() {
    let sims = replicas(4).await;
    let gw = gateway(&sims, &["balance: least_loaded"]).await;
    let mut homes: Vec<std::collections::BTreeSet<String>> = vec![Default::default(); 6];
    for q in 0..5 {
        for (g, home) in homes.iter_mut().enumerate() {
            home.insert(send(&gw, &chat(g, q), &[], g + q).await.0);
        }
    }
    // The comparison the default is for: without the prompt, a group's
    // requests go wherever is least loaded (here: in turn).
    assert!(homes.iter().any(|h| h.len() > 1), "{homes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_hint_keeps_a_conversation_on_one_replica_whatever_its_text() {
    let sims = replicas(4).await;
    let gw = gateway(&sims, &[]).await;
    for (hint, how) in [("x-session-id", "header"), ("prompt_cache_key", "body")] {
        let mut seen = std::collections::BTreeSet::new();
        for turn in 0..6 {
            // Short and different texts: nothing to match but the hint.
            let mut body: Value = serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": format!("turn {turn} {how}")}], "max_tokens": 1});
            let headers: Vec<(&str, &str)> = if how == "header" { vec![(hint, "conv-42")] } else { vec![] };
            if how == "body" {
                body[hint] = "conv-43".into();
            }
            seen.insert(send(&gw, &body.to_string(), &headers, turn).await.0);
            // The lease goes back just after the client has the answer: wait
            // for it, or the home replica counts one request more than the others.
            assert_quiescent(&gw).await;
        }
        assert_eq!(seen.len(), 1, "{hint} ({how}): {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_send_the_same_prefix_to_the_same_replica() {
    let sims = replicas(4).await;
    let gws = [gateway(&sims, &[]).await, gateway(&sims, &[]).await, gateway(&sims, &[]).await];
    for g in 0..8 {
        let mut seen = std::collections::BTreeSet::new();
        // Each gateway routes the group's first request without having seen
        // it: they agree on its home.
        for (i, gw) in gws.iter().enumerate() {
            seen.insert(send(&gw, &chat(100 + g, i), &[], i).await.0);
        }
        assert_eq!(seen.len(), 1, "group {g}: {seen:?}");
    }
}
