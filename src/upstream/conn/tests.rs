//! The connections' tests: idle lists, sizes, and one poll per event.

use super::*;

/// A listener standing in for a replica, and its base URL.
async fn replica() -> (tokio::net::TcpListener, http::Uri) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr")).parse().expect("uri");
    (listener, base)
}

/// A connection to it that reads as `reads` says, and the replica's end.
async fn connected(listener: &tokio::net::TcpListener, base: &http::Uri, reads: Reads) -> (Box<Link>, TcpStream) {
    let link = connect(base, None, Duration::from_secs(5), reads).await.expect("connect");
    let (server, _) = listener.accept().await.expect("accept");
    (link, server)
}

/// Idle connections the replica closed are closed here at the next
/// sweep; live ones stay; past the idle timeout they go too.
#[tokio::test(start_paused = true)]
async fn a_sweep_closes_what_the_replica_closed_and_what_idled_too_long() {
    let (listener, base) = replica().await;
    let idle = IdleConns::default();
    let (a, server_a) = connected(&listener, &base, Reads::Events).await;
    let (b, _server_b) = connected(&listener, &base, Reads::Whole).await;
    idle.put(Reads::Events, a);
    idle.put(Reads::Whole, b);
    idle.sweep();
    assert_eq!(idle.len(), 2, "both are alive");
    drop(server_a);
    // The end of file reaches the client socket.
    tokio::time::sleep(Duration::from_millis(50)).await;
    idle.sweep();
    assert_eq!(idle.len(), 1, "the one the replica closed is gone");
    tokio::time::advance(IDLE_TIMEOUT + Duration::from_secs(1)).await;
    idle.sweep();
    assert_eq!(idle.len(), 0, "the one idle past the timeout is gone");
}

/// A waker that counts its wakes and signals each.
struct Wakes(std::sync::atomic::AtomicUsize, tokio::sync::Notify);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.1.notify_one();
    }
}

impl Wakes {
    fn new() -> Arc<Wakes> {
        Arc::new(Wakes(Default::default(), tokio::sync::Notify::new()))
    }

    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A connected link, its replica's end, and a task's waker that counts its wakes.
async fn link_and_task() -> (Box<Link>, TcpStream, Arc<Wakes>, Waker) {
    let (listener, base) = replica().await;
    let (link, server) = connected(&listener, &base, Reads::Events).await;
    let count = Wakes::new();
    let waker = Waker::from(count.clone());
    (link, server, count, waker)
}

/// The head of a streamed answer, as vLLM sends it.
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// One event as an HTTP chunk.
fn chunk(event: &str) -> String {
    format!("{:x}\r\n{event}\r\n", event.len())
}

/// The replica's side: read a request's head (false: the connection ended first).
async fn read_request_head(server: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut buf = [0u8; 1024];
        let Ok(n @ 1..) = server.read(&mut buf).await else { return false };
        got.extend_from_slice(&buf[..n]);
    }
    true
}

/// The connection and the body it feeds are polled by one task in one
/// poll: an event is handed over in the poll its socket's readiness
/// woke, and handing it over wakes the task no second time.
#[tokio::test]
async fn an_event_reaches_the_body_in_the_poll_that_read_it_with_no_wake_of_its_own() {
    use tokio::io::AsyncWriteExt;
    let (listener, base) = replica().await;
    let (link, mut server) = connected(&listener, &base, Reads::Events).await;
    let req = Request::post("/v1/completions").body(SendBody::from(Bytes::from_static(b"{}"))).expect("request");
    let replica_side = async {
        assert!(read_request_head(&mut server).await, "the request came");
        server.write_all(SSE_HEAD).await.expect("head");
    };
    let (answer, ()) = tokio::join!(exchange(link, req), replica_side);
    let Ok((resp, link)) = answer else { panic!("no answer head") };
    let mut body = UpstreamBody { source: Source::Replica(resp.into_body()), link, home: None };

    let count = Wakes::new();
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending(), "nothing sent yet");
    let event = "data: {\"choices\":[{\"text\":\"hi\"}]}\n\n";
    server.write_all(chunk(event).as_bytes()).await.expect("event");
    count.1.notified().await;
    let woken = count.count();
    assert_eq!(woken, 1, "the socket's readiness woke the task once");
    match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => assert_eq!(frame.into_data().ok().as_deref(), Some(event.as_bytes())),
        _ => panic!("the event was read and handed over in one poll"),
    }
    assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending(), "nothing more yet");
    assert_eq!(count.count(), woken, "handing the event over woke the task again");
}

/// Something polled under the link that asks for a yield at every look
/// (as hyper's connection does after a run of work: it wakes its task at
/// once) gets it: the poll ends, and the task is woken to poll again later.
#[tokio::test]
async fn a_poll_woken_at_every_look_ends_and_wakes_its_task() {
    let (mut link, _server, count, waker) = link_and_task().await;
    let mut cx = Context::from_waker(&waker);
    let mut looks = 0;
    let (open, got) = link.drive_then(&mut cx, |cx| {
        looks += 1;
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    });
    assert!(open && got.is_pending());
    assert_eq!(looks, 3, "it looked again twice");
    assert_eq!(count.count(), 1, "then the task was woken");
}

/// A link whose poll returned `Pending` is not looked at again until
/// something it waits on wakes it: hyper's server polls a body again after
/// every frame it writes, and those polls would find nothing.
#[tokio::test]
async fn a_quiet_link_is_looked_at_again_only_after_a_wake() {
    let (mut link, _server, count, waker) = link_and_task().await;
    let mut cx = Context::from_waker(&waker);
    let mut looks = 0;
    let mut source: Option<Waker> = None;
    let mut poll = |link: &mut Link, cx: &mut Context<'_>| {
        link.drive_then(cx, |cx| {
            looks += 1;
            source = Some(cx.waker().clone());
            Poll::<()>::Pending
        })
    };
    assert!(poll(&mut link, &mut cx).1.is_pending());
    assert!(poll(&mut link, &mut cx).1.is_pending());
    assert!(poll(&mut link, &mut cx).1.is_pending());
    let (looked, source) = (looks, source.take().expect("the source registered a waker"));
    assert_eq!(looked, 1, "polled twice more with no wake: not looked at");
    source.wake();
    assert_eq!(count.count(), 1, "the source's wake reached the task");
    let mut looks = 0;
    let (open, got) = link.drive_then(&mut cx, |_| {
        looks += 1;
        Poll::Ready(())
    });
    assert!(open && got.is_ready() && looks == 1, "woken: looked at again");
}

/// A replica that sends a long run of events at once (more reads than
/// tokio lets one poll make, runs of work after which hyper yields):
/// every event arrives.
#[tokio::test]
async fn a_long_burst_of_events_arrives_whole() {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const EVENTS: usize = 20_000;
    const EVENT: &str = "data: {\"choices\":[{\"text\":\"x\"}]}\n\n";
    let (listener, base) = replica().await;
    let (link, mut server) = connected(&listener, &base, Reads::Events).await;
    tokio::spawn(async move {
        if !read_request_head(&mut server).await {
            return;
        }
        let mut out = SSE_HEAD.to_vec();
        for _ in 0..EVENTS {
            out.extend_from_slice(chunk(EVENT).as_bytes());
        }
        out.extend_from_slice(b"0\r\n\r\n");
        let _ = server.write_all(&out).await;
        let _ = server.read(&mut [0u8; 16]).await;
    });
    let req = Request::post("/v1/completions").body(SendBody::from(Bytes::from_static(b"{}"))).expect("request");
    let read = async {
        let Ok((resp, link)) = exchange(link, req).await else { panic!("no answer head") };
        let mut body = UpstreamBody { source: Source::Replica(resp.into_body()), link, home: None };
        let mut bytes = 0;
        while let Some(frame) = body.frame().await {
            bytes += frame.expect("a frame").into_data().map_or(0, |d| d.len());
        }
        bytes
    };
    let bytes = tokio::time::timeout(Duration::from_secs(60), read).await.expect("the burst was read within a minute");
    assert_eq!(bytes, EVENTS * EVENT.len());
}

fn future_size<A, B, C, D, E, F: std::future::Future>(_: impl Fn(A, B, C, D, E) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// A connection is handed from the idle list to a request, through its
/// response and back as one pointer, and a new connection's state is
/// boxed where it is made: inline, hyper's connection (672 bytes) was
/// copied at every hand-over and the TLS handshake's state sat in every
/// request's future (3,680 bytes; 1,616 when written).
#[test]
fn a_connection_moves_as_a_pointer_and_the_sending_future_stays_small() {
    let body = std::mem::size_of::<UpstreamBody>();
    assert!(body <= 128, "the response body is {body} bytes: it holds its connection boxed (64 when written)");
    let send = future_size(send);
    assert!(send <= 2048, "the sending future is {send} bytes");
}

/// A connection that reads whole answers is never handed to a stream,
/// nor the other way round: each kind comes back from its own list.
#[tokio::test]
async fn connections_of_each_kind_of_reads_are_kept_apart() {
    let (listener, base) = replica().await;
    let idle = IdleConns::default();
    let (link, _server) = connected(&listener, &base, Reads::Whole).await;
    idle.put(Reads::Whole, link);
    assert!(idle.take(Reads::Events).is_none(), "a stream gets no connection that reads whole answers");
    assert!(idle.take(Reads::Whole).is_some(), "a whole answer gets it");
    assert_eq!(idle.len(), 0);
}
