//! Least privilege on the data plane: only inference endpoints reach the
//! replicas (an engine's management endpoints never do, unless an operator
//! opens one for named keys), keys are limited to their models and
//! endpoints, quotas over a day hold, every request has one id everywhere,
//! and the access log has one line per request, never a key or a body.

use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use slogate::config::key_sha256;

/// Two keys: `ops` (every model) and `team` (model `m1` only), and a pool
/// serving `m1` from `mock`.
fn keyed(mock: &Mock, pool: &[&str], sections: &str) -> String {
    let mut b = gateway_config(&[mock.url()]);
    for f in pool {
        b = b.pool(f);
    }
    format!(
        "{}auth:\n  keys:\n    - {{ name: ops, key_sha256: {}, classes: [chat] }}\n    - {{ name: team, key_sha256: {}, classes: [chat], models: [m1] }}\n    - {{ name: embed, key_sha256: {}, classes: [chat], endpoints: [embeddings] }}\n{sections}",
        b.yaml(),
        key_sha256("sk-ops"),
        key_sha256("sk-team"),
        key_sha256("sk-embed"),
    )
}

async fn send(c: &TestClient, addr: std::net::SocketAddr, path: &str, body: &str, h: &[(&str, &str)]) -> (u16, http::HeaderMap, String) {
    let mut b = http::Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (k, v) in h {
        b = b.header(*k, *v);
    }
    let req = b.body(http_body_util::Full::new(bytes::Bytes::from(body.to_string()))).expect("request");
    let resp = c.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// vLLM's management and debug endpoints, and a path nobody serves.
const MANAGEMENT: [&str; 12] = [
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/start_profile",
    "/stop_profile",
    "/collective_rpc",
    "/scale_elastic_ep",
    "/v1/made_up_path",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_paths_with_a_valid_key_and_a_model_never_reach_the_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let gw = start_gateway(&keyed(&mock, &[], &format!("telemetry:\n  access_log: {{ to: {} }}\n", log.display()))).await;
    let body = r#"{"model":"m1","lora_name":"evil","lora_path":"/tmp/evil"}"#;
    for (proto, c) in clients() {
        for path in MANAGEMENT {
            let (s, h, text) = send(&c, gw.data_addr, path, body, &[("authorization", "Bearer sk-ops")]).await;
            assert_eq!(s, 404, "{proto} {path}: {text}");
            let e = error_body(text.as_bytes());
            assert_eq!(e["code"], "not_found", "{proto} {path}");
            assert!(e["message"].as_str().unwrap_or("").contains("extra_paths"), "{proto} {path}: says how to open one: {e}");
            assert_eq!(e["request_id"].as_str(), header(&h, "x-request-id"), "{proto} {path}");
        }
    }
    assert_eq!(mock.calls(), 0, "the replica saw none of them: {:?}", mock.state.paths.lock().expect("lock"));
    // Each probe has its access log line, naming the key's tenant (an auditor's question: who tried?).
    wait_until("a line per probe", || {
        let log = log.clone();
        async move { lines(&log).len() == 2 * MANAGEMENT.len() }
    })
    .await;
    assert!(lines(&log).iter().all(|l| l["status"] == 404 && l["tenant"] == "ops" && l["endpoint"] == "other"), "{:?}", lines(&log));
    // The inference endpoints do reach it, routed by model.
    for path in ["/v1/chat/completions", "/v1/embeddings", "/tokenize", "/detokenize", "/v1/rerank", "/score", "/pooling", "/classify"] {
        let (s, _, text) =
            send(&client(), gw.data_addr, path, r#"{"model":"m1","prompt":"hi"}"#, &[("authorization", "Bearer sk-ops")]).await;
        assert_eq!(s, 200, "{path}: {text}");
    }
    assert_eq!(mock.calls(), 8);
    assert_eq!(mock.state.paths.lock().expect("lock")[2], "/tokenize");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opened_management_path_works_for_its_keys_only() {
    let mock = Mock::start(Script::json(200, r#"{"status":"ok"}"#).always()).await;
    let opened = "extra_paths: [{ path: /v1/load_lora_adapter, keys: [ops] }, { path: /reset_prefix_cache, keys: [ops] }]";
    let gw = start_gateway(&keyed(&mock, &[opened], "")).await;
    for (proto, c) in clients() {
        let before = mock.calls();
        let lora = r#"{"lora_name":"a","lora_path":"/models/a"}"#;
        let (s, _, text) = send(&c, gw.data_addr, "/v1/load_lora_adapter", lora, &[("authorization", "Bearer sk-ops")]).await;
        assert_eq!((s, text.as_str()), (200, r#"{"status":"ok"}"#), "{proto}: the operator's key, no model: the one pool that opened it");
        // No body at all (vLLM's cache reset takes none).
        let (s, _, text) = send(&c, gw.data_addr, "/reset_prefix_cache", "", &[("authorization", "Bearer sk-ops")]).await;
        assert_eq!(s, 200, "{proto}: {text}");
        assert_eq!(mock.calls(), before + 2, "{proto}");
        // A caller without the right (another key, no key) cannot tell the
        // opened path from one slogate does not serve: the same 404.
        let (unknown, _, unknown_text) = send(&c, gw.data_addr, "/v1/unload_lora_adapter", lora, &[]).await;
        let shape = |t: &str| {
            let mut e = error_body(t.as_bytes());
            e["message"] = e["message"]
                .as_str()
                .unwrap_or("")
                .replace("/v1/unload_lora_adapter", "PATH")
                .replace("/v1/load_lora_adapter", "PATH")
                .into();
            e["request_id"] = serde_json::Value::Null;
            e
        };
        for auth in [Some("sk-team"), Some("sk-embed"), Some("sk-wrong"), None] {
            let headers: Vec<(&str, String)> = auth.map(|k| ("authorization", format!("Bearer {k}"))).into_iter().collect();
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (s, _, text) = send(&c, gw.data_addr, "/v1/load_lora_adapter", lora, &headers).await;
            assert_eq!((s, shape(&text)), (unknown, shape(&unknown_text)), "{proto} {auth:?}: {text}");
        }
        assert_eq!(unknown, 404);
        assert_eq!(mock.calls(), before + 2, "{proto}: the others never reached the replica");
    }
    let paths = mock.state.paths.lock().expect("lock").clone();
    assert_eq!(paths[..2], ["/v1/load_lora_adapter", "/reset_prefix_cache"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limited_to_a_model_gets_403_on_another_and_lists_only_its_own() {
    let m1 = Mock::start(standard(2, Duration::ZERO)).await;
    let m2 = Mock::start_with_model("m2", standard(2, Duration::ZERO)).await;
    let second = format!(
        "  - name: q\n    models: [m2]\n    replicas: [{}]\n    health: {{ interval: 100ms, timeout: 1s, unhealthy_after: 2, healthy_after: 2 }}\n",
        m2.url()
    );
    let yaml = keyed(&m1, &[], "").replacen("auth:", &format!("{second}auth:"), 1);
    let gw = start_gateway(&yaml).await;
    for (proto, c) in clients() {
        let other = r#"{"model":"m2","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
        let (s, h, text) = send(&c, gw.data_addr, "/v1/chat/completions", other, &[("authorization", "Bearer sk-team")]).await;
        assert_eq!(s, 403, "{proto}: {text}");
        let e = error_body(text.as_bytes());
        assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some("model_not_allowed"), Some("model")), "{proto}");
        assert!(e["message"].as_str().unwrap_or("").contains("`m2`"), "{proto}: names the model: {e}");
        assert_eq!(e["request_id"].as_str(), header(&h, "x-request-id"), "{proto}: the error carries the request id");
        let (s, _, _) = send(&c, gw.data_addr, "/v1/chat/completions", other, &[("authorization", "Bearer sk-ops")]).await;
        assert_eq!(s, 200, "{proto}: a key without a model list uses every model");
        let (s, _, _) =
            send(&c, gw.data_addr, "/v1/chat/completions", &chat_body(false, false), &[("authorization", "Bearer sk-team")]).await;
        assert_eq!(s, 200, "{proto}: its own model");
        // An embeddings-only key.
        let (s, _, text) =
            send(&c, gw.data_addr, "/v1/chat/completions", &chat_body(false, false), &[("authorization", "Bearer sk-embed")]).await;
        assert_eq!((s, error_code(text.as_bytes())), (403, "endpoint_not_allowed".to_string()), "{proto}");
        let (s, _, _) =
            send(&c, gw.data_addr, "/v1/embeddings", r#"{"model":"m1","input":"x"}"#, &[("authorization", "Bearer sk-embed")]).await;
        assert_eq!(s, 200, "{proto}");
    }
    assert_eq!(m2.calls(), 2, "only the ops key's requests reached m2");
    let list = |key: &'static str| {
        let addr = gw.data_addr;
        async move {
            let req = http::Request::get(format!("http://{addr}/v1/models"))
                .header("authorization", format!("Bearer {key}"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request");
            let body = client().request(req).await.expect("GET").into_body().collect().await.expect("body").to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            v["data"]
                .as_array()
                .map(|d| d.iter().filter_map(|m| m["id"].as_str().map(String::from)).collect::<Vec<_>>())
                .unwrap_or_default()
        }
    };
    assert_eq!(list("sk-team").await, ["m1"]);
    let mut all = list("sk-ops").await;
    all.sort();
    assert_eq!(all, ["m1", "m2"]);
}

/// The access log's lines, parsed.
fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_id_in_the_response_the_replica_the_error_and_the_access_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let section = format!("telemetry:\n  access_log: {{ to: {} }}\n", log.display());
    let gw = start_gateway(&keyed(&mock, &[], &section)).await;
    let mut expected = Vec::new();
    for (proto, c) in clients() {
        // The caller's id is kept.
        let mine = format!("caller-{proto}").replace(['/', '.'], "-");
        let (s, h, _) = send(
            &c,
            gw.data_addr,
            "/v1/chat/completions",
            &chat_body(true, false),
            &[("authorization", "Bearer sk-ops"), ("x-request-id", &mine)],
        )
        .await;
        assert_eq!(s, 200);
        assert_eq!(header(&h, "x-request-id"), Some(mine.as_str()), "{proto}");
        let sent = mock.state.headers.lock().expect("lock").last().cloned().expect("replica got it");
        assert_eq!(header(&sent, "x-request-id"), Some(mine.as_str()), "{proto}: the replica's id is the same");
        expected.push((mine, 200));
        // None given (or one that is not well-formed): a new one, the same everywhere.
        let (s, h, _) = send(
            &c,
            gw.data_addr,
            "/v1/chat/completions",
            &chat_body(false, false),
            &[("authorization", "Bearer sk-ops"), ("x-request-id", "bad id")],
        )
        .await;
        assert_eq!(s, 200);
        let id = header(&h, "x-request-id").expect("an id").to_string();
        assert_eq!(id.len(), 32, "{proto}: {id}");
        let sent = mock.state.headers.lock().expect("lock").last().cloned().expect("replica got it");
        assert_eq!(header(&sent, "x-request-id"), Some(id.as_str()), "{proto}");
        expected.push((id, 200));
        // An error answer carries it too.
        let (s, h, text) = send(&c, gw.data_addr, "/v1/chat/completions", "{", &[("authorization", "Bearer sk-ops")]).await;
        assert_eq!(s, 400);
        let id = header(&h, "x-request-id").expect("an id").to_string();
        assert_eq!(error_body(text.as_bytes())["request_id"], id.as_str(), "{proto}");
        expected.push((id, 400));
    }
    wait_until("every line written", || {
        let log = log.clone();
        async move { lines(&log).len() == 6 }
    })
    .await;
    let got = lines(&log);
    for (line, (id, status)) in got.iter().zip(&expected) {
        assert_eq!(line["request_id"], id.as_str(), "{line}");
        assert_eq!(line["status"], *status, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_a_line_per_request_with_its_fields_and_never_a_key_or_a_body() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let section = format!("telemetry:\n  access_log: {{ to: {}, format: json }}\n", log.display());
    let gw = start_gateway(&keyed(&mock, &[], &section)).await;
    // Secrets a request may carry: its key, a body, a model nobody serves,
    // and a request id that holds the key.
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"BODY-SECRET-1"}],"max_tokens":4,"stream":true}"#;
    let unknown = r#"{"model":"MODEL-SECRET-2","messages":[{"role":"user","content":"BODY-SECRET-3"}]}"#;
    const N: usize = 1000;
    let addr = gw.data_addr;
    let sent = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..20 {
        let c = if w % 2 == 0 { client() } else { client_h2() };
        tasks.push(tokio::spawn(async move {
            for i in 0..N / 20 {
                let (path, b) = if i == 0 { ("/v1/chat/completions", unknown) } else { ("/v1/chat/completions", body) };
                let id = format!("id-sk-ops-{w}-{i}");
                let h = [("authorization", "Bearer sk-ops"), ("x-request-id", id.as_str())];
                let (s, _, _) = send(&c, addr, path, b, &h).await;
                assert_eq!(s, if i == 0 { 404 } else { 200 });
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let rate = N as f64 / sent.elapsed().as_secs_f64();
    gw.count_sent(N);
    wait_until("a line per request", || {
        let log = log.clone();
        async move { lines(&log).len() >= N }
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("log");
    for secret in ["sk-ops", "BODY-SECRET", "MODEL-SECRET", "Bearer"] {
        assert!(!text.contains(secret), "the access log holds `{secret}`");
    }
    let got = lines(&log);
    assert_eq!(got.len(), N, "one line per request (sent at {rate:.0} req/s)");
    let fields = [
        "time",
        "request_id",
        "tenant",
        "model",
        "class",
        "endpoint",
        "replica",
        "status",
        "outcome",
        "queue_ms",
        "ttft_ms",
        "e2e_ms",
        "prompt_tokens",
        "completion_tokens",
        "bytes_in",
        "bytes_out",
    ];
    for line in &got {
        for f in fields {
            assert!(line.get(f).is_some(), "no `{f}` in {line}");
        }
    }
    let ok = got.iter().find(|l| l["status"] == 200).expect("a served line");
    assert_eq!((ok["tenant"].as_str(), ok["model"].as_str(), ok["class"].as_str()), (Some("ops"), Some("m1"), Some("chat")));
    assert_eq!((ok["endpoint"].as_str(), ok["outcome"].as_str(), ok["replica"].as_str()), (Some("chat"), Some("ok"), Some("p-1")));
    assert_eq!((ok["prompt_tokens"].as_u64(), ok["completion_tokens"].as_u64()), (Some(7), Some(3)));
    assert!(ok["ttft_ms"].as_f64().is_some_and(|t| t > 0.0) && ok["bytes_out"].as_u64().is_some_and(|b| b > 100), "{ok}");
    assert_eq!(ok["bytes_in"].as_u64(), Some(body.len() as u64));
    assert!(ok["request_id"].as_str().is_some_and(|i| i.len() == 32), "an id holding the key was replaced: {ok}");
    let missing = got.iter().filter(|l| l["status"] == 404).collect::<Vec<_>>();
    assert_eq!(missing.len(), 20);
    assert_eq!((missing[0]["model"].as_str(), missing[0]["outcome"].as_str()), (Some("unknown"), Some("client_error")));
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_access_log_dropped_total", &[]), Some(0.0));
    assert_quiescent(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_file_is_reopened_on_reload_so_logrotate_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let cfg = dir.path().join("slogate.yaml");
    // A relative path is the config file's sibling.
    std::fs::write(&cfg, format!("{}telemetry:\n  access_log: {{ to: access.log }}\n", gateway_config(&[mock.url()]).yaml()))
        .expect("write");
    let gw = slogate::Gateway::start_file(&cfg).await.expect("start");
    let gw = started(gw);
    let admin = gw.admin_addr;
    wait_until("ready", || async move { get(admin, "/readyz").await.0 == 200 }).await;
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    wait_until("the first line", || {
        let log = log.clone();
        async move { lines(&log).len() == 1 }
    })
    .await;
    std::fs::rename(&log, &rotated).expect("rotate");
    gw.reload().await.expect("reload");
    post(&gw, "/v1/chat/completions", &chat_body(false, false), &[]).await;
    wait_until("the second line, in a new file", || {
        let log = log.clone();
        async move { lines(&log).len() == 1 }
    })
    .await;
    assert_eq!(lines(&rotated).len(), 1, "the rotated file kept its line and got no more");
    assert_quiescent(&gw).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_quota_refuses_with_quota_exceeded_until_midnight() {
    let mock = Mock::start(standard(2, Duration::ZERO)).await;
    let yaml = format!(
        "{}auth:\n  keys:\n    - {{ name: q, key_sha256: {}, classes: [chat], limits: {{ tokens_per_day: 100 }} }}\n",
        gateway_config(&[mock.url()]).yaml(),
        key_sha256("sk-q")
    );
    let gw = start_gateway(&yaml).await;
    // Each request reserves its prompt estimate plus max_tokens 40; the
    // replica reports 10 used (7 + 3), settled at its end.
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":40}"#;
    let mut served = 0u64;
    for (proto, c) in clients() {
        loop {
            let (s, h, text) = send(&c, gw.data_addr, "/v1/chat/completions", body, &[("authorization", "Bearer sk-q")]).await;
            if s == 200 {
                served += 1;
                assert!(served < 20, "{proto}: the quota never refused");
                // Settled to the replica's usage when the request ended.
                let admin = gw.admin_addr;
                wait_until("the request settled", || async move {
                    let slo: serde_json::Value = serde_json::from_str(&get(admin, "/slo.json").await.1).expect("JSON");
                    slo["tenants"][0]["quotas"][0]["used"].as_u64() == Some(10 * served)
                })
                .await;
                continue;
            }
            assert_eq!(s, 429, "{proto}: {text}");
            let e = error_body(text.as_bytes());
            assert_eq!(e["code"], "quota_exceeded", "{proto}");
            assert!(e["message"].as_str().unwrap_or("").contains("tokens per day"), "{proto}: {e}");
            let retry: u64 = header(&h, "retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
            let to_midnight = 86_400 - now % 86_400;
            assert!(retry.abs_diff(to_midnight) <= 5, "{proto}: Retry-After {retry} s, midnight in {to_midnight} s");
            assert_eq!(header(&h, "x-ratelimit-limit-tokens"), Some("100"), "{proto}");
            assert_eq!(header(&h, "x-ratelimit-remaining-tokens"), Some("50"), "{proto}: 50 left cannot hold a request's 60");
            break;
        }
    }
    // 60 reserved (20 of prompt estimate, 40 of max_tokens), 10 used: five fit.
    assert_eq!(served, 5, "against 100 tokens a day");
    let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
    let q = &slo["tenants"][0]["quotas"][0];
    assert_eq!((q["window"].as_str(), q["kind"].as_str(), q["limit"].as_u64()), (Some("day"), Some("tokens"), Some(100)), "{slo}");
    assert!(q["used"].as_u64().is_some_and(|u| u <= 100), "{q}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "q"), ("kind", "quota")]), Some(2.0));
    assert!(metric(&m, "slogate_key_quota_used", &[("tenant", "q"), ("window", "day")]).is_some_and(|u| u > 0.0));
}
