//! Audio uploads that go on as they arrive: a multipart form that declares
//! its length reaches the replica while its client is still sending it,
//! byte for byte, over HTTP/1.1 and HTTP/2; one of undeclared length is
//! read whole first; a client that breaks off mid-upload is the client's
//! failure, and the replica does not keep a half request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::common::*;

type Body = BoxBody<Bytes, std::convert::Infallible>;
type UploadClient = Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

fn upload_clients() -> [(&'static str, UploadClient); 2] {
    [
        ("HTTP/1.1", Client::builder(TokioExecutor::new()).build_http()),
        ("HTTP/2", Client::builder(TokioExecutor::new()).http2_only(true).build_http()),
    ]
}

/// A body its test sends piece by piece, and the sender of the pieces.
fn piecewise() -> (Body, mpsc::UnboundedSender<Bytes>) {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), rx))
    });
    (StreamBody::new(frames).boxed(), tx)
}

/// A transcription request whose form is sent in pieces of `piece` bytes
/// with no declared length (chunked over HTTP/1.1), counted as sent.
fn chunked_form(to: Target, content_type: &str, form: &[u8], piece: usize) -> http::Request<Body> {
    let (body, pieces) = piecewise();
    let addr = to.addr;
    to.count_sent(1);
    for p in form.chunks(piece) {
        pieces.send(Bytes::copy_from_slice(p)).expect("send");
    }
    http::Request::post(format!("http://{addr}/v1/audio/transcriptions")).header("content-type", content_type).body(body).expect("request")
}

/// A replica that reports how many body bytes of the request it is reading
/// it has so far (`progress`), keeps each whole body (`bodies`), and
/// answers a transcription; a GET (the health check) gets an empty 200.
pub(crate) struct UploadReplica {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl UploadReplica {
    pub(crate) async fn start(progress: mpsc::UnboundedSender<usize>) -> UploadReplica {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, progress.clone(), kept.clone()));
            }
        });
        UploadReplica { addr, bodies, task }
    }
}

impl Drop for UploadReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A chunked body, decoded, and the bytes it took, once all of it is in `buf`.
fn unchunked(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&buf[at..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        let data = line_end + 2;
        if size == 0 {
            // No trailers: the last chunk's line is followed by an empty one.
            return (buf.len() >= data + 2).then_some((body, data + 2));
        }
        body.extend_from_slice(buf.get(data..data + size)?);
        buf.get(data + size..data + size + 2)?;
        at = data + size + 2;
    }
}

async fn serve(mut s: tokio::net::TcpStream, progress: mpsc::UnboundedSender<usize>, bodies: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
        if let Some(end) = head_end {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            let have = buf.len() - end - 4;
            if head.starts_with("post") {
                let _ = progress.send(have.min(len));
            }
            // A body of undeclared length comes chunked (as Envoy sends a body streamed back to it).
            let whole = if head.lines().any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked")) {
                unchunked(&buf[end + 4..])
            } else {
                (have >= len).then(|| (buf[end + 4..end + 4 + len].to_vec(), len))
            };
            if let Some((body, used)) = whole {
                buf.drain(..end + 4 + used);
                let answer: &[u8] = if head.starts_with("post") {
                    bodies.lock().expect("lock").push(body);
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"text\":\"done\"}"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                };
                if s.write_all(answer).await.is_err() {
                    return;
                }
                continue;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Wait until the replica has `at_least` bytes of a request's body.
async fn replica_has(progress: &mut mpsc::UnboundedReceiver<usize>, at_least: usize, what: &str) {
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(n) = progress.recv().await {
            if n >= at_least {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got, Ok(true), "{what}");
}

/// The first half of a form (its `model` field, the file's head and half
/// the file) reaches the replica before the client sends the second half,
/// and the replica gets the whole form as sent.
#[tokio::test]
async fn an_upload_that_declares_its_length_reaches_the_replica_as_it_arrives() {
    let (progress_tx, mut progress) = mpsc::unbounded_channel();
    let replica = UploadReplica::start(progress_tx).await;
    let gw = start_gateway(&gateway_config(&[format!("http://{}", replica.addr)]).yaml()).await;
    let audio: Vec<u8> = (0..400 * 1024).map(|i| (i * 31 % 251) as u8).collect();
    let (ct, form) = transcription_form(Some("m1"), false, &audio);
    let half = form.len() / 2;
    for (proto, client) in upload_clients() {
        while progress.try_recv().is_ok() {}
        let (body, pieces) = piecewise();
        let req = http::Request::post(format!("http://{}/v1/audio/transcriptions", gw.data_addr))
            .header("content-type", &ct)
            .header("content-length", form.len())
            .body(body)
            .expect("request");
        gw.count_sent(1);
        let answer = tokio::spawn(async move { client.request(req).await });
        pieces.send(Bytes::copy_from_slice(&form[..half])).expect("send");
        replica_has(&mut progress, half, &format!("{proto}: the replica got the first half before the client sent the rest")).await;
        pieces.send(Bytes::copy_from_slice(&form[half..])).expect("send");
        drop(pieces);
        let resp = answer.await.expect("joined").expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&text[..], br#"{"text":"done"}"#, "{proto}");
        let got = replica.bodies.lock().expect("lock").last().cloned().expect("a body");
        assert!(got == form, "{proto}: the form changed on the way ({} bytes, {} sent)", got.len(), form.len());
    }
    let m = metrics_text(&gw).await;
    assert_eq!(metric(&m, "slogate_requests_total", &[("outcome", "ok")]), Some(2.0), "{m}");
    assert_quiescent(&gw).await;
}

/// A form of undeclared length (chunked, HTTP/1.1) is read whole, then sent
/// with its length; a client that declares a length and breaks off before
/// sending it all is the client's failure (400), never the replica's.
#[tokio::test]
async fn a_chunked_form_is_read_whole_and_a_broken_off_upload_is_the_clients_failure() {
    let (progress_tx, mut progress) = mpsc::unbounded_channel();
    let replica = UploadReplica::start(progress_tx).await;
    let gw = start_gateway(&gateway_config(&[format!("http://{}", replica.addr)]).yaml()).await;
    let (ct, form) = transcription_form(Some("m1"), false, &[7u8; 100 * 1024]);
    let (_, client) = upload_clients().into_iter().next().expect("HTTP/1.1");
    let req = chunked_form(gw.data(), &ct, &form, 30_000);
    let resp = client.request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert!(replica.bodies.lock().expect("lock").last().is_some_and(|b| *b == form), "the form as sent");

    // Declares the whole form, sends half, then goes away.
    let raw = format!("POST /v1/audio/transcriptions HTTP/1.1\r\nhost: x\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n\r\n", form.len());
    let mut s = tokio::net::TcpStream::connect(gw.data_addr).await.expect("connect");
    gw.count_sent(1);
    s.write_all(raw.as_bytes()).await.expect("head");
    s.write_all(&form[..form.len() / 2]).await.expect("half");
    replica_has(&mut progress, 1, "the upload went on as it arrived").await;
    drop(s);
    wait_until("the broken-off upload is counted", || async { requests_with_outcome(&gw, "client_error").await == 1.0 }).await;
    assert_eq!(requests_with_outcome(&gw, "upstream_error").await, 0.0);
    assert_eq!(replica.bodies.lock().expect("lock").len(), 1, "the replica kept no half request");
    assert_quiescent(&gw).await;
}

/// A form of undeclared length is read whole, and held to
/// `server.max_upload_body` as it arrives: 413, nothing reaches the replica.
#[tokio::test]
async fn a_form_of_undeclared_length_over_the_limit_is_refused() {
    let (progress_tx, _progress) = mpsc::unbounded_channel();
    let replica = UploadReplica::start(progress_tx).await;
    let gw = gateway_config(&[format!("http://{}", replica.addr)]).server("max_upload_body: 64KiB").start().await;
    for (proto, client) in upload_clients() {
        let (ct, form) = transcription_form(Some("m1"), false, &[7u8; 70 * 1024]);
        let req = chunked_form(gw.data(), &ct, &form, 16 * 1024);
        let resp = client.request(req).await.expect("response");
        assert_eq!(resp.status(), 413, "{proto}: over max_upload_body");
    }
    assert!(replica.bodies.lock().expect("lock").is_empty(), "nothing reached the replica");
    assert_quiescent(&gw).await;
}

/// A transcription form whose `model` (`model`) comes after a 300 KB file.
pub(crate) fn form_with_model_last(boundary: &str, model: &str) -> Vec<u8> {
    let mut form =
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n")
            .into_bytes();
    form.extend((0..300 * 1024).map(|i| (i * 7 % 251) as u8));
    form.extend_from_slice(
        format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n--{boundary}--\r\n").as_bytes(),
    );
    form
}

/// A form whose `model` comes after a 300 KB file (past what is looked at
/// as it arrives) is read whole and routed by it, bytes intact.
#[tokio::test]
async fn a_form_with_its_model_after_a_long_file_is_read_whole_and_routed() {
    let (progress_tx, _progress) = mpsc::unbounded_channel();
    let replica = UploadReplica::start(progress_tx).await;
    let gw = start_gateway(&gateway_config(&[format!("http://{}", replica.addr)]).yaml()).await;
    let boundary = "model-last-boundary";
    let form = form_with_model_last(boundary, "m1");
    for (proto, client) in upload_clients() {
        let req = http::Request::post(format!("http://{}/v1/audio/transcriptions", gw.data_addr))
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .header("content-length", form.len())
            .body(http_body_util::Full::new(Bytes::from(form.clone())).map_err(|never| match never {}).boxed())
            .expect("request");
        gw.count_sent(1);
        let resp = client.request(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{proto}");
        let got = replica.bodies.lock().expect("lock").last().cloned().expect("a body");
        assert!(got == form, "{proto}: the form changed on the way");
    }
    assert_quiescent(&gw).await;
}

/// A replica that answers an upload before reading it (a 404, as uvicorn
/// answers a path it does not serve) and closes with the upload unread:
/// the client gets that answer, counted by its status, every time, over
/// HTTP/1.1 and HTTP/2; never a 502 of the gateway's.
#[tokio::test]
async fn an_upload_the_replica_answers_early_gets_the_replicas_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let replica = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                // Request after request on the connection, as a server
                // does: the gateway may send an upload on a connection its
                // health checks used.
                loop {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if buf.starts_with(b"GET") {
                        // Health checks and model discovery: the connection stays for the next.
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let answer = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 22\r\nconnection: close\r\n\r\n{\"detail\":\"Not Found\"}";
                    let _ = s.write_all(answer).await;
                    // Closed with the upload unread (a reset, as the kernel sends one).
                    return;
                }
            });
        }
    });
    let gw = start_gateway(&gateway_config(&[format!("http://{addr}")]).yaml()).await;
    let (ct, form) = transcription_form(Some("m1"), false, &vec![7u8; 2 << 20]);
    for (proto, client) in upload_clients() {
        let mut got = Vec::new();
        for _ in 0..10 {
            let req = http::Request::post(format!("http://{}/v1/audio/transcriptions", gw.data_addr))
                .header("content-type", &ct)
                .header("content-length", form.len())
                .body(http_body_util::Full::new(Bytes::from(form.clone())).boxed())
                .expect("request");
            gw.count_sent(1);
            // Bounded: an answer that never comes fails here rather than hangs the suite.
            let answered = tokio::time::timeout(Duration::from_secs(30), async {
                let resp = client.request(req).await.expect("response");
                let status = resp.status().as_u16();
                (status, resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default())
            });
            let (status, text) = answered.await.unwrap_or_else(|_| panic!("{proto}: request {} got no answer in 30 s", got.len()));
            got.push((status, String::from_utf8_lossy(&text).into_owned()));
        }
        assert!(got.iter().all(|(s, t)| *s == 404 && t == r#"{"detail":"Not Found"}"#), "{proto}: {got:?}");
    }
    assert_eq!(requests_with_outcome(&gw, "client_error").await, 20.0);
    assert_eq!(requests_with_outcome(&gw, "upstream_error").await, 0.0);
    assert_quiescent(&gw).await;
    replica.abort();
}
