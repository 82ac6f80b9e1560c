//! Preemption (`pools[].preempt`, on by default): a chat request that
//! finds every slot held by a batch stream, and would miss its TTFT target
//! waiting, takes that stream's slot; the batch stream's
//! replica request ends, it waits for a slot again, and goes on where it
//! stopped, spliced into its client's stream, over HTTP/1.1 and HTTP/2: one
//! id, one role chunk, the text whole, one outcome each.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::*;

fn chunk(id: &str, delta: &str, finish: Option<&str>) -> Bytes {
    let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
    event(&format!(
        r#"{{"id":"{id}","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
    ))
}

/// The batch job streams "Hel", "lo" and then holds its slot (until its
/// connection goes); its continuation says " wor", "ld"; a chat request
/// is answered at once. The replica notes what it was asked, in order.
fn replica(order: Arc<Mutex<Vec<String>>>) -> ScriptFn {
    script(move |req| {
        let what = if req.get("continue_final_message").is_some() {
            "continuation"
        } else {
            req["messages"][0]["content"].as_str().unwrap_or("?")
        };
        order.lock().expect("lock").push(what.to_string());
        match what {
            "batch job" => Script::sse(vec![
                Step::Send(chunk("chatcmpl-a", r#"{"role":"assistant","content":""}"#, None)),
                Step::Send(chunk("chatcmpl-a", r#"{"content":"Hel"}"#, None)),
                Step::Send(chunk("chatcmpl-a", r#"{"content":"lo"}"#, None)),
                Step::Until(Gate::default()),
            ]),
            "continuation" => Script::sse(vec![
                Step::Send(chunk("chatcmpl-b", r#"{"role":"assistant","content":""}"#, None)),
                Step::Send(chunk("chatcmpl-b", r#"{"content":" wor"}"#, None)),
                Step::Send(chunk("chatcmpl-b", r#"{"content":"ld"}"#, None)),
                Step::Send(chunk("chatcmpl-b", r#"{"content":""}"#, Some("stop"))),
                Step::Send(done()),
            ]),
            _ => json_answer("hi", "stop", 5, 1),
        }
    })
}

fn ask(content: &str, stream: bool) -> String {
    format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":16,"stream":{stream}}}"#)
}

/// A batch stream through `gw`, read until it has sent "Hel" and "lo":
/// its body, and what was read of it.
async fn batch_streaming(client: &TestClient, gw: &Gw) -> (hyper::body::Incoming, Vec<u8>) {
    let batch =
        client.request(post_req(gw, "/v1/chat/completions", &ask("batch job", true), &[("x-slo-class", "batch")])).await.expect("batch");
    assert_eq!(batch.status(), 200);
    let mut body = batch.into_body();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("\"lo\"") {
        if let Ok(d) = body.frame().await.expect("frame").expect("ok").into_data() {
            seen.extend_from_slice(&d);
        }
    }
    (body, seen)
}

#[tokio::test]
async fn a_chat_request_takes_a_batch_streams_slot_and_the_batch_stream_goes_on_whole() {
    for (proto, client) in clients() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mock = Mock::start(replica(order.clone())).await;
        // The default (`preempt: auto`).
        let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").start().await;
        let (body, mut seen) = batch_streaming(&client, &gw).await;
        // The one slot is the batch stream's: the chat request takes it.
        let chat = client.request(post_req(&gw, "/v1/chat/completions", &ask("chat", false), &[])).await.expect("chat");
        assert_eq!(chat.status(), 200, "{proto}");
        chat.into_body().collect().await.expect("chat body");
        seen.extend_from_slice(&body.collect().await.expect("the batch stream ends cleanly").to_bytes());
        let text = String::from_utf8_lossy(&seen).to_string();
        let data: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{proto}: whole: {text}");
        let events: Vec<serde_json::Value> = data.iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
        assert!(events.iter().all(|e| e["id"] == "chatcmpl-a"), "{proto}: one id: {text}");
        let roles = events.iter().filter(|e| e.pointer("/choices/0/delta/role").is_some()).count();
        assert_eq!(roles, 1, "{proto}: one role chunk: {text}");
        let said: String = events.iter().filter_map(|e| e.pointer("/choices/0/delta/content").and_then(|c| c.as_str())).collect();
        assert_eq!(said, "Hello world", "{proto}: {text}");
        assert_eq!(order.lock().expect("lock").clone(), ["batch job", "chat", "continuation"], "{proto}: chat went first");
        wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 2.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_preemptions_total", &[]), Some(1.0), "{proto}: {m}");
        assert_eq!(metric(&m, "slogate_preemption_pause_seconds_count", &[]), Some(1.0), "{proto}");
        assert!(metric(&m, "slogate_preemption_redone_tokens_total", &[]).is_some_and(|t| t >= 2.0), "{proto}: {m}");
        assert_eq!(metric(&m, "slogate_stream_resumes_total", &[]), None, "{proto}: not a break");
        assert_quiescent(&gw).await;
    }
}

/// As `replica`, but a chat stream's answer waits for an engine slot (the
/// batch stream holds it): its head comes at once, its first token once
/// `engine_slot` opens.
fn engine(order: Arc<Mutex<Vec<String>>>, engine_slot: Gate) -> ScriptFn {
    let rest = replica(order.clone());
    script(move |req| {
        if req["messages"][0]["content"].as_str() != Some("chat") {
            return rest(req);
        }
        order.lock().expect("lock").push("chat".to_string());
        Script::sse(vec![
            Step::Until(engine_slot.clone()),
            Step::Send(chunk("chatcmpl-c", r#"{"role":"assistant","content":""}"#, None)),
            Step::Send(chunk("chatcmpl-c", r#"{"content":"hi"}"#, None)),
            Step::Send(chunk("chatcmpl-c", r#"{"content":""}"#, Some("stop"))),
            Step::Send(done()),
        ])
    })
}

/// A chat stream that took a slot without waiting in the gateway but has
/// no first token at its moment, on a replica that says requests wait in
/// it (the chat waits inside the engine, whose slot the batch stream
/// holds), asks that batch stream for its slot: the batch stream's
/// replica request ends, the chat stream is answered, and the batch
/// stream goes on whole. With the defaults where the engine orders its
/// own queue by priority (`upstream_priority`): it runs the chat request
/// first, but only once a slot frees, and vLLM frees none for it.
#[tokio::test]
async fn a_chat_stream_waiting_inside_a_priority_engine_takes_a_batch_streams_slot() {
    for (proto, client) in clients() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let engine_slot = Gate::default();
        let mock = Mock::start(engine(order.clone(), engine_slot.clone())).await;
        let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 2\n    upstream_priority: true").start().await;
        // The engine says a request waits in it while it runs all it can
        // (the batch stream), and the gateway read that.
        mock.state.waiting.store(1, std::sync::atomic::Ordering::SeqCst);
        *mock.state.running.lock().expect("lock") = Some(1);
        let scrapes = || mock.state.scrapes.load(std::sync::atomic::Ordering::SeqCst);
        let before = scrapes();
        wait_until("two scrapes", || {
            let n = scrapes();
            async move { n >= before + 2 }
        })
        .await;
        let (body, mut seen) = batch_streaming(&client, &gw).await;
        let chat = client.request(post_req(&gw, "/v1/chat/completions", &ask("chat", true), &[])).await.expect("chat");
        assert_eq!(chat.status(), 200, "{proto}");
        let state = mock.state.clone();
        wait_until("the batch stream's replica request ended", || {
            let state = state.clone();
            async move { state.cancelled.load(std::sync::atomic::Ordering::SeqCst) >= 1 }
        })
        .await;
        engine_slot.open();
        let said = String::from_utf8_lossy(&chat.into_body().collect().await.expect("chat body").to_bytes()).to_string();
        assert!(said.contains("\"hi\"") && said.contains("[DONE]"), "{proto}: {said}");
        seen.extend_from_slice(&body.collect().await.expect("the batch stream ends cleanly").to_bytes());
        let text = String::from_utf8_lossy(&seen).to_string();
        let content: String = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|e| e.pointer("/choices/0/delta/content").and_then(|c| c.as_str()).map(String::from))
            .collect();
        assert_eq!(content, "Hello world", "{proto}: {text}");
        assert_eq!(order.lock().expect("lock").clone(), ["batch job", "chat", "continuation"], "{proto}");
        wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 2.0 }).await;
        assert_eq!(metric(&metrics_text(&gw).await, "slogate_preemptions_total", &[]), Some(1.0), "{proto}");
        assert_quiescent(&gw).await;
    }
}

/// Off, a chat request waits for the batch stream's slot.
#[tokio::test]
async fn without_preempt_a_chat_request_waits_for_the_batch_stream() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mock = Mock::start(replica(order.clone())).await;
    let gw =
        gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1\n    preempt: false\n    timeouts: { idle: 60s }").start().await;
    let (body, _) = batch_streaming(&client(), &gw).await;
    let admin = gw.admin_addr;
    let chat = tokio::spawn({
        let addr = gw.data();
        async move { client().request(post_req(addr, "/v1/chat/completions", &ask("chat", false), &[])).await.expect("chat").status() }
    });
    wait_until("the chat request queued", || async {
        metric(&get(admin, "/metrics").await.1, "slogate_queue_depth", &[("tier", "interactive")]) == Some(1.0)
    })
    .await;
    assert_eq!(order.lock().expect("lock").clone(), ["batch job"], "the chat request waits");
    drop(body);
    assert_eq!(chat.await.expect("task"), 200);
    assert_eq!(metric(&metrics_text(&gw).await, "slogate_preemptions_total", &[]), None);
    assert_quiescent(&gw).await;
}

/// The OpenAI SDK reads a preempted stream as one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_reads_a_preempted_stream_whole() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mock = Mock::start(replica(order.clone())).await;
    let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1\n    preempt: true").start().await;
    let code = r#"
import json
s = c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "batch job"}], max_tokens=16, stream=True,
                              extra_headers={"x-slo-class": "batch"})
ids, text, roles, finish = set(), "", 0, None
for chunk in s:
    ids.add(chunk.id)
    for choice in chunk.choices:
        roles += 1 if choice.delta.role else 0
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
print(json.dumps({"ids": sorted(ids), "text": text, "roles": roles, "finish": finish}))
"#;
    let chat = async {
        // Once the batch stream holds the slot and has sent its first words.
        wait_until("the batch stream runs", || async { order.lock().expect("lock").len() == 1 }).await;
        let admin = gw.admin_addr;
        wait_until("its first token", || async {
            metric(&get(admin, "/metrics").await.1, "slogate_time_to_first_token_seconds_count", &[]) == Some(1.0)
        })
        .await;
        post(&gw, "/v1/chat/completions", &ask("chat", false), &[]).await.0
    };
    gw.count_sent(1);
    let (out, chat) = tokio::join!(openai_sdk(&gw, code, &[]), chat);
    assert_eq!(chat, 200);
    let got: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(got, serde_json::json!({"ids": ["chatcmpl-a"], "text": "Hello world", "roles": 1, "finish": "stop"}), "{out}");
    assert_eq!(order.lock().expect("lock").clone(), ["batch job", "chat", "continuation"]);
    assert_quiescent(&gw).await;
}

/// A chat request through `gw` finds the only slot held by a batch stream
/// that cannot give it up: it waits, and is refused when it can no longer
/// make its target, while the batch stream goes on untouched.
async fn the_chat_request_waits_for_the_batch_streams_slot(client: &TestClient, gw: &Gw, mock: &Mock, proto: &str) {
    let chat = client.request(post_req(gw, "/v1/chat/completions", &ask("chat", false), &[])).await.expect("chat");
    assert_eq!(chat.status(), 429, "{proto}: the chat request waited for the slot and was refused");
    assert_eq!(mock.state.cancelled.load(std::sync::atomic::Ordering::SeqCst), 0, "{proto}: the batch stream went on");
    assert_eq!(metric(&metrics_text(gw).await, "slogate_preemptions_total", &[]), None, "{proto}");
}

/// A batch stream found, once asked, to hold what a continuation cannot
/// carry on from (reasoning) goes on where it is and keeps its slot to its
/// end: the chat request that asked still waits for it, and is refused
/// when it can no longer make its target.
#[tokio::test]
async fn a_batch_stream_asked_that_cannot_be_continued_keeps_its_slot() {
    for (proto, client) in clients() {
        let mock = Mock::start(script(move |req| {
            if req["messages"][0]["content"].as_str() != Some("batch job") {
                return json_answer("hi", "stop", 5, 1);
            }
            Script::sse(vec![
                Step::Send(chunk("chatcmpl-a", r#"{"role":"assistant","content":""}"#, None)),
                Step::Send(chunk("chatcmpl-a", r#"{"reasoning_content":"hmm"}"#, None)),
                Step::Send(chunk("chatcmpl-a", r#"{"content":"Hel"}"#, None)),
                Step::Send(chunk("chatcmpl-a", r#"{"content":"lo"}"#, None)),
                Step::Until(Gate::default()),
            ])
        }))
        .await;
        let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1\n    timeouts: { idle: 60s }").start().await;
        let (body, _) = batch_streaming(&client, &gw).await;
        the_chat_request_waits_for_the_batch_streams_slot(&client, &gw, &mock, proto).await;
        drop(body);
        assert_quiescent(&gw).await;
    }
}

/// A batch stream whose answer slogate cannot continue (a Responses
/// stream: its state lives in the replica) is never a victim: a chat
/// request that finds its slot taken waits, and is refused when it can no
/// longer make its target, while the batch stream goes on untouched.
#[tokio::test]
async fn a_batch_stream_that_cannot_be_continued_keeps_its_slot() {
    for (proto, client) in clients() {
        let rest = replica(Arc::new(Mutex::new(Vec::new())));
        let mock = Mock::start(script(move |req| {
            if req.get("input").is_none() {
                return rest(req);
            }
            Script::sse(vec![
                Step::Send(typed_event("response.created", r#""response":{"id":"resp_1","object":"response","status":"in_progress"}"#)),
                Step::Send(typed_event("response.output_text.delta", r#""delta":"Hel""#)),
                Step::Send(typed_event("response.output_text.delta", r#""delta":"lo""#)),
                Step::Until(Gate::default()),
            ])
        }))
        .await;
        let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1\n    timeouts: { idle: 60s }").start().await;
        let job = r#"{"model":"m1","input":"batch job","stream":true}"#;
        let batch = client.request(post_req(&gw, "/v1/responses", job, &[("x-slo-class", "batch")])).await.expect("batch");
        assert_eq!(batch.status(), 200, "{proto}");
        let mut body = batch.into_body();
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("\"lo\"") {
            if let Ok(d) = body.frame().await.expect("frame").expect("ok").into_data() {
                seen.extend_from_slice(&d);
            }
        }
        the_chat_request_waits_for_the_batch_streams_slot(&client, &gw, &mock, proto).await;
        drop(body);
        assert_quiescent(&gw).await;
    }
}
