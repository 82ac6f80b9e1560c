//! Reading a complete non-streaming JSON answer: its usage and finish
//! reason, or (when the replica reports no usage) an estimate of its tokens
//! from the text, without building a JSON tree of the whole answer.
//!
//! An answer of the shape vLLM and OpenAI write is read from its tail
//! ([`sse::read_answer_tail`]): the usage member and the finish reasons'
//! keys, not the text. Such an answer is not checked as JSON as a whole
//! (the client reads it as the replica sent it; only what slogate counts
//! is read); one of any other shape is read whole, and one that does not
//! read as the answer asked for counts as the replica's error
//! (docs/design/measurement.md, rule 8).

use super::tracker::Tracker;
use crate::config::Endpoint;
use crate::telemetry::Outcome;
use sse::Usage;

/// Read usage and finish reason from a complete non-streaming JSON answer
/// (`usage_only`: an answer with no finish, embeddings or rerank).
pub(super) fn read_json_outcome(body: &[u8], usage_only: bool, tracker: &mut Tracker) -> Outcome {
    // Usage read from the tail, where vLLM and OpenAI write it, without
    // walking the text or numbers before it; with a chat or completion
    // answer's finish reasons, found by their keys. A Responses answer's
    // status is read the whole way.
    let choices = matches!(tracker.endpoint(), Endpoint::Chat | Endpoint::Completions);
    if let Some(a) = (usage_only || choices).then(|| sse::read_answer_tail(body, !usage_only)).flatten() {
        tracker.usage = a.usage;
        tracker.finish_reason = a.finish_reason;
        return if a.length { Outcome::length } else { Outcome::ok };
    }
    // A 200 that is not the JSON answer asked for (garbage, a cut body):
    // the caller got no usable answer.
    let Some(answer) = sse::read_answer(body) else { return Outcome::upstream_error };
    tracker.usage = answer.usage;
    if answer.usage.is_none() {
        tracker.answer_estimate = Some(answer.chars.div_ceil(4) as u64);
    }
    tracker.finish_reason = answer.finish_reason;
    match answer.status.as_deref() {
        // A Responses answer that failed: no usable answer.
        Some("failed") => Outcome::upstream_error,
        Some("incomplete") => {
            tracker.finish_reason = Some("length".into());
            Outcome::length
        }
        _ if answer.length => Outcome::length,
        _ => Outcome::ok,
    }
}

/// Read a transcription's whole answer (`{"text": ...}`, vLLM's and
/// OpenAI's): its usage where it reports one in tokens, else its text's
/// tokens estimated (four characters a token) as a completion's are.
pub(super) fn read_transcription(body: &[u8], tracker: &mut Tracker) -> Outcome {
    #[derive(serde::Deserialize)]
    struct Transcript<'a> {
        #[serde(borrow)]
        text: &'a serde_json::value::RawValue,
        #[serde(default)]
        usage: Option<serde_json::Value>,
    }
    let Ok(t) = serde_json::from_slice::<Transcript<'_>>(body) else { return Outcome::upstream_error };
    tracker.usage = t.usage.and_then(|u| serde_json::from_value::<Usage>(u).ok()).filter(|u| u.prompt_tokens + u.completion_tokens > 0);
    if tracker.usage.is_none() {
        let chars = serde_json::from_str::<String>(t.text.get()).map_or(0, |s| s.chars().count());
        tracker.answer_estimate = Some(chars.div_ceil(4) as u64);
    }
    Outcome::ok
}

/// Read an Anthropic message (`/v1/messages`, whole): its usage
/// (`input_tokens`, `output_tokens`) and its `stop_reason` (`max_tokens`:
/// `length`), else its text's tokens estimated.
pub(super) fn read_message(body: &[u8], tracker: &mut Tracker) -> Outcome {
    #[derive(serde::Deserialize)]
    struct Message {
        #[serde(default)]
        usage: Option<Usage>,
        #[serde(default)]
        stop_reason: Option<String>,
        #[serde(default)]
        content: Vec<Block>,
    }
    #[derive(serde::Deserialize)]
    struct Block {
        #[serde(default)]
        text: Option<String>,
    }
    let Ok(m) = serde_json::from_slice::<Message>(body) else { return Outcome::upstream_error };
    tracker.usage = m.usage;
    if m.usage.is_none() {
        let chars: usize = m.content.iter().filter_map(|b| b.text.as_deref()).map(|t| t.chars().count()).sum();
        tracker.answer_estimate = Some(chars.div_ceil(4) as u64);
    }
    match m.stop_reason.as_deref() {
        Some("max_tokens") => {
            tracker.finish_reason = Some("length".into());
            Outcome::length
        }
        other => {
            tracker.finish_reason = other.map(|r| if r == "end_turn" { "stop".into() } else { r.to_string() });
            Outcome::ok
        }
    }
}
