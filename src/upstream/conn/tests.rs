//! The connections' tests: idle lists, sizes, one poll per event, and what
//! a connection holds.

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

/// Send `req` on `link` and wait for the answer's head (no idle list to go back to).
async fn exchange(mut link: Box<Link>, req: Request<SendBody>) -> Result<Response<UpstreamBody>, WireError> {
    link.start(req.into());
    let head = poll_fn(|cx| link.poll_head(cx)).await?;
    Ok(answer(head, link, None))
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
    let mut body = answer.expect("an answer head").into_body();

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

/// A stream's connection holds no read buffer while it waits for its
/// next event, hands each read on as one frame (every event in it), and
/// keeps only a chunk's unfinished framing until the rest comes.
#[tokio::test]
async fn a_stream_holds_no_read_buffer_between_events() {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    let (listener, base) = replica().await;
    let (mut link, mut server) = connected(&listener, &base, Reads::Events).await;
    link.start(Request::post("/v1/completions").body(SendBody::from(Bytes::from_static(b"{}"))).expect("request").into());
    let (head, ()) = tokio::join!(poll_fn(|cx| link.poll_head(cx)), answer_once(&mut server, SSE_HEAD));
    assert!(head.is_ok());
    let (a, b) = ("data: {\"text\":\"a\"}\n\n", "data: {\"text\":\"b\"}\n\n");
    let mut cx = Context::from_waker(Waker::noop());
    assert!(link.poll_data(&mut cx).is_pending());
    assert_eq!(link.holds(), 0, "waiting for the first event: no buffer");
    server.write_all(format!("{}{}", chunk(a), chunk(b)).as_bytes()).await.expect("two events");
    let data = poll_fn(|cx| link.poll_data(cx)).await.expect("data").expect("bytes");
    assert_eq!(data, format!("{a}{b}"), "both events of the read, as one frame");
    assert!(link.poll_data(&mut cx).is_pending());
    assert_eq!(link.holds(), 0, "between events: no buffer");
    // The next read's frame is cut from the same block: no allocation of its own.
    server.write_all(chunk(b).as_bytes()).await.expect("an event");
    let next = poll_fn(|cx| link.poll_data(cx)).await.expect("data").expect("bytes");
    assert_eq!(next, b);
    assert_eq!(next.as_ptr(), data[data.len()..].as_ptr(), "the frame follows the last one in the thread's block");
    assert!(link.poll_data(&mut cx).is_pending());
    // A chunk's size line cut by the read: its start is kept until the rest comes.
    let whole = chunk(a);
    server.write_all(&whole.as_bytes()[..1]).await.expect("a piece");
    let mut piece = link.poll_data(&mut cx);
    for _ in 0..100 {
        if link.holds() > 0 {
            break;
        }
        tokio::task::yield_now().await;
        piece = link.poll_data(&mut cx);
    }
    assert!(piece.is_pending() && link.holds() > 0, "the piece is kept");
    server.write_all(&whole.as_bytes()[1..]).await.expect("the rest");
    let data = poll_fn(|cx| link.poll_data(cx)).await.expect("data").expect("bytes");
    assert_eq!(data, a);
    assert!(link.poll_data(&mut cx).is_pending());
    assert_eq!(link.holds(), 0, "the event whole: its buffer let go");
    server.write_all(b"0\r\n\r\n").await.expect("end");
    let mut body = answer(http::Response::new(()), link, None).into_body();
    assert!(body.frame().await.is_none(), "the end");
}

/// A replica that sends a long run of events at once (many reads, many
/// events in each): every event arrives.
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
        let mut body = exchange(link, req).await.expect("an answer head").into_body();
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
/// boxed where it is made: inline, a connection's state was copied at
/// every hand-over and the TLS handshake's state sat in every request's
/// future (3,680 bytes; 1,616 when written).
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

/// The replica's side of one exchange: read the request's head, answer `wire`.
async fn answer_once(server: &mut TcpStream, wire: &[u8]) {
    use tokio::io::AsyncWriteExt;
    assert!(read_request_head(server).await, "the request came");
    server.write_all(wire).await.expect("answer");
}

/// Send a GET on `link`, the replica answering `wire`: the body read to
/// its end (or its error), and the link.
async fn get_through(mut link: Box<Link>, server: &mut TcpStream, wire: &[u8]) -> (Result<Vec<u8>, WireError>, Box<Link>) {
    let req = Request::get("/x").header(http::header::HOST, "r").body(SendBody::from(Bytes::new())).expect("request");
    link.start(req.into());
    let (head, ()) = tokio::join!(poll_fn(|cx| link.poll_head(cx)), answer_once(server, wire));
    if let Err(e) = head {
        return (Err(e), link);
    }
    let mut body = Vec::new();
    loop {
        match poll_fn(|cx| link.poll_data(cx)).await {
            Some(Ok(d)) => body.extend_from_slice(&d),
            Some(Err(e)) => return (Err(e), link),
            None => return (Ok(body), link),
        }
    }
}

/// A connection may carry the next request only when its answer was read
/// whole and lets it stay open; one that ends mid-answer is an error of
/// the body, never a short answer.
#[tokio::test]
async fn a_connection_is_kept_only_when_its_answer_lets_it() {
    let (listener, base) = replica().await;
    let (link, mut server) = connected(&listener, &base, Reads::Whole).await;
    let (body, mut link) = get_through(link, &mut server, b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello").await;
    assert_eq!(body.expect("whole"), b"hello");
    assert!(link.reusable(), "a whole answer of known length keeps its connection");
    link.rest();
    let (body, mut link) =
        get_through(link, &mut server, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n").await;
    assert_eq!(body.expect("whole"), b"hi");
    assert!(link.reusable(), "the same connection, again, chunked");
    link.rest();
    let (body, link) = get_through(link, &mut server, b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok").await;
    assert_eq!(body.expect("whole"), b"ok");
    assert!(!link.reusable(), "connection: close");

    let mut link = answered_then_closed(&listener, &base, Reads::Whole, b"HTTP/1.1 200 OK\r\n\r\nuntil the end").await;
    let mut got = Vec::new();
    while let Some(d) = poll_fn(|cx| link.poll_data(cx)).await {
        got.extend_from_slice(&d.expect("data"));
    }
    assert_eq!(got, b"until the end", "a body delimited by the connection's end");
    assert!(!link.reusable(), "and its connection is not kept");

    let mut link = answered_then_closed(&listener, &base, Reads::Events, b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf").await;
    assert_eq!(poll_fn(|cx| link.poll_data(cx)).await.expect("data").expect("bytes"), &b"half"[..]);
    let cut = poll_fn(|cx| link.poll_data(cx)).await.expect("not a clean end");
    assert!(matches!(cut, Err(WireError::Incomplete)), "{cut:?}");
    assert!(!link.reusable());
}

/// A new connection on which a GET was answered `wire`, the replica's end
/// then closed: the link, past the answer's head.
async fn answered_then_closed(listener: &tokio::net::TcpListener, base: &http::Uri, reads: Reads, wire: &[u8]) -> Box<Link> {
    let (mut link, mut server) = connected(listener, base, reads).await;
    link.start(Request::get("/x").body(SendBody::from(Bytes::new())).expect("request").into());
    let replica_side = async {
        answer_once(&mut server, wire).await;
        drop(server);
    };
    let (head, ()) = tokio::join!(poll_fn(|cx| link.poll_head(cx)), replica_side);
    assert!(head.is_ok(), "{:?}", head.err());
    link
}

/// An answer without a body (204 here) is whole at its head: the body says
/// it has ended and its connection is free before anything polls it.
#[tokio::test]
async fn an_answer_without_a_body_is_whole_at_its_head() {
    let (listener, base) = replica().await;
    let (link, mut server) = connected(&listener, &base, Reads::Whole).await;
    let req = Request::delete("/x").body(SendBody::from(Bytes::new())).expect("request");
    let (answer, ()) = tokio::join!(exchange(link, req), answer_once(&mut server, b"HTTP/1.1 204 No Content\r\n\r\n"));
    let body = answer.expect("an answer head").into_body();
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert!(matches!(body.source, Source::Replica(None)), "the connection was let go at once");
}

/// The connection's end before any answer is "closed unanswered"
/// (retried by the sending stage), not an invalid answer.
#[tokio::test]
async fn a_replica_that_closes_unanswered_is_told_apart() {
    let (listener, base) = replica().await;
    let (mut link, mut server) = connected(&listener, &base, Reads::Events).await;
    link.start(Request::post("/x").body(SendBody::from(Bytes::from_static(b"{}"))).expect("request").into());
    let replica_side = async {
        assert!(read_request_head(&mut server).await);
        drop(server);
    };
    let (head, ()) = tokio::join!(poll_fn(|cx| link.poll_head(cx)), replica_side);
    let e = head.expect_err("no answer");
    assert!(matches!(e, WireError::Closed) && e.closed(), "{e:?}");
}

/// A connection for whole answers keeps its read buffer while idle after
/// an answer an embeddings request's size, for its next answer; after a
/// larger one (a replica's `/metrics`, read by the load scrape) it lets the
/// buffer go, and its reads start from their first size again.
#[tokio::test]
async fn an_idle_whole_answer_connection_keeps_a_small_read_buffer_and_lets_a_large_one_go() {
    let (listener, base) = replica().await;
    let (mut link, mut server) = connected(&listener, &base, Reads::Whole).await;
    for (len, kept) in [(9_000, true), (60_000, false), (9_000, true)] {
        let wire = [format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n").into_bytes(), vec![b'x'; len]].concat();
        let (body, back) = get_through(link, &mut server, &wire).await;
        link = back;
        assert_eq!(body.map(|b| b.len()).ok(), Some(len));
        assert!(link.reusable());
        link.rest();
        assert_eq!(link.holds() > 0, kept, "after an answer of {len} bytes: {} held", link.holds());
    }
}

/// Answers of one size, one after another (embeddings of one model): the
/// read buffer settles at a size that holds one and is kept between them,
/// not grown past what is kept by a read that filled the room left behind
/// the last answer, then let go and grown again for every answer.
#[tokio::test]
async fn answers_of_one_size_keep_one_read_buffer_between_them() {
    let (listener, base) = replica().await;
    let (mut link, mut server) = connected(&listener, &base, Reads::Whole).await;
    let len = 8_700;
    let mut buffers = std::collections::HashSet::new();
    for i in 0..12 {
        let wire = [format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n").into_bytes(), vec![b'x'; len]].concat();
        let (body, back) = get_through(link, &mut server, &wire).await;
        link = back;
        assert_eq!(body.map(|b| b.len()).ok(), Some(len));
        link.rest();
        assert!(link.holds() > 0, "answer {i}: its read buffer was let go");
        // After the first answers have sized it, the same buffer is read into.
        if i >= 2 {
            buffers.insert(link.buffer_at());
        }
    }
    assert_eq!(buffers.len(), 1, "the answers were read into {} buffers", buffers.len());
}
