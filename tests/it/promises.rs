//! Promises the README makes that no other test checks end to end: what is
//! never retried, how replica errors are counted, the total timeout, the
//! reserved share, shutdown's grace with requests still queued, and SIGHUP.
//! Every gateway test ends with the gateway at rest and its books balanced.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::BodyExt;

fn calls(mocks: &[&Mock]) -> usize {
    mocks.iter().map(|m| m.calls()).sum()
}

#[tokio::test]
async fn a_request_is_not_retried_once_the_replica_started_answering() {
    // Both replicas answer 200, send a token and then cut the connection:
    // the client already has the headers and a token, so with resuming off
    // nothing may be sent again. (The cut waits until the token is out: a body that fails
    // in the same write as its headers closes the connection unanswered.)
    let gate = Gate::default();
    let cut =
        |gate: Gate| Script::sse(vec![Step::Send(role_chunk()), Step::Send(content_chunk("a")), Step::Until(gate), Step::Abort]).always();
    let (a, b) = (Mock::start(cut(gate.clone())).await, Mock::start(cut(gate.clone())).await);
    // Resuming off: a stream that broke is not continued elsewhere.
    let gw = gateway_config(&[a.url(), b.url()]).pool("resume: { max_attempts: 0 }").start().await;
    let body = stream_until(&gw, "\"a\"").await;
    gate.open();
    let text = String::from_utf8_lossy(&body.collect().await.expect("the stream ends cleanly").to_bytes()).into_owned();
    assert!(
        text.contains("the replica's stream failed") && text.ends_with("data: [DONE]\n\n"),
        "the cut reaches the client as an error event: {text}"
    );
    assert_eq!(calls(&[&a, &b]), 1, "sent to one replica only");
    wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_replica_4xx_passes_through_as_client_error_and_is_not_retried() {
    let bad = || Script::json(400, r#"{"object":"error","message":"max_tokens too large","code":400}"#).always();
    let (a, b) = (Mock::start(bad()).await, Mock::start(bad()).await);
    let gw = gateway_config(&[a.url(), b.url()]).start().await;
    let (status, _, body) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(&body[..], br#"{"object":"error","message":"max_tokens too large","code":400}"#, "passed through unchanged");
    assert_eq!(calls(&[&a, &b]), 1, "a 4xx is the request's fault: not retried");
    assert_eq!(requests_with_outcome(&gw, "client_error").await, 1.0);
    assert_eq!(requests_with_outcome(&gw, "upstream_error").await, 0.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_json_answer_cut_midway_is_an_upstream_error() {
    let gate = Gate::default();
    let mock = Mock::start(
        Script::json_steps(
            200,
            vec![Step::Send(Bytes::from_static(br#"{"id":"cmpl-1","choices":[{"index":0,"mess"#)), Step::Until(gate.clone()), Step::Abort],
        )
        .always(),
    )
    .await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let resp = client().request(post_req(&gw, "/v1/chat/completions", &chat_body(false, false), &[])).await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("the first bytes");
    assert!(first.into_data().is_ok_and(|d| d.starts_with(b"{\"id\"")));
    gate.open();
    assert!(body.collect().await.is_err(), "a cut JSON answer reaches the client as a cut");
    wait_until("counted", || async { requests_with_outcome(&gw, "upstream_error").await == 1.0 }).await;
    assert_eq!(requests_with_outcome(&gw, "ok").await, 0.0);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn the_total_timeout_ends_a_stream_that_keeps_flowing() {
    // A token every 50 ms for 10 s: never idle, never late for its first
    // token, but past the 1 s total.
    let mock = Mock::start(standard(200, Duration::from_millis(50))).await;
    let gw = gateway_config(&[mock.url()]).pool("timeouts: { total: 1s, idle: 30s, first_token: 30s }").start().await;
    let start = tokio::time::Instant::now();
    let (status, _, body) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    let took = start.elapsed();
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("exceeded the total timeout of 1s") && text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("t199"), "the stream was cut before its end");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(9), "ended after {took:?}");
    assert_eq!(requests_with_outcome(&gw, "timeout").await, 1.0);
    wait_until("the replica's request is cancelled", || async { mock.state.cancelled.load(std::sync::atomic::Ordering::SeqCst) == 1 })
        .await;
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn the_reserved_share_keeps_a_slot_for_interactive_while_batch_waits() {
    // Two slots, half reserved: batch may hold one.
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 2")
        .section("tiers:\n  interactive: { reserved_share: 0.5 }")
        .start()
        .await;
    let batch = mock.hold_slot_as(&gw, &[("x-slo-class", "batch")]).await;
    let addr = gw.data();
    let second_batch =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[("x-slo-class", "batch")]).await });
    wait_until("the second batch request waits although a slot is free", || async {
        metric(&metrics_text(&gw).await, "slogate_queue_depth", &[("tier", "batch")]) == Some(1.0)
    })
    .await;
    assert_eq!(metric(&metrics_text(&gw).await, "slogate_inflight_requests", &[]), Some(1.0), "one slot is free");
    // Interactive gets the reserved slot at once.
    let (s, h, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    assert_eq!(s, 200);
    assert_eq!(header(&h, "x-slogate-queue-ms"), Some("0"), "interactive did not wait");
    assert!(!second_batch.is_finished(), "batch still waits for its share");
    batch.release().await;
    assert_eq!(second_batch.await.expect("task").0, 200, "batch gets the slot batch gave back");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn shutdown_returns_when_the_grace_expires_with_requests_still_queued() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("shutdown_grace: 500ms").pool("max_inflight_per_replica: 1").start().await;
    let held = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let queued = tokio::spawn(async move { client().request(post_req(addr, "/v1/chat/completions", &chat_body(false, false), &[])).await });
    wait_until("queued", || async { metric(&metrics_text(&gw).await, "slogate_queue_depth", &[("tier", "interactive")]) == Some(1.0) })
        .await;
    let metrics = gw.metrics();
    let start = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), gw.shutdown()).await.expect("shutdown returns once the grace has expired");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(10),
        "returned after {took:?}: not when the 500 ms grace expired"
    );
    assert!(tokio::net::TcpStream::connect(addr.addr).await.is_err(), "no longer accepting");
    // Nothing was counted twice or lost on the way down.
    held.hang_up();
    queued.abort();
    let total = metrics.encode();
    assert!(metric(&total, "slogate_requests_total", &[]).unwrap_or(0.0) <= 2.0, "{total}");
}

/// The binary: `slogate serve` reloads its file on SIGHUP (a bad file is
/// refused and the running config stays) and exits 0 on SIGTERM.
#[tokio::test]
async fn sighup_reloads_the_config_file_and_sigterm_exits_cleanly() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("slogate.yaml");
    let yaml = gateway_config(&[mock.url()]).yaml();
    std::fs::write(&path, &yaml).expect("write config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&path)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start slogate");
    let pid = child.id() as libc::pid_t;
    let stderr = child.stderr.take().expect("stderr");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(l).is_err() {
                return;
            }
        }
    });
    let admin = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.recv()).await.expect("slogate starts").expect("a log line");
        if line.contains("slogate listening") {
            let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
            break v["fields"]["admin"]
                .as_str()
                .expect("admin")
                .trim_start_matches("http://")
                .parse::<std::net::SocketAddr>()
                .expect("addr");
        }
    };
    let reloads = |what: &'static str| async move { metric(&get(admin, "/metrics").await.1, what, &[]).unwrap_or(0.0) };

    // The first SIGHUP as soon as it says it listens (not even ready yet):
    // its handler must already be in place, or SIGHUP's default action ends it.
    std::fs::write(&path, format!("{yaml}    max_inflight_per_replica: 8\n")).expect("rewrite config");
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    wait_until("reloaded on SIGHUP", || async { reloads("slogate_config_reloads_total").await == 1.0 }).await;
    wait_until("ready on the new config", || async { get(admin, "/readyz").await.0 == 200 }).await;

    std::fs::write(&path, "pools: [").expect("break config");
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    wait_until("a bad file is refused", || async { reloads("slogate_config_reload_failures_total").await == 1.0 }).await;
    assert_eq!(get(admin, "/readyz").await.0, 200, "still serving on the old config");
    let m = get(admin, "/metrics").await.1;
    assert_eq!(metric(&m, "slogate_inflight_requests", &[]).unwrap_or(0.0), 0.0);
    assert_eq!(metric(&m, "slogate_queue_depth", &[]).unwrap_or(0.0), 0.0);

    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join").expect("wait");
    assert!(status.success(), "exit status {status}");
}
