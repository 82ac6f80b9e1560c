//! The quick reading of a stream chunk: one pass over the bytes for the
//! shape nearly every chunk of a chat or completions stream has (`choices`
//! with a delta or a text, the rest skipped). Read through serde, such a
//! chunk took about 4,400 instructions, a fifth of the gateway's user-space
//! work per relayed event; read here, about 3,100 (strings are skipped
//! eight bytes at a time, nothing is built).
//!
//! It answers only when it is sure to answer as [`crate::read`] does: a
//! chunk with anything else in it (usage, an error, a typed event, a key
//! written with an escape, a member given twice, a value of another type
//! than the one read, JSON that is not valid) gets `None`, and the caller
//! reads it the full way. Tests hold the two readings equal on valid,
//! mutated and generated chunks.

use crate::EventInfo;

mod answer;
mod head;
mod tail;
pub(crate) use answer::{quick_answer, quick_usage};
pub use head::{quick_request_head, RequestHead};
pub(crate) use tail::tail_answer;

/// The most nested arrays and objects skipped (serde_json's own limit is 128).
const MAX_DEPTH: u32 = 64;

/// A chunk read the quick way: what it means, where its first choice's
/// text is (`(start, end)` of the string's contents, and whether it has
/// escapes), whether it holds what a continuation cannot carry on from,
/// and where the numbers among its own members are (`created`, a
/// simulator's stamps: what changes from one chunk of a stream to the next
/// besides the text; see [`crate::Memo`]).
pub(crate) struct Quick {
    pub(crate) info: EventInfo,
    pub(crate) text: Option<Span>,
    pub(crate) other: bool,
    pub(crate) numbers: Numbers,
}

/// Where the first few numbers among a chunk's own members are, `(start, end)`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Numbers {
    at: [(usize, usize); 4],
    n: usize,
}

impl Numbers {
    fn push(&mut self, start: usize, end: usize) {
        if let Some(slot) = self.at.get_mut(self.n) {
            *slot = (start, end);
            self.n += 1;
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.at[..self.n].iter().copied()
    }
}

/// A string's contents in the chunk, and whether it holds an escape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) escaped: bool,
}

impl Span {
    pub(crate) fn filled(&self) -> bool {
        self.end > self.start
    }
}

/// Read `data` (trimmed of whitespace) the quick way, or `None`.
pub(crate) fn quick(data: &[u8]) -> Option<Quick> {
    // JSON is UTF-8, checked for the whole text as the full reading does.
    std::str::from_utf8(data).ok()?;
    let mut c = Cursor { b: data, i: 0 };
    let mut out = Quick { info: EventInfo::default(), text: None, other: false, numbers: Numbers::default() };
    let (mut seen_choices, mut seen_object, mut seen_usage, mut seen_error) = (false, false, false, false);
    c.members(|c, key| {
        match key? {
            b"choices" => {
                once(&mut seen_choices)?;
                if !c.null()? {
                    c.elements(|c| choice(c, &mut out))?;
                }
            }
            b"object" => {
                once(&mut seen_object)?;
                if let Some(object) = c.plain_or_null()? {
                    out.info.error = object == b"error";
                }
            }
            // `null` is as good as absent (SGLang writes `"usage":null` in every chunk).
            b"usage" => {
                once(&mut seen_usage)?;
                c.null()?.then_some(())?;
            }
            b"error" => {
                once(&mut seen_error)?;
                c.null()?.then_some(())?;
            }
            // Read the full way: rare, and more to them.
            b"type" | b"delta" | b"response" => return None,
            _ if matches!(c.peek()?, b'-' | b'0'..=b'9') => {
                let start = c.i;
                c.number()?;
                out.numbers.push(start, c.i);
            }
            _ => c.skip(0)?,
        }
        Some(())
    })?;
    c.ws();
    (c.i == data.len()).then_some(out)
}

/// A member that may appear once (serde's derived reading refuses a second).
fn once(seen: &mut bool) -> Option<()> {
    if *seen {
        return None;
    }
    *seen = true;
    Some(())
}

/// One of `choices`: `index`, `delta`, `text`, `finish_reason`, the rest
/// skipped; folded into `out` as [`crate::read`] folds the choices.
fn choice(c: &mut Cursor<'_>, out: &mut Quick) -> Option<()> {
    let (mut index, mut text, mut other, mut content) = (None, None, false, None);
    let (mut seen_index, mut seen_delta, mut seen_text, mut seen_finish) = (false, false, false, false);
    c.members(|c, key| {
        match key? {
            b"index" => {
                once(&mut seen_index)?;
                index = Some(c.count()?);
            }
            b"delta" => {
                once(&mut seen_delta)?;
                if !c.null()? {
                    (content, other) = delta(c)?;
                }
            }
            b"text" => {
                once(&mut seen_text)?;
                text = c.string_or_null()?;
            }
            b"finish_reason" => {
                once(&mut seen_finish)?;
                if let Some(reason) = c.plain_or_null()? {
                    out.info.finish_reason = Some(std::str::from_utf8(reason).ok()?.to_owned());
                }
            }
            _ => c.skip(0)?,
        }
        Some(())
    })?;
    out.other |= other;
    out.info.content |= other;
    let text = content.filter(Span::filled).or(text.filter(Span::filled));
    if let Some(t) = text {
        out.info.content = true;
        if index.unwrap_or(0) == 0 && out.text.is_none() {
            out.text = Some(t);
        } else {
            out.other = true;
        }
    }
    Some(())
}

/// A delta: its `content`, and whether it carries reasoning or a tool call.
fn delta(c: &mut Cursor<'_>) -> Option<(Option<Span>, bool)> {
    let (mut content, mut other) = (None, false);
    let (mut seen_content, mut seen_rc, mut seen_r, mut seen_tools) = (false, false, false, false);
    c.members(|c, key| {
        match key? {
            b"content" => {
                once(&mut seen_content)?;
                content = c.string_or_null()?;
            }
            b"reasoning_content" => {
                once(&mut seen_rc)?;
                other |= c.string_or_null()?.is_some_and(|s| s.filled());
            }
            b"reasoning" => {
                once(&mut seen_r)?;
                other |= c.string_or_null()?.is_some_and(|s| s.filled());
            }
            b"tool_calls" => {
                once(&mut seen_tools)?;
                if !c.null()? {
                    other |= c.elements(|c| c.skip(1))? > 0;
                }
            }
            _ => c.skip(0)?,
        }
        Some(())
    })?;
    Some((content, other))
}

/// Where the run of plain characters of a string that starts at `i` ends:
/// at a quote, a backslash or a control character (or the end). The first
/// four words are looked over eight bytes at a time: most strings of a
/// stream (a token's text, a name) and every key of an answer's usage
/// (`prompt_tokens_details` is 21 bytes) end there, and a search set up
/// for a long run would cost them more. Each mask marks the bytes that are its
/// character exactly up to its first one (the borrow may mark bytes after
/// it), so the lowest mark of the three is the first such byte. A longer
/// run (a whole answer's text) is searched with `memchr` for its quote or
/// backslash, then checked for control characters in one pass the
/// compiler vectorises: about a sixth of the instructions per byte.
fn plain_run(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    for _ in 0..4 {
        let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) else { return plain_tail(b, i) };
        let v = u64::from_le_bytes(*word);
        let ends = zero(v ^ (ONES * u64::from(b'"'))) | zero(v ^ (ONES * u64::from(b'\\'))) | (v.wrapping_sub(ONES * 0x20) & !v & HIGH);
        if ends != 0 {
            return i + (ends.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let rest = b.get(i..).unwrap_or_default();
    let run = &rest[..memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len())];
    // No early exit: the whole run in vector steps, then the place only if
    // there is one (a control character ends the string as invalid).
    if run.iter().fold(false, |any, &c| any | (c < 0x20)) {
        return i + run.iter().position(|&c| c < 0x20).unwrap_or(run.len());
    }
    i + run.len()
}

/// The end of a plain run in the last bytes, fewer than a word.
fn plain_tail(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|&c| c != b'"' && c != b'\\' && c >= 0x20) {
        i += 1;
    }
    i
}

/// Where the string whose contents start at `start` (just after its opening
/// quote) ends, read as the quick reading reads a string.
pub(crate) fn string_from(b: &[u8], start: usize) -> Option<Span> {
    Cursor { b, i: start }.string_rest()
}

/// Where the number that starts at `start` ends, read as the quick reading
/// reads a number it skips.
pub(crate) fn number_from(b: &[u8], start: usize) -> Option<usize> {
    let mut c = Cursor { b, i: start };
    c.number()?;
    Some(c.i)
}

/// A position in the chunk. Every method skips the whitespace before what
/// it reads and gives `None` where the quick reading stops.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn open(&mut self, what: u8) -> Option<()> {
        (self.peek()? == what).then(|| self.i += 1)
    }

    /// Just after an opening bracket: true if it closes at once.
    fn close_or_first(&mut self, close: u8) -> Option<bool> {
        if self.peek()? == close {
            self.i += 1;
            return Some(true);
        }
        Some(false)
    }

    /// After a member or element: true if another follows (a comma), false
    /// if the bracket closes.
    fn next_or_close(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// An object, each member read by `each` with its key (`None`: a key
    /// written with an escape) and the cursor at its value.
    fn members(&mut self, mut each: impl FnMut(&mut Self, Option<&'a [u8]>) -> Option<()>) -> Option<()> {
        self.open(b'{')?;
        if self.close_or_first(b'}')? {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.open(b':')?;
            each(self, (!key.escaped).then(|| &self.b[key.start..key.end]))?;
            if !self.next_or_close(b'}')? {
                return Some(());
            }
        }
    }

    /// An array, each element read by `each`: how many it has.
    fn elements(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<usize> {
        self.open(b'[')?;
        if self.close_or_first(b']')? {
            return Some(0);
        }
        let mut n = 0;
        loop {
            each(self)?;
            n += 1;
            if !self.next_or_close(b']')? {
                return Some(n);
            }
        }
    }

    /// `null` (`None`) or a string.
    fn string_or_null(&mut self) -> Option<Option<Span>> {
        if self.null()? {
            return Some(None);
        }
        self.string().map(Some)
    }

    /// `null` (`None`) or a string with no escape: its bytes.
    fn plain_or_null(&mut self) -> Option<Option<&'a [u8]>> {
        match self.string_or_null()? {
            None => Some(None),
            Some(s) if s.escaped => None,
            Some(s) => Some(Some(&self.b[s.start..s.end])),
        }
    }

    /// `null` (true, read) or another value (false, not read).
    fn null(&mut self) -> Option<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(true);
        }
        Some(false)
    }

    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        let end = self.i + lit.len();
        (self.b.get(self.i..end)? == lit).then(|| self.i = end)
    }

    /// A string: where its contents are. Refused: a control character, an
    /// escape JSON does not have, and any `\u` escape of a surrogate (a
    /// lone one is an error to serde_json; pairs are left to it too).
    fn string(&mut self) -> Option<Span> {
        self.open(b'"')?;
        self.string_rest()
    }

    /// The rest of a string, from just after its opening quote.
    fn string_rest(&mut self) -> Option<Span> {
        let start = self.i;
        let mut escaped = false;
        loop {
            self.i = plain_run(self.b, self.i);
            match *self.b.get(self.i)? {
                b'"' => {
                    let end = self.i;
                    self.i += 1;
                    return Some(Span { start, end, escaped });
                }
                b'\\' => {
                    escaped = true;
                    match *self.b.get(self.i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) || matches!(hex[0], b'd' | b'D') {
                                return None;
                            }
                            self.i += 6;
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    /// A whole number that fits a `u64` (a choice's `index`).
    fn count(&mut self) -> Option<u64> {
        self.ws();
        let digits = self.b[self.i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 19 || (digits > 1 && self.b[self.i] == b'0') {
            return None;
        }
        if matches!(self.b.get(self.i + digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        // At most 19 digits: below 10^19, so within a `u64`.
        let n = self.b[self.i..self.i + digits].iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        self.i += digits;
        Some(n)
    }

    /// A JSON number, checked and skipped.
    fn number(&mut self) -> Option<()> {
        let b = self.b;
        let digits = |i: &mut usize| {
            let from = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > from
        };
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return None,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i).then_some(())?;
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            digits(&mut i).then_some(())?;
        }
        self.i = i;
        Some(())
    }

    /// Any JSON value, checked and skipped.
    fn skip(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.members(|c, _| c.skip(depth + 1)),
            b'[' => self.elements(|c| c.skip(depth + 1)).map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }
}

#[cfg(test)]
mod tests;
