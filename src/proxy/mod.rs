//! Forwarding: the data-plane handler.
//!
//! [`forward`] is the request path, one stage per room, data flowing one way:
//! 1. read the body and find the pool serving its `model` ([`route`]: 413
//!    past `max_request_body`, 400 if not JSON, 404 for an unknown model);
//! 2. admit ([`admission::admit`]): the class's breaker gate, then a replica
//!    slot, maybe after a wait in its tier's queue (429 + Retry-After, 503);
//! 3. reduce ([`crate::reduce`]): under TTFT pressure, rewrite the request to
//!    cost less;
//! 4. send ([`upstream::send_with_retry`]): a connect failure or a 5xx before
//!    any byte reached the client is retried once on another replica;
//! 5. observe: the response body becomes an [`observe::ObservedBody`], which
//!    owns the lease and the request's [`observe::Tracker`] until the stream
//!    ends or the client goes away.
//!
//! Classification (`crate::classify`) happens in [`handle`], before any of
//! them. The tracker travels by value; a stage that fails hands its error to
//! [`fail`], which counts the outcome once and answers in OpenAI's form.

pub(crate) mod body;
pub(crate) mod keepalive;
pub(crate) mod observe;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;
use tracing::Instrument;

use crate::admission::{self, Lease};
use crate::config::Tier;
use crate::error::{full, GatewayError, ProxyBody};
use crate::reduce::Limits;
use crate::state::{App, Route, Snapshot};
use crate::telemetry::metrics::ClassLabels;
use crate::telemetry::Outcome;
use crate::upstream::{self, conn::UpstreamBody};
use body::{Model, RequestBody};
use observe::{ObservedBody, StreamTimeouts, Tracker, Watched};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    /// Any other `/v1/*` POST that names a model.
    Other,
}

impl Endpoint {
    /// Generates text token by token (may stream, may be reduced, has a priority).
    fn generates(self) -> bool {
        matches!(self, Endpoint::Chat | Endpoint::Completions)
    }

    /// The GenAI operation name of its span.
    fn operation(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "text_completion",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Other => "other",
        }
    }
}

/// Handle one data-plane request: route by path, classify, then [`forward`].
pub(crate) async fn handle(req: Request<Incoming>, app: Arc<App>) -> Response<ProxyBody> {
    let start = Instant::now();
    let snap = app.snapshot();
    let endpoint = match (req.method(), req.uri().path()) {
        (&Method::GET, "/v1/models") => {
            return match snap.classifier.authenticate(req.headers()) {
                Ok(()) => models(&snap),
                Err(e) => e.into_response(),
            };
        }
        (&Method::POST, "/v1/chat/completions") => Endpoint::Chat,
        (&Method::POST, "/v1/completions") => Endpoint::Completions,
        (&Method::POST, "/v1/embeddings") => Endpoint::Embeddings,
        (&Method::POST, p) if p.starts_with("/v1/") && route_method(p).is_none() => Endpoint::Other,
        (m, p) => return GatewayError::no_route(m, p, route_method(p)).into_response(),
    };
    let (class, tenant) = match snap.classifier.classify(req.headers()) {
        Ok(c) => c,
        // No class yet: counted under the default class so 401s are visible.
        Err(e) => return fail(Tracker::new(app.metrics.clone(), snap.default_class(), start), e),
    };
    let mut tracker = Tracker::new(app.metrics.clone(), class.clone(), start);
    tracker.set_tenant(tenant);
    // One trace span per request, only when OTLP export is on.
    let span = if snap.config.telemetry.otlp_endpoint.is_some() {
        let span = crate::telemetry::otel::request_span(req.headers(), endpoint.operation());
        span.record("slogate.class", &*class.name);
        span.record("slogate.tier", class.tier.as_str());
        span
    } else {
        tracing::Span::none()
    };
    tracker.set_span(span.clone());
    match snap.config.server.queued_keepalive {
        None => forward(req, &snap, endpoint, tracker, None).instrument(span).await,
        // The rest of the path owns what it borrows, so its future can move
        // into a body that outlives this handler.
        Some(every) => {
            let streams = keepalive::Streams::default();
            let marks = streams.clone();
            let class = class.name.clone();
            let pending = Box::pin(async move { forward(req, &snap, endpoint, tracker, Some(&marks)).await }.instrument(span));
            keepalive::respond(pending, every.get(), streams, &class).await
        }
    }
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

/// The request path after classification: route, admit, reduce, send, observe.
async fn forward(
    req: Request<Incoming>,
    snap: &Snapshot,
    endpoint: Endpoint,
    mut t: Tracker,
    streams: Option<&keepalive::Streams>,
) -> Response<ProxyBody> {
    let (parts, body) = req.into_parts();
    let routed = stage!(t, route(body, &parts.headers, &parts.method, parts.uri.path(), snap, endpoint).await);
    t.set_model(&routed.model);
    t.set_streaming(routed.stream);
    if routed.stream {
        if let Some(s) = streams {
            s.mark();
        }
    }
    let class = t.class().clone();

    // Its prompt, estimated from the body (four bytes a token): what its
    // tenant's fair share is charged when it gets a slot (the rest, at its
    // end, from the replica's usage). Reserved against the key's tokens per
    // minute: that and the most it may generate.
    let prompt = routed.request.len() as u64 / 4;
    t.set_prompt_estimate(prompt);
    let max_output = routed.request.head().max_output.unwrap_or(snap.config.auth.default_max_tokens);
    let tokens = prompt + if endpoint.generates() { max_output } else { 0 };
    let tenant = t.tenant().cloned();
    if let Some(tenant) = tenant.as_ref().filter(|t| t.has_limits()) {
        match admission::limit(tenant, tokens).await {
            Ok((permit, state)) => t.set_permit(permit, state),
            Err(refused) => {
                let (e, state) = *refused;
                t.set_rate(state);
                return fail(t, e);
            }
        }
    }
    let claim = admission::Claim {
        share: tenant.map(|t| t.share()).unwrap_or_default(),
        tokens: prompt,
        fair: snap.classifier.has_keys(),
        ttft: (class.tier == Tier::Interactive).then(|| class.control.ttft_target()),
    };
    let admitted = admission::admit(&class.control, &routed.route.admission, routed.stream, routed.request.len() as u64, claim).await;
    let admitted = stage!(t, admitted);
    t.set_probe(admitted.probe);
    t.span().record("slogate.queue_ms", admitted.waited.as_secs_f64() * 1000.0);

    let Routed { mut request, route, stream, strip_usage, .. } = routed;
    // vLLM serves lower values first: interactive before batch, and among
    // interactive requests a tenant under its fair part before the others
    // (its prefill does not wait behind a heavy tenant's in the replica).
    let priority = (route.pool.config.upstream_priority && endpoint.generates()).then_some(match class.tier {
        Tier::Interactive if admitted.lease.under_share() => -1,
        Tier::Interactive => 0,
        Tier::Batch => 1,
    });
    let prepared = cpu_bound(request.len(), || {
        let reduced = reduce(&mut request, endpoint, snap, &t)?;
        Ok((reduced, request.into_bytes(strip_usage, priority)?))
    });
    let (reduced, body) = stage!(t, prepared);

    let timeouts = StreamTimeouts::of(&route.pool.config, &snap.config.server);
    // Until the response headers: the first-token budget for streams, the total otherwise.
    let header_deadline = t.start() + if stream { timeouts.first_token.min(timeouts.total) } else { timeouts.total };
    let mut lease = admitted.lease;
    let strip_auth = snap.classifier.has_keys();
    let forwarded = Forwarded::of(&parts);
    // Boxed: the sending stage's state is the largest of this path, and
    // inline it would be held by every request waiting in a queue above.
    let sent = Box::pin(upstream::send_with_retry(
        &route.pool,
        &mut lease,
        |replica| {
            let mut req = build_upstream_request(&parts, &replica.base, body.clone(), strip_auth, &forwarded)?;
            if !t.span().is_disabled() {
                crate::telemetry::otel::inject(t.span(), req.headers_mut());
            }
            Ok(req)
        },
        t.start(),
        header_deadline,
    ))
    .await;
    let resp = stage!(t, sent);
    observe(resp, t, lease, endpoint, timeouts, strip_usage, admitted.waited, reduced)
}

/// A stage failed: count the outcome (once, when the tracker drops) and
/// answer in OpenAI's error form.
fn fail(mut t: Tracker, e: GatewayError) -> Response<ProxyBody> {
    t.finish(e.outcome());
    t.span().record("http.response.status_code", e.status().as_u16());
    if e.status().is_server_error() {
        tracing::warn!(error = %e.for_log(), "request failed");
    }
    let mut resp = e.into_response();
    if let Some(state) = t.rate() {
        rate_headers(resp.headers_mut(), &state);
    }
    resp
}

/// OpenAI's rate-limit headers, for every response to a key with limits.
fn rate_headers(h: &mut HeaderMap, state: &admission::RateState) {
    let mut put = |name: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    if let Some(q) = state.requests {
        put("x-ratelimit-limit-requests", q.limit.to_string());
        put("x-ratelimit-remaining-requests", q.remaining.to_string());
        put("x-ratelimit-reset-requests", admission::tenants::reset_text(q.reset));
    }
    if let Some(q) = state.tokens {
        put("x-ratelimit-limit-tokens", q.limit.to_string());
        put("x-ratelimit-remaining-tokens", q.remaining.to_string());
        put("x-ratelimit-reset-tokens", admission::tenants::reset_text(q.reset));
    }
}

/// What routing found: the parsed body, its model and the pool serving it.
struct Routed<'a> {
    request: RequestBody,
    model: String,
    route: &'a Route,
    stream: bool,
    /// The client streams without asking for usage: slogate asks the
    /// replica for it and cuts it back out.
    strip_usage: bool,
}

/// Bodies from this size up are parsed and rewritten with the worker
/// thread handed over (see [`cpu_bound`]). Parsing runs at roughly a
/// gigabyte a second: below this, a body holds a worker for well under a
/// millisecond.
const LARGE_BODY: usize = 256 * 1024;

/// Run `f`, CPU work on a request body of `len` bytes. A large body takes
/// milliseconds to parse or rewrite; a worker busy with it would hold up
/// every stream whose next token waits on that worker, so for those the
/// worker's other tasks move to another thread first
/// ([`tokio::task::block_in_place`]). Small bodies, and a current-thread
/// runtime (tests), run inline.
fn cpu_bound<R>(len: usize, f: impl FnOnce() -> R) -> R {
    // The size first: most bodies are small and need no runtime lookup.
    let multi = || tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if len >= LARGE_BODY && multi() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// Read the body (only as far as routing needs) and find the pool.
async fn route<'a>(
    body: Incoming,
    headers: &HeaderMap,
    method: &Method,
    path: &str,
    snap: &'a Snapshot,
    endpoint: Endpoint,
) -> Result<Routed<'a>, GatewayError> {
    let server = &snap.config.server;
    let read = read_body(body, headers, server.max_request_body.0);
    let bytes = tokio::time::timeout(server.body_read_timeout.get(), read)
        .await
        .map_err(|_| GatewayError::BodyTimeout(server.body_read_timeout))??;
    let request = cpu_bound(bytes.len(), || RequestBody::parse(bytes))?;
    let head = request.head();
    let model = match &head.model {
        Model::Name(m) => m.clone(),
        Model::NotString => return Err(GatewayError::InvalidRequest { message: "`model` must be a string".into(), param: Some("model") }),
        Model::Missing if endpoint == Endpoint::Other => {
            return Err(GatewayError::NotFound { method: method.to_string(), path: path.to_string() });
        }
        Model::Missing => return Err(GatewayError::InvalidRequest { message: "`model` is required".into(), param: Some("model") }),
    };
    let route = snap.pool_for(&model).ok_or_else(|| GatewayError::ModelNotFound(model.clone()))?;
    let stream = endpoint.generates() && head.stream;
    let strip_usage = stream && !head.include_usage;
    Ok(Routed { request, model, route, stream, strip_usage })
}

/// Under TTFT pressure (the class's reduction trigger is on), rewrite a
/// generating request to cost less; the header value saying how, if it changed.
fn reduce(request: &mut RequestBody, endpoint: Endpoint, snap: &Snapshot, t: &Tracker) -> Result<Option<String>, GatewayError> {
    let class = t.class();
    if !class.control.reduction.active() || !endpoint.generates() {
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

/// The response to the client: the replica's, its body observed (the
/// tracker and the lease travel in it), slogate's headers added.
#[allow(clippy::too_many_arguments)]
fn observe(
    resp: Response<UpstreamBody>,
    mut tracker: Tracker,
    lease: Lease,
    endpoint: Endpoint,
    timeouts: StreamTimeouts,
    strip_usage: bool,
    waited: std::time::Duration,
    reduced: Option<String>,
) -> Response<ProxyBody> {
    let status = resp.status();
    let replica = lease.replica().public_name();
    let class_name = tracker.class().name.clone();
    let rate = tracker.rate();
    tracker.span().record("http.response.status_code", status.as_u16());
    tracker.attach_lease(lease, waited);
    let (mut rparts, rbody) = resp.into_parts();
    let is_sse = rparts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"));
    let body: ProxyBody = if !status.is_success() {
        tracker.finish(if status.is_server_error() { Outcome::upstream_error } else { Outcome::client_error });
        Watched::new(ObservedBody::passthrough(rbody, tracker, timeouts)).boxed_unsync()
    } else if is_sse {
        Watched::new(ObservedBody::sse(rbody, tracker, timeouts, strip_usage)).boxed_unsync()
    } else if endpoint == Endpoint::Other {
        Watched::new(ObservedBody::passthrough(rbody, tracker, timeouts)).boxed_unsync()
    } else {
        Watched::new(ObservedBody::json(rbody, tracker, timeouts)).boxed_unsync()
    };
    strip_hop_by_hop(&mut rparts.headers);
    if is_sse && strip_usage {
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    let h = &mut rparts.headers;
    if let Ok(v) = HeaderValue::from_str(&class_name) {
        h.insert(HeaderName::from_static("x-slogate-class"), v);
    }
    h.insert(HeaderName::from_static("x-slogate-replica"), replica);
    h.insert(HeaderName::from_static("x-slogate-queue-ms"), HeaderValue::from(waited.as_millis() as u64));
    if let Some(v) = reduced.and_then(|r| HeaderValue::from_str(&r).ok()) {
        h.insert(HeaderName::from_static("x-slogate-context-reduced"), v);
    }
    if let Some(state) = rate {
        rate_headers(h, &state);
    }
    Response::from_parts(rparts, body)
}

/// The method a data-plane path takes, for a request that used another
/// (405, as vLLM answers, rather than 404).
fn route_method(path: &str) -> Option<&'static str> {
    match path {
        "/v1/models" => Some("GET"),
        "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => Some("POST"),
        _ => None,
    }
}

fn models(snap: &Snapshot) -> Response<ProxyBody> {
    let mut data = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &snap.pools {
        for m in r.pool.model_objects() {
            if let Some(id) = m.get("id").and_then(|v| v.as_str()) {
                if seen.insert(id.to_string()) {
                    data.push(m);
                }
            }
        }
    }
    let body = serde_json::json!({"object": "list", "data": data});
    let mut resp = Response::new(full(serde_json::to_vec(&body).unwrap_or_default()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

async fn read_body(body: Incoming, headers: &HeaderMap, limit: u64) -> Result<Bytes, GatewayError> {
    if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()) {
        if len > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
    }
    match Limited::new(body, limit as usize).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(GatewayError::PayloadTooLarge { limit }),
        Err(e) => Err(GatewayError::BodyRead(e)),
    }
}

/// The request to a replica: the caller's headers but for hop-by-hop ones,
/// and but for `Authorization` when slogate checked it against its own keys
/// (a slogate key is not the replica's to see). The URI is in origin form
/// (`/v1/...`), with `Host` naming the replica.
fn build_upstream_request(
    parts: &http::request::Parts,
    base: &http::Uri,
    body: Bytes,
    strip_auth: bool,
    forwarded: &Forwarded,
) -> Result<Request<Full<Bytes>>, GatewayError> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    // A replica URL may carry a path prefix (`http://host/vllm`).
    let prefix = base.path().trim_end_matches('/');
    *req.uri_mut() = if prefix.is_empty() {
        parts.uri.path_and_query().map(|p| http::Uri::from(p.clone())).unwrap_or_else(|| http::Uri::from_static("/"))
    } else {
        format!("{prefix}{pq}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| GatewayError::Internal(format!("cannot build the replica's URI: {e}")))?
    };
    let h = req.headers_mut();
    if let Some(host) = base.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
        h.insert(header::HOST, host);
    }
    let named = connection_named(&parts.headers);
    for (k, v) in parts.headers.iter() {
        if k == header::HOST
            || k == header::CONTENT_LENGTH
            || is_hop_by_hop(k)
            || (strip_auth && k == header::AUTHORIZATION)
            || named.contains(k)
            || (forwarded.replaces(k))
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    if let Some(v) = &forwarded.x_forwarded_for {
        h.insert(X_FORWARDED_FOR, v.clone());
    }
    if let Some(v) = &forwarded.forwarded {
        h.insert(header::FORWARDED, v.clone());
    }
    Ok(req)
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-For` and `Forwarded` (RFC 7239) as the replica gets them:
/// what the client sent, with the client's address appended. Without a
/// known client address (no [`ClientAddr`](crate::server::ClientAddr)),
/// they pass through as sent.
struct Forwarded {
    x_forwarded_for: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
}

impl Forwarded {
    fn of(parts: &http::request::Parts) -> Forwarded {
        let Some(crate::server::ClientAddr(peer)) = parts.extensions.get::<crate::server::ClientAddr>().copied() else {
            return Forwarded { x_forwarded_for: None, forwarded: None };
        };
        let ip = peer.ip().to_canonical();
        let node = if ip.is_ipv6() { format!("\"[{ip}]\"") } else { ip.to_string() };
        Forwarded {
            x_forwarded_for: appended(&parts.headers, &X_FORWARDED_FOR, &ip.to_string()),
            forwarded: appended(&parts.headers, &header::FORWARDED, &format!("for={node}")),
        }
    }

    /// Is `k` a header this replaces (one the client's value goes into)?
    fn replaces(&self, k: &HeaderName) -> bool {
        (self.x_forwarded_for.is_some() && k == X_FORWARDED_FOR) || (self.forwarded.is_some() && k == header::FORWARDED)
    }
}

/// Every `name` header the client sent, joined by commas, then `element`.
fn appended(h: &HeaderMap, name: &HeaderName, element: &str) -> Option<HeaderValue> {
    let mut v = Vec::new();
    for sent in h.get_all(name) {
        let sent = sent.as_bytes().trim_ascii();
        if !sent.is_empty() {
            v.extend_from_slice(sent);
            v.extend_from_slice(b", ");
        }
    }
    v.extend_from_slice(element.as_bytes());
    HeaderValue::from_bytes(&v).ok()
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-connection"
    )
}

/// The headers a `Connection` header names: hop-by-hop for this hop only.
/// `keep-alive` (hop-by-hop anyway) is left out, so the usual
/// `Connection: keep-alive` costs no allocation.
fn connection_named(h: &HeaderMap) -> Vec<HeaderName> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.eq_ignore_ascii_case("keep-alive"))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect()
}

/// Remove hop-by-hop headers, including those named in `Connection`.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named = connection_named(h);
    for n in named {
        h.remove(n);
    }
    let hop: Vec<HeaderName> = h.keys().filter(|k| is_hop_by_hop(k)).cloned().collect();
    for n in hop {
        h.remove(n);
    }
}
