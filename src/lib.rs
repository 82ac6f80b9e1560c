//! slogate: an OpenAI-compatible streaming gateway for vLLM replicas that
//! measures TTFT, ITL and availability where the caller feels them.
//!
//! The request path, one way (see DESIGN.md):
//! `server` accepts → `classify` picks the SLO class → `proxy` reads the body
//! and finds the pool → `upstream` leases a replica slot → `proxy` forwards
//! and wraps the body in an observer → `telemetry` records one outcome when
//! the body ends or is dropped, and the lease is released with it.
//!
//! [`Gateway::start`] builds the whole service, so tests run it in-process.

pub mod admin;
pub mod admission;
pub mod capacity;
pub mod classify;
pub mod config;
pub mod error;
pub mod proxy;
pub mod reduce;
pub mod rules;
pub mod server;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
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
    Setup(String),
}

/// A running gateway: both listeners and the background tasks.
pub struct Gateway {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub tls: bool,
    pub app: Arc<App>,
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
        let config = Config::load(path).map_err(|e| StartError::Setup(e.0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n")))?;
        Self::start_with(config, Some(path.to_path_buf())).await
    }

    async fn start_with(config: Config, path: Option<std::path::PathBuf>) -> Result<Gateway, StartError> {
        let metrics = Arc::new(Metrics::new(&config));
        let controls = Arc::new(admission::Controls::new(metrics.clone()));
        let snapshot = Snapshot::prepare(config, &metrics, &controls, None).map_err(StartError::Setup)?;
        let cfg = snapshot.config.clone();
        let tls = match &cfg.server.tls {
            Some(t) => Some(server::tls_acceptor(&t.cert, &t.key).map_err(StartError::Setup)?),
            None => None,
        };
        let bind = |addr: SocketAddr| async move { TcpListener::bind(addr).await.map_err(|source| StartError::Bind { addr, source }) };
        let data = bind(cfg.server.listen).await?;
        let admin = bind(cfg.server.admin_listen).await?;
        let data_addr = data.local_addr().map_err(|e| StartError::Setup(e.to_string()))?;
        let admin_addr = admin.local_addr().map_err(|e| StartError::Setup(e.to_string()))?;

        let (stop, stop_rx) = watch::channel(false);
        let app = Arc::new(App::new(snapshot, metrics.clone(), controls.clone(), path, stop_rx.clone()));
        app.start_health_checks();
        let tuning = server::Tuning::new(&cfg.server);
        let mut background = vec![admission::publisher(controls, metrics, app.publisher_view(), stop_rx.clone())];
        background.extend(tuning.start(stop_rx.clone()));
        let grace = cfg.server.shutdown_grace.get();
        let a = app.clone();
        let data_task =
            tokio::spawn(server::serve(data, tls.clone(), move |req| proxy::handle(req, a.clone()), stop_rx.clone(), grace, tuning.clone()));
        let a = app.clone();
        let admin_task =
            tokio::spawn(server::serve(admin, None, move |req| admin::handle(req, a.clone()), stop_rx, grace, server::Tuning::default()));
        Ok(Gateway { data_addr, admin_addr, tls: tls.is_some(), app, tuning, stop, servers: vec![data_task, admin_task], background })
    }

    /// Requests in flight for busy polling, when `server.busy_poll` is on.
    pub fn busy_poll(&self) -> Option<Arc<server::busy::BusyPoll>> {
        self.tuning.busy.clone()
    }

    /// Reload the config file (as SIGHUP and `POST /-/reload` do).
    pub async fn reload(&self) -> Result<(), String> {
        self.app.reload().await
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

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.background {
            t.abort();
        }
        self.app.stop_health_checks();
    }
}
