//! The gateway at the edge: clients and replicas that behave as real ones
//! do, including the ones that misbehave. Driven over HTTP/1.1 and HTTP/2.

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;

/// vLLM answers a non-streaming request with one body and `Content-Length`.
/// Such an answer ends with its last frame (a server may never poll the
/// body again): it must be counted `ok`, with its latency and tokens, not
/// `cancelled`.
#[tokio::test]
async fn non_streaming_answers_with_content_length_are_counted_ok_over_both_protocols() {
    let mock = Mock::start(script(|req| {
        if req.get("input").is_some() {
            Script::json(200, r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m1","usage":{"prompt_tokens":3,"total_tokens":3}}"#)
        } else {
            json_answer("hello", "stop", 5, 2)
        }
    }))
    .await;
    let gw = gateway_config(&[mock.url()]).start().await;
    let requests = [
        ("/v1/chat/completions", chat_body(false, false)),
        ("/v1/completions", r#"{"model":"m1","prompt":"hi","max_tokens":2}"#.to_string()),
        ("/v1/embeddings", r#"{"model":"m1","input":"abc"}"#.to_string()),
    ];
    for (proto, c) in clients() {
        for (path, body) in &requests {
            let resp = c.request(post_req(gw.data_addr, path, body, &[])).await.expect("response");
            assert_eq!(resp.status(), 200, "{proto} {path}");
            assert!(resp.headers().contains_key("content-length"), "{proto} {path}: the length is passed on");
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(bytes.starts_with(b"{"), "{proto} {path}");
        }
    }
    let m = metrics_text(&gw).await;
    assert_eq!(requests_with_outcome(&gw, "ok").await, 6.0, "{m}");
    assert_eq!(requests_with_outcome(&gw, "cancelled").await, 0.0, "{m}");
    let e2e: f64 = m
        .lines()
        .filter(|l| l.starts_with("slogate_e2e_request_latency_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(e2e, 6.0, "every answer has its end-to-end latency");
    assert_eq!(metric(&m, "slogate_generation_tokens_total", &[]), Some(8.0), "chat and completion tokens, both protocols");
    assert_quiescent(&gw).await;
}
