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
//! 2. the key's own limits ([`admission::limit`]: per minute, day, month,
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
pub(crate) mod resume;
mod route;
mod sending;
pub(crate) mod tracker;
pub(crate) mod watchdog;

use std::future::Future;
use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::admission::{self, Lease};
use crate::classify::Caller;
use crate::config::Endpoint;
use crate::error::{GatewayError, ProxyBody};
use crate::reduce::Limits;
use crate::server::bodies::BodyHold;
use crate::server::ClientAddr;
use crate::state::{App, Snapshot};
use crate::sync::Watchlist;
use crate::telemetry::access_log::AccessRecord;
use crate::telemetry::metrics::ClassLabels;
use crate::telemetry::Outcome;
use crate::upstream::{self, conn::UpstreamBody, ClientBody, SendBody};
use body::RequestBody;
use observe::{ObservedBody, StreamTimeouts};
use route::{generates, Routed, Target};
use sending::{lost, send, upload_failed, Attempt};
use tracker::Tracker;
use watchdog::Watched;

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
    let watchlist = app.watchlist.clone();
    match snap.config.server.queued_keepalive {
        // Without a span (no trace export) the forwarding is not wrapped
        // in one: the wrapping is a copy of its future.
        None if span.is_disabled() => forward(req, client, snap, target, caller, tracker, None, watchlist).await,
        None => forward(req, client, snap, target, caller, tracker, None, watchlist).instrument(span).await,
        // The forwarding owns what it uses, so its future can move into a
        // body that outlives this handler.
        Some(every) => {
            let streams = keepalive::Streams::default();
            let marks = streams.clone();
            let (class, id) = (class.name.clone(), tracker.request_id.clone());
            let pending = Box::pin(forward(req, client, snap, target, caller, tracker, Some(marks), watchlist).instrument(span));
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

/// A stage's result, or the answer to the client when it failed.
macro_rules! stage {
    ($tracker:ident, $result:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => return fail($tracker, e),
        }
    };
}

/// The request path after classification: route, the key's limits, admit,
/// reduce, send, observe (the response body on `watchlist`).
///
/// Written as a function returning its future, not an `async fn`: an
/// `async fn` keeps its arguments twice in its state (as given, and as
/// moved into its body), the request's head (224 bytes) among them, copied
/// on the first poll and with every move of the future.
#[allow(clippy::too_many_arguments)]
fn forward(
    req: Request<ClientBody>,
    client: Arc<ClientAddr>,
    snap: Arc<Snapshot>,
    target: Target,
    caller: Caller,
    mut t: Box<Tracker>,
    streams: Option<keepalive::Streams>,
    watchlist: Arc<Watchlist>,
) -> impl Future<Output = Response<ProxyBody>> {
    let (parts, body) = req.into_parts();
    async move {
        let (client, snap, watchlist) = (&client, &*snap, &watchlist);
        let endpoint = target.endpoint();
        // Its key's max_concurrent before its body is read, and the body's bytes held against the listener's and the connection's budgets.
        let reading = stage!(
            t,
            caller.tenant.start_reading().map_err(|(max, state)| {
                t.set_rate(state);
                admission::concurrent_error(max)
            })
        );
        let mut hold = body_hold(client, &snap.config.server);
        let routed = route::route(body, &parts.headers, parts.uri.path(), snap, &target, &caller.grant, &mut hold).await;
        let routed = stage!(t, routed);
        t.hold_body(hold);
        t.set_bytes_in(routed.bytes_in());
        if let Some(m) = &routed.model {
            t.set_model(m);
        }
        t.set_streaming(routed.stream);
        if let (true, Some(s)) = (routed.stream, streams) {
            s.mark();
        }
        // What its tenant's fair share is charged at once (the rest from the replica's usage).
        let prompt = routed.request.prompt_estimate();
        t.set_prompt_estimate(prompt);
        stage!(t, key_limits(&mut t, &caller, &routed, endpoint, snap).await);
        drop(reading);
        let owner = stage!(t, follow_up(&mut t, &routed, endpoint, &caller).await);
        let mut claim =
            admission::Claim::of(&caller.tenant, &caller.class.control, prompt, snap.classifier.has_keys(), endpoint.is_short());
        claim.deadline = stage!(t, headers::deadline(&parts.headers)).map(|d| t.start() + d);
        let (bytes, key, admission) = (routed.request.len() as u64, routed.key.clone(), &routed.route.admission);
        let admitted = admission::admit(&caller.class.control, admission, &caller.tenant.name, routed.stream, bytes, claim, key).await;
        let mut admitted = stage!(t, admitted);
        if let Some((owner, id)) = &owner {
            stage!(t, if admitted.lease.move_to(owner) { Ok(()) } else { Err(GatewayError::StateLost(id.clone())) });
        }
        t.set_probe(admitted.probe);
        t.span().record("slogate.queue_ms", admitted.waited.as_secs_f64() * 1000.0);

        let Routed { mut request, route, stream, strip_usage, upload, stored, .. } = routed;
        // The gateway's priority (where the pool asks) and the key's cache salt where vLLM reads them; a caller's own priority never goes on.
        let engine_reads = generates(endpoint) || endpoint == Endpoint::Responses;
        let priority = (route.pool.config.upstream_priority && engine_reads).then(|| admitted.lease.upstream_priority(caller.class.tier));
        let salt = caller.grant.cache_salt.as_deref().filter(|_| engine_reads);
        let prepared = route::cpu_bound(request.len(), || {
            let reduced = reduce(&mut request, endpoint, snap, &t)?;
            let served = route.pool.config.served_model.as_deref();
            Ok((reduced, request.head().max_output, request.into_bytes(strip_usage, priority, salt, served)?))
        });
        let (reduced, max_output, body) = stage!(t, prepared);

        let timeouts = StreamTimeouts::of(&route.pool.config, &snap.config.server);
        let mut lease = admitted.lease;
        // Boxed: the sending stage's state is the largest of this path, and
        // inline it would be held by every request waiting in a queue above.
        let payload = upload.as_ref().map_or_else(|| SendBody::from(body.clone()), |u| SendBody::from(u.clone()));
        let on = Attempt { lease: &mut lease, pinned: owner.is_some() };
        let sent = Box::pin(send(&parts, client, payload, route, on, &t, snap, stream, &timeouts)).await;
        let resp = stage!(t, sent.map_err(|e| lost(upload_failed(e, upload.as_ref(), snap), owner.as_ref())));
        let preempt = Preempting::of(route, &caller.class, stream, admitted.waited, (prompt, max_output), t.start());
        let preempts = matches!(preempt, Preempting::Victim(..));
        let resume = stream.then(|| resumable(parts, client, body, route, endpoint, snap, &t, preempts)).flatten();
        let passthrough = stored.is_some();
        let settings = Settings { timeouts, strip_usage, waited: admitted.waited, reduced, resume, passthrough, preempt };
        observe(resp, t, lease, endpoint, settings, watchlist)
    }
}

/// The hold of a request's body bytes against its listener's budget
/// (`max_buffered_body_bytes`) and its connection's (`max_upload_body` +
/// `max_request_body`): docs/access.md, rule 18.
fn body_hold(client: &ClientAddr, server: &crate::config::ServerConfig) -> BodyHold {
    let per_connection = server.max_upload_body.0.saturating_add(server.max_request_body.0);
    BodyHold::new(client.bodies.clone(), client.held.clone(), server.max_buffered_body_bytes.0, per_connection)
}

/// A chat, completions or Messages stream, continued on another replica of its pool
/// if it breaks ([`resume`]): unless resuming is off or the pool has no
/// other replica. `preempts`: a batch stream that may be preempted, which
/// goes on on its own pool's next slot whatever these say.
#[allow(clippy::too_many_arguments)]
fn resumable(
    parts: http::request::Parts,
    client: &Arc<ClientAddr>,
    body: bytes::Bytes,
    route: &crate::state::Route,
    endpoint: Endpoint,
    snap: &Snapshot,
    t: &Tracker,
    preempts: bool,
) -> Option<resume::Resume<UpstreamBody>> {
    let attempts = route.pool.config.resume.max_attempts;
    // Relayed (behind Envoy): the stream is Envoy's to send on; it cannot be spliced here.
    if parts.extensions.get::<upstream::Relay>().is_some() {
        return None;
    }
    let kind = match endpoint {
        Endpoint::Chat => resume::Kind::Chat,
        Endpoint::Completions => resume::Kind::Completions,
        Endpoint::Messages => resume::Kind::Messages,
        _ => return None,
    };
    if (attempts == 0 || route.pool.replicas.len() < 2) && !preempts {
        return None;
    }
    let link = resume::PoolLink {
        parts,
        client: client.clone(),
        pool: route.pool.clone(),
        strip_auth: snap.classifier.has_keys(),
        request_id: t.request_id.clone(),
    };
    Some(resume::Resume::new(Box::new(link), body, kind, attempts))
}

/// A follow-up to a stored response (the Responses API's
/// `previous_response_id`) must go where its state is: the replica that
/// made it, when the gateway saw it made, with the id (docs/design/responses.md).
/// Another tenant's response is as unknown as one never made (404); one
/// whose replica is gone is lost (410, `state_lost`). A Responses request
/// teaches the gateway the owner of the response it makes.
async fn follow_up(
    t: &mut Tracker,
    routed: &Routed<'_>,
    endpoint: Endpoint,
    caller: &Caller,
) -> Result<Option<(Arc<upstream::Replica>, String)>, GatewayError> {
    if endpoint != Endpoint::Responses {
        return Ok(None);
    }
    if let Some(stored) = &routed.stored {
        return Ok(Some(stored.clone()));
    }
    let owners = &routed.route.pool.owners;
    t.learn_responses(owners.clone(), caller.tenant.name.clone());
    let Some(id) = routed.request.head().previous_response_id.as_deref() else { return Ok(None) };
    match owners.get_soon(id).await {
        // Unknown to the gateway (made before it started, or elsewhere): the replicas decide.
        None => Ok(None),
        Some(o) if *o.tenant != *caller.tenant.name => Err(GatewayError::ResponseNotFound(id.to_string())),
        Some(o) => Ok(Some((o.replica, id.to_string()))),
    }
}

/// The key's own limits (`auth.keys[].limits`): the request's worst case
/// ([`reservation`]) reserved against them, or the 429. The key's quotas
/// go to the response's headers either way.
async fn key_limits(
    t: &mut Tracker,
    caller: &Caller,
    routed: &Routed<'_>,
    endpoint: Endpoint,
    snap: &Snapshot,
) -> Result<(), GatewayError> {
    // A stored response's own routes make nothing: its key's limits count its making.
    if !caller.tenant.has_limits() || routed.stored.is_some() {
        return Ok(());
    }
    let context = routed.model.as_deref().and_then(|m| routed.route.pool.max_model_len(m));
    let tokens = reservation(&routed.request, endpoint, context, snap.config.auth.default_max_tokens);
    match admission::limit(&caller.tenant, tokens).await {
        Ok((permit, state)) => {
            t.set_permit(permit, state);
            Ok(())
        }
        Err(refused) => {
            let (e, state) = *refused;
            t.set_rate(state);
            Err(e)
        }
    }
}

/// The most a request can take from its key's tokens (docs/access.md,
/// rule 9): its prompt (estimated at four bytes a token) and, for an
/// endpoint that generates, its output limit (`max_completion_tokens`,
/// `max_tokens`, or the Responses API's `max_output_tokens`; none, or more
/// than the model's context: the context its replicas state, else
/// `default_max_tokens`) for each answer it asks for (`n`, `best_of`, each
/// prompt of a list). Saturating, and at most 2^53 (exact wherever it is counted).
fn reservation(request: &body::RequestBody, endpoint: Endpoint, context: Option<u64>, default_max_tokens: u64) -> u64 {
    let head = request.head();
    let limit = match endpoint {
        Endpoint::Chat | Endpoint::Completions | Endpoint::Messages => head.max_output,
        Endpoint::Responses => head.max_output_tokens,
        Endpoint::Transcription => None,
        _ => return request.prompt_estimate().min(MAX_RESERVE),
    };
    let each = match (limit, context) {
        (Some(l), Some(c)) => l.min(c),
        (Some(l), None) => l,
        (None, Some(c)) => c,
        (None, None) => default_max_tokens,
    };
    request.prompt_estimate().saturating_add(each.saturating_mul(head.answers)).min(MAX_RESERVE)
}

/// The largest reservation: 2^53, exact as a float (the limit store counts in Lua's numbers).
const MAX_RESERVE: u64 = 1 << 53;

/// A stage failed: count the outcome (once, when the tracker drops) and
/// answer in OpenAI's error form, with the request's id.
fn fail(mut t: Box<Tracker>, e: GatewayError) -> Response<ProxyBody> {
    t.finish(e.outcome());
    t.set_status(e.status().as_u16());
    t.span().record("http.response.status_code", e.status().as_u16());
    if e.status().is_server_error() {
        tracing::warn!(request_id = t.request_id.to_str().unwrap_or(""), error = %e.for_log(), "request failed");
    }
    let mut resp = match t.endpoint() {
        Endpoint::Messages => e.respond_anthropic(Some(&t.request_id)),
        _ => e.respond(Some(&t.request_id)),
    };
    if let Some(state) = t.rate() {
        headers::rate_headers(resp.headers_mut(), &state);
    }
    resp
}

/// Under TTFT pressure (the class's reduction trigger is on), rewrite a
/// generating request to cost less; the header value saying how, if it changed.
fn reduce(request: &mut RequestBody, endpoint: Endpoint, snap: &Snapshot, t: &Tracker) -> Result<Option<String>, GatewayError> {
    let class = t.class();
    if !class.control.reduction.active() || !generates(endpoint) {
        return Ok(None);
    }
    let limits = Limits::from_config(&snap.config.context_reduction);
    let changes = crate::reduce::reduce(request.object()?, endpoint == Endpoint::Chat, &limits);
    if changes.is_empty() {
        return Ok(None);
    }
    t.metrics().context_reduced.get_or_create(&ClassLabels { class: class.name.to_string() }).inc();
    request.mark_changed();
    Ok(Some(changes.header()))
}

/// Does the response's Content-Type name `media`?
fn content_type_is(h: &http::HeaderMap, media: &str) -> bool {
    h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with(media))
}

/// How the response body is observed, and what slogate says of it.
struct Settings {
    timeouts: StreamTimeouts,
    strip_usage: bool,
    waited: std::time::Duration,
    reduced: Option<String>,
    resume: Option<resume::Resume<UpstreamBody>>,
    /// A stored response's own route: its answer is passed on unread (a
    /// retrieved response's usage was counted when it was made).
    passthrough: bool,
    /// Its part in preemption (docs/design/preemption.md).
    preempt: Preempting,
}

/// A stream's part in preemption, where its pool preempts
/// (docs/design/preemption.md).
enum Preempting {
    None,
    /// A batch stream, which may give its slot up: its prompt and `max_tokens`.
    Victim(u64, Option<u64>),
    /// An interactive stream that took a slot without waiting: with no
    /// first token by then (it waits inside the engine), it asks a batch
    /// stream on its replica for a slot (rule 1).
    Asks(tokio::time::Instant),
}

impl Preempting {
    fn of(
        route: &crate::state::Route,
        class: &crate::classify::Class,
        stream: bool,
        waited: std::time::Duration,
        (prompt, max): (u64, Option<u64>),
        start: tokio::time::Instant,
    ) -> Preempting {
        use crate::config::Tier;
        match class.tier {
            _ if !route.pool.config.preempts() => Preempting::None,
            Tier::Batch => Preempting::Victim(prompt, max),
            Tier::Interactive if stream && waited.is_zero() => {
                Preempting::Asks(start + class.ttft.mul_f64(crate::admission::preempt::IN_ENGINE_AT))
            }
            Tier::Interactive => Preempting::None,
        }
    }
}

/// The response to the client: the replica's, its body observed (the
/// tracker and the lease travel in it), slogate's headers added.
fn observe(
    resp: Response<UpstreamBody>,
    mut tracker: Box<Tracker>,
    lease: Lease,
    endpoint: Endpoint,
    s: Settings,
    list: &Arc<Watchlist>,
) -> Response<ProxyBody> {
    let status = resp.status();
    let replica = lease.replica().public_name();
    let class_name = tracker.class().name.clone();
    let rate = tracker.rate();
    let id = tracker.request_id.clone();
    tracker.span().record("http.response.status_code", status.as_u16());
    tracker.set_status(status.as_u16());
    tracker.attach_lease(lease, s.waited);
    let (mut rparts, rbody) = resp.into_parts();
    let is_sse = content_type_is(&rparts.headers, "text/event-stream");
    let t = s.timeouts;
    let body: ProxyBody = if s.passthrough || !status.is_success() {
        let outcome = match status {
            st if st.is_success() => Outcome::ok,
            st if st.is_server_error() => Outcome::upstream_error,
            _ => Outcome::client_error,
        };
        tracker.finish(outcome);
        Watched::new(ObservedBody::passthrough(rbody, tracker, t), list).boxed_unsync()
    } else if is_sse {
        let mut body = match s.resume {
            Some(resume) => ObservedBody::resumable(rbody, tracker, t, s.strip_usage, resume),
            None => ObservedBody::sse(rbody, tracker, t, s.strip_usage),
        };
        match s.preempt {
            Preempting::Victim(prompt, max) => body.preemptible(prompt, max),
            Preempting::Asks(at) => body.asks_at(at),
            Preempting::None => {}
        }
        if let Some(upstream::HeadRetried(at)) = rparts.extensions.get() {
            body.first_token_from(*at);
        }
        Watched::new(body, list).boxed_unsync()
    } else if endpoint == Endpoint::Speech {
        Watched::new(ObservedBody::audio(rbody, tracker, t), list).boxed_unsync()
    } else if matches!(
        endpoint,
        Endpoint::Chat | Endpoint::Completions | Endpoint::Embeddings | Endpoint::Responses | Endpoint::Messages | Endpoint::Rerank
    ) || (endpoint == Endpoint::Transcription && content_type_is(&rparts.headers, "application/json"))
    {
        let usage_only = matches!(endpoint, Endpoint::Embeddings | Endpoint::Rerank);
        Watched::new(ObservedBody::json(rbody, tracker, t, usage_only), list).boxed_unsync()
    } else {
        Watched::new(ObservedBody::passthrough(rbody, tracker, t), list).boxed_unsync()
    };
    headers::strip_hop_by_hop(&mut rparts.headers);
    if is_sse && s.strip_usage {
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    let said = headers::Said {
        class: &class_name,
        replica: Some(replica),
        waited_ms: s.waited.as_millis() as u64,
        reduced: s.reduced,
        rate,
        request_id: &id,
    };
    headers::add_said(&mut rparts.headers, said);
    Response::from_parts(rparts, body)
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
