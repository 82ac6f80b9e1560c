//! What slogate reads from and writes to Envoy's `ext_proc` messages:
//! header maps both ways, the pick's header mutation and metadata, an
//! immediate response.

use envoy_types::pb::envoy::config::core::v3::{header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// Where the pick goes: a header Envoy's original-destination cluster
/// reads, and the same under the `envoy.lb` metadata namespace.
pub(super) const DESTINATION: &str = "x-gateway-destination-endpoint";
const METADATA_NAMESPACE: &str = "envoy.lb";
/// Where Envoy may name the endpoints to pick among.
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

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

/// The answer that carries the pick: to the request's body, or to its
/// headers when it had none.
pub(super) fn picked(p: Pick, to_body: bool) -> ProcessingResponse {
    let metadata = pick_metadata(&p.destination);
    let response = Some(pick_common(p));
    let r = if to_body {
        processing_response::Response::RequestBody(BodyResponse { response })
    } else {
        processing_response::Response::RequestHeaders(HeadersResponse { response })
    };
    ProcessingResponse { response: Some(r), dynamic_metadata: Some(metadata), ..Default::default() }
}

/// Go on, unchanged: the answer to request headers whose body is to come.
pub(super) fn go_on_headers() -> ProcessingResponse {
    let r = processing_response::Response::RequestHeaders(HeadersResponse::default());
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The answer to the response's headers: `set` and `remove` applied.
pub(super) fn response_headers(set_h: Vec<(String, Vec<u8>)>, remove: Vec<String>) -> ProcessingResponse {
    let set_headers = set_h.iter().map(|(k, v)| set(k, v)).collect();
    let common = CommonResponse { header_mutation: Some(HeaderMutation { set_headers, remove_headers: remove }), ..Default::default() };
    let r = processing_response::Response::ResponseHeaders(HeadersResponse { response: Some(common) });
    ProcessingResponse { response: Some(r), ..Default::default() }
}

/// The answer to a response body chunk: `body` in its place, or the chunk
/// as it came (`None`).
pub(super) fn response_body(body: Option<Vec<u8>>) -> ProcessingResponse {
    let body_mutation = body.map(|b| BodyMutation { mutation: Some(body_mutation::Mutation::Body(b)) });
    let common = CommonResponse { body_mutation, ..Default::default() };
    let r = processing_response::Response::ResponseBody(BodyResponse { response: Some(common) });
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
