//! Exporting never blocks the request path: with the OTLP collector down
//! (nothing listens on the endpoint), requests are served as usual while
//! the SDK's batch processor fails to export on its own thread.
//!
//! Its own test binary: it installs the process-wide tracing subscriber.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn requests_are_served_while_the_collector_is_unreachable() {
    // A port nothing listens on: bind, read the address, close.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let endpoint = format!("http://{dead}");
    let guard = slogate::telemetry::otel::init(&endpoint, false).expect("otel init");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mock = Mock::start(standard(3, Duration::ZERO)).await;
        let yaml = format!("{}telemetry: {{ otlp_endpoint: \"{endpoint}\" }}\n", config_yaml(&[mock.url()], ""));
        let gw = start_gateway(&yaml).await;
        // Many more spans than one export batch, all while every export fails.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let addr = gw.data_addr;
                tokio::spawn(async move {
                    for _ in 0..40 {
                        let (s, _, body) = post(addr, "/v1/chat/completions", &chat_body(true, false), &[]).await;
                        assert_eq!(s, 200);
                        assert!(String::from_utf8_lossy(&body).trim_end().ends_with("data: [DONE]"));
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("client");
        }
        assert_eq!(requests_with_outcome(&gw, "ok").await, 320.0);
    });
    drop(rt);
    // Flushing against a dead collector returns (with an error inside the SDK).
    guard.flush();
}
