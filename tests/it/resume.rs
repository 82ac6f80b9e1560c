//! A stream that breaks after the client got part of it is continued on
//! another replica and spliced into the client's stream, over HTTP/1.1 and
//! HTTP/2: one id, one role chunk, the text going on where it stopped, the
//! usage of the whole answer, one outcome.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::*;

/// A chunk of stream `id` (created at `created`) with `delta`, maybe finished.
fn chunk(id: &str, created: u64, delta: &str, finish: Option<&str>) -> Bytes {
    let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
    event(&format!(
        r#"{{"id":"{id}","object":"chat.completion.chunk","created":{created},"model":"m1","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
    ))
}

/// How the first replica's stream breaks.
#[derive(Clone, Copy, Debug)]
enum Break {
    Reset,
    Eof,
    ErrorEvent,
    Stall,
}

impl Break {
    fn label(self) -> &'static str {
        match self {
            Break::Reset => "reset",
            Break::Eof => "eof",
            Break::ErrorEvent => "error_event",
            Break::Stall => "stall",
        }
    }

    /// The steps that break a stream, once `gate` opens.
    fn steps(self, gate: &Gate) -> Vec<Step> {
        match self {
            Break::Reset => vec![Step::Until(gate.clone()), Step::Abort],
            Break::Eof => vec![Step::Until(gate.clone())],
            Break::ErrorEvent => vec![
                Step::Until(gate.clone()),
                Step::Send(event(r#"{"error":{"object":"error","message":"engine died","type":"InternalServerError","code":500}}"#)),
                Step::Send(done()),
            ],
            // It never opens for this one: the stream stalls.
            Break::Stall => vec![Step::Until(Gate::default())],
        }
    }
}

/// The first request breaks after "Hel" and "lo"; any later one is the
/// continuation, answered " wor", "ld" under another id.
fn breaks_then_continues(how: Break, gate: Gate) -> ScriptFn {
    let calls = Arc::new(AtomicUsize::new(0));
    script(move |req| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut steps = vec![
                Step::Send(chunk("chatcmpl-a", 1, r#"{"role":"assistant","content":""}"#, None)),
                Step::Send(chunk("chatcmpl-a", 1, r#"{"content":"Hel"}"#, None)),
                Step::Send(chunk("chatcmpl-a", 1, r#"{"content":"lo"}"#, None)),
            ];
            steps.extend(how.steps(&gate));
            return Script::sse(steps);
        }
        let mut steps = vec![
            Step::Send(chunk("chatcmpl-b", 2, r#"{"role":"assistant","content":""}"#, None)),
            Step::Send(chunk("chatcmpl-b", 2, r#"{"content":" wor"}"#, None)),
            Step::Send(chunk("chatcmpl-b", 2, r#"{"content":"ld"}"#, None)),
            Step::Send(chunk("chatcmpl-b", 2, r#"{"content":""}"#, Some("stop"))),
        ];
        if wants_usage(req) {
            steps.push(Step::Send(event(
                r#"{"id":"chatcmpl-b","object":"chat.completion.chunk","created":2,"model":"m1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}"#,
            )));
        }
        steps.push(Step::Send(done()));
        Script::sse(steps)
    })
}

/// Read `body` until `text` has come; what came.
async fn read_until(body: &mut hyper::body::Incoming, text: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(text) {
        let frame = body.frame().await.expect("frame").expect("ok frame");
        if let Ok(d) = frame.into_data() {
            seen.extend_from_slice(&d);
        }
    }
    seen
}

/// The JSON events of an SSE text, and whether it ended with `[DONE]`.
fn events(text: &str) -> (Vec<serde_json::Value>, bool) {
    let data: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    let done = data.last() == Some(&"[DONE]");
    (data.iter().filter_map(|d| serde_json::from_str(d).ok()).collect(), done)
}

/// The client's stream reads as one answer from one replica.
fn assert_one_answer(text: &str, usage: bool, what: &str) {
    let (events, done) = events(text);
    assert!(done && !text.contains("error"), "{what}: a whole stream, no error: {text}");
    assert!(
        events.iter().all(|e| e["id"] == "chatcmpl-a" && e["created"] == 1),
        "{what}: the original's id and created throughout: {text}"
    );
    let roles = events.iter().filter(|e| e.pointer("/choices/0/delta/role").is_some()).count();
    assert_eq!(roles, 1, "{what}: one role chunk: {text}");
    let said: String = events.iter().filter_map(|e| e.pointer("/choices/0/delta/content").and_then(|c| c.as_str())).collect();
    assert_eq!(said, "Hello world", "{what}: the continuation's text follows on");
    let finish: Vec<_> = events.iter().filter_map(|e| e.pointer("/choices/0/finish_reason").and_then(|f| f.as_str())).collect();
    assert_eq!(finish, ["stop"], "{what}: the finish is the continuation's");
    let usage_seen = events.iter().find_map(|e| e.get("usage").filter(|u| u.is_object()).cloned());
    if usage {
        let want = serde_json::json!({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14});
        assert_eq!(usage_seen, Some(want), "{what}: the whole answer's usage");
    } else {
        assert_eq!(usage_seen, None, "{what}: no usage the client did not ask for");
    }
}

#[tokio::test]
async fn a_stream_that_breaks_is_continued_on_the_other_replica_as_one_answer() {
    for how in [Break::Reset, Break::Eof, Break::ErrorEvent, Break::Stall] {
        for (proto, client) in clients() {
            let usage = matches!(how, Break::Reset | Break::Stall);
            let what = format!("{proto}, {how:?}");
            let gate = Gate::default();
            let script = breaks_then_continues(how, gate.clone());
            let (a, b) = (Mock::start(script.clone()).await, Mock::start(script).await);
            let gw = gateway_config(&[a.url(), b.url()]).pool("timeouts: { idle: 400ms }").start().await;
            let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, usage), &[])).await.expect("POST");
            assert_eq!(resp.status(), 200, "{what}");
            let mut body = resp.into_body();
            let mut seen = read_until(&mut body, "\"lo\"").await;
            gate.open();
            seen.extend_from_slice(&body.collect().await.expect("the stream ends cleanly").to_bytes());
            assert_one_answer(&String::from_utf8_lossy(&seen), usage, &what);

            // The continuation: the text the client has as the assistant's message to go on from.
            let sent: Vec<serde_json::Value> = [&a, &b].iter().flat_map(|m| m.state.bodies.lock().expect("bodies").clone()).collect();
            assert_eq!(sent.len(), 2, "{what}: the request, then its continuation");
            let cont = sent.iter().find(|r| r.get("continue_final_message").is_some()).expect("a continuation");
            assert_eq!(cont["messages"][1], serde_json::json!({"role": "assistant", "content": "Hello"}), "{what}");
            assert_eq!((cont["add_generation_prompt"].as_bool(), cont["max_tokens"].as_u64()), (Some(false), Some(14)), "{what}");
            assert_eq!((a.calls(), b.calls()), (1, 1), "{what}: one replica each");

            wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 1.0 }).await;
            let m = metrics_text(&gw).await;
            assert_eq!(requests_with_outcome(&gw, "stream_error").await + requests_with_outcome(&gw, "timeout").await, 0.0, "{what}");
            assert_eq!(metric(&m, "slogate_stream_resumes_total", &[("reason", how.label())]), Some(1.0), "{what}");
            assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[]), Some(1.0), "{what}");
            assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &[]), Some(3.0), "{what}: the break is one gap");
            assert_quiescent(&gw).await;
        }
    }
}

#[tokio::test]
async fn a_stream_that_cannot_be_continued_exactly_is_cut_as_before() {
    // n: 2 asks for two answers; a continuation could not give them back.
    for (proto, client) in clients() {
        let gate = Gate::default();
        let script = breaks_then_continues(Break::Reset, gate.clone());
        let (a, b) = (Mock::start(script.clone()).await, Mock::start(script).await);
        let gw = gateway_config(&[a.url(), b.url()]).start().await;
        let body = chat_body(true, false).replace("\"stream\":true", "\"stream\":true,\"n\":2");
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &body, &[])).await.expect("POST");
        let mut body = resp.into_body();
        let mut seen = read_until(&mut body, "\"lo\"").await;
        gate.open();
        seen.extend_from_slice(&body.collect().await.expect("the stream ends cleanly").to_bytes());
        let text = String::from_utf8_lossy(&seen).into_owned();
        assert!(
            text.contains("the replica's stream failed") && text.ends_with("data: [DONE]\n\n"),
            "{proto}: cut, with an error event: {text}"
        );
        assert_eq!(a.calls() + b.calls(), 1, "{proto}: nothing sent again");
        wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[("reason", "reset"), ("why", "not_exact")]), Some(1.0), "{proto}");
        assert_eq!(metric(&m, "slogate_stream_resumes_total", &[]), None, "{proto}");
        assert_quiescent(&gw).await;
    }
}

/// A stream whose replica sends its finish (and, in `tail`, what follows
/// it) and then cuts the connection once `gate` opens.
fn cut_after_finish(tail: Vec<Step>, gate: &Gate) -> ScriptFn {
    let mut steps = vec![
        Step::Send(chunk("chatcmpl-a", 1, r#"{"role":"assistant","content":""}"#, None)),
        Step::Send(chunk("chatcmpl-a", 1, r#"{"content":"Hello"}"#, None)),
        Step::Send(chunk("chatcmpl-a", 1, r#"{"content":""}"#, Some("stop"))),
    ];
    steps.extend(tail);
    steps.extend([Step::Until(gate.clone()), Step::Abort]);
    Script::sse(steps).always()
}

/// Send `body` through a gateway in front of two replicas that cut each
/// stream after its finish (then `tail`); what the client read, the
/// gateway, and how many requests the replicas got (the replicas kept
/// running beside it).
async fn through_cut_after_finish(client: &TestClient, body: &str, tail: Vec<Step>) -> (String, Gw, usize, [Mock; 2]) {
    let gate = Gate::default();
    let (a, b) = (Mock::start(cut_after_finish(tail.clone(), &gate)).await, Mock::start(cut_after_finish(tail, &gate)).await);
    let gw = gateway_config(&[a.url(), b.url()]).start().await;
    let resp = client.request(post_req(&gw, "/v1/chat/completions", body, &[])).await.expect("POST");
    let mut body = resp.into_body();
    let mut seen = read_until(&mut body, "\"stop\"").await;
    gate.open();
    seen.extend_from_slice(&body.collect().await.expect("the stream ends cleanly").to_bytes());
    let calls = a.calls() + b.calls();
    (String::from_utf8_lossy(&seen).into_owned(), gw, calls, [a, b])
}

#[tokio::test]
async fn a_stream_cut_after_its_finish_is_ended_whole_when_the_client_has_all_it_asked_for() {
    for (proto, client) in clients() {
        // The answer was whole (its finish came); only the usage slogate
        // asked for and [DONE] did not: the client gets its [DONE].
        let (text, gw, calls, _replicas) = through_cut_after_finish(&client, &chat_body(true, false), vec![]).await;
        assert!(!text.contains("error") && text.ends_with("\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), "{proto}: whole: {text}");
        assert_eq!(calls, 1, "{proto}: nothing sent again");
        wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 1.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[("reason", "reset"), ("why", "finished")]), Some(1.0), "{proto}");
        assert_eq!(requests_with_outcome(&gw, "stream_error").await, 0.0, "{proto}");
        assert_quiescent(&gw).await;

        // The client asked for usage, which did not come: cut as before.
        let (text, gw, calls, _replicas) = through_cut_after_finish(&client, &chat_body(true, true), vec![]).await;
        assert!(text.contains("the replica's stream failed") && text.ends_with("data: [DONE]\n\n"), "{proto}: cut: {text}");
        assert_eq!(calls, 1, "{proto}: nothing sent again");
        wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[("why", "finished")]), Some(1.0), "{proto}");
        assert_quiescent(&gw).await;

        // Two answers asked for: one choice's finish is not the answer's.
        let two = chat_body(true, false).replace("\"stream\":true", "\"stream\":true,\"n\":2");
        let (text, gw, _, _replicas) = through_cut_after_finish(&client, &two, vec![]).await;
        assert!(text.contains("the replica's stream failed"), "{proto}: cut: {text}");
        wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
        assert_quiescent(&gw).await;
    }
}

#[tokio::test]
async fn a_connection_that_fails_after_done_breaks_nothing() {
    for (proto, client) in clients() {
        for usage in [false, true] {
            let what = format!("{proto}, usage {usage}");
            let tail = vec![Step::Send(usage_chunk(7, 1)), Step::Send(done())];
            let (text, gw, calls, _replicas) = through_cut_after_finish(&client, &chat_body(true, usage), tail).await;
            assert!(!text.contains("error") && text.ends_with("}\n\ndata: [DONE]\n\n"), "{what}: whole, as it came: {text}");
            assert_eq!((text.matches("[DONE]").count(), text.contains("\"usage\"")), (1, usage), "{what}: one [DONE]: {text}");
            assert_eq!(calls, 1, "{what}: nothing sent again");
            wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 1.0 }).await;
            let m = metrics_text(&gw).await;
            assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[]), None, "{what}: no break");
            assert_quiescent(&gw).await;
        }
    }
}

#[tokio::test]
async fn an_error_event_past_the_last_attempt_reaches_the_client_and_is_counted_unresumed() {
    // Both replicas end every stream with an error event: the continuation
    // breaks too, and the default allows one.
    for (proto, client) in clients() {
        let gate = Gate::default();
        gate.open();
        let steps = {
            let gate = gate.clone();
            script(move |_| {
                let mut steps = vec![
                    Step::Send(chunk("chatcmpl-a", 1, r#"{"role":"assistant","content":""}"#, None)),
                    Step::Send(chunk("chatcmpl-a", 1, r#"{"content":"Hel"}"#, None)),
                ];
                steps.extend(Break::ErrorEvent.steps(&gate));
                Script::sse(steps)
            })
        };
        let (a, b) = (Mock::start(steps.clone()).await, Mock::start(steps).await);
        let gw = gateway_config(&[a.url(), b.url()]).start().await;
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("POST");
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("the stream ends").to_bytes()).into_owned();
        assert!(text.contains("engine died"), "{proto}: the second error event reaches the client: {text}");
        assert_eq!(a.calls() + b.calls(), 2, "{proto}: the request and one continuation");
        wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_stream_resumes_total", &[("reason", "error_event")]), Some(1.0), "{proto}");
        assert_eq!(
            metric(&m, "slogate_stream_unresumed_total", &[("reason", "error_event"), ("why", "attempts")]),
            Some(1.0),
            "{proto}: the break that was not continued is counted"
        );
        assert_quiescent(&gw).await;
    }
}
