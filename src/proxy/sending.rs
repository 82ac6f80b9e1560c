//! The sending stage: the request to a replica of its pool (retried on
//! another before any byte reached the client), or handed over to the
//! proxy in front when slogate is its endpoint picker; and what a failure
//! to send means for the client.

use std::sync::Arc;

use http::Response;

use super::form;
use super::headers::{build_upstream_request, Forwarded, Hop};
use super::observe::StreamTimeouts;
use super::tracker::Tracker;
use crate::admission::Lease;
use crate::error::GatewayError;
use crate::server::ClientAddr;
use crate::state::Snapshot;
use crate::upstream::{self, conn::UpstreamBody, SendBody, Upload, UploadFailure};

/// A request pinned to the replica holding its state (`owner`) that
/// could not reach it: the state is lost with it.
pub(super) fn lost(e: GatewayError, owner: Option<&(Arc<upstream::Replica>, String)>) -> GatewayError {
    match (e, owner) {
        (GatewayError::Upstream { .. }, Some((_, id))) => GatewayError::StateLost(id.clone()),
        (e, _) => e,
    }
}

/// Why sending failed (`e`), when an upload did not reach the replica
/// whole: the client's doing (408, 400), or an attempt that took part of it
/// and failed (502: not sent again, as it is not kept).
pub(super) fn upload_failed(e: GatewayError, upload: Option<&Upload>, snap: &Snapshot) -> GatewayError {
    match (upload.and_then(Upload::failure), e) {
        (Some(UploadFailure::Refused), _) => form::malformed(&upload.and_then(Upload::refusal).unwrap_or_default()),
        (Some(UploadFailure::Timeout), _) => GatewayError::BodyTimeout(snap.config.server.body_read_timeout),
        (Some(UploadFailure::Read), _) => GatewayError::BodyRead("the client's upload ended early or failed".into()),
        (Some(UploadFailure::Resend), GatewayError::Upstream { replica, url, source, .. }) => GatewayError::Upstream {
            replica,
            url,
            source,
            detail: "part of the upload went to a replica that failed; it is not kept, so it was not sent again".into(),
        },
        (_, e) => e,
    }
}

/// The sending stage: the request to a replica of `route`'s pool, retried
/// on another when it fails before any byte reached the client, until the
/// response headers (by the first-token budget for streams, the total
/// otherwise).
#[allow(clippy::too_many_arguments)]
pub(super) async fn send(
    parts: &http::request::Parts,
    client: &ClientAddr,
    body: SendBody,
    route: &crate::state::Route,
    mut lease: Attempt<'_>,
    t: &Tracker,
    snap: &Snapshot,
    stream: bool,
    timeouts: &StreamTimeouts,
) -> Result<Response<UpstreamBody>, GatewayError> {
    if let Some(relay) = parts.extensions.get::<upstream::Relay>() {
        // Behind Envoy (slogate its endpoint picker): Envoy sends it.
        // A form goes as the client sent it.
        let bytes = match body {
            SendBody::Bytes(b) => Some(b.unwrap_or_default()),
            SendBody::Upload(_) => None,
        };
        let mut replica = upstream::Attempts::replica(&lease).clone();
        // Where Envoy allows only some endpoints (its subset hint), the pick is among them.
        match relay.instead_of(&replica, &route.pool.replicas) {
            Ok(None) => {}
            Ok(Some(other)) if lease.lease.move_to(&other) => replica = other,
            _ => return Err(GatewayError::NoHealthyReplica { pool: route.pool.config.name.clone() }),
        }
        return relay.hand_over(&replica, bytes).await.map_err(GatewayError::Internal);
    }
    let header_deadline = t.start() + if stream { timeouts.first_token.min(timeouts.total) } else { timeouts.total };
    let json = matches!(&body, SendBody::Bytes(Some(b)) if !b.is_empty());
    let hop = Hop { strip_credentials: snap.classifier.has_keys(), json };
    let forwarded = Forwarded::of(parts, client);
    // The trace context, where the request is traced (a map of its own:
    // the request's head is written from the caller's map).
    let mut trace = http::HeaderMap::new();
    if !t.span().is_disabled() {
        crate::telemetry::otel::inject(t.span(), &mut trace);
    }
    let build =
        |replica: &upstream::Replica| Ok(build_upstream_request(parts, replica, body.clone(), hop, &forwarded, &t.request_id, &trace));
    upstream::send_with_retry(
        &route.pool,
        &mut lease,
        build,
        upstream::Reads::for_stream(stream),
        t.start(),
        header_deadline,
        t.start() + timeouts.total,
    )
    .await
}

/// The request's lease as the sending stage moves it: to another replica
/// when the first failed before any byte reached the client, unless the
/// request is pinned to its replica (its state is there).
pub(super) struct Attempt<'a> {
    pub(super) lease: &'a mut Lease,
    pub(super) pinned: bool,
}

impl upstream::Attempts for Attempt<'_> {
    fn replica(&self) -> &Arc<upstream::Replica> {
        upstream::Attempts::replica(&*self.lease)
    }

    fn move_to_another(&mut self) -> bool {
        !self.pinned && upstream::Attempts::move_to_another(self.lease)
    }
}
