//! Hot reload under streaming load: the config file is rewritten and
//! reloaded again and again (POST /-/reload) while clients stream; not one
//! request fails or is cut, added replicas get traffic, removed ones drain
//! and get no new requests, and an invalid file is rejected with the
//! running config kept.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;

fn config(replicas: &[String]) -> String {
    config_yaml(replicas, "    max_inflight_per_replica: 64\n")
}

/// POST /-/reload once.
async fn post_reload(gw: &Gw) -> (u16, String) {
    let req = hyper::Request::post(format!("http://{}/-/reload", gw.admin_addr))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("reload");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).to_string())
}

/// POST /-/reload as an operator's script would: again while it answers
/// 429 (reloads are rate-limited), until it answers otherwise.
async fn reload(gw: &Gw) -> (u16, String) {
    let answer = Mutex::new((0, String::new()));
    wait_until("a reload that is not rate-limited", || async {
        let a = post_reload(gw).await;
        let done = a.0 != 429;
        *answer.lock().expect("lock") = a;
        done
    })
    .await;
    answer.into_inner().expect("lock")
}

/// The requests the clients have started and not yet finished, by number.
#[derive(Default)]
struct InFlight {
    next: AtomicU64,
    open: Mutex<BTreeSet<u64>>,
}

impl InFlight {
    fn start(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.open.lock().expect("lock").insert(id);
        id
    }

    fn finish(&self, id: u64) {
        self.open.lock().expect("lock").remove(&id);
    }

    /// Every request started before now has finished (the newer ones may run).
    async fn settle(&self) {
        let before = self.next.load(Ordering::SeqCst);
        wait_until("the requests started before the reload finished", || async {
            self.open.lock().expect("lock").first().is_none_or(|oldest| *oldest >= before)
        })
        .await;
    }
}

/// One client: streams until `stop`; returns (requests, failures with why).
async fn client_loop(addr: Target, stop: Arc<AtomicBool>, inflight: Arc<InFlight>) -> (u32, Vec<String>) {
    let mut n = 0;
    let mut failures = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let id = inflight.start();
        let resp = client().request(post_req(addr, "/v1/chat/completions", &chat_body(true, false), &[])).await;
        n += 1;
        match resp {
            Err(e) => failures.push(format!("send: {e}")),
            Ok(r) if r.status() != 200 => failures.push(format!("status {}", r.status())),
            Ok(r) => match r.into_body().collect().await {
                Err(e) => failures.push(format!("body: {e}")),
                Ok(b) => {
                    let text = String::from_utf8_lossy(&b.to_bytes()).to_string();
                    if !text.trim_end().ends_with("data: [DONE]") || text.contains("\"error\"") {
                        failures.push(format!("incomplete stream: {text}"));
                    }
                }
            },
        }
        inflight.finish(id);
    }
    (n, failures)
}

type Clients = Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>;

/// A gateway started from `yaml` written at `path`, ready, with six
/// streaming clients running until `stop`.
async fn start_with_clients(path: &std::path::Path, yaml: &str) -> (Gw, Arc<AtomicBool>, Arc<InFlight>, Clients) {
    std::fs::write(path, yaml).expect("write");
    let gw = slogate::Gateway::start_file(path).await.expect("gateway");
    let gw = started(gw);
    let admin = gw.admin_addr;
    wait_until("ready", || async { get(admin, "/readyz").await.0 == 200 }).await;
    let stop = Arc::new(AtomicBool::new(false));
    let inflight = Arc::new(InFlight::default());
    let clients = (0..6).map(|_| tokio::spawn(client_loop(gw.data(), stop.clone(), inflight.clone()))).collect();
    (gw, stop, inflight, clients)
}

/// Stop the clients; none of their requests failed, and at least `min` ran.
async fn stop_clients(stop: &AtomicBool, clients: Clients, min: u32) {
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        let (n, failures) = c.await.expect("client");
        total += n;
        assert!(failures.is_empty(), "{} of {n} requests failed: {:?}", failures.len(), &failures[..failures.len().min(3)]);
    }
    assert!(total >= min, "only {total} requests ran across the reloads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_under_streaming_load_fails_or_cuts_nothing() {
    let a = Mock::start(standard(10, Duration::from_millis(10))).await;
    let b = Mock::start(standard(10, Duration::from_millis(10))).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let path = dir.join("slogate.yaml");
    let (gw, stop, inflight, clients) = start_with_clients(&path, &config(&[a.url()])).await;

    for round in 0..5 {
        // Add B: it passes its health checks and gets traffic.
        std::fs::write(&path, config(&[a.url(), b.url()])).expect("write");
        assert_eq!(reload(&gw).await.0, 200);
        let b_before = b.calls();
        wait_until("the added replica receives traffic", || async { b.calls() >= b_before + 5 }).await;

        // Remove A: its streams finish, and it gets nothing new. Drained
        // means every request that could have been given a slot on A (all
        // those started before the reload, including any still on its way
        // to A) has finished; then A has answered all it ever will.
        std::fs::write(&path, config(&[b.url()])).expect("write");
        assert_eq!(reload(&gw).await.0, 200);
        inflight.settle().await;
        let s = &a.state;
        assert_eq!(s.calls.load(Ordering::SeqCst), s.completed.load(Ordering::SeqCst), "round {round}: A finished every stream it got");
        let a_after = a.calls();
        let b_now = b.calls();
        wait_until("traffic continues on the remaining replica", || async { b.calls() >= b_now + 10 }).await;
        assert_eq!(a.calls(), a_after, "round {round}: a removed replica got new requests");
        assert_eq!(a.state.cancelled.load(Ordering::SeqCst), 0, "a removed replica's stream was cut");

        // Back to A alone, through B's removal this time. As in a rolling
        // update, the added replica passes its health checks first (removing
        // the last healthy one before would leave nothing to serve: 503).
        std::fs::write(&path, config(&[a.url(), b.url()])).expect("write");
        assert_eq!(reload(&gw).await.0, 200);
        let a_before = a.calls();
        wait_until("A is back in service", || async { a.calls() >= a_before + 3 }).await;
        std::fs::write(&path, config(&[a.url()])).expect("write");
        assert_eq!(reload(&gw).await.0, 200);
        let a_now = a.calls();
        wait_until("traffic back on A", || async { a.calls() >= a_now + 5 }).await;
    }

    // An invalid file is rejected and the running config stays.
    std::fs::write(&path, "pools:\n  - name: p\n    replicas: [ftp://nope]\n").expect("write");
    let (status, body) = reload(&gw).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("pools[0]"), "the error names the field: {body}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_config_reload_failures_total", &[]), Some(1.0));
    assert_eq!(metric(&m, "slogate_config_reloads_total", &[]), Some(20.0));
    let a_now = a.calls();
    wait_until("still serving on the old config", || async { a.calls() >= a_now + 5 }).await;

    stop_clients(&stop, clients, 100).await;
    assert_quiescent(&gw).await;
}

/// Reloads that change a replica's slot count, the health settings or the
/// order of the replicas keep the replicas as they are (health, in-flight
/// count, connections): not one request gets 503 or is cut, and after a
/// lowered limit takes effect no replica holds more than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_that_resize_reorder_or_retune_health_answer_no_503() {
    let a = Mock::start(standard(10, Duration::from_millis(10))).await;
    let b = Mock::start(standard(10, Duration::from_millis(10))).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let path = tmp.path().join("slogate.yaml");
    let variant = |i: usize| {
        let order = if i % 2 == 0 { [a.url(), b.url()] } else { [b.url(), a.url()] };
        let slots = [8, 3, 16, 1][i % 4];
        let interval = ["100ms", "150ms", "200ms"][i % 3];
        gateway_config(&order)
            .pool(&format!("max_inflight_per_replica: {slots}"))
            // Queued requests wait for a slot however late (with one slot a
            // replica they queue for longer than chat's TTFT target): a 429
            // from shedding would be load, not the reload this test judges.
            .section("tiers:\n  interactive: { queue_capacity: 256, queue_timeout: 30s, shed_late: false }")
            .yaml()
            .replace(
                "health: { interval: 100ms, timeout: 1s, unhealthy_after: 2, healthy_after: 2 }",
                &format!("health: {{ interval: {interval}, timeout: 1s, unhealthy_after: {}, healthy_after: 2 }}", 2 + i % 2),
            )
    };
    let (gw, stop, inflight, clients) = start_with_clients(&path, &variant(0)).await;
    for i in 1..=30 {
        std::fs::write(&path, variant(i)).expect("write");
        assert_eq!(reload(&gw).await.0, 200, "reload {i}");
        let calls = a.calls() + b.calls();
        wait_until("requests flow after the reload", || async { a.calls() + b.calls() >= calls + 3 }).await;
        if i % 4 == 3 {
            // One slot per replica now: once the streams admitted under the
            // old limit have ended, none holds more than one.
            inflight.settle().await;
            let m = metrics_text(&gw).await;
            for r in [a.url(), b.url()] {
                let held = metric(&m, "slogate_inflight_requests", &[("replica", &r)]).unwrap_or(0.0);
                assert!(held <= 1.0, "reload {i}: {r} holds {held} slots, over the new limit of 1");
            }
        }
    }
    stop_clients(&stop, clients, 60).await;
    assert_quiescent(&gw).await;
}

/// A reload may add a class whose targets are no bucket yet and change an
/// existing class's target: both get buckets at their targets (and twice
/// them), and the series counted before keep their buckets and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_classes_and_changes_targets_with_buckets_at_them() {
    let a = Mock::start(standard(3, Duration::from_millis(1))).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let path = tmp.path().join("slogate.yaml");
    let classes = |extra: &str| {
        gateway_config(&[a.url()]).section(&format!("classes:\n  chat: {{ tier: interactive, ttft: 300ms, itl: 50ms }}\n{extra}")).yaml()
    };
    std::fs::write(&path, classes("")).expect("write");
    let gw = slogate::Gateway::start_file(&path).await.expect("gateway");
    let gw = started(gw);
    let admin = gw.admin_addr;
    wait_until("ready", || async { get(admin, "/readyz").await.0 == 200 }).await;
    let data = gw.data();
    let chat = |class: &'static str| async move {
        let (status, _, body) = post(data, "/v1/chat/completions", &chat_body(true, false), &[("x-slo-class", class)]).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    };
    let ttft_bucket =
        |m: &str, class: &str, le: &str| metric(m, "slogate_time_to_first_token_seconds_bucket", &[("class", class), ("le", le)]);
    chat("chat").await;
    let m = metrics_text(&gw).await;
    assert_eq!(ttft_bucket(&m, "chat", "0.3"), Some(1.0));
    assert_eq!(ttft_bucket(&m, "chat", "0.21"), None);

    // chat's TTFT target becomes 210 ms; a class `quick` (123 ms, 17 ms) is added.
    std::fs::write(&path, classes("  quick: { tier: interactive, ttft: 123ms, itl: 17ms }\n").replace("ttft: 300ms", "ttft: 210ms"))
        .expect("write");
    let (status, body) = reload(&gw).await;
    assert_eq!(status, 200, "{body}");
    chat("chat").await;
    chat("quick").await;
    let m = metrics_text(&gw).await;
    for le in ["0.21", "0.42", "0.3", "0.6"] {
        assert_eq!(ttft_bucket(&m, "chat", le), Some(2.0), "chat le={le}\n{m}");
    }
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[("class", "chat")]), Some(2.0));
    for le in ["0.123", "0.246"] {
        assert_eq!(ttft_bucket(&m, "quick", le), Some(1.0), "quick le={le}\n{m}");
        assert!(metric(&m, "slogate_queue_time_seconds_bucket", &[("class", "quick"), ("le", le)]).is_some(), "queue le={le}");
    }
    for le in ["0.017", "0.034"] {
        assert!(metric(&m, "slogate_inter_token_latency_seconds_bucket", &[("class", "quick"), ("le", le)]).is_some(), "itl le={le}\n{m}");
    }
    assert_quiescent(&gw).await;
}

/// Reloads past the burst answer 429 with Retry-After and change
/// nothing; the running config serves on.
#[tokio::test]
async fn reloads_past_the_burst_are_refused_with_retry_after() {
    let a = Mock::start(standard(2, Duration::ZERO)).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let path = tmp.path().join("slogate.yaml");
    std::fs::write(&path, config(&[a.url()])).expect("write");
    let gw = slogate::Gateway::start_file(&path).await.expect("gateway");
    let gw = started(gw);
    let admin = gw.admin_addr;
    wait_until("ready", || async { get(admin, "/readyz").await.0 == 200 }).await;
    let mut refused = None;
    for i in 0..50 {
        let req =
            hyper::Request::post(format!("http://{admin}/-/reload")).body(http_body_util::Full::new(bytes::Bytes::new())).expect("req");
        let resp = client().request(req).await.expect("reload");
        if resp.status() == 429 {
            let retry_after = header(resp.headers(), "retry-after").map(str::to_string);
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            refused = Some((i, retry_after, body));
            break;
        }
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
    }
    let (after, retry_after, body) = refused.expect("50 reloads in a row are not all allowed");
    assert!(after >= 10, "the first ten in a row run (refused after {after})");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(error_code(&body), "reload_rate_limited");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_config_reloads_total", &[]), Some(after as f64), "a refused reload changed nothing");
    assert_eq!(metric(&m, "slogate_config_reload_failures_total", &[]), Some(0.0));
    let (status, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 200);
    assert_quiescent(&gw).await;
}
