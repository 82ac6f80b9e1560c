//! One client connection: what it speaks, the builder that serves it, and
//! serving it to its end (plain or TLS, HTTP/1.1 or HTTP/2).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::drain;
use crate::error::ProxyBody;

/// How long HTTP/2 waits between keep-alive pings on a connection, and for
/// the answer to one before it closes the connection (a peer gone silent).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// What the service answers a request with.
type Answer = Response<ProxyBody>;

/// The service a listener's connections run ([`super::service`]): any service of
/// these bounds (a trait, as a type alias cannot name them).
pub(super) trait Svc:
    tower::Service<Request<Incoming>, Response = Answer, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

impl<S: tower::Service<Request<Incoming>, Response = Answer, Error = Infallible, Future: Send> + Clone + Send + 'static> Svc for S {}

/// The HTTP/2 connection preface every HTTP/2 client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a new connection speaks, known before hyper reads from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    Http1,
    Http2,
}

/// Wait (up to `deadline`) until a new plain connection has sent either the
/// whole HTTP/2 preface or bytes that are not one (HTTP/1.1; hyper's own
/// header timeout covers the rest of its head), and say which. `None`: it
/// sent nothing in time, or closed.
async fn first_bytes(stream: &TcpStream, deadline: tokio::time::Instant) -> Option<Speaks> {
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) | Err(_) => return None,
        };
        if n == 0 {
            return None;
        }
        if !H2_PREFACE.starts_with(&buf[..n]) {
            return Some(Speaks::Http1);
        }
        if n >= H2_PREFACE.len() {
            return Some(Speaks::Http2);
        }
        // Part of a preface: peek returns at once until more arrives.
        if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(5))).await.is_err() {
            return None;
        }
    }
}

/// The connection builders of a listener, made once: each connection
/// takes the one for what it speaks. A connection known to speak HTTP/1.1
/// or HTTP/2 is served by hyper's builder for that protocol alone, so its
/// task holds only that protocol's connection state (640 bytes for
/// HTTP/1.1, where hyper-util's builder for both held 1.5 KB, and with
/// TLS's state beside it in the same future, 6.7 KB for every open
/// HTTP/1.1 connection). Told, hyper's first read takes the whole request
/// head; telling it from the bytes hands the few bytes it looked at back
/// as a read of their own, and an HTTP/1.1 connection's read buffer then
/// grew from 8 to 16 KiB while the rest of the head came, for the
/// connection's life (the other half of what a stream kept: see
/// `proxy::respond::detached`). Only a TLS connection whose client chose
/// no protocol (no ALPN) is served by the builder that tells from the
/// bytes.
pub(super) struct Builders {
    h1: hyper::server::conn::http1::Builder,
    h2: hyper::server::conn::http2::Builder<TokioExecutor>,
    either: auto::Builder<TokioExecutor>,
}

impl Builders {
    /// Serve `io` with the builder for what it speaks (`None`: not known,
    /// told from its first bytes) until it closes. HTTP/1.1 inline; the
    /// others boxed: one HTTP/2 connection carries many streams, and its
    /// larger state would otherwise size every HTTP/1.1 connection's task.
    async fn serve<I>(&self, speaks: Option<Speaks>, io: TokioIo<I>, svc: impl Svc, entry: drain::Entry) -> Result<(), BoxError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let svc = TowerToHyperService::new(svc);
        match speaks {
            Some(Speaks::Http1) => Ok(entry.watch(self.h1.serve_connection(io, svc)).await?),
            Some(Speaks::Http2) => Ok(Box::pin(entry.watch(self.h2.serve_connection(io, svc))).await?),
            None => Box::pin(entry.watch(self.either.serve_connection(io, svc))).await,
        }
    }
}

/// What one HTTP/2 stream may send before the gateway reads it: a prompt
/// of up to 1 MiB arrives in one round trip.
const H2_STREAM_WINDOW: u32 = 1 << 20;

/// What all of a connection's streams together may send before the gateway
/// reads it: 1 KiB per stream allowed, at least 8 MiB. Bodies are read as
/// they arrive, so this is rarely held; but it also sets the HTTP/2
/// library's guard against floods of small DATA frames (half the window),
/// and a client that opens thousands of streams at once sends thousands of
/// small frames: at 1 MiB (the library's default), 10,000 streams opened
/// together ended the connection with ENHANCE_YOUR_CALM.
fn h2_connection_window(max_streams: u32) -> u32 {
    max_streams.saturating_mul(1024).clamp(8 << 20, 1 << 30)
}

/// HTTP/1.1 and HTTP/2 on one listener, with the header timeout and the
/// HTTP/2 pings, streams and windows: the same settings in each builder.
pub(super) fn connection_builders(header_read_timeout: Duration, http2_max_streams: u32) -> Builders {
    let mut either = auto::Builder::new(TokioExecutor::new());
    let mut h1 = hyper::server::conn::http1::Builder::new();
    let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    h1.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    either.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    macro_rules! http2 {
        ($b:expr) => {
            $b.timer(TokioTimer::new())
                .keep_alive_interval(H2_PING_INTERVAL)
                .keep_alive_timeout(H2_PING_TIMEOUT)
                .max_concurrent_streams(http2_max_streams)
                .initial_stream_window_size(H2_STREAM_WINDOW)
                .initial_connection_window_size(h2_connection_window(http2_max_streams))
        };
    }
    http2!(h2);
    http2!(either.http2());
    Builders { h1, h2, either }
}

pub(super) async fn serve_conn(
    builders: &Builders,
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    svc: impl Svc,
    entry: drain::Entry,
    header_read_timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + header_read_timeout;
    let result: Result<(), BoxError> = match tls {
        None => {
            let Some(speaks) = first_bytes(&stream, deadline).await else {
                tracing::debug!(%peer, "no request head within server.header_read_timeout; closing");
                return;
            };
            builders.serve(Some(speaks), TokioIo::new(crate::flat::Flat(stream)), svc, entry).await
        }
        // Boxed: TLS's state (1.2 KB more) would otherwise size every plain
        // connection's task too.
        Some(acc) => match Box::pin(serve_tls(builders, stream, peer, acc, svc, entry, deadline)).await {
            Some(r) => r,
            None => return,
        },
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A TLS connection: the handshake, then the protocol its client chose
/// (ALPN). `None` when it ended before a request: the handshake failed or
/// timed out, or no request head was complete by `deadline`.
async fn serve_tls(
    builders: &Builders,
    stream: TcpStream,
    peer: SocketAddr,
    acc: TlsAcceptor,
    svc: impl Svc,
    entry: drain::Entry,
    deadline: tokio::time::Instant,
) -> Option<Result<(), BoxError>> {
    let s = match tokio::time::timeout_at(deadline, acc.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return None;
        }
        Err(_) => return None,
    };
    // Set when the first request head is complete (hyper calls the service).
    let headed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = headed.clone();
    let svc = tower::ServiceExt::map_request(svc, move |req: Request<Incoming>| {
        seen.store(true, std::sync::atomic::Ordering::Relaxed);
        req
    });
    // Inside TLS the preface cannot be peeked at, but the protocol the
    // client chose (ALPN) says what it speaks; a client that chose none is
    // told by its bytes. The connection goes if no request head is
    // complete by the deadline.
    let io = TokioIo::new(s);
    let speaks = match io.inner().get_ref().1.alpn_protocol() {
        Some(b"h2") => Some(Speaks::Http2),
        Some(b"http/1.1") => Some(Speaks::Http1),
        _ => None,
    };
    let conn = builders.serve(speaks, io, svc, entry);
    let no_head = async {
        tokio::time::sleep_until(deadline).await;
        if headed.load(std::sync::atomic::Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = conn => Some(r),
        _ = no_head => {
            tracing::debug!(%peer, "no request head within server.header_read_timeout; closing");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain connection's future holds only what it serves with: no TLS
    /// state and no HTTP/2 connection inline (they are boxed where used),
    /// so every open HTTP/1.1 stream's task stays small. It was 6.1 KB in
    /// a test build with both inline; 0.9 KB without.
    #[tokio::test]
    async fn a_plain_connections_future_holds_no_tls_or_http2_state() {
        let listener = super::super::bind(SocketAddr::from(([127, 0, 0, 1], 0)), 16).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let svc = tower::service_fn(|_: Request<Incoming>| async { Ok::<_, Infallible>(Response::new(ProxyBody::default())) });
        let builders = connection_builders(Duration::from_secs(1), 100);
        let stream = TcpStream::connect(addr).await.expect("connect");
        let drain = drain::Drain::default();
        let conn = serve_conn(&builders, stream, addr, None, svc, drain.enter(), Duration::from_secs(1));
        let size = std::mem::size_of_val(&conn);
        assert!(size < 2048, "a plain connection's future takes {size} bytes");
    }
}
