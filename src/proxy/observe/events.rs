//! The bytes slogate writes into an observed stream: the events of a
//! replica's read as the client gets them (less those cut, with those put
//! instead), and the last events of a stream slogate ends (an error, or a
//! key's limits reached).

use bytes::{Bytes, BytesMut};

/// What the client gets of a read (`data`, after the `pending` bytes
/// held from earlier reads): the events that completed in it, up to
/// `complete_end` of `data`, less those `cuts` remove (or with what they
/// put instead); the rest of `data` is held.
///
/// A read of whole events with nothing held or cut (most reads) is handed
/// on as it came: the replica connection copied it out of its read buffer
/// already, into a small block its thread's streams share, so handing it
/// on keeps no buffer of this stream's alive. The others are put together
/// in a buffer of their own size: a stream keeps no buffer of its own
/// between events.
pub(super) fn splice_read(
    pending: &mut BytesMut,
    data: Bytes,
    cuts: Vec<(usize, usize, Option<Bytes>)>,
    complete_end: usize,
) -> Option<Bytes> {
    let p = pending.len();
    if p == 0 && cuts.is_empty() {
        pending.extend_from_slice(&data[complete_end..]);
        return Some(data.slice(..complete_end)).filter(|b| !b.is_empty());
    }
    let need = p + complete_end;
    let put: usize = cuts.iter().filter_map(|c| c.2.as_ref().map(Bytes::len)).sum();
    let mut out = BytesMut::with_capacity(need + put);
    // Offsets are in `pending ++ data`.
    let append = |buf: &mut BytesMut, a: usize, b: usize| {
        if a < p {
            buf.extend_from_slice(&pending[a..b.min(p)]);
        }
        if b > p {
            buf.extend_from_slice(&data[a.max(p) - p..b - p]);
        }
    };
    let mut pos = 0;
    for (s, e, instead) in cuts {
        append(&mut out, pos, s);
        if let Some(instead) = instead {
            out.extend_from_slice(&instead);
        }
        pos = e;
    }
    append(&mut out, pos, need);
    // What is held is small (part of one event): its buffer goes once empty.
    *pending = BytesMut::from(&data[complete_end..]);
    Some(out.freeze()).filter(|b| !b.is_empty())
}

/// The last events of a stream its key's limits ended: a `length` finish
/// in the endpoint's own shape (the Responses API's `response.incomplete`
/// for `max_output_tokens`), then `[DONE]`.
pub(super) fn limit_event(endpoint: crate::config::Endpoint, id: &http::HeaderValue, model: &str) -> Bytes {
    use crate::config::Endpoint;
    let id = id.to_str().unwrap_or("");
    if endpoint == Endpoint::Messages {
        // Anthropic's end of a message capped by max_tokens.
        let delta = serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": 0}});
        return Bytes::from(format!("event: message_delta\ndata: {delta}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"));
    }
    let json = match endpoint {
        Endpoint::Responses => serde_json::json!({
            "type": "response.incomplete",
            "response": {"id": format!("resp_{id}"), "object": "response", "created_at": 0, "model": model, "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "output": []},
        }),
        Endpoint::Completions => serde_json::json!({
            "id": id, "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}],
        }),
        _ => serde_json::json!({
            "id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}],
        }),
    };
    let mut ev = BytesMut::new();
    if endpoint == Endpoint::Responses {
        ev.extend_from_slice(b"event: response.incomplete\n");
    }
    ev.extend_from_slice(b"data: ");
    ev.extend_from_slice(json.to_string().as_bytes());
    ev.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    ev.freeze()
}

/// An SSE error event in OpenAI's error form (with the request's id), then `[DONE]`.
pub(super) fn error_event(message: &str, kind: &str, code: u16, id: &http::HeaderValue, anthropic: bool) -> Bytes {
    let id = id.to_str().ok().filter(|i| !i.is_empty());
    if anthropic {
        // Anthropic's stream error: `event: error`, and no `[DONE]`.
        let ty = if code == 504 { "timeout_error" } else { "api_error" };
        let json = serde_json::json!({"type": "error", "error": {"type": ty, "message": message}, "request_id": id});
        return Bytes::from(format!("event: error\ndata: {json}\n\n"));
    }
    let json = crate::error::error_body(message, kind, None, code, id);
    let mut ev = BytesMut::with_capacity(json.len() + 32);
    ev.extend_from_slice(b"data: ");
    ev.extend_from_slice(&json);
    ev.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    ev.freeze()
}
