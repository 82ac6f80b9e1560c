//! One request's `ext_proc` exchange with Envoy (docs/endpoint-picker.md,
//! rules 2 to 6).
//!
//! Envoy sends the request's headers, then (buffered) its body. slogate
//! runs the request through its own request path ([`crate::proxy::handle`])
//! with a [`Relay`] where the path would send it: the path classifies,
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

use super::wire;
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
        let subset = wire::subset(first.metadata_context.as_ref());
        let Some(In::RequestHeaders(h)) = first.request else { return };
        let head = wire::headers(&h);
        let body = if h.end_of_stream {
            None
        } else {
            yield Ok(wire::go_on_headers());
            match read_body(&mut inbound).await {
                Some(b) => Some(b),
                None => return,
            }
        };
        // From the whole request (the client's time to send its body is not the picker's).
        let since = tokio::time::Instant::now();
        let decision = app.metrics.epp_decision.clone();
        let strip = app.snapshot().classifier.has_keys();
        let to_body = body.is_some();
        let (req, ends) = request(head, body, subset);
        // A pick removes the caller's credentials: they stay with the gateway, as in proxy mode.
        let remove: Vec<String> =
            if strip { CREDENTIALS.iter().filter(|h| req.headers().contains_key(*h)).map(|h| h.to_string()).collect() } else { Vec::new() };
        // Polled here, not spawned: the pick and the answer's head reach it
        // with no hand-off between tasks.
        let mut path: Path = Box::pin(crate::proxy::handle(req, app, Arc::new(ClientAddr::new(peer))));
        let decided = decide(&mut path, ends.pick).await;
        decision.observe(since.elapsed().as_secs_f64());
        let Picked { replica, body } = match decided {
            Ok(p) => p,
            Err(refused) => {
                yield Ok(refused);
                return;
            }
        };
        let pick = wire::Pick { destination: endpoint(&replica), set: Vec::new(), remove, body: body.map(|b| b.to_vec()) };
        yield Ok(wire::picked(pick, to_body));

        // Envoy relays the replica's answer: its head goes to the request
        // path, whose observed response then takes each body chunk; what it
        // hands on answers the chunk.
        let Ok(Some(msg)) = inbound.message().await else { return };
        let Some(In::ResponseHeaders(h)) = msg.request else { return };
        let head = wire::headers(&h);
        let (chunks_tx, chunks) = mpsc::unbounded_channel();
        if ends.answer.send(Answer { head: response_head(&head), chunks }).is_err() {
            return;
        }
        let (ours, mut body) = path.await.into_parts();
        let (set, remove) = header_changes(&head.map, &ours.headers);
        yield Ok(wire::response_headers(set, remove));
        let (mut tx, mut last) = ((!h.end_of_stream).then_some(chunks_tx), None);
        while let Some(t) = tx.take() {
            let Ok(Some(msg)) = inbound.message().await else { return };
            let Some(In::ResponseBody(chunk)) = msg.request else { return };
            let data = Bytes::from(chunk.body);
            let _ = t.send(data.clone());
            tx = (!chunk.end_of_stream).then_some(t);
            let handed = drain(&mut body);
            let answer = wire::response_body((handed != data).then(|| handed.to_vec()));
            match tx {
                Some(_) => yield Ok(answer),
                None => last = Some(answer),
            }
        }
        // Ended: counted before the last answer goes, not when the stream is next polled.
        drain(&mut body);
        drop(body);
        if let Some(answer) = last {
            yield Ok(answer);
        }
    }
}

/// The path's decision: the pick, or its own answer (a refusal, an error)
/// as Envoy's immediate response.
async fn decide(path: &mut Path, mut pick: tokio::sync::oneshot::Receiver<Picked>) -> Result<Picked, ProcessingResponse> {
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

/// The rest of a request's body, buffered by Envoy: `None` when Envoy
/// closed the stream or sent something else.
async fn read_body(inbound: &mut Inbound) -> Option<Bytes> {
    let mut body = bytes::BytesMut::new();
    loop {
        match inbound.message().await.ok()??.request {
            Some(In::RequestBody(b)) => {
                body.extend_from_slice(&b.body);
                if b.end_of_stream {
                    return Some(body.freeze());
                }
            }
            Some(In::RequestTrailers(_)) => return Some(body.freeze()),
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

/// The replica's response head as Envoy relays it.
fn response_head(head: &wire::Headers) -> http::response::Parts {
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = head.status.and_then(|s| http::StatusCode::from_u16(s).ok()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    parts.headers = head.map.clone();
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
