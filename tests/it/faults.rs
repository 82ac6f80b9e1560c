//! Faults under load: replicas that die mid-run, hang after their headers,
//! or answer 200 with something that is not what was asked. Every request
//! ends, the client learns what happened, and each is counted exactly once
//! with the outcome the client saw.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;

/// How one request ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Seen {
    Done,
    ErrorEvent,
    Status(u16),
}

async fn stream_once(c: &TestClient, addr: Target) -> Seen {
    let resp = c.request(post_req(addr, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("a response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("every body ends cleanly").to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    match status {
        200 if text.contains("\"error\":") => {
            assert!(text.ends_with("data: [DONE]\n\n"), "an error event ends the stream: {text}");
            Seen::ErrorEvent
        }
        200 => {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            assert_eq!(text.matches("\"role\"").count(), 1, "one role chunk: {text}");
            Seen::Done
        }
        s => Seen::Status(s),
    }
}

/// Eight clients, five streams each, over both protocols; replica A is
/// killed while streams run on it. Streams already running on A go on
/// from B (continued there); requests that had not reached A go to B.
/// Every client gets a whole stream with one role chunk and no error, and
/// the counts match: every request `ok`, one continuation per cut stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_loses_no_stream() {
    // Fewer tokens than the request's max_tokens (16), as an engine sends:
    // a stream cut after all it asked for has nothing left to continue.
    let a = Arc::new(Mock::start(standard(12, Duration::from_millis(30))).await);
    let b = Mock::start(standard(12, Duration::from_millis(30))).await;
    let gw = gateway_config(&[a.url(), b.url()]).pool("balance: round_robin").start().await;
    let addr = gw.data();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                let c = if i % 2 == 0 { client() } else { client_h2() };
                let mut seen = Vec::new();
                for _ in 0..5 {
                    seen.push(stream_once(&c, addr).await);
                }
                seen
            })
        })
        .collect();
    let streaming_on_a = || a.calls() - a.state.completed.load(std::sync::atomic::Ordering::SeqCst);
    wait_until("streams running on A", || async { streaming_on_a() >= 2 }).await;
    let cut = streaming_on_a();
    a.kill();
    let mut seen = Vec::new();
    for c in clients {
        seen.extend(c.await.expect("client"));
    }
    assert_eq!(seen, vec![Seen::Done; 40], "every stream whole, none with an error");
    wait_until("every request counted", || async { requests_with_outcome(&gw, "ok").await == 40.0 }).await;
    let m = metrics_text(&gw).await;
    // The streams on A that had their response head were continued; any
    // still waiting for it were sent to B by the sending stage.
    let resumed = metric(&m, "slogate_stream_resumes_total", &[]).unwrap_or(0.0);
    assert!((1.0..=a.calls() as f64).contains(&resumed), "streams cut on A were continued: {resumed} ({cut} ran there at the kill)");
    assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[]), None, "none was left cut");
    assert_quiescent(&gw).await;
}

/// A replica that sends its headers and then nothing: each stream ends at
/// the first-token timeout with an error event, counted `timeout`, and the
/// slots come back.
#[tokio::test]
async fn a_replica_that_hangs_after_its_headers_ends_each_stream_at_the_first_token_timeout() {
    let mock = Mock::start(Script::sse(vec![Step::Wait(Duration::from_secs(120))]).always()).await;
    let gw = gateway_config(&[mock.url()]).pool("timeouts: { first_token: 500ms }").pool("max_inflight_per_replica: 8").start().await;
    let addr = gw.data();
    let runs: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                let c = if i % 2 == 0 { client() } else { client_h2() };
                stream_once(&c, addr).await
            })
        })
        .collect();
    for r in runs {
        assert_eq!(r.await.expect("client"), Seen::ErrorEvent);
    }
    assert_eq!(requests_with_outcome(&gw, "timeout").await, 8.0);
    wait_until("the replica saw every request cancelled", || async { mock.state.cancelled.load(std::sync::atomic::Ordering::SeqCst) == 8 })
        .await;
    assert_quiescent(&gw).await;
}

/// A replica that answers 200 with something that is not the answer asked
/// for: an HTML page for a stream, garbage with an event-stream type. The
/// client gets what came; the request is not counted `ok`.
#[tokio::test]
async fn a_replica_answering_200_with_garbage_is_not_counted_ok() {
    let page = Script {
        status: 200,
        content_type: "text/html",
        header_delay: Duration::ZERO,
        steps: vec![Step::Send("<html>gateway timeout</html>".into())],
    };
    let mock = Mock::start(page.always()).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    for (proto, c) in clients() {
        for stream in [true, false] {
            let resp = c.request(post_req(&gw, "/v1/chat/completions", &chat_body(stream, false), &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"<html>gateway timeout</html>", "{proto}: passed on as it came");
        }
    }
    assert_eq!(requests_with_outcome(&gw, "upstream_error").await, 4.0);
    assert_eq!(requests_with_outcome(&gw, "ok").await, 0.0);

    // Bytes that are no events, under an event-stream type: no [DONE].
    mock.set_script(Script::sse(vec![Step::Send(bytes::Bytes::from_static(b"\x00\x01garbage\xff\n\n"))]).always());
    for (proto, c) in clients() {
        let resp = c.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"\x00\x01garbage\xff\n\n", "{proto}: passed on as it came");
    }
    assert_eq!(requests_with_outcome(&gw, "stream_error").await, 2.0);
    assert_quiescent(&gw).await;
}

/// A replica delivering tokens is alive: while it streams, health checks
/// that time out under its load do not take it out (the status page says
/// why it is kept in); idle and still failing, it is taken out.
#[tokio::test]
async fn a_replica_streaming_tokens_is_not_taken_out_by_a_slow_health_check() {
    let gate = Gate::default();
    let g = gate.clone();
    let mock = Mock::start(script(move |req| {
        // A long stream: a token every 20 ms until the test opens the gate.
        let mut steps = vec![Step::Send(role_chunk())];
        for _ in 0..400 {
            steps.push(Step::Send(content_chunk("tok")));
            steps.push(Step::Wait(Duration::from_millis(20)));
        }
        steps.push(Step::Until(g.clone()));
        steps.push(Step::Send(finish_chunk("stop")));
        if wants_usage(req) {
            steps.push(Step::Send(usage_chunk(5, 400)));
        }
        steps.push(Step::Send(done()));
        Script::sse(steps)
    }))
    .await;
    let gw = gateway_config(&[mock.url()])
        .pool("health: { interval: 100ms, timeout: 50ms, unhealthy_after: 2, healthy_after: 2 }")
        .start()
        .await;
    let addr = gw.data();
    let stream = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await.0 });
    *mock.state.health_delay.lock().expect("lock") = Duration::from_secs(2);
    let admin = gw.admin_addr;
    let reason = || async move {
        let (_, slo) = get(admin, "/slo.json").await;
        let v: serde_json::Value = serde_json::from_str(&slo).expect("JSON");
        (v["pools"][0]["replicas"][0]["healthy"].as_bool(), v["pools"][0]["replicas"][0]["reason"].as_str().map(str::to_string))
    };
    // The checks fail (time out) while tokens flow: it is kept in, and says why.
    wait_until("failed checks while streaming", || async { reason().await.1.is_some_and(|r| r.contains("kept in")) }).await;
    // Six more checks time out (two would take an idle replica out): still in.
    let checks = || mock.state.health_checks.load(std::sync::atomic::Ordering::SeqCst);
    let from = checks();
    wait_until("six more failed checks", || async { checks() >= from + 6 }).await;
    assert_eq!(reason().await.0, Some(true), "taken out while it streams");
    assert!(!stream.is_finished(), "the stream still runs");
    // The stream ends; idle, the failing checks take it out.
    gate.open();
    assert_eq!(stream.await.expect("task"), 200);
    wait_until("taken out once idle", || async { reason().await.0 == Some(false) }).await;
    *mock.state.health_delay.lock().expect("lock") = Duration::ZERO;
    wait_until("back", || async { reason().await.0 == Some(true) }).await;
    assert_quiescent(&gw).await;
}
