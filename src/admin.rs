//! The admin listener: `/metrics`, `/healthz`, `/readyz`, `/slo`, `/slo.json`,
//! `/capacity`, `/fleet.json` (what fleet peers read), `/-/reload`.
//!
//! Scrapes read atomics and metric families; they never block the data path.

use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::error::{error_response, full, GatewayError, ProxyBody};
use crate::state::App;

pub(crate) async fn handle(req: Request<Incoming>, app: Arc<App>) -> Response<ProxyBody> {
    // Probes stay open: a kubelet or load balancer checks them without a token.
    let open = matches!(req.uri().path(), "/healthz" | "/readyz");
    if !open {
        if let Some(token) = &app.snapshot().admin_token {
            if !token.admits(req.headers()) {
                let mut r = error_response(
                    StatusCode::UNAUTHORIZED,
                    "the admin listener needs its token (send `Authorization: Bearer <token>`; server.admin_token_env)",
                    "authentication_error",
                    None,
                    "invalid_admin_token",
                );
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"slogate-admin\""));
                return r;
            }
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let om =
                req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("application/openmetrics-text"));
            let (body, ct) = if om {
                (app.metrics.encode_openmetrics(), "application/openmetrics-text; version=1.0.0; charset=utf-8")
            } else {
                (app.metrics.encode(), "text/plain; version=0.0.4; charset=utf-8")
            };
            let mut r = Response::new(full(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            r
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::POST, "/-/reload") => match app.reload().await {
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
        },
        (&Method::GET, "/slo") => {
            let mut r = Response::new(full(crate::status::html(&crate::status::collect(&app))));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        (&Method::GET, "/capacity") => {
            let query = req.uri().query().unwrap_or("");
            let rates: Vec<&str> = query.split('&').filter_map(|kv| kv.strip_prefix("rate=")).collect();
            match crate::capacity::parse_rates(rates.iter().map(|r| r.trim())) {
                Err(e) => error_response(StatusCode::BAD_REQUEST, &e, "invalid_request_error", Some("rate"), "invalid_rate"),
                Ok(rates) => {
                    let estimates = crate::capacity::plan(&crate::capacity::measure(&app), &rates);
                    let body = serde_json::json!({"assumptions": crate::capacity::ASSUMPTIONS, "estimates": estimates});
                    let mut r = Response::new(full(serde_json::to_vec_pretty(&body).unwrap_or_default()));
                    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    r
                }
            }
        }
        (&Method::GET, crate::fleet::STATE_PATH) => {
            let snap = app.snapshot();
            let pools: Vec<_> = snap.pools.iter().map(|r| r.admission.clone()).collect();
            let state = app.fleet.state(&pools, &snap.config.fleet, true);
            let mut r = Response::new(full(serde_json::to_vec(&state).unwrap_or_default()));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        (&Method::GET, "/slo.json") => {
            let body = serde_json::to_vec_pretty(&crate::status::collect(&app)).unwrap_or_default();
            let mut r = Response::new(full(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        (&Method::GET, "/readyz") => {
            let snap = app.snapshot();
            let mut lines = String::new();
            for p in &snap.pools {
                lines.push_str(&format!(
                    "pool {}: {}/{} replicas healthy\n",
                    p.pool.config.name,
                    p.pool.healthy_count(),
                    p.pool.replicas.len()
                ));
            }
            if snap.ready() {
                text(StatusCode::OK, &format!("ready\n{lines}"))
            } else {
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
        }
        (m, p) => GatewayError::no_route(m, p, route_method(p)).into_response(),
    }
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
