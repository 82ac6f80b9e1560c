//! What slogate reads of a replica's events beyond the measuring: a
//! stored response's id (the Responses API), usage reported in parts
//! (Anthropic's), an event read through the splice when the stream may be
//! continued.

use super::super::tracker::Tracker;
use sse::Memo;

/// A Responses request's stored response id, from its stream's
/// `response.created` event (`event`) or its whole answer: the gateway
/// learns which replica owns it (docs/design/responses.md).
#[inline]
pub(super) fn learn_id(tracker: &mut Tracker, d: &[u8], event: bool) {
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct Created {
        response: Id,
    }
    if !tracker.learning() {
        return;
    }
    let id = if event {
        if memchr::memmem::find(d, b"\"response.created\"").is_none() {
            return;
        }
        serde_json::from_slice::<Created>(d).ok().map(|c| c.response.id)
    } else {
        serde_json::from_slice::<Id>(d).ok().map(|i| i.id)
    };
    if let Some(id) = id {
        tracker.learned(&id);
    }
}

/// A stream's usage so far and a later report of it: each count the
/// larger (Anthropic's `message_start` says the prompt's tokens, its
/// `message_delta` the output's; a report that repeats one says no less).
pub(super) fn merged(before: Option<sse::Usage>, u: sse::Usage) -> sse::Usage {
    match before {
        None => u,
        Some(b) => sse::Usage {
            prompt_tokens: b.prompt_tokens.max(u.prompt_tokens),
            completion_tokens: b.completion_tokens.max(u.completion_tokens),
            cached_tokens: b.cached_tokens.max(u.cached_tokens),
        },
    }
}

/// A stream's usage once the replica reports `u`: a continuation's is the
/// whole answer's less what the client had; the original's may come in
/// parts (Anthropic's), merged.
pub(super) fn reported(before: Option<sse::Usage>, splice: Option<&super::super::resume::Splice>, u: sse::Usage) -> sse::Usage {
    match splice.filter(|s| s.spliced()) {
        Some(s) => s.usage(u),
        None => merged(before, u),
    }
}

/// One complete event's data `d`, read through the splice when the stream
/// may be continued (it notes the stream's ids), else by the memo.
pub(super) fn read_event(splice: Option<&mut super::super::resume::Splice>, d: &[u8], memo: &mut Memo) -> sse::EventInfo {
    match splice {
        Some(s) => {
            s.note_ids(d);
            s.read(d, memo)
        }
        None => memo.analyze(d),
    }
}
