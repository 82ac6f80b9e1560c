//! Reading a complete answer from its tail: its usage where vLLM and
//! OpenAI write it (a member of the answer, after the choices, with at
//! most a few small members after it), and, for a chat or completion
//! answer, each choice's `finish_reason` found by its key. The choices'
//! text, most of an answer, is never walked.
//!
//! A key is found by a search for `"name"` whose opening quote follows
//! `{` or `,` and whose closing one a colon (whitespace between): inside
//! a string every quote is escaped, so such a match is a member's key in
//! valid JSON. The usage is the last such `"usage"`, taken only when what
//! follows it is the usage object, then members, then the answer's closing
//! brace (so it is a member of the answer itself, not of something inside
//! it). The
//! answer is not checked as a whole: where the tail reading answers, it
//! answers as the full reading does for valid JSON with one of each key,
//! which is what replicas write; anything else (no usage in that place,
//! a usage or finish reason of another shape, no finish reason at all) is
//! left to the full reading.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::Cursor;
use crate::Answer;

const USAGE: &[u8] = b"\"usage\"";
const FINISH: &[u8] = b"\"finish_reason\"";

/// The searcher, built once (built for each answer, it costs more than the search).
static FINISH_FWD: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(FINISH));

/// An answer's usage (and, with `finishes`, its choices' finish reasons)
/// read from the tail; `None` leaves it to the full reading.
pub(crate) fn tail_answer(data: &[u8], finishes: bool) -> Option<Answer> {
    let inner = data.trim_ascii().strip_prefix(b"{")?.strip_suffix(b"}")?;
    let at = last_key(inner)?;
    let mut answer = Answer { usage: Some(usage_then_members(&inner[at + USAGE.len()..])?), ..Answer::default() };
    if finishes {
        let head = &inner[..at];
        let mut found = false;
        for m in FINISH_FWD.find_iter(head).filter(|&m| at_key(head, m)) {
            let mut c = Cursor { b: head, i: m + FINISH.len() };
            c.open(b':')?;
            let finish = c.plain_or_null()?;
            if !matches!(c.peek(), Some(b',' | b'}')) {
                return None;
            }
            found = true;
            if let Some(f) = finish {
                let f = std::str::from_utf8(f).ok()?;
                answer.length |= f == "length";
                if answer.finish_reason.is_none() {
                    answer.finish_reason = Some(f.to_owned());
                }
            }
        }
        if !found {
            return None;
        }
    }
    Some(answer)
}

/// Where the last `"usage"` that is a key starts (a colon after it).
///
/// Found from its `u`, searched backwards: a usage object's own keys and
/// numbers hold no `u` (only a `null` does), so the search stops at the
/// usage key's after a step or two. A substring search backwards walks
/// every byte of the usage object instead (about 500 instructions a
/// completion, measured, against about 100).
fn last_key(b: &[u8]) -> Option<usize> {
    memchr::memrchr_iter(b'u', b)
        .filter_map(|u| u.checked_sub(1))
        .find(|&at| b[at..].starts_with(USAGE) && at_key(b, at) && b[at + USAGE.len()..].trim_ascii_start().first() == Some(&b':'))
}

/// The quote at `at` opens a key: `{` or `,` before it, or the start of
/// the answer's members.
fn at_key(b: &[u8], at: usize) -> bool {
    match b[..at].trim_ascii_end().last() {
        None => true,
        Some(c) => matches!(c, b'{' | b','),
    }
}

/// A colon, a usage object, then any members, to the end of `rest`.
fn usage_then_members(rest: &[u8]) -> Option<crate::Usage> {
    std::str::from_utf8(rest).ok()?;
    let mut c = Cursor { b: rest, i: 0 };
    c.open(b':')?;
    let usage = c.usage()?;
    loop {
        match c.peek() {
            None => return Some(usage),
            Some(b',') => {
                c.i += 1;
                c.string()?;
                c.open(b':')?;
                c.skip(1)?;
            }
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests;
