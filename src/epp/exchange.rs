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
use futures_util::FutureExt;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tonic::Status;

use super::wire;
use crate::error::ProxyBody;
use crate::server::ClientAddr;
use crate::state::App;
use crate::upstream::relay::{endpoint, Answer, Picked, Relay};
use crate::upstream::ClientBody;

type Out = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// The headers a pick removes: the caller's credentials stay with the
/// gateway, as in proxy mode.
const CREDENTIALS: [&str; 4] = ["authorization", "x-api-key", "api-key", "cookie"];

/// Serve one request's exchange: read Envoy's messages from `inbound`,
/// answer on `out`, until the response ends or Envoy closes the stream.
pub(super) async fn run(app: Arc<App>, peer: SocketAddr, mut inbound: tonic::Streaming<ProcessingRequest>, out: Out) {
    let client = Arc::new(ClientAddr::new(peer));
    let Some((head, body, subset)) = read_request(&mut inbound, &out).await else { return };
    // From the whole request (the client's time to send its body is not the picker's).
    let since = tokio::time::Instant::now();
    let to_body = body.is_some();
    let (relay, ends) = Relay::new(subset);
    let mut req = http::Request::new(ClientBody::Whole(body));
    *req.method_mut() = head.method.as_deref().and_then(|m| m.parse().ok()).unwrap_or(http::Method::POST);
    *req.uri_mut() = head.path.as_deref().and_then(|p| p.parse().ok()).unwrap_or_else(|| http::Uri::from_static("/"));
    *req.headers_mut() = head.map;
    objective_as_class(req.headers_mut());
    req.extensions_mut().insert(relay);
    let strip = app.snapshot().classifier.has_keys();
    let decision = app.metrics.epp_decision.clone();
    let original = req.headers().clone();
    let mut path = tokio::spawn(crate::proxy::handle(req, app, client));
    let mut pick = ends.pick;
    let done = tokio::select! {
        picked = &mut pick => match picked {
            Ok(p) => Ok(p),
            // The path ended without a pick: its answer is due.
            Err(_) => Err((&mut path).await),
        },
        done = &mut path => Err(done),
    };
    let Picked { replica, body } = match done {
        Ok(p) => p,
        Err(answered) => {
            // Answered without a pick: a refusal or an error, sent by Envoy instead.
            if let Ok(resp) = answered {
                let answer = immediate(resp).await;
                decision.observe(since.elapsed().as_secs_f64());
                let _ = out.send(Ok(answer)).await;
            }
            return;
        }
    };
    let remove =
        if strip { CREDENTIALS.iter().filter(|h| original.contains_key(**h)).map(|h| h.to_string()).collect() } else { Vec::new() };
    let changed = body.map(|b| b.to_vec());
    let pick = wire::Pick { destination: endpoint(&replica), set: Vec::new(), remove, body: changed };
    let answer = wire::picked(pick, to_body);
    decision.observe(since.elapsed().as_secs_f64());
    if out.send(Ok(answer)).await.is_err() {
        return;
    }
    relay_response(&mut inbound, &out, path, ends.answer).await;
}

/// The request's head, its body (`None`: it has none) and Envoy's subset
/// hint, answering the headers when a body follows; `None` when Envoy
/// closed the stream or sent something else first.
async fn read_request(
    inbound: &mut tonic::Streaming<ProcessingRequest>,
    out: &Out,
) -> Option<(wire::Headers, Option<Bytes>, Option<Vec<String>>)> {
    let first = inbound.message().await.ok()??;
    let subset = wire::subset(first.metadata_context.as_ref());
    let Some(In::RequestHeaders(h)) = first.request else { return None };
    let head = wire::headers(&h);
    if h.end_of_stream {
        return Some((head, None, subset));
    }
    out.send(Ok(wire::go_on_headers())).await.ok()?;
    let mut body = bytes::BytesMut::new();
    loop {
        match inbound.message().await.ok()??.request {
            Some(In::RequestBody(b)) => {
                body.extend_from_slice(&b.body);
                if b.end_of_stream {
                    return Some((head, Some(body.freeze()), subset));
                }
            }
            Some(In::RequestTrailers(_)) => return Some((head, Some(body.freeze()), subset)),
            _ => return None,
        }
    }
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

/// Envoy relays the replica's answer: its head goes to the request path
/// (`answer`), whose observed response then takes each body chunk; what it
/// hands on answers the chunk.
async fn relay_response(
    inbound: &mut tonic::Streaming<ProcessingRequest>,
    out: &Out,
    path: tokio::task::JoinHandle<http::Response<ProxyBody>>,
    answer: tokio::sync::oneshot::Sender<Answer>,
) {
    let Ok(Some(msg)) = inbound.message().await else { return };
    let Some(In::ResponseHeaders(h)) = msg.request else { return };
    let head = wire::headers(&h);
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = head.status.and_then(|s| http::StatusCode::from_u16(s).ok()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    parts.headers = head.map.clone();
    let (chunks_tx, chunks) = mpsc::unbounded_channel();
    if answer.send(Answer { head: parts, chunks }).is_err() {
        return;
    }
    let Ok(resp) = path.await else { return };
    let (ours, mut body) = resp.into_parts();
    let (set, remove) = header_changes(&head.map, &ours.headers);
    if out.send(Ok(wire::response_headers(set, remove))).await.is_err() {
        return;
    }
    let mut tx = Some(chunks_tx);
    if h.end_of_stream {
        tx = None;
        drain(&mut body);
    }
    while tx.is_some() {
        let Ok(Some(msg)) = inbound.message().await else { return };
        let Some(In::ResponseBody(chunk)) = msg.request else { return };
        let end = chunk.end_of_stream;
        let data = Bytes::from(chunk.body);
        if let Some(t) = &tx {
            let _ = t.send(data.clone());
        }
        if end {
            tx = None;
        }
        let handed = drain(&mut body);
        let body_out = (handed != data).then(|| handed.to_vec());
        if out.send(Ok(wire::response_body(body_out))).await.is_err() {
            return;
        }
    }
}

/// Everything the observed body hands on now (it has taken what was sent
/// into it): the bytes for the chunk's answer.
fn drain(body: &mut ProxyBody) -> Bytes {
    let mut handed = bytes::BytesMut::new();
    while let Some(frame) = body.frame().now_or_never() {
        match frame {
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    handed.extend_from_slice(&d);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    handed.freeze()
}

/// The response headers slogate's path set or dropped (its own headers,
/// a length no longer true), against the replica's as Envoy has them.
fn header_changes(theirs: &http::HeaderMap, ours: &http::HeaderMap) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let set =
        ours.iter().filter(|(k, v)| theirs.get(*k) != Some(*v)).map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec())).collect();
    let remove = ["content-length"].iter().filter(|k| theirs.contains_key(**k) && !ours.contains_key(**k)).map(|k| k.to_string()).collect();
    (set, remove)
}
