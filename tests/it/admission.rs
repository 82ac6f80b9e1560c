//! Admission control through the real gateway: the queue (wait, full,
//! timeout, shed, cancel while queued), the TTFT breaker (429 +
//! Retry-After, half-open, closed again), context reduction (the rewrite
//! reaches the replica and the header says so), upstream priority.

use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use serde_json::json;

async fn gauge(gw: &Gw, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(&metrics_text(gw).await, name, labels).unwrap_or(-1.0)
}

async fn queued(gw: &Gw, tier: &str) -> f64 {
    gauge(gw, "slogate_queue_depth", &[("tier", tier)]).await
}

#[tokio::test]
async fn queued_request_waits_for_the_slot_and_says_how_long() {
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").start().await;
    let held = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let waiter = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[]).await });
    wait_until("the second request is queued", || async { queued(&gw, "interactive").await == 1.0 }).await;
    assert_eq!(mock.calls(), 1, "a queued request must not reach the replica");
    assert!(!waiter.is_finished(), "no answer while the slot is held");
    held.release().await;
    let (s, h, _) = waiter.await.expect("task");
    assert_eq!(s, 200);
    let queued_ms: u64 = header(&h, "x-slogate-queue-ms").and_then(|v| v.parse().ok()).expect("x-slogate-queue-ms");
    assert!(queued_ms >= 1, "it waited for the stream holding the slot, header says {queued_ms} ms");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_queue_depth", &[("tier", "interactive")]), Some(0.0));
    assert_eq!(metric(&m, "slogate_queue_time_seconds_count", &[("class", "chat")]), Some(2.0));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 1")
        // Queue semantics: a waiter waits for the held slot, past chat's TTFT target.
        .section("tiers:\n  interactive: { queue_capacity: 1, shed_late: false }")
        .start()
        .await;
    let held = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let waiter = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[]).await });
    wait_until("one request is queued", || async { queued(&gw, "interactive").await == 1.0 }).await;
    let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    assert_eq!(s, 429);
    // No drain measured yet: a second, spread over up to a quarter more.
    let ms: u64 = header(&h, "retry-after-ms").and_then(|v| v.parse().ok()).expect("retry-after-ms");
    assert!((1000..=1250).contains(&ms), "{ms}");
    assert_eq!(header(&h, "retry-after"), Some(if ms > 1000 { "2" } else { "1" }));
    assert_eq!(error_code(&b), "queue_full");
    held.release().await;
    assert_eq!(waiter.await.expect("task").0, 200);
    assert_eq!(requests_with_outcome(&gw, "rejected").await, 1.0);
    assert_quiescent(&gw).await;
}

/// Bodies waiting in the queue count against `queue_max_bytes`: a request
/// whose body would take the waiting bytes past it is 429 though the queue
/// has room by count; the ones that waited are served. HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn waiting_bodies_past_queue_max_bytes_are_429() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .server("max_request_body: 1MiB")
        .server("max_upload_body: 1MiB")
        .pool("max_inflight_per_replica: 1")
        .section("tiers:\n  interactive: { queue_capacity: 100, queue_max_bytes: 1MiB, shed_late: false }")
        .start()
        .await;
    let held = mock.hold_slot(&gw).await;
    let big = chat_body(false, false).replace("\"content\":\"", &format!("\"content\":\"{}", "x".repeat(600 << 10)));
    let [(_, h1), (_, h2)] = clients();
    let send = |c: &TestClient, body: &str| c.request(post_req(&gw, "/v1/chat/completions", body, &[]));
    let waiting_big = tokio::spawn(send(&h1, &big));
    wait_until("the big body waits", || async { queued(&gw, "interactive").await == 1.0 }).await;
    let waiting_small = tokio::spawn(send(&h2, &chat_body(false, false)));
    wait_until("the small body waits too", || async { queued(&gw, "interactive").await == 2.0 }).await;
    for (proto, c) in [("HTTP/1.1", &h1), ("HTTP/2", &h2)] {
        let resp = send(c, &big).await.expect("response");
        assert_eq!(resp.status(), 429, "{proto}: 600 KiB waiting + 600 KiB > 1 MiB");
        assert!(matches!(header(resp.headers(), "retry-after"), Some("1" | "2")), "{proto}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(error_code(&body), "queue_full");
        assert!(error_body(&body)["message"].as_str().is_some_and(|m| m.contains("queue_max_bytes")), "{proto}");
    }
    held.release().await;
    for w in [waiting_big, waiting_small] {
        let resp = w.await.expect("task").expect("response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
    }
    assert_eq!(requests_with_outcome(&gw, "rejected").await, 2.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn queue_timeout_is_429_not_before_the_queue_timeout() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 1")
        .section("tiers:\n  interactive: { queue_timeout: 300ms }")
        .start()
        .await;
    let held = mock.hold_slot(&gw).await;
    let start = tokio::time::Instant::now();
    let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    let waited = start.elapsed();
    assert_eq!(s, 429);
    // The slot stays held (the gate is shut), so only the timeout can end
    // the wait: never before it; the upper bound is only a generous sanity check.
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(30), "refused after {waited:?}");
    let retry: u64 = header(&h, "retry-after").and_then(|v| v.parse().ok()).expect("Retry-After in whole seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(error_code(&b), "queue_timeout");
    held.release().await;
    assert_eq!(requests_with_outcome(&gw, "rejected").await, 1.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn client_hanging_up_while_queued_leaves_the_queue_and_never_reaches_the_replica() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").start().await;
    let held = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let gone = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[]).await });
    wait_until("queued", || async { queued(&gw, "interactive").await == 1.0 }).await;
    gone.abort();
    wait_until("left the queue", || async { queued(&gw, "interactive").await == 0.0 }).await;
    held.release().await;
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    assert_eq!(s, 200, "the slot was not lost");
    assert_eq!(mock.calls(), 2);
    wait_until("the cancellation is counted", || async { requests_with_outcome(&gw, "cancelled").await == 1.0 }).await;
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn batch_is_shed_while_interactive_waits() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 1")
        .section("tiers:\n  interactive: { reserved_share: 0 }")
        .start()
        .await;
    let held = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let waiter = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[]).await });
    wait_until("interactive queued", || async { queued(&gw, "interactive").await == 1.0 }).await;
    let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[("x-slo-class", "batch")]).await;
    assert_eq!(s, 429);
    assert!(header(&h, "retry-after").is_some_and(|v| v.parse::<u64>().is_ok_and(|n| n >= 1)));
    assert_eq!(error_code(&b), "shed");
    held.release().await;
    assert_eq!(waiter.await.expect("task").0, 200);
    assert_quiescent(&gw).await;
}

/// Chat's TTFT target is 20 ms (for context reduction's trigger; the
/// breaker test sets its own, wider, targets).
const SLOW_CHAT: &str = "classes:\n  chat: { tier: interactive, ttft: 20ms, itl: 50ms }\n  batch: { tier: batch, ttft: 3s, itl: 200ms }";

fn slow_first_token(delay: Duration) -> ScriptFn {
    script(move |req| {
        let mut s = vllm_stream(req, 2, Duration::ZERO, "stop");
        s.steps.insert(0, Step::Wait(delay));
        s
    })
}

/// Margins wide enough for a loaded machine: chat's TTFT target is 1 s, a
/// slow replica takes 2.5 s (over 2x), a recovered one answers at once; the
/// breaker stays open 5 s, time enough to see its 429.
#[tokio::test]
async fn open_breaker_answers_429_with_retry_after_then_probes_close_it() {
    let mock = Mock::start(slow_first_token(Duration::from_millis(2500))).await;
    let gw = gateway_config(&[mock.url()])
        .section("classes:\n  chat: { tier: interactive, ttft: 1s, itl: 50ms }\n  batch: { tier: batch, ttft: 3s, itl: 200ms }")
        .section("breaker: { trip_after: 1ms, min_samples: 3, retry_after: 5s }")
        .section("context_reduction: { trigger_ratio: 1000 }")
        .start()
        .await;
    let addr = gw.data();
    let slow: Vec<_> =
        (0..3).map(|_| tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await.0 })).collect();
    for s in slow {
        assert_eq!(s.await.expect("task"), 200);
    }
    wait_until("breaker open", || async { gauge(&gw, "slogate_breaker_state", &[("class", "chat")]).await == 2.0 }).await;
    let p99 = gauge(&gw, "slogate_ttft_p99_seconds", &[("class", "chat")]).await;
    assert!(p99 >= 2.5, "ttft_p99_seconds {p99}");
    let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(s, 429);
    // Until it half-opens (5 s at most), spread over one more open period and a quarter more.
    let ms: u64 = header(&h, "retry-after-ms").and_then(|v| v.parse().ok()).expect("retry-after-ms");
    assert!((1000..=12_500).contains(&ms), "{ms}");
    assert_eq!(header(&h, "retry-after").and_then(|v| v.parse::<u64>().ok()), Some(ms.div_ceil(1000)));
    assert_eq!(error_code(&b), "breaker_open");
    let msg = String::from_utf8_lossy(&b).to_string();
    assert!(msg.contains("`chat`") && msg.contains("TTFT P99"), "{msg}");
    assert_eq!(mock.calls(), 3, "refused requests never reach the replica");
    // Other classes are not affected.
    mock.set_script(standard(2, Duration::ZERO));
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[("x-slo-class", "batch")]).await;
    assert_eq!(s, 200);

    // The replica recovers; after retry_after the breaker is half-open and
    // its probes close it: judged at their first token (at once now), not at
    // the end of their streams (which take 3 s, 3x the target).
    mock.set_script(script(|req| {
        let mut s = vllm_stream(req, 3, Duration::from_secs(1), "stop");
        s.steps.remove(1); // no wait before the first token
        s
    }));
    wait_until("half-open", || async { gauge(&gw, "slogate_breaker_state", &[("class", "chat")]).await == 1.0 }).await;
    let probes: Vec<_> =
        (0..5).map(|_| tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await.0 })).collect();
    wait_until("closed by its probes' first tokens", || async { gauge(&gw, "slogate_breaker_state", &[("class", "chat")]).await == 0.0 })
        .await;
    for p in probes {
        assert_eq!(p.await.expect("task"), 200);
    }
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(s, 200);
    assert_eq!(requests_with_outcome(&gw, "rejected").await, 1.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn context_reduction_rewrites_the_request_and_says_so() {
    let mock = Mock::start(slow_first_token(Duration::from_millis(100))).await;
    let gw = gateway_config(&[mock.url()])
        .section(SLOW_CHAT)
        .section("breaker: { trip_ratio: 1000, min_samples: 3 }")
        .section(
            "context_reduction: { trigger_ratio: 1.0, trigger_after: 1ms, max_tokens_cap: 16, max_documents: 1, max_prompt_tokens: 60 }",
        )
        .start()
        .await;
    // Before the trigger: untouched, no header.
    let long = "word ".repeat(40); // 50 tokens + framing
    let body = json!({
        "model": "m1", "stream": true, "max_tokens": 1000, "top_k": 5,
        "documents": [{"text": "a"}, {"text": "b"}, {"text": "c"}],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": long},
            {"role": "assistant", "content": long},
            {"role": "user", "content": "and now?"},
        ]
    })
    .to_string();
    let (s, h, _) = post(&gw, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(s, 200);
    assert!(h.get("x-slogate-context-reduced").is_none());
    for _ in 0..3 {
        post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    }
    wait_until("reduction active", || async { gauge(&gw, "slogate_context_reduction_active", &[("class", "chat")]).await == 1.0 }).await;
    let (s, h, _) = post(&gw, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(header(&h, "x-slogate-context-reduced"), Some("max_tokens=1000->16; documents=3->1; messages=4->2"));
    let sent = mock.state.bodies.lock().expect("bodies").last().cloned().expect("a body");
    assert_eq!(sent["max_tokens"], 16);
    assert_eq!(sent["documents"], json!([{"text": "a"}]));
    assert_eq!(sent["top_k"], 5, "unknown fields survive");
    let roles: Vec<&str> = sent["messages"].as_array().into_iter().flatten().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["system", "user"]);
    assert_eq!(sent["messages"][1]["content"], "and now?");
    // A batch request is another class: not reduced.
    let (_, h, _) = post(&gw, "/v1/chat/completions", &body, &[("x-slo-class", "batch")]).await;
    assert!(h.get("x-slogate-context-reduced").is_none());
    assert_eq!(metric(&metrics_text(&gw).await, "slogate_context_reduced_requests_total", &[("class", "chat")]), Some(1.0));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn upstream_priority_passes_the_tier_to_vllm() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).pool("upstream_priority: true").start().await;
    post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    post(&gw, "/v1/chat/completions", &chat_body(true, false), &[("x-slo-class", "batch")]).await;
    let bodies = mock.state.bodies.lock().expect("bodies").clone();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["priority"], 0);
    assert_eq!(bodies[1]["priority"], 1);
    assert_quiescent(&gw).await;
}

/// A gateway that keeps queued streams alive `every` interval, one slot
/// (held for minutes, of paused time too: the replica's timeouts are
/// longer), the interactive queue holding a request up to `queue_timeout`.
async fn keepalive_gateway(mock: &Mock, every: &str, queue_timeout: &str) -> Gw {
    gateway_config(&[mock.url()])
        .server(&format!("queued_keepalive: {every}"))
        .pool("max_inflight_per_replica: 1")
        .pool("timeouts: { first_token: 10m, idle: 10m }")
        .section(&format!("tiers:\n  interactive: {{ queue_timeout: {queue_timeout}, shed_late: false }}"))
        .start()
        .await
}

/// The next data frame of a response body, as text.
async fn next_text(body: &mut hyper::body::Incoming) -> String {
    loop {
        let frame = body.frame().await.expect("a frame").expect("ok frame");
        if let Ok(d) = frame.into_data() {
            return String::from_utf8_lossy(&d).into_owned();
        }
    }
}

/// With `queued_keepalive`, a stream that waits in the queue gets its 200
/// headers and a comment once it has waited the interval, another every
/// interval, then its events when it gets a slot; the comments do not stop
/// the TTFT clock.
///
/// Real time, at the shortest interval (1 s): paused time moves on to the
/// next timer whenever the runtime waits, also while bytes are still
/// crossing a socket, so it could fire the gateway's body-read timeout
/// before an HTTP/2 body arrived, or a comment before the one before it was
/// read. Every time is bounded from below, where a timer makes it exact;
/// from above only generously.
#[tokio::test]
async fn keepalive_comments_a_queued_stream_until_its_tokens_and_its_ttft_counts_the_wait() {
    for (proto, client) in clients() {
        let mock = Mock::start(standard(3, Duration::ZERO)).await;
        let gw = keepalive_gateway(&mock, "1s", "100s").await;
        let held = mock.hold_slot(&gw).await;
        let start = tokio::time::Instant::now();
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
        let headers_at = start.elapsed();
        assert_eq!(resp.status(), 200, "{proto}");
        assert!(
            headers_at >= Duration::from_secs(1) && headers_at < Duration::from_secs(30),
            "{proto}: headers after {headers_at:?}: not at the first interval"
        );
        assert_eq!(header(resp.headers(), "content-type"), Some("text/event-stream"), "{proto}");
        assert_eq!(header(resp.headers(), "x-slogate-keepalive"), Some("queued"), "{proto}");
        assert_eq!(queued(&gw, "interactive").await, 1.0, "{proto}: still queued");
        let mut body = resp.into_body();
        assert_eq!(next_text(&mut body).await, ": queued\n\n", "{proto}");
        assert_eq!(next_text(&mut body).await, ": queued\n\n", "{proto}");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(2), "{proto}: the second comment after {waited:?}, before two intervals");
        held.release().await;
        let rest = body.collect().await.expect("the stream completes").to_bytes();
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.contains("\"content\"") && rest.ends_with("data: [DONE]\n\n"), "{proto}: {rest}");
        let first_event = rest.find("data: ").expect("events");
        assert!(!rest[first_event..].contains(": queued"), "{proto}: no comment once events flow: {rest}");
        let m = metrics_text(&gw).await;
        let ttft = |what: &str| metric(&m, &format!("slogate_time_to_first_token_seconds_{what}"), &[("class", "chat")]).unwrap_or(0.0);
        assert_eq!(ttft("count"), 2.0, "{proto}: the holder's TTFT and the queued stream's");
        // The holder's first content came at its release, after `waited`;
        // the queued stream's after its second comment, two intervals after
        // it was queued. A clock stopped by the first comment would give
        // the queued stream about one interval.
        let floor = waited.as_secs_f64() + 2.0;
        assert!(ttft("sum") >= floor, "{proto}: the comments stopped a TTFT clock: sum {} < {floor}", ttft("sum"));
        assert_eq!(requests_with_outcome(&gw, "ok").await, 2.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}

/// A stream refused after its headers went out ends with the error event
/// the 429 would have carried (same code), counted as rejected; a
/// non-streaming request is never answered early.
///
/// Time is paused once the request is queued, not before: paused time
/// moves on to the next timer whenever the runtime waits, also while a
/// request's bytes are still on their way through a socket, so the clock
/// could jump between the request's arrival and its entering the queue.
#[tokio::test]
async fn keepalive_stream_refused_after_its_headers_ends_with_the_429s_error_event() {
    for (proto, client) in clients() {
        let mock = Mock::start(standard(3, Duration::ZERO)).await;
        let gw = keepalive_gateway(&mock, "15s", "40s").await;
        let held = mock.hold_slot(&gw).await;
        let start = tokio::time::Instant::now();
        let sent = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[]));
        let resp = tokio::spawn(sent);
        wait_until("queued", || async { queued(&gw, "interactive").await == 1.0 }).await;
        tokio::time::pause();
        let resp = resp.await.expect("client").expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        let ended = start.elapsed();
        assert!(ended >= Duration::from_secs(40), "{proto}: refused at {ended:?}, before the 40 s queue timeout");
        // When the gateway refused, by its own clock: after the comments at
        // 15 and 30 s, before a third at 45 s. (The client's clock cannot
        // bound it from above, for the reason above.)
        assert_eq!(text.matches(": queued\n\n").count(), 2, "{proto}: a comment every 15 s of the 40 s: {text}");
        let (comments, last) = text.split_at(text.rfind(": queued\n\n").expect("comments") + ": queued\n\n".len());
        assert!(comments.replace(": queued\n\n", "").is_empty(), "{proto}: only comments before the end: {text}");
        let data =
            last.strip_prefix("data: ").and_then(|r| r.strip_suffix("\n\ndata: [DONE]\n\n")).unwrap_or_else(|| panic!("{proto}: {last}"));
        assert_eq!(error_code(data.as_bytes()), "queue_timeout", "{proto}");
        assert_eq!(requests_with_outcome(&gw, "rejected").await, 1.0, "{proto}");

        // Not a stream: the 429 itself, at the queue timeout, not before.
        let start = tokio::time::Instant::now();
        let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
        assert_eq!((s, error_code(&b).as_str()), (429, "queue_timeout"), "{proto}");
        let refused = start.elapsed();
        assert!(refused >= Duration::from_secs(40), "{proto}: 429 at {refused:?}");
        assert!(String::from_utf8_lossy(&b).contains("queue timeout of 40s"), "{proto}: {}", String::from_utf8_lossy(&b));
        assert!(header(&h, "retry-after").is_some() && header(&h, "x-slogate-keepalive").is_none(), "{proto}");
        tokio::time::resume();
        held.release().await;
        assert_eq!(requests_with_outcome(&gw, "rejected").await, 2.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}

/// A client that hangs up while its queued stream gets comments leaves
/// the queue at once, counted as cancelled. (Real time, for the reason
/// the first keep-alive test gives.)
#[tokio::test]
async fn keepalive_client_gone_while_queued_leaves_the_queue() {
    for (proto, client) in clients() {
        let mock = Mock::start(standard(3, Duration::ZERO)).await;
        let gw = keepalive_gateway(&mock, "1s", "100s").await;
        let held = mock.hold_slot(&gw).await;
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
        let mut body = resp.into_body();
        assert_eq!(next_text(&mut body).await, ": queued\n\n", "{proto}");
        assert_eq!(queued(&gw, "interactive").await, 1.0, "{proto}");
        drop(body);
        drop(client);
        wait_until("the hung-up stream leaves the queue", || async { queued(&gw, "interactive").await == 0.0 }).await;
        held.release().await;
        assert_eq!(requests_with_outcome(&gw, "cancelled").await, 1.0, "{proto}");
        assert_eq!(mock.calls(), 1, "{proto}: only the holder reached the replica");
        assert_quiescent(&gw).await;
    }
}
