//! The data plane's connections to replicas: HTTP/1 client connections that
//! are driven by the response body that uses them, kept per replica while
//! idle.
//!
//! hyper-util's pooled client spawns one task per connection. That task reads
//! the replica's socket and hands each decoded chunk to the response body
//! through a one-slot channel, so every SSE event costs two task polls and a
//! wake-up between them, and events that arrived in one read still leave the
//! gateway in one write each: the writing task never sees a second chunk
//! before it flushes the first.
//!
//! Here [`UpstreamBody`] polls its connection itself, in the task that writes
//! to the client. One poll reads the socket, decodes a chunk and hands it
//! over; when more events are already in the read buffer, hyper's server
//! writes them in one `writev`, each still its own HTTP chunk (nothing waits,
//! nothing is merged). When the body ends, the connection goes back to its
//! replica's idle list; when the body is dropped early (the client went away,
//! a timeout), the connection is dropped with it and the socket closes, so
//! the replica stops generating. How one poll drives both the connection
//! and the body it feeds: [`super::link`].
//!
//! An idle connection is not polled. It is checked when taken: a replica that
//! closed it (vLLM closes idle keep-alive connections after a few seconds)
//! has left an end-of-file that a poll sees at once. If the request still
//! could not be sent on it, it is sent again on a new connection. A request
//! written on it that the replica then closed unanswered (its close crossed
//! the request on the wire) is reported as [`SendError::IdleClosed`], and
//! [`super::send_with_retry`] sends it again on a new connection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::Builder;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::link::{poll_through, Link, Stream};
use super::payload::SendBody;
use super::tls::ReplicaTls;
use super::Replica;

/// An idle connection unused for this long is closed when next seen.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per replica; more are closed.
const MAX_IDLE: usize = 1024;
/// Stale idle connections tried before a new one is opened.
const STALE_TRIES: usize = 3;

struct Idle {
    link: Box<Link>,
    since: Instant,
}

/// How a connection reads its replica's answers; connections of the two
/// kinds are kept apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reads {
    /// 4 KiB at a time: a stream's head and events are small, and a stream
    /// holds its connection for minutes; a larger buffer would stay that
    /// large for every open stream.
    Events,
    /// hyper's adaptive buffer (8 KiB, doubling while reads fill it): a
    /// whole answer (an embeddings list, a completion) arrives in one or
    /// two reads instead of one per 4 KiB.
    Whole,
}

impl Reads {
    /// The reads for a request that does (or does not) ask for a stream.
    pub(crate) fn for_stream(stream: bool) -> Self {
        if stream {
            Reads::Events
        } else {
            Reads::Whole
        }
    }
}

/// One replica's idle connections, one list for each kind of reads, the
/// most recently used last.
#[derive(Default)]
pub(crate) struct IdleConns {
    events: Mutex<VecDeque<Idle>>,
    whole: Mutex<VecDeque<Idle>>,
}

impl IdleConns {
    fn list(&self, reads: Reads) -> &Mutex<VecDeque<Idle>> {
        match reads {
            Reads::Events => &self.events,
            Reads::Whole => &self.whole,
        }
    }

    fn put(&self, reads: Reads, link: Box<Link>) {
        let Ok(mut list) = self.list(reads).lock() else { return };
        if list.len() >= MAX_IDLE {
            list.pop_front();
        }
        list.push_back(Idle { link, since: Instant::now() });
    }

    /// Close the idle connections past the idle timeout and those the
    /// replica closed (their end of file is seen by one poll), so a burst
    /// leaves no sockets behind once traffic stops. Called with each
    /// health check.
    pub(crate) fn sweep(&self) {
        for list in [&self.events, &self.whole] {
            let Ok(mut list) = list.lock() else { continue };
            let mut cx = Context::from_waker(Waker::noop());
            list.retain_mut(|i| i.since.elapsed() <= IDLE_TIMEOUT && i.link.drive(&mut cx) && i.link.tx.is_ready());
        }
    }

    /// How many idle connections are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        [&self.events, &self.whole].iter().map(|l| l.lock().map(|l| l.len()).unwrap_or(0)).sum()
    }

    /// A live idle connection that reads as `reads` asks, if one is left.
    fn take(&self, reads: Reads) -> Option<Box<Link>> {
        loop {
            let mut idle = {
                let mut list = self.list(reads).lock().ok()?;
                // The oldest ones are at the front: drop those past the timeout.
                while list.front().is_some_and(|i| i.since.elapsed() > IDLE_TIMEOUT) {
                    list.pop_front();
                }
                list.pop_back()?
            };
            // A connection the replica closed finishes on this poll (it reads
            // the end of file); the waker is replaced on the next real poll.
            let mut cx = Context::from_waker(Waker::noop());
            if !idle.link.drive(&mut cx) || !idle.link.tx.is_ready() {
                continue;
            }
            return Some(idle.link);
        }
    }
}

/// Why a request could not be sent to a replica.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    // The I/O error is in the message, not a source: messages that walk
    // the sources would say it twice.
    #[error("connect to {addr}: {error}")]
    Connect { addr: String, error: std::io::Error },
    #[error("connect to {addr}: no connection within {after:?}")]
    ConnectTimeout { addr: String, after: Duration },
    /// The HTTP handshake on a new connection failed, or the request could
    /// not be written: the replica never saw it.
    #[error("{0}")]
    NotSent(hyper::Error),
    /// The request was written (the replica may be generating) and then the
    /// exchange failed.
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("TLS with {addr}: {error}")]
    Tls { addr: String, error: std::io::Error },
    #[error("the replica closed the connection before answering")]
    Closed,
    /// The request went out on a kept-alive connection that the replica
    /// then closed with nothing answered: it timed the idle connection out
    /// as the request was on its way (uvicorn, which serves vLLM, and
    /// llama.cpp's server close idle connections after 5 s) and never read it.
    #[error("the replica closed a kept-alive connection as the request went out: {0}")]
    IdleClosed(Box<SendError>),
}

/// Send `req` (origin-form URI, `Host` set) to `replica`, on an idle
/// connection that reads as `reads` asks when one is left (not when
/// `fresh`), else on a new one. With the pool's API key, `Authorization`
/// is the key, whatever `req` carried.
///
/// Written as a function returning its future, not an `async fn`: an
/// `async fn` keeps its arguments twice in its state (as given, and as
/// moved into its body), and this future is moved twice per request.
pub(crate) fn send<'a>(
    replica: &'a Arc<Replica>,
    mut req: Request<SendBody>,
    connect_timeout: Duration,
    fresh: bool,
    reads: Reads,
) -> impl Future<Output = Result<Response<UpstreamBody>, SendError>> + 'a {
    if let Some(key) = replica.conn.authorization() {
        req.headers_mut().insert(http::header::AUTHORIZATION, key.clone());
    }
    async move {
        let mut tries = 0;
        loop {
            let (link, reused) = match (!fresh && tries < STALE_TRIES).then(|| replica.conn.idle.take(reads)).flatten() {
                Some(link) => (link, true),
                // Boxed: a new connection's state (the TLS handshake's among
                // it) would otherwise sit in every request's future.
                None => (Box::pin(connect(&replica.address.base, replica.conn.tls(), connect_timeout, reads)).await?, false),
            };
            tries += 1;
            match exchange(link, req).await {
                Ok((resp, link)) => {
                    let (parts, incoming) = resp.into_parts();
                    let body = UpstreamBody { source: Source::Replica(incoming), link, home: Some((replica.clone(), reads)) };
                    return Ok(Response::from_parts(parts, body));
                }
                // Never written: safe to send again, on another connection.
                Err(Failed::NotSent(error, back)) if reused => {
                    tracing::debug!(replica = %replica.url, %error, "idle connection was closed; sending on another");
                    req = *back;
                }
                Err(Failed::NotSent(error, _)) => return Err(SendError::NotSent(error)),
                Err(Failed::Sent(e)) if reused && e.closed_unanswered() => return Err(SendError::IdleClosed(Box::new(e))),
                Err(Failed::Sent(e)) => return Err(e),
            }
        }
    }
}

impl SendError {
    /// The replica closed a kept-alive connection as the request went out
    /// on it: sent again on a new connection, it is most likely served.
    pub(crate) fn idle_closed(&self) -> bool {
        matches!(self, SendError::IdleClosed(_))
    }

    /// No connection could be made: nothing listens there, or nothing answers.
    pub(crate) fn refused(&self) -> bool {
        matches!(self, SendError::Connect { .. } | SendError::ConnectTimeout { .. })
    }

    /// The connection ended (closed, or reset) before any of the answer:
    /// not an answer the replica got wrong.
    fn closed_unanswered(&self) -> bool {
        match self {
            SendError::Closed => true,
            SendError::Http(e) => {
                e.is_incomplete_message()
                    || e.is_closed()
                    || io_kind(e).is_some_and(|k| {
                        matches!(
                            k,
                            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionAborted
                        )
                    })
            }
            _ => false,
        }
    }

    /// What a client may be told: the failure without the replica's address
    /// or certificate names (those go to the log).
    pub(crate) fn public_message(&self) -> String {
        match self {
            SendError::Connect { error, .. } => format!("could not connect: {}", error.kind()),
            SendError::ConnectTimeout { after, .. } => format!("no connection within {after:?}"),
            SendError::NotSent(e) | SendError::Http(e) => e.to_string(),
            SendError::Tls { .. } => "the TLS handshake failed".into(),
            SendError::Closed => self.to_string(),
            SendError::IdleClosed(e) => e.public_message(),
        }
    }
}

/// The kind of the I/O error under a hyper error, if one is.
fn io_kind(e: &hyper::Error) -> Option<std::io::ErrorKind> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = s.source();
    }
    None
}

enum Failed {
    NotSent(hyper::Error, Box<Request<SendBody>>),
    Sent(SendError),
}

/// Send on one connection, driving it until the response headers arrive;
/// the connection comes back with them unless it has ended.
fn exchange(mut link: Box<Link>, req: Request<SendBody>) -> Exchange<impl Future<Output = Answer>> {
    Exchange { answer: link.tx.try_send_request(req), link: Some(link) }
}

type Answer = Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<SendBody>>>;

pin_project_lite::pin_project! {
    /// [`exchange`]'s future: hyper's answer, with the connection that
    /// brings it. A future of its own rather than an `async` block, which
    /// would keep hyper's future twice in its state (as given, and as
    /// pinned in its body), and this state is moved with each request.
    struct Exchange<F> {
        #[pin]
        answer: F,
        link: Option<Box<Link>>,
    }
}

impl<F: Future<Output = Answer>> Future for Exchange<F> {
    type Output = Result<(Response<Incoming>, Option<Box<Link>>), Failed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut answer = this.answer;
        let result = match poll_through(this.link, cx, |cx| answer.as_mut().poll(cx)) {
            Poll::Ready(r) => r,
            // The connection ended and left the request unanswered.
            Poll::Pending if this.link.is_none() => return Poll::Ready(Err(Failed::Sent(SendError::Closed))),
            Poll::Pending => return Poll::Pending,
        };
        Poll::Ready(match result {
            Ok(resp) => Ok((resp, this.link.take())),
            Err(mut e) => match e.take_message() {
                Some(req) => Err(Failed::NotSent(e.into_error(), Box::new(req))),
                None => Err(Failed::Sent(SendError::Http(e.into_error()))),
            },
        })
    }
}

/// Open a connection to `base` (with TLS when `tls` is given) that reads
/// as `reads` says: the TCP connect and the TLS handshake together within
/// `timeout`.
async fn connect(base: &http::Uri, tls: Option<&ReplicaTls>, timeout: Duration, reads: Reads) -> Result<Box<Link>, SendError> {
    let host = base.host().unwrap_or("127.0.0.1").trim_start_matches('[').trim_end_matches(']');
    let port = base.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
    let addr = || format!("{host}:{port}");
    let open = async {
        let tcp = TcpStream::connect((host, port)).await.map_err(|error| SendError::Connect { addr: addr(), error })?;
        tcp.set_nodelay(true).map_err(|error| SendError::Connect { addr: addr(), error })?;
        match tls {
            None => Ok(Stream::plain(tcp)),
            Some(t) => match t.connector.connect(t.server_name.clone(), tcp).await {
                Ok(s) => Ok(Stream::tls(s)),
                Err(error) => Err(SendError::Tls { addr: addr(), error }),
            },
        }
    };
    let stream = match tokio::time::timeout(timeout, open).await {
        Ok(s) => s?,
        Err(_) => return Err(SendError::ConnectTimeout { addr: addr(), after: timeout }),
    };
    let mut builder = Builder::new();
    if reads == Reads::Events {
        builder.read_buf_exact_size(Some(EVENTS_READ_BUF));
    }
    let (tx, conn) = builder.handshake(TokioIo::new(stream)).await.map_err(SendError::NotSent)?;
    Ok(Link::new(tx, conn))
}

/// The read buffer of a connection that carries streams.
const EVENTS_READ_BUF: usize = 4096;

/// A replica's response body, carrying the connection it arrives on.
pub(crate) struct UpstreamBody {
    source: Source,
    /// `None` once the connection has ended.
    link: Option<Box<Link>>,
    /// The replica whose idle list the connection goes back to, and which
    /// of its lists (none for a one-off request).
    home: Option<(Arc<Replica>, Reads)>,
}

/// Where a response body comes from.
enum Source {
    /// A connection of slogate's to the replica.
    Replica(Incoming),
    /// The proxy in front (slogate as Envoy's endpoint picker) relays it,
    /// chunk by chunk (the sender dropped at its end).
    Relayed(tokio::sync::mpsc::UnboundedReceiver<Bytes>),
}

impl UpstreamBody {
    /// An answer another proxy relays (slogate as its endpoint picker).
    pub(crate) fn relayed(chunks: tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Self {
        UpstreamBody { source: Source::Relayed(chunks), link: None, home: None }
    }

    /// The body ended: the connection can serve the next request.
    fn release(&mut self) {
        if let (Some(link), Some((home, reads))) = (self.link.take(), &self.home) {
            if !link.tx.is_closed() {
                home.conn.idle.put(*reads, link);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = SendError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, SendError>>> {
        let this = self.get_mut();
        let incoming = match &mut this.source {
            Source::Replica(incoming) => incoming,
            Source::Relayed(r) => return r.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        };
        // Read and decode first, so a chunk the connection just decoded is
        // handed over in this same poll.
        match poll_through(&mut this.link, cx, |cx| Pin::new(&mut *incoming).poll_frame(cx)) {
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.link = None;
                Poll::Ready(Some(Err(SendError::Http(e))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                // A body of known length may not be polled past its last byte.
                if incoming.is_end_stream() {
                    this.release();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            // The connection is gone and the body has nothing more: it was cut.
            Poll::Pending if this.link.is_none() => Poll::Ready(Some(Err(SendError::Closed))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Replica(incoming) => incoming.is_end_stream(),
            Source::Relayed(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Replica(incoming) => incoming.size_hint(),
            Source::Relayed(_) => SizeHint::default(),
        }
    }
}

/// A GET request for `path` under `base` (which may carry a path prefix):
/// origin-form URI, `Host` naming the server.
fn get_request(base: &http::Uri, path: &str) -> Result<Request<SendBody>, String> {
    let prefix = base.path().trim_end_matches('/');
    let mut req = Request::get(format!("{prefix}{path}")).body(SendBody::from(Bytes::new())).map_err(|e| format!("GET {path}: {e}"))?;
    if let Some(host) = base.authority().and_then(|a| http::HeaderValue::from_str(a.as_str()).ok()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    Ok(req)
}

/// Read a whole response within `timeout`: its status and body, or why not.
async fn read_whole(
    path: &str,
    timeout: Duration,
    answer: impl Future<Output = Result<Response<UpstreamBody>, SendError>>,
) -> Result<(http::StatusCode, Bytes), String> {
    use http_body_util::BodyExt;
    let fut = async {
        // The error names only its kind; its sources say what failed (refused, reset).
        let resp = answer.await.map_err(|e| {
            let mut msg = format!("GET {path}: {e}");
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                msg.push_str(&format!(": {c}"));
                cause = c.source();
            }
            msg
        })?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| format!("GET {path}: reading the body: {e}"))?.to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, fut).await.unwrap_or_else(|_| Err(format!("GET {path}: no answer within {timeout:?}")))
}

/// GET `path` from a replica (health checks, model discovery, load
/// scrapes), on its pooled connections like any request.
pub(crate) async fn get(replica: &Arc<Replica>, path: &str, timeout: Duration) -> Result<(http::StatusCode, Bytes), String> {
    let req = get_request(&replica.address.base, path)?;
    read_whole(path, timeout, send(replica, req, timeout, false, Reads::Whole)).await
}

/// GET `path` from any plain-HTTP server at `base` (a gateway's admin
/// listener, for `slogate capacity` and the fleet's exchange) on a
/// connection of its own, with `authorization` when given.
pub(crate) async fn get_once(
    base: &http::Uri,
    path: &str,
    authorization: Option<&http::HeaderValue>,
    timeout: Duration,
) -> Result<(http::StatusCode, Bytes), String> {
    if base.scheme_str() != Some("http") {
        return Err(format!("{base}: must be an http:// URL"));
    }
    let mut req = get_request(base, path)?;
    if let Some(v) = authorization {
        req.headers_mut().insert(http::header::AUTHORIZATION, v.clone());
    }
    read_whole(path, timeout, async {
        let link = connect(base, None, timeout, Reads::Whole).await?;
        match exchange(link, req).await {
            Ok((resp, link)) => {
                let (parts, incoming) = resp.into_parts();
                Ok(Response::from_parts(parts, UpstreamBody { source: Source::Replica(incoming), link, home: None }))
            }
            Err(Failed::NotSent(e, _)) => Err(SendError::NotSent(e)),
            Err(Failed::Sent(e)) => Err(e),
        }
    })
    .await
}

#[cfg(test)]
mod tests;
