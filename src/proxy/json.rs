//! Reading a complete non-streaming JSON answer: its usage and finish
//! reason, or (when the replica reports no usage) an estimate of its tokens
//! from the text, without building a JSON tree of the whole answer.

use super::tracker::Tracker;
use crate::telemetry::Outcome;
use sse::Usage;

/// Usage as the last member of a JSON object (`..., "usage": {...}}`), as
/// vLLM and OpenAI write it, read without reading the rest (an embeddings
/// answer's thousands of numbers). `None` when it is not found so; the
/// whole answer is read then. The pattern cannot match inside a string,
/// where a quote is escaped.
fn usage_at_end(body: &[u8]) -> Option<Usage> {
    let body = body.trim_ascii();
    let inner = body.strip_prefix(b"{")?.strip_suffix(b"}")?;
    let at = rfind_usage(inner)?;
    sse::read_usage(&inner[at + KEY.len()..])
}

const KEY: &[u8] = b"\"usage\":";

/// Where the last `"usage":` in `b` starts: found from the end by its `u`
/// (a searcher built for each answer cost more than the search).
fn rfind_usage(b: &[u8]) -> Option<usize> {
    let mut end = b.len();
    while let Some(u) = memchr::memrchr(b'u', &b[..end]) {
        if u > 0 && b[u - 1..].starts_with(KEY) {
            return Some(u - 1);
        }
        end = u;
    }
    None
}

/// Read usage and finish reason from a complete non-streaming JSON answer
/// (`usage_only`: an answer with no finish, whose usage may be read from its end).
pub(super) fn read_json_outcome(body: &[u8], usage_only: bool, tracker: &mut Tracker) -> Outcome {
    if let Some(u) = usage_only.then(|| usage_at_end(body)).flatten() {
        tracker.usage = Some(u);
        return Outcome::ok;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The last `"usage":` is found where a searcher for it finds it.
    #[test]
    fn usage_is_found_from_the_end_as_a_search_finds_it() {
        for body in [
            &br#""usage":{}"#[..],
            br#"{"a":"u","usage":{"x":"uu"},"b":"usage","usage":null}"#,
            br#"{"usage" :1,"usag":2,"uu\"usage\":"}"#,
            br#"uuuuusage":"#,
            b"",
            b"u",
            br#"{"data":[0.1,0.2],"usage":{"prompt_tokens":1,"prompt_tokens_details":null}}"#,
        ] {
            assert_eq!(rfind_usage(body), memchr::memmem::rfind(body, KEY), "{:?}", String::from_utf8_lossy(body));
        }
    }
}
