//! Keys' limits kept in a real Redis (`limits.redis`): two gateways count
//! against one total, running requests included, tokens settled to usage;
//! a store that goes down costs precision, never a request.

use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use slogate::config::key_sha256;

fn gateway_yaml(mock: &Mock, redis: &str, prefix: &str, limits: &str) -> String {
    format!(
        "{}auth:\n  keys:\n    - {{ name: shared, key_sha256: {}, classes: [chat], limits: {limits} }}\nlimits:\n  redis: {redis}\n  key_prefix: {prefix}\n  timeout: 2s\n",
        gateway_config(&[mock.url()]).yaml(),
        key_sha256("sk-shared")
    )
}

async fn ask(c: &TestClient, gw: &Gw, body: &str) -> (u16, http::HeaderMap, String) {
    let resp = c.request(post_req(gw, "/v1/chat/completions", body, &[("authorization", "Bearer sk-shared")])).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn slo(gw: &Gw) -> serde_json::Value {
    serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_count_a_keys_requests_against_one_total_in_redis() {
    let redis = Redis::start().await;
    for (proto, c) in clients() {
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        // A prefix per protocol: each run starts from an empty minute.
        let yaml = gateway_yaml(&mock, &redis.url(), &format!("t1{proto}"), "{ requests_per_minute: 5 }");
        let (a, b) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
        let body = chat_body(false, false);
        // Alternating gateways: five in all, not five each.
        for (i, left) in ["4", "3", "2", "1", "0"].into_iter().enumerate() {
            let gw = if i % 2 == 0 { &a } else { &b };
            let (s, h, body) = ask(&c, gw, &body).await;
            assert_eq!(s, 200, "{proto}: request {i}: {body}");
            assert_eq!(header(&h, "x-ratelimit-limit-requests"), Some("5"), "{proto}: the key's whole limit, not a part");
            assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some(left), "{proto}: request {i}");
        }
        for gw in [&a, &b] {
            let (s, h, body) = ask(&c, gw, &body).await;
            assert_eq!(s, 429, "{proto}: {body}");
            assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("0"), "{proto}");
            let retry: u64 = header(&h, "retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
            assert!((1..=60).contains(&retry), "{proto}: {retry}");
            assert_eq!(error_code(body.as_bytes()), "rate_limit_exceeded", "{proto}");
        }
        let s = slo(&a).await;
        assert_eq!(s["tenants"][0]["limits"]["kept"], "store", "{proto}: {s}");
        let m = metrics_text(&a).await;
        assert_eq!(metric(&m, "slogate_limits_store_up", &[]), Some(1.0), "{proto}");
        assert_eq!(metric(&m, "slogate_limits_store_errors_total", &[]), Some(0.0), "{proto}");
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_one_gateway_holds_the_keys_max_concurrent_on_the_other() {
    let redis = Redis::start().await;
    for (proto, c) in clients() {
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        let yaml = gateway_yaml(&mock, &redis.url(), &format!("t2{proto}"), "{ max_concurrent: 1 }");
        let (a, b) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
        let held = mock.hold_slot_as(&a, &[("authorization", "Bearer sk-shared")]).await;
        let (s, h, body) = ask(&c, &b, &chat_body(true, false)).await;
        assert_eq!(s, 429, "{proto}: the key's one running request is on the other gateway: {body}");
        assert_eq!(header(&h, "retry-after"), Some("1"), "{proto}");
        assert!(body.contains("max_concurrent"), "{proto}: {body}");
        held.release().await;
        // The stream's end reaches the store (queued, never waited on by the request path).
        wait_until("the held stream's end counted in the store", || async { ask(&c, &b, &chat_body(false, false)).await.0 == 200 }).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reserved_at_admission_are_settled_to_the_replicas_usage_in_the_store() {
    let redis = Redis::start().await;
    for (proto, c) in clients() {
        // The mock reports 10 tokens used in all.
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        let yaml = gateway_yaml(&mock, &redis.url(), &format!("t3{proto}"), "{ tokens_per_minute: 1000 }");
        let (a, b) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":600}"#;
        let (s, h, _) = ask(&c, &a, body).await;
        assert_eq!(s, 200, "{proto}");
        let reserved = 1000 - header(&h, "x-ratelimit-remaining-tokens").and_then(|v| v.parse::<u64>().ok()).expect("remaining");
        assert!(reserved > 600, "{proto}: the prompt estimate plus max_tokens is reserved: {reserved}");
        // While reserved, a second 600 does not fit; once the first is
        // settled to the 10 tokens it used, it does, on the other gateway.
        let second = std::sync::Mutex::new(None);
        wait_until("the first request settled to its usage", || async {
            let (s, h, _) = ask(&c, &b, body).await;
            *second.lock().expect("lock") = header(&h, "x-ratelimit-remaining-tokens").and_then(|v| v.parse::<u64>().ok());
            s == 200
        })
        .await;
        let second = *second.lock().expect("lock");
        assert_eq!(second, Some(1000 - 10 - reserved), "{proto}: 10 used by the first, the second's reservation");
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_goes_down_costs_no_request_and_each_instance_enforces_its_part() {
    let mut redis = Redis::start().await;
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = start_gateway(&gateway_yaml(&mock, &redis.url(), "t4", "{ requests_per_minute: 3 }")).await;
    let c = client();
    let body = chat_body(false, false);
    let (s, h, _) = ask(&c, &gw, &body).await;
    assert_eq!((s, header(&h, "x-ratelimit-remaining-requests")), (200, Some("2")), "through the store");
    redis.kill();
    // No request fails for the outage: the first ones find it down, and this
    // instance's own windows (empty: the store held the count) take over.
    for left in ["2", "1", "0"] {
        let (s, h, body) = ask(&c, &gw, &body).await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some(left));
    }
    let (s, _, body) = ask(&c, &gw, &body).await;
    assert_eq!(s, 429, "the instance's part still holds: {body}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_limits_store_up", &[]), Some(0.0));
    assert!(metric(&m, "slogate_limits_store_errors_total", &[]).is_some_and(|n| n >= 1.0), "{m}");
    assert_eq!(slo(&gw).await["tenants"][0]["limits"]["kept"], "store_down");
    // Every request counted once (a request is counted as its response body
    // is dropped, which may come a moment after the client read it).
    assert_quiescent(&gw).await;
    gw.shutdown().await;
}

/// What the store holds for the key's tokens today.
async fn tokens_today(redis: &Redis, prefix: &str) -> Option<u64> {
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    let day = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() / 86_400;
    redis::cmd("GET").arg(format!("{prefix}:key:shared:tokens:day:{day}")).query_async::<Option<u64>>(&mut conn).await.expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_quota_in_the_store_holds_across_two_gateways_and_a_restart() {
    let redis = Redis::start().await;
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let yaml = gateway_yaml(&mock, &redis.url(), "q1", "{ tokens_per_day: 100 }");
    // Each request reserves 60 (20 of prompt estimate, 40 of max_tokens); the replica reports 10.
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":40}"#;
    let (a, b) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let mut served = 0;
    for (i, (proto, c)) in clients().into_iter().enumerate() {
        let gw = if i == 0 { &a } else { &b };
        loop {
            let (s, h, text) = ask(&c, gw, body).await;
            if s == 429 {
                assert_eq!(error_code(text.as_bytes()), "quota_exceeded", "{proto}: {text}");
                assert_eq!(header(&h, "x-ratelimit-remaining-tokens"), Some("50"), "{proto}");
                break;
            }
            assert_eq!(s, 200, "{proto}: {text}");
            served += 1;
            // Settled in the store to the replica's usage.
            wait_until("the store settled it", || async { tokens_today(&redis, "q1").await == Some(10 * served) }).await;
            if i == 0 && served == 2 {
                break;
            }
        }
    }
    assert_eq!(served, 5, "two on one gateway, three on the other: one quota of 100, 60 reserved and 10 used each");
    a.shutdown().await;
    b.shutdown().await;
    // A restart: the day's use is still there.
    let c = start_gateway(&yaml).await;
    let (s, _, text) = ask(&client(), &c, body).await;
    assert_eq!((s, error_code(text.as_bytes())), (429, "quota_exceeded".to_string()), "{text}");
    assert_eq!(tokens_today(&redis, "q1").await, Some(50), "refusals take nothing");
    c.shutdown().await;
}

/// Cut streams settle in the store too: streams of 500 tokens cut by their
/// client, alternating between two gateways, until the key's day is spent;
/// the replica generates within the quota, and what the store counts is
/// what the streams relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_streams_settle_in_the_store_at_what_they_relayed() {
    let redis = Redis::start().await;
    let mock = Mock::start(crate::enforcement::streams_500_then_holds()).await;
    let yaml = gateway_yaml(&mock, &redis.url(), "cut", "{ tokens_per_day: 6000 }");
    let (a, b) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":18446744073709551615}"#;
    let c = client();
    let mut served = 0u64;
    for i in 0..30 {
        let gw = if i % 2 == 0 { &a } else { &b };
        let resp = c.request(post_req(gw, "/v1/chat/completions", body, &[("authorization", "Bearer sk-shared")])).await.expect("response");
        if resp.status() == 429 {
            break;
        }
        let mut body = resp.into_body();
        let mut seen = String::new();
        while seen.matches("\"content\":\"t").count() < 500 {
            let frame = body.frame().await.expect("a frame").expect("data");
            seen.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap_or_default()));
        }
        drop(body);
        served += 1;
        // Settled in the store: the reservation (the context) gives way to what was relayed.
        let r = &redis;
        wait_until("the cut stream settled in the store", || async move { tokens_today(r, "cut").await.unwrap_or(0) <= 564 * served })
            .await;
    }
    let made = 500 * served;
    assert!(served >= 2 && made <= 6000 * 5 / 4 + 4096, "{served} streams, {made} tokens for a 6,000-token day");
    let used = tokens_today(&redis, "cut").await.unwrap_or(0);
    assert!((made..=made + 64 * served).contains(&used), "{served} cut streams of 500 tokens: the store counts {used}");
    let s = slo(&a).await;
    assert_eq!(s["tenants"][0]["quotas"][0]["used"].as_u64(), Some(used), "/slo shows the store's count: {s}");
    for gw in [&a, &b] {
        assert_quiescent(gw).await;
    }
}
