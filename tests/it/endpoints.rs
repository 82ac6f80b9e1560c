//! Endpoints beyond chat, through the gateway as a user sends them: the
//! Responses API (streamed and whole) measured by its typed events, and
//! `GET /health` on the data port. Driven over HTTP/1.1 and HTTP/2, and with
//! the OpenAI SDK's `responses.create`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::*;

const RESPONSES_STREAM: &str = r#"{"model":"m1","input":"Say hello","stream":true}"#;
const RESPONSES_WHOLE: &str = r#"{"model":"m1","input":"Say hello"}"#;

/// The bytes a script sends, joined.
fn sent_bytes(s: &Script) -> Vec<u8> {
    s.steps.iter().filter_map(|st| if let Step::Send(b) = st { Some(b.to_vec()) } else { None }).flatten().collect()
}

/// A whole Responses stream arrives byte for byte and counts `ok`, with its
/// TTFT at the first text delta (not at `response.created`), one gap per
/// delta after it, and the tokens `response.completed` reports; a stream
/// cut after its deltas is `stream_error`, one the token limit ended is
/// `length`, a failed one `stream_error`.
#[tokio::test]
async fn a_responses_stream_is_measured_by_its_typed_events() {
    let words = ["Hel", "lo", " there"];
    for (end, outcome) in [
        (ResponsesEnd::Completed, "ok"),
        (ResponsesEnd::Incomplete, "length"),
        (ResponsesEnd::Cut, "stream_error"),
        (ResponsesEnd::Failed, "stream_error"),
    ] {
        let script = responses_stream(&words, Duration::from_millis(5), end);
        let expected = sent_bytes(&script);
        let mock = Mock::start(script.always()).await;
        let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
        for (proto, client) in clients() {
            let resp = client.request(post_req(&gw, "/v1/responses", RESPONSES_STREAM, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto} {end:?}");
            assert_eq!(header(resp.headers(), "content-type"), Some("text/event-stream"), "{proto}");
            let got = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&expected), "{proto} {end:?}: the bytes changed");
        }
        let sent = mock.state.bodies.lock().expect("lock").clone();
        assert!(sent.iter().all(|b| b.get("stream_options").is_none()), "nothing added to a Responses request: {sent:?}");
        let m = metrics_text(&gw).await;
        let labels = [("class", "chat"), ("outcome", outcome)];
        assert_eq!(metric(&m, "slogate_requests_total", &labels), Some(2.0), "{end:?}: {m}");
        assert_eq!(
            metric(&m, "slogate_time_to_first_token_seconds_count", &[("class", "chat")]),
            Some(2.0),
            "{end:?}: TTFT at the first delta of each stream"
        );
        assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &[("class", "chat")]), Some(4.0), "{end:?}: two gaps each");
        if end == ResponsesEnd::Completed || end == ResponsesEnd::Incomplete {
            assert_eq!(metric(&m, "slogate_prompt_tokens_total", &[("class", "chat")]), Some(24.0), "{end:?}: input_tokens, reported");
            assert_eq!(metric(&m, "slogate_generation_tokens_total", &[("class", "chat")]), Some(6.0), "{end:?}: output_tokens");
            assert_eq!(metric(&m, "slogate_usage_estimated_requests_total", &[("class", "chat")]).unwrap_or(0.0), 0.0, "{end:?}");
        }
        assert_quiescent(&gw).await;
    }
}

/// The first token of a Responses stream is its first text delta: events
/// before it (created, in progress, the item and part added) do not stop the
/// clock, so a delta that comes late is a late TTFT.
#[tokio::test]
async fn a_responses_streams_ttft_waits_for_its_first_delta() {
    let mut script = responses_stream(&["late"], Duration::ZERO, ResponsesEnd::Completed);
    // Everything before the first delta goes out at once; the delta comes 300 ms later.
    let first_delta = script
        .steps
        .iter()
        .position(|s| matches!(s, Step::Send(b) if b.starts_with(b"event: response.output_text.delta")))
        .expect("a delta");
    script.steps.insert(first_delta, Step::Wait(Duration::from_millis(300)));
    let mock = Mock::start(script.always()).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let (status, _, _) = post(&gw, "/v1/responses", RESPONSES_STREAM, &[]).await;
    assert_eq!(status, 200);
    let m = metrics_text(&gw).await;
    let ttft = metric(&m, "slogate_time_to_first_token_seconds_sum", &[("class", "chat")]).expect("a TTFT");
    assert!((0.3..5.0).contains(&ttft), "TTFT {ttft} s: stamped before the first delta");
    assert_quiescent(&gw).await;
}

/// A whole Responses answer: passed on as sent (with its Content-Length),
/// `ok`, its tokens from `usage`; `incomplete` is `length`.
#[tokio::test]
async fn a_whole_responses_answer_is_counted_with_its_usage() {
    for (status, outcome) in [("completed", "ok"), ("incomplete", "length")] {
        let script = responses_json("Hello there", status);
        let expected = sent_bytes(&script);
        let mock = Mock::start(script.always()).await;
        let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
        for (proto, client) in clients() {
            let resp = client.request(post_req(&gw, "/v1/responses", RESPONSES_WHOLE, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            assert_eq!(header(resp.headers(), "content-length"), Some(expected.len().to_string().as_str()), "{proto}");
            let got: Bytes = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            assert_eq!(got.as_ref(), expected.as_slice(), "{proto}");
        }
        let m = metrics_text(&gw).await;
        assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", outcome)]), Some(2.0), "{status}: {m}");
        assert_eq!(metric(&m, "slogate_prompt_tokens_total", &[("class", "chat")]), Some(24.0), "{status}");
        assert_eq!(metric(&m, "slogate_generation_tokens_total", &[("class", "chat")]), Some(6.0), "{status}");
        assert_eq!(metric(&m, "slogate_usage_estimated_requests_total", &[("class", "chat")]).unwrap_or(0.0), 0.0);
        assert_quiescent(&gw).await;
    }
}

/// The OpenAI Python SDK's `responses.create`, whole and streamed, through
/// the gateway: it gets the text, and the gateway counts both `ok`.
#[tokio::test]
async fn the_openai_sdk_uses_the_responses_api_through_the_gateway() {
    let mock = Mock::start(script(|req| {
        if req.get("stream").and_then(|s| s.as_bool()) == Some(true) {
            responses_stream(&["Hel", "lo"], Duration::ZERO, ResponsesEnd::Completed)
        } else {
            responses_json("Hello", "completed")
        }
    }))
    .await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let code = r#"
whole = c.responses.create(model="m1", input="Say hello")
print("whole:", whole.output_text, whole.usage.input_tokens, whole.usage.output_tokens)
text, kinds = "", []
with c.responses.create(model="m1", input="Say hello", stream=True) as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
print("streamed:", text, kinds[-1])
"#;
    let stdout = openai_sdk(&gw, code, &[]).await;
    assert!(stdout.contains("whole: Hello 12 3"), "{stdout}");
    assert!(stdout.contains("streamed: Hello response.completed"), "{stdout}");
    gw.count_sent(2);
    assert_eq!(requests_with_outcome(&gw, "ok").await, 2.0);
    assert_quiescent(&gw).await;
}

/// `GET /health` on the data port answers as vLLM's does (200) while every
/// pool has a healthy replica, and 503 with Retry-After when one has none;
/// it needs no key, and any other method is 405.
#[tokio::test]
async fn health_on_the_data_port_follows_the_replicas() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let yaml = format!(
        "{}auth:\n  keys:\n    - {{ name: k, key_sha256: {}, classes: [chat] }}\n",
        gateway_config(&[mock.url()]).pool("health: { panic_threshold: 0 }").yaml(),
        slogate::config::key_sha256("sk-k")
    );
    let gw = start_gateway(&yaml).await;
    for (proto, client) in clients() {
        let resp = client.request(get_req(gw.data_addr, "/health")).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}: no key needed");
        assert!(header(resp.headers(), "x-request-id").is_some(), "{proto}");
    }
    let (status, headers, _) = post(&gw, "/health", "{}", &[]).await;
    assert_eq!((status, header(&headers, "allow")), (405, Some("GET")));
    mock.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    let data = gw.data_addr;
    wait_until("the replica taken out", || async move { get(data, "/health").await.0 == 503 }).await;
    let resp = client().request(get_req(gw.data_addr, "/health")).await.expect("response");
    assert_eq!(header(resp.headers(), "retry-after"), Some("1"));
    let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    assert_eq!(error_code(&body), "no_healthy_replica");
    assert_quiescent(&gw).await;
}

/// A multipart request to `path` with `content_type` and `body`, counted
/// as sent when `counted` (a request the gateway routes).
fn form_req(to: Target, path: &str, content_type: &str, body: Vec<u8>, counted: bool) -> http::Request<http_body_util::Full<Bytes>> {
    let addr = to.addr;
    if counted {
        to.count_sent(1);
    }
    http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request")
}

/// Audio-like bytes: every byte value, with CR LF and dashes among them, so
/// a parser that copied or cut the file would show it.
fn audio(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            if i % 97 == 0 {
                b'-'
            } else if i % 89 == 0 {
                b'\r'
            } else {
                (i * 31 % 251) as u8
            }
        })
        .collect()
}

/// A transcription upload is routed by its form's `model` field and reaches
/// the replica byte for byte, content type and all, in the `voice` class
/// (an audio request that names no class); streamed (`stream=true` in the
/// form) it is measured as chat is: TTFT at the first text delta, one
/// gap per delta after it, `ok` at `[DONE]`; a whole answer is `ok` too.
#[tokio::test]
async fn a_transcription_upload_is_routed_by_its_model_field_and_passed_on_as_sent() {
    let mock = Mock::start(script(|req| {
        // A form is no JSON: the mock sees `null` for it.
        if req.is_null() {
            transcription_stream(&["The", " quick", " fox"])
        } else {
            json_answer("unused", "stop", 1, 1)
        }
    }))
    .await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    for (proto, client) in clients() {
        let (ct, body) = transcription_form(Some("m1"), true, &audio(300 * 1024));
        let resp = client.request(form_req(gw.data(), "/v1/audio/transcriptions", &ct, body.clone(), true)).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes()).into_owned();
        assert!(text.contains(r#""content":" fox""#) && text.ends_with("data: [DONE]\n\n"), "{proto}: {text}");
        let raw = mock.state.raw_bodies.lock().expect("lock").last().cloned().expect("the replica got it");
        assert!(raw.as_ref() == body.as_slice(), "{proto}: the form changed on the way ({} bytes, {} sent)", raw.len(), body.len());
        let headers = mock.state.headers.lock().expect("lock").last().cloned().expect("headers");
        assert_eq!(header(&headers, "content-type"), Some(ct.as_str()), "{proto}: the boundary must reach the replica");
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[("class", "voice")]), Some(2.0));
    assert_eq!(metric(&m, "slogate_inter_token_latency_seconds_count", &[("class", "voice")]), Some(4.0));
    assert_quiescent(&gw).await;
}

/// A form without `model` is a 400 naming it, a form malformed before its
/// `model` a 400, a form over `server.max_upload_body` a 413; none reaches
/// the replica.
#[tokio::test]
async fn a_bad_or_oversized_form_is_refused_before_the_replica() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = gateway_config(&[mock.url()]).server("max_upload_body: 64KiB").start().await;
    let path = "/v1/audio/transcriptions";
    for (proto, client) in clients() {
        let (ct, body) = transcription_form(None, false, &audio(1000));
        let resp = client.request(form_req(gw.data(), path, &ct, body, true)).await.expect("response");
        assert_eq!(resp.status(), 400, "{proto}: no model");
        let b = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(error_body(&b)["param"], "model", "{proto}");

        // Cut short before its `model` field ends (the rest of a form goes
        // on to the replica as it arrives: the engine judges that part).
        let (ct, mut body) = transcription_form(Some("m1"), false, &audio(1000));
        let model_at = body.windows(5).position(|w| w == b"\r\n\r\nm").expect("the model's value") + 5;
        body.truncate(model_at);
        let resp = client.request(form_req(gw.data(), path, &ct, body, true)).await.expect("response");
        assert_eq!(resp.status(), 400, "{proto}: a form cut short");
        let b = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(error_body(&b)["message"].as_str().is_some_and(|m| m.contains("multipart")), "{proto}");

        let (ct, body) = transcription_form(Some("m1"), false, &audio(100 * 1024));
        let resp = client.request(form_req(gw.data(), path, &ct, body, true)).await.expect("response");
        assert_eq!(resp.status(), 413, "{proto}: over max_upload_body");
    }
    assert_eq!(mock.calls(), 0, "nothing reached the replica");
    assert_quiescent(&gw).await;
}

/// The OpenAI Python SDK's `audio.transcriptions.create`, whole and
/// streamed (OpenAI's typed events), through the gateway.
#[tokio::test]
async fn the_openai_sdk_transcribes_through_the_gateway() {
    let mock = Mock::start(script(|_| Script::json(200, r#"{"text":"Hello world"}"#))).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let streamed = Script::sse(vec![
        Step::Send(Bytes::from_static(b"data: {\"type\":\"transcript.text.delta\",\"delta\":\"Hello\"}\n\n")),
        Step::Send(Bytes::from_static(b"data: {\"type\":\"transcript.text.delta\",\"delta\":\" world\"}\n\n")),
        Step::Send(Bytes::from_static(
            b"data: {\"type\":\"transcript.text.done\",\"text\":\"Hello world\",\"usage\":{\"type\":\"tokens\",\"input_tokens\":40,\"output_tokens\":2,\"total_tokens\":42}}\n\n",
        )),
    ]);
    let streamed2 = streamed.clone();
    mock.set_script(script(move |_| streamed2.clone()));
    let wav = std::env::temp_dir().join(format!("slogate-test-{}.wav", std::process::id()));
    std::fs::write(&wav, audio(50 * 1024)).expect("write the audio");
    let code = r#"
text = ""
for event in c.audio.transcriptions.create(model="m1", file=open(sys.argv[2], "rb"), stream=True):
    if event.type == "transcript.text.delta":
        text += event.delta
print("streamed:", text)
"#;
    let stdout = openai_sdk(&gw, code, &[&wav]).await;
    assert!(stdout.contains("streamed: Hello world"), "{stdout}");
    mock.set_script(script(|_| Script::json(200, r#"{"text":"Hello world"}"#)));
    let whole = r#"print("whole:", c.audio.transcriptions.create(model="m1", file=open(sys.argv[2], "rb")).text)"#;
    let stdout = openai_sdk(&gw, whole, &[&wav]).await;
    assert!(stdout.contains("whole: Hello world"), "{stdout}");
    let _ = std::fs::remove_file(&wav);
    gw.count_sent(2);
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(2.0), "{m}");
    assert_eq!(
        metric(&m, "slogate_prompt_tokens_total", &[("class", "voice")]),
        Some(40.0),
        "the stream's usage; an upload is no text, so the whole answer's prompt is not estimated from its bytes"
    );
    assert_quiescent(&gw).await;
}

/// Speech out: `/v1/audio/speech` answers with audio as it is made; its
/// first byte is its TTFT (a late first byte is a late TTFT), the bytes
/// arrive as sent, and the OpenAI SDK's `audio.speech.create` gets them.
#[tokio::test]
async fn speech_is_measured_at_its_first_audio_byte() {
    let chunk = |n: u8| Bytes::from(vec![n; 4096]);
    let speech = Script {
        status: 200,
        content_type: "audio/mpeg",
        header_delay: Duration::ZERO,
        steps: vec![Step::Wait(Duration::from_millis(250)), Step::Send(chunk(1)), Step::Send(chunk(2)), Step::Send(chunk(3))],
    };
    let mock = Mock::start(speech.always()).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let body = r#"{"model":"m1","voice":"alloy","input":"Hello there"}"#;
    for (proto, client) in clients() {
        let resp = client.request(post_req(&gw, "/v1/audio/speech", body, &[])).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        assert_eq!(header(resp.headers(), "content-type"), Some("audio/mpeg"), "{proto}");
        let got = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(got.len(), 3 * 4096, "{proto}");
        assert!(got[..4096].iter().all(|b| *b == 1) && got[8192..].iter().all(|b| *b == 3), "{proto}: the audio changed");
    }
    let code = r#"print("speech bytes:", len(c.audio.speech.create(model="m1", voice="alloy", input="Hello there").content))"#;
    let stdout = openai_sdk(&gw, code, &[]).await;
    assert!(stdout.contains("speech bytes: 12288"), "{stdout}");
    gw.count_sent(1);
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(3.0), "{m}");
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[("class", "voice")]), Some(3.0), "a TTFT for each");
    let ttft = metric(&m, "slogate_time_to_first_token_seconds_sum", &[("class", "voice")]).expect("TTFTs");
    assert!((0.75..15.0).contains(&ttft), "each first byte came after 250 ms: sum {ttft} s");
    let late = [("class", "voice"), ("signal", "first_byte"), ("within", "false")];
    assert_eq!(metric(&m, "slogate_latency_judged_requests_total", &late), Some(3.0), "judged by the first byte, over voice's 150 ms");
    assert_quiescent(&gw).await;
}

/// `GET /v1/models` with a configured model list: each named model as its
/// replicas describe it (`max_model_len`, `owned_by`) once one has answered.
#[tokio::test]
async fn models_named_in_the_config_carry_what_the_replicas_report() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let data = gw.data_addr;
    wait_until("the replica's description", || async move { get(data, "/v1/models").await.1.contains("max_model_len") }).await;
    let (status, body) = get(gw.data_addr, "/v1/models").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let m1 = v["data"].as_array().and_then(|d| d.iter().find(|m| m["id"] == "m1")).cloned().expect("m1 listed");
    assert_eq!((m1["owned_by"].as_str(), m1["max_model_len"].as_u64()), (Some("vllm"), Some(4096)), "{m1}");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1), "only the named model: {v}");
    assert_quiescent(&gw).await;
}

/// A request that names no class goes to its endpoint's class: by default
/// embeddings and rerank to `rag`, audio to `voice` (chat's SLIs hold chat);
/// `endpoint_classes` changes the map; `x-slo-class` still decides; a key
/// keeps to its classes (the endpoint's class only if the key may use it).
#[tokio::test]
async fn a_request_that_names_no_class_goes_to_its_endpoints_class() {
    let mock =
        Mock::start(script(|_| Script::json(200, r#"{"object":"list","data":[],"usage":{"prompt_tokens":3,"total_tokens":3}}"#))).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let emb = r#"{"model":"m1","input":"hello"}"#;
    post(&gw, "/v1/embeddings", emb, &[]).await;
    post(&gw, "/v1/rerank", r#"{"model":"m1","query":"q","documents":["a"]}"#, &[]).await;
    post(&gw, "/v1/embeddings", emb, &[("x-slo-class", "batch")]).await;
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("class", "rag")]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "slogate_requests_total", &[("class", "batch")]), Some(1.0), "the header decides");
    assert_eq!(metric(&m, "slogate_requests_total", &[("class", "chat")]), Some(0.0), "chat holds chat only (its series at zero)");
    assert_eq!(metric(&m, "slogate_requests_total", &[("endpoint", "embeddings")]), Some(2.0), "the endpoint label");
    assert_eq!(metric(&m, "slogate_requests_total", &[("endpoint", "rerank")]), Some(1.0));
    assert!(
        m.lines().filter(|l| l.starts_with("slogate_requests_total{")).all(|l| l.contains("endpoint=\"")),
        "every request series names its endpoint: {m}"
    );
    assert_quiescent(&gw).await;

    let yaml = format!(
        "{}endpoint_classes: {{ embeddings: batch }}\nauth:\n  keys:\n    - {{ name: k, key_sha256: {}, classes: [chat, batch] }}\n    - {{ name: c, key_sha256: {}, classes: [chat] }}\n",
        gateway_config(&[mock.url()]).yaml(),
        slogate::config::key_sha256("sk-k"),
        slogate::config::key_sha256("sk-c")
    );
    let gw = start_gateway(&yaml).await;
    post(&gw, "/v1/embeddings", emb, &[("authorization", "Bearer sk-k")]).await;
    post(&gw, "/v1/embeddings", emb, &[("authorization", "Bearer sk-c")]).await;
    post(&gw, "/v1/rerank", r#"{"model":"m1","query":"q","documents":["a"]}"#, &[("authorization", "Bearer sk-k")]).await;
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("class", "batch")]), Some(1.0), "the configured map: {m}");
    assert_eq!(metric(&m, "slogate_requests_total", &[("class", "chat")]), Some(2.0), "a key without batch, and rerank unmapped");
    assert_quiescent(&gw).await;

    let bad = format!("{}endpoint_classes: {{ embeddings: nope }}\n", gateway_config(&[mock.url()]).yaml());
    let err = slogate::config::Config::parse(&bad).expect_err("an unknown class").0;
    assert_eq!(err[0].field, "endpoint_classes.embeddings", "{err:?}");
}

/// A whole answer is judged by its time, in its own class's latency SLI:
/// embeddings in `rag` (400 ms target, no output tokens), one answered at
/// once and one after 600 ms, over HTTP/1.1 and HTTP/2. The verdicts are
/// counted by signal (what the generated latency rules read), and `/slo`'s
/// latency budget counts the same.
#[tokio::test]
async fn a_whole_answer_is_judged_by_its_time_in_its_own_classes_latency_sli() {
    let answer = r#"{"object":"list","data":[],"usage":{"prompt_tokens":3,"total_tokens":3}}"#;
    let mock = Mock::start(script(move |req| {
        let slow = req["input"] == "slow";
        Script { header_delay: Duration::from_millis(if slow { 600 } else { 0 }), ..Script::json(200, answer) }
    }))
    .await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    for (proto, client) in clients() {
        for input in ["fast", "slow"] {
            let body = format!(r#"{{"model":"m1","input":"{input}"}}"#);
            let resp = client.request(post_req(&gw, "/v1/embeddings", &body, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto}");
            resp.into_body().collect().await.expect("body");
        }
    }
    let m = metrics_text(&gw).await;
    let judged = |class: &str, signal: &str, within: &str| {
        metric(&m, "slogate_latency_judged_requests_total", &[("class", class), ("signal", signal), ("within", within)])
    };
    assert_eq!((judged("rag", "e2e", "true"), judged("rag", "e2e", "false")), (Some(2.0), Some(2.0)), "{m}");
    assert_eq!(judged("rag", "ttft", "true"), Some(0.0), "no stream: its other signals at zero");
    assert_eq!(judged("chat", "e2e", "false"), Some(0.0), "chat judges chat only");
    let admin = gw.admin_addr;
    let rag = || async move {
        let (_, slo) = get(admin, "/slo.json").await;
        let v: serde_json::Value = serde_json::from_str(&slo).expect("JSON");
        v["classes"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "rag")).cloned().expect("rag")
    };
    // The budget takes the last verdicts in at its next tick.
    wait_until("the budget counts all four", || async move { rag().await["latency"]["valid"].as_u64() == Some(4) }).await;
    let rag = rag().await;
    assert_eq!(rag["latency"]["good"].as_u64(), Some(2), "{rag}");
    let e2e = rag["signals"].as_array().and_then(|s| s.iter().find(|s| s["signal"] == "e2e")).cloned().expect("e2e");
    assert_eq!((e2e["judged"].as_u64(), e2e["within"].as_u64()), (Some(4), Some(2)), "{rag}");
    assert_quiescent(&gw).await;
}

/// Short work does not wait behind streams: with the pool's one slot held
/// by a stream, an embeddings, rerank or tokenize request takes a seat above
/// the slots and is answered while the stream goes on; a chat request waits
/// in the queue for the slot as before.
#[tokio::test]
async fn short_requests_do_not_wait_behind_a_stream_for_a_slot() {
    let mock = Mock::start(script(|req| {
        if req.get("messages").is_some() {
            vllm_stream(req, 1, Duration::ZERO, "stop")
        } else {
            Script::json(200, r#"{"object":"list","data":[],"usage":{"prompt_tokens":2,"total_tokens":2}}"#)
        }
    }))
    .await;
    let gw = gateway_config(&[mock.url()]).pool("max_inflight_per_replica: 1").start().await;
    let held = mock.hold_slot(&gw).await;
    for (path, body) in [
        ("/v1/embeddings", r#"{"model":"m1","input":"hello"}"#),
        ("/v1/rerank", r#"{"model":"m1","query":"q","documents":["a","b"]}"#),
        ("/tokenize", r#"{"model":"m1","prompt":"hello"}"#),
    ] {
        if path == "/tokenize" {
            gw.count_sent(1);
        }
        let answered = tokio::time::timeout(Duration::from_secs(10), post(&gw, path, body, &[])).await;
        let (status, _, _) = answered.unwrap_or_else(|_| panic!("{path} waited behind the stream"));
        assert_eq!(status, 200, "{path}");
    }
    // A chat request waits for the slot.
    let addr = gw.data();
    let chat = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await.0 });
    wait_until("chat queued", || async {
        metric(&metrics_text(&gw).await, "slogate_queue_depth", &[("tier", "interactive")]) == Some(1.0)
    })
    .await;
    assert!(!chat.is_finished(), "chat does not jump the queue");
    held.release().await;
    assert_eq!(chat.await.expect("task"), 200);
    assert_quiescent(&gw).await;
}

/// Every configured class's series exist from the start, at zero, with
/// their buckets: a class without traffic still has a ratio for its SLI
/// rules to compute.
#[tokio::test]
async fn a_class_without_traffic_exposes_its_series_at_zero() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let m = metrics_text(&gw).await;
    for class in ["chat", "voice", "code-inline", "code-panel", "rag", "batch"] {
        assert_eq!(metric(&m, "slogate_requests_total", &[("class", class), ("outcome", "ok")]), Some(0.0), "{class}: {m}");
        assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_count", &[("class", class)]), Some(0.0), "{class}");
        for signal in ["ttft", "first_byte", "e2e"] {
            let labels = [("class", class), ("signal", signal), ("within", "true")];
            assert_eq!(metric(&m, "slogate_latency_judged_requests_total", &labels), Some(0.0), "{class} {signal}");
        }
    }
    // voice's TTFT target (150 ms) is a bucket of its histogram from the start.
    assert_eq!(metric(&m, "slogate_time_to_first_token_seconds_bucket", &[("class", "voice"), ("le", "0.15")]), Some(0.0));
    assert_quiescent(&gw).await;
}

/// A whole transcription (vLLM's `{"text": ...}`, no usage) counts its
/// text's tokens, estimated as a completion's are (four characters a
/// token), flagged as an estimate; a whole answer in another format
/// (`response_format: text`) passes as it is.
#[tokio::test]
async fn a_whole_transcription_counts_its_texts_tokens() {
    let mock = Mock::start(Script::json(200, r#"{"text":"The quick brown fox jumps over"}"#).always()).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    for (proto, client) in clients() {
        let (ct, body) = transcription_form(Some("m1"), false, &audio(1000));
        let resp = client.request(form_req(gw.data(), "/v1/audio/transcriptions", &ct, body, true)).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(2.0), "{m}");
    // 30 characters: 8 tokens each.
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[("class", "voice")]), Some(16.0), "{m}");
    assert_eq!(metric(&m, "slogate_usage_estimated_requests_total", &[("class", "voice")]), Some(2.0), "{m}");
    assert_quiescent(&gw).await;
}

/// Before any traffic, every class's TTFT, ITL and queue-time series exist
/// at zero, labelled with the pool's models (not `unknown`), so their SLI
/// rules and dashboards read zero requests rather than nothing.
#[tokio::test]
async fn every_classs_latency_series_exist_at_zero_before_traffic() {
    let mock = Mock::start(standard(1, Duration::ZERO)).await;
    let gw = start_gateway(&gateway_config(&[mock.url()]).yaml()).await;
    let m = metrics_text(&gw).await;
    for class in ["chat", "batch", "rag", "voice"] {
        for name in ["slogate_time_to_first_token_seconds_count", "slogate_inter_token_latency_seconds_count"] {
            assert_eq!(metric(&m, name, &[("class", class), ("model", "m1")]), Some(0.0), "{name} {class}: {m}");
        }
        assert_eq!(metric(&m, "slogate_queue_time_seconds_count", &[("class", class)]), Some(0.0), "{class}: {m}");
    }
    assert!(!m.contains("model=\"unknown\""), "{m}");
    assert_quiescent(&gw).await;
}
