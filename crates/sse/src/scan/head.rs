//! The quick reading of a request body's routed-on members (`model`,
//! `stream`, the token counts, where the prompt is): one pass over the
//! bytes, nothing built. Through serde's derived reading, a small request's
//! head took about 2,360 instructions in the gateway, a third of routing's;
//! read here, about 1,660.
//!
//! It answers only where serde's reading of the same members would answer
//! the same: a key written with an escape, one of these members given
//! twice, a `model` or `stream` of another type (or a string with escapes),
//! `stream_options` (an object read by its members), a count that is not a
//! plain whole number, or JSON that is not valid gets `None`, and the
//! caller reads it the serde way.

use super::{once, Cursor};

/// A request's routed-on members, as read by [`quick_request_head`].
/// Spans are `(start, len)` of the member's value as written.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub model: Option<&'a str>,
    pub stream: Option<bool>,
    /// `priority` given, whatever its value.
    pub priority: bool,
    /// `cache_salt` given, whatever its value.
    pub cache_salt: bool,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub n: Option<u64>,
    pub best_of: Option<u64>,
    pub messages: Option<(usize, usize)>,
    pub prompt: Option<(usize, usize)>,
    pub input: Option<(usize, usize)>,
    pub instructions: Option<(usize, usize)>,
    pub prompt_cache_key: Option<(usize, usize)>,
    pub metadata: Option<(usize, usize)>,
    pub previous_response_id: Option<&'a str>,
}

/// The members read: each one's place in the `seen` list, and, for the
/// token counts and the members whose place is read, in their lists.
#[derive(Clone, Copy)]
enum Member {
    Model,
    Stream,
    PreviousResponseId,
    Priority,
    CacheSalt,
    StreamOptions,
    /// `max_tokens`, `max_completion_tokens`, `max_output_tokens`, `n`, `best_of`.
    Count(usize),
    /// `messages`, `prompt`, `input`, `instructions`, `prompt_cache_key`, `metadata`.
    Span(usize),
    Other,
}

/// Which member `key` names (one `match`: the compiler compares by length first).
fn member(key: &[u8]) -> Member {
    match key {
        b"model" => Member::Model,
        b"stream" => Member::Stream,
        b"previous_response_id" => Member::PreviousResponseId,
        b"priority" => Member::Priority,
        b"cache_salt" => Member::CacheSalt,
        b"stream_options" => Member::StreamOptions,
        b"max_tokens" => Member::Count(0),
        b"max_completion_tokens" => Member::Count(1),
        b"max_output_tokens" => Member::Count(2),
        b"n" => Member::Count(3),
        b"best_of" => Member::Count(4),
        b"messages" => Member::Span(0),
        b"prompt" => Member::Span(1),
        b"input" => Member::Span(2),
        b"instructions" => Member::Span(3),
        b"prompt_cache_key" => Member::Span(4),
        b"metadata" => Member::Span(5),
        _ => Member::Other,
    }
}

/// The members of a request body read the quick way, or `None` where the
/// caller must read it the serde way (see the module's doc). `data` must be
/// UTF-8 (the caller checks it once).
pub fn quick_request_head(data: &[u8]) -> Option<RequestHead<'_>> {
    let mut c = Cursor { b: data, i: 0 };
    let (mut model, mut stream, mut previous) = (None, None, None);
    let (mut priority, mut cache_salt) = (false, false);
    let mut counts = [None; 5];
    let mut spans = [None; 6];
    // Each member read at most once: serde refuses a field given twice.
    let mut seen = [false; 5 + 5 + 6];
    c.members(|c, key| {
        match member(key?) {
            Member::Model => {
                once(&mut seen[0])?;
                model = plain_str(c)?;
            }
            Member::Stream => {
                once(&mut seen[1])?;
                stream = bool_or_null(c)?;
            }
            Member::PreviousResponseId => {
                once(&mut seen[2])?;
                previous = plain_str(c)?;
            }
            Member::Priority => {
                once(&mut seen[3])?;
                c.skip(1)?;
                priority = true;
            }
            Member::CacheSalt => {
                once(&mut seen[4])?;
                c.skip(1)?;
                cache_salt = true;
            }
            // Read by its members the serde way.
            Member::StreamOptions => return None,
            Member::Count(i) => {
                once(&mut seen[5 + i])?;
                counts[i] = count_or_other(c)?;
            }
            Member::Span(i) => {
                once(&mut seen[10 + i])?;
                spans[i] = raw(c)?;
            }
            Member::Other => c.skip(1)?,
        }
        Some(())
    })?;
    c.ws();
    (c.i == data.len()).then_some(RequestHead {
        model,
        stream,
        priority,
        cache_salt,
        max_tokens: counts[0],
        max_completion_tokens: counts[1],
        max_output_tokens: counts[2],
        n: counts[3],
        best_of: counts[4],
        messages: spans[0],
        prompt: spans[1],
        input: spans[2],
        instructions: spans[3],
        prompt_cache_key: spans[4],
        metadata: spans[5],
        previous_response_id: previous,
    })
}

/// `null` or a string without escapes.
fn plain_str<'a>(c: &mut Cursor<'a>) -> Option<Option<&'a str>> {
    match c.plain_or_null()? {
        None => Some(None),
        Some(b) => std::str::from_utf8(b).ok().map(Some),
    }
}

fn bool_or_null(c: &mut Cursor<'_>) -> Option<Option<bool>> {
    match c.peek()? {
        b't' => c.literal(b"true").map(|()| Some(true)),
        b'f' => c.literal(b"false").map(|()| Some(false)),
        b'n' => c.literal(b"null").map(|()| None),
        _ => None,
    }
}

/// A token count as serde reads one into a JSON value and takes it as a
/// `u64`: a plain whole number; any other value (a string, `null`) is no
/// count. A number that is not a plain whole number below 10^19 (a sign,
/// a fraction, an exponent) stops the quick reading.
fn count_or_other(c: &mut Cursor<'_>) -> Option<Option<u64>> {
    match c.peek()? {
        b'0'..=b'9' => c.count().map(Some),
        b'-' => None,
        _ => c.skip(1).map(|()| None),
    }
}

/// A value as written, `null` as none: where it is.
fn raw(c: &mut Cursor<'_>) -> Option<Option<(usize, usize)>> {
    if c.null()? {
        return Some(None);
    }
    let start = c.i;
    c.skip(1)?;
    Some(Some((start, c.i - start)))
}

#[cfg(test)]
mod tests {
    use super::{quick_request_head, RequestHead};

    #[test]
    fn the_routed_members_are_read_and_the_rest_skipped() {
        let body =
            br#"{"model":"m", "messages": [{"role":"user","content":"hi"}] ,"max_tokens":64,"n":null,"x":{"y":[1,2.5e3]},"stream":false}"#;
        let h = quick_request_head(body).expect("read");
        let at = |s: Option<(usize, usize)>| s.map(|(at, len)| &body[at..at + len]);
        assert_eq!(h.model, Some("m"));
        assert_eq!(h.stream, Some(false));
        assert_eq!(at(h.messages), Some(&br#"[{"role":"user","content":"hi"}]"#[..]));
        assert_eq!((h.max_tokens, h.n), (Some(64), None));
        assert_eq!(quick_request_head(b"{}"), Some(RequestHead::default()));
    }

    #[test]
    fn what_serde_must_read_is_left_to_it() {
        for body in [
            &br#"{"model":"m","model":"n"}"#[..],
            br#"{"mod\u0065l":"m"}"#,
            br#"{"model":"\u006d"}"#,
            br#"{"model":1}"#,
            br#"{"stream":1}"#,
            br#"{"stream_options":null}"#,
            br#"{"max_tokens":-1}"#,
            br#"{"max_tokens":1e2}"#,
            br#"{"prompt":[1,]}"#,
            br#"{"prompt":"a"}}"#,
            br#"[]"#,
        ] {
            assert_eq!(quick_request_head(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
