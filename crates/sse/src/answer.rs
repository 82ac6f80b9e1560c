//! Reading a complete (non-streaming) answer: its usage, how it finished,
//! and, when the replica reports no usage, how much text it holds to
//! estimate its tokens from. Nothing else is built: an embeddings answer's
//! thousands of numbers and a completion's text are checked and skipped.
//!
//! Answers of the common shape are read in one pass (`scan::quick_answer`);
//! the rest through serde, here. Tests hold the two readings equal.

use crate::{from_json, scan, TextLen, Usage};
use serde_json::value::RawValue;

/// What a complete answer says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// Usage as the replica reported it; `None` when it reported none.
    pub usage: Option<Usage>,
    /// When no usage is reported: the characters of the choices' text
    /// (a message's content, or a completion's text); 0 otherwise.
    pub chars: usize,
    /// The first finish reason given among the choices.
    pub finish_reason: Option<String>,
    /// Some choice finished for length.
    pub length: bool,
    /// A Responses API answer's `status`: `completed`, `incomplete`, `failed`.
    pub status: Option<String>,
}

/// Read a complete answer: in one pass where it has the common shape,
/// through serde otherwise. `None` when it is not the JSON answer asked
/// for (garbage, a cut body).
pub fn read_answer(data: &[u8]) -> Option<Answer> {
    scan::quick_answer(data).or_else(|| full_answer(data))
}

/// Read a complete answer's usage from its tail, where vLLM and OpenAI
/// write it, without walking the rest (an embeddings answer's thousands of
/// numbers, a completion's text); with `finishes`, each choice's finish
/// reason too, found by its key (chat and completion answers). `None`
/// when the answer is not of that shape: read it with [`read_answer`] then.
pub fn read_answer_tail(data: &[u8], finishes: bool) -> Option<Answer> {
    scan::tail_answer(data, finishes)
}

/// The full reading of a complete answer.
pub(crate) fn full_answer(data: &[u8]) -> Option<Answer> {
    // The text is kept as it was sent (its characters are counted only
    // when the replica reports no usage, which vLLM always does): read as
    // text, every answer's text would be checked and counted for nothing.
    #[derive(serde::Deserialize)]
    struct Whole<'a> {
        #[serde(default)]
        usage: Option<Usage>,
        #[serde(default, borrow)]
        choices: Vec<WholeChoice<'a>>,
        #[serde(default)]
        status: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct WholeChoice<'a> {
        #[serde(default)]
        finish_reason: Option<String>,
        #[serde(default, borrow)]
        message: Option<Message<'a>>,
        #[serde(default, borrow)]
        text: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow)]
        content: Option<&'a RawValue>,
    }
    let whole = from_json::<Whole>(data).ok()?;
    let chars = |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str::<TextLen>(r.get()).ok()).map_or(0, |t| t.0);
    let mut answer = Answer { usage: whole.usage, status: whole.status, ..Answer::default() };
    if whole.usage.is_none() {
        answer.chars = whole.choices.iter().map(|c| chars(c.message.as_ref().and_then(|m| m.content).or(c.text))).sum();
    }
    answer.length = whole.choices.iter().any(|c| c.finish_reason.as_deref() == Some("length"));
    answer.finish_reason = whole.choices.into_iter().find_map(|c| c.finish_reason);
    Some(answer)
}
