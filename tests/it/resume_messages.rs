//! An Anthropic Messages stream that breaks after the client got part of
//! its text goes on on another replica through the chat API, and the
//! client reads one message (over HTTP/1.1 and HTTP/2, and through
//! Anthropic's SDK): one `message_start`, the text going on where it
//! stopped, the stop reason and the whole answer's output tokens, one
//! `message_stop`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::*;

fn ev(kind: &str, data: &str) -> Step {
    Step::Send(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")))
}

fn text_delta(text: &str) -> Step {
    ev("content_block_delta", &format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#))
}

/// How the first replica's Messages stream breaks.
#[derive(Clone, Copy, Debug)]
enum Break {
    Reset,
    /// Ends without `message_stop`.
    Eof,
    ErrorEvent,
}

/// The first request (a Messages stream) breaks after "Hel" and "lo" once
/// `gate` opens; any later one is the continuation, a chat stream going on
/// with " wor", "ld" (and its usage).
fn breaks_then_continues(how: Break, gate: Gate, first: &'static str) -> ScriptFn {
    let calls = Arc::new(AtomicUsize::new(0));
    script(move |req| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut steps = vec![
                ev(
                    "message_start",
                    r#"{"type":"message_start","message":{"id":"msg_a","type":"message","role":"assistant","content":[],"model":"m1","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#,
                ),
                ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
                text_delta(first),
                text_delta("lo"),
                Step::Until(gate.clone()),
            ];
            match how {
                Break::Reset => steps.push(Step::Abort),
                Break::Eof => {}
                Break::ErrorEvent => steps.push(ev("error", r#"{"type":"error","error":{"type":"api_error","message":"engine died"}}"#)),
            }
            return Script::sse(steps);
        }
        assert!(wants_usage(req), "the continuation asks for its usage");
        let chunk = |delta: &str, finish: &str| {
            Step::Send(event(&format!(
                r#"{{"id":"chatcmpl-b","object":"chat.completion.chunk","created":2,"model":"m1","choices":[{{"index":0,"delta":{delta},"finish_reason":{finish}}}]}}"#
            )))
        };
        Script::sse(vec![
            chunk(r#"{"role":"assistant","content":""}"#, "null"),
            chunk(r#"{"content":" wor"}"#, "null"),
            chunk(r#"{"content":"ld"}"#, "null"),
            chunk(r#"{"content":""}"#, "\"stop\""),
            Step::Send(event(
                r#"{"id":"chatcmpl-b","object":"chat.completion.chunk","created":2,"model":"m1","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":2,"total_tokens":16}}"#,
            )),
            Step::Send(done()),
        ])
    })
}

const BODY: &str =
    r#"{"model":"m1","max_tokens":16,"stream":true,"system":"Be brief.","messages":[{"role":"user","content":"Say hello"}]}"#;

#[tokio::test]
async fn a_messages_stream_that_breaks_goes_on_through_the_chat_api_as_one_message() {
    for how in [Break::Reset, Break::Eof, Break::ErrorEvent] {
        for (proto, client) in clients() {
            let what = format!("{proto}, {how:?}");
            let gate = Gate::default();
            let script = breaks_then_continues(how, gate.clone(), "Hel");
            let (a, b) = (Mock::start(script.clone()).await, Mock::start(script).await);
            let gw = gateway_config(&[a.url(), b.url()]).start().await;
            let resp = client.request(post_req(&gw, "/v1/messages", BODY, &[])).await.expect("POST");
            assert_eq!(resp.status(), 200, "{what}");
            let mut body = resp.into_body();
            let mut seen = Vec::new();
            while !String::from_utf8_lossy(&seen).contains("\"lo\"") {
                let frame = body.frame().await.expect("frame").expect("ok frame");
                seen.extend_from_slice(&frame.into_data().unwrap_or_default());
            }
            gate.open();
            seen.extend_from_slice(&body.collect().await.expect("the stream ends cleanly").to_bytes());
            let text = String::from_utf8_lossy(&seen).into_owned();
            let kinds: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("event: ")?.split('\n').next()).collect();
            assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1, "{what}: one message_start: {text}");
            assert_eq!(kinds.last(), Some(&"message_stop"), "{what}: {text}");
            assert!(!text.contains("error") && !text.contains("chat.completion"), "{what}: Anthropic's events only: {text}");
            let data: Vec<serde_json::Value> =
                text.split("\n\n").filter_map(|e| e.split("data: ").nth(1)).filter_map(|d| serde_json::from_str(d).ok()).collect();
            let said: String = data.iter().filter_map(|d| d.pointer("/delta/text").and_then(|t| t.as_str())).collect();
            assert_eq!(said, "Hello world", "{what}");
            let delta = data.iter().find(|d| d["type"] == "message_delta").expect("message_delta");
            assert_eq!(
                (delta["delta"]["stop_reason"].as_str(), delta["usage"]["output_tokens"].as_u64()),
                (Some("end_turn"), Some(4)),
                "{what}"
            );

            // The continuation: the chat API, the conversation and the text so far.
            let paths: Vec<String> = [&a, &b].iter().flat_map(|m| m.state.paths.lock().expect("paths").clone()).collect();
            assert_eq!(paths, ["/v1/messages", "/v1/chat/completions"], "{what}");
            let sent: Vec<serde_json::Value> = [&a, &b].iter().flat_map(|m| m.state.bodies.lock().expect("bodies").clone()).collect();
            let cont = sent.iter().find(|r| r.get("continue_final_message").is_some()).expect("a continuation");
            assert_eq!(
                cont["messages"],
                serde_json::json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Hello"}]),
                "{what}"
            );
            assert_eq!(cont["max_tokens"].as_u64(), Some(14), "{what}");

            wait_until("counted", || async { requests_with_outcome(&gw, "ok").await == 1.0 }).await;
            let m = metrics_text(&gw).await;
            assert_eq!(metric(&m, "slogate_stream_resumes_total", &[]), Some(1.0), "{what}");
            assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(4.0), "{what}: the whole answer's tokens");
            assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &[("endpoint", "messages")]), Some(3.0), "{what}");
            assert_quiescent(&gw).await;
        }
    }
}

/// What cannot go on exactly (a request that offers tools: the chat API
/// would have to carry them and turn tool calls back) is cut as before,
/// with Anthropic's error event.
#[tokio::test]
async fn a_messages_stream_that_may_call_tools_is_cut() {
    for (proto, client) in clients() {
        let gate = Gate::default();
        let script = breaks_then_continues(Break::Reset, gate.clone(), "Hel");
        let (a, b) = (Mock::start(script.clone()).await, Mock::start(script).await);
        let gw = gateway_config(&[a.url(), b.url()]).start().await;
        let body = BODY.replace("\"system\"", r#""tools":[{"name":"f","input_schema":{"type":"object"}}],"system""#);
        let resp = client.request(post_req(&gw, "/v1/messages", &body, &[])).await.expect("POST");
        gate.open();
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("the stream ends").to_bytes()).into_owned();
        assert!(text.ends_with("\n\n") && text.contains("event: error\n"), "{proto}: cut with an error event: {text}");
        assert_eq!(a.calls() + b.calls(), 1, "{proto}: nothing sent again");
        wait_until("counted", || async { requests_with_outcome(&gw, "stream_error").await == 1.0 }).await;
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_stream_unresumed_total", &[("why", "not_exact")]), Some(1.0), "{proto}");
        assert_quiescent(&gw).await;
    }
}

/// Anthropic's SDK reads a broken and continued stream as one message.
#[tokio::test]
async fn anthropics_sdk_reads_a_continued_stream_whole() {
    let gate = Gate::default();
    gate.open();
    let script = breaks_then_continues(Break::Reset, gate, "Hel");
    let (a, b) = (Mock::start(script.clone()).await, Mock::start(script).await);
    let gw = gateway_config(&[a.url(), b.url()]).start().await;
    let code = r#"
import sys, anthropic
c = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused", max_retries=0)
with c.messages.stream(model="m1", max_tokens=16, system="Be brief.", messages=[{"role": "user", "content": "Say hello"}]) as s:
    text = "".join(s.text_stream)
    m = s.get_final_message()
print("read:", repr(text), m.id, m.stop_reason, m.usage.output_tokens, len(m.content))
"#;
    let out = crate::agents::anthropic_sdk(&gw, code).await;
    assert!(out.contains("read: 'Hello world' msg_a end_turn 4 1"), "{out}");
    assert_eq!(a.calls() + b.calls(), 2);
    gw.count_sent(1);
    assert_quiescent(&gw).await;
}
