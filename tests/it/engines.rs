//! Engines beyond vLLM: each fixture in `tests/fixtures/engines/` is a
//! stream as that engine sends it, replayed by the mock replica an event
//! every 10 ms (paused time), through the real gateway. What slogate
//! measures must be right for each: TTFT at the first event with generated
//! text (whatever came before it), one ITL gap between each two content
//! events, the outcome, and the tokens (the replica's usage, or counted and
//! marked as estimated when it sends none).

use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::BodyExt;

const EVENT_GAP: Duration = Duration::from_millis(10);

/// The events of a fixture (each with its blank line).
fn fixture(name: &str) -> Vec<Bytes> {
    let path = repo().join("tests/fixtures/engines").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split_inclusive("\n\n").filter(|e| !e.trim().is_empty()).map(|e| Bytes::from(e.to_string())).collect()
}

/// What slogate must make of a fixture.
struct Expect {
    file: &'static str,
    /// Index of the first event with generated text.
    first_content: usize,
    content_events: u64,
    outcome: &'static str,
    /// Completion tokens counted, and whether they were estimated.
    tokens: u64,
    estimated: bool,
}

const CASES: &[Expect] = &[
    Expect { file: "vllm.sse", first_content: 1, content_events: 3, outcome: "ok", tokens: 3, estimated: false },
    Expect { file: "sglang.sse", first_content: 1, content_events: 3, outcome: "length", tokens: 3, estimated: false },
    Expect { file: "sglang-error.sse", first_content: 1, content_events: 1, outcome: "stream_error", tokens: 0, estimated: false },
    Expect { file: "llamacpp.sse", first_content: 1, content_events: 3, outcome: "ok", tokens: 3, estimated: false },
    Expect { file: "llamacpp-python.sse", first_content: 1, content_events: 3, outcome: "length", tokens: 3, estimated: true },
    Expect { file: "tgi.sse", first_content: 0, content_events: 3, outcome: "length", tokens: 3, estimated: false },
    Expect { file: "tgi-error.sse", first_content: 0, content_events: 1, outcome: "stream_error", tokens: 0, estimated: false },
    Expect { file: "ollama.sse", first_content: 0, content_events: 3, outcome: "ok", tokens: 3, estimated: false },
];

#[tokio::test(start_paused = true)]
async fn each_engines_stream_is_measured_at_its_first_content() {
    for case in CASES {
        let events = fixture(case.file);
        let replay = events.clone();
        let mock = Mock::start(script(move |_| {
            let mut steps = Vec::new();
            for e in &replay {
                steps.push(Step::Wait(EVENT_GAP));
                steps.push(Step::Send(e.clone()));
            }
            Script::sse(steps)
        }))
        .await;
        let gw = gateway_config(&[mock.url()]).pool("engine: auto").start().await;
        let f = case.file;
        // The client asks for usage, so what it gets is the stream as sent.
        let resp = client().request(post_req(&gw, "/v1/chat/completions", &chat_body(true, true), &[])).await.expect("response");
        assert_eq!(resp.status(), 200, "{f}");
        let got = resp.into_body().collect().await.expect("body").to_bytes();
        let sent: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&sent), "{f}: the stream passes through unchanged");

        let m = metrics_text(&gw).await;
        let chat = [("class", "chat")];
        let ttft = metric(&m, "slogate_time_to_first_token_seconds_sum", &chat).expect("a TTFT");
        let at = EVENT_GAP.as_secs_f64() * (case.first_content + 1) as f64;
        // At the first content event: not at the role chunk before it (10 ms
        // earlier), nor at a later event.
        assert!(ttft >= at - 1e-6 && ttft < at + EVENT_GAP.as_secs_f64() - 1e-6, "{f}: TTFT {ttft} s, the first content came at {at} s");
        let gaps = metric(&m, "slogate_inter_token_latency_seconds_count", &chat).unwrap_or(0.0);
        assert_eq!(gaps, (case.content_events - 1) as f64, "{f}: one gap between each two content events");
        assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", case.outcome)]), Some(1.0), "{f}: outcome\n{m}");
        let tokens = metric(&m, "slogate_generation_tokens_total", &chat).unwrap_or(0.0);
        assert_eq!(tokens, case.tokens as f64, "{f}: completion tokens");
        let estimated = metric(&m, "slogate_usage_estimated_requests_total", &chat).unwrap_or(0.0);
        assert_eq!(estimated, if case.estimated { 1.0 } else { 0.0 }, "{f}: marked as estimated");
        if case.estimated {
            // The prompt from the body's size, four bytes a token.
            let prompt = metric(&m, "slogate_prompt_tokens_total", &chat).unwrap_or(0.0);
            assert_eq!(prompt, (chat_body(true, true).len() / 4) as f64, "{f}: prompt estimate");
        }
        assert_quiescent(&gw).await;
    }
}

/// A client that did not ask for usage gets none: slogate asked for it
/// and cut the usage-only chunk out, for the engines that send one; the
/// tokens are counted all the same.
#[tokio::test(start_paused = true)]
async fn usage_slogate_asked_for_is_cut_out_for_each_engine() {
    for file in ["vllm.sse", "sglang.sse", "ollama.sse"] {
        let events = fixture(file);
        let mock = Mock::start(script(move |req| {
            assert!(wants_usage(req), "slogate asks for usage");
            Script::sse(events.iter().cloned().map(Step::Send).collect())
        }))
        .await;
        let gw = gateway_config(&[mock.url()]).start().await;
        let resp = client().request(post_req(&gw, "/v1/chat/completions", &chat_body(true, false), &[])).await.expect("response");
        let got = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        assert!(!got.contains("\"usage\":{"), "{file}: {got}");
        assert!(got.contains("Hello") && got.ends_with("data: [DONE]\n\n"), "{file}: {got}");
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_generation_tokens_total", &[("class", "chat")]), Some(3.0), "{file}");
        assert_quiescent(&gw).await;
    }
}

/// Error answers in each engine's shape pass through unchanged (TGI's
/// `{"error": "<text>", "error_type"}`, SGLang's `{"object": "error", ...}`),
/// counted by status; a JSON answer without usage has its tokens estimated
/// from its text.
#[tokio::test]
async fn error_shapes_pass_through_and_a_json_answer_without_usage_is_estimated() {
    let tgi = r#"{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096","error_type":"validation"}"#;
    let sglang = r#"{"object":"error","message":"Requested token count exceeds the model's maximum context length","type":"BadRequestError","param":null,"code":400}"#;
    let no_usage = r#"{"id":"chatcmpl-c3","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, friend"},"finish_reason":"stop"}]}"#;
    for (proto, client) in clients() {
        for (status, body) in [(422, tgi), (400, sglang)] {
            let mock = Mock::start(Script::json(status, body).always()).await;
            let gw = gateway_config(&[mock.url()]).start().await;
            let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(false, false), &[])).await.expect("response");
            assert_eq!(resp.status(), status, "{proto}");
            let got = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&got[..], body.as_bytes(), "{proto}: unchanged");
            assert_eq!(requests_with_outcome(&gw, "client_error").await, 1.0, "{proto}");
            assert_quiescent(&gw).await;
        }
        let mock = Mock::start(Script::json(200, no_usage).always()).await;
        let gw = gateway_config(&[mock.url()]).start().await;
        let resp = client.request(post_req(&gw, "/v1/chat/completions", &chat_body(false, false), &[])).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let _ = resp.into_body().collect().await.expect("body");
        let m = metrics_text(&gw).await;
        let chat = [("class", "chat")];
        // 19 characters, four a token.
        assert_eq!(metric(&m, "slogate_generation_tokens_total", &chat), Some(5.0), "{proto}\n{m}");
        assert_eq!(metric(&m, "slogate_usage_estimated_requests_total", &chat), Some(1.0), "{proto}");
        assert_eq!(requests_with_outcome(&gw, "ok").await, 1.0, "{proto}");
        assert_quiescent(&gw).await;
    }
}
