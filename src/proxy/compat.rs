//! LiteLLM's routes, for clients moved from its proxy as they are
//! (docs/migrating-from-litellm.md, rules 5 to 8): the inference routes
//! without `/v1`, `GET /key/info` for the calling key, and
//! `/health/liveliness` and `/health/readiness`.

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::error::{full, GatewayError, ProxyBody};
use crate::state::Snapshot;

/// The `/v1` route LiteLLM's unprefixed `path` is (`None`: not one).
fn with_v1(path: &str) -> Option<String> {
    let routes = ["/chat/completions", "/completions", "/embeddings", "/responses", "/models", "/audio/transcriptions", "/audio/speech"];
    if routes.contains(&path) || path.starts_with("/responses/") {
        return Some(format!("/v1{path}"));
    }
    None
}

/// `req` on its `/v1` route when it came on LiteLLM's unprefixed one (the
/// query kept); otherwise as it is.
pub(super) fn unprefixed<B>(mut req: Request<B>) -> Request<B> {
    let Some(path) = with_v1(req.uri().path()) else { return req };
    let pq = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = req.uri().clone().into_parts();
    if let Ok(pq) = pq.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// slogate's answer on LiteLLM's own routes (`None`: not one of them).
pub(super) fn answer(
    snap: &Snapshot,
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
    query: Option<&str>,
) -> Option<Response<ProxyBody>> {
    match (method, path) {
        (&Method::GET, "/health/liveliness" | "/health/liveness") => Some(json_answer(StatusCode::OK, &json!("I'm alive!"))),
        (&Method::GET, "/health/readiness") => Some(readiness(snap)),
        (&Method::GET, "/key/info") => Some(key_info(snap, headers, query).unwrap_or_else(|e| e.respond(None))),
        _ => None,
    }
}

fn json_answer(status: StatusCode, v: &Value) -> Response<ProxyBody> {
    let mut resp = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// LiteLLM's readiness: healthy while every pool has a healthy replica.
fn readiness(snap: &Snapshot) -> Response<ProxyBody> {
    let ready = snap.ready();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let v = json!({
        "status": if ready { "healthy" } else { "unhealthy" },
        "db": "Not connected",
        "cache": null,
        "gateway": "slogate",
        "gateway_version": env!("CARGO_PKG_VERSION"),
    });
    json_answer(status, &v)
}

/// `GET /key/info`: the calling key's limits and what it used, in the
/// fields of LiteLLM's answer that slogate has, and slogate's own usage
/// under `slogate`. Only the calling key: `?key=` naming another is 403.
fn key_info(snap: &Snapshot, headers: &http::HeaderMap, query: Option<&str>) -> Result<Response<ProxyBody>, GatewayError> {
    let key = snap.classifier.key_view(headers)?;
    let asked = query.into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix("key="));
    if let Some(asked) = asked.filter(|a| !a.is_empty()) {
        let asked = percent_decoded(asked);
        let digest = crate::config::key_sha256(&asked);
        if digest != key.token && asked != key.token {
            return Err(GatewayError::PathNotAllowed("/key/info for another key".into()));
        }
    }
    let now = tokio::time::Instant::now();
    let limits = key.tenant.limits();
    let rates = key.tenant.rates_now(now);
    let (served_tokens, _, _) = key.tenant.last_minute(now);
    let mut usage = Map::new();
    usage.insert("requests_in_flight".into(), json!(key.tenant.concurrent()));
    usage.insert("tokens_served_last_minute".into(), json!(served_tokens));
    if let Some(q) = rates.requests {
        usage.insert("requests_remaining_this_minute".into(), json!(q.remaining));
    }
    if let Some(q) = rates.tokens {
        usage.insert("tokens_remaining_this_minute".into(), json!(q.remaining));
    }
    let quotas: Vec<Value> = key
        .tenant
        .quota_standing(now)
        .iter()
        .map(|s| json!({"period": s.period.as_str(), "kind": s.kind.as_str(), "limit": s.limit, "used": s.used, "resets_in_seconds": s.reset}))
        .collect();
    usage.insert("quotas".into(), Value::Array(quotas));
    let info = json!({
        "token": key.token,
        "key_alias": &*key.tenant.name,
        "models": key.grant.models().map_or_else(Vec::new, <[String]>::to_vec),
        "rpm_limit": limits.requests_per_minute,
        "tpm_limit": limits.tokens_per_minute,
        "max_parallel_requests": limits.max_concurrent,
        "tpd_limit": limits.quotas[1],
        "blocked": false,
        "expires": null,
        "slogate": usage,
    });
    Ok(json_answer(StatusCode::OK, &json!({"key": key.token, "info": info})))
}

/// `s` with its `%XX` escapes decoded (a key in a query string).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
