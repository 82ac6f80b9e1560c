//! Operator-facing pieces with the real tools: the /slo page rendered by
//! headless Chromium (text checked, screenshot saved), /slo.json and
//! /capacity, `slogate capacity`, the Prometheus scrape config through
//! `promtool check config`, and the Grafana dashboard and KEDA example
//! referring only to metrics the gateway exports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn chromium() -> PathBuf {
    which("chromium")
        .or_else(|| which("chromium-browser"))
        .expect("chromium not found: run scripts/test, which installs Debian's chromium package")
}

fn chromium_run(args: &[&str], profile: &Path) -> std::process::Output {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args);
    cmd.output().expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_page_renders_in_headless_chromium_with_every_section() {
    let good = Mock::start(standard(3, Duration::from_millis(5))).await;
    let gw = start_gateway(&config_yaml(&[good.url()], "")).await;
    // voice goes to a failing replica: a 5xx before any byte, retried, still 502.
    good.set_script(script(|req| {
        if req.get("stream").is_some() && req["messages"][0]["content"] == "fail" {
            Script::json(500, "")
        } else {
            vllm_stream(req, 3, Duration::from_millis(5), "stop")
        }
    }));
    for i in 0..12 {
        let class = if i % 3 == 0 { "batch" } else { "chat" };
        let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[("x-slo-class", class)]).await;
        assert_eq!(s, 200);
    }
    let fail = r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"fail"}]}"#;
    let (s, _, _) = post(&gw, "/v1/chat/completions", fail, &[("x-slo-class", "voice")]).await;
    assert_eq!(s, 500);
    // Let the publisher fold the counts and refresh the views.
    wait_until("the view has the chat samples", || async {
        let (_, j) = get(gw.admin_addr, "/slo.json").await;
        let v: serde_json::Value = serde_json::from_str(&j).unwrap_or_default();
        v["classes"].as_array().into_iter().flatten().any(|c| c["name"] == "chat" && c["samples"].as_u64() == Some(8))
            && v["classes"].as_array().into_iter().flatten().any(|c| c["name"] == "voice" && c["availability"]["valid"].as_u64() == Some(1))
    })
    .await;

    let (_, j) = get(gw.admin_addr, "/slo.json").await;
    let v: serde_json::Value = serde_json::from_str(&j).expect("slo.json");
    let chat = v["classes"].as_array().and_then(|a| a.iter().find(|c| c["name"] == "chat")).expect("chat");
    assert_eq!(chat["ttft_target_ms"], 300.0);
    assert_eq!(chat["latency"]["valid"], 8);
    assert_eq!(chat["availability"]["attainment"], 1.0);
    assert_eq!(chat["breaker"], "closed");
    let voice = v["classes"].as_array().and_then(|a| a.iter().find(|c| c["name"] == "voice")).expect("voice");
    assert_eq!(voice["availability"]["attainment"], 0.0);
    assert!(voice["availability"]["budget_remaining"].as_f64().is_some_and(|r| r < 0.0), "one failure overspends a 99.9 % budget");
    assert_eq!(v["pools"][0]["replicas"][0]["healthy"], true);
    assert!(v["budgets_since"].as_str().is_some_and(|s| s.ends_with('Z')));

    // The page as a browser renders it.
    let dir = repo().join("target").join("slo-page");
    std::fs::create_dir_all(&dir).expect("dir");
    let profile = dir.join(format!("profile-{}", std::process::id()));
    let url = format!("http://{}/slo", gw.admin_addr);
    let out = chromium_run(&["--dump-dom", &url], &profile);
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&out.stderr));
    for needle in [
        "slogate SLO status",
        "Latency against targets",
        "TTFT P99 ms",
        "ITL P99 ms",
        "Error budgets",
        "chat-latency",
        "voice-availability",
        "budget remaining",
        "burn 5m",
        "Queues",
        "interactive",
        "Replicas",
        &good.url(),
        "healthy",
        "closed",
        "error budgets counted since",
    ] {
        assert!(dom.contains(needle), "rendered page lacks {needle:?}");
    }
    let shot = dir.join("slo.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium_run(&[&format!("--screenshot={}", shot.display()), "--window-size=1280,1000", &url], &profile);
    assert!(out.status.success(), "chromium --screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.len() > 10_000 && png.starts_with(b"\x89PNG"), "not a real screenshot ({} bytes)", png.len());
    let _ = std::fs::remove_dir_all(&profile);
    assert_quiescent(&gw).await;
}

/// The last hour on /slo: per class, inline SVG charts of TTFT P99
/// against its target, attainment, admitted and refused, queue depth and
/// budget burn, drawn from the gateway's own history (a point every 200 ms
/// here), rendered by headless Chromium at desktop and phone widths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_history_charts_render_from_a_loaded_gateway() {
    let mock = Mock::start(standard(3, Duration::from_millis(5))).await;
    let gw = gateway_config(&[mock.url()])
        .pool("max_inflight_per_replica: 1")
        .section("tiers:\n  interactive: { queue_timeout: 300ms }")
        .section("slo:\n  history_step: 200ms")
        .start()
        .await;
    // Load: streams one after another for a while, then one refused (the
    // slot held, the queue times out).
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut sent = 0;
    while tokio::time::Instant::now() < until {
        let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
        assert_eq!(s, 200);
        sent += 1;
    }
    let held = mock.hold_slot(&gw).await;
    let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(s, 429);
    held.release().await;
    let history = |v: &serde_json::Value| v["history"]["classes"]["chat"].as_array().cloned().unwrap_or_default();
    let sum = |points: &[serde_json::Value], k: &str| points.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    wait_until("the history holds the load", || async {
        let v: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).unwrap_or_default();
        let p = history(&v);
        sum(&p, "admitted") == sent + 1 && sum(&p, "refused") == 1 && p.len() >= 5
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
    assert_eq!(v["history"]["step_s"], 0.2);
    let points = history(&v);
    let last = points.last().expect("points");
    assert_eq!(last["ttft_target_ms"], 300.0);
    assert!(points.iter().any(|p| p["ttft_p99_ms"].as_f64().is_some_and(|t| t > 0.0)), "TTFT P99 recorded");
    assert!(points.iter().any(|p| p["attainment"] == 1.0), "steps with completed requests within target");
    let max_admitted = points.iter().map(|p| p["admitted"].as_u64().unwrap_or(0)).max().unwrap_or(0);

    let dir = repo().join("target").join("slo-page");
    std::fs::create_dir_all(&dir).expect("dir");
    let profile = dir.join(format!("profile-history-{}", std::process::id()));
    let url = format!("http://{}/slo", gw.admin_addr);
    let out = chromium_run(&["--dump-dom", &url], &profile);
    assert!(out.status.success(), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&out.stderr));
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(dom.contains("Last hour"), "no history section");
    for series in ["ttft_p99", "attainment", "requests", "queued", "burn"] {
        let tag = format!("<svg class=\"hist\" data-class=\"chat\" data-series=\"{series}\"");
        assert!(dom.contains(&tag), "no {series} chart for chat");
    }
    // The data is the gateway's: the requests chart's top is the most
    // admitted in one step, the TTFT chart names the class's target.
    let requests = dom.split("data-series=\"requests\"").nth(1).and_then(|r| r.split("</svg>").next()).expect("requests chart");
    assert!(requests.contains("<polyline") && requests.contains("data-name=\"refused\""), "both series drawn");
    let top = requests.split("class=\"lbl\">").nth(1).and_then(|t| t.split('<').next()).expect("axis label");
    assert_eq!(
        top.parse::<f64>().ok(),
        Some(max_admitted as f64),
        "top of the requests chart: {top}, most admitted in a step {max_admitted}"
    );
    assert!(dom.contains("chat TTFT P99: ") && dom.contains("(target 300 ms)"));
    for (name, size) in [("slo-1400.png", "1400,1400"), ("slo-phone.png", "390,2400")] {
        let shot = dir.join(name);
        let _ = std::fs::remove_file(&shot);
        let out = chromium_run(&[&format!("--screenshot={}", shot.display()), &format!("--window-size={size}"), &url], &profile);
        assert!(out.status.success(), "chromium --screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
        let png = std::fs::read(&shot).expect("screenshot written");
        assert!(png.len() > 10_000 && png.starts_with(b"\x89PNG"), "not a real screenshot ({} bytes)", png.len());
    }
    let _ = std::fs::remove_dir_all(&profile);
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn page_is_self_contained_and_refreshes_itself() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    let (s, html) = get(gw.admin_addr, "/slo").await;
    assert_eq!(s, 200);
    assert!(html.contains("http-equiv=\"refresh\""));
    for external in ["<script src", "<link", "@import", "url("] {
        assert!(!html.contains(external), "external asset: {external}");
    }
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn capacity_endpoint_and_command_answer_per_class() {
    let mock = Mock::start(standard(2, Duration::from_millis(20))).await;
    let gw = start_gateway(&config_yaml(&[mock.url()], "")).await;
    for _ in 0..5 {
        post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    }
    wait_until("samples in the view", || async {
        let (_, j) = get(gw.admin_addr, "/slo.json").await;
        j.contains("\"samples\": 5")
    })
    .await;
    let (s, j) = get(gw.admin_addr, "/capacity?rate=chat=100").await;
    assert_eq!(s, 200, "{j}");
    let v: serde_json::Value = serde_json::from_str(&j).expect("json");
    let chat = v["estimates"].as_array().and_then(|a| a.iter().find(|e| e["class"] == "chat")).expect("chat");
    assert_eq!(chat["target_rps"], 100.0);
    assert_eq!(chat["utilisation_ceiling"], 0.63);
    let service = chat["service_time_ms"].as_f64().expect("service time");
    assert!(service >= 20.0, "median TTFT includes the 20 ms the replica waits: {service}");
    let expected = (100.0 / (0.63 / (service / 1000.0))).ceil() as u64;
    assert_eq!(chat["replicas_needed"], expected);
    assert!(v["assumptions"].as_str().is_some_and(|a| a.contains("ceil(rate / (ceiling / service_time))")));
    let (s, j) = get(gw.admin_addr, "/capacity?rate=chat").await;
    assert_eq!(s, 400, "{j}");

    // The command reads the same endpoint.
    let bin = env!("CARGO_BIN_EXE_slogate");
    let admin = format!("http://{}", gw.admin_addr);
    let out = tokio::task::spawn_blocking(move || Command::new(bin).args(["capacity", "--from", &admin, "--rate", "chat=100"]).output())
        .await
        .expect("join")
        .expect("run slogate capacity");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.starts_with("chat ")).expect("chat line");
    assert!(line.trim_end().ends_with(&expected.to_string()), "{line}");
    assert!(text.contains("ceil(rate / (ceiling / service_time))"), "the assumptions are printed with the answer");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn capacity_command_sends_the_admin_token_when_told_where_it_is() {
    std::env::set_var("SLOGATE_TEST_CAPACITY_TOKEN", "capacity-token");
    let mock = Mock::start(standard(2, Duration::from_millis(1))).await;
    let gw = gateway_config(&[mock.url()]).server("admin_token_env: SLOGATE_TEST_CAPACITY_TOKEN").start().await;
    let admin = format!("http://{}", gw.admin_addr);
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_slogate")).args(&args).env("MY_TOKEN", "capacity-token").output().expect("run")
        })
    };
    let base = vec!["capacity".to_string(), "--from".into(), admin.clone(), "--rate".into(), "chat=10".into()];
    let without = run(base.clone()).await.expect("join");
    assert!(!without.status.success(), "no token: refused");
    assert!(String::from_utf8_lossy(&without.stderr).contains("401"), "{}", String::from_utf8_lossy(&without.stderr));
    let mut with = base.clone();
    with.extend(["--admin-token-env".to_string(), "MY_TOKEN".into()]);
    let with = run(with).await.expect("join");
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));
    assert!(String::from_utf8_lossy(&with.stdout).lines().any(|l| l.starts_with("chat ")));
    let mut unset = base;
    unset.extend(["--admin-token-env".to_string(), "SLOGATE_TEST_UNSET_VARIABLE".into()]);
    let unset = run(unset).await.expect("join");
    assert!(String::from_utf8_lossy(&unset.stderr).contains("SLOGATE_TEST_UNSET_VARIABLE is not set"));
    gw.shutdown().await;
}

#[test]
fn capacity_command_reads_a_loadgen_result() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let mut records = Vec::new();
    for i in 0..100 {
        records
            .push(serde_json::json!({"class": "chat", "outcome": "length", "ttft_ms": 90.0 + (i % 21) as f64, "start_s": i as f64 * 0.1}));
    }
    let result =
        serde_json::json!({"elapsed_s": 10.0, "records": records, "scenario": {"classes": {"chat": {"ttft_ms": 300.0, "itl_ms": 50.0}}}});
    let path = dir.join("r.json");
    std::fs::write(&path, result.to_string()).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["capacity", "--from", path.to_str().expect("path"), "--rate", "chat=50", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let e = &v["estimates"][0];
    // Median TTFT 100 ms, 63 % ceiling: 6.3 req/s per replica, 50 req/s -> 8 replicas.
    assert_eq!(e["service_time_ms"], 100.0);
    assert_eq!(e["replicas_needed"], 8);
    let bad = Command::new(env!("CARGO_BIN_EXE_slogate")).args(["capacity", "--from", "/nonexistent.json"]).output().expect("run");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent.json"));
}

#[test]
fn prometheus_scrape_config_passes_promtool_check_config() {
    let promtool = which("promtool").expect("promtool not found: run scripts/test");
    let out = Command::new(promtool)
        .args(["check", "config", "deploy/monitoring/prometheus.yml"])
        .current_dir(repo())
        .output()
        .expect("promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check config failed:\n{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// Every `slogate_*` name a config file queries exists in the exposition.
#[test]
fn dashboard_and_keda_query_only_exported_metrics() {
    let metrics = slogate::telemetry::Metrics::new(&slogate::config::Config::default()).encode();
    let mut exported = std::collections::HashSet::new();
    for line in metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let mut it = line.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else { continue };
        match kind {
            "histogram" => exported.extend(["_bucket", "_count", "_sum"].map(|s| format!("{name}{s}"))),
            "counter" if name.ends_with("_total") => {
                exported.insert(name.to_string());
            }
            "counter" => {
                exported.insert(format!("{name}_total"));
            }
            _ => {
                exported.insert(name.to_string());
            }
        }
    }
    for file in ["deploy/monitoring/grafana-dashboard.json", "deploy/monitoring/keda-scaledobject.yaml"] {
        let text = std::fs::read_to_string(repo().join(file)).expect(file);
        if file.ends_with(".json") {
            let _: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
        }
        let mut used = 0;
        for (i, _) in text.match_indices("slogate_") {
            let name: String = text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(exported.contains(&name), "{file} queries {name}, which slogate does not export");
            used += 1;
        }
        assert!(used >= 3, "{file} queries only {used} slogate metrics");
    }
}

/// The image's default config (Dockerfile) is valid and listens where a
/// published port reaches it: on every interface, not on the container's
/// own loopback.
#[test]
fn container_config_is_valid_and_listens_on_every_interface() {
    let out = Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["check", "--config", "config/container.yaml"])
        .current_dir(repo())
        .output()
        .expect("run");
    assert!(out.status.success(), "slogate check: {}", String::from_utf8_lossy(&out.stderr));
    let cfg = slogate::config::Config::load(&repo().join("config/container.yaml")).expect("container config");
    for (field, addr) in [("server.listen", cfg.server.listen), ("server.admin_listen", cfg.server.admin_listen)] {
        assert!(addr.ip().is_unspecified(), "{field} is {addr}: unreachable from outside the container");
    }
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains("COPY --from=build /src/config/container.yaml /etc/slogate/slogate.yaml"),
        "the image does not ship config/container.yaml"
    );
    assert!(dockerfile.contains("\"--config\", \"/etc/slogate/slogate.yaml\""), "the image does not start with that config");
}

/// The admin listener's layers: a scrape that accepts gzip gets
/// `/metrics` gzipped (the same families), one that does not gets it
/// plain, over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn metrics_are_gzipped_for_a_scraper_that_asks() {
    use http_body_util::BodyExt;
    use std::io::Read;
    let mock = Mock::start(standard(2, Duration::from_millis(1))).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    for (proto, c) in clients() {
        let mut req = get_req(gw.admin_addr, "/metrics");
        req.headers_mut().insert("accept-encoding", "gzip".parse().expect("header"));
        let resp = c.request(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        assert_eq!(resp.headers().get("content-encoding").map(|v| v.as_bytes()), Some(&b"gzip"[..]), "{proto}");
        let zipped = resp.into_body().collect().await.expect("body").to_bytes();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&zipped[..]).read_to_string(&mut text).expect("gzip");
        assert!(text.contains("slogate_requests_total") && zipped.len() * 3 < text.len(), "{proto}: {} of {}", zipped.len(), text.len());
        let resp = c.request(get_req(gw.admin_addr, "/metrics")).await.expect("response");
        assert!(resp.headers().get("content-encoding").is_none(), "{proto}: plain unless asked");
        let plain = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(String::from_utf8_lossy(&plain).contains("slogate_requests_total"), "{proto}");
    }
    gw.shutdown().await;
}

/// A page on another origin, in headless Chromium, reads `/slo.json` (the
/// admin listener's CORS answer allows it) and cannot read `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_reads_slo_json_and_not_the_metrics() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = Mock::start(standard(2, Duration::from_millis(1))).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let admin = gw.admin_addr;
    let page = format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
async function read(path) {{
  try {{
    const r = await fetch("http://{admin}" + path);
    const t = await r.text();
    return path + ": read " + r.status + (t.includes('"classes"') || t.includes("slogate_") ? " with content" : " empty");
  }} catch (e) {{ return path + ": blocked"; }}
}}
Promise.all([read("/slo.json"), read("/metrics")]).then(x => {{ document.getElementById("out").textContent = x.join(" | "); }});
</script></body></html>"#
    );
    // The page's own origin: another port.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", page.len());
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(page.as_bytes()).await;
        }
    });
    let dir = repo().join("target").join("admin-cors");
    std::fs::create_dir_all(&dir).expect("dir");
    let profile = dir.join(format!("profile-{}", std::process::id()));
    let url = format!("http://{origin}/");
    let out = tokio::task::spawn_blocking(move || chromium_run(&["--virtual-time-budget=10000", "--dump-dom", &url], &profile))
        .await
        .expect("join");
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dom.contains("/slo.json: read 200 with content"), "{dom}");
    assert!(dom.contains("/metrics: blocked"), "{dom}");
    server.abort();
    gw.shutdown().await;
}
