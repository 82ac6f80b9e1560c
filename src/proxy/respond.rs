//! What the request path answers: a failed stage's error ([`fail`]), and
//! the replica's response with its body observed ([`observe`]: measured,
//! resumed where it breaks, preempted where its pool preempts), slogate's
//! headers added.

use std::sync::Arc;

use http::{header, Response};
use http_body_util::BodyExt;

use super::headers;
use super::observe::{ObservedBody, StreamTimeouts};
use super::resume;
use super::tracker::Tracker;
use super::watchdog::Watched;
use crate::admission::Lease;
use crate::config::Endpoint;
use crate::error::{GatewayError, ProxyBody};
use crate::server::ClientAddr;
use crate::state::Snapshot;
use crate::sync::Watchlist;
use crate::telemetry::Outcome;
use crate::upstream::{self, conn::UpstreamBody};

/// A chat, completions or Messages stream, continued on another replica of its pool
/// if it breaks ([`resume`]): unless resuming is off or the pool has no
/// other replica. `preempts`: a batch stream that may be preempted, which
/// goes on on its own pool's next slot whatever these say.
#[allow(clippy::too_many_arguments)]
pub(super) fn resumable(
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
    let strip_auth = snap.classifier.has_keys();
    let link = resume::PoolLink {
        parts: detached(parts, strip_auth),
        client: client.clone(),
        pool: route.pool.clone(),
        strip_auth,
        request_id: t.request_id.clone(),
    };
    Some(resume::Resume::new(Box::new(link), detached_body(body), kind, attempts))
}

/// The request's head as the stream keeps it: only the headers a
/// continuation forwards ([`headers::for_continuations`]), their values and
/// the URI copied into one allocation of their own. As parsed, they (and a
/// body that came in one read) are slices of the client connection's read
/// buffer, and while a stream held them hyper could not reuse that
/// buffer: every HTTP/1.1 connection carrying a stream held a second
/// 8 KiB one. The rule: docs/design/resume.md, rule 20.
fn detached(mut parts: http::request::Parts, strip_credentials: bool) -> http::request::Parts {
    use std::fmt::Write as _;
    parts.headers = headers::for_continuations(&parts.headers, strip_credentials);
    // Nothing a continuation reads (a relayed request is not resumed).
    parts.extensions = http::Extensions::new();
    let values = parts.headers.values().map(|v| v.len()).sum::<usize>();
    let mut all = bytes::BytesMut::with_capacity(values + 64);
    // Written in place: no String of its own first.
    let _ = write!(all, "{}", parts.uri);
    let uri_len = all.len();
    for v in parts.headers.values() {
        all.extend_from_slice(v.as_bytes());
    }
    let all = all.freeze();
    if let Ok(u) = http::Uri::from_maybe_shared(all.slice(..uri_len)) {
        parts.uri = u;
    }
    let mut at = uri_len;
    for v in parts.headers.values_mut() {
        let end = at + v.len();
        if let Ok(mut copy) = http::HeaderValue::from_maybe_shared(all.slice(at..end)) {
            copy.set_sensitive(v.is_sensitive());
            *v = copy;
        }
        at = end;
    }
    parts
}

/// The request body as the stream keeps it: one that came in a single
/// read (a slice of the connection's buffer, see [`detached`]) copied; a
/// larger one is a buffer of its own already.
fn detached_body(body: bytes::Bytes) -> bytes::Bytes {
    if body.len() <= 8 * 1024 {
        bytes::Bytes::copy_from_slice(&body)
    } else {
        body
    }
}

/// A stage failed: count the outcome (once, when the tracker drops) and
/// answer in OpenAI's error form, with the request's id.
pub(super) fn fail(mut t: Box<Tracker>, e: GatewayError) -> Response<ProxyBody> {
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

/// Does the response's Content-Type name `media`?
fn content_type_is(h: &http::HeaderMap, media: &str) -> bool {
    h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with(media))
}

/// How the response body is observed, and what slogate says of it.
pub(super) struct Settings {
    pub(super) timeouts: StreamTimeouts,
    pub(super) strip_usage: bool,
    pub(super) waited: std::time::Duration,
    pub(super) reduced: Option<String>,
    pub(super) resume: Option<resume::Resume<UpstreamBody>>,
    /// A stored response's own route: its answer is passed on unread (a
    /// retrieved response's usage was counted when it was made).
    pub(super) passthrough: bool,
    /// Its part in preemption (docs/design/preemption.md).
    pub(super) preempt: Preempting,
}

/// A stream's part in preemption, where its pool preempts
/// (docs/design/preemption.md).
pub(super) enum Preempting {
    None,
    /// A batch stream, which may give its slot up: its prompt and `max_tokens`.
    Victim(u64, Option<u64>),
    /// An interactive stream that took a slot without waiting: with no
    /// first token by then (see [`crate::admission::preempt::in_engine_ask_at`]),
    /// it waits inside the engine, and asks a batch stream on its replica
    /// for a slot (rule 1).
    Asks(tokio::time::Instant),
}

impl Preempting {
    pub(super) fn of(
        route: &crate::state::Route,
        class: &crate::classify::Class,
        stream: bool,
        waited: std::time::Duration,
        (prompt, max): (u64, Option<u64>),
        start: tokio::time::Instant,
        due: Option<(tokio::time::Instant, std::time::Duration)>,
    ) -> Preempting {
        use crate::config::Tier;
        match class.tier {
            _ if !route.pool.config.preempts() => Preempting::None,
            Tier::Batch => Preempting::Victim(prompt, max),
            Tier::Interactive if stream && waited.is_zero() => {
                crate::admission::preempt::in_engine_ask_at(start, class.ttft, due).map_or(Preempting::None, Preempting::Asks)
            }
            Tier::Interactive => Preempting::None,
        }
    }
}

/// The response to the client: the replica's, its body observed (the
/// tracker and the lease travel in it), slogate's headers added.
pub(super) fn observe(
    resp: Response<UpstreamBody>,
    mut tracker: Box<Tracker>,
    lease: Lease,
    endpoint: Endpoint,
    s: Settings,
    list: &Arc<Watchlist>,
) -> Response<ProxyBody> {
    let status = resp.status();
    let replica = lease.replica().public_name();
    let class_header = tracker.class().header.clone();
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
        // Only a stream that can be continued gives its slot up: not one
        // relayed behind Envoy, nor a Responses stream.
        let continuable = s.resume.is_some();
        let mut body = match s.resume {
            Some(resume) => ObservedBody::resumable(rbody, tracker, t, s.strip_usage, resume),
            None => ObservedBody::sse(rbody, tracker, t, s.strip_usage),
        };
        match s.preempt {
            Preempting::Victim(prompt, max) if continuable => body.preemptible(prompt, max),
            Preempting::Asks(at) => body.asks_at(at),
            Preempting::Victim(..) | Preempting::None => {}
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
    if is_sse && s.strip_usage {
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    let said = headers::Said {
        class: class_header.as_ref(),
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
    use super::*;

    /// What a stream keeps of its request holds none of the buffer the
    /// request was parsed from, and says the same.
    #[test]
    fn a_detached_head_and_body_keep_nothing_of_the_buffer_they_were_read_into() {
        let read = bytes::Bytes::from(b"/v1/chat/completions?x=1 Bearer sk-1 req-7 {\"model\":\"m\"}".to_vec());
        let mut parts = http::Request::new(()).into_parts().0;
        parts.uri = http::Uri::from_maybe_shared(read.slice(0..24)).expect("uri");
        let mut auth = http::HeaderValue::from_maybe_shared(read.slice(25..36)).expect("value");
        auth.set_sensitive(true);
        parts.headers.insert(http::header::AUTHORIZATION, auth);
        parts.headers.append("x-tag", http::HeaderValue::from_maybe_shared(read.slice(37..42)).expect("value"));
        let body = read.slice(43..);
        let (kept, kept_body) = (detached(parts, false), detached_body(body));
        assert!(read.is_unique(), "nothing kept points into the read buffer");
        assert_eq!(kept.uri, "/v1/chat/completions?x=1");
        assert_eq!(kept.headers[http::header::AUTHORIZATION], "Bearer sk-1");
        assert!(kept.headers[http::header::AUTHORIZATION].is_sensitive());
        assert_eq!(kept.headers["x-tag"], "req-7");
        assert_eq!(&kept_body[..], b"{\"model\":\"m\"}");
    }
}
