//! Several gateways in front of the same replicas (`fleet`): they read each
//! other's state from their admin listeners, split each replica's slots,
//! keep a lost peer's share until it is taken for dead, count a peer that
//! answers again, and take over a dead one's share.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// GET `path` from the admin listener at `admin` with the admin token.
async fn admin_get(admin: SocketAddr, path: &str, token: Option<&str>) -> Bytes {
    let mut req = hyper::Request::get(format!("http://{admin}{path}"));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = client().request(req.body(Full::new(Bytes::new())).expect("request")).await.expect("GET");
    assert_eq!(resp.status(), 200, "GET {path}");
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// `/fleet.json` of the gateway at `admin`, with the admin token when given.
async fn fleet_state(admin: SocketAddr, token: Option<&str>) -> serde_json::Value {
    serde_json::from_slice(&admin_get(admin, "/fleet.json", token).await).expect("JSON")
}

/// This gateway's slots on the pool's only replica.
fn slots(state: &serde_json::Value) -> u64 {
    state["pools"][0]["replicas"][0]["slots"].as_u64().expect("slots")
}

/// The standing the gateway gives the peer at `address`.
fn peer_status(state: &serde_json::Value, address: &str) -> String {
    let peers = state["peers"].as_array().cloned().unwrap_or_default();
    peers.iter().find(|p| p["address"] == address).map(|p| p["status"].as_str().unwrap_or("").to_string()).unwrap_or_default()
}

/// Wait until the gateway at `admin` says `cond` of its state.
async fn until(what: &str, admin: SocketAddr, token: Option<&'static str>, cond: impl Fn(&serde_json::Value) -> bool) {
    let cond = &cond;
    wait_until(what, || async move { cond(&fleet_state(admin, token).await) }).await;
}

const FLEET_TIMES: &str = "period: 50ms, peer_timeout: 400ms, takeover_after: 2s";

/// A fake fleet peer: answers `GET /fleet.json` with the state the test
/// sets, or 503 while down; counts requests that carried the token.
struct FakePeer {
    addr: SocketAddr,
    state: Arc<Mutex<serde_json::Value>>,
    up: Arc<AtomicBool>,
    authorized: Arc<AtomicUsize>,
}

impl FakePeer {
    async fn start(token: &'static str) -> FakePeer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(serde_json::Value::Null));
        let up = Arc::new(AtomicBool::new(true));
        let authorized = Arc::new(AtomicUsize::new(0));
        let (s, u, a) = (state.clone(), up.clone(), authorized.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (s, u, a) = (s.clone(), u.clone(), a.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (s, u, a) = (s.clone(), u.clone(), a.clone());
                        async move {
                            if req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {token}")) {
                                a.fetch_add(1, Ordering::SeqCst);
                            }
                            let (status, body) = if !u.load(Ordering::SeqCst) {
                                (503, String::from("down"))
                            } else if req.uri().path() == "/fleet.json" {
                                (200, s.lock().expect("lock").to_string())
                            } else {
                                (404, String::new())
                            };
                            let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
                            *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        FakePeer { addr, state, up, authorized }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// It says it holds `inflight` of `replica`'s requests, may hold `slots`,
    /// and reserves for `interactive` interactive requests.
    fn says(&self, replica: &str, inflight: u64, slots: u64, interactive: u64) {
        *self.state.lock().expect("lock") = serde_json::json!({
            "id": "fake-peer",
            "pools": [{"name": "p", "interactive": interactive, "interactive_now": inflight, "batch": 0, "waiting": 0,
                       "replicas": [{"url": replica, "healthy": true, "inflight": inflight, "limit": 8, "slots": slots}]}]
        });
    }
}

/// A gateway in front of `mock` with a fixed limit of 8 and fleet `peers`.
fn fleet_gateway(mock: &Mock, peers: &[String], token_env: &str) -> ConfigBuilder {
    let peers = peers.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ");
    gateway_config(&[mock.url()])
        .server(&format!("admin_token_env: {token_env}"))
        .pool("max_inflight_per_replica: 8")
        .pool("scrape_metrics: 50ms")
        .section(&format!("fleet: {{ peers: [{peers}], {FLEET_TIMES} }}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_keeps_its_share_until_taken_for_dead_and_counts_again_when_back() {
    const TOKEN: &str = "fleet-test-token-1";
    std::env::set_var("SLOGATE_TEST_FLEET_TOKEN_1", TOKEN);
    let mock = Mock::start(standard(2, std::time::Duration::from_millis(1))).await;
    *mock.state.running.lock().expect("lock") = Some(5);
    let peer = FakePeer::start(TOKEN).await;
    // The peer holds 5 requests and reserves 6 interactive: of 8 slots, it
    // gets its 6, and the 2 left are split evenly. (The fleet keeps three
    // quarters of the slots for interactive requests here, so the peer's
    // peak counts whole: the default quarter would count 2 of it.)
    peer.says(&mock.url(), 5, 6, 6);
    let gw = fleet_gateway(&mock, &[peer.url()], "SLOGATE_TEST_FLEET_TOKEN_1")
        .section("tiers:\n  interactive: { reserved_share: 0.75 }")
        .start()
        .await;
    let admin = gw.admin_addr;
    let url = peer.url();
    until("the peer is heard and takes its share", admin, Some(TOKEN), |s| peer_status(s, &url) == "fresh" && slots(s) == 1).await;
    assert!(peer.authorized.load(Ordering::SeqCst) > 0, "the exchange carries the admin token");
    let m = String::from_utf8_lossy(&admin_get(admin, "/metrics", Some(TOKEN)).await).into_owned();
    assert_eq!(metric(&m, "slogate_fleet_peers", &[("state", "fresh")]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "slogate_replica_slots", &[("pool", "p")]), Some(1.0));

    // Unreachable: it keeps the 6 slots it last held (more than the 5 the
    // replica runs beyond this gateway's, more than an equal 4).
    peer.up.store(false, Ordering::SeqCst);
    until("the peer is lost and keeps its slots", admin, Some(TOKEN), |s| peer_status(s, &url) == "lost" && slots(s) == 2).await;
    // (The state is read at the request, the slots at the last tick: one
    // tick after "lost" they are the lost peer's.)
    // It answers again: counted as before.
    peer.up.store(true, Ordering::SeqCst);
    until("the peer is back", admin, Some(TOKEN), |s| peer_status(s, &url) == "fresh" && slots(s) == 1).await;

    // It dies: its requests end on the replica, and after takeover_after
    // its share is this gateway's.
    peer.up.store(false, Ordering::SeqCst);
    *mock.state.running.lock().expect("lock") = Some(0);
    until("the peer is lost, its slots kept", admin, Some(TOKEN), |s| peer_status(s, &url) == "lost" && slots(s) == 2).await;
    until("the dead peer's share is taken over", admin, Some(TOKEN), |s| peer_status(s, &url) == "gone" && slots(s) == 8).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_never_reached_gets_an_equal_share_and_what_the_replica_still_runs_for_it() {
    std::env::set_var("SLOGATE_TEST_FLEET_TOKEN_2", "t2");
    let mock = Mock::start(standard(2, std::time::Duration::from_millis(1))).await;
    *mock.state.running.lock().expect("lock") = Some(0);
    // A port nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
    let url = format!("http://{closed}");
    let gw = fleet_gateway(&mock, std::slice::from_ref(&url), "SLOGATE_TEST_FLEET_TOKEN_2").start().await;
    let admin = gw.admin_addr;
    // Ready means healthy replicas; the peer was never heard: half of 8 is kept for it.
    until("the unreachable peer keeps an equal share", admin, Some("t2"), |s| peer_status(s, &url) == "lost" && slots(s) == 4).await;
    let s = fleet_state(admin, Some("t2")).await;
    let error = s["peers"][0]["error"].as_str().unwrap_or("").to_string();
    assert!(!error.is_empty(), "the status says why the peer is not heard: {s}");
    // Taken for dead, but the replica still runs 3 requests for someone else.
    *mock.state.running.lock().expect("lock") = Some(3);
    until("only what the replica still runs is kept", admin, Some("t2"), |s| peer_status(s, &url) == "gone" && slots(s) == 5).await;
    *mock.state.running.lock().expect("lock") = Some(0);
    until("all slots once the replica runs nothing else", admin, Some("t2"), |s| slots(s) == 8).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_split_the_slots_by_demand_and_the_survivor_takes_over() {
    const TOKEN: &str = "fleet-test-token-3";
    std::env::set_var("SLOGATE_TEST_FLEET_TOKEN_3", TOKEN);
    let mock = Mock::start(standard(2, std::time::Duration::from_millis(1))).await;
    *mock.state.running.lock().expect("lock") = Some(0);
    let tmp = tempfile::tempdir().expect("temp dir");
    let (path_a, path_b) = (tmp.path().join("a.yaml"), tmp.path().join("b.yaml"));
    let alone = gateway_config(&[mock.url()])
        .server("admin_token_env: SLOGATE_TEST_FLEET_TOKEN_3")
        .pool("max_inflight_per_replica: 8")
        .pool("scrape_metrics: 50ms");
    std::fs::write(&path_a, alone.yaml()).expect("write");
    std::fs::write(&path_b, alone.yaml()).expect("write");
    let a = started(slogate::Gateway::start_file(&path_a).await.expect("a starts"));
    let b = started(slogate::Gateway::start_file(&path_b).await.expect("b starts"));
    until("a alone has every slot", a.admin_addr, Some(TOKEN), |s| slots(s) == 8 && s["peers"].as_array().is_none()).await;
    // Each names the other, and itself too (one list for the whole fleet).
    let (url_a, url_b) = (format!("http://{}", a.admin_addr), format!("http://{}", b.admin_addr));
    let both = [url_a.clone(), url_b.clone()];
    std::fs::write(&path_a, fleet_gateway(&mock, &both, "SLOGATE_TEST_FLEET_TOKEN_3").yaml()).expect("write");
    std::fs::write(&path_b, fleet_gateway(&mock, &both, "SLOGATE_TEST_FLEET_TOKEN_3").yaml()).expect("write");
    a.reload().await.expect("a reloads");
    b.reload().await.expect("b reloads");
    until("a hears b and recognises itself; idle, they split evenly", a.admin_addr, Some(TOKEN), |s| {
        peer_status(s, &url_b) == "fresh" && peer_status(s, &url_a) == "self" && slots(s) == 4
    })
    .await;
    until("b hears a", b.admin_addr, Some(TOKEN), |s| peer_status(s, &url_a) == "fresh" && slots(s) == 4).await;
    // The status shows the fleet: this instance's part and its peers.
    let status: serde_json::Value = serde_json::from_slice(&admin_get(a.admin_addr, "/slo.json", Some(TOKEN)).await).expect("JSON");
    assert_eq!(status["pools"][0]["replicas"][0]["fleet_slots"].as_u64(), Some(4), "{status}");
    let peers = status["fleet"]["peers"].as_array().expect("fleet peers");
    assert!(peers.iter().any(|p| p["address"] == url_b.as_str() && p["status"] == "fresh"), "{status}");
    let page = String::from_utf8_lossy(&admin_get(a.admin_addr, "/slo", Some(TOKEN)).await).into_owned();
    assert!(page.contains("<h2>Fleet</h2>") && page.contains("4 of 8") && page.contains(&url_b), "the page shows the fleet");
    // Both protocols read the state the peers exchange.
    for (name, c) in clients() {
        let req = hyper::Request::get(format!("http://{}/fleet.json", a.admin_addr)).body(Full::new(Bytes::new())).expect("req");
        assert_eq!(c.request(req).await.expect("GET").status(), 401, "{name}: the state needs the admin token");
    }

    // A request streaming through b: b's interactive demand grows its share.
    let held = mock.hold_slot(&b).await;
    until("b's interactive demand is met first", b.admin_addr, Some(TOKEN), |s| slots(s) >= 5).await;
    until("a gives way", a.admin_addr, Some(TOKEN), |s| slots(s) <= 3).await;
    held.release().await;

    // b stops: a keeps b's share until takeover_after, then takes it.
    b.shutdown().await;
    until("b is lost", a.admin_addr, Some(TOKEN), |s| peer_status(s, &url_b) == "lost").await;
    until("b's share is taken over", a.admin_addr, Some(TOKEN), |s| peer_status(s, &url_b) == "gone" && slots(s) == 8).await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_limits_are_split_among_the_live_instances_and_whole_again_when_alone() {
    const TOKEN: &str = "fleet-test-token-4";
    std::env::set_var("SLOGATE_TEST_FLEET_TOKEN_4", TOKEN);
    let mock = Mock::start(standard(2, std::time::Duration::from_millis(1))).await;
    let peer = FakePeer::start(TOKEN).await;
    peer.says(&mock.url(), 0, 4, 0);
    let key = format!(
        "auth:\n  keys:\n    - {{ name: k, key_sha256: {}, classes: [chat], limits: {{ requests_per_minute: 4 }} }}\n",
        slogate::config::key_sha256("sk-k")
    );
    let gw = start_gateway(&format!("{}{key}", fleet_gateway(&mock, &[peer.url()], "SLOGATE_TEST_FLEET_TOKEN_4").yaml())).await;
    let instances = |s: &serde_json::Value| s["tenants"][0]["limits"]["instances"].as_u64();
    let slo = |admin| async move {
        serde_json::from_slice::<serde_json::Value>(&admin_get(admin, "/slo.json", Some(TOKEN)).await).expect("JSON")
    };
    wait_until("the peer heard: two instances share the key's limit", || async { instances(&slo(gw.admin_addr).await) == Some(2) }).await;
    let body = chat_body(false, false);
    let ask = || post(&gw, "/v1/chat/completions", &body, &[("authorization", "Bearer sk-k")]);
    for left in ["1", "0"] {
        let (s, h, _) = ask().await;
        assert_eq!(s, 200);
        assert_eq!(h.get("x-ratelimit-limit-requests").and_then(|v| v.to_str().ok()), Some("2"), "this instance's half of 4");
        assert_eq!(h.get("x-ratelimit-remaining-requests").and_then(|v| v.to_str().ok()), Some(left));
    }
    assert_eq!(ask().await.0, 429, "a third within the minute: over this instance's part");
    // The peer dies: once it is taken for dead, the whole limit is this instance's.
    peer.up.store(false, Ordering::SeqCst);
    wait_until("alone again", || async { instances(&slo(gw.admin_addr).await) == Some(1) }).await;
    let (s, h, _) = ask().await;
    assert_eq!(s, 200);
    assert_eq!(h.get("x-ratelimit-limit-requests").and_then(|v| v.to_str().ok()), Some("4"));
    assert_eq!(h.get("x-ratelimit-remaining-requests").and_then(|v| v.to_str().ok()), Some("1"), "two used before, this one, of four");
    // Every request counted once (the metrics need the admin token here; a
    // request is counted as its response body is dropped, which may come a
    // moment after the client read it).
    let metrics = || async { String::from_utf8_lossy(&admin_get(gw.admin_addr, "/metrics", Some(TOKEN)).await).into_owned() };
    let sent = gw.sent() as f64;
    wait_until("every request counted", || async { metric(&metrics().await, "slogate_requests_total", &[]) >= Some(sent) }).await;
    let m = metrics().await;
    assert_eq!(metric(&m, "slogate_requests_total", &[]), Some(sent), "counted once: {m}");
    assert_eq!(metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "k"), ("kind", "requests")]), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gateway_of_a_fleet_reads_where_the_others_sent_their_prompts() {
    let mock = Mock::start(standard(2, std::time::Duration::from_millis(1))).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let alone = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 8");
    let (a, b, url_a, url_b) = fleet_of_two(&alone, FLEET_TIMES, tmp.path()).await;
    until("a hears b", a.admin_addr, None, |s| peer_status(s, &url_b) == "fresh").await;
    until("b hears a", b.admin_addr, None, |s| peer_status(s, &url_a) == "fresh").await;
    let index = |admin: SocketAddr| async move {
        let s: serde_json::Value = serde_json::from_slice(&admin_get(admin, "/slo.json", None).await).expect("JSON");
        s["pools"][0]["prefix_index"][0].as_u64().expect("the index's names")
    };
    assert_eq!(index(b.admin_addr).await, 0);

    // A prompt of 4,000 characters (15 blocks of 256) through a only, over each protocol.
    for (i, (name, c)) in clients().into_iter().enumerate() {
        let text = format!("{i} {}", "the same long system prompt ".repeat(143));
        let body = serde_json::json!({"model": "m1", "messages": [{"role": "user", "content": text}]}).to_string();
        let resp = c.request(post_req(&a, "/v1/chat/completions", &body, &[])).await.expect("POST");
        assert_eq!(resp.status(), 200, "{name}");
        resp.into_body().collect().await.expect("body");
    }
    let sent = index(a.admin_addr).await;
    assert!(sent >= 30, "a's index has both prompts' blocks: {sent}");
    // b routed nothing, and its index learns all of it from a's journal.
    wait_until("b's index holds what a sent", || async { index(b.admin_addr).await == sent }).await;
    // What b read it does not tell again: its journal is its own decisions.
    let b_says: serde_json::Value = serde_json::from_slice(&admin_get(b.admin_addr, "/fleet.json?since=0", None).await).expect("JSON");
    assert!(b_says["pools"][0]["sent"].as_array().is_none(), "{b_says}");
    let a_says: serde_json::Value = serde_json::from_slice(&admin_get(a.admin_addr, "/fleet.json?since=0", None).await).expect("JSON");
    assert_eq!(a_says["pools"][0]["sent"].as_array().map(Vec::len), Some(2), "{a_says}");
    // Without `since` (a person reading the state), no decisions.
    assert!(fleet_state(a.admin_addr, None).await["pools"][0]["sent"].is_null());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_read_is_held_until_news_and_answered_at_once_for_news_it_missed() {
    let mock = Mock::start(standard(2, std::time::Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 1")
        // The waiter waits for the held slot, past chat's TTFT target.
        .section("tiers:\n  interactive: { shed_late: false }")
        .start()
        .await;
    let admin = gw.admin_addr;
    let read = move |query: String| async move {
        serde_json::from_slice::<serde_json::Value>(&admin_get(admin, &format!("/fleet.json{query}"), None).await).expect("JSON")
    };
    let news = |s: &serde_json::Value| s["news"].as_u64().expect("news");
    let waiting = |s: &serde_json::Value| s["pools"][0]["interactive_waiting"].as_u64().expect("interactive_waiting");
    let quiet = read(String::new()).await;
    assert!(quiet["woken"].is_null(), "a plain read is answered as it stands: {quiet}");
    // Nothing happens: held for the wait asked, and not woken.
    let asked = std::time::Duration::from_millis(200);
    let start = tokio::time::Instant::now();
    let held = read(format!("?wait_ms={}&news={}", asked.as_millis(), news(&quiet))).await;
    assert!(start.elapsed() >= asked && held["woken"].is_null(), "held for the wait: {held}");
    // A chat request starts waiting here: news, which a read that comes
    // after it hears at once by its count.
    let slot = mock.hold_slot(&gw).await;
    let addr = gw.data();
    let waiter = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(false, false), &[]).await });
    wait_until("the chat request waits", || async { waiting(&read(String::new()).await) == 1 }).await;
    let missed = read(format!("?wait_ms=1000&news={}", news(&held))).await;
    assert_eq!((missed["woken"].as_bool(), waiting(&missed)), (Some(true), 1), "{missed}");
    // Held from here, it is answered when the last chat request stops
    // waiting (its slot came).
    let pending = tokio::spawn(read(format!("?wait_ms=1000&news={}", news(&missed))));
    slot.release().await;
    let told = pending.await.expect("task");
    assert_eq!((told["woken"].as_bool(), waiting(&told)), (Some(true), 0), "{told}");
    assert_eq!(waiter.await.expect("task").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_is_news_while_a_peers_chat_waits_and_not_once_alone_again() {
    std::env::set_var("SLOGATE_TEST_FLEET_TOKEN_5", "t5");
    let mock = Mock::start(standard(4, std::time::Duration::ZERO)).await;
    *mock.state.running.lock().expect("lock") = Some(0);
    let peer = FakePeer::start("t5").await;
    *peer.state.lock().expect("lock") = serde_json::json!({
        "id": "fake-peer",
        "pools": [{"name": "p", "interactive": 1, "interactive_now": 1, "batch": 0, "waiting": 1, "interactive_waiting": 1,
                   "replicas": [{"url": mock.url(), "healthy": true, "inflight": 0, "limit": 8, "slots": 4}]}]
    });
    let tmp = tempfile::tempdir().expect("temp dir");
    let path = tmp.path().join("g.yaml");
    let in_fleet = fleet_gateway(&mock, &[peer.url()], "SLOGATE_TEST_FLEET_TOKEN_5");
    std::fs::write(&path, in_fleet.yaml()).expect("write");
    let gw = started(slogate::Gateway::start_file(&path).await.expect("starts"));
    let admin = gw.admin_addr;
    let url = peer.url();
    until("the peer is heard", admin, Some("t5"), |s| peer_status(s, &url) == "fresh").await;
    let news = |s: &serde_json::Value| s["news"].as_u64().expect("news");
    // The peer's chat waits: a slot given back here is news for it.
    // (Heard, it counts at the next tick: a slot freed before then is not news yet.)
    let before = news(&fleet_state(admin, Some("t5")).await);
    let (gw_ref, mock_ref) = (&gw, &mock);
    wait_until("a slot freed is told", || async move {
        mock_ref.hold_slot(gw_ref).await.release().await;
        news(&fleet_state(admin, Some("t5")).await) != before
    })
    .await;
    // Alone again: nobody waits elsewhere, and a slot freed is no news.
    std::fs::write(
        &path,
        gateway_config(&[mock.url()]).server("admin_token_env: SLOGATE_TEST_FLEET_TOKEN_5").pool("max_inflight_per_replica: 8").yaml(),
    )
    .expect("write");
    gw.reload().await.expect("reloads");
    until("alone", admin, Some("t5"), |s| s["peers"].as_array().is_none()).await;
    let before = news(&fleet_state(admin, Some("t5")).await);
    mock.hold_slot(&gw).await.release().await;
    wait_until("the slot is given back", || async { fleet_state(admin, Some("t5")).await["pools"][0]["replicas"][0]["inflight"] == 0 })
        .await;
    assert_eq!(news(&fleet_state(admin, Some("t5")).await), before, "no news once alone");
    gw.shutdown().await;
}
