//! OpenTelemetry: with `telemetry.otlp_endpoint` set, one span per request
//! reaches an OTLP/HTTP receiver (in-process, decoding the real protobuf)
//! with the GenAI attributes and slogate's own, parented on the caller's
//! `traceparent`, and the replica receives the span's `traceparent`.

// A binary of its own (it installs the process-wide tracing subscriber,
// which a process can do once), with the same harness as tests/it.
#[allow(dead_code, unused_imports)]
#[path = "it/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// An OTLP/HTTP receiver on 127.0.0.1:0 in its own thread: stores every
/// POST /v1/traces body.
fn receiver() -> (std::net::SocketAddr, Arc<Mutex<Vec<Bytes>>>) {
    let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let store = bodies.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send addr");
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let store = store.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let store = store.clone();
                        async move {
                            let ok = req.uri().path() == "/v1/traces";
                            let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            if ok {
                                store.lock().expect("lock").push(body);
                            }
                            let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                            *resp.status_mut() = if ok { hyper::StatusCode::OK } else { hyper::StatusCode::NOT_FOUND };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(sock), svc).await;
                });
            }
        });
    });
    (rx.recv().expect("receiver address"), bodies)
}

fn attrs(span: &opentelemetry_proto::tonic::trace::v1::Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "b7ad6b7169203331";

#[test]
fn request_spans_reach_an_otlp_receiver_with_genai_attributes_and_traceparent() {
    let (addr, bodies) = receiver();
    let endpoint = format!("http://{addr}");
    // Installed outside any runtime, as `slogate serve` does.
    let guard = slogate::telemetry::otel::init(&endpoint, false).expect("otel init");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mock_headers = rt.block_on(async {
        let mock = Mock::start(standard(3, Duration::from_millis(2))).await;
        let gw = gateway_config(&[mock.url()])
            .pool("max_inflight_per_replica: 1")
            .section(&format!("telemetry: {{ otlp_endpoint: \"{endpoint}\" }}"))
            .start()
            .await;
        // The traced request waits in the queue behind a held slot, so its
        // span's queue time is not zero.
        let held = mock.hold_slot(&gw).await;
        let traceparent = format!("00-{TRACE_ID}-{PARENT}-01");
        let addr = gw.data();
        let traced = tokio::spawn(async move {
            post(
                addr,
                "/v1/chat/completions",
                &chat_body(true, false),
                &[("traceparent", traceparent.as_str()), ("x-request-id", "trace-req-1")],
            )
            .await
        });
        wait_until("the traced request is queued", || async {
            metric(&metrics_text(&gw).await, "slogate_queue_depth", &[("tier", "interactive")]) == Some(1.0)
        })
        .await;
        held.release().await;
        let (s, h, body) = traced.await.expect("task");
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
        let queue_ms: u64 = h.get("x-slogate-queue-ms").and_then(|v| v.to_str().ok()?.parse().ok()).expect("queue ms header");
        assert_eq!(header(&h, "x-request-id"), Some("trace-req-1"), "the caller's request id comes back");
        let (s, _, _) = post(&gw, "/v1/chat/completions", &chat_body(false, false), &[("x-slo-class", "batch")]).await;
        assert_eq!(s, 200);
        // The spans end with the streams (the trackers drop after the bodies).
        wait_until("all three requests counted", || async { requests_with_outcome(&gw, "ok").await == 3.0 }).await;
        assert_quiescent(&gw).await;
        // The holder's request went first; the traced one second.
        let h = mock.state.headers.lock().expect("lock")[1].clone();
        (h, mock.url(), queue_ms)
    });
    guard.flush();
    let (headers, replica, queue_ms) = mock_headers;

    let mut spans = Vec::new();
    for b in bodies.lock().expect("lock").iter() {
        let req = ExportTraceServiceRequest::decode(b.as_ref()).expect("OTLP protobuf");
        for rs in req.resource_spans {
            let service = rs.resource.as_ref().map(|r| r.attributes.iter().any(|kv| kv.key == "service.name")).unwrap_or(false);
            assert!(service, "resource has service.name");
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
    }
    assert_eq!(spans.len(), 3, "one span per request: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());

    let stream = spans.iter().find(|s| hex(&s.trace_id) == TRACE_ID).expect("the traced request's span");
    let a = attrs(stream);
    assert_eq!(stream.name, "chat");
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.request.model"], "m1");
    assert_eq!(a["gen_ai.usage.input_tokens"], "7");
    assert_eq!(a["gen_ai.usage.output_tokens"], "3");
    assert_eq!(a["gen_ai.response.finish_reasons"], "stop");
    assert_eq!(a["slogate.tier"], "interactive");
    assert_eq!(a["slogate.outcome"], "ok");
    assert_eq!(a["slogate.replica"], replica);
    assert_eq!(a["http.response.status_code"], "200");
    // The request id: the caller's, on the span and sent to the replica.
    assert_eq!(a["slogate.request_id"], "trace-req-1");
    assert_eq!(headers.get("x-request-id").and_then(|v| v.to_str().ok()), Some("trace-req-1"));
    assert!(a["slogate.ttft_ms"].parse::<f64>().is_ok_and(|t| t > 0.0), "{a:?}");
    // The span's queue time is the one the response header reported (whole ms there).
    let q: f64 = a["slogate.queue_ms"].parse().expect("queue_ms");
    assert!(q > 0.0 && q.floor() as u64 == queue_ms, "span queue_ms {q}, header {queue_ms}: it waited in the queue");
    // Parented on the caller's traceparent.
    assert_eq!(hex(&stream.trace_id), TRACE_ID);
    assert_eq!(hex(&stream.parent_span_id), PARENT);
    // The replica got this span as its parent, in place of the caller's.
    assert_eq!(headers.get_all("traceparent").iter().count(), 1, "one traceparent upstream: {headers:?}");
    let sent = headers.get("traceparent").and_then(|v| v.to_str().ok()).expect("traceparent sent upstream");
    assert_eq!(sent, format!("00-{TRACE_ID}-{}-01", hex(&stream.span_id)));

    let batch = spans.iter().find(|s| attrs(s).get("slogate.class").map(String::as_str) == Some("batch")).expect("batch span");
    let b = attrs(batch);
    assert_eq!(b["slogate.tier"], "batch");
    assert_eq!(b["gen_ai.usage.output_tokens"], "3");
    assert_ne!(hex(&batch.trace_id), TRACE_ID, "no traceparent: a new trace");
    assert!(batch.parent_span_id.is_empty());
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
