//! The gateway around the stream: errors, routing, health, retry, metrics
//! exposition, shutdown and TLS.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::BodyExt;

#[tokio::test]
async fn gateway_errors_have_their_status_and_openai_shape() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("max_request_body: 1KiB").start().await;
    let a = gw.data();
    let cases: Vec<(&str, String, u16)> = vec![
        ("malformed JSON", "{not json".into(), 400),
        ("not an object", "[1,2]".into(), 400),
        ("missing model", r#"{"messages":[]}"#.into(), 400),
        ("unknown model", r#"{"model":"nope","messages":[]}"#.into(), 404),
        ("too large", format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(2000)), 413),
    ];
    for (what, body, want) in cases {
        let (status, _, b) = post(a, "/v1/chat/completions", &body, &[]).await;
        assert_eq!(status, want, "{what}: {}", String::from_utf8_lossy(&b));
        error_body(&b);
    }
    let (status, _, b) = post(a, "/v1/chat/completions", &chat_body(false, false), &[("x-slo-class", "gold")]).await;
    assert_eq!(status, 400);
    assert_eq!(error_body(&b)["param"], "x-slo-class");
    let (status, body) = get(a.addr, "/nope").await;
    assert_eq!(status, 404);
    error_body(&Bytes::from(body));
    let (status, _, b) = post(a, "/v1/rerank", r#"{"query":"q"}"#, &[]).await;
    assert_eq!(status, 400, "an inference endpoint without a model");
    assert_eq!(error_body(&b)["param"], "model");
    // A known path with the wrong method: 405 naming the method it takes (as vLLM answers).
    for (addr, method, path, allow) in [
        (a.addr, "GET", "/v1/chat/completions", "POST"),
        (a.addr, "DELETE", "/v1/embeddings", "POST"),
        (a.addr, "POST", "/v1/models", "GET"),
        (gw.admin_addr, "GET", "/-/reload", "POST"),
        (gw.admin_addr, "POST", "/metrics", "GET"),
    ] {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(http_body_util::Full::new(Bytes::new()))
            .expect("request");
        let resp = client().request(req).await.expect("request");
        let (status, allowed) = (resp.status().as_u16(), resp.headers().get("allow").and_then(|v| v.to_str().ok()).map(str::to_string));
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!((status, allowed.as_deref()), (405, Some(allow)), "{method} {path}");
        assert_eq!(error_body(&body)["code"], "method_not_allowed", "{method} {path}");
    }
    assert_eq!(mock.calls(), 0, "nothing bad reached the replica");
    // Client errors are counted, under bounded labels.
    let m = metrics_text(&gw).await;
    assert_eq!(
        metric(&m, "slogate_requests_total", &[("outcome", "client_error")]),
        Some(7.0),
        "5 bad bodies, 1 unknown class, 1 rerank without a model"
    );
    assert!(!m.contains("model=\"nope\""), "client-chosen model names never become label values");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn api_keys_gate_classes_with_401_and_403() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let hash = |k: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(k.as_bytes()))
    };
    let auth = format!("auth:\n  keys:\n    - {{ name: web, key_sha256: {}, classes: [chat, voice] }}\n    - {{ name: nightly, key_sha256: {}, classes: [batch] }}\n", hash("web-key"), hash("batch-key"));
    let gw = start_gateway(&format!("{}{auth}", config_yaml(&[mock.url()], ""))).await;
    let a = gw.data();
    let body = chat_body(false, false);
    assert_eq!(post(a, "/v1/chat/completions", &body, &[]).await.0, 401);
    assert_eq!(post(a, "/v1/chat/completions", &body, &[("authorization", "Bearer wrong")]).await.0, 401);
    let (s, h, _) = post(a, "/v1/chat/completions", &body, &[("authorization", "Bearer web-key")]).await;
    assert_eq!((s, h.get("x-slogate-class").and_then(|v| v.to_str().ok())), (200, Some("chat")));
    let (s, h, _) = post(a, "/v1/chat/completions", &body, &[("authorization", "Bearer web-key"), ("x-slo-class", "voice")]).await;
    assert_eq!((s, h.get("x-slogate-class").and_then(|v| v.to_str().ok())), (200, Some("voice")));
    let (s, h, _) = post(a, "/v1/chat/completions", &body, &[("authorization", "Bearer batch-key")]).await;
    assert_eq!((s, h.get("x-slogate-class").and_then(|v| v.to_str().ok())), (200, Some("batch")));
    let (s, _, b) = post(a, "/v1/chat/completions", &body, &[("authorization", "Bearer batch-key"), ("x-slo-class", "chat")]).await;
    assert_eq!(s, 403, "a batch key cannot promote itself to interactive");
    assert_eq!(error_body(&b)["type"], "permission_error");
    // slogate's keys are checked here and not passed on to the replicas.
    let seen = mock.state.headers.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|h| h.get("authorization").is_none()), "a slogate key reached a replica");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn without_slogate_keys_the_callers_authorization_goes_to_the_replica() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[("authorization", "Bearer vllm-key")]).await;
    assert_eq!(s, 200);
    let seen = mock.state.headers.lock().expect("lock").clone();
    assert_eq!(seen[0].get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer vllm-key"));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn no_healthy_replica_is_503_with_retry_after() {
    // Without panic routing (a pool whose every replica fails is routed to by default).
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).pool("health: { interval: 100ms, panic_threshold: 0 }").start().await;
    mock.state.healthy.store(false, Ordering::SeqCst);
    wait_until("replica taken out", || async { get(gw.admin_addr, "/readyz").await.0 == 503 }).await;
    let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    assert_eq!(s, 503);
    assert_eq!(h.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "Retry-After in whole seconds");
    assert_eq!(error_code(&b), "no_healthy_replica");
    error_body(&b);
    assert_eq!(requests_with_outcome(&gw, "unavailable").await, 1.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn replica_failing_health_is_taken_out_and_comes_back() {
    let a = Mock::start(standard(1, Duration::ZERO)).await;
    let b = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[a.url(), b.url()], "    balance: round_robin\n")).await;
    let healthy = |url: String| {
        let admin = gw.admin_addr;
        async move { metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &url)]) }
    };
    wait_until("both healthy", || async { healthy(a.url()).await == Some(1.0) && healthy(b.url()).await == Some(1.0) }).await;
    a.state.healthy.store(false, Ordering::SeqCst);
    wait_until("a taken out", || async { healthy(a.url()).await == Some(0.0) }).await;
    let before = a.calls();
    for _ in 0..6 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await.0, 200);
    }
    assert_eq!(a.calls(), before, "no traffic to a replica that is out");
    assert_eq!(get(gw.admin_addr, "/readyz").await.0, 200, "one healthy replica keeps the pool ready");
    a.state.healthy.store(true, Ordering::SeqCst);
    wait_until("a back", || async { healthy(a.url()).await == Some(1.0) }).await;
    for _ in 0..6 {
        post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    }
    assert!(a.calls() > before, "traffic returns to the recovered replica");
    assert_quiescent(&gw).await;
}

/// Every replica fails its active checks while it still serves: rather
/// than refuse everything, the pool is in panic and routes to all of them
/// (Envoy's panic threshold); `/slo` and `slogate_pool_panic` say so, with
/// when and why each replica was taken out, and the panic ends when the
/// checks pass again.
#[tokio::test]
async fn replicas_all_failing_their_checks_while_serving_are_routed_to_under_panic() {
    let a = Mock::start(standard(1, Duration::ZERO)).await;
    let b = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[a.url(), b.url()]).pool("health: { interval: 100ms }").start().await;
    let admin = gw.admin_addr;
    let panic = || async move { metric(&get(admin, "/metrics").await.1, "slogate_pool_panic", &[("pool", "p")]) };
    wait_until("both in, no panic", || async { panic().await == Some(0.0) && get(admin, "/readyz").await.0 == 200 }).await;
    a.state.healthy.store(false, Ordering::SeqCst);
    wait_until("a out", || async {
        metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &a.url())]) == Some(0.0)
    })
    .await;
    assert_eq!(panic().await, Some(0.0), "one of two passing is not under the threshold (50 %)");
    b.state.healthy.store(false, Ordering::SeqCst);
    wait_until("panic", || async { panic().await == Some(1.0) }).await;
    let before = a.calls() + b.calls();
    for (proto, client) in clients() {
        for _ in 0..4 {
            let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("POST");
            assert_eq!(resp.status(), 200, "{proto}: served under panic");
            let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
            assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("error"), "{proto}: {text}");
        }
    }
    assert_eq!(a.calls() + b.calls(), before + 8);
    assert!(a.calls() > 0 && b.calls() > 0, "both are routed to");
    let v: serde_json::Value = serde_json::from_str(&get(admin, "/slo.json").await.1).expect("JSON");
    assert_eq!(v["pools"][0]["panic"], true);
    for r in v["pools"][0]["replicas"].as_array().expect("replicas") {
        assert_eq!(r["healthy"], false, "{r}");
        assert!(r["last_change"].as_str().is_some_and(|c| c.starts_with("taken out at ") && c.contains("health checks failed")), "{r}");
    }
    assert!(get(admin, "/slo").await.1.contains("pool in panic"), "the status page says so");
    a.state.healthy.store(true, Ordering::SeqCst);
    b.state.healthy.store(true, Ordering::SeqCst);
    wait_until("panic over", || async { panic().await == Some(0.0) }).await;
    let v: serde_json::Value = serde_json::from_str(&get(admin, "/slo.json").await.1).expect("JSON");
    assert!(v["pools"][0]["replicas"][0]["last_change"].as_str().is_some_and(|c| c.starts_with("brought back at ")), "{v}");
    assert_quiescent(&gw).await;
}

/// A replica whose connections are refused is taken out by the requests
/// that found it dead, without waiting for its active checks (here an hour
/// apart): after the first refused connect, no request is sent there.
#[tokio::test]
async fn a_replica_whose_connections_are_refused_is_taken_out_by_its_traffic() {
    let a = Mock::start(standard(1, Duration::ZERO)).await;
    let b = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[a.url(), b.url()]).pool("balance: round_robin").pool("health: { interval: 1h }").start().await;
    let admin = gw.admin_addr;
    let healthy = |url: String| async move { metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &url)]) };
    wait_until("both in", || async { healthy(a.url()).await == Some(1.0) && healthy(b.url()).await == Some(1.0) }).await;
    a.kill();
    for _ in 0..6 {
        assert_eq!(post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await.0, 200, "retried on b");
    }
    assert_eq!(healthy(a.url()).await, Some(0.0), "taken out by its traffic");
    let v: serde_json::Value = serde_json::from_str(&get(admin, "/slo.json").await.1).expect("JSON");
    let out = &v["pools"][0]["replicas"][0];
    assert!(out["last_change"].as_str().is_some_and(|c| c.contains("its traffic failed: could not connect")), "{out}");
    assert_eq!(b.calls(), 6, "every request was served by b");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn retry_before_first_byte_lands_on_the_other_replica() {
    let bad = Mock::start(Script::json(503, r#"{"error":"overloaded"}"#).always()).await;
    let good = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[bad.url(), good.url()], "    balance: round_robin\n")).await;
    for _ in 0..6 {
        let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
        assert_eq!(s, 200);
    }
    assert!(bad.calls() >= 1, "the failing replica was tried");
    assert_eq!(good.calls(), 6, "every request ended on the good replica");
    // Now a replica that refuses connections while still marked healthy.
    bad.kill();
    for _ in 0..4 {
        let (s, h, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
        assert_eq!(s, 200);
        // An unnamed replica is shown by its pool and position, never its URL.
        assert_eq!(h.get("x-slogate-replica").and_then(|v| v.to_str().ok()), Some("p-2"));
    }
    assert_eq!(requests_with_outcome(&gw, "ok").await, 10.0);
    assert_quiescent(&gw).await;
}

/// A replica written on raw TCP, for what hyper's server never does: it
/// reads a POST and closes the connection without a byte of answer when
/// `close(n)` says so for the connection's `n`th POST (from 1); otherwise
/// it answers a whole vLLM stream (with Content-Length) and keeps the
/// connection alive. GETs (health) get 200. Counts POSTs and the
/// connections that carried one.
struct RawReplica {
    addr: std::net::SocketAddr,
    posts: Arc<std::sync::atomic::AtomicUsize>,
    post_connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RawReplica {
    async fn start(close: fn(usize) -> bool) -> RawReplica {
        use std::sync::atomic::AtomicUsize;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (posts, post_connections) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (p, c) = (posts.clone(), post_connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(raw_connection(stream, close, p.clone(), c.clone()));
            }
        });
        RawReplica { addr, posts, post_connections, task }
    }
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst)
    }
}

impl Drop for RawReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn raw_connection(
    mut stream: tokio::net::TcpStream,
    close: fn(usize) -> bool,
    posts: Arc<std::sync::atomic::AtomicUsize>,
    post_connections: Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncWriteExt;
    let (mut buf, mut n) = (Vec::new(), 0);
    while let Some(head) = read_raw_request(&mut stream, &mut buf).await {
        let answer = if head.starts_with("post") {
            n += 1;
            if n == 1 {
                post_connections.fetch_add(1, Ordering::SeqCst);
            }
            posts.fetch_add(1, Ordering::SeqCst);
            if close(n) {
                return;
            }
            let body = [role_chunk(), content_chunk("a"), content_chunk("b"), finish_chunk("stop"), done()].concat();
            let mut a =
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
            a.extend_from_slice(&body);
            a
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()
        };
        if stream.write_all(&answer).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_kept_alive_connection_closed_as_the_request_arrives_is_sent_again_on_a_new_one() {
    // One replica. Each protocol's client sends two requests in turn: the
    // second goes out on the connection the first left idle, and the
    // replica closes it unanswered (its keep-alive timeout crossing the
    // request on the wire). With no other replica, the gateway sends it
    // again on a new connection, and the caller never knows.
    for (proto, client) in clients() {
        let replica = RawReplica::start(|n| n == 2).await;
        // No health check or scrape after the first: they would share the
        // replica's idle connections with the requests.
        let gw = gateway_config(&[replica.url()])
            .pool("health: { interval: 1h }")
            .pool("scrape_metrics: 0s")
            .pool("max_inflight_per_replica: 8")
            .start()
            .await;
        for i in 0..2 {
            let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("POST");
            assert_eq!(resp.status(), 200, "{proto}: request {i}");
            let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
            assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("error"), "{proto}: a whole stream: {text}");
        }
        assert_eq!(replica.posts(), 3, "{proto}: the closed request was sent once more");
        assert_eq!(replica.post_connections.load(Ordering::SeqCst), 2, "{proto}: on a new connection");
        assert_eq!(requests_with_outcome(&gw, "ok").await, 2.0, "{proto}");
        assert_eq!(requests_with_outcome(&gw, "upstream_error").await, 0.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn a_replica_that_closes_before_its_response_head_is_retried_on_another() {
    // The request reached the replica, which closed the connection without
    // a byte of answer (it died, or dropped the request): the caller still
    // has nothing, so the other replica serves it.
    for (proto, client) in clients() {
        let bad = RawReplica::start(|_| true).await;
        let good = Mock::start(standard(2, Duration::ZERO)).await;
        let gw = start_gateway(&config_yaml(&[bad.url(), good.url()], "    balance: round_robin\n")).await;
        for i in 0..4 {
            let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("POST");
            assert_eq!(resp.status(), 200, "{proto}: request {i}");
            let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
            assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("error"), "{proto}: a whole stream: {text}");
        }
        assert!(bad.posts() >= 1, "{proto}: the failing replica was tried");
        assert_eq!(good.calls(), 4, "{proto}: every request ended on the good replica");
        assert_eq!(requests_with_outcome(&gw, "ok").await, 4.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn a_replica_that_sends_no_response_head_in_time_is_replaced_by_another() {
    // The first replica a stream goes to hangs before its response head (a
    // hung process, a network that drops packets): at the first-token
    // timeout the request goes to the other replica, with the same budget
    // again, instead of a 504.
    for (proto, client) in clients() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hang_first = script(move |req| {
            let mut s = vllm_stream(req, 2, Duration::ZERO, "stop");
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                s.header_delay = Duration::from_secs(60);
            }
            s
        });
        let (a, b) = (Mock::start(hang_first.clone()).await, Mock::start(hang_first).await);
        let gw = gateway_config(&[a.url(), b.url()]).pool("timeouts: { first_token: 400ms }").start().await;
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("POST");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("error"), "{proto}: a whole stream: {text}");
        assert_eq!((a.calls(), b.calls()), (1, 1), "{proto}: one replica each");
        wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 1.0 }).await;
        assert_eq!(requests_with_outcome(&gw, "timeout").await, 0.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn streaming_first_token_timeout_before_headers_is_504() {
    let mock = Mock::start(script(|req| {
        let mut s = vllm_stream(req, 1, Duration::ZERO, "stop");
        s.header_delay = Duration::from_secs(30);
        s
    }))
    .await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "    timeouts: { first_token: 300ms }\n")).await;
    let (s, _, b) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(s, 504);
    error_body(&b);
    assert_eq!(requests_with_outcome(&gw, "timeout").await, 1.0);
    assert_eq!(metric(&metrics_text(&gw).await, "slogate_slo_breaches_total", &[("kind", "timeout")]), Some(1.0));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn models_are_the_union_across_pools_with_auto_discovery() {
    let auto = Mock::start_with_model("llama-8b", standard(1, Duration::ZERO)).await;
    let fixed = Mock::start(standard(1, Duration::ZERO)).await;
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\npools:\n  - name: fixed\n    models: [m1]\n    replicas: [{}]\n  - name: discovered\n    models: [auto]\n    replicas: [{}]\n",
        fixed.url(),
        auto.url()
    );
    let gw = start_gateway(&yaml).await;
    wait_until("discovered", || async { get(gw.data_addr, "/v1/models").await.1.contains("llama-8b") }).await;
    let (s, body) = get(gw.data_addr, "/v1/models").await;
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let ids: Vec<&str> = v["data"].as_array().expect("list").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, vec!["m1", "llama-8b"]);
    assert_eq!(v["data"][1]["max_model_len"], 4096, "discovered model objects are passed on as the replica gave them");
    let body = chat_body(false, false).replace("\"m1\"", "\"llama-8b\"");
    let (s, h, _) = post(&gw, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(h.get("x-slogate-replica").and_then(|v| v.to_str().ok()), Some("discovered-1"));
    assert_eq!((auto.calls(), fixed.calls()), (1, 0));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn embeddings_and_completions_are_forwarded() {
    let mock = Mock::start(script(|req| {
        if req.get("input").is_some() {
            Script::json(
                200,
                r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m1","usage":{"prompt_tokens":3,"total_tokens":3}}"#,
            )
        } else {
            let mut s = vllm_stream(req, 2, Duration::ZERO, "stop");
            s.steps[1] = Step::Send(event(r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":" the","finish_reason":null}]}"#));
            s
        }
    }))
    .await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    let (s, _, b) = post(&gw, "/v1/embeddings", r#"{"model":"m1","input":"abc"}"#, &[]).await;
    assert_eq!(s, 200);
    assert!(String::from_utf8_lossy(&b).contains("embedding"));
    let completion = r#"{"model":"m1","prompt":"a","stream":true}"#;
    let (s, _, via) = post(&gw, "/v1/completions", completion, &[]).await;
    assert_eq!(s, 200);
    // The client did not ask for usage: it gets exactly what the replica
    // sends such a client, with the usage slogate asked for cut out again.
    let (_, _, direct) = post(mock.addr, "/v1/completions", completion, &[]).await;
    assert_eq!(String::from_utf8_lossy(&via), String::from_utf8_lossy(&direct));
    assert!(!String::from_utf8_lossy(&via).contains("\"usage\""));
    assert!(mock.state.bodies.lock().expect("lock")[1].pointer("/stream_options/include_usage") == Some(&serde_json::Value::Bool(true)));
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(2.0));
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[]), Some(1.0), "completion text counts as content");
    assert_eq!(metric(&m, "slogate_prompt_tokens_total", &[]), Some(10.0));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn metrics_pass_promtool_check_metrics() {
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    post(&gw, "/v1/chat/completions", r#"{"model":"x"}"#, &[]).await;
    let text = metrics_text(&gw).await;
    for name in [
        "slogate_time_to_first_token_seconds",
        "slogate_inter_token_latency_seconds",
        "slogate_time_per_output_token_seconds",
        "slogate_e2e_request_latency_seconds",
        "slogate_queue_time_seconds",
        "slogate_requests_total",
        "slogate_slo_breaches_total",
        "slogate_prompt_tokens_total",
        "slogate_generation_tokens_total",
        "slogate_goodput_requests_total",
        "slogate_queue_depth",
        "slogate_inflight_requests",
        "slogate_upstream_healthy",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    let promtool = which("promtool").expect("promtool not found: run scripts/test, which installs Debian's prometheus package");
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_inflight_streams_finish() {
    let mock = Mock::start(standard(10, Duration::from_millis(50))).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    let addr = gw.data();
    let resp = client().request(post_req(addr, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("stream");
    assert_eq!(resp.status(), 200);
    let metrics = gw.metrics();
    let stopping = tokio::spawn(gw.shutdown());
    wait_until("listener closed", || async { tokio::net::TcpStream::connect(addr.addr).await.is_err() }).await;
    let body = resp.into_body().collect().await.expect("in-flight stream completes").to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("t9 ") && text.ends_with("data: [DONE]\n\n"), "{text}");
    tokio::time::timeout(Duration::from_secs(10), stopping).await.expect("shutdown finishes once drained").expect("join");
    let m = metrics.encode();
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(1.0));
}

/// Idle keep-alive connections, HTTP/1.1 and HTTP/2, are closed at
/// shutdown, which returns once they are: long before its grace.
#[tokio::test]
async fn shutdown_closes_idle_connections_of_both_protocols_and_returns_before_its_grace() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("shutdown_grace: 120s").server("header_read_timeout: 300s").start().await;
    let addr = gw.data();
    let tcp = || async move { TokioIo::new(tokio::net::TcpStream::connect(addr.addr).await.expect("connect")) };
    let (mut h1, h1_conn) = hyper::client::conn::http1::handshake(tcp().await).await.expect("HTTP/1.1");
    let h1_conn = tokio::spawn(h1_conn);
    let (mut h2, h2_conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), tcp().await).await.expect("HTTP/2");
    let h2_conn = tokio::spawn(h2_conn);
    for version in [hyper::Version::HTTP_11, hyper::Version::HTTP_2] {
        let mut req = post_req(addr, "/v1/chat/completions", &chat_body(false, false), &[]);
        *req.version_mut() = version;
        let resp = if version == hyper::Version::HTTP_2 { h2.send_request(req).await } else { h1.send_request(req).await };
        let resp = resp.expect("response");
        assert_eq!(resp.status(), 200, "{version:?}");
        resp.into_body().collect().await.expect("body");
    }
    // Both connections are open and idle; the gateway is told to stop.
    let stopped = tokio::time::timeout(Duration::from_secs(60), gw.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown waited for idle connections");
    for (what, conn) in [("HTTP/1.1", h1_conn), ("HTTP/2", h2_conn)] {
        let ended = tokio::time::timeout(Duration::from_secs(30), conn).await;
        assert!(matches!(ended, Ok(Ok(_))), "{what} connection closed by the gateway: {ended:?}");
    }
}

/// A gateway whose data listener serves TLS with a fresh self-signed
/// certificate for `localhost`; the certificate, and the directory holding it.
async fn tls_gateway(mock: &Mock, server: &[&str]) -> (Gw, rcgen::CertifiedKey, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (cert, cert_path, key_path) = self_signed_in(tmp.path());
    let mut c = gateway_config(&[mock.url()]).server(&format!("tls: {{ cert: {}, key: {} }}", cert_path.display(), key_path.display()));
    for f in server {
        c = c.server(f);
    }
    let gw = c.start().await;
    assert!(gw.tls);
    (gw, cert, tmp)
}

/// A TLS connection to `gw` trusting `cert`, offering `alpn`.
async fn tls_connect(gw: &Gw, cert: &rcgen::CertifiedKey, alpn: &[&[u8]]) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = tls_trusting(cert, alpn);
    let tcp = tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    connector.connect(name, tcp).await.expect("TLS handshake")
}

/// Over TLS the gateway serves each protocol a client can choose: none
/// chosen (told from its bytes), HTTP/1.1 and HTTP/2 chosen by ALPN (taken
/// at its word).
#[tokio::test]
async fn tls_listener_serves_https_whichever_protocol_the_client_chose() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let (gw, cert, _dir) = tls_gateway(&mock, &[]).await;
    for (what, alpn) in [("no ALPN", &[][..]), ("ALPN http/1.1", &[&b"http/1.1"[..]][..]), ("ALPN h2", &[&b"h2"[..]][..])] {
        let stream = TokioIo::new(tls_connect(&gw, &cert, alpn).await);
        let mut req = post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[]);
        let resp = if alpn == [b"h2"] {
            let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), stream).await.expect("HTTP/2");
            tokio::spawn(conn);
            *req.version_mut() = hyper::Version::HTTP_2;
            sender.send_request(req).await
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(stream).await.expect("HTTP/1.1");
            tokio::spawn(conn);
            sender.send_request(req).await
        };
        let resp = resp.expect("response");
        assert_eq!(resp.status(), 200, "{what}");
        let want = if alpn == [b"h2"] { hyper::Version::HTTP_2 } else { hyper::Version::HTTP_11 };
        assert_eq!(resp.version(), want, "{what}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"), "{what}");
    }
    assert_quiescent(&gw).await;
}

/// Over TLS, where the HTTP/2 preface cannot be peeked at, a connection
/// that completes no request head within `server.header_read_timeout` is
/// closed too: nothing sent, half a head, half the preface.
#[tokio::test]
async fn tls_connections_without_a_request_head_are_closed_after_the_header_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let (gw, cert, _dir) = tls_gateway(&mock, &["header_read_timeout: 300ms"]).await;
    for (what, alpn, sent) in [
        ("nothing", &[&b"h2"[..]][..], &b""[..]),
        ("half the HTTP/2 preface", &[&b"h2"[..]][..], &b"PRI * HTTP/2.0\r\n"[..]),
        ("half a request head", &[&b"http/1.1"[..]][..], &b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"[..]),
    ] {
        let mut s = tls_connect(&gw, &cert, alpn).await;
        s.write_all(sent).await.expect("write");
        s.flush().await.expect("flush");
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "{what}: the gateway closes the connection");
        assert!(!String::from_utf8_lossy(&buf).contains("200"), "{what}");
    }
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_a_cancelled_one_is_not_reused() {
    let mock = Mock::start(script(|req| {
        if req.get("stream").and_then(|v| v.as_bool()) == Some(true) {
            let gap = if req["max_tokens"] == 1000 { Duration::from_secs(60) } else { Duration::ZERO };
            vllm_stream(req, 3, gap, "stop")
        } else {
            json_answer("hi", "stop", 5, 1)
        }
    }))
    .await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    for i in 0..6 {
        let (s, _, body) = post(&gw, "/v1/chat/completions", &chat_body(i % 2 == 0, false), &[]).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(mock.calls(), 6);
    // Streams and whole answers read differently (4 KiB at a time, or a
    // buffer that grows), so each kind keeps its own connection.
    assert_eq!(
        mock.state.post_connections.load(Ordering::SeqCst),
        2,
        "six requests one after another, streams and whole answers in turn, share one upstream connection of each kind"
    );

    // A client that hangs up mid-stream: that connection is closed (the
    // replica must stop generating), so the next request needs a new one.
    let slow = r#"{"model":"m1","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = client().request(post_req(&gw, "/v1/chat/completions", slow, &[])).await.expect("stream");
    let mut body = resp.into_body();
    body.frame().await.expect("first frame").expect("ok");
    drop(body);
    wait_until("replica sees the cancellation", || async { mock.state.cancelled.load(Ordering::SeqCst) == 1 }).await;
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(s, 200);
    assert_eq!(mock.state.post_connections.load(Ordering::SeqCst), 3, "the next stream opens a new connection");
    assert_eq!(requests_with_outcome(&gw, "ok").await, 7.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_replica_that_closes_idle_connections_costs_no_request() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    for round in 1..=3 {
        let (s, _, body) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
        let text = String::from_utf8_lossy(&body);
        assert_eq!(s, 200, "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(mock.state.post_connections.load(Ordering::SeqCst), round, "round {round} went on a new connection");
        // The connection the gateway keeps for the next request is closed under it.
        mock.close_idle_connections();
        wait_until("the replica closed the idle connection", || async {
            mock.state.closed_post_connections.load(Ordering::SeqCst) == round
        })
        .await;
    }
    assert_eq!(requests_with_outcome(&gw, "ok").await, 3.0);
    assert_quiescent(&gw).await;
}

/// One request's place in the prefill-aware routing test: which replica it
/// reached (its mock's call count grew) and its open body.
async fn open_stream(c: &TestClient, gw: &Gw, a: &Mock, b: &Mock) -> (bool, hyper::body::Incoming) {
    let before = a.calls();
    let resp = c.request(post_req(gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
    assert_eq!(resp.status(), 200);
    let on_a = a.calls() > before;
    assert!(on_a || b.calls() > 0, "reached one of the replicas");
    let mut body = resp.into_body();
    if on_a {
        // Replica A sends a first token at once: read until it is through the gateway.
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("tok") {
            let frame = body.frame().await.expect("frame").expect("ok frame");
            if let Ok(d) = frame.into_data() {
                seen.extend_from_slice(&d);
            }
        }
    }
    (on_a, body)
}

#[tokio::test]
async fn least_loaded_sends_a_request_where_fewer_prefills_wait_not_where_fewer_stream() {
    for (proto, c) in clients() {
        // A: first token at once, then the stream stays open. B: no first token until released.
        let (gate_a, gate_b) = (Gate::default(), Gate::default());
        let a = Mock::start(
            Script::sse(vec![
                Step::Send(role_chunk()),
                Step::Send(content_chunk("tok")),
                Step::Until(gate_a.clone()),
                Step::Send(finish_chunk("stop")),
                Step::Send(done()),
            ])
            .always(),
        )
        .await;
        let b = Mock::start(
            Script::sse(vec![
                Step::Send(role_chunk()),
                Step::Until(gate_b.clone()),
                Step::Send(content_chunk("late")),
                Step::Send(finish_chunk("stop")),
                Step::Send(done()),
            ])
            .always(),
        )
        .await;
        let gw = start_gateway(&config_yaml(&[a.url(), b.url()], "    balance: least_loaded\n")).await;
        let healthy = |url: String| {
            let admin = gw.admin_addr;
            async move { metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &url)]) }
        };
        wait_until("both healthy", || async { healthy(a.url()).await == Some(1.0) && healthy(b.url()).await == Some(1.0) }).await;
        let (a0, b0) = (a.calls(), b.calls());
        let mut open = Vec::new();
        for _ in 0..4 {
            open.push(open_stream(&c, &gw, &a, &b).await);
        }
        // One request each first; then B has one waiting for its first token
        // and A only streams: A takes the rest, though it streams more.
        assert_eq!((a.calls() - a0, b.calls() - b0), (3, 1), "{proto}: three on A, one on B");
        let (_, slo) = get(gw.admin_addr, "/slo.json").await;
        let slo: serde_json::Value = serde_json::from_str(&slo).expect("JSON");
        let replica = |url: &str| {
            slo["pools"][0]["replicas"].as_array().expect("replicas").iter().find(|r| r["url"] == url).cloned().expect("listed")
        };
        let (ra, rb) = (replica(&a.url()), replica(&b.url()));
        assert_eq!((ra["inflight"].as_u64(), ra["prefilling"].as_u64()), (Some(3), Some(0)), "{proto}: {ra}");
        assert_eq!((rb["inflight"].as_u64(), rb["prefilling"].as_u64()), (Some(1), Some(1)), "{proto}: {rb}");
        gate_a.open();
        gate_b.open();
        for (_, body) in open {
            body.collect().await.expect("stream completes");
        }
        wait_until("every slot and prefill count back to zero", || async {
            let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
            slo["pools"][0]["replicas"].as_array().expect("replicas").iter().all(|r| r["inflight"] == 0 && r["prefilling"] == 0)
        })
        .await;
        assert_quiescent(&gw).await;
    }
}
