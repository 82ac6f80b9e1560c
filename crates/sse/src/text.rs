//! The text a chunk of a chat or completions stream carries, for a caller
//! that must know what the client has read so far (to continue the answer
//! elsewhere when its stream breaks).
//!
//! Only what a continuation can reproduce exactly counts as text: `content`
//! (chat) or `text` (completions) of the first choice. A tool call, a
//! reasoning delta or a second choice makes the stream [`Piece::Other`].

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

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

/// A JSON string, borrowed from the chunk unless it had escapes.
struct Str<'a>(Cow<'a, str>);

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

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Str<'a>>,
    #[serde(default)]
    reasoning_content: Option<Str<'a>>,
    #[serde(default)]
    reasoning: Option<Str<'a>>,
    #[serde(default)]
    tool_calls: Option<Vec<IgnoredAny>>,
}

fn filled(s: &Option<Str<'_>>) -> bool {
    s.as_ref().is_some_and(|s| !s.0.is_empty())
}

/// Append the text `data` (one event's payload) carries to `out`, and say
/// what it carried.
pub fn delta_text(data: &[u8], out: &mut String) -> Piece {
    let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data.trim_ascii()) else {
        return Piece::Nothing;
    };
    let mut piece = Piece::Nothing;
    for c in chunk.choices.unwrap_or_default() {
        let delta = c.delta.as_ref();
        let other = delta
            .is_some_and(|d| filled(&d.reasoning_content) || filled(&d.reasoning) || d.tool_calls.as_ref().is_some_and(|t| !t.is_empty()));
        let text = delta.and_then(|d| d.content.as_ref()).or(c.text.as_ref()).filter(|t| !t.0.is_empty());
        if other || (c.index != 0 && text.is_some()) {
            return Piece::Other;
        }
        if let Some(t) = text {
            out.push_str(&t.0);
            piece = Piece::Text;
        }
    }
    piece
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_and_completion_text_is_appended_as_sent() {
        let mut out = String::new();
        let role = br#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(delta_text(role, &mut out), Piece::Nothing);
        assert_eq!(delta_text(br#"{"choices":[{"index":0,"delta":{"content":"He"}}]}"#, &mut out), Piece::Text);
        assert_eq!(delta_text(br#"{"choices":[{"index":0,"delta":{"content":"y \"you\"\n\u00e9"}}]}"#, &mut out), Piece::Text);
        assert_eq!(delta_text(br#"{"choices":[{"index":0,"text":" there","finish_reason":null}]}"#, &mut out), Piece::Text);
        assert_eq!(out, "Hey \"you\"\n\u{e9} there");
        let usage = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        assert_eq!(delta_text(usage, &mut out), Piece::Nothing);
        assert_eq!(delta_text(b"[DONE]", &mut out), Piece::Nothing);
        assert_eq!(delta_text(b"not json", &mut out), Piece::Nothing);
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
            assert_eq!(delta_text(other.as_bytes(), &mut out), Piece::Other, "{other}");
        }
        assert_eq!(delta_text(br#"{"choices":[{"delta":{"content":"a","tool_calls":[]}}]}"#, &mut out), Piece::Text);
        assert_eq!(out, "a");
    }
}
