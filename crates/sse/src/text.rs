//! The text a chunk of a chat or completions stream carries, for a caller
//! that must know what the client has read so far (to continue the answer
//! elsewhere when its stream breaks), read in the same pass as
//! [`crate::analyze`]'s.
//!
//! Only what a continuation can reproduce exactly counts as text: `content`
//! (chat) or `text` (completions) of the first choice. A tool call, a
//! reasoning delta or a second choice with text is [`Piece::Other`].

use std::borrow::Cow;

use serde::Deserialize;

use crate::scan::Quick;
use crate::{EventInfo, NonEmpty};

/// How a choice's text is read: for whether there is any, or kept.
pub(crate) trait Field {
    fn filled(&self) -> bool;
}

impl Field for NonEmpty {
    fn filled(&self) -> bool {
        self.0
    }
}

impl Field for Str<'_> {
    fn filled(&self) -> bool {
        !self.0.is_empty()
    }
}

/// What one chunk adds to the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Nothing (a role chunk, usage, a finish, not JSON).
    Nothing,
    /// Text, appended to the caller's buffer.
    Text,
    /// Something a continuation cannot carry on from: a tool call, a
    /// reasoning delta, a choice other than the first.
    Other,
}

/// A JSON string, borrowed from the chunk unless it had escapes (then
/// unescaped into a `String`). Not a string: a type error.
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// [`crate::analyze`], and the text the payload carries appended to `out`.
pub fn analyze_text(data: &[u8], out: &mut String) -> (EventInfo, Piece) {
    let trimmed = data.trim_ascii();
    match crate::scan::quick(trimmed).and_then(|q| quick_text(q, trimmed, out)) {
        Some(read) => read,
        None => full_text(data, out),
    }
}

/// A chunk read the quick way, its text appended to `out`; `None` (nothing
/// appended) where the text needs unescaping: the full reading does that.
pub(crate) fn quick_text(q: Quick, trimmed: &[u8], out: &mut String) -> Option<(EventInfo, Piece)> {
    if q.text.is_some_and(|t| t.escaped) {
        return None;
    }
    // Its bytes lie between two quotes of text already checked as UTF-8.
    let text = q.text.and_then(|t| std::str::from_utf8(&trimmed[t.start..t.end]).ok());
    Some(match (q.other, text) {
        (true, _) => (q.info, Piece::Other),
        (false, Some(text)) => {
            out.push_str(text);
            (q.info, Piece::Text)
        }
        (false, None) => (q.info, Piece::Nothing),
    })
}

/// A chunk read the full way, its text appended to `out`.
pub(crate) fn full_text(data: &[u8], out: &mut String) -> (EventInfo, Piece) {
    let (info, text, other) = crate::read::<Str<'_>>(data);
    if other {
        return (info, Piece::Other);
    }
    match text {
        Some(t) => {
            out.push_str(&t.0);
            (info, Piece::Text)
        }
        None => (info, Piece::Nothing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(data: &[u8], out: &mut String) -> Piece {
        let (info, piece) = analyze_text(data, out);
        assert_eq!(info, crate::analyze(data), "the same reading as analyze's");
        piece
    }

    #[test]
    fn chat_and_completion_text_is_appended_as_sent() {
        let mut out = String::new();
        let role = br#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(text_of(role, &mut out), Piece::Nothing);
        assert_eq!(text_of(br#"{"choices":[{"index":0,"delta":{"content":"He"}}]}"#, &mut out), Piece::Text);
        assert_eq!(text_of(br#"{"choices":[{"index":0,"delta":{"content":"y \"you\"\n\u00e9"}}]}"#, &mut out), Piece::Text);
        assert_eq!(text_of(br#"{"choices":[{"index":0,"text":" there","finish_reason":null}]}"#, &mut out), Piece::Text);
        assert_eq!(out, "Hey \"you\"\n\u{e9} there");
        let usage = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        assert_eq!(text_of(usage, &mut out), Piece::Nothing);
        assert_eq!(text_of(b"[DONE]", &mut out), Piece::Nothing);
        assert_eq!(text_of(b"not json", &mut out), Piece::Nothing);
    }

    #[test]
    fn tool_calls_reasoning_and_other_choices_cannot_be_continued() {
        let mut out = String::new();
        for other in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm"}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"b"}}]}"#,
        ] {
            assert_eq!(text_of(other.as_bytes(), &mut out), Piece::Other, "{other}");
        }
        assert_eq!(text_of(br#"{"choices":[{"delta":{"content":"a","tool_calls":[]}}]}"#, &mut out), Piece::Text);
        assert_eq!(out, "a");
    }
}
