//! slogate as Envoy's endpoint picker, hermetic: a tonic `ext_proc` client
//! plays Envoy (headers, then the buffered body; the pick followed to the
//! replica it names; the replica's head and each body chunk relayed), in
//! the style of the reference EPP's hermetic suite.

use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::common::*;

/// One request's stream to the EPP, as Envoy holds it.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    answers: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(gw: &Gw) -> Stream {
        let addr = gw.epp_addr.expect("epp listener");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
        Stream::on(channel).await
    }

    async fn on(channel: tonic::transport::Channel) -> Stream {
        let mut client = ExternalProcessorClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let requests = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let answers = client.process(requests).await.expect("process").into_inner();
        Stream { tx, answers }
    }

    async fn send(&self, r: processing_request::Request, metadata: Option<Metadata>) {
        let msg = ProcessingRequest { request: Some(r), metadata_context: metadata, ..Default::default() };
        self.tx.send(msg).await.expect("the stream is open");
    }

    async fn answer_whole(&mut self) -> ProcessingResponse {
        let got = tokio::time::timeout(Duration::from_secs(10), self.answers.message()).await.expect("an answer in time");
        got.expect("no error").expect("an answer")
    }

    async fn answer(&mut self) -> processing_response::Response {
        self.answer_whole().await.response.expect("a response")
    }
}

fn headers(pairs: &[(&str, &str)], end: bool) -> HttpHeaders {
    let headers = pairs.iter().map(|(k, v)| HeaderValue { key: k.to_string(), raw_value: v.as_bytes().to_vec(), ..Default::default() });
    HttpHeaders { headers: Some(HeaderMap { headers: headers.collect() }), end_of_stream: end, ..Default::default() }
}

/// `envoy.lb.subset_hint` naming `endpoints`.
fn subset(endpoints: &[String]) -> Metadata {
    let list = ListValue { values: endpoints.iter().map(|e| Value { kind: Some(Kind::StringValue(e.clone())) }).collect() };
    let inner =
        Struct { fields: [("x-gateway-destination-endpoint-subset".to_string(), Value { kind: Some(Kind::ListValue(list)) })].into() };
    Metadata { filter_metadata: [("envoy.lb.subset_hint".to_string(), inner)].into(), ..Default::default() }
}

/// What came of one request through the EPP.
#[derive(Debug)]
enum Outcome {
    /// slogate answered itself: status, headers, body.
    Immediate(u16, Vec<(String, String)>, String),
    /// Sent where the EPP said: the destination, and the body as the client reads it.
    Relayed { destination: String, body: String },
}

/// Envoy in miniature: send `body` for `path` (with `extra` headers and
/// `hint`) through the EPP; follow the pick to the replica it names and
/// relay the replica's answer through the EPP, chunk by chunk.
async fn through(gw: &Gw, path: &str, body: &str, extra: &[(&str, &str)], hint: Option<Metadata>) -> Outcome {
    through_on(Stream::open(gw).await, gw, path, body, extra, hint).await
}

/// As [`through`], on the stream `s`.
async fn through_on(mut s: Stream, gw: &Gw, path: &str, body: &str, extra: &[(&str, &str)], hint: Option<Metadata>) -> Outcome {
    gw.count_sent(1);
    let mut head = vec![(":method", "POST"), (":path", path), (":authority", "gateway"), ("content-type", "application/json")];
    head.extend_from_slice(extra);
    s.send(processing_request::Request::RequestHeaders(headers(&head, false)), hint).await;
    assert!(matches!(s.answer().await, processing_response::Response::RequestHeaders(_)), "the headers go on");
    let chunk = HttpBody { body: body.as_bytes().to_vec(), end_of_stream: true, ..Default::default() };
    s.send(processing_request::Request::RequestBody(chunk), None).await;
    let whole = s.answer_whole().await;
    let metadata = whole
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get("envoy.lb"))
        .and_then(|v| if let Some(Kind::StructValue(s)) = &v.kind { s.fields.get("x-gateway-destination-endpoint") } else { None })
        .and_then(|v| if let Some(Kind::StringValue(s)) = &v.kind { Some(s.clone()) } else { None })
        .unwrap_or_default();
    let common = match whole.response.expect("a response") {
        processing_response::Response::ImmediateResponse(i) => {
            let hs = i.headers.iter().flat_map(|m| &m.set_headers).filter_map(|o| o.header.as_ref());
            let hs = hs.map(|h| (h.key.clone(), String::from_utf8_lossy(&h.raw_value).into_owned())).collect();
            let status = i.status.map_or(0, |s| s.code as u16);
            return Outcome::Immediate(status, hs, String::from_utf8_lossy(&i.body).into_owned());
        }
        processing_response::Response::RequestBody(b) => b.response.expect("a common response"),
        other => panic!("unexpected answer {other:?}"),
    };
    assert!(common.clear_route_cache, "the route is chosen again");
    let set = common.header_mutation.as_ref().map(|m| m.set_headers.clone()).unwrap_or_default();
    let value = |k: &str| {
        set.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == k).map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
    };
    let destination = value("x-gateway-destination-endpoint").expect("the pick in a header");
    assert_eq!(metadata, destination, "the same pick in the envoy.lb metadata");
    let sent_body = match common.body_mutation.and_then(|m| m.mutation) {
        Some(body_mutation::Mutation::Body(b)) => {
            assert_eq!(value("content-length"), Some(b.len().to_string()), "a rewritten body's length");
            b
        }
        _ => body.as_bytes().to_vec(),
    };
    // The replica Envoy sends it to.
    let resp = to_the_replica(&mut s, &destination, path, sent_body).await;
    let mut body = resp.into_body();
    let mut client_reads = Vec::new();
    let mut chunks: Vec<Bytes> = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame.expect("frame").into_data() {
            chunks.push(d);
        }
    }
    let n = chunks.len();
    for (i, c) in chunks.into_iter().enumerate() {
        let last = i + 1 == n;
        s.send(processing_request::Request::ResponseBody(HttpBody { body: c.to_vec(), end_of_stream: last, ..Default::default() }), None)
            .await;
        let processing_response::Response::ResponseBody(b) = s.answer().await else { panic!("a body answer") };
        match b.response.and_then(|r| r.body_mutation).and_then(|m| m.mutation) {
            Some(body_mutation::Mutation::Body(instead)) => client_reads.extend_from_slice(&instead),
            _ => client_reads.extend_from_slice(&c),
        }
    }
    Outcome::Relayed { destination, body: String::from_utf8_lossy(&client_reads).into_owned() }
}

/// Envoy sends the request (`body`) to the replica the picker named, and
/// relays the answer's head through the picker (answered unchanged); the
/// answer, its body still to read.
async fn to_the_replica(s: &mut Stream, destination: &str, path: &str, body: Vec<u8>) -> http::Response<hyper::body::Incoming> {
    let req = http::Request::post(format!("http://{destination}{path}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request");
    let resp = client().request(req).await.expect("the replica answers");
    let mut rhead = vec![(":status".to_string(), resp.status().as_u16().to_string())];
    rhead.extend(resp.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())));
    let rhead: Vec<(&str, &str)> = rhead.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    s.send(processing_request::Request::ResponseHeaders(headers(&rhead, false)), None).await;
    assert!(matches!(s.answer().await, processing_response::Response::ResponseHeaders(_)));
    resp
}

fn epp_config(urls: &[String]) -> ConfigBuilder {
    gateway_config(urls).section("epp: { listen: 127.0.0.1:0 }")
}

fn endpoint(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_string()
}

/// Headers, then the body, then the pick in the destination header (and
/// the route cache cleared); the stream followed to that replica and its
/// events relayed unchanged, measured as in proxy mode (TTFT, a gap per
/// token after the first, the replica's usage), and the usage chunk slogate
/// asked for cut back out of the client's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pick_goes_in_the_header_and_the_stream_is_echoed_and_measured() {
    let answer = |r: &serde_json::Value| {
        if r["stream"] == true {
            vllm_stream(r, 4, Duration::ZERO, "stop")
        } else {
            json_answer("Hello there", "stop", 7, 4)
        }
    };
    let (a, b) = (Mock::start(script(answer)).await, Mock::start(script(answer)).await);
    let gw = epp_config(&[a.url(), b.url()]).start().await;
    let replicas = [endpoint(&a.url()), endpoint(&b.url())];
    for usage in [false, true] {
        let Outcome::Relayed { destination, body, .. } = through(&gw, "/v1/chat/completions", &chat_body(true, usage), &[], None).await
        else {
            panic!("relayed")
        };
        assert!(replicas.contains(&destination), "{destination} is one of {replicas:?}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        assert_eq!(body.contains("\"usage\""), usage, "usage only when the client asked for it: {body}");
    }
    let Outcome::Relayed { body, .. } = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[], None).await else { panic!() };
    assert!(body.contains("chat.completion"), "{body}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(3.0), "{m}");
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &[]), Some(6.0), "{m}");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(12.0), "{m}");
    assert_eq!(a.calls() + b.calls(), 3, "each request went once, where the EPP said");
    assert_eq!(metric(&m, "slogate_epp_decision_seconds_count", &[]), Some(3.0), "a decision each: {m}");
    assert_quiescent(&gw).await;
}

fn streaming() -> ScriptFn {
    script(|r| if r["stream"] == true { vllm_stream(r, 3, Duration::ZERO, "stop") } else { json_answer("Hello", "stop", 7, 1) })
}

/// Envoy's subset hint narrows the pick to the endpoints it names; a hint
/// that names none slogate can use is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_narrows_the_pick() {
    let (a, b) = (Mock::start(streaming()).await, Mock::start(streaming()).await);
    let gw = epp_config(&[a.url(), b.url()]).start().await;
    let only_b = [endpoint(&b.url())];
    for _ in 0..4 {
        let got = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[], Some(subset(&only_b))).await;
        let Outcome::Relayed { destination, .. } = got else { panic!("relayed: {got:?}") };
        assert_eq!(destination, only_b[0]);
    }
    assert_eq!((a.calls(), b.calls()), (0, 4));
    for hint in [vec!["127.0.0.1:1".to_string()], vec![]] {
        let got = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[], Some(subset(&hint))).await;
        let Outcome::Immediate(status, _, body) = got else { panic!("immediate: {got:?}") };
        assert_eq!(status, 503, "{hint:?}: {body}");
    }
    assert_quiescent(&gw).await;
}

/// slogate's refusals reach the client as Envoy's immediate responses: a
/// key over its rate gets 429 with Retry-After and OpenAI's error body, an
/// unknown model 404, a bad key 401; no replica is picked for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_immediate_responses_with_retry_after() {
    let a = Mock::start(streaming()).await;
    let keys = format!(
        "auth:\n  keys:\n    - {{ name: one, key_sha256: {}, classes: [chat], limits: {{ requests_per_minute: 1 }} }}\n",
        slogate::config::key_sha256("sk-one")
    );
    let gw = epp_config(&[a.url()]).section(&keys).start().await;
    let key = [("authorization", "Bearer sk-one")];
    assert!(matches!(through(&gw, "/v1/chat/completions", &chat_body(false, false), &key, None).await, Outcome::Relayed { .. }));
    let got = through(&gw, "/v1/chat/completions", &chat_body(false, false), &key, None).await;
    let Outcome::Immediate(status, headers, body) = got else { panic!("immediate: {got:?}") };
    assert_eq!(status, 429, "{body}");
    let retry = headers.iter().find(|(k, _)| k == "retry-after").map(|(_, v)| v.clone());
    assert!(retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|n| n >= 1)), "Retry-After: {headers:?}");
    let e: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(e["error"]["message"].is_string() && e["error"]["code"].is_string(), "OpenAI's error shape: {body}");
    let got = through(&gw, "/v1/chat/completions", &chat_body(false, false).replace("m1", "nope"), &key, None).await;
    assert!(matches!(got, Outcome::Immediate(404, ..)), "{got:?}");
    let got = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[("authorization", "Bearer wrong")], None).await;
    assert!(matches!(got, Outcome::Immediate(401, ..)), "{got:?}");
    assert_eq!(a.calls(), 1, "only the first went to a replica");
    // The caller's key stays with the gateway: the pick removes it.
    assert!(a.state.headers.lock().expect("lock").iter().all(|h| h.get("authorization").is_none()));
    assert_quiescent(&gw).await;
}

/// No replica can serve: 503, as Envoy's immediate response.
#[tokio::test]
async fn no_healthy_replica_is_503() {
    let a = Mock::start(streaming()).await;
    let gw = epp_config(&[a.url()]).pool("health: { interval: 100ms, panic_threshold: 0 }").start().await;
    a.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    wait_until("replica taken out", || async { get(gw.admin_addr, "/readyz").await.0 == 503 }).await;
    let got = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[], None).await;
    let Outcome::Immediate(status, headers, _) = got else { panic!("immediate: {got:?}") };
    assert_eq!(status, 503);
    assert!(headers.iter().any(|(k, _)| k == "retry-after"), "{headers:?}");
    assert_quiescent(&gw).await;
}

/// A client that leaves mid-stream (Envoy closes the exchange) releases
/// its slot, counted as cancelled with the tokens it had.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_releases_its_slot() {
    let a = Mock::start(streaming()).await;
    let gw = epp_config(&[a.url()]).start().await;
    gw.count_sent(1);
    let mut s = Stream::open(&gw).await;
    let head = [(":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json")];
    s.send(processing_request::Request::RequestHeaders(headers(&head, false)), None).await;
    s.answer().await;
    let body = HttpBody { body: chat_body(true, false).into_bytes(), end_of_stream: true, ..Default::default() };
    s.send(processing_request::Request::RequestBody(body), None).await;
    assert!(matches!(s.answer().await, processing_response::Response::RequestBody(_)));
    let rhead = [(":status", "200"), ("content-type", "text/event-stream")];
    s.send(processing_request::Request::ResponseHeaders(headers(&rhead, false)), None).await;
    s.answer().await;
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_inflight_requests", &[]), Some(1.0), "the stream holds its slot: {m}");
    let mut first = role_chunk().to_vec();
    first.extend_from_slice(&content_chunk("Hel"));
    s.send(processing_request::Request::ResponseBody(HttpBody { body: first, ..Default::default() }), None).await;
    s.answer().await;
    drop(s);
    wait_until("counted", || async { requests_with_outcome(&gw, "cancelled").await == 1.0 }).await;
    assert_quiescent(&gw).await;
}

/// The picker alone (`epp.proxy: false`): no proxy listener, the picker serves.
#[tokio::test]
async fn the_picker_may_run_without_the_proxy_listener() {
    let a = Mock::start(streaming()).await;
    let gw = gateway_config(&[a.url()]).section("epp: { listen: 127.0.0.1:0, proxy: false }").start().await;
    assert!(tokio::net::TcpStream::connect(gw.data_addr).await.is_err(), "no proxy listener");
    assert!(matches!(through(&gw, "/v1/chat/completions", &chat_body(false, false), &[], None).await, Outcome::Relayed { .. }));
    assert_quiescent(&gw).await;
}

/// The Inference Extension's fairness id is the tenant of a gateway without
/// keys (its requests count under it, and fair share sees it); with keys
/// the key is, whatever the header says.
#[tokio::test]
async fn the_fairness_id_is_the_tenant_without_keys_and_the_key_wins_with_them() {
    let a = Mock::start(streaming()).await;
    let gw = epp_config(&[a.url()]).start().await;
    for flow in ["team-a", "team-b", "team-b"] {
        let sent = through(&gw, "/v1/chat/completions", &chat_body(false, false), &[("x-llm-d-inference-fairness-id", flow)], None).await;
        assert!(matches!(sent, Outcome::Relayed { .. }), "{sent:?}");
    }
    let m = metrics_text(&gw).await;
    let count = |t: &str| metric(&m, "slogate_tenant_requests_total", &[("tenant", t), ("outcome", "ok")]);
    assert_eq!((count("team-a"), count("team-b"), count("anonymous")), (Some(1.0), Some(2.0), None), "{m}");
    assert_quiescent(&gw).await;

    let keyed = epp_config(&[a.url()])
        .section(&format!(
            "auth:\n  keys:\n    - {{ name: owner, key_sha256: {}, classes: [chat] }}",
            slogate::config::key_sha256("sk-owner")
        ))
        .start()
        .await;
    let head = [("x-llm-d-inference-fairness-id", "team-a"), ("authorization", "Bearer sk-owner")];
    assert!(matches!(through(&keyed, "/v1/chat/completions", &chat_body(false, false), &head, None).await, Outcome::Relayed { .. }));
    let m = metrics_text(&keyed).await;
    let count = |t: &str| metric(&m, "slogate_tenant_requests_total", &[("tenant", t), ("outcome", "ok")]);
    assert_eq!((count("owner"), count("team-a")), (Some(1.0), None), "{m}");
    assert_quiescent(&keyed).await;
}

/// `epp.tls`: the picker serves `ext_proc` and gRPC health over TLS (ALPN
/// h2), and a client that trusts its certificate gets its pick.
#[tokio::test]
async fn the_picker_serves_over_tls_when_given_a_certificate() {
    let a = Mock::start(streaming()).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let (cert, cert_path, key_path) = self_signed_in(tmp.path());
    let epp = format!("epp: {{ listen: 127.0.0.1:0, tls: {{ cert: {}, key: {} }} }}", cert_path.display(), key_path.display());
    let gw = gateway_config(&[a.url()]).section(&epp).start().await;
    let addr = gw.epp_addr.expect("epp listener");
    // h2c is not served.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect().await;
    let refused = match plain {
        Err(_) => true,
        Ok(ch) => tonic_health::pb::health_client::HealthClient::new(ch)
            .check(tonic_health::pb::HealthCheckRequest { service: "liveness".into() })
            .await
            .is_err(),
    };
    assert!(refused, "no answer without TLS");

    let connector = tls_trusting(&cert, &[b"h2"]);
    let connect = tower::service_fn(move |_: http::Uri| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector(connect).await.expect("TLS channel");
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest { service: "liveness".into() })
        .await
        .expect("health over TLS");
    assert_eq!(health.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    let sent = through_on(Stream::on(channel).await, &gw, "/v1/chat/completions", &chat_body(false, false), &[], None).await;
    let Outcome::Relayed { destination, .. } = sent else { panic!("relayed: {sent:?}") };
    assert_eq!(destination, endpoint(&a.url()));
    assert_quiescent(&gw).await;
}

/// Envoy in full duplex (`FULL_DUPLEX_STREAMED` announced in the first
/// message, as the Inference Extension's gateways configure it): the
/// headers, then the body in three chunks, unanswered until the last;
/// then the pick on the headers' answer (header, metadata, the length of
/// the body to come), and the body slogate rewrote (asking for usage)
/// streamed back; the replica's events each answered with the bytes the
/// client reads, measured as in proxy mode, the usage chunk cut back out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_full_duplex_the_pick_waits_for_the_body_and_the_bodies_stream_back() {
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
    use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
    let mock = Mock::start(streaming()).await;
    let gw = epp_config(&[mock.url()]).start().await;
    gw.count_sent(1);
    let mut s = Stream::open(&gw).await;
    let duplex = BodySendMode::FullDuplexStreamed as i32;
    let config = ProtocolConfiguration { request_body_mode: duplex, response_body_mode: duplex, ..Default::default() };
    let head = [(":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "gateway"), ("content-type", "application/json")];
    let first = ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(headers(&head, false))),
        protocol_config: Some(config),
        ..Default::default()
    };
    s.tx.send(first).await.expect("open");
    let body = chat_body(true, false);
    let pieces: Vec<&[u8]> = body.as_bytes().chunks(body.len() / 3 + 1).collect();
    assert_eq!(pieces.len(), 3);
    for (i, p) in pieces.iter().enumerate() {
        let chunk = HttpBody { body: p.to_vec(), end_of_stream: i == 2, ..Default::default() };
        s.send(processing_request::Request::RequestBody(chunk), None).await;
    }
    // The first answer carries the pick: nothing answered the headers before the body was whole.
    let whole = s.answer_whole().await;
    let Some(processing_response::Response::RequestHeaders(h)) = whole.response else { panic!("the headers' answer first: {whole:?}") };
    let common = h.response.expect("common");
    assert!(common.clear_route_cache);
    let set: Vec<(String, String)> = common
        .header_mutation
        .expect("mutation")
        .set_headers
        .into_iter()
        .filter_map(|o| o.header)
        .map(|h| (h.key, String::from_utf8_lossy(&h.raw_value).into_owned()))
        .collect();
    let value = |k: &str| set.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(value("x-gateway-destination-endpoint"), Some(endpoint(&mock.url())));
    assert!(whole.dynamic_metadata.is_some_and(|m| m.fields.contains_key("envoy.lb")));
    let length: usize = value("content-length").expect("the body's length").parse().expect("a number");
    // The body streamed back, up to the chunk marked as its end.
    let mut sent = Vec::new();
    loop {
        let processing_response::Response::RequestBody(b) = s.answer().await else { panic!("the body's chunks") };
        let Some(body_mutation::Mutation::StreamedResponse(r)) = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation) else {
            panic!("streamed back")
        };
        sent.extend_from_slice(&r.body);
        if r.end_of_stream {
            break;
        }
    }
    assert_eq!(sent.len(), length);
    let asked: serde_json::Value = serde_json::from_slice(&sent).expect("JSON");
    assert_eq!(asked["stream_options"]["include_usage"], true, "slogate asks for the usage: {asked}");
    // The replica's answer, relayed in full duplex.
    let resp = to_the_replica(&mut s, &endpoint(&mock.url()), "/v1/chat/completions", sent).await;
    let text = resp.into_body().collect().await.expect("body").to_bytes();
    // An event a chunk, as the replica sends them.
    let chunks: Vec<Bytes> = String::from_utf8_lossy(&text).split_inclusive("\n\n").map(|e| Bytes::from(e.to_string())).collect();
    assert!(chunks.len() > 3, "{chunks:?}");
    let (n, mut reads) = (chunks.len(), Vec::new());
    for (i, c) in chunks.into_iter().enumerate() {
        s.send(
            processing_request::Request::ResponseBody(HttpBody { body: c.to_vec(), end_of_stream: i + 1 == n, ..Default::default() }),
            None,
        )
        .await;
        let processing_response::Response::ResponseBody(b) = s.answer().await else { panic!("a body answer") };
        let Some(body_mutation::Mutation::StreamedResponse(r)) = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation) else {
            panic!("streamed back")
        };
        assert_eq!(r.end_of_stream, i + 1 == n);
        reads.extend_from_slice(&r.body);
    }
    let reads = String::from_utf8_lossy(&reads);
    assert!(reads.contains("data: [DONE]") && !reads.contains("\"usage\""), "{reads}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[]), Some(1.0), "{m}");
    assert_quiescent(&gw).await;
}
