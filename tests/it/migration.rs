//! Moving from LiteLLM: `slogate import litellm` on a config and on
//! LiteLLM's recorded `/key/list` and `/team/list` answers (rows rebuilt
//! with keys the test knows), the imported keys working on slogate with
//! their models and limits, `--keys-from` against a stub of LiteLLM's
//! API page by page, and the routes LiteLLM's clients call.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use serde_json::{json, Value};
use slogate::config::key_sha256;

use crate::common::*;

/// The key the test gives the row aliased `alias`.
fn secret(alias: &str) -> String {
    format!("sk-{alias}-known-to-the-test")
}

/// LiteLLM's recorded answers, each key's token the hash of a key the test
/// knows; the team's rpm and tpm tightened below its keys', one key
/// allowed one request at once, and an expired key added.
fn recorded_rows() -> (Value, Value) {
    let dir = repo().join("tests/fixtures/litellm");
    let read = |f: &str| serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join(f)).expect("fixture")).expect("JSON");
    let (mut keys, mut teams) = (read("key_list.json"), read("team_list.json"));
    let rows = keys["keys"].as_array_mut().expect("keys");
    for row in rows.iter_mut() {
        let alias = row["key_alias"].as_str().expect("alias").to_string();
        row["token"] = json!(key_sha256(&secret(&alias)));
        if alias == "k-both" {
            row["max_parallel_requests"] = json!(1);
        }
    }
    let mut expired = rows.iter().find(|r| r["key_alias"] == "k-both").expect("k-both").clone();
    expired["key_alias"] = json!("k-expired");
    expired["token"] = json!(key_sha256(&secret("k-expired")));
    expired["expires"] = json!("2020-01-01T00:00:00Z");
    rows.push(expired);
    keys["total_count"] = json!(rows.len());
    teams[0]["rpm_limit"] = json!(3);
    teams[0]["tpm_limit"] = json!(60);
    (keys, teams)
}

/// A LiteLLM config of two model groups served as `served-small` and
/// `served-big` by `small` and `big`, with what the importer cannot carry.
fn litellm_config(dir: &Path, small: &str, big: &str) -> std::path::PathBuf {
    let main = format!(
        "model_list:\n  - model_name: m-small\n    litellm_params:\n      model: hosted_vllm/served-small\n      api_base: {small}/v1\n      api_key: none\n      rpm: 100\n    model_info: {{ input_cost_per_token: 0.000001, output_cost_per_token: 0.000002 }}\ninclude:\n  - groups.yaml\nrouter_settings:\n  routing_strategy: least-busy\n  num_retries: 2\ngeneral_settings:\n  master_key: sk-master-known-to-the-test\nlitellm_settings:\n  drop_params: true\n  request_timeout: 600\n"
    );
    let included = format!(
        "model_list:\n  - model_name: m-big\n    litellm_params:\n      model: openai/served-big\n      api_base: {big}/v1/\n  - model_name: claude\n    litellm_params:\n      model: anthropic/claude-3-5-sonnet\n"
    );
    std::fs::write(dir.join("config.yaml"), main).expect("write");
    std::fs::write(dir.join("groups.yaml"), included).expect("write");
    dir.join("config.yaml")
}

/// `slogate import litellm ARGS` (the binary, as a user runs it): its exit status and output.
fn import(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["import", "litellm"])
        .args(args)
        .env("LITELLM_MASTER_KEY", "sk-master-known-to-the-test")
        .output()
        .expect("run slogate");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The imported config with its keys inline, on loopback ports, the admin token left out.
fn serveable(out: &Path) -> String {
    let mut config: Value = serde_norway::from_str(&std::fs::read_to_string(out.join("slogate.yaml")).expect("config")).expect("YAML");
    let keys: Value = serde_norway::from_str(&std::fs::read_to_string(out.join("keys.yaml")).expect("keys")).expect("YAML");
    config["server"] = json!({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"});
    config["auth"] = json!({ "keys": keys });
    for p in config["pools"].as_array_mut().expect("pools") {
        p["health"] = json!({"interval": "100ms", "timeout": "1s", "unhealthy_after": 2, "healthy_after": 2});
    }
    serde_norway::to_string(&config).expect("YAML")
}

/// A replica serving `served` only (a request for another model is vLLM's
/// 404); its held requests ask for `facing`, the name clients use.
async fn replica(served: &'static str, facing: &str) -> Mock {
    let answer = move |r: &Value| {
        if r["model"] != served {
            return Script::json(404, &format!(r#"{{"error":{{"message":"The model `{}` does not exist.","code":404}}}}"#, r["model"]));
        }
        if r["stream"] == true {
            vllm_stream(r, 2, std::time::Duration::ZERO, "stop")
        } else {
            json_answer("ok", "stop", 5, 2)
        }
    };
    Mock::start_with_model(facing, script(answer)).await
}

fn ask(model: &str, max_tokens: u64) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens}}}"#)
}

async fn chat(gw: &Gw, key: &str, model: &str, max_tokens: u64) -> u16 {
    let auth = format!("Bearer {key}");
    post(&gw, "/v1/chat/completions", &ask(model, max_tokens), &[("authorization", &auth)]).await.0
}

async fn models_of(gw: &Gw, key: &str) -> BTreeSet<String> {
    let req = http::Request::get(format!("http://{}/v1/models", gw.data_addr))
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("models");
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.expect("body").to_bytes()).expect("JSON");
    body["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect()
}

/// The fields the report lists as not carried.
fn not_carried(report: &str) -> BTreeSet<String> {
    let section = report.split("## Not carried").nth(1).and_then(|s| s.split("## ").next()).unwrap_or("");
    section.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_string)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_keys_keep_their_strings_models_and_limits_and_the_report_names_what_was_left() {
    let (small, big) = (replica("served-small", "m-small").await, replica("served-big", "m-big").await);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = litellm_config(dir.path(), &small.url(), &big.url());
    let (keys, teams) = recorded_rows();
    let (keys_file, teams_file, out) = (dir.path().join("keys.json"), dir.path().join("teams.json"), dir.path().join("out"));
    std::fs::write(&keys_file, keys.to_string()).expect("write");
    std::fs::write(&teams_file, teams.to_string()).expect("write");
    let p = |p: &Path| p.display().to_string();
    let (ok, said) =
        import(&["--config", &p(&config), "--keys", &p(&keys_file), "--teams", &p(&teams_file), "--out", &p(&out), "--budgets-as-tokens"]);
    assert!(ok, "{said}");
    assert!(said.contains("(3 keys; 2 left out)"), "{said}");

    // `slogate check` takes it as written (with the master key's variable set).
    let (ok, said) = {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
            .args(["check", "--config", &p(&out.join("slogate.yaml"))])
            .env("LITELLM_MASTER_KEY", "sk-master-known-to-the-test")
            .output()
            .expect("run");
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    assert!(ok, "slogate check: {said}");

    let report = std::fs::read_to_string(out.join("report.md")).expect("report");
    let expected: BTreeSet<String> = [
        "keys[k-blocked]",
        "keys[k-expired]",
        "keys[k-big].team.max_budget",
        "keys[k-small].team.max_budget",
        "model_list[0].litellm_params.rpm",
        "model_list[2].litellm_params.model",
        "router_settings.routing_strategy",
        "litellm_settings.drop_params",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(not_carried(&report), expected, "{report}");
    assert!(report.contains("`router_settings.num_retries`") && report.contains("`teams[tenants-a]`"), "{report}");

    let gw = start_gateway(&serveable(&out)).await;
    wait_until("both pools healthy", || async { get(gw.admin_addr, "/readyz").await.0 == 200 }).await;
    // Each key, with the same string it had, sees exactly its models and is refused the others.
    let models = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(models_of(&gw, &secret("k-both")).await, models(&["m-small", "m-big"]));
    assert_eq!(models_of(&gw, &secret("k-big")).await, models(&["m-big"]));
    assert_eq!(models_of(&gw, &secret("k-small")).await, models(&["m-small"]));
    assert_eq!(models_of(&gw, "sk-master-known-to-the-test").await, models(&["m-small", "m-big"]));
    assert_eq!(chat(&gw, &secret("k-both"), "m-big", 10).await, 200, "served as served-big");
    assert_eq!(chat(&gw, &secret("k-big"), "m-big", 10).await, 200);
    assert_eq!(chat(&gw, &secret("k-big"), "m-small", 10).await, 403, "not its model");
    // Blocked and expired keys are not keys.
    assert_eq!(chat(&gw, &secret("k-blocked"), "m-small", 10).await, 401);
    assert_eq!(chat(&gw, &secret("k-expired"), "m-small", 10).await, 401);
    // The team's tighter rpm (3, under the key's 30): k-small's fourth request in the minute is refused.
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(chat(&gw, &secret("k-small"), "m-small", 5).await);
    }
    assert_eq!(answers, [200, 200, 200, 429], "the team's rpm holds");
    // The team's tighter tpm (60, under the key's 100,000): a request reserving more is refused.
    assert_eq!(chat(&gw, &secret("k-big"), "m-big", 100).await, 429, "the team's tpm holds");
    // k-both may have one request at once.
    let held = small.hold_slot_as(&gw, &[("authorization", &format!("Bearer {}", secret("k-both")))]).await;
    assert_eq!(chat(&gw, &secret("k-both"), "m-small", 5).await, 429, "its concurrency holds");
    held.release().await;
    assert_eq!(chat(&gw, &secret("k-both"), "m-small", 5).await, 200);
    assert_quiescent(&gw).await;
}

/// A stub of LiteLLM's key and team API: the keys in pages of two, only
/// with the master key; the pages asked for are noted.
async fn litellm_api(keys: Value, teams: Value) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let asked = Arc::new(Mutex::new(Vec::new()));
    let noted = asked.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (keys, teams, noted) = (keys.clone(), teams.clone(), noted.clone());
            let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let (keys, teams, noted) = (keys.clone(), teams.clone(), noted.clone());
                async move {
                    let authorized = req.headers().get("authorization").is_some_and(|v| v == "Bearer sk-master-known-to-the-test");
                    let q = req.uri().query().unwrap_or("").to_string();
                    noted.lock().expect("lock").push(format!("{}?{q}", req.uri().path()));
                    let rows = keys["keys"].as_array().cloned().unwrap_or_default();
                    let page: usize = q.split('&').find_map(|kv| kv.strip_prefix("page=")).and_then(|p| p.parse().ok()).unwrap_or(1);
                    let pages = rows.len().div_ceil(2);
                    let body = match (authorized, req.uri().path()) {
                        (false, _) => json!({"error": {"message": "Authentication Error", "code": "401"}}),
                        (true, "/key/list") => json!({
                            "keys": rows.iter().skip((page - 1) * 2).take(2).collect::<Vec<_>>(),
                            "total_count": rows.len(), "current_page": page, "total_pages": pages,
                        }),
                        (true, "/team/list") => teams,
                        _ => json!({}),
                    };
                    let status = if authorized { 200 } else { 401 };
                    let resp =
                        http::Response::builder().status(status).body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())));
                    Ok::<_, std::convert::Infallible>(resp.expect("response"))
                }
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(tcp), svc));
        }
    });
    (addr, asked)
}

#[tokio::test]
async fn keys_from_a_running_litellm_are_read_page_by_page_with_the_master_key() {
    let (keys, teams) = recorded_rows();
    let (addr, asked) = litellm_api(keys, teams).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = litellm_config(dir.path(), "http://127.0.0.1:9", "http://127.0.0.1:9");
    let out = dir.path().join("out");
    let (c, o, url) = (config.display().to_string(), out.display().to_string(), format!("http://{addr}"));
    let (ok, said) = tokio::task::spawn_blocking(move || import(&["--config", &c, "--keys-from", &url, "--out", &o])).await.expect("task");
    assert!(ok, "{said}");
    let pages: Vec<String> = asked.lock().expect("lock").iter().filter(|a| a.starts_with("/key/list")).cloned().collect();
    assert_eq!(pages.len(), 3, "five keys in pages of two: {pages:?}");
    assert!(pages.iter().all(|p| p.contains("return_full_object=true")), "{pages:?}");
    let written: Value = serde_norway::from_str(&std::fs::read_to_string(out.join("keys.yaml")).expect("keys")).expect("YAML");
    let names: BTreeSet<&str> = written.as_array().expect("list").iter().filter_map(|k| k["name"].as_str()).collect();
    assert_eq!(names, ["k-big", "k-both", "k-small", "litellm-master-key"].into_iter().collect());
    // Without the master key: a clear error, nothing half-written.
    let (c, o, url) = (config.display().to_string(), dir.path().join("other").display().to_string(), format!("http://{addr}"));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
            .args(["import", "litellm", "--config", &c, "--keys-from", &url, "--out", &o])
            .env("LITELLM_MASTER_KEY", "sk-wrong")
            .output()
            .expect("run")
    })
    .await
    .expect("task");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.path().join("other").exists(), "nothing written");
}

/// LiteLLM's routes: inference without `/v1`, `/key/info` for the calling
/// key, the health routes, and its key header, over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn the_routes_litellms_clients_call_are_answered() {
    let mock = replica("m1", "m1").await;
    let keys = format!(
        "auth:\n  keys:\n    - {{ name: team-a, key_sha256: {}, classes: [chat], models: [m1], limits: {{ requests_per_minute: 10, max_concurrent: 2 }} }}",
        key_sha256("sk-team-a")
    );
    let gw = gateway_config(&[mock.url()]).section(&keys).start().await;
    for (proto, c) in clients() {
        let send = |path: &str, method: http::Method, key: Option<(&str, &str)>, body: &str| {
            let mut b = http::Request::builder().method(method).uri(format!("http://{}{path}", gw.data_addr));
            if let Some((h, v)) = key {
                b = b.header(h, v).header("content-type", "application/json");
            }
            let req = b.body(http_body_util::Full::new(bytes::Bytes::from(body.to_string()))).expect("request");
            let c = c.clone();
            async move {
                let resp = c.request(req).await.expect("response");
                let status = resp.status().as_u16();
                (status, String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned())
            }
        };
        let bearer = Some(("authorization", "Bearer sk-team-a"));
        gw.count_sent(2);
        let (status, body) = send("/chat/completions", http::Method::POST, bearer, &ask("m1", 5)).await;
        assert_eq!(status, 200, "{proto}: {body}");
        assert!(body.contains("chat.completion"), "{proto}: {body}");
        let (status, body) =
            send("/chat/completions", http::Method::POST, Some(("x-litellm-api-key", "Bearer sk-team-a")), &ask("m1", 5)).await;
        assert_eq!(status, 200, "{proto}: LiteLLM's key header: {body}");
        let (status, body) = send("/models", http::Method::GET, Some(("x-litellm-api-key", "sk-team-a")), "").await;
        assert!(status == 200 && body.contains(r#""id":"m1""#), "{proto}: {status} {body}");
        let (status, body) = send("/key/info", http::Method::GET, bearer, "").await;
        assert_eq!(status, 200, "{proto}: {body}");
        let info: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(info["key"], json!(key_sha256("sk-team-a")), "{body}");
        assert_eq!(info["info"]["key_alias"], "team-a");
        assert_eq!(info["info"]["models"], json!(["m1"]));
        assert_eq!((info["info"]["rpm_limit"].as_u64(), info["info"]["max_parallel_requests"].as_u64()), (Some(10), Some(2)));
        assert!(info["info"]["slogate"]["requests_remaining_this_minute"].as_u64().is_some_and(|r| r < 10), "{body}");
        assert_eq!(send("/key/info", http::Method::GET, None, "").await.0, 401, "{proto}: no key");
        assert_eq!(send("/key/info?key=sk-someone-else", http::Method::GET, bearer, "").await.0, 403, "{proto}: another key");
        assert_eq!(send("/key/info?key=sk-team-a", http::Method::GET, bearer, "").await.0, 200, "{proto}: its own, named");
        assert_eq!(send("/health/liveliness", http::Method::GET, None, "").await, (200, r#""I'm alive!""#.to_string()), "{proto}");
        let (status, body) = send("/health/readiness", http::Method::GET, None, "").await;
        assert!(status == 200 && body.contains(r#""status":"healthy""#), "{proto}: {body}");
    }
    assert_eq!(mock.calls(), 4, "each inference request went once, as /v1/chat/completions");
    assert_quiescent(&gw).await;
}
