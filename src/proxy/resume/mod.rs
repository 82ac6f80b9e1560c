//! Continuing a broken stream on another replica.
//!
//! A chat, completions or Messages stream that breaks after the client got
//! part of it is sent again, as a continuation of what the client has, to another
//! replica of the pool, and that replica's stream is spliced into the
//! client's. The rules (what breaks a stream, what a continuation is, what
//! the client receives, when it is not done) are docs/design/resume.md's.
//!
//! [`Splice`] is what the observed body keeps while the stream runs (the
//! text the client has, the first chunk's ids) and how it rewrites a
//! continuation's chunks; [`Link`] sends a continuation ([`PoolLink`]: to
//! another replica of the request's pool, its lease moving with it).
//! Anthropic's Messages go on through the chat API ([`messages`]).

mod messages;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sse::{EventInfo, Piece, Usage};
use tokio::time::Instant;

use super::headers::{build_upstream_request, Forwarded, Hop};
use crate::admission::Lease;
use crate::upstream::{conn, Attempts, Pool};

/// How a stream broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Break {
    /// The connection failed (reset, or closed mid-chunk).
    Reset,
    /// The body ended cleanly but before `[DONE]`.
    Eof,
    /// The replica sent an error event.
    ErrorEvent,
    /// No data for the idle timeout.
    Stall,
    /// slogate ended it for an interactive request (docs/design/preemption.md).
    Preempted,
}

impl Break {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Break::Reset => "reset",
            Break::Eof => "eof",
            Break::ErrorEvent => "error_event",
            Break::Stall => "stall",
            Break::Preempted => "preempted",
        }
    }
}

/// A continuation on its way: its body once its response head came.
pub(crate) type Continuing<B> = Pin<Box<dyn Future<Output = Result<B, String>> + Send>>;

/// Sends a continuation.
pub(crate) trait Link<B>: Send {
    /// Move the request (and `lease`, when it has one) to another replica
    /// and send `body` there, its response head due by `deadline`; `None`
    /// when no other replica can take it now.
    /// `path`: where to send it instead of the request's own path.
    /// `here`: to the lease's own replica (a preempted stream's new slot).
    fn send(
        &self,
        lease: Option<&mut Lease>,
        body: Bytes,
        path: Option<&'static str>,
        here: bool,
        deadline: Instant,
    ) -> Option<Continuing<B>>;
    /// The pool, for the metrics.
    fn pool(&self) -> &str;
}

/// Why a broken stream was not continued (the `why` label).
pub(crate) type NotResumed = &'static str;

/// A resumable stream: how to send a continuation, and what it splices.
pub(crate) struct Resume<B> {
    pub(super) link: Box<dyn Link<B>>,
    pub(super) splice: Splice,
}

impl<B> Resume<B> {
    /// A stream of `request` (the body as the replica got it) that may be
    /// continued `attempts` times through `link`.
    pub(crate) fn new(link: Box<dyn Link<B>>, request: Bytes, kind: Kind, attempts: u32) -> Self {
        Resume { link, splice: Splice::new(request, kind, attempts) }
    }

    /// Send the continuation of a stream whose client has `sent` tokens, or say why not.
    pub(super) fn start(&mut self, lease: Option<&mut Lease>, sent: u64, deadline: Instant) -> Result<Continuing<B>, NotResumed> {
        let s = &mut self.splice;
        if s.attempts_left == 0 {
            return Err("attempts");
        }
        let body = s.continuation(sent).ok_or("not_exact")?;
        let path = (s.kind == Kind::Messages).then_some(messages::CHAT_PATH);
        let pending = self.link.send(lease, body, path, false, deadline).ok_or("no_replica")?;
        s.attempts_left -= 1;
        s.spliced = Some(sent);
        s.had_chunk = s.ids.is_some();
        Ok(pending)
    }

    /// A preempted stream's continuation, on the slot `lease` was given
    /// again (not counted against its attempts: it did not break).
    pub(super) fn start_here(&mut self, lease: &mut Lease, sent: u64, deadline: Instant) -> Result<Continuing<B>, NotResumed> {
        let s = &mut self.splice;
        let body = s.continuation(sent).ok_or("not_exact")?;
        let path = (s.kind == Kind::Messages).then_some(messages::CHAT_PATH);
        let pending = self.link.send(Some(lease), body, path, true, deadline).ok_or("no_replica")?;
        s.spliced = Some(sent);
        s.had_chunk = s.ids.is_some();
        Ok(pending)
    }

    /// Could it be continued from `sent` tokens (a preemption's question)?
    pub(crate) fn exact(&self, sent: u64) -> bool {
        self.splice.continuation(sent).is_some()
    }
}

/// Which API a resumable stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completions,
    /// Anthropic's Messages, continued through the chat API.
    Messages,
}

/// What a resumable stream keeps while it runs, and how a continuation's
/// chunks are made to read as the original's.
pub(crate) struct Splice {
    /// The request as its replica got it.
    request: Bytes,
    kind: Kind,
    /// How a Messages continuation's end has been told.
    ending: messages::Ending,
    attempts_left: u32,
    /// The text the client got.
    text: String,
    /// The answer holds what a continuation cannot carry on from (a tool
    /// call, reasoning, a second choice).
    not_exact: bool,
    /// The first chunk's `id`, `created`, `model` and `system_fingerprint`.
    ids: Option<Box<[u8]>>,
    /// The tokens the client had when the current continuation began.
    spliced: Option<u64>,
    /// The client had a chunk (its role chunk) before the continuation.
    had_chunk: bool,
    /// An error event reached the client because the stream could no
    /// longer be continued: why not (counted once, then cleared).
    passed_error: Option<NotResumed>,
}

/// The members every chunk of one stream shares, as the first chunk has
/// them (a `null` kept as `null`), read without the rest of the chunk.
#[derive(serde::Deserialize)]
struct Ids<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    created: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    model: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    system_fingerprint: Option<&'a RawValue>,
}

/// A member that is there, whatever its value (`null` too).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

impl Ids<'_> {
    /// One JSON object of its own: an open stream holds it for as long
    /// as it lasts, and only a continuation reads it.
    fn object(&self) -> Box<[u8]> {
        let members = [("id", self.id), ("created", self.created), ("model", self.model), ("system_fingerprint", self.system_fingerprint)];
        let present = members.iter().filter_map(|(k, v)| Some((*k, (*v)?.get())));
        // Exactly: a boxed slice of a longer vector would be a second allocation.
        let (n, len) = present.clone().fold((0usize, 0usize), |(n, len), (k, v)| (n + 1, len + k.len() + v.len() + 3));
        let mut out = Vec::with_capacity(2 + len + n.saturating_sub(1));
        out.push(b'{');
        for (i, (k, v)) in present.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(v.as_bytes());
        }
        out.push(b'}');
        out.into_boxed_slice()
    }
}

impl Splice {
    /// The splice of a stream of `request` (`kind`) that may be continued `attempts` times.
    fn new(request: Bytes, kind: Kind, attempts: u32) -> Splice {
        Splice {
            request,
            kind,
            ending: messages::Ending::default(),
            attempts_left: attempts,
            text: String::new(),
            not_exact: false,
            ids: None,
            spliced: None,
            had_chunk: false,
            passed_error: None,
        }
    }

    /// A continuation is sent, and its chunks are rewritten.
    pub(super) fn spliced(&self) -> bool {
        self.spliced.is_some()
    }

    /// The stream could still be continued if it broke now.
    pub(super) fn may_resume(&self) -> bool {
        self.attempts_left > 0 && !self.not_exact
    }

    /// The request asks for one answer (no `n` over 1).
    pub(super) fn one_choice(&self) -> bool {
        let req: Option<Map<String, Value>> = serde_json::from_slice(&self.request).ok();
        req.is_some_and(|r| r.get("n").and_then(Value::as_u64).is_none_or(|n| n <= 1))
    }

    /// Read one event of the stream as the client gets it: what it means,
    /// and (while the answer can still be continued) its text, appended to
    /// what the client has, in the same pass.
    pub(super) fn read(&mut self, data: &[u8], memo: &mut sse::Memo) -> EventInfo {
        let info = if self.not_exact {
            memo.analyze(data)
        } else if self.kind == Kind::Messages && self.spliced.is_none() {
            // Anthropic's events (a continuation's are chat chunks).
            let info = memo.analyze(data);
            self.not_exact = messages::piece(data, &mut self.text) == Piece::Other;
            info
        } else {
            let (info, piece) = memo.analyze_text(data, &mut self.text);
            self.not_exact = piece == Piece::Other;
            info
        };
        if info.error && !self.may_resume() {
            self.passed_error = Some(if self.not_exact { "not_exact" } else { "attempts" });
        }
        info
    }

    /// Why an error event just reached the client instead of being
    /// continued from, once.
    pub(super) fn take_passed_error(&mut self) -> Option<NotResumed> {
        self.passed_error.take()
    }

    /// The stream's first event: its ids, which every continuation chunk carries.
    pub(super) fn note_ids(&mut self, data: &[u8]) {
        if self.ids.is_none() && self.kind != Kind::Messages {
            if let Ok(ids) = serde_json::from_slice::<Ids<'_>>(data) {
                self.ids = Some(ids.object());
            }
        }
    }

    /// A continuation's usage as the whole answer's: its prompt less the
    /// tokens the client already had, its completion plus them.
    pub(super) fn usage(&self, u: Usage) -> Usage {
        let sent = self.spliced.unwrap_or(0);
        Usage { prompt_tokens: u.prompt_tokens.saturating_sub(sent), completion_tokens: u.completion_tokens + sent, ..u }
    }

    /// A continuation's event as the client gets it: with the original's
    /// ids and the whole answer's usage; `None` for its role chunk (the
    /// client has one). Not JSON: as it came.
    pub(super) fn rewrite(&mut self, data: &[u8], info: &EventInfo) -> Option<Bytes> {
        if self.kind == Kind::Messages {
            let sent = self.spliced.unwrap_or(0);
            let whole = move |u: Usage| Usage { completion_tokens: u.completion_tokens + sent, ..u };
            return messages::rewrite(&mut self.ending, data, info, whole, sent);
        }
        let Ok(mut chunk) = serde_json::from_slice::<Map<String, Value>>(data) else {
            return Some(event(data));
        };
        if self.had_chunk && !info.content && !info.error && info.finish_reason.is_none() && info.usage.is_none() {
            return None;
        }
        let ids = self.ids.as_deref().and_then(|ids| serde_json::from_slice::<Map<String, Value>>(ids).ok());
        for (k, v) in ids.into_iter().flatten() {
            if chunk.contains_key(&k) {
                chunk.insert(k, v);
            }
        }
        if let (Some(u), Some(Value::Object(wire))) = (info.usage, chunk.get_mut("usage")) {
            let whole = self.usage(u);
            wire.insert("prompt_tokens".into(), whole.prompt_tokens.into());
            wire.insert("completion_tokens".into(), whole.completion_tokens.into());
            wire.insert("total_tokens".into(), (whole.prompt_tokens + whole.completion_tokens).into());
        }
        serde_json::to_vec(&chunk).ok().map(|json| event(&json))
    }

    /// The request that continues the answer from the client's `sent`
    /// tokens (its text), or `None` when it cannot be exact.
    fn continuation(&self, sent: u64) -> Option<Bytes> {
        if self.not_exact {
            return None;
        }
        if self.kind == Kind::Messages {
            return messages::continuation(&self.request, &self.text, sent);
        }
        let mut req: Map<String, Value> = serde_json::from_slice(&self.request).ok()?;
        let number = |req: &Map<String, Value>, k: &str| req.get(k).and_then(Value::as_u64);
        let set = |k: &str| req.get(k).is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)));
        let many = |k: &str| number(&req, k).is_some_and(|n| n > 1);
        if many("n") || many("best_of") || set("logprobs") || set("top_logprobs") || set("seed") || set("echo") {
            return None;
        }
        for k in ["max_tokens", "max_completion_tokens"] {
            if let Some(most) = number(&req, k) {
                let left = most.checked_sub(sent).filter(|l| *l > 0)?;
                req.insert(k.into(), left.into());
            }
        }
        if let Some(least) = number(&req, "min_tokens") {
            req.insert("min_tokens".into(), least.saturating_sub(sent).into());
        }
        if !self.text.is_empty() {
            if self.kind == Kind::Chat {
                self.continue_chat(&mut req)?;
            } else {
                match req.get_mut("prompt")? {
                    Value::String(p) => p.push_str(&self.text),
                    Value::Array(a) if a.len() == 1 => {
                        let whole = format!("{}{}", a[0].as_str()?, self.text);
                        a[0] = Value::String(whole);
                    }
                    _ => return None,
                }
            }
        }
        serde_json::to_vec(&req).ok().map(Bytes::from)
    }

    /// Chat: the text the client has as the assistant's message to go on
    /// from (vLLM's `continue_final_message`), or added to the one the
    /// caller already asked it to go on from.
    fn continue_chat(&self, req: &mut Map<String, Value>) -> Option<()> {
        let continuing = req.get("continue_final_message") == Some(&Value::Bool(true));
        let messages = req.get_mut("messages")?.as_array_mut()?;
        if continuing {
            let last = messages.last_mut()?.get_mut("content")?;
            let had = last.as_str()?;
            *last = Value::String(format!("{had}{}", self.text));
        } else {
            let mut m = Map::new();
            m.insert("role".into(), "assistant".into());
            m.insert("content".into(), self.text.clone().into());
            messages.push(Value::Object(m));
        }
        req.insert("continue_final_message".into(), true.into());
        req.insert("add_generation_prompt".into(), false.into());
        Some(())
    }
}

/// `data: <payload>` and the blank line.
fn event(payload: &[u8]) -> Bytes {
    let mut ev = BytesMut::with_capacity(payload.len() + 8);
    ev.extend_from_slice(b"data: ");
    ev.extend_from_slice(payload);
    ev.extend_from_slice(b"\n\n");
    ev.freeze()
}

/// Continuations to another replica of the request's pool.
pub(crate) struct PoolLink {
    pub(super) parts: http::request::Parts,
    /// The connection's peer, for the forwarding headers.
    pub(super) client: Arc<crate::server::ClientAddr>,
    pub(super) pool: Arc<Pool>,
    pub(super) strip_auth: bool,
    pub(super) request_id: HeaderValue,
}

impl Link<conn::UpstreamBody> for PoolLink {
    fn send(
        &self,
        lease: Option<&mut Lease>,
        body: Bytes,
        path: Option<&'static str>,
        here: bool,
        deadline: Instant,
    ) -> Option<Continuing<conn::UpstreamBody>> {
        let lease = lease?;
        if !here && !lease.move_to_another() {
            return None;
        }
        let replica = lease.replica().clone();
        let forwarded = Forwarded::of(&self.parts, &self.client);
        let hop = Hop { strip_credentials: self.strip_auth, json: true };
        let untraced = http::HeaderMap::new();
        let req = match path {
            Some(path) => {
                let mut parts = self.parts.clone();
                parts.uri = http::Uri::from_static(path);
                build_upstream_request(&parts, &replica, body.into(), hop, &forwarded, &self.request_id, &untraced)
            }
            None => build_upstream_request(&self.parts, &replica, body.into(), hop, &forwarded, &self.request_id, &untraced),
        };
        let connect = self.pool.config.timeouts.connect.get();
        Some(Box::pin(async move {
            let send = |req, fresh| tokio::time::timeout_at(deadline, conn::send(&replica, req, connect, fresh, conn::Reads::Events));
            let sent = match send(req.clone(), false).await {
                // A kept-alive connection closed as it went out: on a new one.
                Ok(Err(e)) if e.idle_closed() => send(req, true).await,
                other => other,
            };
            let resp = sent.map_err(|_| "no response head in time".to_string())?.map_err(|e| e.public_message())?;
            if !resp.status().is_success() {
                return Err(format!("the replica answered {}", resp.status()));
            }
            Ok(resp.into_body())
        }))
    }

    fn pool(&self) -> &str {
        &self.pool.config.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splice(request: &str, chat: bool) -> Splice {
        Splice::new(Bytes::from(request.to_string()), if chat { Kind::Chat } else { Kind::Completions }, 1)
    }

    fn feed(s: &mut Splice, chunks: &[&str]) {
        let mut memo = sse::Memo::new();
        for c in chunks {
            s.note_ids(c.as_bytes());
            assert_eq!(s.read(c.as_bytes(), &mut memo), sse::analyze(c.as_bytes()));
        }
    }

    const ROLE: &str = r#"{"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;

    /// A stream keeps its first chunk's ids as one small object, exactly
    /// as they came (a `null` too), and nothing else of the chunk.
    #[test]
    fn the_first_chunks_ids_are_kept_as_they_came_and_alone() {
        let mut s = splice("{}", true);
        s.note_ids(br#"{"id":"chatcmpl-a","object":"chat.completion.chunk","created":7,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#);
        let kept = s.ids.as_deref().expect("ids");
        assert_eq!(std::str::from_utf8(kept), Ok(r#"{"id":"chatcmpl-a","created":7,"model":"m","system_fingerprint":null}"#));
        let mut t = splice("{}", true);
        t.note_ids(br#"{"model": "m2", "choices": []}"#);
        assert_eq!(t.ids.as_deref(), Some(&br#"{"model":"m2"}"#[..]));
        let mut u = splice("{}", true);
        u.note_ids(b"not json");
        assert!(u.ids.is_none());
    }

    #[test]
    fn a_chat_continuation_goes_on_from_the_text_the_client_has() {
        let mut s =
            splice(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":10,"min_tokens":3}"#, true);
        feed(
            &mut s,
            &[
                ROLE,
                r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"lo \"w\""}}]}"#,
            ],
        );
        let req: Value = serde_json::from_slice(&s.continuation(2).unwrap()).unwrap();
        assert_eq!(req["messages"][1], serde_json::json!({"role": "assistant", "content": "Hello \"w\""}));
        assert_eq!((req["continue_final_message"].clone(), req["add_generation_prompt"].clone()), (Value::Bool(true), Value::Bool(false)));
        assert_eq!((req["max_tokens"].as_u64(), req["min_tokens"].as_u64()), (Some(8), Some(1)));
        assert!(s.continuation(10).is_none(), "no tokens left to generate");
    }

    #[test]
    fn a_completion_goes_on_from_its_prompt_and_text_and_a_prefilled_message_grows() {
        let mut s = splice(r#"{"model":"m","prompt":"Once","stream":true}"#, false);
        feed(&mut s, &[r#"{"id":"cmpl-1","choices":[{"index":0,"text":" upon"}]}"#]);
        let req: Value = serde_json::from_slice(&s.continuation(1).unwrap()).unwrap();
        assert_eq!(req["prompt"], "Once upon");
        let mut s = splice(r#"{"model":"m","messages":[{"role":"assistant","content":"Sure:"}],"continue_final_message":true}"#, true);
        feed(&mut s, &[r#"{"choices":[{"index":0,"delta":{"content":" yes"}}]}"#]);
        let req: Value = serde_json::from_slice(&s.continuation(1).unwrap()).unwrap();
        assert_eq!(req["messages"].as_array().map(Vec::len), Some(1));
        assert_eq!(req["messages"][0]["content"], "Sure: yes");
    }

    #[test]
    fn what_cannot_be_continued_exactly_is_not() {
        for req in [
            r#"{"messages":[],"n":2}"#,
            r#"{"messages":[],"logprobs":true}"#,
            r#"{"messages":[],"top_logprobs":2}"#,
            r#"{"messages":[],"seed":1}"#,
            r#"{"prompt":"a","echo":true}"#,
            r#"{"prompt":[1,2,3]}"#,
        ] {
            let mut s = splice(req, req.contains("messages"));
            feed(&mut s, &[r#"{"choices":[{"index":0,"delta":{"content":"x"},"text":"x"}]}"#]);
            assert!(s.continuation(1).is_none(), "{req}");
        }
        let mut s = splice(r#"{"messages":[]}"#, true);
        feed(&mut s, &[r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#]);
        assert!(!s.may_resume() && s.continuation(1).is_none(), "a tool call in flight");
        let s = splice(r#"{"messages":[],"n":1,"logprobs":false,"seed":null}"#, true);
        assert!(s.continuation(0).is_some(), "defaults written out are fine");
    }

    #[test]
    fn a_continuations_chunks_read_as_the_originals() {
        let mut s = splice(r#"{"messages":[]}"#, true);
        feed(&mut s, &[ROLE]);
        (s.spliced, s.had_chunk) = (Some(3), true);
        let role = r#"{"id":"chatcmpl-b","created":9,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(s.rewrite(role.as_bytes(), &sse::analyze(role.as_bytes())), None, "the client has a role chunk");
        let text = r#"{"id":"chatcmpl-b","created":9,"model":"m","choices":[{"index":0,"delta":{"content":"on"}}]}"#;
        let got = s.rewrite(text.as_bytes(), &sse::analyze(text.as_bytes())).unwrap();
        let got: Value = serde_json::from_slice(got.strip_prefix(b"data: ").unwrap()).unwrap();
        assert_eq!(
            (got["id"].as_str(), got["created"].as_u64(), got["choices"][0]["delta"]["content"].as_str()),
            (Some("chatcmpl-a"), Some(7), Some("on"))
        );
        let usage = r#"{"id":"chatcmpl-b","choices":[],"usage":{"prompt_tokens":13,"completion_tokens":4,"total_tokens":17}}"#;
        let got = s.rewrite(usage.as_bytes(), &sse::analyze(usage.as_bytes())).unwrap();
        let got: Value = serde_json::from_slice(got.strip_prefix(b"data: ").unwrap()).unwrap();
        assert_eq!(got["usage"], serde_json::json!({"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}));
    }
}
