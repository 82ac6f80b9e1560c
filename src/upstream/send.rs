//! Sending a request to a replica, retried once on another when it fails
//! before any byte reached the client.

use std::sync::Arc;

use super::{conn, Pool, Replica};
use crate::error::GatewayError;

/// The response came from a replica the request was sent to at this
/// instant, after the first sent it no response head in time: its
/// first-token budget counts from here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadRetried(pub(crate) tokio::time::Instant);

/// What a request's attempts are made on: the replica its slot is on now,
/// and a way to move the slot to another healthy replica for a retry.
/// Admission's lease implements it; this room never sees the lease.
pub(crate) trait Attempts {
    fn replica(&self) -> &Arc<Replica>;
    /// Move to a slot on another healthy replica; false when there is none.
    fn move_to_another(&mut self) -> bool;
}

/// Send a request to the replica `on` holds a slot on, retrying when it
/// failed before any byte reached the client:
/// - a request that went out on a kept-alive connection the replica closed
///   as it arrived (its idle timeout) is sent again to the same replica on
///   a new connection;
/// - otherwise once on another healthy replica: when the request never
///   reached the replica (connecting, TLS or the HTTP handshake failed),
///   when the replica closed the connection or reset it before its
///   response head (it died, or dropped the request: it is not generating
///   it, since nothing could read its answer), or when it answered 5xx (it
///   refused the work).
///
/// A request whose head did not come by `deadline` (the replica hangs, or
/// the network to it does) is sent once to another replica with the same
/// budget again, within `end` (the total timeout), its connection to the
/// first dropped (which cancels it there); its response then carries
/// [`HeadRetried`]. `request` builds the request for a replica, sent on a
/// connection that reads as `reads` says; `start` is
/// when the gateway got the request, for the error message.
pub(crate) async fn send_with_retry<A: Attempts>(
    pool: &Pool,
    on: &mut A,
    request: impl Fn(&Replica) -> Result<super::Outgoing, GatewayError>,
    reads: conn::Reads,
    start: tokio::time::Instant,
    mut deadline: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Result<http::Response<conn::UpstreamBody>, GatewayError> {
    let connect_timeout = pool.config.timeouts.connect.get();
    let (mut retried, mut fresh, mut head_retried) = (false, false, None);
    loop {
        let replica = on.replica().clone();
        let req = request(&replica)?;
        let mut sent = tokio::time::timeout_at(deadline, conn::send(&replica, req, connect_timeout, fresh, reads)).await;
        if sent.is_err() && !retried {
            let now = tokio::time::Instant::now();
            let again = (now + (deadline - start)).min(end);
            if again > now && on.move_to_another() {
                tracing::info!(replica = %replica.url, "no response head in time; sending to another replica");
                (deadline, retried, fresh, head_retried) = (again, true, false, Some(HeadRetried(now)));
                continue;
            }
        }
        if let (Ok(Ok(resp)), Some(at)) = (&mut sent, head_retried) {
            resp.extensions_mut().insert(at);
        }
        if let Ok(Ok(resp)) = &sent {
            replica.health.verdict.answered();
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
                (retried, fresh) = (true, false);
                continue;
            }
            Ok(Ok(resp)) => return Ok(resp),
            Ok(Err(e)) if e.idle_closed() && !fresh => {
                tracing::debug!(replica = %replica.url, error = %e, "sending again on a new connection");
                fresh = true;
                continue;
            }
            Ok(Err(e)) => {
                pool.connection_failed(&replica, e.refused(), &e.public_message());
                replica.failed(e)
            }
        };
        if retried || !on.move_to_another() {
            return Err(failure);
        }
        tracing::info!(error = %failure.for_log(), "retrying on another replica");
        (retried, fresh) = (true, false);
    }
}
