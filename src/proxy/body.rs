//! The request body: the few fields the gateway routes on, and its edits.
//!
//! Most requests need only `model`, `stream` and `stream_options` read, and
//! at most two members added (`stream_options` to ask for usage, `priority`
//! for vLLM's scheduler). For those the body is read by the quick path
//! ([`quick`]: a one-pass scan, or serde into a small struct where the scan
//! is not sure; every byte still checked as JSON, the rest skipped without
//! building values) and the members are written into the caller's bytes
//! right after the opening brace. Anything else (a field to change rather than add,
//! context reduction, duplicate keys, a `model` that is not a string) takes
//! the general path: the whole object as a `serde_json::Value`, edited and
//! written again. Both paths send the replica the same request.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{Map, Value};

mod quick;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use quick::paths_agree;

use crate::error::GatewayError;
use crate::upstream::prefix::RouteKey;

/// What the request's `model` member holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Model {
    Name(String),
    Missing,
    NotString,
}

/// The members the gateway routes and measures on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub(crate) model: Model,
    /// `"stream": true`.
    pub(crate) stream: bool,
    /// `"stream_options": {"include_usage": true}`.
    pub(crate) include_usage: bool,
    /// A `stream_options` member of any value is present.
    has_stream_options: bool,
    /// A `priority` member of any value is present.
    has_priority: bool,
    /// A `cache_salt` member of any value is present.
    has_cache_salt: bool,
    /// The most tokens it may generate: `max_completion_tokens`, else `max_tokens`.
    pub(crate) max_output: Option<u64>,
    /// The Responses API's limit: `max_output_tokens`.
    pub(crate) max_output_tokens: Option<u64>,
    /// How many answers it asks for: `n`, or `best_of` if more (1 when
    /// neither is a count), times the prompts of a completions list.
    pub(crate) answers: u64,
    /// The Responses API's `previous_response_id`: the stored response it continues.
    pub(crate) previous_response_id: Option<String>,
}

/// A request body, parsed only as far as needed.
pub(super) struct RequestBody {
    bytes: Bytes,
    head: Head,
    /// The whole object, once something needed it.
    object: Option<Map<String, Value>>,
    /// The object was changed and must be written again.
    dirty: bool,
    /// A multipart form, sent as it came.
    form: bool,
    /// Where the prompt is in `bytes` (read by the quick path), for prefix-aware routing.
    spans: Spans,
}

/// A prompt member's bytes: borrowed from the body, or written out again.
type Text<'a> = Cow<'a, [u8]>;
/// A prompt's parts for its routing key: its instructions and its prompt, on the stack.
type PromptParts<T> = smallvec::SmallVec<[T; 2]>;

/// Byte ranges of a body's prompt members, as the client wrote them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Spans {
    /// The Responses API's `instructions`.
    instructions: Option<(usize, usize)>,
    /// `messages`, else `prompt`, else `input`.
    prompt: Option<(usize, usize)>,
    /// `prompt_cache_key`.
    cache_key: Option<(usize, usize)>,
    /// Anthropic's `metadata` (its `user_id` names an agent's session).
    metadata: Option<(usize, usize)>,
}

/// How many answers a request asks for: `n` or `best_of` (the larger),
/// times the prompts of a list of them (`prompt: ["a", "b"]`, or a list of
/// token lists; one list of token ids is one prompt). At least 1.
fn answers(n: Option<u64>, best_of: Option<u64>, prompt: Option<&Value>) -> u64 {
    let each = n.unwrap_or(1).max(best_of.unwrap_or(1)).max(1);
    let prompts = match prompt {
        Some(Value::Array(items)) if matches!(items.first(), Some(Value::String(_) | Value::Array(_))) => items.len() as u64,
        _ => 1,
    };
    each.saturating_mul(prompts.max(1))
}

fn usage_asked(opts: Option<&Value>) -> bool {
    opts.and_then(|o| o.get("include_usage")).and_then(Value::as_bool) == Some(true)
}

impl Head {
    /// The head of a multipart form: its `model` and `stream` fields.
    pub(super) fn form(model: Model, stream: bool) -> Head {
        Head {
            model,
            stream,
            include_usage: false,
            has_stream_options: false,
            has_priority: false,
            has_cache_salt: false,
            max_output: None,
            max_output_tokens: None,
            answers: 1,
            previous_response_id: None,
        }
    }
}

impl RequestBody {
    /// A multipart form, read as far as `head` (see `form.rs`); sent as is.
    pub(super) fn form(bytes: Bytes, head: Head) -> Self {
        Self { bytes, head, object: None, dirty: false, form: true, spans: Spans::default() }
    }

    /// Its prompt, estimated at four bytes a token for text; a form (an
    /// audio upload) is no text: 0, and what the replica reports counts.
    pub(super) fn prompt_estimate(&self) -> u64 {
        if self.form {
            0
        } else {
            self.bytes.len() as u64 / 4
        }
    }

    /// Parse a body; 400 (`MalformedJson` or `InvalidRequest`) when it is
    /// not a JSON object.
    pub(super) fn parse(bytes: Bytes) -> Result<Self, GatewayError> {
        if let Some((head, spans)) = quick::head(&bytes) {
            return Ok(Self { bytes, head, object: None, dirty: false, form: false, spans });
        }
        let object = parse_object(&bytes)?;
        let head = head_of(&object);
        Ok(Self { bytes, head, object: Some(object), dirty: false, form: false, spans: Spans::default() })
    }

    /// An empty body (a management call that takes none): no model, sent as is.
    pub(super) fn empty() -> Self {
        let head = Head::form(Model::Missing, false);
        Self { bytes: Bytes::new(), head, object: None, dirty: false, form: false, spans: Spans::default() }
    }

    /// What prefix-aware routing knows of the prompt: its members as the
    /// client wrote them (the Responses API's `instructions`, then
    /// `messages`, `prompt` or `input`), cut into blocks of `block` bytes,
    /// at most `max_blocks`; its `prompt_cache_key`, else `session` (the
    /// `x-session-id` header), as the session hint. `None` for a form, or a
    /// body with neither a prompt nor a hint. A body the quick path could
    /// not read has its members written out again first (compact JSON).
    pub(super) fn route_key(&self, block: usize, max_blocks: usize, session: Option<&[u8]>) -> Option<RouteKey> {
        if self.form {
            return None;
        }
        let (parts, key): (PromptParts<Text<'_>>, Option<Text<'_>>) = match &self.object {
            None => {
                let slice = |s: Option<(usize, usize)>| s.and_then(|(at, len)| self.bytes.get(at..at + len)).map(Cow::Borrowed);
                let parts = [slice(self.spans.instructions), slice(self.spans.prompt)].into_iter().flatten().collect();
                (parts, slice(self.spans.cache_key))
            }
            Some(o) => {
                let json = |v: Option<&Value>| v.and_then(|v| serde_json::to_vec(v).ok()).map(Cow::Owned);
                let prompt = o.get("messages").or_else(|| o.get("prompt")).or_else(|| o.get("input"));
                ([json(o.get("instructions")), json(prompt)].into_iter().flatten().collect(), json(o.get("prompt_cache_key")))
            }
        };
        let session = key.as_deref().or(session);
        if parts.is_empty() && session.is_none() {
            return None;
        }
        let parts: PromptParts<&[u8]> = parts.iter().map(|p| p.as_ref()).collect();
        Some(RouteKey::of(&parts, block, max_blocks, session))
    }

    /// An Anthropic request's `metadata.user_id` (Claude Code and other
    /// agents name their session there): the session hint of a Messages
    /// request that sends no `x-session-id`.
    pub(super) fn metadata_user_id(&self) -> Option<Vec<u8>> {
        #[derive(Deserialize)]
        struct Metadata {
            user_id: Option<String>,
        }
        let user_id = match &self.object {
            None => {
                let (at, len) = self.spans.metadata?;
                serde_json::from_slice::<Metadata>(self.bytes.get(at..at + len)?).ok()?.user_id
            }
            Some(o) => o.get("metadata")?.get("user_id")?.as_str().map(str::to_string),
        };
        user_id.filter(|u| !u.is_empty()).map(String::into_bytes)
    }

    /// The prompt member as the client wrote it (`messages` for chat,
    /// `prompt` for completions: `name`), as JSON, for exact prefix
    /// routing's tokenizer; `None` for a form or a body without it.
    pub(super) fn prompt_member(&self, name: &str) -> Option<Bytes> {
        if self.form {
            return None;
        }
        match &self.object {
            None => {
                let (at, len) = self.spans.prompt?;
                if at + len > self.bytes.len() {
                    return None;
                }
                let member = self.bytes.slice(at..at + len);
                // The span holds the first of messages, prompt, input: the one named?
                let wanted = match name {
                    "messages" => member.first() == Some(&b'['),
                    _ => true,
                };
                wanted.then_some(member)
            }
            Some(o) => o.get(name).and_then(|v| serde_json::to_vec(v).ok()).map(Bytes::from),
        }
    }

    /// The size of the body as the client sent it.
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn head(&self) -> &Head {
        &self.head
    }

    /// The whole object, parsed now if it was not already (for context
    /// reduction). Call [`mark_changed`](Self::mark_changed) after editing it.
    pub(super) fn object(&mut self) -> Result<&mut Map<String, Value>, GatewayError> {
        let object = match self.object.take() {
            Some(o) => o,
            None => parse_object(&self.bytes)?,
        };
        Ok(self.object.insert(object))
    }

    pub(super) fn mark_changed(&mut self) {
        self.dirty = true;
    }

    /// The bytes to send: with `stream_options.include_usage` set when
    /// `ask_usage`; `priority` set when given, else removed (a caller's own
    /// never reaches a replica); `cache_salt` set to `salt` when given
    /// (the caller's replaced; docs/access.md, rules 19 and 20); the
    /// `model` the caller named set to `served` when given (the pool's
    /// `served_model`).
    pub(super) fn into_bytes(
        mut self,
        ask_usage: bool,
        priority: Option<i64>,
        salt: Option<&str>,
        served: Option<&str>,
    ) -> Result<Bytes, GatewayError> {
        // Only a model the client named is rewritten (a body without one stays so).
        let served = served.filter(|_| matches!(self.head.model, Model::Name(_)));
        let edit_existing = (ask_usage && self.head.has_stream_options)
            || self.head.has_priority
            || (salt.is_some() && self.head.has_cache_salt)
            || served.is_some();
        if self.object.is_none() && !edit_existing {
            let mut members = String::new();
            if ask_usage {
                members.push_str(r#""stream_options":{"include_usage":true},"#);
            }
            if let Some(p) = priority {
                members.push_str(&format!(r#""priority":{p},"#));
            }
            if let Some(salt) = salt {
                members.push_str(&format!(r#""cache_salt":{},"#, Value::from(salt)));
            }
            if members.is_empty() {
                return Ok(self.bytes);
            }
            members.pop();
            if let Some(b) = insert_members(&self.bytes, &members) {
                return Ok(b);
            }
        }
        let dirty = self.dirty || ask_usage || priority.is_some() || self.head.has_priority || salt.is_some() || served.is_some();
        if !dirty {
            return Ok(self.bytes);
        }
        let obj = self.object()?;
        match priority {
            Some(p) => {
                obj.insert("priority".into(), Value::from(p));
            }
            None => {
                obj.remove("priority");
            }
        }
        if let Some(salt) = salt {
            obj.insert("cache_salt".into(), Value::from(salt));
        }
        if let Some(m) = served {
            obj.insert("model".into(), Value::from(m));
        }
        if ask_usage {
            let opts = obj.entry("stream_options").or_insert_with(|| Value::Object(Map::new()));
            if !opts.is_object() {
                *opts = Value::Object(Map::new());
            }
            if let Some(o) = opts.as_object_mut() {
                o.insert("include_usage".into(), Value::Bool(true));
            }
        }
        serde_json::to_vec(obj).map(Bytes::from).map_err(GatewayError::MalformedJson)
    }
}

fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(bytes).map_err(GatewayError::MalformedJson)? {
        Value::Object(o) => Ok(o),
        _ => Err(GatewayError::InvalidRequest { message: "the request body must be a JSON object".into(), param: None }),
    }
}

fn head_of(o: &Map<String, Value>) -> Head {
    Head {
        model: match o.get("model") {
            Some(Value::String(m)) => Model::Name(m.clone()),
            Some(_) => Model::NotString,
            None => Model::Missing,
        },
        stream: o.get("stream").and_then(Value::as_bool) == Some(true),
        include_usage: usage_asked(o.get("stream_options")),
        has_stream_options: o.contains_key("stream_options"),
        has_priority: o.contains_key("priority"),
        has_cache_salt: o.contains_key("cache_salt"),
        max_output: o.get("max_completion_tokens").and_then(Value::as_u64).or_else(|| o.get("max_tokens").and_then(Value::as_u64)),
        max_output_tokens: o.get("max_output_tokens").and_then(Value::as_u64),
        answers: answers(o.get("n").and_then(Value::as_u64), o.get("best_of").and_then(Value::as_u64), o.get("prompt")),
        previous_response_id: o.get("previous_response_id").and_then(Value::as_str).map(str::to_string),
    }
}

fn first_non_ws(b: &[u8], from: usize) -> Option<usize> {
    b.iter().skip(from).position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r')).map(|i| i + from)
}

/// `members` (`"k":v,...`) written right after the object's opening brace.
fn insert_members(bytes: &[u8], members: &str) -> Option<Bytes> {
    let open = first_non_ws(bytes, 0).filter(|&i| bytes[i] == b'{')?;
    let empty = bytes.get(first_non_ws(bytes, open + 1)?) == Some(&b'}');
    let mut out = BytesMut::with_capacity(bytes.len() + members.len() + 1);
    out.put_slice(&bytes[..=open]);
    out.put_slice(members.as_bytes());
    if !empty {
        out.put_u8(b',');
    }
    out.put_slice(&bytes[open + 1..]);
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(s: &str) -> RequestBody {
        RequestBody::parse(Bytes::from(s.to_string())).expect("parses")
    }

    #[test]
    fn the_route_key_is_the_prompt_as_written_and_its_cache_hint() {
        let system = "s".repeat(64);
        let chat =
            |q: &str| format!(r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{q}"}}]}}"#);
        let a = body(&chat("first question")).route_key(16, 100, None).expect("a prompt");
        let b = body(&chat("second")).route_key(16, 100, None).expect("a prompt");
        // The messages as written: `[{"role":"system","content":"` then the 64 s.
        // They differ from the question on: byte 122, in block 7.
        let question = (r#"[{"role":"system","content":""#.len() + 64 + r#""},{"role":"user","content":""#.len()) / 16;
        assert_eq!(a.blocks[..question], b.blocks[..question]);
        assert_ne!(a.blocks[question], b.blocks[question]);
        let messages = format!(r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"second"}}]"#);
        assert_eq!(b.bytes, messages.len() as u64);
        assert_eq!(b.session, None);
        // The general path (duplicate keys) writes the members out compactly: the same here.
        let dup = chat("second").replacen(r#""model":"m","#, r#""model":"m","model":"m","#, 1);
        let general = RequestBody::parse(Bytes::from(dup)).expect("parses");
        assert!(general.object.is_some());
        assert_eq!(general.route_key(16, 100, None).expect("a prompt").blocks, b.blocks);
        // Completions' prompt; the Responses API's instructions, then input.
        let p = body(r#"{"model":"m","prompt":"aaaaaaaaaaaaaaaaaaaa"}"#).route_key(16, 100, None).expect("a prompt");
        assert_eq!((p.bytes, p.blocks.len()), (22, 1));
        let r = body(r#"{"model":"m","instructions":"iiii","input":"xxxx"}"#).route_key(4, 100, None).expect("a prompt");
        assert_eq!(r.bytes, 12, "both members, quotes included");
        // A cache hint in the body wins over the header's.
        let hinted = |b: &str| body(b).route_key(16, 100, Some(b"header-session")).expect("a key").session;
        let with_key = hinted(r#"{"model":"m","prompt":"x","prompt_cache_key":"conv-1"}"#);
        let without = hinted(r#"{"model":"m","prompt":"x"}"#);
        assert!(with_key.is_some() && without.is_some() && with_key != without);
        // Nothing to route on.
        assert_eq!(body(r#"{"model":"m"}"#).route_key(16, 100, None), None);
        assert_eq!(RequestBody::form(Bytes::from_static(b"--x"), Head::form(Model::Missing, false)).route_key(16, 100, None), None);
    }

    fn sent(s: &str, usage: bool, prio: Option<i64>) -> Value {
        let out = body(s).into_bytes(usage, prio, None, None).expect("writes");
        serde_json::from_slice(&out).expect("valid JSON")
    }

    /// What the general path sends: the reference the quick path must match.
    fn general(s: &str, usage: bool, prio: Option<i64>) -> Value {
        let mut b = body(s);
        b.object().expect("object");
        b.into_bytes(usage, prio, None, None).map(|out| serde_json::from_slice(&out).expect("valid JSON")).expect("writes")
    }

    #[test]
    fn reads_the_routed_members_without_the_general_path() {
        let b = body(
            r#" {"messages":[{"role":"user","content":"hi"}],"model":"m\u00e9","stream":true,"stream_options":{"include_usage":true}}"#,
        );
        assert!(b.object.is_none(), "the quick path took it");
        assert_eq!(b.head(), &Head { include_usage: true, has_stream_options: true, ..Head::form(Model::Name("mé".into()), true) });
    }

    #[test]
    fn the_general_path_decides_the_odd_bodies() {
        for (s, model, stream) in [
            (r#"{"model":"a","model":"b"}"#, Model::Name("b".into()), false),
            (r#"{"model":7}"#, Model::NotString, false),
            (r#"{"model":null}"#, Model::NotString, false),
            (r#"{"stream":true}"#, Model::Missing, true),
            (r#"{"model":"m","stream":"yes"}"#, Model::Name("m".into()), false),
            (r#"{"model":"m","stream":false,"stream":true}"#, Model::Name("m".into()), true),
        ] {
            let b = body(s);
            assert!(b.object.is_some(), "{s}: the general path took it");
            assert_eq!(b.head().model, model, "{s}");
            assert_eq!(b.head().stream, stream, "{s}");
        }
        assert!(matches!(RequestBody::parse(Bytes::from_static(b"[\"m\"]")), Err(GatewayError::InvalidRequest { .. })));
        for bad in [&b"{\"model\":\"m\""[..], b"{\"model\":\"m\"} x", b"", b"\xff"] {
            assert!(matches!(RequestBody::parse(Bytes::copy_from_slice(bad)), Err(GatewayError::MalformedJson(_))), "{bad:?}");
        }
    }

    /// Found by the request_body fuzz target: invalid UTF-8 inside a member
    /// the quick path skips was forwarded; the general path rejects it.
    #[test]
    fn invalid_utf8_anywhere_is_rejected_by_both_paths() {
        let bytes = b"{\"model\":\"m1\",\"stream\":true,\"x\":[{\"role\":\"use\xfa\xff\xff\xffr\"}]}";
        assert!(matches!(RequestBody::parse(Bytes::from_static(bytes)), Err(GatewayError::MalformedJson(_))));
        assert_eq!(paths_agree(bytes, true, None), Ok(()));
    }

    /// Found by the request_body fuzz target: the general path parses and
    /// writes numbers again; without correctly rounded parsing a long number
    /// came out as another value than the one the client sent.
    #[test]
    fn the_general_path_keeps_every_number_the_client_sent() {
        let bytes = br#"{"model":"","x":666666666666666666666666666666666666666666666.6,"t":0.1000000000000000055511151231257827}"#;
        assert_eq!(paths_agree(bytes, true, Some(1)), Ok(()));
    }

    #[test]
    fn an_unedited_body_is_sent_byte_for_byte() {
        let s = "{ \"model\" : \"m\",\n \"stream\": false }";
        assert_eq!(&body(s).into_bytes(false, None, None, None).expect("writes")[..], s.as_bytes());
    }

    #[test]
    fn added_members_match_the_general_path() {
        for s in [
            r#"{"model":"m","stream":true}"#,
            " \n{ \"model\":\"m\", \"stream\":true }",
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}"#,
            r#"{"model":"m","stream":true,"stream_options":null}"#,
            r#"{"model":"m","priority":null}"#,
            r#"{"model":"m","priority":5,"stream_options":{}}"#,
        ] {
            for (usage, prio) in [(true, None), (false, Some(0)), (true, Some(1)), (false, None)] {
                let want = general(s, usage, prio);
                assert_eq!(sent(s, usage, prio), want, "{s} usage={usage} priority={prio:?}");
                if usage {
                    assert_eq!(want.pointer("/stream_options/include_usage"), Some(&Value::Bool(true)), "{s}");
                }
                match prio {
                    Some(p) => assert_eq!(want["priority"], p, "{s}"),
                    None => assert!(want.get("priority").is_none(), "{s}: a caller's priority is removed"),
                }
            }
        }
    }

    #[test]
    fn members_go_into_an_empty_object_without_a_stray_comma() {
        assert_eq!(&insert_members(b" { } ", r#""a":1"#).expect("object")[..], br#" {"a":1 } "#);
        assert_eq!(&insert_members(br#"{"b":2}"#, r#""a":1"#).expect("object")[..], br#"{"a":1,"b":2}"#);
        assert!(insert_members(b"[]", r#""a":1"#).is_none());
    }

    #[test]
    fn a_reduced_body_is_written_again() {
        let mut b = body(r#"{"model":"m","max_tokens":9000}"#);
        b.object().expect("object").insert("max_tokens".into(), Value::from(100));
        b.mark_changed();
        let out: Value = serde_json::from_slice(&b.into_bytes(false, None, None, None).expect("writes")).expect("valid JSON");
        assert_eq!(out["max_tokens"], 100);
    }

    use proptest::prelude::*;

    /// One member as written in a request body (some of them the members the
    /// gateway reads, in every type a caller might send).
    fn member() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9-]{1,8}".prop_map(|m| format!(r#""model":"{m}""#)),
            Just(r#""model":7"#.to_string()),
            Just(r#""model":null"#.to_string()),
            prop_oneof![Just("true"), Just("false"), Just("\"yes\""), Just("null")].prop_map(|v| format!(r#""stream":{v}"#)),
            prop_oneof![
                Just("null"),
                Just("{}"),
                Just(r#"{"include_usage":true}"#),
                Just(r#"{"include_usage":false,"continuous_usage_stats":true}"#),
                Just("\"x\""),
            ]
            .prop_map(|v| format!(r#""stream_options":{v}"#)),
            prop_oneof![Just("null"), Just("5"), Just("\"high\"")].prop_map(|v| format!(r#""priority":{v}"#)),
            prop_oneof![Just("null"), Just("\"mine\""), Just("7")].prop_map(|v| format!(r#""cache_salt":{v}"#)),
            prop_oneof![
                Just(r#""n":3"#),
                Just(r#""best_of":4"#),
                Just(r#""n":"x""#),
                Just(r#""prompt":["a","b"]"#),
                Just(r#""prompt":[1,2,3]"#),
                Just(r#""prompt":[[1],[2]]"#),
                Just(r#""prompt":[]"#),
                Just(r#""max_output_tokens":7"#),
                Just(r#""previous_response_id":"resp_1""#),
                Just(r#""previous_response_id":null"#),
                Just(r#""previous_response_id":3"#),
                Just(r#""max_tokens":18446744073709551615"#),
            ]
            .prop_map(str::to_string),
            ("[a-z_]{1,8}", prop_oneof![Just("1"), Just("\"s\""), Just("[1,{\"a\":[]}]"), Just("{\"k\":null}")])
                .prop_map(|(k, v)| format!(r#""{k}":{v}"#)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Whatever the body, the quick path reads the same head and sends
        /// the replica the same request as the general path.
        #[test]
        fn the_quick_path_agrees_with_the_general_path(
            members in prop::collection::vec(member(), 0..7),
            ws in prop_oneof![Just(""), Just(" "), Just("\n  ")],
            usage in any::<bool>(),
            prio in prop_oneof![Just(None), Just(Some(0i64)), Just(Some(1i64))],
        ) {
            let text = format!("{ws}{{{ws}{}{ws}}}{ws}", members.join(&format!(",{ws}")));
            if let Err(e) = paths_agree(text.as_bytes(), usage, prio) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}
