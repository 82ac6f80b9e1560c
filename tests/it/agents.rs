//! Agents' traffic: the Responses API's stored state across replicas. vLLM
//! keeps each stored response in the memory of the replica that made it;
//! slogate learns the owner from the answers it relays, sends follow-ups
//! (`previous_response_id`) and the id's own routes there, keeps tenants'
//! responses apart, and counts a follow-up whose replica is gone as lost
//! state, against availability.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use slogate::config::key_sha256;

use crate::common::*;

/// A replica with vLLM's response store: each response it makes is kept
/// in its own memory (`resp_NAME_N`); a follow-up or an id route for a
/// response it does not hold is vLLM's 404.
fn storing(name: &'static str) -> ScriptFn {
    let store = Arc::new(Mutex::new(HashSet::<String>::new()));
    let made = Arc::new(AtomicUsize::new(0));
    script(move |req| {
        let not_found = |id: &str| {
            Script::json(
                404,
                &format!(r#"{{"error":{{"message":"Response with id '{id}' not found.","type":"invalid_request_error","code":404}}}}"#),
            )
        };
        if let Some(path) = req.get("__path").and_then(|p| p.as_str()) {
            let id = path.trim_start_matches("/v1/responses/").split('/').next().unwrap_or("").to_string();
            if !store.lock().expect("lock").contains(&id) {
                return not_found(&id);
            }
            let status = if path.ends_with("/cancel") { "cancelled" } else { "completed" };
            return Script::json(200, &format!(r#"{{"id":"{id}","object":"response","status":"{status}","output":[]}}"#));
        }
        if let Some(prev) = req.get("previous_response_id").and_then(|p| p.as_str()) {
            if !store.lock().expect("lock").contains(prev) {
                return not_found(prev);
            }
        }
        let id = format!("resp_{name}_{}", made.fetch_add(1, Ordering::SeqCst));
        store.lock().expect("lock").insert(id.clone());
        if req.get("stream").and_then(|s| s.as_bool()) == Some(true) {
            let response = format!(r#""response":{{"id":"{id}","object":"response","status":"in_progress","output":[]}}"#);
            let done = format!(
                r#""response":{{"id":"{id}","object":"response","status":"completed","output":[],"usage":{{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}}"#
            );
            Script::sse(vec![
                Step::Send(typed_event("response.created", &response)),
                Step::Send(typed_event("response.output_text.delta", r#""delta":"ok ""#)),
                Step::Send(typed_event("response.output_text.delta", r#""delta":"done""#)),
                Step::Send(typed_event("response.completed", &done)),
            ])
        } else {
            Script::json(
                200,
                &format!(
                    r#"{{"id":"{id}","object":"response","status":"completed","output":[],"usage":{{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}}"#
                ),
            )
        }
    })
}

fn keys() -> String {
    format!(
        "auth:\n  keys:\n    - {{ name: a, key_sha256: {}, classes: [chat] }}\n    - {{ name: b, key_sha256: {}, classes: [chat] }}\n    - {{ name: one, key_sha256: {}, classes: [chat], limits: {{ requests_per_minute: 1 }} }}\n",
        key_sha256("sk-a"),
        key_sha256("sk-b"),
        key_sha256("sk-one")
    )
}

/// A request as key `who`: (status, body).
async fn call(c: &TestClient, gw: &Gw, method: &str, path: &str, body: &str, who: &str) -> (u16, String) {
    // Every call is a routed request (the id routes too).
    gw.count_sent(1);
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", gw.data_addr))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer sk-{who}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = c.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let text = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&text).into_owned())
}

/// The id of the response a turn made: a whole answer's, or its stream's
/// `response.created`.
fn made_id(text: &str) -> String {
    let json = text.lines().filter_map(|l| l.strip_prefix("data: ")).next().unwrap_or(text);
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    v.get("response").unwrap_or(&v)["id"].as_str().expect("an id").to_string()
}

/// Conversations of three turns through two replicas, each with its own
/// store, streaming and not, over HTTP/1.1 and HTTP/2: every follow-up
/// finds its state, whichever replica the routing would otherwise pick.
#[tokio::test]
async fn follow_ups_go_to_the_replica_that_holds_their_state() {
    let (a, b) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let gw = start_gateway(&format!("{}{}", gateway_config(&[a.url(), b.url()]).yaml(), keys())).await;
    for (proto, c) in clients() {
        for stream in [false, true] {
            for conversation in 0..10 {
                let mut prev: Option<String> = None;
                for turn in 0..3 {
                    let follow = prev.as_ref().map(|p| format!(r#","previous_response_id":"{p}""#)).unwrap_or_default();
                    let body = format!(r#"{{"model":"m1","input":"turn {turn} of {conversation}","stream":{stream}{follow}}}"#);
                    let (s, text) = call(&c, &gw, "POST", "/v1/responses", &body, "a").await;
                    assert_eq!(s, 200, "{proto} stream={stream} conversation {conversation} turn {turn}: {text}");
                    let id = made_id(&text);
                    if let Some(p) = &prev {
                        let owner = |i: &str| i.split('_').nth(1).map(str::to_string);
                        assert_eq!(owner(&id), owner(p), "{proto}: the turn was made where its state was");
                    }
                    prev = Some(id);
                }
            }
        }
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "client_error")]), None, "{m}");
    assert_quiescent(&gw).await;
}

/// A stored response's own routes go to its owner for the tenant that
/// made it (retrieve, input items, cancel, delete); to another tenant it
/// is the same 404 as an id never made.
#[tokio::test]
async fn a_stored_responses_routes_reach_its_owner_for_its_tenant_only() {
    let (a, b) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let gw = start_gateway(&format!("{}{}", gateway_config(&[a.url(), b.url()]).yaml(), keys())).await;
    for (proto, c) in clients() {
        let (s, text) = call(&c, &gw, "POST", "/v1/responses", r#"{"model":"m1","input":"hi","background":true}"#, "a").await;
        assert_eq!(s, 200, "{proto}: {text}");
        let id = made_id(&text);
        for (method, suffix) in [("GET", ""), ("GET", "/input_items"), ("POST", "/cancel"), ("DELETE", "")] {
            let path = format!("/v1/responses/{id}{suffix}");
            let (s, text) = call(&c, &gw, method, &path, "", "a").await;
            assert_eq!(s, 200, "{proto} {method} {path}: {text}");
            assert!(text.contains(&id), "{proto}: {text}");
            let (s, other) = call(&c, &gw, method, &path, "", "b").await;
            let (s2, never) = call(&c, &gw, method, &format!("/v1/responses/resp_never{suffix}"), "", "b").await;
            assert_eq!((s, s2), (404, 404), "{proto} {method} {path}: another tenant's: {other}");
            assert_eq!(
                error_body(other.as_bytes())["message"].as_str().map(|m| m.replace(&id, "ID")),
                error_body(never.as_bytes())["message"].as_str().map(|m| m.replace("resp_never", "ID")),
                "{proto}"
            );
        }
        // A follow-up by another tenant is as unknown.
        let body = format!(r#"{{"model":"m1","input":"more","previous_response_id":"{id}"}}"#);
        let (s, _) = call(&c, &gw, "POST", "/v1/responses", &body, "b").await;
        assert_eq!(s, 404, "{proto}");
    }
    assert_quiescent(&gw).await;
}

/// A follow-up whose replica is gone cannot succeed: a 410 that says the
/// conversation's state was lost, counted `state_lost`, against
/// availability, not as the client's error.
#[tokio::test]
async fn a_follow_up_whose_replica_is_gone_is_lost_state() {
    let (a, b) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let gw = start_gateway(&format!("{}{}", gateway_config(&[a.url(), b.url()]).yaml(), keys())).await;
    let c = client();
    let mut made = Vec::new();
    while made.iter().all(|i: &String| !i.contains("_a_")) || made.iter().all(|i: &String| !i.contains("_b_")) {
        let (s, text) = call(&c, &gw, "POST", "/v1/responses", r#"{"model":"m1","input":"hi"}"#, "a").await;
        assert_eq!(s, 200, "{text}");
        made.push(made_id(&text));
        assert!(made.len() < 50, "both replicas make responses");
    }
    a.kill();
    let on_a = made.iter().find(|i| i.contains("_a_")).expect("one on a").clone();
    let on_b = made.iter().find(|i| i.contains("_b_")).expect("one on b").clone();
    let follow = |id: &str| format!(r#"{{"model":"m1","input":"more","previous_response_id":"{id}"}}"#);
    let (s, text) = call(&c, &gw, "POST", "/v1/responses", &follow(&on_a), "a").await;
    assert_eq!(s, 410, "{text}");
    assert_eq!(error_code(text.as_bytes()), "response_state_lost", "{text}");
    let (s, text) = call(&c, &gw, "POST", "/v1/responses", &follow(&on_b), "a").await;
    assert_eq!(s, 200, "the other replica's conversations go on: {text}");
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "state_lost")]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "client_error")]), None, "{m}");
    assert_quiescent(&gw).await;
}

/// An OpenAI SDK script: 100 conversations of three turns of `model`
/// chained by `previous_response_id`, streaming and not, one at a time and
/// 20 at once, each line saying how many went on; then `then`.
fn agents_script(model: &str, then: &str) -> String {
    format!(
        r#"
from concurrent.futures import ThreadPoolExecutor
def conversation(i, stream):
    prev = None
    for turn in range(3):
        kw = {{"model": "{model}", "input": f"turn {{turn}} of {{i}}", "max_output_tokens": 8}}
        if prev:
            kw["previous_response_id"] = prev
        if stream:
            for event in c.responses.create(stream=True, **kw):
                if event.type == "response.created":
                    prev = event.response.id
        else:
            prev = c.responses.create(**kw).id
    return 1
for at_once in (1, 20):
    for stream in (False, True):
        with ThreadPoolExecutor(at_once) as pool:
            done = sum(pool.map(lambda i: conversation(i, stream), range(100)))
        print("conversations", at_once, stream, done)
{then}"#
    )
}

/// Every conversation of [`agents_script`] went on to its last turn.
fn all_conversations_went_on(out: &str) {
    for line in ["1 False 100", "1 True 100", "20 False 100", "20 True 100"] {
        assert!(out.contains(&format!("conversations {line}")), "{out}");
    }
}

/// The OpenAI Python SDK's agents: 100 conversations of three turns chained
/// by `previous_response_id`, streaming and not, one at a time and 20 at
/// once, through two replicas each with its own store: every follow-up
/// succeeds.
#[tokio::test]
async fn the_openai_sdks_follow_ups_succeed_through_two_replicas() {
    let (a, b) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let gw = start_gateway(&gateway_config(&[a.url(), b.url()]).yaml()).await;
    let code = agents_script("m1", "");
    let out = openai_sdk(&gw, &code, &[]).await;
    all_conversations_went_on(&out);
    gw.count_sent(4 * 100 * 3);
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(1200.0), "{m}");
    assert_quiescent(&gw).await;
}

/// A fleet's gateways share what they learn: a conversation whose first
/// turn went through one gateway goes on through the other, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_on_through_another_gateway_of_the_fleet() {
    let (ra, rb) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let tmp = tempfile::tempdir().expect("temp dir");
    let alone = gateway_config(&[ra.url(), rb.url()]);
    let (a, b, url_a, url_b) = fleet_of_two(&alone, "period: 50ms, peer_timeout: 400ms, takeover_after: 2s", tmp.path()).await;
    // Both have joined the fleet: each hears the other.
    for (gw, peer) in [(&a, &url_b), (&b, &url_a)] {
        let (admin, peer) = (gw.admin_addr, peer.as_str());
        wait_until("the peer is heard", || async move {
            let s: serde_json::Value = serde_json::from_str(&get(admin, "/fleet.json").await.1).unwrap_or_default();
            s["peers"].as_array().is_some_and(|ps| ps.iter().any(|p| p["address"] == peer && p["status"] == "fresh"))
        })
        .await;
    }
    let stored = |admin: std::net::SocketAddr| async move {
        let s: serde_json::Value = serde_json::from_str(&get(admin, "/slo.json").await.1).expect("JSON");
        s["pools"][0]["stored_responses"].as_u64().unwrap_or(0)
    };
    let c = client();
    let mut prev: Option<String> = None;
    for turn in 0..4 {
        // Turns alternate between the gateways.
        let (gw, other) = if turn % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let follow = prev.as_ref().map(|p| format!(r#","previous_response_id":"{p}""#)).unwrap_or_default();
        let body = format!(r#"{{"model":"m1","input":"turn {turn}"{follow}}}"#);
        let resp = c.request(post_req(gw, "/v1/responses", &body, &[])).await.expect("response");
        let status = resp.status();
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        assert_eq!(status, 200, "turn {turn}: {text}");
        prev = Some(made_id(&text));
        let (here, there) = (gw.admin_addr, other.admin_addr);
        let known = stored(here).await;
        wait_until("the other gateway heard of the response", || async move { stored(there).await >= known }).await;
    }
    for gw in [&a, &b] {
        assert_quiescent(gw).await;
    }
}

/// The OpenAI SDK's agents through a fleet of two gateways: every turn
/// goes through the other gateway than the one before, sent at once (so
/// the second gateway often hears of the first turn's owner only while
/// the follow-up waits), 100 conversations per mode, and every follow-up
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdks_follow_ups_succeed_across_two_gateways() {
    let (ra, rb) = (Mock::start(storing("a")).await, Mock::start(storing("b")).await);
    let tmp = tempfile::tempdir().expect("temp dir");
    let alone = gateway_config(&[ra.url(), rb.url()]);
    let (a, b, url_a, url_b) = fleet_of_two(&alone, "period: 50ms, peer_timeout: 400ms, takeover_after: 2s", tmp.path()).await;
    for (gw, peer) in [(&a, &url_b), (&b, &url_a)] {
        let (admin, peer) = (gw.admin_addr, peer.as_str());
        wait_until("the peer is heard", || async move {
            let s: serde_json::Value = serde_json::from_str(&get(admin, "/fleet.json").await.1).unwrap_or_default();
            s["peers"].as_array().is_some_and(|ps| ps.iter().any(|p| p["address"] == peer && p["status"] == "fresh"))
        })
        .await;
    }
    // The script's `c` is gateway a's client; `other` is gateway b's, and
    // `client_of(turn)` alternates between them.
    let other = std::path::PathBuf::from(format!("http://{}/v1", b.data_addr));
    let code = agents_script("m1", "").replace(
        "def conversation(i, stream):",
        "other = OpenAI(base_url=sys.argv[2], api_key=\"unused\", max_retries=0)\nclient_of = lambda turn: other if turn % 2 else c\ndef conversation(i, stream):",
    );
    let code = code.replace("c.responses.create(", "client_of(turn).responses.create(");
    let out = openai_sdk(&a, &code, &[&other]).await;
    all_conversations_went_on(&out);
    let m_a = metrics_text(&a).await;
    let m_b = metrics_text(&b).await;
    let ok = |m: &str| metric(m, "slogate_requests_total", &[("outcome", "ok")]).unwrap_or(0.0);
    assert_eq!((ok(&m_a), ok(&m_b)), (800.0, 400.0), "turns 1 and 3 through a, turn 2 through b");
    a.count_sent(800);
    b.count_sent(400);
    for gw in [&a, &b] {
        assert_quiescent(gw).await;
    }
}

/// The same agents against three simulated vLLM replicas (the simulator
/// keeps a response store per replica, as vLLM does), whole and streamed,
/// one at a time and 20 at once; and through the simulator a background
/// response is retrieved and cancelled on its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdks_agents_work_through_three_simulated_replicas() {
    use loadtest::sim::{SimConfig, SimServer};
    let mut sims = Vec::new();
    for _ in 0..3 {
        let cfg = SimConfig { step_base_ms: 1.0, decode_per_seq_ms: 0.0, prefill_per_token_ms: 0.0, ..SimConfig::default() };
        sims.push(SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator"));
    }
    let urls: Vec<String> = sims.iter().map(|s| s.url()).collect();
    let model = SimConfig::default().model;
    let gw = start_gateway(&gateway_config(&urls).models(&[&model]).yaml()).await;
    let background = format!(
        r#"
r = c.responses.create(model="{model}", input="a long job", background=True, max_output_tokens=2000)
print("retrieved", c.responses.retrieve(r.id).id == r.id)
print("cancelled", c.responses.cancel(r.id).status)
"#
    );
    let code = agents_script(&model, &background);
    let out = openai_sdk(&gw, &code, &[]).await;
    all_conversations_went_on(&out);
    assert!(out.contains("retrieved True") && out.contains("cancelled cancelled"), "{out}");
    gw.count_sent(4 * 100 * 3 + 3);
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "client_error")]), None, "{m}");
    assert_quiescent(&gw).await;
}

// ---- Anthropic's Messages API ----

/// A replica serving `/v1/messages` as vLLM does: Anthropic's events
/// streamed (`message_start` with the prompt's usage, a `text_delta` per
/// word, `message_delta` with the stop reason and the output's usage,
/// `message_stop`), or the whole message.
fn anthropic(req: &serde_json::Value) -> Script {
    let words = ["Hello", " from", " the", " replica"];
    let max = req.get("max_tokens").and_then(|m| m.as_u64()).unwrap_or(1024);
    let stop = if max <= 4 { "max_tokens" } else { "end_turn" };
    if req.get("stream").and_then(|s| s.as_bool()) == Some(true) {
        let ev = |kind: &str, data: String| Step::Send(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
        let mut steps = vec![
            ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m1","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"output_tokens":1}}}"#.into()),
            ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into()),
            ev("ping", r#"{"type":"ping"}"#.into()),
        ];
        for w in words {
            steps.push(ev(
                "content_block_delta",
                format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{w}"}}}}"#),
            ));
        }
        steps.push(ev("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.into()));
        steps.push(ev(
            "message_delta",
            format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}},"usage":{{"output_tokens":9}}}}"#),
        ));
        steps.push(ev("message_stop", r#"{"type":"message_stop"}"#.into()));
        Script::sse(steps)
    } else {
        Script::json(
            200,
            &format!(
                r#"{{"id":"msg_1","type":"message","role":"assistant","content":[{{"type":"text","text":"Hello from the replica"}}],"model":"m1","stop_reason":"{stop}","stop_sequence":null,"usage":{{"input_tokens":21,"output_tokens":9}}}}"#
            ),
        )
    }
}

/// Messages through the gateway by default, keyed by `x-api-key`, over
/// HTTP/1.1 and HTTP/2: streamed byte for byte and measured as chat is
/// (TTFT at the first text delta, a gap per delta after it, the replica's
/// usage from `message_start` and `message_delta`), whole messages counted
/// (`max_tokens` is `length`); errors in Anthropic's shape.
#[tokio::test]
async fn anthropics_messages_are_served_and_measured_by_default() {
    let mock = Mock::start(script(anthropic)).await;
    let gw = start_gateway(&format!("{}{}", gateway_config(&[mock.url()]).yaml(), keys())).await;
    let stream = r#"{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hello"}]}"#;
    let whole = r#"{"model":"m1","max_tokens":4,"messages":[{"role":"user","content":"Hello"}]}"#;
    for (proto, c) in clients() {
        let headers = [("x-api-key", "sk-a"), ("anthropic-version", "2023-06-01")];
        let resp = c.request(post_req(&gw, "/v1/messages", stream, &headers)).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        let steps = anthropic(&serde_json::from_str(stream).expect("json")).steps;
        let sent: Vec<u8> = steps.iter().filter_map(|s| if let Step::Send(b) = s { Some(b.to_vec()) } else { None }).flatten().collect();
        assert_eq!(&text[..], &sent[..], "{proto}: the events as the replica sent them");
        let h = mock.state.headers.lock().expect("lock").last().cloned().expect("headers");
        assert!(h.get("x-api-key").is_none(), "{proto}: the caller's key stays with the gateway");
        assert_eq!(h.get("anthropic-version").and_then(|v| v.to_str().ok()), Some("2023-06-01"), "{proto}");
        let (s, body) = call(&c, &gw, "POST", "/v1/messages", whole, "a").await;
        assert_eq!(s, 200, "{proto}: {body}");
    }
    let m = metrics_text(&gw).await;
    let msgs = [("endpoint", "messages")];
    assert_eq!(metric(&m, "slogate_requests_total", &[("endpoint", "messages"), ("outcome", "ok")]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_requests_total", &[("endpoint", "messages"), ("outcome", "length")]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &msgs), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &msgs), Some(6.0), "{m}");
    assert_eq!(metric(&m, "slogate_prompt_tokens_total", &[]), Some(84.0), "{m}");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(36.0), "{m}");
    // Errors in Anthropic's shape, Retry-After kept.
    let (s, body) = call(&client(), &gw, "POST", "/v1/messages", whole, "wrong").await;
    let e: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!((s, e["type"].as_str(), e["error"]["type"].as_str()), (401, Some("error"), Some("authentication_error")), "{body}");
    let (s, body) = call(&client(), &gw, "POST", "/v1/messages", r#"{"model":"nope","max_tokens":4,"messages":[]}"#, "a").await;
    let e: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!((s, e["error"]["type"].as_str()), (404, Some("not_found_error")), "{body}");
    // A key over its limit: 429 rate_limit_error, with Retry-After.
    let (s, _) = call(&client(), &gw, "POST", "/v1/messages", whole, "one").await;
    assert_eq!(s, 200);
    let req = post_req(&gw, "/v1/messages", whole, &[("x-api-key", "sk-one")]);
    let resp = client().request(req).await.expect("response");
    let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    let (s, body) = (resp.status().as_u16(), resp.into_body().collect().await.expect("body").to_bytes());
    let e: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!((s, e["type"].as_str(), e["error"]["type"].as_str()), (429, Some("error"), Some("rate_limit_error")), "{e}");
    assert!(retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|n| n >= 1)), "Retry-After");
    assert_quiescent(&gw).await;
}

/// Run `code` (Python, Anthropic's SDK installed by scripts/setup-test-deps)
/// with the gateway's base URL as its argument; its output, once it succeeded.
pub(crate) async fn anthropic_sdk(gw: &Gw, code: &str) -> String {
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let out = tokio::process::Command::new(py)
        .arg("-c")
        .arg(code)
        .arg(format!("http://{}", gw.data_addr))
        .kill_on_drop(true)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Anthropic's Python SDK, with the defaults: `messages.create` and
/// `messages.stream` through the gateway, keyed by `x-api-key`.
#[tokio::test]
async fn anthropics_sdk_works_through_the_gateway() {
    let mock = Mock::start(script(anthropic)).await;
    let gw = start_gateway(&format!("{}{}", gateway_config(&[mock.url()]).yaml(), keys())).await;
    let code = r#"
import sys, anthropic
c = anthropic.Anthropic(base_url=sys.argv[1], api_key="sk-a", max_retries=0)
m = c.messages.create(model="m1", max_tokens=64, messages=[{"role": "user", "content": "Hello"}])
print("create:", m.content[0].text, m.usage.input_tokens, m.usage.output_tokens, m.stop_reason)
with c.messages.stream(model="m1", max_tokens=64, messages=[{"role": "user", "content": "Hello"}]) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
print("stream:", text, final.usage.output_tokens, final.stop_reason)
"#;
    let stdout = anthropic_sdk(&gw, code).await;
    assert!(stdout.contains("create: Hello from the replica 21 9 end_turn"), "{stdout}");
    assert!(stdout.contains("stream: Hello from the replica 9 end_turn"), "{stdout}");
    gw.count_sent(2);
    assert_quiescent(&gw).await;
}

/// Anthropic's SDK through the gateway in front of two simulated replicas
/// (the simulator serves `/v1/messages` as vLLM does): whole and streamed,
/// measured (TTFT and a gap per delta after the first) and counted at the
/// replicas' usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropics_sdk_works_through_two_simulated_replicas() {
    use loadtest::sim::{SimConfig, SimServer};
    let mut sims = Vec::new();
    for _ in 0..2 {
        let cfg = SimConfig { step_base_ms: 1.0, decode_per_seq_ms: 0.0, prefill_per_token_ms: 0.0, ..SimConfig::default() };
        sims.push(SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator"));
    }
    let urls: Vec<String> = sims.iter().map(|s| s.url()).collect();
    let model = SimConfig::default().model;
    let gw = start_gateway(&format!("{}{}", gateway_config(&urls).models(&[&model]).yaml(), keys())).await;
    let code = format!(
        r#"
import sys, anthropic
c = anthropic.Anthropic(base_url=sys.argv[1], api_key="sk-a", max_retries=0)
inp = out = 0
for _ in range(3):
    m = c.messages.create(model="{model}", max_tokens=12, messages=[{{"role": "user", "content": "Hello there"}}])
    inp += m.usage.input_tokens; out += m.usage.output_tokens
    with c.messages.stream(model="{model}", max_tokens=12, messages=[{{"role": "user", "content": "Hello there"}}]) as s:
        text = "".join(s.text_stream)
        f = s.get_final_message()
    inp += f.usage.input_tokens; out += f.usage.output_tokens
print("usage", inp, out, f.stop_reason)
"#
    );
    let stdout = anthropic_sdk(&gw, &code).await;
    let words: Vec<u64> = stdout.split_whitespace().skip(1).take(2).filter_map(|w| w.parse().ok()).collect();
    assert_eq!(words.len(), 2, "{stdout}");
    gw.count_sent(6);
    let m = metrics_text(&gw).await;
    let msgs = [("endpoint", "messages")];
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &msgs), Some(3.0), "{m}");
    assert_eq!(metric(&m, "slogate_prompt_tokens_total", &[]), Some(words[0] as f64), "the replicas' prompt tokens: {m}");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(words[1] as f64), "the replicas' output tokens: {m}");
    assert_quiescent(&gw).await;
}

/// An agent's session pins its turns to one replica while it is healthy
/// and free, as `prompt_cache_key` does: Anthropic's `metadata.user_id`
/// (where Claude Code and other agents name their session) for Messages,
/// `x-session-id` for any endpoint. Turns of other prompts without one
/// spread over the replicas.
#[tokio::test]
async fn an_agents_session_keeps_its_turns_on_one_replica() {
    let (a, b) = (Mock::start(script(anthropic)).await, Mock::start(script(anthropic)).await);
    let gw = start_gateway(&format!("{}{}", gateway_config(&[a.url(), b.url()]).yaml(), keys())).await;
    let c = client();
    let replica_of = |resp: &http::Response<hyper::body::Incoming>| {
        resp.headers().get("x-slogate-replica").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
    };
    let mut seen = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for turn in 0..12 {
        for (session, meta, header) in [("claude", true, false), ("cli", false, true), ("none", false, false)] {
            let metadata = if meta { format!(r#","metadata":{{"user_id":"user_x_account__session_{session}"}}"#) } else { String::new() };
            let body = format!(
                r#"{{"model":"m1","max_tokens":8{metadata},"messages":[{{"role":"user","content":"turn {turn} of {session}: a different question each time"}}]}}"#
            );
            let mut headers = vec![("x-api-key", "sk-a")];
            if header {
                headers.push(("x-session-id", "cli-session-7"));
            }
            let resp = c.request(post_req(&gw, "/v1/messages", &body, &headers)).await.expect("response");
            assert_eq!(resp.status(), 200);
            seen.entry(session.to_string()).or_default().insert(replica_of(&resp));
            resp.into_body().collect().await.expect("body");
        }
    }
    assert_eq!(seen["claude"].len(), 1, "metadata.user_id pins the session: {seen:?}");
    assert_eq!(seen["cli"].len(), 1, "x-session-id pins the session: {seen:?}");
    assert_eq!(seen["none"].len(), 2, "other turns spread: {seen:?}");
    assert_quiescent(&gw).await;
}
