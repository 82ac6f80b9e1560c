//! Enforcement, tried as an adversarial tenant would and judged by what
//! reaches the replica, over HTTP/1.1 and HTTP/2: a key limited to one
//! model cannot reach another through a multipart form written any way
//! the replica's parser reads; a token quota holds against cut streams,
//! concurrency, `n`, prompt lists, a missing or overflowing output limit
//! and the Responses API; a stream that runs past its key's reservation is
//! ended as a normal `length` finish; bodies held in memory are bounded;
//! credentials and a caller's priority never reach a replica, and an
//! isolated key's cache salt is the gateway's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slogate::config::key_sha256;
use tokio::sync::mpsc;

use crate::common::*;

type Body = BoxBody<Bytes, std::convert::Infallible>;
type AnyClient = Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

fn any_clients() -> [(&'static str, AnyClient); 2] {
    [
        ("HTTP/1.1", Client::builder(TokioExecutor::new()).build_http()),
        ("HTTP/2", Client::builder(TokioExecutor::new()).http2_only(true).build_http()),
    ]
}

/// A key entry for `auth.keys` (class chat) with `extra` fields.
fn key(name: &str, extra: &str) -> String {
    format!("    - {{ name: {name}, key_sha256: {}, classes: [chat]{extra} }}\n", key_sha256(&format!("sk-{name}")))
}

fn auth(name: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer sk-{name}"))
}

/// A gateway in front of `mock` serving `m-small` and `m-big`, with `keys`.
async fn gateway(mock: &Mock, keys: &[String], server: &[&str]) -> Gw {
    let mut b = gateway_config(&[mock.url()]).models(&["m-small", "m-big"]);
    for f in server {
        b = b.server(f);
    }
    start_gateway(&format!("{}auth:\n  keys:\n{}", b.yaml(), keys.concat())).await
}

/// A body sent whole with its length (`declared`), or in pieces without one
/// (chunked over HTTP/1.1); the sender of more pieces, when not declared.
fn body_of(bytes: &[u8], declared: bool) -> (Body, Option<mpsc::UnboundedSender<Bytes>>) {
    if declared {
        return (Full::new(Bytes::copy_from_slice(bytes)).boxed(), None);
    }
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), rx))
    });
    for piece in bytes.chunks(1000) {
        let _ = tx.send(Bytes::copy_from_slice(piece));
    }
    (StreamBody::new(frames).boxed(), Some(tx))
}

async fn send(c: &AnyClient, gw: &Gw, path: &str, headers: &[(&str, &str)], body: Body) -> (u16, http::HeaderMap, String) {
    gw.count_sent(1);
    let mut b = http::Request::post(format!("http://{}{path}", gw.data_addr));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c.request(b.body(body).expect("request")).await.expect("response");
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let text = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (status, parts.headers, String::from_utf8_lossy(&text).into_owned())
}

// ---- forms ----

fn part(disposition: &str, value: &str) -> String {
    format!("--XyZ\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n")
}

const FILE: &str =
    "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF....WAVEfmt \r\n";

/// Every way found to make the replica's parser read `m-big` where the
/// gateway once read `m-small`: (what, Content-Type, form).
fn smuggled() -> Vec<(&'static str, &'static str, String)> {
    let small = part(r#"form-data; name="model""#, "m-small");
    let ct = "multipart/form-data; boundary=XyZ";
    vec![
        ("a second model after the file", ct, format!("{small}{FILE}{}--XyZ--\r\n", part(r#"form-data; name="model""#, "m-big"))),
        ("Name= in another case", ct, format!("{small}{FILE}{}--XyZ--\r\n", part(r#"form-data; Name="model""#, "m-big"))),
        ("NAME= in capitals", ct, format!("{small}{FILE}{}--XyZ--\r\n", part(r#"form-data; NAME="model""#, "m-big"))),
        (
            "name= hidden in a quoted parameter",
            ct,
            format!(
                "{}{FILE}{}--XyZ--\r\n",
                part(r#"form-data; filename="x; name=model"; name="x""#, "m-small"),
                part(r#"form-data; name="model""#, "m-big")
            ),
        ),
        ("two name parameters", ct, format!("{}{FILE}--XyZ--\r\n", part(r#"form-data; name="model"; name="model2""#, "m-small"))),
        ("two boundaries", "multipart/form-data; boundary=XyZ; boundary=QqQ", format!("{small}{FILE}--XyZ--\r\n")),
    ]
}

/// Each smuggling variant, sent whole with its length and chunked, over
/// HTTP/1.1 and HTTP/2: a 400 naming what is ambiguous, and the replica
/// never gets the whole form. The same form without the smuggled part
/// goes through, byte for byte.
#[tokio::test]
async fn a_form_cannot_reach_a_model_its_key_may_not_use() {
    let mock = Mock::start_with_model("m-small", Script::json(200, r#"{"text":"ok"}"#).always()).await;
    let gw = gateway(&mock, &[key("a", ", models: [m-small]")], &[]).await;
    let (k, v) = auth("a");
    for (proto, c) in any_clients() {
        for declared in [true, false] {
            for (what, ct, form) in smuggled() {
                let seen = mock.state.raw_bodies.lock().expect("lock").len();
                let (body, more) = body_of(form.as_bytes(), declared);
                drop(more);
                let (s, _, text) = send(&c, &gw, "/v1/audio/transcriptions", &[(k, &v), ("content-type", ct)], body).await;
                assert_eq!(s, 400, "{proto} declared={declared} {what}: {text}");
                assert!(text.contains("multipart form"), "{proto} {what}: {text}");
                let got = mock.state.raw_bodies.lock().expect("lock")[seen..].to_vec();
                assert!(got.iter().all(|b| b.len() < form.len()), "{proto} declared={declared} {what}: the replica got the whole form");
            }
            let fine = format!("{}{FILE}--XyZ--\r\n", part(r#"form-data; name="model""#, "m-small"));
            let (body, more) = body_of(fine.as_bytes(), declared);
            drop(more);
            let ct = "multipart/form-data; boundary=XyZ";
            let (s, _, text) = send(&c, &gw, "/v1/audio/transcriptions", &[(k, &v), ("content-type", ct)], body).await;
            assert_eq!((s, text.as_str()), (200, r#"{"text":"ok"}"#), "{proto} declared={declared}");
            let last = mock.state.raw_bodies.lock().expect("lock").last().cloned().expect("a body");
            assert_eq!(&last[..], fine.as_bytes(), "{proto}: the form as sent");
        }
    }
    // A JSON body goes as JSON whatever type the caller names: the replica
    // cannot read it as a form.
    let before = mock.state.headers.lock().expect("lock").len();
    let (_, c) = any_clients().into_iter().next().expect("HTTP/1.1");
    let json = Full::new(Bytes::from_static(br#"{"model":"m-small","messages":[],"x":"&model=m-big"}"#)).boxed();
    let (s, _, text) = send(&c, &gw, "/v1/chat/completions", &[(k, &v), ("content-type", "application/x-www-form-urlencoded")], json).await;
    assert_eq!(s, 200, "{text}");
    let headers = mock.state.headers.lock().expect("lock")[before].clone();
    assert_eq!(headers.get_all("content-type").iter().collect::<Vec<_>>(), ["application/json"]);
    assert_quiescent(&gw).await;
}

// ---- token quotas ----

/// A replica that generates as vLLM does and counts every token it makes:
/// `max_completion_tokens` / `max_tokens` / `max_output_tokens` per
/// answer, or 3,000 without one (capped by a 4,096 context), times `n`
/// (or `best_of`) and the prompts of a list. Whole answers wait at the
/// current `gate`.
fn generating(generated: Arc<AtomicU64>, gate: Arc<std::sync::Mutex<Gate>>) -> ScriptFn {
    script(move |req| {
        let u = |k: &str| req.get(k).and_then(serde_json::Value::as_u64);
        let responses = req.get("input").is_some();
        let limit = if responses { u("max_output_tokens") } else { u("max_completion_tokens").or(u("max_tokens")) };
        let each = limit.unwrap_or(3000).min(4096 - 10);
        let prompts = match req.get("prompt") {
            Some(serde_json::Value::Array(a)) if a.first().is_some_and(|f| f.is_string()) => a.len() as u64,
            _ => 1,
        };
        let n = u("n").unwrap_or(1).max(u("best_of").unwrap_or(1));
        let total = each * n * prompts;
        generated.fetch_add(total, Ordering::SeqCst);
        let answer = if responses {
            format!(
                r#"{{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{{"input_tokens":10,"output_tokens":{total},"total_tokens":{}}}}}"#,
                total + 10
            )
        } else {
            format!(
                r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"x"}},"finish_reason":"length"}}],"usage":{{"prompt_tokens":10,"completion_tokens":{total},"total_tokens":{}}}}}"#,
                total + 10
            )
        };
        let gate = gate.lock().expect("lock").clone();
        Script::json_steps(200, vec![Step::Until(gate), Step::Send(Bytes::from(answer))])
    })
}

/// The key's day token quota as `/slo.json` shows it: (used, limit).
async fn quota_used(gw: &Gw, tenant: &str) -> (u64, u64) {
    let slo: serde_json::Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("JSON");
    let t = slo["tenants"].as_array().and_then(|ts| ts.iter().find(|t| t["name"] == tenant)).cloned().expect("the tenant");
    let q = &t["quotas"][0];
    (q["used"].as_u64().expect("used"), q["limit"].as_u64().expect("limit"))
}

/// Wait until the replica has said its context (4,096): the worst case of
/// a request without an output limit.
async fn context_known(gw: &Gw, name: &str) {
    let (data, (k, v)) = (gw.data_addr, auth(name));
    wait_until("the replica's max_model_len", || {
        let req = http::Request::get(format!("http://{data}/v1/models")).header(k, &v).body(Full::new(Bytes::new())).expect("request");
        async move {
            let resp = client().request(req).await.expect("GET");
            let text = resp.into_body().collect().await.expect("body").to_bytes();
            String::from_utf8_lossy(&text).contains("max_model_len")
        }
    })
    .await;
}

/// The key names' prefixes, a key per protocol.
const PROTOS: [&str; 2] = ["h1", "h2"];

/// A gateway with a key `PROTO-KIND` of `tokens_per_day: 6000` for each
/// protocol and kind, once the replica's context is known.
async fn quota_gateway(mock: &Mock, kinds: &[&str]) -> Gw {
    let keys: Vec<String> =
        PROTOS.iter().flat_map(|p| kinds.iter().map(move |n| key(&format!("{p}-{n}"), ", limits: { tokens_per_day: 6000 }"))).collect();
    let gw = gateway(mock, &keys, &[]).await;
    context_known(&gw, &format!("h1-{}", kinds[0])).await;
    gw
}

/// The kinds of request that overran a quota: (name, path, body, the
/// most one of them may generate).
const KINDS: [(&str, &str, &str, u64); 6] = [
    ("n", "/v1/chat/completions", r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}],"max_tokens":300,"n":5}"#, 1500),
    ("list", "/v1/completions", r#"{"model":"m-small","prompt":["a","b","c","d","e"],"max_tokens":300}"#, 1500),
    ("nomax", "/v1/chat/completions", r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}]}"#, 4096),
    (
        "huge",
        "/v1/chat/completions",
        r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}],"max_tokens":18446744073709551615}"#,
        4096,
    ),
    ("resp", "/v1/responses", r#"{"model":"m-small","input":"hi","max_output_tokens":1500}"#, 1500),
    ("bestof", "/v1/completions", r#"{"model":"m-small","prompt":"hi","max_tokens":300,"best_of":5}"#, 1500),
];

/// Eight requests of each kind at once against `tokens_per_day: 6000`
/// (a key per kind and protocol): what the replica generates for the key
/// stays within 1.25 times the quota plus one request's output limit,
/// the refused ones are 429 `quota_exceeded`, and the quota counts what
/// the replica reported.
#[tokio::test]
async fn concurrent_requests_of_every_kind_cannot_overrun_a_token_quota() {
    let generated = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(std::sync::Mutex::new(Gate::default()));
    let mock = Mock::start_with_model("m-small", generating(generated.clone(), gate.clone())).await;
    let gw = quota_gateway(&mock, &KINDS.map(|k| k.0)).await;
    for ((proto, c), p) in clients().into_iter().zip(PROTOS) {
        for (kind, path, body, output) in KINDS {
            let name = format!("{p}-{kind}");
            let (k, v) = auth(&name);
            *gate.lock().expect("lock") = Gate::default();
            let before = generated.load(Ordering::SeqCst);
            let (calls, refused) = (mock.calls(), Arc::new(AtomicUsize::new(0)));
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (c, refused, req) = (c.clone(), refused.clone(), post_req(&gw, path, body, &[(k, &v)]));
                tasks.push(tokio::spawn(async move {
                    let resp = c.request(req).await.expect("response");
                    let status = resp.status().as_u16();
                    if status == 429 {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    let text = resp.into_body().collect().await.expect("body").to_bytes();
                    (status, String::from_utf8_lossy(&text).into_owned())
                }));
            }
            let (m, r) = (&mock, &refused);
            wait_until("each of the 8 admitted or refused", || async move { m.calls() - calls + r.load(Ordering::SeqCst) == 8 }).await;
            gate.lock().expect("lock").open();
            let mut served = 0;
            for t in tasks {
                let (s, text) = t.await.expect("joined");
                match s {
                    200 => served += 1,
                    429 => assert_eq!(error_code(text.as_bytes()), "quota_exceeded", "{proto} {kind}: {text}"),
                    other => panic!("{proto} {kind}: {other} {text}"),
                }
            }
            let made = generated.load(Ordering::SeqCst) - before;
            assert!(served >= 1, "{proto} {kind}: one request fits");
            assert!(made <= 6000 * 5 / 4 + output, "{proto} {kind}: the replica generated {made} tokens for a 6,000-token day");
            let (used, limit) = quota_used(&gw, &name).await;
            assert_eq!((used, limit), (made + 10 * served, 6000), "{proto} {kind}: the quota counts the replica's usage");
        }
    }
    assert_quiescent(&gw).await;
}

/// A replica that streams 500 tokens and then holds the stream open
/// without its end or its usage (chat chunks, or the Responses API's
/// deltas for a request with `input`).
pub(crate) fn streams_500_then_holds() -> ScriptFn {
    let never = Gate::default();
    script(move |req| {
        let responses = req.get("input").is_some();
        let mut steps = if responses { Vec::new() } else { vec![Step::Send(role_chunk())] };
        for i in 0..500 {
            steps.push(Step::Send(if responses {
                typed_event("response.output_text.delta", &format!(r#""delta":"t{i} ""#))
            } else {
                content_chunk(&format!("t{i} "))
            }));
        }
        steps.push(Step::Until(never.clone()));
        Script::sse(steps)
    })
}

/// Streams read to their last token, then cut by the client, until the key
/// is refused: each is settled at what it relayed (its prompt and its 500
/// tokens), however the request named its output limit, so the replica
/// generates no more than the quota allows.
#[tokio::test]
async fn cut_streams_are_settled_at_what_they_relayed() {
    let mock = Mock::start_with_model("m-small", streams_500_then_holds()).await;
    let kinds = [
        ("resp", "/v1/responses", r#"{"model":"m-small","input":"hi","stream":true}"#, "output_text.delta"),
        (
            "huge",
            "/v1/chat/completions",
            r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":18446744073709551615}"#,
            "\"content\":\"t",
        ),
        (
            "nomax",
            "/v1/chat/completions",
            r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            "\"content\":\"t",
        ),
    ];
    let gw = quota_gateway(&mock, &kinds.map(|k| k.0)).await;
    for ((proto, c), p) in clients().into_iter().zip(PROTOS) {
        for (kind, path, body, token) in kinds {
            let name = format!("{p}-{kind}");
            let (k, v) = auth(&name);
            let mut served = 0u64;
            for _ in 0..30 {
                let resp = c.request(post_req(&gw, path, body, &[(k, &v)])).await.expect("response");
                if resp.status() == 429 {
                    let text = resp.into_body().collect().await.expect("body").to_bytes();
                    assert_eq!(error_code(&text), "quota_exceeded", "{proto} {kind}");
                    break;
                }
                assert_eq!(resp.status(), 200, "{proto} {kind}");
                let mut body = resp.into_body();
                let mut seen = String::new();
                while seen.matches(token).count() < 500 {
                    let frame = body.frame().await.expect("a frame").expect("data");
                    seen.push_str(&String::from_utf8_lossy(&frame.into_data().unwrap_or_default()));
                }
                let cancelled = mock.state.cancelled.load(Ordering::SeqCst);
                drop(body);
                let m = &mock;
                wait_until("the gateway let the replica go", || async move { m.state.cancelled.load(Ordering::SeqCst) > cancelled }).await;
                served += 1;
            }
            let made = 500 * served;
            assert!(served >= 1, "{proto} {kind}");
            assert!(made <= 6000 * 5 / 4 + 4096, "{proto} {kind}: the replica generated {made} tokens for a 6,000-token day");
            let (used, _) = quota_used(&gw, &name).await;
            assert!((made..=made + 64 * served).contains(&used), "{proto} {kind}: {served} cut streams of 500 tokens counted {used}");
        }
    }
    assert_quiescent(&gw).await;
}

/// A replica that ignores the output limit (300 tokens for `max_tokens`
/// 50): the gateway stops relaying at the key's reservation and ends the
/// stream as one capped by its limit ends (a `length` finish, `[DONE]`),
/// counted `quota_exhausted`, settled at what it relayed.
#[tokio::test]
async fn a_stream_past_its_keys_reservation_is_ended_as_a_length_finish() {
    let mock = Mock::start_with_model("m-small", script(|req| vllm_stream(req, 300, Duration::from_millis(1), "stop"))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let b = gateway_config(&[mock.url()])
        .models(&["m-small", "m-big"])
        .section(&format!("telemetry:\n  access_log: {{ to: {} }}", log.display()));
    let keys = [key("h1", ", limits: { tokens_per_day: 6000 }"), key("h2", ", limits: { tokens_per_day: 6000 }")];
    let gw = start_gateway(&format!("{}auth:\n  keys:\n{}", b.yaml(), keys.concat())).await;
    let body = r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50}"#;
    for ((proto, c), name) in clients().into_iter().zip(["h1", "h2"]) {
        let (k, v) = auth(name);
        let resp = c.request(post_req(&gw, "/v1/chat/completions", body, &[(k, &v)])).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        let relayed = text.matches("\"content\":\"t").count();
        assert_eq!(relayed, 50, "{proto}: the stream stops at its reservation (prompt estimate aside): {text}");
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
        let last = events[events.len() - 2];
        assert!(last.contains(r#""finish_reason":"length""#) && !text.contains("error"), "{proto}: {last}");
        assert_eq!(events[events.len() - 1], "data: [DONE]", "{proto}");
        let (used, _) = quota_used(&gw, name).await;
        assert!((50..=50 + 64).contains(&used), "{proto}: settled at what it relayed: {used}");
        // The access log says what the key was charged.
        let mine = format!("\"tenant\":\"{name}\"");
        let (at, mine) = (&log, &mine);
        wait_until("its access log line", || async move { std::fs::read_to_string(at).is_ok_and(|t| t.contains(mine.as_str())) }).await;
        let text = std::fs::read_to_string(&log).expect("log");
        let line = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|l| l["tenant"] == name);
        let line = line.expect("a line");
        let got = (line["outcome"].as_str(), line["completion_tokens"].as_u64(), line["usage_estimated"].as_bool());
        assert_eq!(got, (Some("quota_exhausted"), Some(50), Some(true)), "{line}");
        assert_eq!(line["prompt_tokens"].as_u64().map(|p| p + 50), Some(used), "{proto}: the log and the quota agree: {line}");
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "quota_exhausted")]), Some(2.0), "{m}");
    assert_quiescent(&gw).await;
}

// ---- bodies in memory ----

/// A request whose body its client has begun and not finished (chunked):
/// its status as soon as the gateway answers, with the sender of the rest
/// (kept, so the body stays unfinished until the test ends).
async fn unfinished(
    c: &AnyClient,
    gw: &Gw,
    headers: &[(&str, &str)],
    first: usize,
) -> (tokio::task::JoinHandle<u16>, mpsc::UnboundedSender<Bytes>) {
    let (ct, form) = transcription_form(Some("m-small"), false, &vec![7u8; first]);
    let (body, more) = body_of(&form[..form.len() - 200], false);
    gw.count_sent(1);
    let mut b = http::Request::post(format!("http://{}/v1/audio/transcriptions", gw.data_addr)).header("content-type", ct);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(body).expect("request");
    let c = c.clone();
    (tokio::spawn(async move { c.request(req).await.map(|r| r.status().as_u16()).unwrap_or(0) }), more.expect("a sender"))
}

/// The bytes of request bodies the gateway holds now.
async fn held(gw: &Gw) -> f64 {
    metric(&metrics_text(gw).await, "slogate_request_body_bytes_held", &[]).unwrap_or(0.0)
}

/// Finish unfinished uploads: their last bytes, then their end; each is answered 200.
async fn finish(uploads: Vec<(tokio::task::JoinHandle<u16>, mpsc::UnboundedSender<Bytes>)>, what: &str) {
    for (task, more) in uploads {
        let _ = more.send(Bytes::from(format!("\r\n--{}--\r\n", "slogate-test-boundary-7MA4YWxkTrZu0gW")));
        drop(more);
        assert_eq!(task.await.expect("joined"), 200, "{what}");
    }
}

/// A key allowed 2 requests at once has its third refused before its body
/// is read (its uploads are unfinished: read whole, they would be held);
/// the listener's budget for bodies held (`max_buffered_body_bytes`) and
/// one HTTP/2 connection's answer 503 with Retry-After when full, and
/// every byte is given back when its request ends.
#[tokio::test]
async fn bodies_held_in_memory_are_bounded_per_key_per_listener_and_per_connection() {
    let mock = Mock::start_with_model("m-small", Script::json(200, r#"{"text":"ok"}"#).always()).await;
    let server = ["max_upload_body: 256KiB", "max_request_body: 64KiB", "max_buffered_body_bytes: 400KiB"];
    let gw = gateway(&mock, &[key("two", ", limits: { max_concurrent: 2 }"), key("free", "")], &server).await;
    let ((k, v), (f, fv)) = (auth("two"), auth("free"));
    for (proto, c) in any_clients() {
        let mut two = Vec::new();
        for _ in 0..2 {
            two.push(unfinished(&c, &gw, &[(k, &v)], 100 << 10).await);
        }
        wait_until("both bodies held", || async { held(&gw).await >= 200_000.0 }).await;
        let (third, _rest) = unfinished(&c, &gw, &[(k, &v)], 100 << 10).await;
        assert_eq!(third.await.expect("joined"), 429, "{proto}: the third is refused before its body is read");
        finish(two, proto).await;
        wait_until("every byte given back", || async { held(&gw).await == 0.0 }).await;
    }
    // Over the listener's budget: 250 KiB held, 250 KiB more (separate connections).
    let (_, h1) = any_clients().into_iter().next().expect("HTTP/1.1");
    let first = unfinished(&h1, &gw, &[(f, &fv)], 250 << 10).await;
    wait_until("the first body held", || async { held(&gw).await >= 250_000.0 }).await;
    let (second, _rest) = unfinished(&h1, &gw, &[(f, &fv)], 250 << 10).await;
    assert_eq!(second.await.expect("joined"), 503, "HTTP/1.1: over max_buffered_body_bytes");
    finish(vec![first], "HTTP/1.1").await;
    // Over one HTTP/2 connection's (256 + 64 KiB): two of 180 KiB on it.
    let (_, h2) = any_clients().into_iter().nth(1).expect("HTTP/2");
    let first = unfinished(&h2, &gw, &[(f, &fv)], 180 << 10).await;
    wait_until("the first body held", || async { held(&gw).await >= 180_000.0 }).await;
    let (second, _rest) = unfinished(&h2, &gw, &[(f, &fv)], 180 << 10).await;
    assert_eq!(second.await.expect("joined"), 503, "HTTP/2: over one connection's bodies");
    finish(vec![first], "HTTP/2").await;
    wait_until("every byte given back", || async { held(&gw).await == 0.0 }).await;
    assert_quiescent(&gw).await;
}

// ---- what a request carries to the replica ----

/// A caller's credentials (OpenAI's, Anthropic's, Azure's, a browser's)
/// never reach a replica; nor does its `priority`, on any endpoint that
/// has one; an isolated key's requests carry the gateway's `cache_salt`,
/// its own per key, the caller's replaced; a key that is not isolated
/// keeps its own.
#[tokio::test]
async fn credentials_priority_and_cache_salt_reaching_the_replica_are_the_gateways() {
    let mock = Mock::start_with_model("m-small", standard(2, Duration::ZERO)).await;
    let keys = [key("a", ", cache_isolation: true"), key("b", ", cache_isolation: true"), key("open", "")];
    let gw = gateway(&mock, &keys, &[]).await;
    let bodies = [
        (
            "/v1/chat/completions",
            r#"{"model":"m-small","messages":[{"role":"user","content":"the same prompt"}],"priority":-1000,"cache_salt":"mine"}"#,
        ),
        ("/v1/completions", r#"{"model":"m-small","prompt":"the same prompt","priority":-1000,"cache_salt":"mine"}"#),
        ("/v1/responses", r#"{"model":"m-small","input":"the same prompt","priority":-1000,"cache_salt":"mine"}"#),
        ("/v1/embeddings", r#"{"model":"m-small","input":"the same prompt","priority":-1000}"#),
    ];
    for (proto, c) in clients() {
        for (path, body) in bodies {
            let mut salts = Vec::new();
            for name in ["a", "b", "open"] {
                let (k, v) = auth(name);
                let sent = [(k, v.as_str()), ("x-api-key", "sk-a"), ("api-key", "sk-a"), ("cookie", "session=s"), ("x-other", "kept")];
                let before = mock.state.headers.lock().expect("lock").len();
                let resp = c.request(post_req(&gw, path, body, &sent)).await.expect("response");
                assert_eq!(resp.status(), 200, "{proto} {path} {name}");
                let _ = resp.into_body().collect().await;
                let h = mock.state.headers.lock().expect("lock")[before].clone();
                for cred in ["authorization", "x-api-key", "api-key", "cookie"] {
                    assert!(h.get(cred).is_none(), "{proto} {path} {name}: {cred} reached the replica");
                }
                assert_eq!(h.get("x-other").and_then(|v| v.to_str().ok()), Some("kept"), "{proto}: other headers go on");
                let got = mock.state.bodies.lock().expect("lock")[before].clone();
                assert!(got.get("priority").is_none(), "{proto} {path} {name}: the caller's priority reached the replica: {got}");
                salts.push(got.get("cache_salt").cloned());
            }
            if path == "/v1/embeddings" {
                continue;
            }
            let (a, b, open) = (&salts[0], &salts[1], &salts[2]);
            assert!(a.as_ref().and_then(|s| s.as_str()).is_some_and(|s| s.starts_with("slogate-")), "{proto} {path}: {a:?}");
            assert_ne!(a, b, "{proto} {path}: two isolated keys, two salts");
            assert_eq!(open.as_ref().and_then(|s| s.as_str()), Some("mine"), "{proto} {path}: not isolated: the caller's own");
        }
    }
    assert_quiescent(&gw).await;
}

/// A key read from the environment with a line break after it (as
/// `echo KEY > file` writes it) works as the key without it, and
/// `slogate check` says so.
#[tokio::test]
async fn a_key_from_the_environment_is_trimmed_and_check_says_so() {
    let mock = Mock::start_with_model("m-small", standard(1, Duration::ZERO)).await;
    std::env::set_var("SLOGATE_TEST_KEY_WITH_NEWLINE", "sk-newline\n");
    let yaml = format!(
        "{}auth:\n  keys:\n    - {{ name: nl, key_env: SLOGATE_TEST_KEY_WITH_NEWLINE, classes: [chat] }}\n",
        gateway_config(&[mock.url()]).models(&["m-small"]).yaml()
    );
    let warnings = slogate::config::Config::parse(&yaml).expect("valid").warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("auth.keys[0].key_env:"), "{warnings:?}");
    let gw = start_gateway(&yaml).await;
    let body = r#"{"model":"m-small","messages":[{"role":"user","content":"hi"}]}"#;
    let (s, _, _) = post(&gw, "/v1/chat/completions", body, &[("authorization", "Bearer sk-newline")]).await;
    assert_eq!(s, 200);
    assert_quiescent(&gw).await;
}

/// The promise as a user states it: eight unfinished 24 MiB uploads from a
/// key allowed 2 at a time hold less than 100 MB of bodies in the gateway
/// (the other six are refused before their bodies are read), over
/// HTTP/1.1 and over one HTTP/2 connection.
#[tokio::test]
async fn eight_unfinished_24_mib_uploads_from_a_key_allowed_two_hold_under_100_mb() {
    let mock = Mock::start_with_model("m-small", Script::json(200, r#"{"text":"ok"}"#).always()).await;
    let gw = gateway(&mock, &[key("two", ", limits: { max_concurrent: 2 }")], &[]).await;
    let (k, v) = auth("two");
    for (proto, c) in any_clients() {
        let mut uploads = Vec::new();
        for _ in 0..8 {
            uploads.push(unfinished(&c, &gw, &[(k, &v)], 24 << 20).await);
        }
        // Six are refused by the key's limit before their bodies are read;
        // the two it allows are read (on one HTTP/2 connection, the second
        // passes that connection's bound and is refused too).
        let limited = || async {
            let m = metrics_text(&gw).await;
            metric(&m, "slogate_tenant_limited_requests_total", &[("tenant", "two"), ("kind", "concurrent")]).unwrap_or(0.0)
        };
        let before = if proto == "HTTP/1.1" { 0.0 } else { 6.0 };
        wait_until("six refused before their bodies were read", || async { limited().await >= before + 6.0 }).await;
        wait_until("a held body read whole", || async { held(&gw).await >= (24 << 20) as f64 }).await;
        let bytes = held(&gw).await;
        assert!(bytes < 100e6, "{proto}: {bytes} bytes of bodies held");
        assert_eq!(limited().await, before + 6.0, "{proto}");
        let held_on = uploads;
        for (task, more) in held_on {
            drop(more);
            task.abort();
        }
        wait_until("every byte given back", || async { held(&gw).await == 0.0 }).await;
    }
    assert_quiescent(&gw).await;
}
