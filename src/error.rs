//! The one place an error becomes an HTTP response.
//!
//! Every error slogate itself produces is OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` (plus the request's
//! `request_id`) with the status docs/operations.md's "Status codes and headers" lists; errors
//! from replicas are passed through unchanged elsewhere.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::config::Dur;
use crate::telemetry::Outcome;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The response body type of both listeners.
pub(crate) type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    #[error("request body is larger than the {limit}-byte limit")]
    PayloadTooLarge { limit: u64 },
    #[error("could not read the request body")]
    BodyRead(#[source] BoxError),
    #[error("the request body did not arrive within {0} (server.body_read_timeout)")]
    BodyTimeout(Dur),
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(#[source] serde_json::Error),
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<&'static str> },
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    #[error("no route for {method} {path}: slogate forwards the inference endpoints only (an operator may open others per pool, for named keys, with pools[].extra_paths)")]
    NotFound { method: String, path: String },
    #[error("{path} does not take {method}; it takes {allow}")]
    MethodNotAllowed { method: String, path: String, allow: &'static str },
    #[error("missing or invalid API key (send `Authorization: Bearer <key>`)")]
    Unauthorized,
    #[error("this API key may not use SLO class `{0}`")]
    ClassForbidden(String),
    #[error("this API key may not use model `{0}`")]
    ModelNotAllowed(String),
    #[error("this API key may not call {0} endpoints")]
    EndpointNotAllowed(&'static str),
    #[error("this API key may not call {0}")]
    PathNotAllowed(String),
    #[error("unknown SLO class `{0}` in x-slo-class")]
    UnknownClass(String),
    #[error("{message}")]
    /// The gateway refused it for load: `retry_after` is already bounded
    /// and spread ([`retry_after`]).
    Rejected { message: String, code: &'static str, retry_after: Duration },
    /// The caller's key is over one of its own limits (`auth.keys[].limits`):
    /// 429 like OpenAI's, but the caller's doing, not the gateway's failure.
    #[error("{message}")]
    KeyLimited { message: String, limit: &'static str, code: &'static str, retry_after: u64 },
    /// A stored response unknown to the caller's tenant (404, as the engine says it).
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
    /// A follow-up whose stored response was on a replica that is gone.
    #[error("the conversation's state (response '{0}') was kept by a replica that is no longer serving; it is lost. Send the conversation again in full (its input, without previous_response_id) to go on")]
    StateLost(String),
    /// The gateway holds all the request bodies it may (503).
    #[error("{message}")]
    Busy { message: String, retry_after: Duration },
    #[error("no healthy replica in pool `{pool}`")]
    NoHealthyReplica { pool: String },
    /// `replica` is the name clients are shown, `detail` what they may be
    /// told of the failure; `url` and `source` are for the log.
    #[error("replica {replica} failed: {detail}")]
    Upstream {
        replica: String,
        detail: String,
        url: String,
        #[source]
        source: BoxError,
    },
    #[error("replica {replica} sent no response within {after}")]
    UpstreamTimeout { replica: String, after: Dur },
    /// slogate's own inconsistency: a 500 and a log line, never blamed on the client.
    #[error("internal error in slogate: {0}")]
    Internal(String),
}

impl GatewayError {
    /// No route for this method and path: 405 naming the method the path
    /// takes (`allow`, from the listener's routes), else 404.
    pub(crate) fn no_route(method: &http::Method, path: &str, allow: Option<&'static str>) -> GatewayError {
        let (method, path) = (method.to_string(), path.to_string());
        match allow {
            Some(allow) => GatewayError::MethodNotAllowed { method, path, allow },
            None => GatewayError::NotFound { method, path },
        }
    }

    /// The whole story for the log: what the client was told, and for a
    /// replica's failure its URL and the full cause.
    pub(crate) fn for_log(&self) -> String {
        match self {
            GatewayError::Upstream { url, source, .. } => format!("{self} ({url}: {source})"),
            _ => self.to_string(),
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyRead(_) | MalformedJson(_) | InvalidRequest { .. } | UnknownClass(_) => StatusCode::BAD_REQUEST,
            ModelNotFound(_) | NotFound { .. } | ResponseNotFound(_) => StatusCode::NOT_FOUND,
            StateLost(_) => StatusCode::GONE,
            MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Unauthorized => StatusCode::UNAUTHORIZED,
            ClassForbidden(_) | ModelNotAllowed(_) | EndpointNotAllowed(_) | PathNotAllowed(_) => StatusCode::FORBIDDEN,
            Rejected { .. } | KeyLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            NoHealthyReplica { .. } | Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Upstream { .. } => StatusCode::BAD_GATEWAY,
            UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// How a request that ended with this error is counted.
    pub(crate) fn outcome(&self) -> Outcome {
        use GatewayError::*;
        match self {
            Rejected { .. } | Busy { .. } => Outcome::rejected,
            StateLost(_) => Outcome::state_lost,
            NoHealthyReplica { .. } => Outcome::unavailable,
            Upstream { .. } => Outcome::upstream_error,
            UpstreamTimeout { .. } => Outcome::timeout,
            // The gateway failed the caller: bad for availability.
            Internal(_) => Outcome::unavailable,
            _ => Outcome::client_error,
        }
    }

    fn kind(&self) -> (&'static str, Option<&'static str>, &'static str) {
        use GatewayError::*;
        match self {
            PayloadTooLarge { .. } => ("invalid_request_error", None, "payload_too_large"),
            BodyRead(_) => ("invalid_request_error", None, "body_read_error"),
            BodyTimeout(_) => ("invalid_request_error", None, "request_timeout"),
            MalformedJson(_) => ("invalid_request_error", None, "invalid_json"),
            InvalidRequest { param, .. } => ("invalid_request_error", *param, "invalid_request"),
            ModelNotFound(_) => ("invalid_request_error", Some("model"), "model_not_found"),
            NotFound { .. } => ("invalid_request_error", None, "not_found"),
            MethodNotAllowed { .. } => ("invalid_request_error", None, "method_not_allowed"),
            Unauthorized => ("authentication_error", None, "invalid_api_key"),
            ClassForbidden(_) => ("permission_error", Some("x-slo-class"), "class_not_allowed"),
            UnknownClass(_) => ("invalid_request_error", Some("x-slo-class"), "unknown_class"),
            Rejected { code, .. } => ("rate_limit_error", None, code),
            KeyLimited { limit, code, .. } => (limit, None, code),
            ModelNotAllowed(_) => ("permission_error", Some("model"), "model_not_allowed"),
            EndpointNotAllowed(_) => ("permission_error", None, "endpoint_not_allowed"),
            PathNotAllowed(_) => ("permission_error", None, "path_not_allowed"),
            NoHealthyReplica { .. } => ("service_unavailable", None, "no_healthy_replica"),
            Busy { .. } => ("service_unavailable", None, "server_busy"),
            ResponseNotFound(_) => ("invalid_request_error", Some("previous_response_id"), "not_found"),
            StateLost(_) => ("server_error", Some("previous_response_id"), "response_state_lost"),
            Upstream { .. } => ("upstream_error", None, "upstream_unreachable"),
            UpstreamTimeout { .. } => ("timeout", None, "upstream_timeout"),
            Internal(_) => ("internal_error", None, "internal_error"),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            GatewayError::Rejected { retry_after, .. } | GatewayError::Busy { retry_after, .. } => Some(*retry_after),
            GatewayError::KeyLimited { retry_after, .. } => Some(Duration::from_secs(*retry_after)),
            GatewayError::NoHealthyReplica { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        self.respond(None)
    }

    /// The response to request `id`: its id in the error body and in `x-request-id`.
    pub(crate) fn respond(self, id: Option<&HeaderValue>) -> Response<ProxyBody> {
        let (ty, param, code) = self.kind();
        let body = error_body(&self.to_string(), ty, param, code, id.and_then(|v| v.to_str().ok()));
        let mut resp = json_response(self.status(), body);
        if let Some(id) = id {
            resp.headers_mut().insert(http::HeaderName::from_static("x-request-id"), id.clone());
        }
        if let Some(d) = self.retry_after() {
            // Whole seconds for every client; milliseconds for those that read
            // them (the OpenAI SDKs prefer `retry-after-ms`).
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            resp.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            resp.headers_mut().insert(http::HeaderName::from_static("retry-after-ms"), HeaderValue::from(d.as_millis() as u64));
        }
        if let GatewayError::MethodNotAllowed { allow, .. } = self {
            resp.headers_mut().insert(http::header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}

impl GatewayError {
    /// The response on Anthropic's routes (`/v1/messages`), in Anthropic's
    /// error shape (`{"type":"error","error":{"type":...,"message":...}}`)
    /// with the same status and headers (Retry-After among them).
    pub(crate) fn respond_anthropic(self, id: Option<&HeaderValue>) -> Response<ProxyBody> {
        let status = self.status();
        let ty = match status.as_u16() {
            400 | 405 | 408 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        };
        let message = self.to_string();
        let mut resp = self.respond(id);
        let body =
            serde_json::json!({"type": "error", "error": {"type": ty, "message": message}, "request_id": id.and_then(|v| v.to_str().ok())});
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        resp.headers_mut().insert(http::header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        *resp.body_mut() = full(bytes);
        resp
    }
}

/// The least Retry-After a refusal says: a client told less would be back
/// before anything changed.
pub(crate) const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
/// The most: past it, a client is better served by its own backoff.
pub(crate) const RETRY_AFTER_MAX: Duration = Duration::from_secs(30);
/// Each client is told up to this part more than the estimate, at random.
pub(crate) const RETRY_AFTER_SPREAD: f64 = 0.25;

/// What a refusal for load tells its client to wait, from the `estimate`
/// of when capacity returns: bounded to [`RETRY_AFTER_MIN`] and
/// [`RETRY_AFTER_MAX`], and spread over up to [`RETRY_AFTER_SPREAD`] more
/// (`unit`: a uniform draw in 0..1) so a refused crowd does not come back
/// in one wave. (docs/design/seats.md, rule 20.)
pub(crate) fn retry_after_with(estimate: Duration, unit: f64) -> Duration {
    // Near the cap the spread goes below it, not into it: a crowd all told
    // exactly the cap would come back as one.
    let base = estimate.clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX.div_f64(1.0 + RETRY_AFTER_SPREAD));
    let spread = base.mul_f64(1.0 + RETRY_AFTER_SPREAD * unit.clamp(0.0, 1.0));
    Duration::from_millis(spread.as_millis() as u64).min(RETRY_AFTER_MAX)
}

/// [`retry_after_with`] a fresh draw.
pub(crate) fn retry_after(estimate: Duration) -> Duration {
    retry_after_with(estimate, fastrand::f64())
}

/// The OpenAI error JSON for a message.
pub(crate) fn error_json(message: &str, ty: &str, param: Option<&str>, code: impl serde::Serialize) -> Vec<u8> {
    error_body(message, ty, param, code, None)
}

/// The OpenAI error JSON, with the request's id (`request_id`) when it has one.
pub(crate) fn error_body(message: &str, ty: &str, param: Option<&str>, code: impl serde::Serialize, id: Option<&str>) -> Vec<u8> {
    let mut e = serde_json::json!({"message": message, "type": ty, "param": param, "code": code});
    if let (Some(id), Some(o)) = (id, e.as_object_mut()) {
        o.insert("request_id".into(), id.into());
    }
    serde_json::to_vec(&serde_json::json!({ "error": e }))
        .unwrap_or_else(|_| br#"{"error":{"message":"internal error","type":"internal_error","param":null,"code":null}}"#.to_vec())
}

pub(crate) fn error_response(status: StatusCode, message: &str, ty: &str, param: Option<&str>, code: &str) -> Response<ProxyBody> {
    json_response(status, error_json(message, ty, param, code))
}

/// A JSON body with `status`.
fn json_response(status: StatusCode, body: Vec<u8>) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A complete body.
pub(crate) fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_bounded_and_spread() {
        let s = Duration::from_secs_f64;
        assert_eq!(retry_after_with(s(0.2), 0.0), s(1.0), "at least a second");
        assert_eq!(retry_after_with(s(0.2), 1.0), s(1.25), "spread above the floor too");
        assert_eq!(retry_after_with(s(8.0), 0.5), s(9.0));
        assert_eq!(retry_after_with(s(500.0), 1.0), s(30.0), "at most 30 s");
        assert_eq!(retry_after_with(s(500.0), 0.0), s(24.0), "spread below the cap, not piled on it");
        assert_eq!(retry_after_with(s(29.0), 0.5), s(27.0));
        // A crowd refused at once is told different times, within the spread.
        let told: std::collections::BTreeSet<_> = (0..200).map(|_| retry_after(s(4.0)).as_millis()).collect();
        assert!(told.len() > 50, "{} distinct values", told.len());
        assert!(told.iter().all(|ms| (4000..=5000).contains(ms)), "{told:?}");
    }

    #[test]
    fn a_refusal_says_retry_after_in_seconds_and_milliseconds() {
        let e = GatewayError::Rejected { message: "busy".into(), code: "queue_full", retry_after: Duration::from_millis(2300) };
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "3");
        assert_eq!(resp.headers()["retry-after-ms"], "2300");
    }
}
