//! The gateway at the edge: clients and replicas that behave as real ones
//! do, including the ones that misbehave. Driven over HTTP/1.1 and HTTP/2.

use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;

/// vLLM answers a non-streaming request with one body and `Content-Length`.
/// Such an answer ends with its last frame (a server may never poll the
/// body again): it must be counted `ok`, with its latency and tokens, not
/// `cancelled`.
#[tokio::test]
async fn non_streaming_answers_with_content_length_are_counted_ok_over_both_protocols() {
    let mock = Mock::start(script(|req| {
        if req.get("input").is_some() {
            Script::json(200, r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m1","usage":{"prompt_tokens":3,"total_tokens":3}}"#)
        } else {
            json_answer("hello", "stop", 5, 2)
        }
    }))
    .await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let requests = [
        ("/v1/chat/completions", chat_body(false, false)),
        ("/v1/completions", r#"{"model":"m1","prompt":"hi","max_tokens":2}"#.to_string()),
        ("/v1/embeddings", r#"{"model":"m1","input":"abc"}"#.to_string()),
    ];
    for (proto, c) in clients() {
        for (path, body) in &requests {
            let resp = c.request(post_req(&gw, path, body, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto} {path}");
            assert!(resp.headers().contains_key("content-length"), "{proto} {path}: the length is passed on");
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(bytes.starts_with(b"{"), "{proto} {path}");
        }
    }
    let m = metrics_text(&gw).await;
    assert_eq!(requests_with_outcome(&gw, "ok").await, 6.0, "{m}");
    assert_eq!(requests_with_outcome(&gw, "cancelled").await, 0.0, "{m}");
    let e2e: f64 = m
        .lines()
        .filter(|l| l.starts_with("slogate_e2e_request_latency_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(e2e, 6.0, "every answer has its end-to-end latency");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(8.0), "chat and completion tokens, both protocols");
    assert_quiescent(&gw).await;
}

async fn body_text(c: &TestClient, gw: &Gw, usage: bool) -> String {
    let resp = c.request(post_req(gw, "/v1/chat/completions", &chat_body(true, usage), &[])).await.expect("response");
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.expect("the stream ends").to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A replica that sends one event without end (a line that never ends)
/// must not make slogate hold it all: past `max_event_bytes` the stream ends
/// at once with an error event, the replica's request is cancelled, and the
/// request counts as `stream_error`.
#[tokio::test]
async fn an_event_past_max_event_bytes_ends_the_stream_with_an_error_event() {
    let never = Gate::default();
    let mut steps =
        vec![Step::Send(role_chunk()), Step::Send(content_chunk("a")), Step::Send(bytes::Bytes::from_static(b"data: {\"x\":\""))];
    steps.extend((0..16).map(|_| Step::Send(bytes::Bytes::from(vec![b'x'; 16 * 1024]))));
    steps.push(Step::Until(never));
    let mock = Mock::start(Script::sse(steps).always()).await;
    let gw = gateway_config(&[mock.url()]).pool("max_event_bytes: 64KiB").pool("timeouts: { idle: 5s }").start().await;
    for ((proto, c), usage) in clients().into_iter().zip([false, true]) {
        let text = body_text(&c, &gw, usage).await;
        assert!(text.contains("\"content\":\"a\""), "{proto}: the events before it arrive: {text}");
        assert!(!text.contains("xxxx"), "{proto}: none of the oversized event is sent");
        assert!(text.contains("\n\ndata: {\"error\":") && text.contains("exceeded max_event_bytes (65536 bytes)"), "{proto}: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{proto}: {text}");
    }
    wait_until("the replica saw both requests cancelled", || async { mock.state.cancelled.load(std::sync::atomic::Ordering::SeqCst) == 2 })
        .await;
    assert_eq!(requests_with_outcome(&gw, "stream_error").await, 2.0);
    assert_quiescent(&gw).await;
}

/// A replica that stalls in the middle of an event: the timeout's error
/// event starts on an event boundary, not glued to the half-sent line.
#[tokio::test]
async fn a_timeout_mid_event_sends_its_error_event_on_a_fresh_boundary() {
    let steps = vec![
        Step::Send(role_chunk()),
        Step::Send(content_chunk("a")),
        Step::Send(bytes::Bytes::from_static(b"data: {\"choi")),
        Step::Wait(Duration::from_secs(60)),
    ];
    let mock = Mock::start(Script::sse(steps).always()).await;
    let gw = gateway_config(&[mock.url()]).pool("timeouts: { idle: 300ms }").start().await;
    // With and without usage asked for (slogate strips usage it asked for itself).
    for ((proto, c), usage) in clients().into_iter().flat_map(|c| [(c.clone(), false), (c, true)]) {
        let text = body_text(&c, &gw, usage).await;
        assert!(!text.contains("{\"choi"), "{proto}: the half event was sent: {text}");
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        let error = events.iter().find(|e| e.contains("\"error\"")).unwrap_or_else(|| panic!("{proto}: no error event in {text}"));
        assert!(error.starts_with("data: {\"error\":"), "{proto}: {error}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{proto}: {text}");
    }
    assert_eq!(requests_with_outcome(&gw, "timeout").await, 4.0);
    assert_quiescent(&gw).await;
}

/// With `auth.keys`, listing the models needs a key like any other call.
#[tokio::test]
async fn with_auth_keys_listing_the_models_needs_a_key() {
    use sha2::Digest;
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let digest = hex::encode(sha2::Sha256::digest(b"sk-edge-caller"));
    let gw = gateway_config(&[mock.url()])
        .section(&format!("auth:\n  keys:\n    - {{ name: team, key_sha256: {digest}, classes: [chat] }}"))
        .start()
        .await;
    for (proto, c) in clients() {
        let list = |auth: Option<&str>| {
            let mut req = http::Request::get(format!("http://{}/v1/models", gw.data_addr));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            c.request(req.body(http_body_util::Full::new(bytes::Bytes::new())).expect("request"))
        };
        let none = list(None).await.expect("response");
        assert_eq!(none.status(), 401, "{proto}: no key");
        let wrong = list(Some("Bearer sk-wrong")).await.expect("response");
        assert_eq!(wrong.status(), 401, "{proto}: a wrong key");
        let right = list(Some("Bearer sk-edge-caller")).await.expect("response");
        assert_eq!(right.status(), 200, "{proto}: the right key");
        let body = right.into_body().collect().await.expect("body").to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("\"m1\""));
    }
}

/// Headers the client's `Connection` header names are for that hop only:
/// they do not reach the replica (HTTP/1.1; HTTP/2 has no `Connection`).
#[tokio::test]
async fn headers_named_in_connection_are_not_forwarded() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let headers = [("connection", "keep-alive, x-hop-secret"), ("x-hop-secret", "for the gateway only"), ("x-kept", "yes")];
    let resp = client().request(post_req(&gw, "/v1/chat/completions", &chat_body(false, false), &headers)).await.expect("response");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body");
    let seen = mock.state.headers.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].get("x-hop-secret").is_none(), "{:?}", seen[0]);
    assert_eq!(seen[0].get("x-kept").and_then(|v| v.to_str().ok()), Some("yes"));
    assert_quiescent(&gw).await;
}

/// A breaker opened by slow streams closes again for a class that then
/// sends only non-streaming requests, or only embeddings: such a probe has
/// no first token, so it is judged when it ends, against the class's TTFT
/// target plus its ITL target per generated token.
#[tokio::test]
async fn a_breaker_closes_for_classes_that_send_only_non_streaming_requests_or_embeddings() {
    let mock = Mock::start(script(|req| {
        if req.get("input").is_some() {
            Script::json(200, r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"m1","usage":{"prompt_tokens":3,"total_tokens":3}}"#)
        } else if req.get("stream").and_then(|v| v.as_bool()) == Some(true) {
            // Slow first tokens: 400 ms against a 100 ms target.
            Script { header_delay: Duration::from_millis(400), ..vllm_stream(req, 2, Duration::ZERO, "stop") }
        } else {
            // 150 ms for 10 tokens: over the TTFT target, within 100 ms + 10 x 20 ms.
            Script { header_delay: Duration::from_millis(150), ..json_answer("0123456789", "stop", 5, 10) }
        }
    }))
    .await;
    let gw = gateway_config(&[mock.url()])
        .section("classes:\n  chat: { tier: interactive, ttft: 100ms, itl: 20ms }\n  emb: { tier: interactive, ttft: 100ms, itl: 20ms }")
        .section("breaker: { trip_after: 500ms, window: 1s, min_samples: 3, retry_after: 500ms }")
        .start()
        .await;
    let state = |class: &'static str| {
        let gw = &gw;
        async move { metric(&metrics_text(gw).await, "slogate_breaker_state", &[("class", class)]) }
    };
    for class in ["chat", "emb"] {
        wait_until("slow streams open the breaker", || async {
            let _ = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[("x-slo-class", class)]).await;
            state(class).await == Some(2.0)
        })
        .await;
    }
    // From now on: chat sends only non-streaming requests, emb only embeddings.
    let (chat, emb) = (chat_body(false, false), r#"{"model":"m1","input":"abc"}"#);
    wait_until("both breakers close", || async {
        let _ = post(&gw, "/v1/chat/completions", &chat, &[("x-slo-class", "chat")]).await;
        let _ = post(&gw, "/v1/embeddings", emb, &[("x-slo-class", "emb")]).await;
        state("chat").await == Some(0.0) && state("emb").await == Some(0.0)
    })
    .await;
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat, &[("x-slo-class", "chat")]).await;
    assert_eq!(s, 200);
    let (s, _, _) = post(&gw, "/v1/embeddings", emb, &[("x-slo-class", "emb")]).await;
    assert_eq!(s, 200);
    assert_quiescent(&gw).await;
}

/// A stream that floods: 3,000 events of 1 KB, as fast as they go.
fn flood() -> ScriptFn {
    let big = "x".repeat(1000);
    let mut steps = vec![Step::Send(role_chunk())];
    steps.extend((0..3000).map(|_| Step::Send(content_chunk(&big))));
    steps.push(Step::Send(finish_chunk("stop")));
    steps.push(Step::Send(done()));
    Script::sse(steps).always()
}

/// Clients that stop reading (a full TCP window over HTTP/1.1; an HTTP/2
/// stream with no flow-control window) stop the server from polling the
/// response: the total timeout must still end the request from its timer
/// and give the replica slot back, so others are served.
#[tokio::test]
async fn a_client_that_stops_reading_gives_its_slot_back_at_the_total_timeout() {
    use tokio::io::AsyncWriteExt;
    let mock = Mock::start(flood()).await;
    let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").pool("timeouts: { total: 2s }").start().await;
    let inflight = || async { metric(&metrics_text(&gw).await, "slogate_inflight_requests", &[]).unwrap_or(0.0) };

    // HTTP/1.1: a small receive buffer, and nothing read.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut raw = socket.connect(gw.data_addr).await.expect("connect");
    let body = chat_body(true, false);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.write_all(head.as_bytes()).await.expect("write");
    gw.count_sent(1);
    wait_until("the stalled client holds the slot", || async { inflight().await == 1.0 }).await;
    wait_until("the total timeout gives the slot back", || async { inflight().await == 0.0 }).await;
    drop(raw);

    // HTTP/2: a stream whose window is zero.
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .http2_initial_stream_window_size(0)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let held = h2.request(post_req(&gw, "/v1/chat/completions", &body, &[])).await.expect("headers arrive");
    assert_eq!(held.status(), 200);
    wait_until("the zero-window stream gives the slot back", || async { inflight().await == 0.0 }).await;
    drop(held);

    assert_eq!(requests_with_outcome(&gw, "timeout").await, 2.0);
    // The slot serves the next caller.
    mock.set_script(standard(2, Duration::ZERO));
    let (status, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 200);
    assert_quiescent(&gw).await;
}

/// Read until the peer closes the connection; what it sent before.
async fn until_closed(s: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("the gateway closes the connection");
    out
}

/// Connections that send nothing, half a request head, half the HTTP/2
/// preface, or nothing more after a response, are closed after
/// `server.header_read_timeout`.
#[tokio::test]
async fn idle_and_half_sent_connections_are_closed_after_the_header_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("header_read_timeout: 300ms").start().await;
    for (what, sent) in [
        ("nothing", &b""[..]),
        ("half a request head", &b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"[..]),
        ("half the HTTP/2 preface", &b"PRI * HTTP/2.0\r\n"[..]),
    ] {
        let mut s = tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect");
        s.write_all(sent).await.expect("write");
        let answer = until_closed(&mut s).await;
        assert!(!String::from_utf8_lossy(&answer).contains("200"), "{what}: {}", String::from_utf8_lossy(&answer));
    }
    // A keep-alive connection idle after its response.
    let mut s = tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect");
    s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let mut first = [0u8; 12];
    s.read_exact(&mut first).await.expect("an answer");
    assert_eq!(&first, b"HTTP/1.1 200");
    until_closed(&mut s).await;
}

/// A request body that stalls is answered 408 in OpenAI's error form
/// after `server.body_read_timeout`.
#[tokio::test]
async fn a_stalled_request_body_is_408_after_the_body_read_timeout() {
    use tokio::io::AsyncWriteExt;
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("body_read_timeout: 300ms").start().await;
    let mut s = tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect");
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .expect("write");
    gw.count_sent(1);
    let answer = String::from_utf8_lossy(&until_closed(&mut s).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").map_or(0, |i| i + 4)..];
    assert_eq!(error_code(body.as_bytes()), "request_timeout", "{answer}");
    assert_eq!(mock.calls(), 0);
    assert_eq!(requests_with_outcome(&gw, "client_error").await, 1.0);
    assert_quiescent(&gw).await;
}

/// Past `server.max_connections`, a new connection waits to be accepted
/// (and is counted) until one closes; then it is served.
#[tokio::test]
async fn connections_past_max_connections_wait_and_are_counted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("max_connections: 2").start().await;
    let held = [
        tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect"),
        tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect"),
    ];
    wait_until("two connections open", || async { metric(&metrics_text(&gw).await, "slogate_open_connections", &[]) == Some(2.0) }).await;
    let mut third = tokio::net::TcpStream::connect(gw.data_addr).await.expect("the kernel queues it");
    third.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    wait_until("the third waits, counted", || async {
        metric(&metrics_text(&gw).await, "slogate_connections_waited_total", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    let mut first = [0u8; 12];
    let early = tokio::time::timeout(Duration::from_millis(200), third.read_exact(&mut first)).await;
    assert!(early.is_err(), "served while two connections were open");
    drop(held);
    tokio::time::timeout(Duration::from_secs(10), third.read_exact(&mut first)).await.expect("served once one closed").expect("read");
    assert_eq!(&first, b"HTTP/1.1 200");
}

/// Replicas are shown to clients by name: `replicas[].name` when given,
/// else `<pool>-<position>`; metrics and the status page label them by name
/// or URL. Over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn replicas_are_shown_to_clients_by_name_never_by_url() {
    let named = Mock::start(standard(2, Duration::ZERO)).await;
    let plain = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = gateway_config(&[format!("{{ url: {}, name: gpu-a }}", named.url()), plain.url()]).pool("balance: round_robin").start().await;
    for (proto, c) in clients() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let resp = c.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            seen.insert(header(resp.headers(), "x-slogate-replica").unwrap_or("none").to_string());
            resp.into_body().collect().await.expect("body");
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["gpu-a", "p-2"], "{proto}");
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_upstream_healthy", &[("replica", "gpu-a")]), Some(1.0));
    assert_eq!(metric(&m, "slogate_upstream_healthy", &[("replica", &plain.url())]), Some(1.0));
    assert_eq!(metric(&m, "slogate_upstream_healthy", &[("replica", &named.url())]), None, "a named replica's series carry its name");
    let (_, slo) = get(gw.admin_addr, "/slo.json").await;
    let v: serde_json::Value = serde_json::from_str(&slo).expect("json");
    assert_eq!(v["pools"][0]["replicas"][0]["name"], "gpu-a");
    assert_eq!(v["pools"][0]["replicas"][1]["name"], "p-2");
    assert_eq!(v["pools"][0]["replicas"][1]["url"], plain.url());
    assert_quiescent(&gw).await;
}

/// A replica that refuses connections (502) or answers nothing in time
/// (504): the error body names the replica as clients know it, and holds
/// neither its address nor its port.
#[tokio::test]
async fn gateway_errors_do_not_expose_replica_addresses() {
    let dead = Mock::start(standard(1, Duration::ZERO)).await;
    let slow = Mock::start(script(|req| {
        let mut s = vllm_stream(req, 1, Duration::ZERO, "stop");
        s.header_delay = Duration::from_secs(30);
        s
    }))
    .await;
    // One check at start (the first decides), none after: the dead replica
    // stays in service and its connection is refused.
    let once = |yaml: String| {
        yaml.replace(
            "health: { interval: 100ms, timeout: 1s, unhealthy_after: 2, healthy_after: 2 }",
            "health: { interval: 1h, timeout: 1s, unhealthy_after: 2, healthy_after: 2 }",
        )
    };
    let gw_dead = start_gateway(&once(gateway_config(&[dead.url()]).yaml())).await;
    let gw_slow = start_gateway(&once(gateway_config(&[slow.url()]).pool("timeouts: { first_token: 300ms }").yaml())).await;
    dead.kill();
    for (gw, mock, status) in [(&gw_dead, &dead, 502), (&gw_slow, &slow, 504)] {
        for (proto, c) in clients() {
            let resp = c.request(post_req(gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
            assert_eq!(resp.status(), status, "{proto}");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            let message = error_body(&body)["message"].as_str().unwrap_or_default().to_string();
            let port = mock.url().rsplit(':').next().unwrap_or_default().to_string();
            assert!(message.contains("replica p-1"), "{proto}: {message}");
            assert!(!message.contains("127.0.0.1") && !message.contains(&port), "{proto}: {message} exposes {}", mock.url());
        }
    }
    assert_quiescent(&gw_dead).await;
    assert_quiescent(&gw_slow).await;
}

/// `X-Forwarded-For` and `Forwarded` reach the replica with the client's
/// address appended to what the client sent (or as the only element when
/// it sent none): a client cannot pass itself off as another address.
#[tokio::test]
async fn forwarded_headers_are_appended_to_not_passed_through() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 3] = [
        (&[], "127.0.0.1", "for=127.0.0.1"),
        (
            &[("x-forwarded-for", "203.0.113.7"), ("forwarded", "for=203.0.113.7;proto=https")],
            "203.0.113.7, 127.0.0.1",
            "for=203.0.113.7;proto=https, for=127.0.0.1",
        ),
        (
            &[("x-forwarded-for", "198.51.100.1, 203.0.113.7"), ("x-forwarded-for", "192.0.2.9")],
            "198.51.100.1, 203.0.113.7, 192.0.2.9, 127.0.0.1",
            "for=127.0.0.1",
        ),
    ];
    for (proto, c) in clients() {
        for (sent, xff, fwd) in cases {
            mock.state.headers.lock().expect("lock").clear();
            let resp = c.request(post_req(&gw, "/v1/chat/completions", &chat_body(false, false), sent)).await.expect("response");
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.expect("body");
            let seen = mock.state.headers.lock().expect("lock").clone();
            let all = |name: &str| seen[0].get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>();
            assert_eq!(all("x-forwarded-for"), [xff], "{proto}: sent {sent:?}");
            assert_eq!(all("forwarded"), [fwd], "{proto}: sent {sent:?}");
        }
    }
    assert_quiescent(&gw).await;
}

/// With `server.admin_token_env`, everything on the admin listener but the
/// probes needs the token; a reload without it changes nothing.
#[tokio::test]
async fn the_admin_listener_requires_its_token_except_for_probes() {
    // Each test binary is its own process; this variable is this test's alone.
    std::env::set_var("SLOGATE_TEST_ADMIN_TOKEN", "adm-7f3e");
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("admin_token_env: SLOGATE_TEST_ADMIN_TOKEN").start().await;
    let request = |method: &str, path: &str, token: Option<&str>| {
        let mut b = hyper::Request::builder().method(method).uri(format!("http://{}{path}", gw.admin_addr));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(http_body_util::Full::new(bytes::Bytes::new())).expect("request")
    };
    for (proto, c) in clients() {
        for (method, path) in
            [("GET", "/metrics"), ("GET", "/slo"), ("GET", "/slo.json"), ("GET", "/capacity?rate=chat=1"), ("POST", "/-/reload")]
        {
            for token in [None, Some("wrong"), Some("adm-7f3")] {
                let resp = c.request(request(method, path, token)).await.expect("response");
                assert_eq!(resp.status(), 401, "{proto} {method} {path} with {token:?}");
                assert_eq!(header(resp.headers(), "www-authenticate"), Some("Bearer realm=\"slogate-admin\""));
                let body = resp.into_body().collect().await.expect("body").to_bytes();
                assert_eq!(error_code(&body), "invalid_admin_token");
            }
            let resp = c.request(request(method, path, Some("adm-7f3e"))).await.expect("response");
            // This gateway has no config file to reload: the token got it that far.
            let want = if path == "/-/reload" { 400 } else { 200 };
            assert_eq!(resp.status(), want, "{proto} {method} {path} with the token");
            resp.into_body().collect().await.expect("body");
        }
        for path in ["/healthz", "/readyz"] {
            let resp = c.request(request("GET", path, None)).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto} {path} is open");
            resp.into_body().collect().await.expect("body");
        }
    }
    let (status, _, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    assert_eq!(status, 200, "the data plane needs no admin token");
    let resp = client().request(request("GET", "/metrics", Some("adm-7f3e"))).await.expect("metrics");
    let m = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).to_string();
    assert_eq!(metric(&m, "slogate_config_reload_failures_total", &[]), Some(2.0), "only the two reloads with the token ran");
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(1.0));
}

/// Large bodies are parsed and rewritten with the worker handed over
/// (a multi-thread runtime, as the server runs): they arrive whole, and
/// small streams running beside them are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_are_parsed_and_forwarded_whole_beside_open_streams() {
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let text = "abc ".repeat(300_000);
    let big = format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"{text}"}}],"stream":true,"max_tokens":3}}"#);
    let addr = gw.data();
    let small = tokio::spawn(async move {
        let mut n = 0;
        for _ in 0..20 {
            let (s, _, body) = post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await;
            assert_eq!(s, 200);
            assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
            n += 1;
        }
        n
    });
    for (proto, c) in clients() {
        for _ in 0..3 {
            let resp = c.request(post_req(addr, "/v1/chat/completions", &big, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"), "{proto}");
        }
    }
    assert_eq!(small.await.expect("small streams"), 20);
    let bodies = mock.state.bodies.lock().expect("lock").clone();
    let whole = bodies.iter().filter(|b| b["messages"][0]["content"].as_str() == Some(text.as_str())).count();
    assert_eq!(whole, 6, "every large body reached the replica unchanged but for the usage request");
    assert!(bodies
        .iter()
        .filter(|b| b["messages"][0]["content"].as_str() == Some(text.as_str()))
        .all(|b| b["stream_options"]["include_usage"] == true));
    assert_quiescent(&gw).await;
}

/// `server.http2_max_streams` is the SETTINGS_MAX_CONCURRENT_STREAMS a
/// client's HTTP/2 connection gets: with 2, a client multiplexing three
/// streams has two at the replica and the third waits for one to end.
#[tokio::test]
async fn an_http2_connection_has_at_most_http2_max_streams_open() {
    let gate = Gate::default();
    let held_gate = std::sync::Arc::new(std::sync::Mutex::new(gate.clone()));
    let g = held_gate.clone();
    let mock = Mock::start(script(move |req| {
        let mut s = vllm_stream(req, 2, Duration::ZERO, "stop");
        s.steps.insert(1, Step::Until(g.lock().expect("lock").clone()));
        s
    }))
    .await;
    let gw = gateway_config(&[mock.url()]).server("http2_max_streams: 2").start().await;
    let c = client_h2();
    let send = || {
        let c = c.clone();
        let addr = gw.data();
        tokio::spawn(async move {
            let resp = c.request(post_req(addr, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
            resp.into_body().collect().await.expect("body").to_bytes()
        })
    };
    // One request first: the connection is up and the client knows the
    // server's SETTINGS (before them, a client may open more, and the
    // server refuses the extra ones with REFUSED_STREAM, which a client may retry).
    gate.open();
    assert!(String::from_utf8_lossy(&send().await.expect("task")).ends_with("data: [DONE]\n\n"));
    let gate = Gate::default();
    *held_gate.lock().expect("lock") = gate.clone();
    let streams: Vec<_> = (0..3).map(|_| send()).collect();
    wait_until("the first request and two streams at the replica", || async { mock.calls() >= 3 }).await;
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_inflight_requests", &[]), Some(2.0), "the third is held by the client, not the gateway");
    assert_eq!(mock.calls(), 3, "the third stream waits for a free one");
    gate.open();
    for s in streams {
        assert!(String::from_utf8_lossy(&s.await.expect("task")).ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(mock.calls(), 4);
    assert_quiescent(&gw).await;
}

/// A request body a client sends in pieces: each piece its own DATA frame.
struct Pieces(std::collections::VecDeque<bytes::Bytes>);

impl http_body::Body for Pieces {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }
    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// Many streams opened at once on one HTTP/2 connection, each request body
/// sent in small pieces (as clients that write a body as they build it
/// do): every one gets its answer, none is refused or reset.
#[tokio::test]
async fn thousands_of_small_http2_streams_opened_at_once_all_get_answers() {
    let mock = Mock::start(script(|req| vllm_stream(req, 1, Duration::ZERO, "stop"))).await;
    let gw = gateway_config(&[mock.url()]).server("http2_max_streams: 8192").start().await;
    let c: hyper_util::client::legacy::Client<_, Pieces> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).http2_only(true).build_http();
    // Unknown model: the gateway reads each body, then answers 404 itself.
    let body = chat_body(true, false).replace("\"m1\"", "\"no-such-model\"");
    let send = || {
        let (c, addr) = (c.clone(), gw.data_addr);
        let pieces = body.as_bytes().chunks(16).map(bytes::Bytes::copy_from_slice).collect();
        gw.count_sent(1);
        let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Pieces(pieces))
            .expect("request");
        tokio::spawn(async move { c.request(req).await.map(|r| r.status()) })
    };
    let streams: Vec<_> = (0..6000).map(|_| send()).collect();
    let mut answered = 0;
    let mut failed = Vec::new();
    for s in streams {
        match s.await.expect("task") {
            Ok(status) => {
                assert_eq!(status, 404);
                answered += 1;
            }
            Err(e) => failed.push(format!("{e:?}")),
        }
    }
    failed.dedup();
    assert_eq!(answered, 6000, "streams failed: {:?}", &failed[..failed.len().min(3)]);
    assert_eq!(mock.calls(), 0);
}

/// One HTTP/2 stream whose reader stops does not hold up the others on its
/// connection: its data waits within its own flow-control window (the
/// client's, 64 KiB here) and the gateway stops pulling it from its
/// replica, while another stream on the same connection runs to its end.
#[tokio::test]
async fn a_stalled_http2_stream_does_not_hold_up_the_others_on_its_connection() {
    let mock = Mock::start(script(|req| {
        let n = req["max_tokens"].as_u64().unwrap_or(16) as usize;
        vllm_stream(req, n, Duration::ZERO, "length")
    }))
    .await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let c: TestClient = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .http2_initial_stream_window_size(64 * 1024)
        .http2_initial_connection_window_size(4 << 20)
        .build_http();
    // A: 4,000 events (about 600 KB), its body left unread for now.
    let big = chat_body(true, false).replace("\"max_tokens\":16", "\"max_tokens\":4000");
    let a = c.request(post_req(&gw, "/v1/chat/completions", &big, &[])).await.expect("A's head");
    // The gateway has forwarded A as far as the client's window lets it
    // (about 400 events of 150 bytes fill 64 KiB); A cannot end before it is read.
    let gaps = || async { metric(&metrics_text(&gw).await, "slogate_inter_token_latency_seconds_count", &[]).unwrap_or(0.0) };
    wait_until("A at its window", || async { gaps().await >= 300.0 }).await;
    let before = gaps().await;
    // B, on the same connection, runs to its end meanwhile.
    let small = chat_body(true, false);
    let b = tokio::time::timeout(Duration::from_secs(60), async {
        let resp = c.request(post_req(&gw, "/v1/chat/completions", &small, &[])).await.expect("B's head");
        resp.into_body().collect().await.expect("B's body").to_bytes()
    })
    .await
    .expect("B held up behind the stalled stream");
    assert!(String::from_utf8_lossy(&b).ends_with("data: [DONE]\n\n"));
    // A was still held at its window while B ran: no more of it was pulled
    // from its replica than 64 KiB holds (each event is over 100 bytes; B
    // adds 15 gaps).
    let held = gaps().await;
    assert!(held <= 65536.0 / 100.0 + 15.0, "A went on past its window while unread: {before} then {held} gaps");
    // A, read now, arrives whole.
    let a = a.into_body().collect().await.expect("A's body").to_bytes();
    let text = String::from_utf8_lossy(&a);
    assert_eq!(text.matches("\"content\":\"t").count(), 4000);
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_quiescent(&gw).await;
}
