//! The admin listener: `/metrics`, `/healthz`, `/readyz`, `/slo`, `/slo.json`,
//! `/capacity`, `/fleet.json` (what fleet peers read), `/-/reload`.
//!
//! Scrapes read atomics and metric families; they never block the data path.
//!
//! The listener serves [`handle`] through tower-http's layers ([`service`]):
//! gzip for the clients that ask (a Prometheus scrape of `/metrics`), CORS
//! for `/slo.json` (a dashboard on another origin reads it), a timeout,
//! request tracing at debug level, and the token's header marked
//! sensitive, so no log or trace shows it. None of it is on the data path.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tower::util::BoxCloneSyncService;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::error::{error_response, full, GatewayError, ProxyBody};
use crate::state::App;

/// The longest an admin request may take (a reload re-reads the config
/// and checks it): past it, a 408.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The paths a page on another origin may read.
const CROSS_ORIGIN: &[&str] = &["/slo.json"];

/// The admin listener's service: [`handle`] in its layers.
pub(crate) type Admin = BoxCloneSyncService<Request<Incoming>, Response<ProxyBody>, Infallible>;

pub(crate) fn service(app: Arc<App>) -> Admin {
    let cors = CorsLayer::new()
        .allow_methods([Method::GET])
        .allow_origin(AllowOrigin::predicate(|_, parts: &http::request::Parts| CROSS_ORIGIN.contains(&parts.uri.path())));
    let svc = tower::ServiceBuilder::new()
        .map_response(|r: Response<_>| r.map(|b: _| BodyExt::map_err(b, Into::into).boxed_unsync()))
        .layer(SetSensitiveRequestHeadersLayer::new([header::AUTHORIZATION]))
        .layer(TraceLayer::new_for_http())
        .layer(CompressionLayer::new())
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, ADMIN_TIMEOUT))
        .layer(cors)
        .service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(handle(req, app).await) }
        });
    BoxCloneSyncService::new(svc)
}

/// One admin request through the layers of [`service`].
pub(crate) async fn serve_one(svc: Admin, req: Request<Incoming>) -> Response<ProxyBody> {
    use tower::ServiceExt;
    svc.oneshot(req).await.unwrap_or_else(|never| match never {})
}

async fn handle(req: Request<Incoming>, app: Arc<App>) -> Response<ProxyBody> {
    if let Some(refused) = unauthorized(&req, &app) {
        return refused;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => metrics(&req, &app),
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::POST, "/-/reload") => reload(&app).await,
        (&Method::GET, "/slo") => typed(crate::status::html(&crate::status::collect(&app)).into(), "text/html; charset=utf-8", true),
        (&Method::GET, "/capacity") => capacity(&req, &app),
        (&Method::GET, crate::fleet::STATE_PATH) => fleet_state(&req, &app).await,
        (&Method::GET, "/slo.json") => {
            typed(serde_json::to_vec_pretty(&crate::status::collect(&app)).unwrap_or_default(), "application/json", true)
        }
        (&Method::GET, "/readyz") => readyz(&app),
        (m, p) => GatewayError::no_route(m, p, route_method(p)).into_response(),
    }
}

/// This instance's fleet state. A peer asks for the routing decisions after
/// the last it read (`since`), and may ask to be answered only at news or
/// after `wait_ms` (docs/design/fleet.md, rule 15).
async fn fleet_state(req: &Request<Incoming>, app: &App) -> Response<ProxyBody> {
    let query =
        |name: &str| -> Option<u64> { req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()) };
    let snap = app.snapshot();
    let pools: Vec<_> = snap.pools.iter().map(|r| r.admission.clone()).collect();
    let woken = match query("wait_ms") {
        Some(ms) if ms > 0 => crate::fleet::Fleet::hold(&pools, std::time::Duration::from_millis(ms), query("news")).await,
        _ => false,
    };
    // The state as it stands after the wait.
    let mut state = app.fleet.state(&pools, &snap.config.fleet, true, query("since"));
    state.woken = woken;
    typed(serde_json::to_vec(&state).unwrap_or_default(), "application/json", true)
}

/// A 401 when the admin listener has a token and the request lacks it.
/// Probes stay open: a kubelet or load balancer checks them without a token.
fn unauthorized(req: &Request<Incoming>, app: &App) -> Option<Response<ProxyBody>> {
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return None;
    }
    let snap = app.snapshot();
    let token = snap.admin_token.as_ref()?;
    if token.admits(req.headers()) {
        return None;
    }
    let mut r = error_response(
        StatusCode::UNAUTHORIZED,
        "the admin listener needs its token (send `Authorization: Bearer <token>`; server.admin_token_env)",
        "authentication_error",
        None,
        "invalid_admin_token",
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"slogate-admin\""));
    Some(r)
}

/// A 200 with `body` of `content_type` (`no_store`: never cached).
fn typed(body: Vec<u8>, content_type: &'static str, no_store: bool) -> Response<ProxyBody> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if no_store {
        r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// `GET /metrics`: OpenMetrics when the scraper asks for it, else Prometheus text.
fn metrics(req: &Request<Incoming>, app: &App) -> Response<ProxyBody> {
    let om = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("application/openmetrics-text"));
    if om {
        typed(app.metrics.encode_openmetrics().into(), "application/openmetrics-text; version=1.0.0; charset=utf-8", false)
    } else {
        typed(app.metrics.encode().into(), "text/plain; version=0.0.4; charset=utf-8", false)
    }
}

/// `POST /-/reload`.
async fn reload(app: &App) -> Response<ProxyBody> {
    match app.reload().await {
        Ok(()) => text(StatusCode::OK, "reloaded\n"),
        Err(e @ crate::state::ReloadError::TooSoon { retry_after }) => {
            let mut r = error_response(StatusCode::TOO_MANY_REQUESTS, &e.to_string(), "rate_limit_error", None, "reload_rate_limited");
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after.as_secs_f64().ceil().max(1.0) as u64));
            r
        }
        Err(e) => error_response(
            StatusCode::BAD_REQUEST,
            &format!("reload rejected, the running config stays: {e}"),
            "invalid_request_error",
            None,
            "reload_failed",
        ),
    }
}

/// `GET /capacity?rate=class=N`: replicas per class at those rates.
fn capacity(req: &Request<Incoming>, app: &App) -> Response<ProxyBody> {
    let query = req.uri().query().unwrap_or("");
    let rates: Vec<&str> = query.split('&').filter_map(|kv| kv.strip_prefix("rate=")).collect();
    match crate::capacity::parse_rates(rates.iter().map(|r| r.trim())) {
        Err(e) => error_response(StatusCode::BAD_REQUEST, &e, "invalid_request_error", Some("rate"), "invalid_rate"),
        Ok(rates) => {
            let estimates = crate::capacity::plan(&crate::capacity::measure(app), &rates);
            let body = serde_json::json!({"assumptions": crate::capacity::ASSUMPTIONS, "estimates": estimates});
            typed(serde_json::to_vec_pretty(&body).unwrap_or_default(), "application/json", false)
        }
    }
}

/// `GET /readyz`: 200 with every pool's healthy count, or 503 naming them.
fn readyz(app: &App) -> Response<ProxyBody> {
    let snap = app.snapshot();
    let mut lines = String::new();
    for p in &snap.pools {
        lines.push_str(&format!("pool {}: {}/{} replicas healthy\n", p.pool.config.name, p.pool.healthy_count(), p.pool.replicas.len()));
    }
    if snap.ready() {
        return text(StatusCode::OK, &format!("ready\n{lines}"));
    }
    let mut r = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("not ready: {}", lines.trim_end().replace('\n', "; ")),
        "service_unavailable",
        None,
        "not_ready",
    );
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The method an admin path takes, for a request that used another (405).
fn route_method(path: &str) -> Option<&'static str> {
    match path {
        "/metrics" | "/healthz" | "/readyz" | "/slo" | "/slo.json" | "/fleet.json" | "/capacity" => Some("GET"),
        "/-/reload" => Some("POST"),
        _ => None,
    }
}

fn text(status: StatusCode, body: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}
