//! Forwarding: the data-plane handler.
//!
//! [`handle`] finds what the request asks for ([`route::Target`]: an
//! inference endpoint, or a path an operator opened; anything else is 404)
//! and who asks ([`crate::classify`]: class, tenant, and what its key may
//! use), gives the request its id ([`request_id`]), then runs [`forward`],
//! the request path, one stage per room, data flowing one way:
//! 1. route ([`route::route`]): read the body, check the key may use its
//!    `model`, find the pool (413 past `max_request_body`, 400 if not JSON,
//!    403 for a model the key may not use, 404 for an unknown model);
//! 2. the key's own limits ([`crate::limits::limit`]: per minute, day, month,
//!    and at once; 429 with Retry-After);
//! 3. admit ([`admission::admit`]): the class's breaker gate, then a replica
//!    slot, maybe after a wait in its tier's queue (429 + Retry-After, 503);
//! 4. reduce ([`crate::reduce`]): under TTFT pressure, rewrite the request to
//!    cost less;
//! 5. send ([`upstream::send_with_retry`]): a failure before any byte reached
//!    the client (connect, a connection closed before the response head, a
//!    5xx, no head in time) is retried once on another replica;
//! 6. observe: the response body becomes an [`observe::ObservedBody`], which
//!    owns the lease and the request's [`tracker::Tracker`] until the stream
//!    ends or the client goes away.
//!
//! The tracker travels by value; a stage that fails hands its error to
//! [`fail`], which counts the outcome once and answers in OpenAI's form.
//! The path and its rooms are drawn in docs/architecture.md.

mod aside;
pub(crate) mod body;
mod compat;
#[doc(hidden)]
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fixtures;
pub(crate) mod form;
mod headers;
pub(crate) use headers::CREDENTIALS;
mod json;
pub(crate) mod keepalive;
pub(crate) mod observe;
pub(crate) mod request_id;
mod respond;
pub(crate) mod resume;
mod route;
mod sending;
mod stages;
pub(crate) mod tracker;
pub(crate) mod watchdog;

use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response};
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::Endpoint;
use crate::error::{GatewayError, ProxyBody};
use crate::server::ClientAddr;
use crate::state::{App, Snapshot};
use crate::telemetry::access_log::AccessRecord;
use crate::upstream::ClientBody;
use respond::fail;
use route::Target;
use tracker::Tracker;

/// The GenAI operation name of an endpoint's span.
fn operation(e: Endpoint) -> &'static str {
    match e {
        Endpoint::Chat => "chat",
        Endpoint::Completions => "text_completion",
        Endpoint::Embeddings => "embeddings",
        other => other.as_str(),
    }
}

/// Handle one data-plane request: find its target, classify, then [`forward`].
/// `client`: the connection's peer, for the forwarding headers.
///
/// An `async fn`, so that its future is small until it is first polled:
/// hyper moves it twice before that.
pub(crate) async fn handle(req: Request<ClientBody>, app: Arc<App>, client: Arc<ClientAddr>) -> Response<ProxyBody> {
    let start = Instant::now();
    let snap = app.snapshot();
    let id = request_id::of(req.headers());
    let req = compat::unprefixed(req);
    if let Some(resp) = compat::answer(&snap, req.method(), req.uri().path(), req.headers(), req.uri().query()) {
        return with_id(resp, &id);
    }
    let target = match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => return with_id(route::health(&snap), &id),
        (&Method::GET, "/v1/models") => {
            return match snap.classifier.authenticate(req.headers()) {
                Ok(grant) => with_id(route::models(&snap, &grant), &id),
                Err(e) => e.respond(Some(&id)),
            };
        }
        (m, p) if p.starts_with("/v1/responses/") => Target::stored(m, p),
        (&Method::POST, p) => Target::of(&snap, p),
        _ => None,
    };
    let Some(target) = target else {
        let (m, p) = (req.method(), req.uri().path());
        let e = GatewayError::no_route(m, p, route::route_method(p));
        log_unrouted(&app, &snap, req.headers(), &id, e.status().as_u16(), start);
        return e.respond(Some(&id));
    };
    if let Target::Stored(id) = &target {
        route::heard_of(&snap, id).await;
    }
    let flow = req.extensions().get::<crate::classify::FairnessId>();
    let caller = snap.classifier.classify_flow(req.headers(), target.endpoint(), flow);
    let caller = caller.and_then(|c| target.clone().permit(&snap, req.uri().path(), &c.grant).map(|t| (c, t)));
    // An opened path is an unknown path to a caller who may not call it (no
    // key, another key): nothing tells it the path is there.
    if let (Target::Opened(_), Err(GatewayError::Unauthorized | GatewayError::PathNotAllowed(_) | GatewayError::EndpointNotAllowed(_))) =
        (&target, &caller)
    {
        let (m, p) = (req.method(), req.uri().path());
        let e = GatewayError::no_route(m, p, route::route_method(p));
        log_unrouted(&app, &snap, req.headers(), &id, e.status().as_u16(), start);
        return e.respond(Some(&id));
    }
    let class = caller.as_ref().map_or_else(|_| snap.default_class(), |c| c.0.class.clone());
    // Without a class yet (a bad key) the request counts under the default class, so 401s are visible.
    let mut tracker = Tracker::new(app.metrics.clone(), class.clone(), start);
    tracker.set_request(id, target.endpoint(), app.access_log.current());
    let caller = match caller {
        Ok(c) => c,
        Err(e) => return fail(tracker, e),
    };
    tracker.set_tenant(caller.0.tenant.clone());
    // One trace span per request, only when OTLP export is on.
    let span = if snap.config.telemetry.otlp_endpoint.is_some() {
        let span = crate::telemetry::otel::request_span(req.headers(), operation(target.endpoint()));
        span.record("slogate.class", &*class.name);
        span.record("slogate.tier", class.tier.as_str());
        span
    } else {
        tracing::Span::none()
    };
    tracker.set_span(span.clone());
    let (caller, target) = caller;
    let keepalive = snap.config.server.queued_keepalive;
    let mut f = stages::Forwarding { req, client, snap, target, caller, tracker, streams: None, watchlist: app.watchlist.clone() };
    match keepalive {
        // Without a span (no trace export) the forwarding is not wrapped
        // in one: the wrapping is a copy of its future.
        None if span.is_disabled() => stages::forward(f).await,
        None => stages::forward(f).instrument(span).await,
        // The forwarding owns what it uses, so its future can move into a
        // body that outlives this handler.
        Some(every) => {
            let streams = keepalive::Streams::default();
            f.streams = Some(streams.clone());
            let (class, id) = (class.header.clone(), f.tracker.request_id.clone());
            let pending = Box::pin(stages::forward(f).instrument(span));
            keepalive::respond(pending, every.get(), streams, class, id).await
        }
    }
}

/// A request for a path slogate does not serve (404, 405): nothing of it
/// is routed or counted in the metrics, but it has its access log line, so
/// an auditor sees who tried what (a tenant probing an engine's management
/// endpoints, say).
fn log_unrouted(app: &App, snap: &Snapshot, headers: &http::HeaderMap, id: &HeaderValue, status: u16, start: Instant) {
    let Some(log) = app.access_log.current() else { return };
    let tenant = snap.classifier.classify(headers, Endpoint::Other).ok().map(|c| c.tenant.name.clone());
    log.log(AccessRecord::unrouted(id.clone(), tenant, snap.default_class().name.clone(), status, start.elapsed()));
}

/// A response slogate made, with the request's id.
fn with_id(mut resp: Response<ProxyBody>, id: &HeaderValue) -> Response<ProxyBody> {
    resp.headers_mut().insert(request_id::X_REQUEST_ID, id.clone());
    resp
}

#[cfg(test)]
mod tests {
    fn size3<A, B, C, F: std::future::Future>(_: impl Fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }
    fn size7<A, B, C, D, E, G, H, F: std::future::Future>(_: impl Fn(A, B, C, D, E, G, H) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Each request's future is moved into a box as hyper calls the
    /// service, every byte of it copied, whatever state the request will
    /// use: a rare stage's state inline (a form's reading, exact mode's
    /// tokenizing) made every short request copy 7.9 KB. Those are boxed
    /// where they run; this keeps them so (4.9 KB and 0.7 KB when written).
    #[test]
    fn the_request_path_futures_stay_small() {
        let (handle, route) = (size3(super::handle), size7(super::route::route));
        assert!(handle <= 6 * 1024, "the request handler's future is {handle} bytes");
        assert!(route <= 1024, "the routing stage's future is {route} bytes");
    }
}
