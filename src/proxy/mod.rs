//! Forwarding: the data-plane handler.
//!
//! Order of work for one request (data flows one way):
//! 1. classify (`crate::classify`): class and tier, or 400/401/403;
//! 2. read the body (413 past `max_request_body`, 400 if not JSON) and find
//!    the pool serving its `model` (404 otherwise);
//! 3. ask the replica for usage when the client streams without it;
//! 4. lease a slot on a replica (`crate::upstream`): 503 when none is
//!    healthy, 429 when all slots are taken;
//! 5. send; a connect failure or a 5xx before any byte reached the client
//!    is retried once on another healthy replica;
//! 6. wrap the response body in an [`observe::ObservedBody`], which owns the
//!    lease and the request's [`observe::Tracker`] until the stream ends.

mod body;
pub mod observe;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::admission::breaker::Gate;
use crate::admission::queue::{Admitted, Refusal};
use crate::classify::Class;
use crate::config::{Dur, Tier};
use crate::error::{full, GatewayError, ProxyBody};
use crate::reduce::Limits;
use crate::state::{App, Snapshot};
use crate::telemetry::metrics::{ClassLabels, Metrics};
use crate::telemetry::Outcome;
use crate::upstream::Pool;
use body::{Model, RequestBody};
use observe::{ObservedBody, StreamTimeouts, Tracker};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    /// Any other `/v1/*` POST that names a model.
    Other,
}

/// Handle one data-plane request.
pub async fn handle(req: Request<Incoming>, app: Arc<App>) -> Response<ProxyBody> {
    let start = Instant::now();
    // In flight from here until the response body ends (busy polling).
    let active = app.busy.as_ref().map(|b| b.enter());
    let snap = app.snapshot();
    let endpoint = match (req.method(), req.uri().path()) {
        (&Method::GET, "/v1/models") => return models(&snap),
        (&Method::POST, "/v1/chat/completions") => Endpoint::Chat,
        (&Method::POST, "/v1/completions") => Endpoint::Completions,
        (&Method::POST, "/v1/embeddings") => Endpoint::Embeddings,
        (&Method::POST, p) if p.starts_with("/v1/") && route_method(p).is_none() => Endpoint::Other,
        (m, p) => return GatewayError::no_route(m, p, route_method(p)).into_response(),
    };
    let class = match snap.classifier.classify(req.headers()) {
        Ok(c) => c,
        Err(e) => {
            // No class yet: count it under the default class so 401s are visible.
            let mut t = Tracker::new(app.metrics.clone(), snap.default_class(), start);
            t.finish(e.outcome());
            return e.into_response();
        }
    };
    let mut t = Tracker::new(app.metrics.clone(), class.clone(), start);
    if let Some(a) = active {
        t.hold_active(a);
    }
    // One trace span per request, only when OTLP export is on.
    let span = if snap.config.telemetry.otlp_endpoint.is_some() {
        let operation = match endpoint {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "text_completion",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Other => "other",
        };
        let span = crate::telemetry::otel::request_span(req.headers(), operation);
        span.record("slogate.class", &*class.name);
        span.record("slogate.tier", class.tier.as_str());
        span
    } else {
        tracing::Span::none()
    };
    t.set_span(span.clone());
    let mut tracker = Some(t);
    let result = {
        use tracing::Instrument;
        forward(req, &snap, &app.metrics, endpoint, &mut tracker).instrument(span.clone()).await
    };
    match result {
        Ok(resp) => resp,
        Err(e) => {
            if let Some(mut t) = tracker.take() {
                t.finish(e.outcome());
            }
            span.record("http.response.status_code", e.status().as_u16());
            if e.status().is_server_error() {
                tracing::warn!(error = %e, "request failed");
            }
            e.into_response()
        }
    }
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
    for pool in &snap.pools {
        for m in pool.model_objects() {
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

async fn forward(
    req: Request<Incoming>,
    snap: &Snapshot,
    metrics: &Metrics,
    endpoint: Endpoint,
    tracker: &mut Option<Tracker>,
) -> Result<Response<ProxyBody>, GatewayError> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, &parts.headers, snap.config.server.max_request_body.0).await?;
    let mut request = RequestBody::parse(bytes)?;
    let head = request.head();
    let model = match &head.model {
        Model::Name(m) => m.clone(),
        Model::NotString => return Err(GatewayError::InvalidRequest { message: "`model` must be a string".into(), param: Some("model") }),
        Model::Missing if endpoint == Endpoint::Other => {
            return Err(GatewayError::NotFound { method: parts.method.to_string(), path: parts.uri.path().to_string() });
        }
        Model::Missing => return Err(GatewayError::InvalidRequest { message: "`model` is required".into(), param: Some("model") }),
    };
    let pool = snap.pool_for(&model).ok_or_else(|| GatewayError::ModelNotFound(model.clone()))?;
    let stream = matches!(endpoint, Endpoint::Chat | Endpoint::Completions) && head.stream;
    let client_wants_usage = head.include_usage;
    let strip_usage = stream && !client_wants_usage;
    let Some(t) = tracker.as_mut() else {
        return Err(GatewayError::InvalidRequest { message: "internal: request tracker missing".into(), param: None });
    };
    t.set_model(&model);
    t.set_streaming(stream);
    let class = t.class().clone();

    // Admission: the class's breaker gate, then a slot (maybe after a wait).
    match class.control.breaker.admit() {
        Gate::Pass => {}
        Gate::Probe(ticket) => t.set_probe(ticket),
        Gate::Reject { retry_after_secs } => {
            return Err(GatewayError::Rejected {
                message: format!(
                    "SLO class `{}` is shedding load: its TTFT P99 has stayed above {} x its {} ms target; retry in {retry_after_secs} s",
                    class.name,
                    snap.config.breaker.trip_ratio,
                    class.ttft.as_millis()
                ),
                code: "breaker_open",
                retry_after: retry_after_secs,
            })
        }
    }
    let admitted = pool.queue.admit(pool, class.tier).await;
    let waited = match &admitted {
        Ok(a) => Some(a.waited),
        Err(Refusal::Timeout { .. }) => Some(pool.queue_timeout(class.tier)),
        Err(_) => None,
    };
    if let Err(Refusal::Timeout { .. }) = &admitted {
        // The caller waited this long without a first token: a TTFT sample
        // for the breaker's window (an overloaded pool shows up here first).
        if let Some(w) = waited {
            class.control.ttft.record(w);
        }
    }
    if let Some(w) = waited {
        class.control.queue_time.observe(w.as_secs_f64());
    }
    let Admitted { lease, waited } = admitted.map_err(|r| refusal_error(r, pool, &class))?;
    t.span().record("slogate.queue_ms", waited.as_secs_f64() * 1000.0);

    // Reduce: under TTFT pressure, rewrite the request to cost less.
    let mut reduced = None;
    if class.control.reduction.active() && matches!(endpoint, Endpoint::Chat | Endpoint::Completions) {
        let limits = Limits::from_config(&snap.config.context_reduction);
        let changes = crate::reduce::reduce(request.object()?, endpoint == Endpoint::Chat, &limits);
        if !changes.is_empty() {
            metrics.context_reduced.get_or_create(&ClassLabels { class: class.name.to_string() }).inc();
            reduced = Some(changes.header());
            request.mark_changed();
        }
    }
    // vLLM serves lower values first.
    let priority =
        (pool.config.upstream_priority && matches!(endpoint, Endpoint::Chat | Endpoint::Completions)).then_some(match class.tier {
            Tier::Interactive => 0,
            Tier::Batch => 1,
        });
    let body = request.into_bytes(strip_usage, priority)?;

    let timeouts = StreamTimeouts {
        first_token: pool.config.timeouts.first_token.get(),
        idle: pool.config.timeouts.idle.get(),
        total: pool.config.timeouts.total.get(),
    };
    let start = tracker.as_ref().map(|t| t.start()).unwrap_or_else(Instant::now);
    // Until the response headers: the first-token budget for streams, the total otherwise.
    let header_deadline = start + if stream { timeouts.first_token.min(timeouts.total) } else { timeouts.total };

    let mut lease = lease;
    let mut retried = false;
    let resp = loop {
        let replica = lease.replica().clone();
        let mut upstream_req = build_upstream_request(&parts, &replica.base, body.clone(), snap.classifier.has_keys())?;
        if let Some(t) = tracker.as_ref().filter(|t| !t.span().is_disabled()) {
            crate::telemetry::otel::inject(t.span(), upstream_req.headers_mut());
        }
        let connect_timeout = pool.config.timeouts.connect.get();
        let sent = tokio::time::timeout_at(header_deadline, crate::upstream::conn::send(&replica, upstream_req, connect_timeout)).await;
        let failure: GatewayError = match sent {
            Err(_) => {
                let after = crate::config::Dur(header_deadline - start);
                return Err(GatewayError::UpstreamTimeout { replica: replica.url.clone(), after });
            }
            Ok(Ok(resp)) if resp.status().is_server_error() && !retried => match pool.try_lease(class.tier, Some(&replica)) {
                Ok(other) => {
                    tracing::info!(replica = %replica.url, status = %resp.status(), "replica answered 5xx before any byte was sent; retrying on another replica");
                    drop(resp);
                    lease = other;
                    retried = true;
                    continue;
                }
                Err(_) => break resp,
            },
            Ok(Ok(resp)) => break resp,
            Ok(Err(e)) => GatewayError::Upstream { replica: replica.url.clone(), source: Box::new(e) },
        };
        if retried {
            return Err(failure);
        }
        match pool.try_lease(class.tier, Some(&replica)) {
            Ok(other) => {
                tracing::info!(error = %failure, "retrying on another replica");
                lease = other;
                retried = true;
            }
            Err(_) => return Err(failure),
        }
    };

    let status = resp.status();
    let replica_url = lease.replica().url.clone();
    let Some(mut tracker) = tracker.take() else {
        return Err(GatewayError::InvalidRequest { message: "internal: request tracker missing".into(), param: None });
    };
    let class_name = tracker.class().name.clone();
    tracker.span().record("http.response.status_code", status.as_u16());
    tracker.attach_lease(lease);
    let (mut rparts, rbody) = resp.into_parts();
    let is_sse = rparts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"));
    let body: ProxyBody = if !status.is_success() {
        tracker.finish(if status.is_server_error() { Outcome::upstream_error } else { Outcome::client_error });
        ObservedBody::passthrough(rbody, tracker, timeouts).boxed_unsync()
    } else if is_sse {
        ObservedBody::sse(rbody, tracker, timeouts, strip_usage).boxed_unsync()
    } else if endpoint == Endpoint::Other {
        ObservedBody::passthrough(rbody, tracker, timeouts).boxed_unsync()
    } else {
        ObservedBody::json(rbody, tracker, timeouts).boxed_unsync()
    };
    strip_hop_by_hop(&mut rparts.headers);
    if is_sse && strip_usage {
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    let h = &mut rparts.headers;
    if let Ok(v) = HeaderValue::from_str(&class_name) {
        h.insert(HeaderName::from_static("x-slogate-class"), v);
    }
    if let Ok(v) = HeaderValue::from_str(&replica_url) {
        h.insert(HeaderName::from_static("x-slogate-replica"), v);
    }
    h.insert(HeaderName::from_static("x-slogate-queue-ms"), HeaderValue::from(waited.as_millis() as u64));
    if let Some(v) = reduced.and_then(|r| HeaderValue::from_str(&r).ok()) {
        h.insert(HeaderName::from_static("x-slogate-context-reduced"), v);
    }
    Ok(Response::from_parts(rparts, body))
}

fn refusal_error(r: Refusal, pool: &Pool, class: &Class) -> GatewayError {
    let tier = class.tier.as_str();
    let (message, code, retry_after) = match r {
        Refusal::NoHealthy => return GatewayError::NoHealthyReplica { pool: pool.config.name.clone() },
        Refusal::QueueFull { retry_after } => {
            (format!("the {tier} queue of pool `{}` is full", pool.config.name), "queue_full", retry_after)
        }
        Refusal::Shed { retry_after } => {
            (format!("batch work is shed while interactive requests wait for pool `{}`", pool.config.name), "shed", retry_after)
        }
        Refusal::Timeout { retry_after } => (
            format!("no slot on pool `{}` within the {tier} queue timeout of {}", pool.config.name, Dur(pool.queue_timeout(class.tier))),
            "queue_timeout",
            retry_after,
        ),
        Refusal::Hopeless { retry_after } => (
            format!("pool `{}` cannot serve this {tier} request before its queue timeout at the current rate", pool.config.name),
            "queue_timeout",
            retry_after,
        ),
    };
    GatewayError::Rejected { message, code, retry_after }
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
) -> Result<Request<Full<Bytes>>, GatewayError> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    // A replica URL may carry a path prefix (`http://host/vllm`).
    let prefix = base.path().trim_end_matches('/');
    *req.uri_mut() = if prefix.is_empty() {
        parts.uri.path_and_query().map(|p| http::Uri::from(p.clone())).unwrap_or_else(|| http::Uri::from_static("/"))
    } else {
        format!("{prefix}{pq}").parse().map_err(|e: http::uri::InvalidUri| GatewayError::InvalidRequest {
            message: format!("cannot build upstream URI: {e}"),
            param: None,
        })?
    };
    let h = req.headers_mut();
    if let Some(host) = base.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
        h.insert(header::HOST, host);
    }
    for (k, v) in parts.headers.iter() {
        if k == header::HOST || k == header::CONTENT_LENGTH || is_hop_by_hop(k) || (strip_auth && k == header::AUTHORIZATION) {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    Ok(req)
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

/// Remove hop-by-hop headers, including those named in `Connection`.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    let hop: Vec<HeaderName> = h.keys().filter(|k| is_hop_by_hop(k)).cloned().collect();
    for n in hop {
        h.remove(n);
    }
}
