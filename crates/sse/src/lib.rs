//! Incremental Server-Sent Events parsing and OpenAI chunk analysis, shared
//! by the gateway (which measures as it forwards) and the load generator
//! (which measures as a client does), so both stamp TTFT the same way.
//!
//! Upstream bytes arrive in arbitrary pieces: an event may be split over
//! several reads, one read may hold several events, lines may end in LF, CR or
//! CRLF, and `:` lines are comments (keep-alives). The parser keeps only the
//! current partial line and the current event's data, and reports for each
//! completed event where in the fed chunk it ended, so a caller can cut an
//! event out of the byte stream without re-chunking the rest.
//!
//! The same one-pass JSON reading reads a whole answer's usage and a
//! request body's routed-on members ([`quick_request_head`]), for the
//! gateway's request path, where serde's derived readings cost more than
//! the rest of the work.

use serde::de::IgnoredAny;
use serde::Deserialize;

mod answer;
mod memo;
mod scan;
mod text;
pub use answer::{read_answer, read_answer_tail, Answer};
pub use memo::Memo;
pub use scan::{quick_request_head, RequestHead};
use text::Field;
pub use text::{analyze_text, Piece};

/// Incremental SSE parser.
///
/// Completed blocks (the bytes up to and including a blank line) are handed
/// to a callback with their `data` field (lines joined with `\n`, or `None`
/// for comment-only blocks) and the offset in the fed chunk where the block
/// ends. Parsing allocates nothing per event: a block lying whole in one
/// chunk is handed on in place, and the data buffer is reused.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// The last chunk ended in CR: a leading LF in the next one belongs to it.
    skip_lf: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// The last chunk ended in CR: an LF at the start of the next one ends
    /// that line (it belongs to the block before, not to the next one).
    pub fn expects_lf(&self) -> bool {
        self.skip_lf
    }

    /// Feed one chunk; `on_block(data, end)` is called for each completed block.
    ///
    /// A block whose one `data` line and blank line are both in `chunk` (a
    /// replica's usual event) is handed on where it lies, not copied: the
    /// data buffer is used only by blocks of several data lines or split
    /// over chunks, and an open stream holds none between its events.
    pub fn feed(&mut self, chunk: &[u8], mut on_block: impl FnMut(Option<&[u8]>, usize)) {
        // An empty read says nothing, not even whether an LF follows a CR.
        if chunk.is_empty() {
            return;
        }
        let mut i = 0;
        if self.skip_lf {
            self.skip_lf = false;
            if chunk.first() == Some(&b'\n') {
                i = 1;
            }
        }
        // The block's only data so far, where it lies in `chunk`.
        let mut pending: Option<(usize, usize)> = None;
        while i < chunk.len() {
            let rest = &chunk[i..];
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    self.spill(chunk, &mut pending);
                    self.line.extend_from_slice(rest);
                    return;
                }
                Some(pos) => {
                    let mut end = i + pos + 1;
                    if rest[pos] == b'\r' {
                        if end < chunk.len() {
                            if chunk[end] == b'\n' {
                                end += 1;
                            }
                        } else {
                            self.skip_lf = true;
                        }
                    }
                    if self.line.is_empty() {
                        self.take_line_in(chunk, i, i + pos, end, &mut pending, &mut on_block);
                    } else {
                        self.line.extend_from_slice(&rest[..pos]);
                        let line = std::mem::take(&mut self.line);
                        self.take_line(&line, end, &mut on_block);
                        self.line = line;
                        self.line.clear();
                    }
                    i = end;
                }
            }
        }
        self.spill(chunk, &mut pending);
    }

    /// The block's data so far, lying in `chunk`, into the data buffer: its
    /// block goes on past what is at hand.
    fn spill(&mut self, chunk: &[u8], pending: &mut Option<(usize, usize)>) {
        if let Some((a, b)) = pending.take() {
            self.data.extend_from_slice(&chunk[a..b]);
        }
    }

    /// A line lying whole in `chunk` (`from..to`): a block's first data
    /// line is only noted where it lies.
    fn take_line_in(
        &mut self,
        chunk: &[u8],
        from: usize,
        to: usize,
        end: usize,
        pending: &mut Option<(usize, usize)>,
        on_block: &mut impl FnMut(Option<&[u8]>, usize),
    ) {
        let line = &chunk[from..to];
        if line.is_empty() {
            if let Some((a, b)) = pending.take() {
                on_block(Some(&chunk[a..b]), end);
                self.has_data = false;
                return;
            }
        } else if !self.has_data {
            let (field, value) = field(line);
            if field == b"data" {
                *pending = Some((from + value, to));
                self.has_data = true;
                return;
            }
        }
        self.spill(chunk, pending);
        self.take_line(line, end, on_block);
    }

    fn take_line(&mut self, line: &[u8], end: usize, on_block: &mut impl FnMut(Option<&[u8]>, usize)) {
        if line.is_empty() {
            on_block(self.has_data.then_some(&self.data[..]), end);
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, at) = field(line);
        let value = &line[at..];
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }
}

/// A line's field name, and where its value starts (after the colon and
/// one space; the line's end when it has no colon).
fn field(line: &[u8]) -> (&[u8], usize) {
    match line.iter().position(|&b| b == b':') {
        Some(p) => (&line[..p], if line.get(p + 1) == Some(&b' ') { p + 2 } else { p + 1 }),
        None => (line, line.len()),
    }
}

/// What one `data:` payload of an OpenAI-style stream means.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventInfo {
    pub done: bool,
    /// Carries generated content: text, a tool call, or reasoning.
    pub content: bool,
    pub error: bool,
    /// The final usage chunk (`choices: []` with `usage`).
    pub usage_only: bool,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
}

/// Tokens a replica reported: chat's `prompt_tokens` / `completion_tokens`,
/// or the Responses API's and transcription's `input_tokens` /
/// `output_tokens`; and of the prompt, the tokens its prefix cache held
/// (`prompt_tokens_details.cached_tokens`, the Responses API's
/// `input_tokens_details.cached_tokens`; 0 when not reported).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default, alias = "input_tokens")]
    pub prompt_tokens: u64,
    #[serde(default, alias = "output_tokens")]
    pub completion_tokens: u64,
    #[serde(default, rename = "prompt_tokens_details", alias = "input_tokens_details", deserialize_with = "cached_tokens")]
    pub cached_tokens: u64,
}

impl Usage {
    /// Prompt and completion tokens, none reported cached.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage { prompt_tokens, completion_tokens, cached_tokens: 0 }
    }
}

/// A visitor's methods for the JSON values it does not care about: each
/// gives `$zero` (arrays and objects are skipped through).
macro_rules! zero_otherwise {
    ($ty:ty, $zero:expr; $($kind:ident),*) => {
        $(zero_otherwise!(@ $kind, $ty, $zero);)*
    };
    (@ seq, $ty:ty, $zero:expr) => {
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<$ty, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($zero)
        }
    };
    (@ map, $ty:ty, $zero:expr) => {
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$ty, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($zero)
        }
    };
    (@ unit, $ty:ty, $zero:expr) => {
        fn visit_unit<E: serde::de::Error>(self) -> Result<$ty, E> {
            Ok($zero)
        }
    };
    (@ bool, $ty:ty, $zero:expr) => { zero_otherwise!(@ visit_bool, bool, $ty, $zero); };
    (@ i64, $ty:ty, $zero:expr) => { zero_otherwise!(@ visit_i64, i64, $ty, $zero); };
    (@ u64, $ty:ty, $zero:expr) => { zero_otherwise!(@ visit_u64, u64, $ty, $zero); };
    (@ f64, $ty:ty, $zero:expr) => { zero_otherwise!(@ visit_f64, f64, $ty, $zero); };
    (@ str, $ty:ty, $zero:expr) => { zero_otherwise!(@ visit_str, &str, $ty, $zero); };
    (@ $visit:ident, $arg:ty, $ty:ty, $zero:expr) => {
        fn $visit<E: serde::de::Error>(self, _: $arg) -> Result<$ty, E> {
            Ok($zero)
        }
    };
}

/// `{"cached_tokens": n}`, or `null` (vLLM without
/// `--enable-prompt-tokens-details`), or anything else: 0. Read in
/// passing, not built into a JSON tree.
fn cached_tokens<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Details;
    impl<'de> serde::de::Visitor<'de> for Details {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
            let mut n = 0;
            while let Some(CachedKey(cached)) = map.next_key()? {
                if cached {
                    n = map.next_value::<Count>()?.0;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(n)
        }
        zero_otherwise!(u64, 0; seq, unit, bool, i64, u64, f64, str);
    }
    d.deserialize_any(Details)
}

/// A whole number of tokens; any other JSON value counts 0.
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Count, E> {
                Ok(Count(n))
            }
            zero_otherwise!(Count, Count(0); seq, map, unit, bool, i64, f64, str);
        }
        d.deserialize_any(V)
    }
}

// Strings are read without allocating: serde's `borrow` does not reach a
// `Cow` inside an `Option`, which would copy every token's text into a new
// `String`. Only emptiness (or one comparison) is kept.

/// A chunk, its choices' text read as `T`: [`NonEmpty`] to know only
/// whether there is text (no allocation), [`Str`] to keep it.
#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Field + Deserialize<'de>"))]
struct Chunk<T> {
    #[serde(default = "none")]
    choices: Option<Choices<T>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    object: Option<IsError>,
    /// A typed event (the Responses API, OpenAI's transcription stream):
    /// `response.output_text.delta`, `response.completed`, ...
    #[serde(default, rename = "type")]
    kind: Option<TypeName>,
    /// A typed delta event's text: a string (the Responses API), or an
    /// object (Anthropic's Messages: `text`, `thinking`, `partial_json`,
    /// and a `message_delta`'s `stop_reason`).
    #[serde(default)]
    delta: Option<DeltaField>,
    /// The response a `response.completed` / `incomplete` / `failed` event carries.
    #[serde(default)]
    response: Option<ResponseObject>,
    /// The message an Anthropic `message_start` carries (its usage); an
    /// error event's `message` (a string) is none.
    #[serde(default)]
    message: Option<MessageField>,
}

/// A `message` member: an object (Anthropic's message), or anything else.
#[derive(Deserialize)]
#[serde(untagged)]
enum MessageField {
    Message(ResponseObject),
    Other(IgnoredAny),
}

/// A typed event's `delta`: its text's length, and a stop reason.
#[derive(Debug, Default)]
struct DeltaField {
    chars: usize,
    stop_reason: Option<String>,
}

impl<'de> Deserialize<'de> for DeltaField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = DeltaField;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a delta")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DeltaField, E> {
                Ok(DeltaField { chars: v.chars().count(), stop_reason: None })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<DeltaField, A::Error> {
                let mut out = DeltaField::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "text" | "thinking" | "partial_json" => out.chars += map.next_value::<TextLen>()?.0,
                        "stop_reason" => out.stop_reason = map.next_value::<Option<String>>()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
            zero_otherwise!(DeltaField, DeltaField::default(); bool, i64, u64, f64, unit, seq);
        }
        d.deserialize_any(V)
    }
}

/// What a typed event's `type` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `*.delta`: generated text, reasoning, a tool call's arguments, audio.
    Delta,
    /// `response.completed`, `transcript.text.done`, `speech.audio.done`: the whole answer.
    Completed,
    /// `response.incomplete`: ended early (a token limit, a filter).
    Incomplete,
    /// `response.failed`, `error`.
    Failed,
    /// Anthropic's `message_start` (the prompt's usage), `message_delta`
    /// (the stop reason, the output's usage), `message_stop` (the end).
    MessageStart,
    MessageDelta,
    MessageStop,
    Other,
}

#[derive(Deserialize)]
struct ResponseObject {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

/// Any JSON value, read for the length in characters of a string (not
/// copied); anything else (content given as parts, a number) counts 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextLen(pub usize);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TextLen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TextLen, E> {
                Ok(TextLen(v.chars().count()))
            }
            zero_otherwise!(TextLen, TextLen(0); bool, i64, u64, f64, unit, seq, map);
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
struct Choice<T> {
    #[serde(default)]
    index: u64,
    #[serde(default = "none")]
    delta: Option<Delta<T>>,
    #[serde(default = "none")]
    text: Option<T>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
struct Delta<T> {
    #[serde(default = "none")]
    content: Option<T>,
    #[serde(default)]
    reasoning_content: Option<NonEmpty>,
    #[serde(default)]
    reasoning: Option<NonEmpty>,
    #[serde(default)]
    tool_calls: Option<NonEmptySeq>,
}

/// A missing member (a generic `Option` has no `Default` bound to lean on).
fn none<T>() -> Option<T> {
    None
}

/// A string, read for whether it is empty. Not a string: a type error.
pub(crate) struct NonEmpty(bool);

/// A string, read for whether it is `"error"`.
struct IsError(bool);

/// An array, read for whether it has elements (which are skipped).
struct NonEmptySeq(bool);

fn non_empty(s: &Option<NonEmpty>) -> bool {
    s.as_ref().is_some_and(|s| s.0)
}

macro_rules! str_visitor {
    ($ty:ident, $what:literal, |$v:ident| $test:expr) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: serde::de::Error>(self, $v: &str) -> Result<$ty, E> {
                        Ok($ty($test))
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

str_visitor!(NonEmpty, "a string", |v| !v.is_empty());
str_visitor!(TypeName, "an event type", |v| match v {
    "response.completed" | "transcript.text.done" | "speech.audio.done" => Kind::Completed,
    "response.incomplete" => Kind::Incomplete,
    "response.failed" | "error" => Kind::Failed,
    "content_block_delta" => Kind::Delta,
    "message_start" => Kind::MessageStart,
    "message_delta" => Kind::MessageDelta,
    "message_stop" => Kind::MessageStop,
    _ if v.ends_with(".delta") => Kind::Delta,
    _ => Kind::Other,
});

/// A `type` string, read for its [`Kind`].
struct TypeName(Kind);
str_visitor!(IsError, "a string", |v| v == "error");

/// A key of `prompt_tokens_details`, read for whether it is `cached_tokens`.
struct CachedKey(bool);
str_visitor!(CachedKey, "a key", |v| v == "cached_tokens");

impl<'de> Deserialize<'de> for NonEmptySeq {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = NonEmptySeq;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NonEmptySeq, A::Error> {
                let mut any = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(NonEmptySeq(any))
            }
        }
        d.deserialize_seq(V)
    }
}

/// What the `choices` array says, folded while it is read (no `Vec`).
struct Choices<T> {
    any: bool,
    content: bool,
    finish_reason: Option<String>,
    /// The first choice's text (`delta.content`, or `text`).
    text: Option<T>,
    /// What a continuation cannot carry on from: a tool call, reasoning, a
    /// choice other than the first with text.
    other: bool,
}

impl<'de, T: Field + Deserialize<'de>> Deserialize<'de> for Choices<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fold<T>(std::marker::PhantomData<T>);
        impl<'de, T: Field + Deserialize<'de>> serde::de::Visitor<'de> for Fold<T> {
            type Value = Choices<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Choices<T>, A::Error> {
                let mut out = Choices { any: false, content: false, finish_reason: None, text: None, other: false };
                while let Some(c) = seq.next_element::<Choice<T>>()? {
                    out.any = true;
                    let mut text = c.text.filter(T::filled);
                    if let Some(d) = c.delta {
                        let other =
                            non_empty(&d.reasoning_content) || non_empty(&d.reasoning) || d.tool_calls.as_ref().is_some_and(|t| t.0);
                        out.other |= other;
                        out.content |= other;
                        text = d.content.filter(T::filled).or(text);
                    }
                    if let Some(t) = text {
                        out.content = true;
                        if c.index == 0 && out.text.is_none() {
                            out.text = Some(t);
                        } else {
                            out.other = true;
                        }
                    }
                    if let Some(f) = c.finish_reason {
                        out.finish_reason = Some(f);
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Fold(std::marker::PhantomData))
    }
}

/// A usage object (the value of an answer's `usage`) as [`Usage`]: read in
/// one pass where it has the common shape, through serde otherwise; `None`
/// when it is not a usage object.
pub fn read_usage(data: &[u8]) -> Option<Usage> {
    scan::quick_usage(data).or_else(|| from_json::<Usage>(data).ok())
}

/// Read JSON, its UTF-8 checked once for the whole text rather than string
/// by string (each key and value was checked apart: a fifth of the cost of
/// reading a stream's chunk). Bytes that are not UTF-8 are read as bytes,
/// so a stray byte fails only a string that holds it, as before.
pub fn from_json<'a, T: Deserialize<'a>>(data: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(data) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(data),
    }
}

/// One payload read whole, its choices' text as `T`: what it means, the
/// text of its first choice, and whether it holds what a continuation
/// cannot carry on from.
pub(crate) fn read<'a, T: Field + Deserialize<'a>>(data: &'a [u8]) -> (EventInfo, Option<T>, bool) {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return (EventInfo { done: true, ..Default::default() }, None, false);
    }
    let Ok(chunk) = from_json::<Chunk<T>>(trimmed) else {
        return (EventInfo::default(), None, false);
    };
    let mut info =
        EventInfo { error: chunk.error.is_some() || chunk.object.is_some_and(|o| o.0), usage: chunk.usage, ..Default::default() };
    let (mut text, mut other) = (None, false);
    if let Some(choices) = chunk.choices {
        info.usage_only = !choices.any && chunk.usage.is_some();
        info.content = choices.content;
        info.finish_reason = choices.finish_reason;
        (text, other) = (choices.text, choices.other);
    }
    if let Some(TypeName(kind)) = chunk.kind {
        let message = chunk.message.and_then(|m| match m {
            MessageField::Message(r) => Some(r),
            MessageField::Other(_) => None,
        });
        typed(kind, &chunk.delta, chunk.response.or(message), &mut info);
    }
    (info, text, other)
}

/// Classify one event payload. Payloads that are not JSON are neither content
/// nor errors (they are passed through untouched).
pub fn analyze(data: &[u8]) -> EventInfo {
    match scan::quick(data.trim_ascii()) {
        Some(q) => q.info,
        None => read::<NonEmpty>(data).0,
    }
}

/// A typed event (the Responses API, OpenAI's transcription stream): a
/// delta with text is content; `response.completed` (or
/// `transcript.text.done`) ends the answer, `response.incomplete` ends it
/// early (`length` when a token limit cut it), `response.failed` and
/// `error` are errors. These streams have no `[DONE]`: the ending event is it.
fn typed(kind: Kind, delta: &Option<DeltaField>, response: Option<ResponseObject>, info: &mut EventInfo) {
    match kind {
        Kind::Delta => info.content |= delta.as_ref().is_some_and(|d| d.chars > 0),
        Kind::Completed => {
            info.done = true;
            info.finish_reason = Some("stop".into());
        }
        Kind::Incomplete => {
            info.done = true;
            let reason = response.as_ref().and_then(|r| r.incomplete_details.as_ref()).and_then(|d| d.reason.as_deref());
            info.finish_reason = Some(match reason {
                Some("max_output_tokens") | Some("max_tokens") | None => "length".into(),
                Some(other) => other.into(),
            });
        }
        Kind::Failed => info.error = true,
        // Anthropic's: the stop reason in OpenAI's names (`max_tokens` is `length`).
        Kind::MessageDelta => {
            info.finish_reason = delta.as_ref().and_then(|d| d.stop_reason.as_deref()).map(|r| match r {
                "max_tokens" => "length".to_string(),
                "end_turn" | "stop_sequence" => "stop".to_string(),
                "tool_use" => "tool_calls".to_string(),
                other => other.to_string(),
            });
        }
        Kind::MessageStop => info.done = true,
        Kind::MessageStart | Kind::Other => {}
    }
    if let Some(u) = response.and_then(|r| r.usage) {
        info.usage = Some(u);
    }
}

#[cfg(test)]
mod tests;
