//! slogate: an OpenAI-compatible streaming gateway for vLLM replicas that
//! measures TTFT, ITL and availability where the caller feels them.
//!
//! The request path, one way: `server` accepts → `classify` picks the SLO
//! class → `proxy::forward` runs the stages: route (body, pool), `admission`
//! (breaker gate, queue, a lease on a replica slot), `reduce`, `upstream`
//! (send, retry) → the observed body, which records one outcome through
//! `telemetry` when it ends or is dropped, and releases the lease with it.
//!
//! The facade: [`Gateway`] builds the whole service (tests run it
//! in-process), [`config`] is the configuration users write, [`rules`] and
//! [`capacity`] are the `slogate rules` and `slogate capacity` commands,
//! [`telemetry`] sets up logging and tracing (and exposes `Metrics` and
//! `Outcome`), [`server`] holds the runtime, listener and busy-poll pieces
//! `main` wires. Every other room is `pub(crate)`: the crate's own.

#![warn(unreachable_pub)]
#![warn(clippy::too_many_lines)]

mod admin;
mod admission;
pub mod capacity;
mod classify;
pub mod config;
mod discovery;
mod epp;
mod error;
mod flat;
mod fleet;
pub mod import;
mod limits;
mod proxy;
mod reduce;
pub mod rules;
pub mod server;
mod state;
mod status;
mod sync;
pub mod telemetry;
mod upstream;

/// Measurements for the benchmarks (`examples/`). Not an API.
#[doc(hidden)]
pub mod benching {
    use std::time::Duration;

    /// See `upstream::pick::decisions`.
    pub fn prefix_decisions(replicas: usize, prefixes: usize, blocks: usize, samples: usize) -> Vec<Duration> {
        crate::upstream::pick::decisions(replicas, prefixes, blocks, samples)
    }

    /// Name a prompt's blocks as prefix-aware routing does; how many.
    pub fn prompt_blocks(text: &[u8], block: usize, max_blocks: usize) -> usize {
        crate::upstream::prefix::RouteKey::of(&[text], block, max_blocks, None).blocks.len()
    }
}

/// Entry points for the fuzz targets (`fuzz/`) and the property tests:
/// each checks one promise on arbitrary input and panics when it is
/// broken. Not an API: built only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;

    /// The SSE observer: the client's bytes do not depend on how the
    /// replica's stream was cut into reads (with and without usage stripping).
    pub fn sse_reads(stream: &[u8], cuts: &[u8]) {
        let whole = Bytes::copy_from_slice(stream);
        let chunks = crate::proxy::fixtures::cut_into_reads(&whole, cuts.iter().map(|c| *c as usize * whole.len() / 255).collect());
        for strip in [false, true] {
            let one = crate::proxy::fixtures::observe_sse(vec![whole.clone()], strip);
            let many = crate::proxy::fixtures::observe_sse(chunks.clone(), strip);
            assert_eq!(one, many, "strip {strip}: the reads changed what the client gets");
        }
    }

    /// The multipart form reader: where it accepts a form (cut into frames
    /// at `cuts`), the replica's parser reads the same `model` and
    /// `stream` from it, and no `priority` (its reference, written down
    /// from python-multipart's rules).
    pub fn form_reader(body: &[u8], boundary: &[u8], cuts: &[usize]) {
        if let Err(e) = crate::proxy::form::reference::agree(body, boundary, cuts) {
            panic!("{e}");
        }
    }

    /// The request-body reader: its quick and general paths agree.
    pub fn request_body(bytes: &[u8], usage: bool, priority: Option<i64>) {
        if let Err(e) = crate::proxy::body::paths_agree(bytes, usage, priority) {
            panic!("{e}");
        }
    }

    /// Context reduction: on any JSON object, the rewrite is a valid object
    /// no larger than the input plus the `max_tokens` it may add.
    pub fn reduce(bytes: &[u8], chat: bool) {
        let Ok(serde_json::Value::Object(mut o)) = serde_json::from_slice::<serde_json::Value>(bytes) else { return };
        let before = serde_json::to_vec(&o).map(|v| v.len()).unwrap_or(0);
        let limits = crate::reduce::Limits { max_tokens_cap: 64, max_documents: 2, max_prompt_tokens: 64 };
        crate::reduce::reduce(&mut o, chat, &limits);
        let after = serde_json::to_vec(&o).expect("a rewritten object serialises");
        assert!(after.len() <= before + ",\"max_tokens\":64,\"max_completion_tokens\":64".len(), "the rewrite grew the request");
    }

    /// The config parser: any text is a config or a list of problems, each
    /// naming a field or saying the file is not YAML; never a panic.
    pub fn config(text: &str) {
        if let Err(e) = crate::config::Config::parse(text) {
            assert!(!e.0.is_empty(), "an error with no problem in it");
        }
    }
}

pub use classify::KeyError;
pub use state::{PrepareError, ReloadError};
pub use upstream::tls::TlsError;
pub use upstream::PoolError;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use config::Config;
use state::{App, Snapshot};
use telemetry::Metrics;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("server.tls: {0}")]
    Tls(String),
    #[error(transparent)]
    Invalid(#[from] state::PrepareError),
    #[error("cannot read the listener's address: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("telemetry.access_log: cannot open it: {0}")]
    AccessLog(#[source] std::io::Error),
}

/// A running gateway: both listeners and the background tasks.
pub struct Gateway {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The endpoint picker's listener (`epp.listen`), when configured.
    pub epp_addr: Option<SocketAddr>,
    pub tls: bool,
    app: Arc<App>,
    tuning: server::Tuning,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Bind both listeners and start serving `config` (no file: reload is refused).
    pub async fn start(config: Config) -> Result<Gateway, StartError> {
        Self::start_with(config, None).await
    }

    /// Load `path` and serve it; `POST /-/reload` and SIGHUP read it again.
    pub async fn start_file(path: &std::path::Path) -> Result<Gateway, StartError> {
        let config = Config::load(path)?;
        Self::start_with(config, Some(path.to_path_buf())).await
    }

    async fn start_with(config: Config, path: Option<std::path::PathBuf>) -> Result<Gateway, StartError> {
        let metrics = Arc::new(Metrics::new(&config));
        let controls = Arc::new(admission::Controls::new(metrics.clone()));
        let snapshot = Snapshot::prepare(config, &metrics, &controls, None)?;
        let cfg = snapshot.config.clone();
        let tls = match &cfg.server.tls {
            Some(t) => Some(server::tls_acceptor(&t.cert, &t.key).map_err(StartError::Tls)?),
            None => None,
        };
        let epp_tls = match cfg.epp.as_ref().and_then(|e| e.tls.as_ref()) {
            Some(t) => Some(server::acceptor_of("epp.tls", &t.cert, &t.key, &[b"h2"]).map_err(StartError::Tls)?),
            None => None,
        };
        let backlog = cfg.server.listen_backlog;
        let bind = |addr: SocketAddr| async move { server::bind(addr, backlog).map_err(|source| StartError::Bind { addr, source }) };
        // As Envoy's endpoint picker alone (`epp.proxy: false`), no proxy listener.
        let data = match cfg.epp.as_ref().is_some_and(|e| !e.proxy) {
            true => None,
            false => Some(bind(cfg.server.listen).await?),
        };
        let admin = bind(cfg.server.admin_listen).await?;
        let data_addr = data.as_ref().map_or(Ok(cfg.server.listen), |d| d.local_addr()).map_err(StartError::LocalAddr)?;
        let admin_addr = admin.local_addr().map_err(StartError::LocalAddr)?;
        let epp = match &cfg.epp {
            Some(e) => Some(bind(e.listen).await?),
            None => None,
        };
        let epp_addr = epp.as_ref().map(|l| l.local_addr()).transpose().map_err(StartError::LocalAddr)?;

        let dir = path.as_deref().and_then(std::path::Path::parent);
        let access_log =
            telemetry::access_log::AccessLogSlot::start(cfg.telemetry.access_log.as_ref(), dir, metrics.access_log_dropped.clone())
                .map_err(StartError::AccessLog)?;
        let (stop, stop_rx) = watch::channel(false);
        let app = Arc::new(App::new(snapshot, metrics.clone(), controls.clone(), path, stop_rx.clone(), access_log));
        app.start_health_checks();
        let tuning = server::Tuning::new(&cfg.server);
        let mut background = vec![
            admission::publisher(controls, metrics.clone(), app.publisher_view(), stop_rx.clone()),
            fleet::run(app.fleet.clone(), metrics, app.fleet_view(), stop_rx.clone()),
            status::sampler(app.clone(), stop_rx.clone()),
            tokio::spawn(discovery::run(app.clone(), stop_rx.clone())),
        ];
        background.extend(tuning.start(stop_rx.clone()));
        let grace = cfg.server.shutdown_grace.get();
        let a = app.clone();
        let data_task = data.map(|data| {
            tokio::spawn(server::serve(
                data,
                tls.clone(),
                move |req: http::Request<hyper::body::Incoming>, client| {
                    proxy::handle(req.map(upstream::ClientBody::Hyper), a.clone(), client)
                },
                stop_rx.clone(),
                grace,
                tuning.clone(),
                server::Limits {
                    open: Some(app.metrics.open_connections.clone()),
                    waited: Some(app.metrics.connections_waited.clone()),
                    bodies: Some(app.metrics.request_body_bytes_held.clone()),
                    ..server::Limits::new(&cfg.server)
                },
            ))
        });
        let admin_service = admin::service(app.clone());
        let admin_task = tokio::spawn(server::serve(
            admin,
            None,
            move |req, _| admin::serve_one(admin_service.clone(), req),
            stop_rx,
            grace,
            server::Tuning::default(),
            server::Limits::new(&cfg.server),
        ));
        let mut servers: Vec<JoinHandle<()>> = data_task.into_iter().chain([admin_task]).collect();
        if let Some(listener) = epp {
            servers.push(tokio::spawn(epp::serve(listener, epp_tls, app.clone(), stop.subscribe())));
        }
        Ok(Gateway { data_addr, admin_addr, epp_addr, tls: tls.is_some(), app, tuning, stop, servers, background })
    }

    /// Requests in flight for busy polling, when `server.busy_poll` is on.
    pub fn busy_poll(&self) -> Option<Arc<server::busy::BusyPoll>> {
        self.tuning.busy.clone()
    }

    /// Reload the config file (as SIGHUP and `POST /-/reload` do).
    pub async fn reload(&self) -> Result<(), ReloadError> {
        self.app.reload().await
    }

    /// A handle that reloads this gateway's config file (for a signal handler).
    pub fn reloader(&self) -> Reloader {
        Reloader(self.app.clone())
    }

    /// The gateway's metrics (what the admin listener serves at `/metrics`);
    /// readable after shutdown too.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.app.metrics.clone()
    }

    /// Ready (a healthy replica in every pool) and serving `model`.
    pub fn serves(&self, model: &str) -> bool {
        let snap = self.app.snapshot();
        snap.ready() && snap.pool_for(model).is_some()
    }

    /// Stop accepting, let in-flight streams finish (up to `shutdown_grace`), stop.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for t in self.servers.drain(..) {
            let _ = t.await;
        }
        for t in self.background.drain(..) {
            t.abort();
        }
        self.app.stop_health_checks();
    }
}

/// Reloads a gateway's config file; see [`Gateway::reloader`].
#[derive(Clone)]
pub struct Reloader(Arc<App>);

impl Reloader {
    pub async fn reload(&self) -> Result<(), ReloadError> {
        self.0.reload().await
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.background {
            t.abort();
        }
        self.app.stop_health_checks();
    }
}
