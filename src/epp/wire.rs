//! What slogate reads from and writes to Envoy's `ext_proc` messages:
//! header maps both ways, the body modes Envoy announces, the pick's
//! header mutation and metadata, bodies streamed back, an immediate
//! response.

use envoy_types::pb::envoy::config::core::v3::{header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingResponse, ProtocolConfiguration, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// Where the pick goes: a header Envoy's original-destination cluster
/// reads, and the same under the `envoy.lb` metadata namespace.
pub(super) const DESTINATION: &str = "x-gateway-destination-endpoint";
const METADATA_NAMESPACE: &str = "envoy.lb";
/// Where Envoy may name the endpoints to pick among.
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The largest body chunk streamed back in one message (Envoy's advice
/// for `FULL_DUPLEX_STREAMED`).
const STREAMED_CHUNK: usize = 64 * 1024;

/// How Envoy sends a request's or a response's body to the picker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bodies {
    /// Whole, in one message, after the headers' answer (`BUFFERED`,
    /// `BUFFERED_PARTIAL`).
    Buffered,
    /// In chunks, each answered as it comes (`STREAMED`).
    Streamed,
    /// In chunks, with the answers streamed back on their own
    /// (`FULL_DUPLEX_STREAMED`): the headers' answer may wait for the body.
    FullDuplex,
    /// Not at all (`NONE`).
    NotSent,
}

/// The body modes of one exchange, as Envoy announces them in its first
/// message (`protocol_config`). An Envoy that announces none is taken to
/// send what the project's own Envoy configuration asks for: the request
/// buffered, the response streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Modes {
    pub(super) request: Bodies,
    pub(super) response: Bodies,
}

impl Modes {
    pub(super) fn of(config: Option<&ProtocolConfiguration>) -> Modes {
        let Some(c) = config else { return Modes { request: Bodies::Buffered, response: Bodies::Streamed } };
        let bodies = |mode: i32| match BodySendMode::try_from(mode) {
            Ok(BodySendMode::Buffered | BodySendMode::BufferedPartial) => Bodies::Buffered,
            Ok(BodySendMode::FullDuplexStreamed) => Bodies::FullDuplex,
            Ok(BodySendMode::None) => Bodies::NotSent,
            // STREAMED, and modes slogate does not know (gRPC's).
            _ => Bodies::Streamed,
        };
        Modes { request: bodies(c.request_body_mode), response: bodies(c.response_body_mode) }
    }
}

/// A request's or response's headers as `http` has them, with the
/// pseudo-headers (`:method`, `:path`, `:status`) apart.
pub(super) struct Headers {
    pub(super) map: http::HeaderMap,
    pub(super) method: Option<String>,
    pub(super) path: Option<String>,
    pub(super) status: Option<u16>,
}

/// Envoy's header list read into [`Headers`]; a header `http` cannot hold is skipped.
pub(super) fn headers(h: &HttpHeaders) -> Headers {
    let mut out = Headers { map: http::HeaderMap::new(), method: None, path: None, status: None };
    for hv in h.headers.iter().flat_map(|m| m.headers.iter()) {
        let value: &[u8] = if hv.raw_value.is_empty() { hv.value.as_bytes() } else { &hv.raw_value };
        let text = || String::from_utf8_lossy(value).into_owned();
        match hv.key.as_str() {
            ":method" => out.method = Some(text()),
            ":path" => out.path = Some(text()),
            ":status" => out.status = text().parse().ok(),
            k if k.starts_with(':') => {}
            k => {
                if let (Ok(name), Ok(v)) = (http::HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_bytes(value)) {
                    out.map.append(name, v);
                }
            }
        }
    }
    out
}

fn set(key: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue { key: key.to_string(), value: String::new(), raw_value: value.to_vec() }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_string())) }
}

/// What the request carries to the replica: the pick (`ip:port`), the
/// headers to set and remove, the body if slogate changed it.
pub(super) struct Pick {
    pub(super) destination: String,
    pub(super) set: Vec<(String, Vec<u8>)>,
    pub(super) remove: Vec<String>,
    pub(super) body: Option<Vec<u8>>,
}

/// The pick's common response: the destination header, the headers
/// changed, `content-length` and the body if it was rewritten, the route
/// cache cleared (the route may depend on the header).
fn pick_common(p: Pick) -> CommonResponse {
    let mut set_headers = vec![set(DESTINATION, p.destination.as_bytes())];
    set_headers.extend(p.set.iter().map(|(k, v)| set(k, v)));
    let mut remove_headers = p.remove;
    let body_mutation = p.body.map(|b| {
        set_headers.push(set("content-length", b.len().to_string().as_bytes()));
        BodyMutation { mutation: Some(body_mutation::Mutation::Body(b)) }
    });
    remove_headers.retain(|h| !set_headers.iter().any(|s| s.header.as_ref().is_some_and(|x| x.key == *h)));
    CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers, remove_headers }),
        body_mutation,
        clear_route_cache: true,
        ..Default::default()
    }
}

/// The `envoy.lb` metadata naming the pick.
fn pick_metadata(destination: &str) -> Struct {
    let inner = Struct { fields: [(DESTINATION.to_string(), string(destination))].into_iter().collect() };
    Struct { fields: [(METADATA_NAMESPACE.to_string(), Value { kind: Some(Kind::StructValue(inner)) })].into_iter().collect() }
}

/// The answers that carry the pick, in order. A request without a body
/// is answered on its headers. A buffered body is answered on the body
/// (its headers were answered, unchanged, before it came). In full duplex
/// the headers' answer waited for the body: it carries the pick, and the
/// body (slogate's or the client's own, `body`) is streamed back after
/// it, in chunks, then the trailers' answer if Envoy sent trailers.
pub(super) fn picked(p: Pick, body: Option<&[u8]>, bodies: Bodies, trailers: bool) -> Vec<ProcessingResponse> {
    let metadata = Some(pick_metadata(&p.destination));
    let answer = |r| ProcessingResponse { response: Some(r), dynamic_metadata: metadata.clone(), ..Default::default() };
    match (body, bodies) {
        (Some(body), Bodies::FullDuplex) => {
            let mut p = p;
            // The client's own body is streamed back from where it lies: no copy before the chunks'.
            let rewritten = p.body.take();
            let whole: &[u8] = rewritten.as_deref().unwrap_or(body);
            let mut common = pick_common(p);
            if let Some(m) = common.header_mutation.as_mut() {
                m.set_headers.push(set("content-length", whole.len().to_string().as_bytes()));
                m.remove_headers.retain(|h| h != "content-length");
            }
            let headers = answer(processing_response::Response::RequestHeaders(HeadersResponse { response: Some(common) }));
            let mut out = vec![headers];
            out.extend(streamed(whole, !trailers, processing_response::Response::RequestBody));
            if trailers {
                out.push(request_trailers());
            }
            out
        }
        (Some(_), _) => vec![answer(processing_response::Response::RequestBody(BodyResponse { response: Some(pick_common(p)) }))],
        (None, _) => vec![answer(processing_response::Response::RequestHeaders(HeadersResponse { response: Some(pick_common(p)) }))],
    }
}

/// `body` streamed back in chunks of at most [`STREAMED_CHUNK`], the last
/// one marked `end` (at least one message, for an empty body).
fn streamed(body: &[u8], end: bool, kind: fn(BodyResponse) -> processing_response::Response) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> = if body.is_empty() { vec![body] } else { body.chunks(STREAMED_CHUNK).collect() };
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let r = StreamedBodyResponse { body: c.to_vec(), end_of_stream: end && i == last, ..Default::default() };
            let mutation = BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(r)) };
            let common = CommonResponse { body_mutation: Some(mutation), ..Default::default() };
            ProcessingResponse { response: Some(kind(BodyResponse { response: Some(common) })), ..Default::default() }
        })
        .collect()
}

/// Go on, unchanged: the answer to request headers whose body is to come.
pub(super) fn go_on_headers() -> ProcessingResponse {
    let r = processing_response::Response::RequestHeaders(HeadersResponse::default());
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The answer to a request's trailers: unchanged.
pub(super) fn request_trailers() -> ProcessingResponse {
    let r = processing_response::Response::RequestTrailers(TrailersResponse::default());
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The answer to the response's headers: `set` and `remove` applied.
pub(super) fn response_headers(set_h: Vec<(String, Vec<u8>)>, remove: Vec<String>) -> ProcessingResponse {
    let set_headers = set_h.iter().map(|(k, v)| set(k, v)).collect();
    let common = CommonResponse { header_mutation: Some(HeaderMutation { set_headers, remove_headers: remove }), ..Default::default() };
    let r = processing_response::Response::ResponseHeaders(HeadersResponse { response: Some(common) });
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The answers to a response body chunk: in full duplex, the bytes
/// slogate hands on (`handed`), streamed back, `end` on the last; else
/// one answer, with `handed` in the chunk's place where it differs from
/// what came (`changed`), or the chunk as it came.
pub(super) fn response_body(handed: &[u8], changed: bool, end: bool, bodies: Bodies) -> Vec<ProcessingResponse> {
    if bodies == Bodies::FullDuplex {
        return streamed(handed, end, processing_response::Response::ResponseBody);
    }
    let body_mutation = changed.then(|| BodyMutation { mutation: Some(body_mutation::Mutation::Body(handed.to_vec())) });
    let common = CommonResponse { body_mutation, ..Default::default() };
    let r = processing_response::Response::ResponseBody(BodyResponse { response: Some(common) });
    vec![ProcessingResponse { response: Some(r), ..Default::default() }]
}

/// The answer to the response's trailers: unchanged.
pub(super) fn response_trailers() -> ProcessingResponse {
    let r = processing_response::Response::ResponseTrailers(TrailersResponse::default());
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// slogate's own answer (a refusal, an error), sent by Envoy instead of
/// going to any replica.
pub(super) fn immediate(status: u16, headers: &http::HeaderMap, body: Vec<u8>) -> ProcessingResponse {
    let set_headers = headers
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "content-length" | "transfer-encoding" | "connection"))
        .map(|(k, v)| set(k.as_str(), v.as_bytes()))
        .collect();
    let r = processing_response::Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation { set_headers, remove_headers: Vec::new() }),
        body,
        ..Default::default()
    });
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The endpoints Envoy allows for this request (`envoy.lb.subset_hint`),
/// if it names any: `None` when it says nothing.
pub(super) fn subset(metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>) -> Option<Vec<String>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = hint.fields.get(SUBSET_KEY)?;
    let Some(Kind::ListValue(ListValue { values })) = &list.kind else { return Some(Vec::new()) };
    Some(
        values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(body: Option<Vec<u8>>) -> Pick {
        Pick { destination: "10.0.0.1:8000".into(), set: Vec::new(), remove: vec!["authorization".into()], body }
    }

    fn streamed_body(r: &ProcessingResponse) -> (Vec<u8>, bool) {
        let Some(processing_response::Response::RequestBody(b)) = &r.response else { panic!("a body answer: {r:?}") };
        let m = b.response.as_ref().and_then(|c| c.body_mutation.as_ref()).and_then(|m| m.mutation.as_ref());
        let Some(body_mutation::Mutation::StreamedResponse(s)) = m else { panic!("streamed: {r:?}") };
        (s.body.clone(), s.end_of_stream)
    }

    #[test]
    fn modes_are_read_from_the_protocol_config_and_default_to_the_shipped_ones() {
        assert_eq!(Modes::of(None), Modes { request: Bodies::Buffered, response: Bodies::Streamed });
        let c = |req: BodySendMode, resp: BodySendMode| ProtocolConfiguration {
            request_body_mode: req as i32,
            response_body_mode: resp as i32,
            send_body_without_waiting_for_header_response: false,
        };
        let m = Modes::of(Some(&c(BodySendMode::FullDuplexStreamed, BodySendMode::FullDuplexStreamed)));
        assert_eq!(m, Modes { request: Bodies::FullDuplex, response: Bodies::FullDuplex });
        let m = Modes::of(Some(&c(BodySendMode::BufferedPartial, BodySendMode::Streamed)));
        assert_eq!(m, Modes { request: Bodies::Buffered, response: Bodies::Streamed });
        assert_eq!(Modes::of(Some(&c(BodySendMode::None, BodySendMode::None))).request, Bodies::NotSent);
    }

    /// In full duplex the headers' answer carries the pick and the body's
    /// length, then the body goes back whole in chunks of at most 64 KiB,
    /// the last alone marked as the end, then the trailers' answer.
    #[test]
    fn in_full_duplex_the_pick_goes_on_the_headers_and_the_body_follows_in_chunks() {
        let body = vec![b'x'; 3 * STREAMED_CHUNK + 10];
        for trailers in [false, true] {
            let out = picked(pick(None), Some(&body), Bodies::FullDuplex, trailers);
            let Some(processing_response::Response::RequestHeaders(h)) = &out[0].response else { panic!("headers first: {out:?}") };
            let common = h.response.as_ref().expect("common");
            assert!(common.clear_route_cache);
            let m = common.header_mutation.as_ref().expect("mutation");
            let value = |k: &str| m.set_headers.iter().filter_map(|h| h.header.as_ref()).find(|h| h.key == k).map(|h| h.raw_value.clone());
            assert_eq!(value(DESTINATION), Some(b"10.0.0.1:8000".to_vec()));
            assert_eq!(value("content-length"), Some(body.len().to_string().into_bytes()));
            assert_eq!(m.remove_headers, vec!["authorization".to_string()]);
            assert!(out[0].dynamic_metadata.is_some());
            let chunks: Vec<(Vec<u8>, bool)> = out[1..5].iter().map(streamed_body).collect();
            assert!(chunks.iter().all(|(c, _)| c.len() <= STREAMED_CHUNK));
            assert_eq!(chunks.iter().flat_map(|(c, _)| c.clone()).collect::<Vec<u8>>(), body);
            let ends: Vec<bool> = chunks.iter().map(|(_, e)| *e).collect();
            assert_eq!(ends, [false, false, false, !trailers], "trailers: {trailers}");
            assert_eq!(out.len(), 5 + usize::from(trailers));
            if trailers {
                assert!(matches!(out[5].response, Some(processing_response::Response::RequestTrailers(_))));
            }
        }
        // A body slogate rewrote goes instead of the client's.
        let out = picked(pick(Some(b"{\"new\":1}".to_vec())), Some(b"{\"old\":true}"), Bodies::FullDuplex, false);
        assert_eq!(streamed_body(&out[1]), (b"{\"new\":1}".to_vec(), true));
        assert_eq!(out.len(), 2);
    }

    /// Buffered, the pick answers the body (its headers went on before);
    /// without a body, it answers the headers; a response chunk is left
    /// as it came unless slogate changed it.
    #[test]
    fn buffered_and_streamed_answers_are_one_per_message() {
        let out = picked(pick(None), Some(b"{}"), Bodies::Buffered, false);
        assert!(matches!(&out[..], [ProcessingResponse { response: Some(processing_response::Response::RequestBody(_)), .. }]));
        let out = picked(pick(None), None, Bodies::FullDuplex, false);
        assert!(matches!(&out[..], [ProcessingResponse { response: Some(processing_response::Response::RequestHeaders(_)), .. }]));
        let unchanged = response_body(b"data: x\n\n", false, false, Bodies::Streamed);
        let Some(processing_response::Response::ResponseBody(b)) = &unchanged[0].response else { panic!() };
        assert!(b.response.as_ref().expect("common").body_mutation.is_none());
        let duplex = response_body(b"", false, true, Bodies::FullDuplex);
        assert_eq!(duplex.len(), 1, "an empty last chunk still ends the body");
    }
}
