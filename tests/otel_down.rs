//! Exporting never blocks the request path. The collector here accepts
//! connections and never answers, so an export hangs until the exporter's
//! own timeout (5 s). First the test waits until an export is stuck there;
//! then a second wave of requests must complete while that same export is
//! still hanging: had the request path waited on exporting, it could not.

// A binary of its own (it installs the process-wide tracing subscriber,
// which a process can do once), with the same harness as tests/it.
#[allow(dead_code, unused_imports)]
#[path = "it/common/mod.rs"]
mod common;

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;

/// A collector that accepts and never answers; it keeps every connection.
fn black_hole() -> (std::net::SocketAddr, Arc<Mutex<Vec<TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let conns = Arc::new(Mutex::new(Vec::new()));
    let c = conns.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().map_while(Result::ok) {
            c.lock().expect("lock").push(s);
        }
    });
    (addr, conns)
}

/// Connections the exporter opened and has not closed (an export in progress).
fn hanging(conns: &Mutex<Vec<TcpStream>>) -> usize {
    let conns = conns.lock().expect("lock");
    let mut buf = [0u8; 1];
    conns
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).ok();
            // Data waiting (the export request) or nothing yet: still open; 0: closed.
            match s.peek(&mut buf) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        })
        .count()
}

async fn wave(addr: Target, clients: usize, each: usize) {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                for _ in 0..each {
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
}

#[test]
fn requests_are_served_while_an_export_hangs() {
    let (collector, conns) = black_hole();
    let endpoint = format!("http://{collector}");
    let guard = slogate::telemetry::otel::init(&endpoint, false).expect("otel init");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mock = Mock::start(standard(3, Duration::ZERO)).await;
        let gw = gateway_config(&[mock.url()]).section(&format!("telemetry: {{ otlp_endpoint: \"{endpoint}\" }}")).start().await;
        // More spans than one export batch (512): an export starts, and hangs.
        wave(gw.data(), 8, 80).await;
        wait_until("an export hangs on the collector", || async { hanging(&conns) > 0 }).await;
        // While it hangs, a second wave is served in full.
        wave(gw.data(), 8, 40).await;
        assert!(hanging(&conns) > 0, "the export ended before the second wave did: the test proved nothing, run it again");
        assert_eq!(requests_with_outcome(&gw, "ok").await, 960.0);
        assert_quiescent(&gw).await;
    });
    drop(rt);
    // Flushing against a dead collector returns (with an error inside the SDK).
    guard.flush();
}
