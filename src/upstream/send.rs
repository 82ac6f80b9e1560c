//! Sending a request to a replica, retried once on another when it fails
//! before any byte reached the client.

use std::sync::Arc;

use super::{conn, Pool, Replica};
use crate::error::GatewayError;

/// What a request's attempts are made on: the replica its slot is on now,
/// and a way to move the slot to another healthy replica for a retry.
/// Admission's lease implements it; this room never sees the lease.
pub(crate) trait Attempts {
    fn replica(&self) -> &Arc<Replica>;
    /// Move to a slot on another healthy replica; false when there is none.
    fn move_to_another(&mut self) -> bool;
}

/// Send a request to the replica `on` holds a slot on, retrying once on
/// another healthy replica when the request never reached it (connecting,
/// TLS or the HTTP handshake failed) or when it answered 5xx before any byte
/// reached the client (it refused the work). A request written to a replica
/// that then failed without answering is not sent again: the replica may be
/// generating it, and a second one would generate it twice. `request` builds the
/// request for a replica; the response headers must arrive by `deadline`
/// (`start` is when the gateway got the request, for the error message).
pub(crate) async fn send_with_retry<A: Attempts>(
    pool: &Pool,
    on: &mut A,
    request: impl Fn(&Replica) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, GatewayError>,
    start: tokio::time::Instant,
    deadline: tokio::time::Instant,
) -> Result<http::Response<conn::UpstreamBody>, GatewayError> {
    let connect_timeout = pool.config.timeouts.connect.get();
    let mut retried = false;
    loop {
        let replica = on.replica().clone();
        let req = request(&replica)?;
        let sent = tokio::time::timeout_at(deadline, conn::send(&replica, req, connect_timeout)).await;
        if let Ok(Ok(resp)) = &sent {
            if matches!(resp.status(), http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE) {
                // The learned limit backs off from a replica that refuses work.
                replica.note_refused();
            }
        }
        let failure = match sent {
            Err(_) => return Err(GatewayError::UpstreamTimeout { replica: replica.shown(), after: crate::config::Dur(deadline - start) }),
            Ok(Ok(resp)) if resp.status().is_server_error() && !retried => {
                if !on.move_to_another() {
                    return Ok(resp);
                }
                tracing::info!(replica = %replica.url, status = %resp.status(), "replica answered 5xx before any byte was sent; retrying on another replica");
                retried = true;
                continue;
            }
            Ok(Ok(resp)) => return Ok(resp),
            Ok(Err(e)) if e.was_sent() => return Err(replica.failed(e)),
            Ok(Err(e)) => replica.failed(e),
        };
        if retried || !on.move_to_another() {
            return Err(failure);
        }
        tracing::info!(error = %failure.for_log(), "retrying on another replica");
        retried = true;
    }
}
