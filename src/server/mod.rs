//! Listeners: accept, optional TLS, HTTP/1.1 and HTTP/2, graceful shutdown;
//! and the opt-in tuning for machines of the gateway's own (busy polling,
//! short scheduler slices), which lives here only and reaches the rest
//! through [`Tuning`] and [`runtime`].
//!
//! Shutdown, in order:
//! 1. stop accepting (the listener is dropped, new connects are refused);
//! 2. tell every open connection to finish: idle keep-alive connections close
//!    at once, connections with a response in flight close after it ends;
//! 3. wait for them up to `grace`, then return (what is left is cut when the
//!    process exits).

pub mod bodies;
pub mod busy;
mod conn;
mod drain;
pub mod memory;
pub(crate) mod sched;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::error::{error_response, ProxyBody};
use conn::Svc;

/// Load a rustls acceptor (ALPN h2 and http/1.1) from PEM files.
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor, String> {
    acceptor_of("server.tls", cert, key, &[b"h2", b"http/1.1"])
}

/// A rustls acceptor of the config's section `at` (its errors name it),
/// offering `alpn`.
pub(crate) fn acceptor_of(at: &str, cert: &std::path::Path, key: &std::path::Path, alpn: &[&[u8]]) -> Result<TlsAcceptor, String> {
    let certs = crate::config::pem::certs(cert).map_err(|e| format!("{at}.cert {e}"))?;
    let key = crate::config::pem::key(key).map_err(|e| format!("{at}.key {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{at}: {e}"))?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

/// The opt-in machine tuning of a running gateway (`server.busy_poll`,
/// `server.short_sched_slice`), fixed at start.
#[derive(Clone, Default)]
pub struct Tuning {
    /// Requests in flight, for busy polling (when it is on).
    pub busy: Option<Arc<busy::BusyPoll>>,
}

impl Tuning {
    pub fn new(cfg: &crate::config::ServerConfig) -> Tuning {
        Tuning { busy: cfg.busy_poll.then(Default::default) }
    }

    /// Start what runs in the background (the polling tasks), until `stop`.
    pub fn start(&self, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
        self.busy.as_ref().map(|b| b.start(stop)).unwrap_or_default()
    }
}

/// The gateway's runtime: multi-threaded, with short scheduler slices on
/// every worker when `short_sched_slice` is set (see `server::sched`).
pub fn runtime(short_sched_slice: bool) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if short_sched_slice {
        static REFUSED: std::sync::Once = std::sync::Once::new();
        b.on_thread_start(|| {
            if let Err(e) = sched::request_short_slice() {
                REFUSED.call_once(
                    || tracing::warn!(error = %e, "server.short_sched_slice: short scheduler slices not granted; default slices kept"),
                );
            }
        });
    }
    b.enable_all().build()
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response<ProxyBody> {
    tracing::error!("request handler panicked");
    error_response(http::StatusCode::INTERNAL_SERVER_ERROR, "internal error in slogate", "internal_error", None, "internal_error")
}

/// The address a request's connection came from, in its extensions, with
/// the elements that name it in `X-Forwarded-For` and `Forwarded`, made
/// once per connection rather than for each request.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    pub addr: SocketAddr,
    /// The client's IP as `X-Forwarded-For` lists it.
    pub x_forwarded_for: http::HeaderValue,
    /// `for=<ip>` as `Forwarded` (RFC 7239) lists it, an IPv6 address
    /// quoted and in brackets.
    pub forwarded: http::HeaderValue,
    /// Request body bytes held by its listener's requests, and by this
    /// connection's ([`bodies`]).
    pub bodies: Arc<bodies::Held>,
    pub held: Arc<bodies::Held>,
}

impl ClientAddr {
    /// A connection from `addr` on a listener of its own.
    pub fn new(addr: SocketAddr) -> Self {
        Self::on(addr, Arc::default())
    }

    /// A connection from `addr` on the listener whose bodies `bodies` counts.
    pub fn on(addr: SocketAddr, bodies: Arc<bodies::Held>) -> Self {
        let ip = addr.ip().to_canonical();
        let node = if ip.is_ipv6() { format!("for=\"[{ip}]\"") } else { format!("for={ip}") };
        // An address's text is always a valid header value.
        let value = |s: String| http::HeaderValue::from_str(&s).unwrap_or(http::HeaderValue::from_static("unknown"));
        ClientAddr { addr, x_forwarded_for: value(ip.to_string()), forwarded: value(node), bodies, held: Arc::default() }
    }
}

/// What a listener allows its clients: how long a request head may take,
/// how many connections may be open (`server.*`).
#[derive(Clone)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    /// Streams one HTTP/2 connection may have open at once.
    pub http2_max_streams: u32,
    /// Open connections and connections that waited (the data listener's).
    pub open: Option<prometheus_client::metrics::gauge::Gauge>,
    pub waited: Option<prometheus_client::metrics::counter::Counter>,
    /// Request body bytes held (the data listener's).
    pub bodies: Option<prometheus_client::metrics::gauge::Gauge>,
}

impl Limits {
    pub fn new(cfg: &crate::config::ServerConfig) -> Limits {
        Limits {
            header_read_timeout: cfg.header_read_timeout.get(),
            max_connections: cfg.max_connections as usize,
            http2_max_streams: cfg.http2_max_streams,
            open: None,
            waited: None,
            bodies: None,
        }
    }
}

/// A listener on `addr` whose accept queue holds `backlog` connections
/// (the kernel caps it at `net.core.somaxconn`).
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // A restart binds the port again while the old connections drain.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raise this process's soft limit on open files to its hard limit (what a
/// process may do for itself), and return the limit now in force. Each
/// open HTTP/1.1 stream holds two files (the client's connection and the
/// replica's), an HTTP/2 stream one (the replica's); the usual soft limit
/// of 1,024 would stop slogate near 500 streams.
pub fn raise_file_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// Serve `handler` on `listener` until `shutdown` turns true, then drain.
/// With busy polling on (`tuning`), each request counts as in flight from
/// its arrival until its response body ends.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
    tuning: Tuning,
    limits: Limits,
) where
    H: Fn(Request<Incoming>, Arc<ClientAddr>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let builders = Arc::new(conn::connection_builders(limits.header_read_timeout, limits.http2_max_streams));
    let drain = drain::Drain::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let bodies = Arc::new(bodies::Held::shown(limits.bodies.clone()));
    loop {
        let Some(permit) = connection_slot(&slots, &limits, &mut shutdown).await else { break };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => break,
        };
        let _ = stream.set_nodelay(true);
        // Each connection's service knows its client: no request carries
        // the address in its extensions (a map allocated for each).
        let svc = service(handler.clone(), tuning.clone(), Arc::new(ClientAddr::on(peer, bodies.clone())));
        let (builders, tls, entry, timeout) = (builders.clone(), tls.clone(), drain.enter(), limits.header_read_timeout);
        let open = limits.open.clone();
        // The connection's future is made inside the task's: made outside
        // and awaited inside, it would be stored twice (5 KB more for every
        // open connection).
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(g) = &open {
                g.inc();
            }
            conn::serve_conn(&builders, stream, peer, tls, svc, entry, timeout).await;
            if let Some(g) = &open {
                g.dec();
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, drain.shutdown()).await.is_err() {
        tracing::warn!(grace = ?grace, "shutdown grace expired with connections still open");
    }
}

/// The request handler as a service: panics become 500s, and a request
/// counts as in flight for busy polling until its body ends. Of a type
/// known here, not boxed: a boxed service would be cloned, box and all,
/// for each request. The handler's future (about 3.5 KB) is boxed, one
/// allocation a request: hyper keeps the service's future in place for as
/// long as the HTTP/1.1 connection lives, and an HTTP/2 stream's task
/// holds the larger of it and the response body's pipe until the stream
/// ends, so inline, every open stream held the whole future long after
/// its response head; boxed, it holds a pointer, and the future is freed
/// at the head. The panic is caught around the handler's future here
/// rather than by a layer, which would box every response body once more.
fn service<H, F>(handler: H, tuning: Tuning, client: Arc<ClientAddr>) -> impl Svc
where
    H: Fn(Request<Incoming>, Arc<ClientAddr>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    tower::service_fn(move |req: Request<Incoming>| {
        let active = tuning.busy.as_ref().map(|b| b.enter());
        // The handler's future is made inside the block: a future made
        // outside and awaited inside would be stored twice in it (once
        // captured, once awaited), doubling what each request in flight
        // holds until its response head.
        let (handler, client) = (handler.clone(), client.clone());
        async move {
            let answered = std::panic::AssertUnwindSafe(Box::pin(handler(req, client))).catch_unwind().await;
            let resp = answered.unwrap_or_else(panic_response);
            Ok::<_, Infallible>(match active {
                Some(a) => resp.map(|b| http_body_util::BodyExt::boxed_unsync(busy::Held::new(b, a))),
                None => resp,
            })
        }
    })
}

/// A place for one more connection. At max_connections, wait until one
/// closes (new connections wait in the kernel's accept queue); `None` at
/// shutdown.
async fn connection_slot(
    slots: &Arc<tokio::sync::Semaphore>,
    limits: &Limits,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = slots.clone().try_acquire_owned() {
        return Some(p);
    }
    if let Some(w) = &limits.waited {
        w.inc();
    }
    tokio::select! {
        p = slots.clone().acquire_owned() => p.ok(),
        _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => None,
    }
}

#[cfg(test)]
mod tests {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpStream;

    use super::*;

    /// A handler that panics answers 500 in OpenAI's error form, over
    /// HTTP/1.1 and HTTP/2, and the connection serves the next request.
    #[tokio::test]
    async fn a_handler_that_panics_answers_500_and_the_connection_goes_on() {
        use http_body_util::BodyExt;
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)), 16).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop) = watch::channel(false);
        let handler = |req: Request<Incoming>, _: Arc<ClientAddr>| async move {
            if req.uri().path() == "/panic" {
                panic!("a handler bug");
            }
            error_response(http::StatusCode::NOT_FOUND, "none", "not_found", None, "not_found")
        };
        let cfg = crate::config::ServerConfig::default();
        let server = tokio::spawn(serve(listener, None, handler, stop, Duration::from_secs(1), Tuning::new(&cfg), Limits::new(&cfg)));
        for h2 in [false, true] {
            let io = TokioIo::new(TcpStream::connect(addr).await.expect("connect"));
            let send = |path: &str| Request::get(path).header("host", "x").body(http_body_util::Empty::<bytes::Bytes>::new()).expect("req");
            let statuses = if h2 {
                let (mut tx, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.expect("h2");
                tokio::spawn(conn);
                let a = tx.send_request(send("/panic")).await.expect("answered");
                let (status, body) = (a.status(), a.into_body().collect().await.expect("body").to_bytes());
                assert!(String::from_utf8_lossy(&body).contains("internal_error"), "{body:?}");
                (status, tx.send_request(send("/next")).await.expect("answered").status())
            } else {
                let (mut tx, conn) = hyper::client::conn::http1::handshake(io).await.expect("h1");
                tokio::spawn(conn);
                let a = tx.send_request(send("/panic")).await.expect("answered");
                let (status, body) = (a.status(), a.into_body().collect().await.expect("body").to_bytes());
                assert!(String::from_utf8_lossy(&body).contains("internal_error"), "{body:?}");
                (status, tx.send_request(send("/next")).await.expect("answered").status())
            };
            assert_eq!(statuses, (http::StatusCode::INTERNAL_SERVER_ERROR, http::StatusCode::NOT_FOUND), "h2: {h2}");
        }
        let _ = stop_tx.send(true);
        server.await.expect("server ends");
    }

    /// The listener's accept queue is `server.listen_backlog` long (what
    /// the kernel reports for it: `ss`'s Send-Q of a listening socket).
    #[tokio::test]
    async fn a_listener_gets_the_backlog_asked_for() {
        for backlog in [17, 300] {
            let l = bind(SocketAddr::from(([127, 0, 0, 1], 0)), backlog).expect("bind");
            let port = l.local_addr().expect("addr").port();
            let out = std::process::Command::new("ss")
                .args(["-Hltn", &format!("sport = :{port}")])
                .output()
                .expect("ss (iproute2; scripts/setup-test-deps installs it)");
            let text = String::from_utf8_lossy(&out.stdout);
            let send_q = text.split_whitespace().nth(2).map(str::to_string);
            assert_eq!(send_q.as_deref(), Some(backlog.to_string().as_str()), "{text}");
        }
    }

    /// A soft open-file limit below the hard one is raised to it.
    #[test]
    fn the_file_limit_is_raised_to_the_hard_limit() {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit read and write the struct we pass.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let lowered = libc::rlimit { rlim_cur: lim.rlim_max.min(4096) - 1, rlim_max: lim.rlim_max };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        let files = raise_file_limit().expect("rlimit");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((files, lim.rlim_cur), (lim.rlim_max, lim.rlim_max));
    }

    /// A client's address as the forwarding headers name it: IPv4 bare,
    /// IPv6 quoted in brackets in `Forwarded`, an IPv4-mapped IPv6 address
    /// as the IPv4 address it is.
    #[test]
    fn a_client_address_is_named_as_the_forwarding_headers_want() {
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1", "for=127.0.0.1"),
            ("[2001:db8::7]:5000", "2001:db8::7", "for=\"[2001:db8::7]\""),
            ("[::ffff:192.0.2.9]:5000", "192.0.2.9", "for=192.0.2.9"),
        ];
        for (addr, xff, fwd) in cases {
            let c = ClientAddr::new(addr.parse().expect("addr"));
            assert_eq!((c.x_forwarded_for.to_str().ok(), c.forwarded.to_str().ok()), (Some(xff), Some(fwd)), "{addr}");
        }
    }
}
