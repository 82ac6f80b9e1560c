//! The data plane's connections to replicas: HTTP/1.1 connections of
//! slogate's own ([`super::link`], [`super::wire`]), driven by the response
//! body that uses them, kept per replica while idle. The rules:
//! docs/design/replica-connections.md.
//!
//! [`UpstreamBody`] polls its connection itself, in the task that writes to
//! the client. One poll reads the socket, decodes a chunk and hands it
//! over; when more events are already in the read buffer, hyper's server
//! writes them in one `writev`, each still its own HTTP chunk (nothing
//! waits, nothing is merged). When the body ends, the connection goes back
//! to its replica's idle list; when the body is dropped early (the client
//! went away, a timeout), the connection is dropped with it and the socket
//! closes, so the replica stops generating.
//!
//! An idle connection is not polled. It is checked when taken: a replica
//! that closed it (vLLM closes idle keep-alive connections after a few
//! seconds) has left an end-of-file that a read sees at once. A request
//! written on it that the replica then closed unanswered (its close crossed
//! the request on the wire) is reported as [`SendError::IdleClosed`], and
//! [`super::send_with_retry`] sends it again on a new connection.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use super::link::{Link, ReadSize, Stream, FIRST_ADAPTIVE};
use super::outgoing::Outgoing;
use super::payload::SendBody;
use super::tls::ReplicaTls;
use super::wire::WireError;
use super::Replica;

/// An idle connection unused for this long is closed when next seen.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per replica; more are closed.
const MAX_IDLE: usize = 1024;

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
    /// An adaptive buffer (8 KiB, doubling while reads fill it): a whole
    /// answer (an embeddings list, a completion) arrives in one or two
    /// reads instead of one per 4 KiB.
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
            list.retain_mut(|i| i.since.elapsed() <= IDLE_TIMEOUT && i.link.alive(&mut cx));
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
            if !idle.link.alive(&mut cx) {
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
    /// The request went out (the replica may be generating) and then the
    /// exchange failed.
    #[error("{0}")]
    Http(#[from] WireError),
    #[error("TLS with {addr}: {error}")]
    Tls { addr: String, error: std::io::Error },
    /// The request went out on a kept-alive connection that the replica
    /// then closed with nothing answered: it timed the idle connection out
    /// as the request was on its way (uvicorn, which serves vLLM, and
    /// llama.cpp's server close idle connections after 5 s) and never read it.
    #[error("the replica closed a kept-alive connection as the request went out: {0}")]
    IdleClosed(Box<SendError>),
}

/// Send `req` (origin-form target, `Host` written) to `replica`, on an
/// idle connection that reads as `reads` asks when one is left (not when
/// `fresh`), else on a new one. With the pool's API key, `Authorization`
/// is the key: `req` must carry no credential of its own then.
///
/// Written as a function returning its future, not an `async fn`: an
/// `async fn` keeps its arguments twice in its state (as given, and as
/// moved into its body), and this future is moved twice per request.
pub(crate) fn send<'a>(
    replica: &'a Arc<Replica>,
    mut req: Outgoing,
    connect_timeout: Duration,
    fresh: bool,
    reads: Reads,
) -> impl Future<Output = Result<Response<UpstreamBody>, SendError>> + 'a {
    // The request carries no credential of its own where the replica has
    // a key (the proxy leaves them out for such a replica).
    if let Some(key) = replica.conn.authorization() {
        req.header(&http::header::AUTHORIZATION, key);
    }
    async move {
        let (mut link, reused) = match (!fresh).then(|| replica.conn.idle.take(reads)).flatten() {
            Some(link) => (link, true),
            // Boxed: a new connection's state (the TLS handshake's among
            // it) would otherwise sit in every request's future.
            None => (Box::pin(connect(&replica.address.base, replica.conn.tls(), connect_timeout, reads)).await?, false),
        };
        link.start(req);
        match poll_fn(|cx| link.poll_head(cx)).await {
            Ok(head) => Ok(answer(head, link, Some((replica.clone(), reads)))),
            Err(e) if reused && e.closed() => Err(SendError::IdleClosed(Box::new(SendError::Http(e)))),
            Err(e) => Err(SendError::Http(e)),
        }
    }
}

/// The answer whose head came on `link`, its body read from it.
fn answer(head: Response<()>, link: Box<Link>, home: Option<(Arc<Replica>, Reads)>) -> Response<UpstreamBody> {
    let (parts, ()) = head.into_parts();
    let mut body = UpstreamBody { source: Source::Replica(Some(link)), home };
    // An answer without a body is whole already: its connection goes back
    // now, not when (or if) something polls the empty body.
    if body.is_end_stream() {
        body.release();
    }
    Response::from_parts(parts, body)
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

    /// What a client may be told: the failure without the replica's address
    /// or certificate names (those go to the log).
    pub(crate) fn public_message(&self) -> String {
        match self {
            SendError::Connect { error, .. } => format!("could not connect: {}", error.kind()),
            SendError::ConnectTimeout { after, .. } => format!("no connection within {after:?}"),
            SendError::Http(e) => e.to_string(),
            SendError::Tls { .. } => "the TLS handshake failed".into(),
            SendError::IdleClosed(e) => e.public_message(),
        }
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
    let size = match reads {
        Reads::Events => ReadSize::Exact(EVENTS_READ_BUF),
        Reads::Whole => ReadSize::Adaptive(FIRST_ADAPTIVE),
    };
    Ok(Link::new(stream, size))
}

/// The read buffer of a connection that carries streams.
const EVENTS_READ_BUF: usize = 4096;

/// A replica's response body, carrying the connection it arrives on.
pub(crate) struct UpstreamBody {
    source: Source,
    /// The replica whose idle list the connection goes back to, and which
    /// of its lists (none for a one-off request).
    home: Option<(Arc<Replica>, Reads)>,
}

/// Where a response body comes from.
enum Source {
    /// A connection of slogate's to the replica; `None` once the body has
    /// ended (its connection gone back to the idle list) or failed.
    Replica(Option<Box<Link>>),
    /// The proxy in front (slogate as Envoy's endpoint picker) relays it,
    /// chunk by chunk (the sender dropped at its end).
    Relayed(tokio::sync::mpsc::UnboundedReceiver<Bytes>),
}

impl UpstreamBody {
    /// An answer another proxy relays (slogate as its endpoint picker).
    pub(crate) fn relayed(chunks: tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Self {
        UpstreamBody { source: Source::Relayed(chunks), home: None }
    }

    /// The body ended: the connection can serve the next request, if the
    /// answer lets it.
    fn release(&mut self) {
        let Source::Replica(link) = &mut self.source else { return };
        if let (Some(mut link), Some((home, reads))) = (link.take(), &self.home) {
            if link.reusable() {
                link.rest();
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
        let link = match &mut this.source {
            Source::Replica(Some(link)) => link,
            Source::Replica(None) => return Poll::Ready(None),
            Source::Relayed(r) => return r.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        };
        match link.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => {
                // A body of known length is not polled past its last byte.
                if link.body_ended() {
                    this.release();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.source = Source::Replica(None);
                Poll::Ready(Some(Err(SendError::Http(e))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Replica(Some(link)) => link.body_ended(),
            Source::Replica(None) => true,
            Source::Relayed(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Replica(Some(link)) => link.size_hint(),
            Source::Replica(None) => SizeHint::with_exact(0),
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
    read_whole(path, timeout, send(replica, req.into(), timeout, false, Reads::Whole)).await
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
        let mut link = connect(base, None, timeout, Reads::Whole).await?;
        link.start(req.into());
        let head = poll_fn(|cx| link.poll_head(cx)).await?;
        Ok(answer(head, link, None))
    })
    .await
}

#[cfg(test)]
mod tests;
