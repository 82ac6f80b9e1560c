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

pub mod busy;
pub(crate) mod sched;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::error::{error_response, ProxyBody};

/// Load a rustls acceptor (ALPN h2 and http/1.1) from PEM files.
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor, String> {
    let certs = crate::config::pem::certs(cert).map_err(|e| format!("server.tls.cert {e}"))?;
    let key = crate::config::pem::key(key).map_err(|e| format!("server.tls.key {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
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
/// every worker when `short_sched_slice` is set (see [`sched`]).
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
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let svc: Svc = tower::util::BoxCloneService::new(
        tower::ServiceBuilder::new().layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response)).service_fn(move |req| {
            let active = tuning.busy.as_ref().map(|b| b.enter());
            let fut = handler(req);
            async move {
                let resp = fut.await;
                Ok::<_, Infallible>(match active {
                    Some(a) => resp.map(|b| http_body_util::BodyExt::boxed_unsync(busy::Held::new(b, a))),
                    None => resp,
                })
            }
        }),
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
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
        tokio::spawn(serve_conn(builder.clone(), stream, peer, tls.clone(), svc.clone(), graceful.watcher()));
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(grace = ?grace, "shutdown grace expired with connections still open");
    }
}

type Svc = tower::util::BoxCloneService<
    Request<Incoming>,
    Response<tower_http::body::UnsyncBoxBody<bytes::Bytes, crate::error::BoxError>>,
    Infallible,
>;

async fn serve_conn(
    builder: auto::Builder<TokioExecutor>,
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    svc: Svc,
    watcher: Watcher,
) {
    let svc = TowerToHyperService::new(svc);
    let result = match tls {
        None => watcher.watch(builder.serve_connection(TokioIo::new(stream), svc).into_owned()).await,
        Some(acc) => match tokio::time::timeout(Duration::from_secs(10), acc.accept(stream)).await {
            Ok(Ok(s)) => watcher.watch(builder.serve_connection(TokioIo::new(s), svc).into_owned()).await,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => return,
        },
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
