//! Reading a complete non-streaming JSON answer: its usage and finish
//! reason, or (when the replica reports no usage) an estimate of its tokens
//! from the text, without building a JSON tree of the whole answer.

use super::tracker::Tracker;
use crate::telemetry::Outcome;
use serde_json::value::RawValue;
use sse::{from_json, TextLen as Chars, Usage};

/// Usage as the last member of a JSON object (`..., "usage": {...}}`), as
/// vLLM and OpenAI write it, read without reading the rest (an embeddings
/// answer's thousands of numbers). `None` when it is not found so; the
/// whole answer is read then. The pattern cannot match inside a string,
/// where a quote is escaped.
fn usage_at_end(body: &[u8]) -> Option<Usage> {
    let body = body.trim_ascii();
    let inner = body.strip_prefix(b"{")?.strip_suffix(b"}")?;
    let at = memchr::memmem::rfind(inner, b"\"usage\":")?;
    from_json::<Usage>(&inner[at + 8..]).ok()
}

/// Read usage and finish reason from a complete non-streaming JSON answer
/// (`usage_only`: an answer with no finish, whose usage may be read from its end).
pub(super) fn read_json_outcome(body: &[u8], usage_only: bool, tracker: &mut Tracker) -> Outcome {
    if let Some(u) = usage_only.then(|| usage_at_end(body)).flatten() {
        tracker.usage = Some(u);
        return Outcome::ok;
    }
    // The text is kept as it was sent (its characters are counted only
    // when the replica reports no usage, which vLLM always does): read as
    // text, every answer's text would be checked and counted for nothing.
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(default)]
        usage: Option<Usage>,
        #[serde(default, borrow)]
        choices: Vec<AnswerChoice<'a>>,
        /// A Responses API answer's `status`: `completed`, `incomplete`, `failed`.
        #[serde(default)]
        status: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct AnswerChoice<'a> {
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
    let chars = |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str::<Chars>(r.get()).ok()).map_or(0, |t| t.0);
    match from_json::<Answer>(body) {
        Ok(a) => {
            tracker.usage = a.usage;
            if a.usage.is_none() {
                let chars: usize = a.choices.iter().map(|c| chars(c.message.as_ref().and_then(|m| m.content).or(c.text))).sum();
                tracker.answer_estimate = Some(chars.div_ceil(4) as u64);
            }
            let length = a.choices.iter().any(|c| c.finish_reason.as_deref() == Some("length"));
            tracker.finish_reason = a.choices.into_iter().find_map(|c| c.finish_reason);
            match a.status.as_deref() {
                // A Responses answer that failed: no usable answer.
                Some("failed") => return Outcome::upstream_error,
                Some("incomplete") => {
                    tracker.finish_reason = Some("length".into());
                    return Outcome::length;
                }
                _ => {}
            }
            if length {
                Outcome::length
            } else {
                Outcome::ok
            }
        }
        // A 200 that is not the JSON answer asked for (garbage, a cut
        // body): the caller got no usable answer.
        Err(_) => Outcome::upstream_error,
    }
}
