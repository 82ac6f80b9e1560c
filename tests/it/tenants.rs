//! Tenants through the gateway: each API key's own limits with OpenAI's
//! rate-limit headers (driven by the real OpenAI SDK too), fair sharing of a
//! tier's slots among keys, keys kept in a separate file and reloaded, and
//! `slogate keys hash`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use slogate::config::key_sha256;

/// A key entry for `auth.keys` with classes chat and batch and `extra` fields.
fn key(name: &str, secret: &str, extra: &str) -> String {
    format!("    - {{ name: {name}, key_sha256: {}, classes: [chat, batch]{extra} }}\n", key_sha256(secret))
}

fn bearer(secret: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {secret}"))
}

async fn chat_as(c: &TestClient, gw: &Gw, secret: &str, body: &str) -> (u16, http::HeaderMap, String) {
    let (k, v) = bearer(secret);
    let resp = c.request(post_req(gw, "/v1/chat/completions", body, &[(k, &v)])).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_keys_request_limit_answers_429_with_openais_headers_and_others_are_untouched() {
    for (proto, c) in clients() {
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        let yaml = format!(
            "{}auth:\n  keys:\n{}{}",
            gateway_config(&[mock.url()]).yaml(),
            key("tight", "sk-tight", ", limits: { requests_per_minute: 2 }"),
            key("free", "sk-free", "")
        );
        let gw = start_gateway(&yaml).await;
        let body = chat_body(false, false);
        for left in ["1", "0"] {
            let (s, h, _) = chat_as(&c, &gw, "sk-tight", &body).await;
            assert_eq!(s, 200, "{proto}");
            assert_eq!(header(&h, "x-ratelimit-limit-requests"), Some("2"), "{proto}");
            assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some(left), "{proto}");
            let reset = header(&h, "x-ratelimit-reset-requests").expect("reset");
            assert!(reset.ends_with('s'), "{proto}: {reset}");
            assert!(h.get("x-ratelimit-limit-tokens").is_none(), "{proto}: no token limit, no token headers");
        }
        let (s, h, b) = chat_as(&c, &gw, "sk-tight", &body).await;
        assert_eq!(s, 429, "{proto}: {b}");
        let retry: u64 = header(&h, "retry-after").expect("Retry-After").parse().expect("seconds");
        assert!((1..=60).contains(&retry), "{proto}: {retry}");
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("0"), "{proto}");
        let e: serde_json::Value = serde_json::from_str(&b).expect("JSON");
        assert_eq!(
            (e["error"]["code"].as_str(), e["error"]["type"].as_str()),
            (Some("rate_limit_exceeded"), Some("requests")),
            "{proto}: {b}"
        );
        assert!(e["error"]["message"].as_str().is_some_and(|m| m.contains("tight") && m.contains("requests per minute")), "{proto}: {b}");
        // Another key is not limited and gets no headers.
        for _ in 0..3 {
            let (s, h, _) = chat_as(&c, &gw, "sk-free", &body).await;
            assert_eq!(s, 200, "{proto}");
            assert!(h.get("x-ratelimit-limit-requests").is_none(), "{proto}");
        }
        // A key over its own limit is the caller's doing: not a failure of the gateway.
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "tight"), ("kind", "requests")]), Some(1.0), "{proto}");
        assert_eq!(metric(&m, "slogate_tenant_requests_total", &[("tenant", "tight"), ("outcome", "client_error")]), Some(1.0), "{proto}");
        assert_eq!(metric(&m, "slogate_tenant_requests_total", &[("tenant", "free"), ("outcome", "ok")]), Some(3.0), "{proto}");
        assert_eq!(requests_with_outcome(&gw, "rejected").await, 0.0, "{proto}");
        let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
        let tight = slo["tenants"].as_array().expect("tenants").iter().find(|t| t["name"] == "tight").cloned().expect("listed");
        assert_eq!((tight["limited"].as_bool(), tight["refused"]["requests"].as_u64()), (Some(true), Some(1)), "{proto}: {tight}");
        assert_eq!(tight["limits"]["requests_per_minute"].as_u64(), Some(2), "{proto}: {tight}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn tokens_are_reserved_from_max_tokens_and_settled_to_the_replicas_usage() {
    for (proto, c) in clients() {
        // The replica reports 10 prompt + 5 completion tokens.
        let mock = Mock::start(json_answer("hi", "stop", 10, 5).always()).await;
        let yaml = format!(
            "{}auth:\n  keys:\n{}",
            gateway_config(&[mock.url()]).yaml(),
            key("tok", "sk-tok", ", limits: { tokens_per_minute: 1000 }")
        );
        let gw = start_gateway(&yaml).await;
        let ask = |max: u64| format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max}}}"#);
        // Reserved: the body's ~20 tokens plus 600; the headers show what is left after the reservation.
        let (s, h, _) = chat_as(&c, &gw, "sk-tok", &ask(600)).await;
        assert_eq!(s, 200, "{proto}");
        let after_one: u64 = header(&h, "x-ratelimit-remaining-tokens").expect("remaining").parse().expect("number");
        assert!((370..=385).contains(&after_one), "{proto}: 1000 - (600 + ~20) = {after_one}");
        // Settled at the end to the 15 used: another 600 fits.
        let (s, h, _) = chat_as(&c, &gw, "sk-tok", &ask(600)).await;
        assert_eq!(s, 200, "{proto}: the first request's reservation came back");
        let after_two: u64 = header(&h, "x-ratelimit-remaining-tokens").expect("remaining").parse().expect("number");
        assert!((360..=372).contains(&after_two), "{proto}: 1000 - 15 - (600 + ~20) = {after_two}");
        // More than a minute's worth can never pass: 429 that says so.
        let (s, h, b) = chat_as(&c, &gw, "sk-tok", &ask(5000)).await;
        assert_eq!(s, 429, "{proto}");
        assert!(b.contains("Request too large"), "{proto}: {b}");
        assert_eq!(header(&h, "x-ratelimit-limit-tokens"), Some("1000"), "{proto}");
        // Without max_tokens, the worst case is reserved: the context its replica states (4096), or
        // auth.default_max_tokens (1024) until it has: more than the minute either way.
        let no_max = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
        let (s, _, _) = chat_as(&c, &gw, "sk-tok", no_max).await;
        assert_eq!(s, 429, "{proto}: the worst case reserved");
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_tenant_tokens_total", &[("tenant", "tok"), ("kind", "completion")]), Some(10.0), "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn max_concurrent_holds_until_a_stream_ends_and_a_refused_request_costs_the_key_nothing() {
    for (proto, c) in clients() {
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        let yaml = format!(
            "{}auth:\n  keys:\n{}",
            gateway_config(&[mock.url()]).yaml(),
            key("one", "sk-one", ", limits: { max_concurrent: 1, requests_per_minute: 10 }")
        );
        let gw = start_gateway(&yaml).await;
        let (k, v) = bearer("sk-one");
        let held = mock.hold_slot_as(&gw, &[(k, &v)]).await;
        let (s, h, b) = chat_as(&c, &gw, "sk-one", &chat_body(true, false)).await;
        assert_eq!(s, 429, "{proto}: {b}");
        assert_eq!(header(&h, "retry-after"), Some("1"), "{proto}");
        assert!(b.contains("max_concurrent"), "{proto}: {b}");
        // Refused by the key's own limit: the request still counts (it was
        // the caller's), the one in flight is one of ten.
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("9"), "{proto}");
        held.release().await;
        wait_until("the held stream's permit is back", || async {
            let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
            slo["tenants"][0]["concurrent"] == 0
        })
        .await;
        let (s, h, _) = chat_as(&c, &gw, "sk-one", &chat_body(true, false)).await;
        assert_eq!(s, 200, "{proto}");
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("8"), "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn a_request_the_gateway_refuses_after_the_keys_limits_gives_its_quota_back() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let yaml = format!(
        "{}tiers:\n  interactive: {{ queue_capacity: 1 }}\nauth:\n  keys:\n{}",
        gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").yaml(),
        key("k", "sk-k", ", limits: { requests_per_minute: 5 }")
    );
    let gw = start_gateway(&yaml).await;
    let (k, v) = bearer("sk-k");
    let held = mock.hold_slot_as(&gw, &[(k, &v)]).await;
    // One waits for the slot; the queue holds one: the next is refused by the gateway.
    let (gw_addr, auth) = (gw.data(), v.clone());
    let waiting = tokio::spawn(async move {
        client()
            .request(post_req(gw_addr, "/v1/chat/completions", &chat_body(false, false), &[("authorization", &auth)]))
            .await
            .expect("response")
            .status()
    });
    let admin = gw.admin_addr;
    wait_until("one queued", || async move {
        metric(&get(admin, "/metrics").await.1, "slogate_queue_depth", &[("tier", "interactive")]) == Some(1.0)
    })
    .await;
    let (s, h, b) = chat_as(&client(), &gw, "sk-k", &chat_body(false, false)).await;
    assert_eq!(s, 429, "{b}");
    assert!(b.contains("queue"), "{b}");
    assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("2"), "shown as taken while it was tried");
    held.release().await;
    assert_eq!(waiting.await.expect("task"), 200);
    let (s, h, _) = chat_as(&client(), &gw, "sk-k", &chat_body(false, false)).await;
    assert_eq!(s, 200);
    // Held, waited, this one: three of five; the refused one gave its request back.
    assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("2"));
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_light_key_does_not_wait_behind_a_heavy_keys_queue() {
    for (proto, c) in clients() {
        // Each request says who sent it in its prompt; the replica notes the order it gets them.
        let order = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = order.clone();
        let mock = Mock::start(script(move |req| {
            let who = req["messages"][0]["content"].as_str().unwrap_or("").to_string();
            if who != "hi" {
                seen.lock().expect("lock").push(who);
            }
            json_answer("ok", "stop", 10, 5)
        }))
        .await;
        // A TTFT target far above the test's waits: bulk, over its share while
        // small runs, would be refused at it (another test shows that).
        let classes = "classes:\n  chat: { tier: interactive, ttft: 60s, itl: 1s }\n  batch: { tier: batch, ttft: 60s, itl: 1s }";
        let yaml = format!(
            "{}auth:\n  keys:\n{}{}",
            gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").section(classes).yaml(),
            key("bulk", "sk-bulk", ""),
            key("small", "sk-small", "")
        );
        let gw = start_gateway(&yaml).await;
        let (k, v) = bearer("sk-bulk");
        let held = mock.hold_slot_as(&gw, &[(k, &v)]).await;
        // Six from bulk queue first (bulk holds the one slot).
        let ask = |who: &str| format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"{who}"}}],"max_tokens":10}}"#);
        let send = |secret: &str, who: &str| {
            let (c, gw_addr, body, secret) = (c.clone(), gw.data(), ask(who), secret.to_string());
            tokio::spawn(async move {
                let (k, v) = bearer(&secret);
                let resp = c.request(post_req(gw_addr, "/v1/chat/completions", &body, &[(k, &v)])).await.expect("response");
                resp.status().as_u16()
            })
        };
        let mut waiting = Vec::new();
        for i in 1..=6 {
            waiting.push(send("sk-bulk", &format!("bulk-{i}")));
            let admin = gw.admin_addr;
            wait_until("queued", || async move {
                metric(&get(admin, "/metrics").await.1, "slogate_queue_depth", &[("tier", "interactive")]) == Some(i as f64)
            })
            .await;
        }
        // Small holds nothing, under its fair part of the slot: it does not
        // queue behind bulk's six (first come, first served would make it
        // the seventh); it takes the seat kept above the slots at once.
        assert_eq!(send("sk-small", "small-1").await.expect("task"), 200, "{proto}");
        assert_eq!(order.lock().expect("lock").clone(), ["small-1"], "{proto}: served while bulk's six wait");
        held.release().await;
        for w in waiting {
            assert_eq!(w.await.expect("task"), 200, "{proto}");
        }
        // Bulk's own requests, first come first served among themselves.
        let got = order.lock().expect("lock").clone();
        assert_eq!(got, ["small-1", "bulk-1", "bulk-2", "bulk-3", "bulk-4", "bulk-5", "bulk-6"], "{proto}");
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn keys_in_a_keys_file_work_and_a_key_removed_at_reload_stops_at_once_while_its_stream_finishes() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let dir = tempfile::tempdir().expect("dir");
    let keys = dir.path().join("keys.yaml");
    let one = |name: &str, secret: &str| format!("- {{ name: {name}, key_sha256: {}, classes: [chat] }}\n", key_sha256(secret));
    std::fs::write(&keys, format!("{}{}", one("filed", "sk-filed"), one("leaving", "sk-leaving"))).expect("write");
    let config = dir.path().join("slogate.yaml");
    std::fs::write(
        &config,
        format!("{}auth:\n  keys_file: keys.yaml\n  keys:\n{}", gateway_config(&[mock.url()]).yaml(), key("inline", "sk-inline", "")),
    )
    .expect("write");
    let gw = slogate::Gateway::start_file(&config).await.expect("starts");
    let gw = started(gw);
    let admin = gw.admin_addr;
    wait_until("ready", || async move { get(admin, "/readyz").await.0 == 200 }).await;
    for secret in ["sk-inline", "sk-filed", "sk-leaving"] {
        assert_eq!(chat_as(&client(), &gw, secret, &chat_body(false, false)).await.0, 200, "{secret}");
    }
    let (k, v) = bearer("sk-leaving");
    let held = mock.hold_slot_as(&gw, &[(k, &v)]).await;
    std::fs::write(&keys, one("filed", "sk-filed")).expect("write");
    let req = hyper::Request::post(format!("http://{}/-/reload", gw.admin_addr))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("req");
    let resp = client().request(req).await.expect("reload");
    assert_eq!(resp.status(), 200, "{:?}", resp.into_body().collect().await.map(|b| b.to_bytes()));
    assert_eq!(chat_as(&client(), &gw, "sk-leaving", &chat_body(false, false)).await.0, 401, "removed: stops at once");
    assert_eq!(chat_as(&client(), &gw, "sk-filed", &chat_body(false, false)).await.0, 200);
    let body = held.release().await;
    assert!(body.contains("[DONE]"), "the stream admitted before the reload finished: {body}");
    // A key file with a problem is named in the reload's refusal; the running keys stay.
    std::fs::write(&keys, "- { name: broken, classes: [chat] }\n").expect("write");
    let req = hyper::Request::post(format!("http://{}/-/reload", gw.admin_addr))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("req");
    let resp = client().request(req).await.expect("reload");
    let status = resp.status();
    let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
    assert_ne!(status, 200, "{text}");
    assert!(text.contains("auth.keys_file[0]"), "{text}");
    assert_eq!(chat_as(&client(), &gw, "sk-filed", &chat_body(false, false)).await.0, 200, "the running keys stay");
    assert_quiescent(&gw).await;
}

#[test]
fn slogate_keys_hash_prints_the_digest_the_config_takes() {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["keys", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    child.stdin.take().expect("stdin").write_all(b"sk-secret\n").expect("write");
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // sha256("sk-secret"), computed independently (`printf %s sk-secret | sha256sum`).
    assert_eq!(printed, "746b4ad1ca9129e1caf080bf9406d43531b8bbf97f42cc1597ee4f3d4663938e");
    assert_eq!(printed, key_sha256("sk-secret"));
    let empty = std::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["keys", "hash"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    assert_eq!(empty.status.code(), Some(2), "no key: a clear error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_reads_the_headers_backs_off_on_429_and_gets_through() {
    let gate = Gate::default();
    let g = gate.clone();
    let mock = Mock::start(script(move |req| {
        if req["stream"] != true {
            return json_answer("ok", "stop", 5, 2);
        }
        let mut steps =
            vec![Step::Send(role_chunk()), Step::Send(content_chunk("hello")), Step::Until(g.clone()), Step::Send(finish_chunk("stop"))];
        if wants_usage(req) {
            steps.push(Step::Send(usage_chunk(5, 2)));
        }
        steps.push(Step::Send(done()));
        Script::sse(steps)
    }))
    .await;
    let yaml = format!(
        "{}auth:\n  keys:\n{}{}",
        gateway_config(&[mock.url()]).yaml(),
        key("sdk", "sk-sdk", ", limits: { max_concurrent: 1, requests_per_minute: 100 }"),
        key("tight", "sk-tight", ", limits: { requests_per_minute: 1 }")
    );
    let gw = start_gateway(&yaml).await;
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(py.is_file(), "{} missing: run scripts/setup-test-deps", py.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_limits.py");
    let child = tokio::process::Command::new(py)
        .arg(script)
        .arg(format!("http://{}/v1", gw.data_addr))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python");
    // The SDK's second request finds the key's one slot taken: once the
    // gateway has refused it, the first stream may end; the SDK's retry
    // (after Retry-After) then gets through.
    let refused = async {
        wait_until("the SDK's request refused for max_concurrent", || async {
            metric(&metrics_text(&gw).await, "slogate_tenant_limited_requests_total", &[("tenant", "sdk"), ("kind", "concurrent")])
                .unwrap_or(0.0)
                >= 1.0
        })
        .await
    };
    let output = child.wait_with_output();
    tokio::pin!(output);
    tokio::select! {
        _ = refused => gate.open(),
        out = &mut output => {
            let out = out.expect("output");
            panic!("the SDK script ended early:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(60), output).await.expect("SDK script ends").expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "OpenAI SDK:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("retried and got through"), "{stdout}");
    // The SDK's requests: a stream, a request refused once and retried, and two from `tight`.
    gw.count_sent(5);
    let m = metrics_text(&gw).await;
    assert_eq!(
        metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "sdk"), ("kind", "concurrent")]),
        Some(1.0),
        "refused once, then let through"
    );
    assert_eq!(metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "tight"), ("kind", "requests")]), Some(1.0));
    assert_eq!(
        metric(&m, "slogate_tenant_requests_total", &[("tenant", "sdk"), ("outcome", "ok")]),
        Some(2.0),
        "both of the SDK's requests answered"
    );
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn the_status_page_lists_fifty_tenants_one_row_each() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let mut keys = String::new();
    for i in 0..50 {
        let limits = if i % 5 == 0 { ", limits: { requests_per_minute: 600, tokens_per_minute: 100000 }" } else { "" };
        keys.push_str(&key(&format!("team-{i:02}"), &format!("sk-{i}"), limits));
    }
    let gw = start_gateway(&format!("{}auth:\n  keys:\n{keys}", gateway_config(&[mock.url()]).yaml())).await;
    for i in [0, 7, 49] {
        assert_eq!(chat_as(&client(), &gw, &format!("sk-{i}"), &chat_body(false, false)).await.0, 200);
    }
    let (s, html) = get(gw.admin_addr, "/slo").await;
    assert_eq!(s, 200);
    let table = html.split("<h2>Tenants").nth(1).and_then(|t| t.split("</table>").next()).expect("a tenants table");
    assert_eq!(table.matches("<tr>").count(), 51, "a header and one row per tenant");
    for i in 0..50 {
        assert_eq!(table.matches(&format!(">team-{i:02}<")).count(), 1, "team-{i:02} once");
    }
    assert!(table.contains("600 req/min, 100000 tok/min"), "limits shown");
    assert!(html.len() < 64 * 1024, "the page stays small: {} bytes", html.len());
    let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
    let tenants = slo["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), 50);
    let served: f64 = tenants.iter().map(|t| t["share"].as_f64().unwrap_or(0.0)).sum();
    assert!((served - 1.0).abs() < 1e-9, "shares of the tokens served add up to one: {served}");
    assert_eq!(tenants.iter().filter(|t| t["tokens_last_minute"].as_u64() > Some(0)).count(), 3);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_tenant_under_its_fair_part_goes_first_in_the_replicas_own_queue() {
    for (proto, c) in clients() {
        let mock = Mock::start(standard(2, Duration::ZERO)).await;
        let yaml = format!(
            "{}auth:\n  keys:\n{}{}",
            gateway_config(&[mock.url()]).pool("upstream_priority: true\n    max_inflight_per_replica: 4").yaml(),
            key("heavy", "sk-heavy", ""),
            key("light", "sk-light", "")
        );
        let gw = start_gateway(&yaml).await;
        let (k, v) = bearer("sk-heavy");
        let held = [mock.hold_slot_as(&gw, &[(k, &v)]).await, mock.hold_slot_as(&gw, &[(k, &v)]).await];
        let before = mock.state.bodies.lock().expect("bodies").len();
        // Light holds nothing of the 4 slots, its part is 2: ahead of heavy's requests at the replica.
        let (s, _, b) = chat_as(&c, &gw, "sk-light", &chat_body(false, false)).await;
        assert_eq!(s, 200, "{proto}: {b}");
        // Heavy, alone again with 2 running, is under nobody's share: the interactive priority.
        let (s, _, b) = chat_as(&c, &gw, "sk-heavy", &chat_body(false, false)).await;
        assert_eq!(s, 200, "{proto}: {b}");
        let bodies = mock.state.bodies.lock().expect("bodies").clone();
        let sent: Vec<i64> = bodies[before..].iter().filter_map(|b| b["priority"].as_i64()).collect();
        assert_eq!(sent, [-1, 0], "{proto}");
        for h in held {
            h.release().await;
        }
        assert_quiescent(&gw).await;
    }
}

/// A key over its fair share while another key's request runs is refused
/// first, with its own code, a message naming its share, and a Retry-After
/// in seconds and milliseconds; it does not wait out the queue timeout.
#[tokio::test]
async fn a_key_over_its_share_is_refused_first_with_its_own_code() {
    for (proto, c) in clients() {
        let mock = Mock::start(script(|_| json_answer("ok", "stop", 10, 5))).await;
        let yaml = format!(
            "{}auth:\n  keys:\n{}{}",
            gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").yaml(),
            key("bulk", "sk-bulk", ""),
            key("small", "sk-small", "")
        );
        let gw = start_gateway(&yaml).await;
        let (k, v) = bearer("sk-bulk");
        let bulk_stream = mock.hold_slot_as(&gw, &[(k, &v)]).await;
        // Small holds nothing, under its part: it takes the seat above the slot, and its stream runs.
        let (k, v) = bearer("sk-small");
        let small_stream = mock.hold_slot_as(&gw, &[(k, &v)]).await;
        // Bulk holds the one slot, its whole part and more, while small runs: its next request is refused
        // once it can no longer make chat's 300 ms TTFT target, not after the 2 s queue timeout.
        let started = tokio::time::Instant::now();
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"more"}],"max_tokens":10}"#;
        let (status, headers, text) = chat_as(&c, &gw, "sk-bulk", body).await;
        let waited = started.elapsed();
        assert_eq!(status, 429, "{proto}: {text}");
        let e: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(e["error"]["code"], "tenant_over_share", "{proto}: {text}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("key `bulk` holds 1 of pool `p`'s 1 interactive slots"), "{proto}: {message}");
        assert!(message.contains("fair share of 0.5"), "{proto}: {message}");
        assert!(waited < Duration::from_millis(1500), "{proto}: refused at the target, not the queue timeout: {waited:?}");
        let secs: u64 = header(&headers, "retry-after").and_then(|s| s.parse().ok()).expect("retry-after");
        let ms: u64 = header(&headers, "retry-after-ms").and_then(|s| s.parse().ok()).expect("retry-after-ms");
        assert!((1..=30).contains(&secs) && secs == ms.div_ceil(1000), "{proto}: {secs} s, {ms} ms");
        // Small, its stream over, is under its part again: its request goes at once, bulk's stream still running.
        small_stream.release().await;
        assert_eq!(chat_as(&c, &gw, "sk-small", body).await.0, 200, "{proto}");
        bulk_stream.release().await;
        assert_eq!(requests_with_outcome(&gw, "rejected").await, 1.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}
