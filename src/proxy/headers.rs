//! The headers of the hop to a replica and back: what the replica gets of
//! the caller's (hop-by-hop headers and slogate's own key removed, the
//! client's address appended to `X-Forwarded-For` and `Forwarded`, the
//! request id set), and what slogate adds to the caller's response.

use http::{header, HeaderMap, HeaderName, HeaderValue};

use super::request_id::X_REQUEST_ID;
use crate::error::GatewayError;
use crate::upstream::{Outgoing, SendBody};

/// What slogate says of a request in its response's headers.
pub(super) struct Said<'a> {
    pub(super) class: Option<&'a HeaderValue>,
    pub(super) replica: Option<HeaderValue>,
    pub(super) waited_ms: u64,
    pub(super) reduced: Option<String>,
    pub(super) rate: Option<crate::limits::RateState>,
    pub(super) request_id: &'a HeaderValue,
}

/// Add slogate's headers to a response: class, replica, queue time, context
/// reduction, the key's rate limits, the request id.
pub(super) fn add_said(h: &mut HeaderMap, said: Said<'_>) {
    if let Some(v) = said.class {
        h.insert(HeaderName::from_static("x-slogate-class"), v.clone());
    }
    if let Some(replica) = said.replica {
        h.insert(HeaderName::from_static("x-slogate-replica"), replica);
    }
    // Most requests wait for nothing: their value is a constant.
    let waited = if said.waited_ms == 0 { HeaderValue::from_static("0") } else { HeaderValue::from(said.waited_ms) };
    h.insert(HeaderName::from_static("x-slogate-queue-ms"), waited);
    if let Some(v) = said.reduced.and_then(|r| HeaderValue::from_str(&r).ok()) {
        h.insert(HeaderName::from_static("x-slogate-context-reduced"), v);
    }
    if let Some(state) = said.rate {
        rate_headers(h, &state);
    }
    h.insert(X_REQUEST_ID, said.request_id.clone());
}

/// The caller's deadline header: milliseconds from the request's arrival.
pub(crate) const DEADLINE_MS: &str = "x-slogate-deadline-ms";
/// The same, parsed once (a lookup by `&str` parses the name each time).
const DEADLINE_MS_NAME: HeaderName = HeaderName::from_static(DEADLINE_MS);
/// The OpenAI SDKs' read timeout (seconds), sent with every request: a
/// request that cannot start before it will be abandoned by its client.
const SDK_READ_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-read-timeout");

/// How long the caller gives the request, from its arrival: the sooner of
/// `x-slogate-deadline-ms` and the OpenAI SDK's `x-stainless-read-timeout`.
/// A deadline header that is not a whole number of milliseconds is a 400;
/// an SDK header that does not parse is ignored (it is not ours).
pub(crate) fn deadline(h: &HeaderMap) -> Result<Option<std::time::Duration>, GatewayError> {
    let ours = match h.get(DEADLINE_MS_NAME) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(ms) if ms > 0 => Some(std::time::Duration::from_millis(ms)),
            _ => {
                return Err(GatewayError::InvalidRequest {
                    message: format!("{DEADLINE_MS} must be a whole number of milliseconds above 0"),
                    param: Some(DEADLINE_MS),
                })
            }
        },
    };
    let sdk = h
        .get(SDK_READ_TIMEOUT)
        .and_then(|v| v.to_str().ok()?.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e7)
        .map(std::time::Duration::from_secs_f64);
    Ok([ours, sdk].into_iter().flatten().min())
}

/// OpenAI's rate-limit headers, for every response to a key with limits.
pub(super) fn rate_headers(h: &mut HeaderMap, state: &crate::limits::RateState) {
    let mut put = |name: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    if let Some(q) = state.requests {
        put("x-ratelimit-limit-requests", q.limit.to_string());
        put("x-ratelimit-remaining-requests", q.remaining.to_string());
        put("x-ratelimit-reset-requests", crate::limits::tenants::reset_text(q.reset));
    }
    if let Some(q) = state.tokens {
        put("x-ratelimit-limit-tokens", q.limit.to_string());
        put("x-ratelimit-remaining-tokens", q.remaining.to_string());
        put("x-ratelimit-reset-tokens", crate::limits::tenants::reset_text(q.reset));
    }
}

/// How a request's headers go to a replica.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hop {
    /// slogate checked the caller's key against its own keys: no credential
    /// of the caller's is the replica's to see.
    pub(super) strip_credentials: bool,
    /// The body is the JSON object slogate read: it goes as
    /// `application/json`, whatever type the caller named, so the replica
    /// reads it as slogate did (not as a form).
    pub(super) json: bool,
}

impl Hop {
    /// Whether this hop forwards the client's header `k` (its own value:
    /// the forwarding headers' are appended to, not forwarded), `named`
    /// being what the client's `Connection` names.
    fn forwards(self, k: &HeaderName, named: &[HeaderName]) -> bool {
        k != header::HOST
            && k != header::CONTENT_LENGTH
            && k != X_REQUEST_ID
            && !is_hop_by_hop(k)
            && !(self.strip_credentials && CREDENTIALS.contains(k))
            && !(self.json && k == header::CONTENT_TYPE)
            && !named.contains(k)
    }
}

/// The headers that carry a caller's credentials (OpenAI's, Anthropic's,
/// LiteLLM's, Azure's, a browser's).
pub(crate) const CREDENTIALS: [HeaderName; 5] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("x-litellm-api-key"),
    HeaderName::from_static("api-key"),
    header::COOKIE,
];

/// The request to a replica: the caller's headers but for hop-by-hop ones,
/// and but for every credential header when slogate checked the caller's
/// key against its own keys or the pool has a key of its own (added at the
/// connection): a slogate key is not the replica's to see
/// (docs/access.md, rule 20). The target is in origin form (`/v1/...`),
/// with `Host` naming the replica. `trace`: the trace context's headers
/// (empty when not traced), sent in place of the caller's of those names.
/// The head is written straight from the caller's header map, with no map
/// of its own (design/replica-connections.md, rule 9).
pub(super) fn build_upstream_request(
    parts: &http::request::Parts,
    replica: &crate::upstream::Replica,
    body: SendBody,
    hop: Hop,
    forwarded: &Forwarded,
    request_id: &HeaderValue,
    trace: &HeaderMap,
) -> Outgoing {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // A replica URL may carry a path prefix (`http://host/vllm`).
    let prefix = replica.address.base.path().trim_end_matches('/');
    let host = replica.address.host.as_ref().map(|h| (&header::HOST, h));
    let json = HeaderValue::from_static("application/json");
    // Written after the caller's, in this order; `None`: not this request's.
    let after = [
        (&header::CONTENT_TYPE, hop.json.then_some(&json)),
        (&X_REQUEST_ID, Some(request_id)),
        (&X_FORWARDED_FOR, forwarded.x_forwarded_for.as_ref()),
        (&header::FORWARDED, forwarded.forwarded.as_ref()),
    ];
    let after = || after.iter().filter_map(|&(k, v)| Some((k, v?)));
    // Room for every line the caller sent (some are left out) and those
    // added here, so the head is not grown on the way.
    let lines = parts.headers.iter().chain(host).chain(after()).chain(trace).map(|(k, v)| Outgoing::line_len(k, v)).sum();
    let mut req = Outgoing::new(parts.method.clone(), prefix, pq, lines, body);
    if let Some((k, v)) = host {
        req.header(k, v);
    }
    let named = connection_named(&parts.headers);
    let hop = Hop { strip_credentials: hop.strip_credentials || replica.has_api_key(), ..hop };
    for (k, v) in parts.headers.iter() {
        // (A lookup in an empty map returns before hashing the name.)
        if !hop.forwards(k, &named) || forwarded.replaces(k) || trace.contains_key(k) {
            continue;
        }
        req.header(k, v);
    }
    // The request's id goes as `X-Request-Id`, which vLLM takes for its own.
    for (k, v) in after().chain(trace) {
        req.header(k, v);
    }
    req
}

/// What a stream keeps of its request's headers for a continuation: only
/// those [`build_upstream_request`] may forward (its `json` hop: the
/// `Content-Type` is its own), in a map of their own size. The parsed map
/// is sized for everything the client sent, and an open stream holds it
/// for as long as it lasts. Building a request from what this keeps gives
/// the replica the same headers as building it from the whole map.
pub(super) fn for_continuations(h: &HeaderMap, strip_credentials: bool) -> HeaderMap {
    let named = connection_named(h);
    let hop = Hop { strip_credentials, json: true };
    let mut kept = HeaderMap::with_capacity(h.keys().filter(|k| hop.forwards(k, &named)).count());
    for (k, v) in h.iter().filter(|(k, _)| hop.forwards(k, &named)) {
        kept.append(k.clone(), v.clone());
    }
    kept
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-For` and `Forwarded` (RFC 7239) as the replica gets them:
/// what the client sent, with the client's address appended (where the
/// joined value is not a valid header value, as sent).
pub(super) struct Forwarded {
    x_forwarded_for: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
}

impl Forwarded {
    pub(super) fn of(parts: &http::request::Parts, client: &crate::server::ClientAddr) -> Forwarded {
        Forwarded {
            x_forwarded_for: appended(&parts.headers, &X_FORWARDED_FOR, &client.x_forwarded_for),
            forwarded: appended(&parts.headers, &header::FORWARDED, &client.forwarded),
        }
    }

    /// Is `k` a header this replaces (one the client's value goes into)?
    fn replaces(&self, k: &HeaderName) -> bool {
        (self.x_forwarded_for.is_some() && k == X_FORWARDED_FOR) || (self.forwarded.is_some() && k == header::FORWARDED)
    }
}

/// Every `name` header the client sent, joined by commas, then `element`
/// (the connection's own value, shared, when the client sent none).
fn appended(h: &HeaderMap, name: &HeaderName, element: &HeaderValue) -> Option<HeaderValue> {
    let mut sent = h.get_all(name).iter().map(|s| s.as_bytes().trim_ascii()).filter(|s| !s.is_empty()).peekable();
    if sent.peek().is_none() {
        return Some(element.clone());
    }
    let mut v = Vec::new();
    for s in sent {
        v.extend_from_slice(s);
        v.extend_from_slice(b", ");
    }
    v.extend_from_slice(element.as_bytes());
    HeaderValue::from_bytes(&v).ok()
}

/// A header of one hop only (the replica's answer's are left out as it is
/// read: [`crate::upstream::HOP_BY_HOP`]).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    crate::upstream::HOP_BY_HOP.contains(name)
}

/// The headers a `Connection` header names: hop-by-hop for this hop only.
/// `keep-alive` (hop-by-hop anyway) and `close` (an option, not a header)
/// are left out, so the usual `Connection: keep-alive` costs no allocation.
fn connection_named(h: &HeaderMap) -> Vec<HeaderName> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter(|v| !names_no_header(v) && v.to_str().is_ok())
        .flat_map(|v| crate::upstream::list_items(v.as_bytes()))
        .filter(|n| !n.eq_ignore_ascii_case(b"keep-alive") && !n.eq_ignore_ascii_case(b"close"))
        .filter_map(|n| HeaderName::from_bytes(n).ok())
        .collect()
}

/// A `Connection` value that is only `keep-alive` or `close`, as nearly
/// every one is: it names no header, so it is not split and looked up.
fn names_no_header(v: &HeaderValue) -> bool {
    v.as_bytes().eq_ignore_ascii_case(b"keep-alive") || v.as_bytes().eq_ignore_ascii_case(b"close")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_the_sooner_of_ours_and_the_sdks_read_timeout() {
        let ms = std::time::Duration::from_millis;
        let of = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
            }
            deadline(&h).ok()
        };
        assert_eq!(of(&[]), Some(None));
        assert_eq!(of(&[(DEADLINE_MS, "1500")]), Some(Some(ms(1500))));
        assert_eq!(of(&[("x-stainless-read-timeout", "600.0")]), Some(Some(ms(600_000))));
        assert_eq!(of(&[(DEADLINE_MS, "1500"), ("x-stainless-read-timeout", "0.5")]), Some(Some(ms(500))));
        assert_eq!(of(&[("x-stainless-read-timeout", "soon")]), Some(None), "not ours: ignored");
        for bad in ["0", "-3", "1.5s", ""] {
            let mut h = HeaderMap::new();
            h.insert(DEADLINE_MS, HeaderValue::from_static(bad));
            assert!(matches!(deadline(&h), Err(GatewayError::InvalidRequest { .. })), "{bad:?}");
        }
    }
    /// What a stream keeps for its continuations is smaller than what the
    /// client sent, and a request built from it carries the very headers a
    /// request built from everything does, credentials kept or stripped.
    #[test]
    fn a_continuation_built_from_the_kept_headers_forwards_the_same_ones() {
        let cfg = crate::config::PoolConfig { replicas: vec!["http://127.0.0.1:9".into()], ..crate::config::PoolConfig::default() };
        let access = crate::upstream::Access::new(&cfg).expect("access");
        let replica = crate::upstream::Pool::new(cfg, access, None).replicas[0].clone();
        let client = crate::server::ClientAddr::new("10.0.0.7:5000".parse().expect("addr"));
        let mut parts = http::Request::new(()).into_parts().0;
        parts.uri = http::Uri::from_static("/v1/chat/completions");
        for (k, v) in [
            ("host", "gw.example"),
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", "42"),
            ("connection", "keep-alive, X-Private"),
            ("x-private", "p"),
            ("te", "trailers"),
            ("authorization", "Bearer sk-1"),
            ("x-request-id", "theirs"),
            ("x-forwarded-for", "192.0.2.1"),
            ("user-agent", "OpenAI/Python 1.0"),
            ("accept", "text/event-stream"),
            ("x-stainless-lang", "python"),
        ] {
            parts.headers.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let sent = |parts: &http::request::Parts, strip: bool| {
            let forwarded = Forwarded::of(parts, &client);
            let hop = Hop { strip_credentials: strip, json: true };
            let trace = HeaderMap::new();
            let req = build_upstream_request(
                parts,
                &replica,
                bytes::Bytes::new().into(),
                hop,
                &forwarded,
                &HeaderValue::from_static("ours"),
                &trace,
            );
            let mut all = req.header_lines();
            all.sort();
            all
        };
        for strip in [false, true] {
            let mut kept = parts.clone();
            kept.headers = for_continuations(&parts.headers, strip);
            assert_eq!(sent(&kept, strip), sent(&parts, strip), "strip credentials: {strip}");
            assert_eq!(kept.headers.len(), if strip { 4 } else { 5 }, "{:?}", kept.headers);
            assert!(kept.headers.capacity() < parts.headers.capacity());
        }
        assert!(sent(&parts, false).contains(&"authorization: Bearer sk-1".to_string()));
        assert!(!sent(&parts, true).iter().any(|h| h.starts_with("authorization")));
    }
}
