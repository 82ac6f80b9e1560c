//! Continuing a broken Anthropic Messages stream (docs/design/resume.md,
//! rules 17 to 19).
//!
//! vLLM's `/v1/messages` does not go on from a final assistant message (it
//! starts a new turn after it), so a continuation cannot be expressed in
//! the Messages API there. It is expressed in the chat API that vLLM
//! serves Messages with: the same conversation as vLLM renders it, the
//! text the client has as the assistant's message to go on from, sent to
//! `/v1/chat/completions` on another replica; that stream's chunks are
//! turned back into Anthropic's events. Only a text answer to a text
//! conversation is continued: an image, a tool, thinking, or a parameter
//! the chat request would not carry exactly make the stream not exact.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sse::{EventInfo, Piece, Usage};

/// Where a Messages continuation is sent.
pub(super) const CHAT_PATH: &str = "/v1/chat/completions";

/// The members of a Messages request a chat continuation carries exactly.
const CARRIED: [&str; 11] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "chat_template_kwargs",
];

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    delta: Option<Part<'a>>,
    #[serde(default, borrow)]
    content_block: Option<Part<'a>>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

/// What one Messages event adds to the answer the client has: the text of
/// its first content block, appended to `out`; any other block (a tool
/// use, thinking, a second block) is what a continuation cannot carry on from.
pub(super) fn piece(data: &[u8], out: &mut String) -> Piece {
    if memchr::memmem::find(data, b"\"content_block_").is_none() {
        return Piece::Nothing;
    }
    let Ok(ev) = sse::from_json::<Event<'_>>(data) else { return Piece::Nothing };
    let (part, delta) = match ev.kind.as_ref() {
        "content_block_start" => (ev.content_block, false),
        "content_block_delta" => (ev.delta, true),
        _ => return Piece::Nothing,
    };
    let Some(part) = part else { return Piece::Other };
    let text_kind = if delta { "text_delta" } else { "text" };
    if ev.index != 0 || part.kind != text_kind {
        return Piece::Other;
    }
    match part.text.filter(|t| !t.is_empty()) {
        Some(t) => {
            out.push_str(&t);
            Piece::Text
        }
        None => Piece::Nothing,
    }
}

/// A message's `content` as vLLM passes it to the chat template: a string
/// as it is, text blocks as one string (one block) or text parts; `None`
/// for anything but text.
fn content(v: &Value) -> Option<Value> {
    let blocks = match v {
        Value::String(s) => return Some(Value::String(s.clone())),
        Value::Array(blocks) => blocks,
        _ => return None,
    };
    let mut parts = Vec::new();
    for b in blocks {
        if b.get("type")?.as_str()? != "text" {
            return None;
        }
        let text = b.get("text")?.as_str()?;
        if !text.is_empty() {
            parts.push(text);
        }
    }
    Some(match parts.as_slice() {
        [one] => Value::String(one.to_string()),
        more => Value::Array(more.iter().map(|t| json!({"type": "text", "text": t})).collect()),
    })
}

/// The system prompt as vLLM gathers it: the `system` member (its text
/// blocks but a billing header's, which Claude Code varies per request)
/// and any system message, joined.
fn system(req: &Map<String, Value>) -> Option<String> {
    let mut parts = String::new();
    let mut add = |v: &Value| -> Option<()> {
        match v {
            Value::String(s) => parts.push_str(s),
            Value::Array(blocks) => {
                for b in blocks {
                    let text = b.get("text").and_then(Value::as_str).unwrap_or("");
                    if b.get("type")?.as_str()? != "text" {
                        return None;
                    }
                    if !text.starts_with("x-anthropic-billing-header") {
                        parts.push_str(text);
                    }
                }
            }
            Value::Null => {}
            _ => return None,
        }
        Some(())
    };
    if let Some(s) = req.get("system") {
        add(s)?;
    }
    for m in req.get("messages")?.as_array()? {
        if m.get("role").and_then(Value::as_str) == Some("system") {
            add(m.get("content")?)?;
        }
    }
    Some(parts)
}

/// The chat request that continues the Messages answer of `request` from
/// the client's `text` (`sent` tokens), or `None` when it cannot be exact.
pub(super) fn continuation(request: &[u8], text: &str, sent: u64) -> Option<Bytes> {
    let req: Map<String, Value> = serde_json::from_slice(request).ok()?;
    if req.keys().any(|k| !CARRIED.contains(&k.as_str())) {
        return None;
    }
    let left = req.get("max_tokens")?.as_u64()?.checked_sub(sent).filter(|l| *l > 0)?;
    let mut messages = Vec::new();
    let sys = system(&req)?;
    if !sys.is_empty() {
        messages.push(json!({"role": "system", "content": sys}));
    }
    for m in req.get("messages")?.as_array()? {
        let role = m.get("role")?.as_str()?;
        match role {
            "system" => continue,
            "user" | "assistant" => messages.push(json!({"role": role, "content": content(m.get("content")?)?})),
            _ => return None,
        }
    }
    messages.push(json!({"role": "assistant", "content": text}));
    let mut out = Map::new();
    out.insert("model".into(), req.get("model")?.clone());
    out.insert("messages".into(), Value::Array(messages));
    out.insert("max_tokens".into(), left.into());
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("stop_sequences", "stop")] {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(k) = req.get("chat_template_kwargs") {
        out.insert("chat_template_kwargs".into(), k.clone());
    }
    out.insert("stream".into(), true.into());
    out.insert("stream_options".into(), json!({"include_usage": true}));
    out.insert("continue_final_message".into(), true.into());
    out.insert("add_generation_prompt".into(), false.into());
    serde_json::to_vec(&out).ok().map(Bytes::from)
}

/// How a continuation's end is told in Anthropic's events.
#[derive(Default)]
pub(super) struct Ending {
    /// The continuation's finish, in Anthropic's words.
    stop: Option<&'static str>,
    /// `message_delta` was sent.
    told: bool,
}

/// One Anthropic event.
fn event(kind: &str, data: &Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ => "end_turn",
    }
}

/// A continuation's chat chunk as the Anthropic events the client reads:
/// its text as a `text_delta` of the first block, its finish as the
/// block's end, its usage (`whole`: the whole answer's) as `message_delta`,
/// `[DONE]` as `message_stop`. The role chunk and the rest: nothing.
pub(super) fn rewrite(end: &mut Ending, data: &[u8], info: &EventInfo, whole: impl Fn(Usage) -> Usage, sent: u64) -> Option<Bytes> {
    let mut out = String::new();
    if info.error {
        let message = serde_json::from_slice::<Value>(data)
            .ok()
            .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| "the replica's stream failed".into());
        out.push_str(&event("error", &json!({"type": "error", "error": {"type": "api_error", "message": message}})));
        return Some(Bytes::from(out));
    }
    if info.content {
        let mut text = String::new();
        sse::analyze_text(data, &mut text);
        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}});
        out.push_str(&event("content_block_delta", &delta));
    }
    if let Some(f) = &info.finish_reason {
        end.stop = Some(stop_reason(f));
        out.push_str(&event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
    }
    let tell = |end: &mut Ending, out: &mut String, output: u64| {
        let delta =
            json!({"type": "message_delta", "delta": {"stop_reason": end.stop, "stop_sequence": null}, "usage": {"output_tokens": output}});
        out.push_str(&event("message_delta", &delta));
        end.told = true;
    };
    if let (Some(u), Some(_), false) = (info.usage, end.stop, end.told) {
        tell(end, &mut out, whole(u).completion_tokens);
    }
    if info.done {
        if !end.told {
            tell(end, &mut out, sent);
        }
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
    }
    (!out.is_empty()).then(|| Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_of_the_first_block_is_what_the_client_has() {
        let mut out = String::new();
        let ev = |s: &str| piece(s.as_bytes(), &mut String::new());
        assert_eq!(ev(r#"{"type":"message_start","message":{"id":"m"}}"#), Piece::Nothing);
        assert_eq!(ev(r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#), Piece::Nothing);
        let hi = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi \"you\""}}"#;
        assert_eq!(piece(hi.as_bytes(), &mut out), Piece::Text);
        assert_eq!(out, "Hi \"you\"");
        for other in [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"b"}}"#,
        ] {
            assert_eq!(ev(other), Piece::Other, "{other}");
        }
    }

    #[test]
    fn a_continuation_is_the_chat_request_vllm_would_render_going_on_from_the_text() {
        let req = br#"{"model":"m","max_tokens":10,"stream":true,"system":[{"type":"text","text":"x-anthropic-billing-header: 1"},{"type":"text","text":"Be brief."}],
            "messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},{"role":"assistant","content":"Hello"},{"role":"user","content":"Go on"}],
            "temperature":0.5,"stop_sequences":["END"],"metadata":{"user_id":"u"}}"#;
        let got: Value = serde_json::from_slice(&continuation(req, "Once upon", 3).expect("exact")).expect("JSON");
        assert_eq!(
            got["messages"],
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Go on"}, {"role": "assistant", "content": "Once upon"}])
        );
        assert_eq!((got["max_tokens"].as_u64(), got["stop"].clone(), got["temperature"].as_f64()), (Some(7), json!(["END"]), Some(0.5)));
        assert_eq!((got["continue_final_message"].as_bool(), got["add_generation_prompt"].as_bool()), (Some(true), Some(false)));
        assert_eq!(got["stream_options"], json!({"include_usage": true}));
        assert!(got.get("metadata").is_none() && got.get("system").is_none());
        for not in [
            r#"{"model":"m","max_tokens":10,"messages":[],"tools":[{"name":"f"}]}"#,
            r#"{"model":"m","max_tokens":10,"messages":[],"thinking":{"type":"enabled"}}"#,
            r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#,
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","max_tokens":3,"messages":[]}"#,
        ] {
            assert!(continuation(not.as_bytes(), "x", 3).is_none(), "{not}");
        }
    }

    #[test]
    fn a_continuations_chunks_read_as_anthropics_events() {
        let mut end = Ending::default();
        let whole = |u: Usage| Usage { completion_tokens: u.completion_tokens + 3, ..u };
        let mut read = |chunk: &str| {
            let b = rewrite(&mut end, chunk.as_bytes(), &sse::analyze(chunk.as_bytes()), whole, 3);
            b.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
        };
        assert_eq!(read(r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#), "");
        let text = read(r#"{"id":"c","choices":[{"index":0,"delta":{"content":" a \"time\""},"finish_reason":null}]}"#);
        assert_eq!(
            text,
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" a \\\"time\\\"\"}}\n\n"
        );
        let fin = read(r#"{"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}"#);
        assert!(fin.starts_with("event: content_block_stop\n"), "{fin}");
        let usage = read(r#"{"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#);
        let data: Value =
            serde_json::from_str(usage.strip_prefix("event: message_delta\ndata: ").expect("message_delta").trim()).expect("JSON");
        assert_eq!((data["delta"]["stop_reason"].as_str(), data["usage"]["output_tokens"].as_u64()), (Some("max_tokens"), Some(7)));
        assert_eq!(read("[DONE]"), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }
}
