//! One request's `ext_proc` exchange with Envoy (docs/endpoint-picker.md,
//! rules 2 to 6).
//!
//! Envoy sends the request's headers, then its body (buffered, or in full
//! duplex: [`wire::Modes`]). slogate runs the request through its own
//! request path ([`crate::proxy::handle`]) with a [`Relay`] where the path
//! would send it: the path classifies,
//! admits (queueing as it would), reduces and picks, and the pick goes back
//! to Envoy as the destination header and metadata. A refusal is an
//! immediate response. Envoy then sends the replica's response head and
//! its body's chunks; each goes into the relayed body the path observes,
//! and what the observed body hands on goes back as that chunk's answer,
//! so the response is measured exactly as in proxy mode. The slot is held
//! until the body ends, or Envoy closes the stream (the client left).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_request::Request as In, ProcessingRequest, ProcessingResponse};
use futures_util::{FutureExt, Stream};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tonic::Status;

use super::wire::{self, Bodies};
use crate::classify::FairnessId;
use crate::error::ProxyBody;
use crate::proxy::CREDENTIALS;
use crate::server::ClientAddr;
use crate::state::App;
use crate::upstream::relay::{endpoint, Answer, Picked, Relay, RelayEnds};
use crate::upstream::ClientBody;

type Inbound = tonic::Streaming<ProcessingRequest>;
/// The request path's run.
type Path = std::pin::Pin<Box<dyn std::future::Future<Output = http::Response<ProxyBody>> + Send>>;

/// One request's exchange: Envoy's messages read from `inbound`, and the
/// stream of answers to them (tonic's own task drives it: no hand-off
/// between tasks on the way), until the response ends or Envoy closes the
/// exchange (the stream is dropped, and the response with it).
pub(super) fn run(app: Arc<App>, peer: SocketAddr, mut inbound: Inbound) -> impl Stream<Item = Result<ProcessingResponse, Status>> + Send {
    async_stream::stream! {
        let Ok(Some(first)) = inbound.message().await else { return };
        let modes = wire::Modes::of(first.protocol_config.as_ref());
        let subset = wire::subset(first.metadata_context.as_ref());
        let Some(In::RequestHeaders(h)) = first.request else { return };
        let head = wire::headers(&h);
        let mut body = None;
        if !h.end_of_stream {
            match modes.request {
                // Envoy buffers the body once the headers are answered.
                Bodies::Buffered => yield Ok(wire::go_on_headers()),
                // The headers' answer waits for the body: it carries the pick.
                Bodies::FullDuplex => {}
                Bodies::Streamed | Bodies::NotSent => {
                    yield Ok(mode_refused(modes.request));
                    return;
                }
            }
            match read_body(&mut inbound, modes.request).await {
                Some(b) => body = Some(b),
                None => return,
            }
        }
        let Decided { path, answer, answers } = match decide(&app, peer, head, body, subset, modes.request).await {
            Ok(d) => d,
            Err(refused) => {
                yield Ok(refused);
                return;
            }
        };
        for a in answers {
            yield Ok(a);
        }

        // Envoy relays the replica's answer: its head goes to the request
        // path, whose observed response then takes each body chunk; what it
        // hands on answers the chunk.
        let h = loop {
            let Ok(Some(msg)) = inbound.message().await else { return };
            match msg.request {
                Some(In::ResponseHeaders(h)) => break h,
                // A buffered request's trailers, sent after its body.
                Some(In::RequestTrailers(_)) => yield Ok(wire::request_trailers()),
                _ => return,
            }
        };
        let head = wire::headers(&h);
        let (chunks_tx, chunks) = mpsc::unbounded_channel();
        if answer.send(Answer { head: response_head(&head), chunks }).is_err() {
            return;
        }
        let (ours, mut body) = path.await.into_parts();
        let (set, remove) = header_changes(&head.map, &ours.headers);
        yield Ok(wire::response_headers(set, remove));
        let (mut tx, mut last) = ((!h.end_of_stream).then_some(chunks_tx), Vec::new());
        while let Some(t) = tx.take() {
            let Ok(Some(msg)) = inbound.message().await else { return };
            let Some((answers, open)) = relay_chunk(msg.request, t, &mut body, modes.response) else { return };
            match open {
                Some(t) => {
                    tx = Some(t);
                    for a in answers {
                        yield Ok(a);
                    }
                }
                None => last = answers,
            }
        }
        // Ended: counted before the last answer goes, not when the stream is next polled.
        drain(&mut body);
        drop(body);
        for a in last {
            yield Ok(a);
        }
    }
}

/// One message of the response's body relayed into the observed body
/// (`tx`), and the answers to it: what the observed body hands on now,
/// and `tx` back while the body goes on (dropped at its end, so the
/// observed body ends before the last answers go). `None` for a message
/// that is not the response's.
fn relay_chunk(
    msg: Option<In>,
    tx: mpsc::UnboundedSender<Bytes>,
    body: &mut ProxyBody,
    bodies: Bodies,
) -> Option<(Vec<ProcessingResponse>, Option<mpsc::UnboundedSender<Bytes>>)> {
    let (data, end, trailers) = match msg? {
        In::ResponseBody(chunk) => (Bytes::from(chunk.body), chunk.end_of_stream, false),
        // Trailers end the body (in full duplex, they say so).
        In::ResponseTrailers(_) => (Bytes::new(), true, true),
        _ => return None,
    };
    if !data.is_empty() {
        let _ = tx.send(data.clone());
    }
    let open = (!end).then_some(tx);
    let handed = drain(body);
    // A trailers message takes a trailers answer; only in full duplex can
    // bytes still to hand on go before it.
    let bytes_due = !trailers || (bodies == Bodies::FullDuplex && !handed.is_empty());
    let mut answers = if bytes_due { wire::response_body(&handed, handed != data, end && !trailers, bodies) } else { Vec::new() };
    if trailers {
        answers.push(wire::response_trailers());
    }
    Some((answers, open))
}

/// The request path run on the request, up to its pick: the path itself,
/// where the replica's answer goes, and the answers that carry the pick.
struct Decided {
    path: Path,
    answer: tokio::sync::oneshot::Sender<Answer>,
    answers: Vec<ProcessingResponse>,
}

/// Run the request path on the request Envoy sent, up to its pick, or its
/// own answer (a refusal) as Envoy's immediate response.
async fn decide(
    app: &Arc<App>,
    peer: SocketAddr,
    head: wire::Headers,
    body: Option<(Bytes, bool)>,
    subset: Option<Vec<String>>,
    bodies: Bodies,
) -> Result<Decided, ProcessingResponse> {
    // From the whole request (the client's time to send its body is not the picker's).
    let since = tokio::time::Instant::now();
    let strip = app.snapshot().classifier.has_keys();
    let (sent, trailers) = match body {
        Some((b, t)) => (Some(b), t),
        None => (None, false),
    };
    let (req, ends) = request(head, sent.clone(), subset);
    // A pick removes the caller's credentials: they stay with the gateway, as in proxy mode.
    let remove: Vec<String> =
        if strip { CREDENTIALS.iter().filter(|h| req.headers().contains_key(*h)).map(|h| h.to_string()).collect() } else { Vec::new() };
    // Polled here, not spawned: the pick and the answer's head reach it
    // with no hand-off between tasks.
    let mut path: Path = Box::pin(crate::proxy::handle(req, app.clone(), Arc::new(ClientAddr::new(peer))));
    let decided = picked(&mut path, ends.pick).await;
    app.metrics.epp_decision.observe(since.elapsed().as_secs_f64());
    let Picked { replica, body } = decided?;
    let pick = wire::Pick { destination: endpoint(&replica), set: Vec::new(), remove, body: body.map(|b| b.to_vec()) };
    let answers = wire::picked(pick, sent.as_deref(), bodies, trailers);
    Ok(Decided { path, answer: ends.answer, answers })
}

/// A request body Envoy will not hand over whole: slogate picks by what
/// the body says (the model, the prompt), so the filter must send it
/// buffered or in full duplex. Said to the caller, and in the log.
fn mode_refused(mode: Bodies) -> ProcessingResponse {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let why = "the endpoint picker needs the request body before it picks: set the ext_proc filter's \
               processing_mode.request_body_mode to BUFFERED or FULL_DUPLEX_STREAMED";
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(mode = ?mode, "epp: {why}");
    }
    let body = serde_json::json!({ "error": { "message": why, "type": "server_error", "code": "epp_body_mode" } });
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    wire::immediate(500, &headers, body.to_string().into_bytes())
}

/// The path's decision: the pick, or its own answer (a refusal, an error)
/// as Envoy's immediate response.
async fn picked(path: &mut Path, mut pick: tokio::sync::oneshot::Receiver<Picked>) -> Result<Picked, ProcessingResponse> {
    let done = tokio::select! {
        picked = &mut pick => match picked {
            Ok(p) => Ok(p),
            // The path ended without a pick: its answer is due.
            Err(_) => Err(path.await),
        },
        done = &mut *path => Err(done),
    };
    match done {
        Ok(p) => Ok(p),
        Err(answered) => Err(immediate(answered).await),
    }
}

/// The request's body: one message when Envoy buffers it, else its chunks
/// up to the last, or up to its trailers (`true` with it when they came).
/// `None` when Envoy closed the stream or sent something else.
async fn read_body(inbound: &mut Inbound, bodies: Bodies) -> Option<(Bytes, bool)> {
    let mut body = bytes::BytesMut::new();
    loop {
        match inbound.message().await.ok()??.request {
            Some(In::RequestBody(b)) => {
                body.extend_from_slice(&b.body);
                if b.end_of_stream || bodies == Bodies::Buffered {
                    return Some((body.freeze(), false));
                }
            }
            Some(In::RequestTrailers(_)) => return Some((body.freeze(), true)),
            _ => return None,
        }
    }
}

/// The request the path runs, with the relay it hands its pick to.
fn request(head: wire::Headers, body: Option<Bytes>, subset: Option<Vec<String>>) -> (http::Request<ClientBody>, RelayEnds) {
    let (relay, ends) = Relay::new(subset);
    let mut req = http::Request::new(ClientBody::Whole(body));
    *req.method_mut() = head.method.as_deref().and_then(|m| m.parse().ok()).unwrap_or(http::Method::POST);
    *req.uri_mut() = head.path.as_deref().and_then(|p| p.parse().ok()).unwrap_or_else(|| http::Uri::from_static("/"));
    *req.headers_mut() = head.map;
    objective_as_class(req.headers_mut());
    if let Some(flow) = req.headers().get("x-llm-d-inference-fairness-id").and_then(FairnessId::of) {
        req.extensions_mut().insert(flow);
    }
    req.extensions_mut().insert(relay);
    (req, ends)
}

/// The replica's response head as Envoy relays it, but for the headers of
/// one hop (as a replica's own answer is read).
fn response_head(head: &wire::Headers) -> http::response::Parts {
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = head.status.and_then(|s| http::StatusCode::from_u16(s).ok()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let end_to_end = head.map.iter().filter(|(k, _)| !crate::upstream::HOP_BY_HOP.contains(k));
    parts.headers = end_to_end.map(|(k, v)| (k.clone(), v.clone())).collect();
    parts
}

/// The Gateway API Inference Extension's objective header names the class
/// where the request names none (`x-slo-class` wins).
fn objective_as_class(h: &mut http::HeaderMap) {
    if h.contains_key("x-slo-class") {
        return;
    }
    if let Some(v) = h.get("x-llm-d-inference-objective").cloned() {
        h.insert("x-slo-class", v);
    }
}

/// slogate's own answer as Envoy's immediate response.
async fn immediate(resp: http::Response<ProxyBody>) -> ProcessingResponse {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default();
    wire::immediate(parts.status.as_u16(), &parts.headers, body)
}

/// Everything the observed body hands on now (it has taken what was sent
/// into it): the bytes for the chunk's answer (one frame, most often, as it is).
fn drain(body: &mut ProxyBody) -> Bytes {
    let mut first: Option<Bytes> = None;
    let mut more: Option<bytes::BytesMut> = None;
    while let Some(Some(Ok(frame))) = body.frame().now_or_never() {
        let Ok(d) = frame.into_data() else { continue };
        match (&first, &mut more) {
            (None, _) => first = Some(d),
            (Some(f), None) => {
                let mut m = bytes::BytesMut::from(&f[..]);
                m.extend_from_slice(&d);
                more = Some(m);
            }
            (Some(_), Some(m)) => m.extend_from_slice(&d),
        }
    }
    match more {
        Some(m) => m.freeze(),
        None => first.unwrap_or_default(),
    }
}

/// The response headers slogate's path set or dropped (its own headers,
/// a length no longer true), against the replica's as Envoy has them.
fn header_changes(theirs: &http::HeaderMap, ours: &http::HeaderMap) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let set =
        ours.iter().filter(|(k, v)| theirs.get(*k) != Some(*v)).map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec())).collect();
    let remove = ["content-length"].iter().filter(|k| theirs.contains_key(**k) && !ours.contains_key(**k)).map(|k| k.to_string()).collect();
    (set, remove)
}
