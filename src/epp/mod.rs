//! slogate as the endpoint picker (EPP) of an Envoy-based gateway: Envoy's
//! `ext_proc` gRPC service, and gRPC health for `liveness`, `readiness`
//! and the service's own name, on `epp.listen` (h2c, or TLS with
//! `epp.tls`: [`tls`]). Each request Envoy
//! sends is one [`exchange`]. The rules are docs/endpoint-picker.md's.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::state::App;

mod exchange;
mod tls;
mod wire;

/// How often the readiness that gRPC health reports is read again.
const READY_EVERY: Duration = Duration::from_secs(1);

/// The `ext_proc` service.
struct Epp {
    app: Arc<App>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Epp {
    type ProcessStream = Answers;

    async fn process(&self, request: Request<Streaming<ProcessingRequest>>) -> Result<Response<Answers>, Status> {
        let peer = request.remote_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        Ok(Response::new(Box::pin(exchange::run(self.app.clone(), peer, request.into_inner()))))
    }
}

/// Serve the EPP on `listener` (over TLS with `tls`) until `stop`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Arc<App>,
    mut stop: watch::Receiver<bool>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ExternalProcessorServer<Epp>>().await;
    health.set_service_status("liveness", ServingStatus::Serving).await;
    let ready = {
        let (app, health, mut stop) = (app.clone(), health.clone(), stop.clone());
        async move {
            loop {
                let status = if app.snapshot().ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
                health.set_service_status("readiness", status).await;
                tokio::select! {
                    _ = tokio::time::sleep(READY_EVERY) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    };
    let readiness = tokio::spawn(ready);
    // A message carries a whole request body (Envoy buffers it): well over
    // what the request path takes, so that a larger one gets its 413.
    let server = &app.snapshot().config.server;
    let largest = server.max_request_body.0.max(server.max_upload_body.0).saturating_mul(2).saturating_add(1 << 20);
    let service =
        ExternalProcessorServer::new(Epp { app: app.clone() }).max_decoding_message_size(usize::try_from(largest).unwrap_or(usize::MAX));
    let router = tonic::transport::Server::builder().add_service(health_service).add_service(service);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let served = match tls {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, stopped).await
        }
        Some(acceptor) => router.serve_with_incoming_shutdown(tls::incoming(listener, acceptor), stopped).await,
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "epp: the ext_proc listener failed");
    }
    readiness.abort();
}
