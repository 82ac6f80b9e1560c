//! Replicas as they are deployed: behind TLS (a private CA, mTLS, a
//! certificate for a name the URL does not carry) and started with an API
//! key. Every certificate is made here, by a throwaway CA.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use slogate::config::Config;
use slogate::Gateway;

/// A throwaway CA, a replica certificate for `replica.test` (only: the
/// replicas are reached as `https://127.0.0.1:port`) and a client
/// certificate for slogate, all as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertificateDer<'static>,
    server: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "slogate test CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA");
        let leaf = |name: &str, purpose: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(vec![name.to_string()]).expect("params");
            p.extended_key_usages = vec![purpose];
            (p.signed_by(&key, &ca, &ca_key).expect("signed"), key)
        };
        let (server, server_key) = leaf("replica.test", ExtendedKeyUsagePurpose::ServerAuth);
        let (client, client_key) = leaf("slogate", ExtendedKeyUsagePurpose::ClientAuth);
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("client.pem", client.pem()),
            ("client-key.pem", client_key.serialize_pem()),
            ("other-ca.pem", rcgen::generate_simple_self_signed(vec!["x".into()]).expect("cert").cert.pem()),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("write");
        }
        let server = (server.der().clone(), PrivateKeyDer::Pkcs8(server_key.serialize_der().into()));
        Pki { dir, ca: ca.der().clone(), server }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The replica's TLS: its certificate; with `require_client_cert`, mTLS
    /// (clients must show a certificate the CA signed).
    fn server_config(&self, require_client_cert: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder =
            rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().expect("versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca.clone()).expect("root");
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().expect("verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let cfg = builder.with_single_cert(vec![self.server.0.clone()], self.server.1.clone_key()).expect("server cert");
        Arc::new(cfg)
    }
}

/// Start a gateway that may never become ready (its replica fails its checks).
async fn start_unready(yaml: &str) -> Gw {
    let cfg = Config::parse(yaml).unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{yaml}"));
    started(Gateway::start(cfg).await.expect("gateway starts"))
}

/// The `/slo` entry of the pool's only replica once its health is known
/// to be `healthy`.
async fn replica_status(gw: &Gw, healthy: bool) -> serde_json::Value {
    let admin = gw.admin_addr;
    let entry = || async move {
        let (_, body) = get(admin, "/slo.json").await;
        let v: serde_json::Value = serde_json::from_str(&body).expect("/slo is JSON");
        v["pools"][0]["replicas"][0].clone()
    };
    wait_until("the replica's health is known", || async move {
        let r = entry().await;
        r["healthy"] == healthy && (healthy || r.get("reason").is_some())
    })
    .await;
    entry().await
}

async fn chat_through(c: &TestClient, gw: &Gw) -> (u16, String) {
    let resp = c.request(post_req(gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn https_replicas_behind_a_private_ca_serve_and_reuse_their_connections_and_sessions() {
    let pki = Pki::new();
    let opts = MockOptions { tls: Some(pki.server_config(false)), ..MockOptions::default() };
    let mock = Mock::start_with(standard(3, Duration::ZERO), opts).await;
    assert!(mock.url().starts_with("https://127.0.0.1:"));
    // Health checks and scrapes share the replica's connections: one in
    // flight when the next request goes would open a second. Here only the
    // first check runs, and nothing is scraped.
    let gw = gateway_config(&[mock.url()])
        .pool(&format!("tls: {{ ca: {}, server_name: replica.test }}", pki.path("ca.pem")))
        .pool("health: { interval: 1h, timeout: 1s }")
        .pool("max_inflight_per_replica: 8")
        .pool("scrape_metrics: 0s")
        .start()
        .await;

    for (proto, c) in clients() {
        for _ in 0..3 {
            let (status, text) = chat_through(&c, &gw).await;
            assert_eq!(status, 200, "{proto}: {text}");
            assert!(text.ends_with("data: [DONE]\n\n"), "{proto}: {text}");
        }
    }
    assert_eq!(mock.calls(), 6);
    assert_eq!(mock.state.post_connections.load(Ordering::SeqCst), 1, "requests one after another share one TLS connection");
    let resumed_before = mock.state.tls_resumed.load(Ordering::SeqCst);

    // The replica closes its idle connections (a keep-alive timeout): the
    // next request opens a new one, and resumes the TLS session.
    mock.close_idle_connections();
    wait_until("the replica closed its idle connections", || async { mock.state.closed_post_connections.load(Ordering::SeqCst) >= 1 })
        .await;
    let (status, text) = chat_through(&client(), &gw).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(mock.state.post_connections.load(Ordering::SeqCst), 2);
    assert!(mock.state.tls_resumed.load(Ordering::SeqCst) > resumed_before, "the new connection resumed the TLS session");
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn an_https_replica_whose_certificate_is_not_trusted_is_unhealthy_with_the_reason() {
    let pki = Pki::new();
    let opts = MockOptions { tls: Some(pki.server_config(false)), ..MockOptions::default() };
    let mock = Mock::start_with(standard(3, Duration::ZERO), opts).await;
    // Another CA than the replica's.
    let gw = start_unready(
        &gateway_config(&[mock.url()]).pool(&format!("tls: {{ ca: {}, server_name: replica.test }}", pki.path("other-ca.pem"))).yaml(),
    )
    .await;
    let r = replica_status(&gw, false).await;
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("TLS with 127.0.0.1") && reason.contains("UnknownIssuer"), "{reason}");
    let (status, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 503);
    assert_eq!(mock.calls(), 0, "nothing reached the replica");

    // The right CA but the URL's own host (an IP the certificate does not name).
    let gw = start_unready(&gateway_config(&[mock.url()]).pool(&format!("tls: {{ ca: {} }}", pki.path("ca.pem"))).yaml()).await;
    let r = replica_status(&gw, false).await;
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("certificate not valid for name \"127.0.0.1\""), "{reason}");
}

#[tokio::test]
async fn mtls_replicas_accept_slogates_client_certificate_and_refuse_a_gateway_without_one() {
    let pki = Pki::new();
    let opts = MockOptions { tls: Some(pki.server_config(true)), ..MockOptions::default() };
    let mock = Mock::start_with(standard(3, Duration::ZERO), opts).await;
    let tls = format!(
        "tls: {{ ca: {}, cert: {}, key: {}, server_name: replica.test }}",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem")
    );
    let gw = gateway_config(&[mock.url()]).pool(&tls).start().await;
    for (proto, c) in clients() {
        let (status, text) = chat_through(&c, &gw).await;
        assert_eq!(status, 200, "{proto}: {text}");
    }
    assert_quiescent(&gw).await;
    assert!(replica_status(&gw, true).await.get("reason").is_none());

    // No client certificate: the replica ends every handshake.
    let without = format!("tls: {{ ca: {}, server_name: replica.test }}", pki.path("ca.pem"));
    let calls = mock.calls();
    let gw = start_unready(&gateway_config(&[mock.url()]).pool(&without).yaml()).await;
    let r = replica_status(&gw, false).await;
    assert!(r["reason"].as_str().is_some_and(|s| s.starts_with("GET /health: ")), "{r}");
    assert_eq!(mock.calls(), calls);
}

/// Set an environment variable for this test binary (each test uses its own name).
fn set_env(name: &str, value: &str) {
    std::env::set_var(name, value);
}

#[tokio::test]
async fn a_pools_api_key_authenticates_requests_health_checks_and_scrapes_and_replaces_the_callers() {
    set_env("SLOGATE_TEST_REPLICA_KEY", "sk-replica-0123");
    let opts = MockOptions { api_key: Some("sk-replica-0123".into()), ..MockOptions::default() };
    let mock = Mock::start_with(standard(3, Duration::ZERO), opts).await;
    let gw = gateway_config(&[mock.url()]).pool("api_key_env: SLOGATE_TEST_REPLICA_KEY").pool("scrape_metrics: 100ms").start().await;

    for (proto, c) in clients() {
        let req = post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[("authorization", "Bearer caller-key")]);
        let resp = c.request(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"), "{proto}");
    }
    wait_until("health checks, model lists and scrapes have been seen", || async {
        let seen = mock.state.keyed.lock().expect("lock").clone();
        ["GET /health", "GET /metrics", "GET /v1/models", "POST /v1/chat/completions"].iter().all(|p| seen.iter().any(|(s, _)| s == p))
    })
    .await;
    let seen = mock.state.keyed.lock().expect("lock").clone();
    let without: Vec<&String> = seen.iter().filter(|(_, right)| !right).map(|(p, _)| p).collect();
    assert!(without.is_empty(), "requests without the replica's key: {without:?}");
    // The caller's own key never reached the replica.
    for h in mock.state.headers.lock().expect("lock").iter() {
        let auth: Vec<&http::HeaderValue> = h.get_all("authorization").iter().collect();
        assert_eq!(auth, ["Bearer sk-replica-0123"]);
    }
    // Neither the status page nor the metrics show the key.
    let (_, slo) = get(gw.admin_addr, "/slo").await;
    let (_, html) = get(gw.admin_addr, "/slo.json").await;
    let metrics = metrics_text(&gw).await;
    for text in [&slo, &html, &metrics] {
        assert!(!text.contains("sk-replica-0123"));
    }
    assert_quiescent(&gw).await;
}

#[tokio::test]
async fn a_wrong_api_key_shows_the_replica_unhealthy_with_the_reason() {
    set_env("SLOGATE_TEST_WRONG_REPLICA_KEY", "sk-not-the-replicas");
    let opts = MockOptions { api_key: Some("sk-replica-4567".into()), ..MockOptions::default() };
    let mock = Mock::start_with(standard(3, Duration::ZERO), opts).await;
    // vLLM's /health is open even with --api-key: the check passes it and
    // then finds the key refused on /v1/models.
    let gw = start_unready(&gateway_config(&[mock.url()]).pool("api_key_env: SLOGATE_TEST_WRONG_REPLICA_KEY").yaml()).await;
    let r = replica_status(&gw, false).await;
    assert_eq!(
        r["reason"].as_str().unwrap_or_default(),
        "/v1/models answered 401 Unauthorized: the replica refused the key in SLOGATE_TEST_WRONG_REPLICA_KEY"
    );
    let (status, _, body) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(mock.calls(), 0);
    let (_, slo) = get(gw.admin_addr, "/slo").await;
    assert!(!slo.contains("sk-not-the-replicas"));
}

#[test]
fn slogate_check_names_a_missing_ca_file_an_unset_key_variable_and_half_an_mtls_pair() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("slogate.yaml");
    let missing = dir.path().join("no-such-ca.pem");
    std::fs::write(
        &config,
        format!(
            "pools:\n  - name: a\n    models: [m]\n    replicas: [https://10.0.0.1:8000]\n    tls: {{ ca: {}, cert: {} }}\n    api_key_env: SLOGATE_TEST_KEY_NOBODY_SETS\n  - name: b\n    models: [n]\n    replicas: [http://10.0.0.2:8000]\n    tls: {{ server_name: 'not a name' }}\n",
            missing.display(),
            missing.display()
        ),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slogate")).args(["check", "--config"]).arg(&config).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for line in [
        format!("pools[0].tls.ca: {}: ", missing.display()),
        "pools[0].tls.key: is required with tls.cert".to_string(),
        "pools[0].api_key_env: environment variable SLOGATE_TEST_KEY_NOBODY_SETS is not set".to_string(),
        "pools[1].tls: is set, but no replica URL starts with https://".to_string(),
        "pools[1].tls.server_name: `not a name` is not a DNS name or an IP address".to_string(),
    ] {
        assert!(err.lines().any(|l| l.starts_with(&line)), "missing `{line}` in:\n{err}");
    }
}

/// A replica whose completions carry an `x-pad` header of `pad` bytes
/// (a proxy in front of it adding large headers): raw HTTP/1.1 on a free port.
async fn padded_replica(pad: usize) -> String {
    raw_replica(pad, "").await
}

/// A replica answering completions with `lines` (each ending in CRLF) in
/// their head after an `x-pad` header of `pad` bytes: raw HTTP/1.1 on a
/// free port.
async fn raw_replica(pad: usize, lines: &'static str) -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(head) = read_raw_request(&mut s, &mut buf).await {
                    let body = r#"{"id":"c","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                    // Health checks get a plain answer; only completions are padded.
                    let pad = if head.starts_with("post") { pad } else { 1 };
                    let lines = if head.starts_with("post") { lines } else { "" };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-pad: {}\r\n{lines}content-length: {}\r\n\r\n{body}",
                        "p".repeat(pad),
                        body.len()
                    );
                    if s.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A connection that carries streams reads 4 KiB at a time, but a
/// response head larger than that (a proxy in front of the replica adding
/// headers) passes whole, on a stream as on a whole answer; a head over
/// 64 KiB is a 502 with an OpenAI error body, never a hang or a cut answer.
#[tokio::test]
async fn a_response_head_past_the_read_buffer_passes_and_one_past_64_kib_is_a_502() {
    for pad in [3000, 5000, 60_000] {
        let gw = gateway_config(&[padded_replica(pad).await]).start().await;
        for stream in [true, false] {
            let (s, h, b) = post(&gw, "/v1/chat/completions", &chat_body(stream, false), &[]).await;
            assert_eq!(s, 200, "{pad} bytes of header, stream {stream}: {}", String::from_utf8_lossy(&b));
            assert_eq!(header(&h, "x-pad").map(str::len), Some(pad), "the replica's header passes");
            assert!(String::from_utf8_lossy(&b).contains("\"hi\""));
        }
        assert_quiescent(&gw).await;
    }
    let gw = gateway_config(&[padded_replica(70_000).await]).start().await;
    for stream in [true, false] {
        let (s, _, b) = post(&gw, "/v1/chat/completions", &chat_body(stream, false), &[]).await;
        assert_eq!(s, 502, "{}", String::from_utf8_lossy(&b));
        assert!(!error_code(&b).is_empty(), "an OpenAI error body: {}", String::from_utf8_lossy(&b));
    }
    assert_quiescent(&gw).await;
}

/// A replica's answer's headers of its own hop (`Connection`, those it
/// names, `Keep-Alive`, `Proxy-Connection`, `Upgrade`) do not reach the
/// client, over HTTP/1.1 or HTTP/2 (where a connection header is not even
/// allowed), while its other headers do.
#[tokio::test]
async fn a_replicas_hop_by_hop_headers_stay_on_its_hop() {
    let hop = "Connection: keep-alive, X-Replica-Hop\r\nX-Replica-Hop: secret\r\nKeep-Alive: timeout=5\r\n\
               Proxy-Connection: keep-alive\r\nUpgrade: h2c\r\nX-Kept: yes\r\n";
    let gw = gateway_config(&[raw_replica(1, hop).await]).start().await;
    for (proto, c) in clients() {
        for stream in [true, false] {
            let resp = c.request(post_req(&gw, "/v1/chat/completions", &chat_body(stream, false), &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}, stream {stream}");
            let h = resp.headers().clone();
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(String::from_utf8_lossy(&body).contains("\"hi\""), "{proto}, stream {stream}");
            for name in ["x-replica-hop", "keep-alive", "proxy-connection", "upgrade"] {
                assert!(h.get(name).is_none(), "{proto}, stream {stream}: {name} passed: {h:?}");
            }
            assert!(h.get_all("connection").iter().all(|v| v.as_bytes().eq_ignore_ascii_case(b"keep-alive")), "{proto}: {h:?}");
            assert_eq!(header(&h, "x-kept"), Some("yes"), "{proto}, stream {stream}: the replica's own header passes");
        }
    }
    assert_quiescent(&gw).await;
}

/// Each replica's time to first token is predicted at dispatch once a few
/// first tokens taught it, and judged at the first token: the error's
/// histogram counts every request dispatched after the first three, the
/// late ones among them, over HTTP/1.1 and HTTP/2 clients alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_time_to_first_token_is_predicted_and_judged() {
    let mock = Mock::start(standard(3, Duration::from_millis(2))).await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let replica = mock.url();
    let count = |m: &str| metric(m, "slogate_first_token_prediction_error_seconds_count", &[("replica", &replica)]);
    for i in 0..8 {
        let (proto, c) = &clients()[i % 2];
        let body = chat_body(true, false).replace("hello", &format!("hello {i}"));
        let resp = c.request(post_req(&gw, "/v1/chat/completions", &body, &[])).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        resp.into_body().collect().await.expect("body");
        let m = metrics_text(&gw).await;
        let judged = count(&m).unwrap_or(0.0);
        assert_eq!(judged, i.saturating_sub(2) as f64, "after request {i}: {m}");
    }
    let m = metrics_text(&gw).await;
    let late = metric(&m, "slogate_first_token_predicted_late_total", &[("replica", &replica)]).unwrap_or(0.0);
    assert!(late <= 5.0, "late {late} of 5 judged");
    assert_quiescent(&gw).await;
}

/// The load scrape follows traffic: with nothing sent to the replica it
/// rests (at most 5 s) instead of reading `/metrics` every
/// `scrape_metrics`, and a request's dispatch wakes it to read a period later.
#[tokio::test]
async fn the_load_scrape_rests_while_the_replica_gets_nothing_and_a_request_wakes_it() {
    let mock = Mock::start(standard(3, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).pool("scrape_metrics: 50ms").start().await;
    let scrapes = || mock.state.scrapes.load(Ordering::SeqCst);
    wait_until("the first scrape", || async { scrapes() >= 1 }).await;
    // Idle for 30 periods: ticking, it would have read 30 times.
    let before = scrapes();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle = scrapes() - before;
    assert!(idle <= 2, "{idle} scrapes of an idle replica in 1.5 s at scrape_metrics 50ms");
    // A request wakes it: read one period (50 ms) later, where the rest
    // that began at the last scrape would end 3.5 s from now.
    let woken = tokio::time::Instant::now();
    let before = scrapes();
    let (status, _, _) = post(&gw, "/v1/chat/completions", &chat_body(true, false), &[]).await;
    assert_eq!(status, 200);
    wait_until("a scrape after the request", || async { scrapes() > before }).await;
    assert!(woken.elapsed() < Duration::from_secs(2), "the request did not wake the scrape: {:?}", woken.elapsed());
    assert_quiescent(&gw).await;
}
