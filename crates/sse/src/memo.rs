//! Reading a stream's chunks by what they share. A replica writes every
//! chunk of one stream alike: the same id, model and members in the same
//! order, only the text and a few numbers (`created`, a simulator's
//! stamps) changing. [`Memo`] keeps the last chunk that had text, with
//! those places left open; a chunk that matches it byte for byte outside
//! them means what that chunk meant, and is read by comparing bytes and
//! checking the open places: about a quarter of the quick reading's
//! instructions (740 against 3,040 on the simulator's chunks).
//!
//! It answers exactly as [`crate::analyze`] and [`crate::analyze_text`]
//! do. The quick reading reads left to right and decides each thing from
//! the bytes before it, so on the same bytes it takes the same steps; an
//! open place is checked as it checks that value (a string as a string,
//! skipped numbers as numbers), and nothing it reads depends on them
//! except whether the text is empty, which must not be (the chunk then
//! goes the usual way). Tests hold the memo to the two readings on
//! streams, on damaged chunks and on generated ones.

use crate::scan::{self, Quick, Span};
use crate::text::{quick_text, Str};
use crate::{EventInfo, NonEmpty, Piece};

/// One stream's memory of its last chunk with text. See the module docs.
#[derive(Debug, Default)]
pub struct Memo {
    /// The chunk (trimmed); empty until one with text was read.
    chunk: Vec<u8>,
    /// Its open places, in order.
    holes: Vec<Hole>,
    /// What it meant, and whether it held what a continuation cannot carry on from.
    info: EventInfo,
    other: bool,
    #[cfg(test)]
    hits: usize,
}

/// An open place in the kept chunk, `(start, end)`.
#[derive(Debug, Clone, Copy)]
enum Hole {
    /// The first choice's text: a string's contents, not empty.
    Text(usize, usize),
    /// A number among the chunk's own members (skipped by the reading).
    Number(usize, usize),
}

impl Hole {
    fn range(self) -> (usize, usize) {
        match self {
            Hole::Text(s, e) | Hole::Number(s, e) => (s, e),
        }
    }
}

impl Memo {
    pub fn new() -> Self {
        Self::default()
    }

    /// [`crate::analyze`], by the stream's last chunk with text where it can.
    pub fn analyze(&mut self, data: &[u8]) -> EventInfo {
        let trimmed = data.trim_ascii();
        if self.fits(trimmed).is_some() {
            return self.info.clone();
        }
        match scan::quick(trimmed) {
            Some(q) => {
                self.keep(trimmed, &q);
                q.info
            }
            None => crate::read::<NonEmpty>(data).0,
        }
    }

    /// [`crate::analyze_text`], by the stream's last chunk with text where it can.
    pub fn analyze_text(&mut self, data: &[u8], out: &mut String) -> (EventInfo, Piece) {
        let trimmed = data.trim_ascii();
        if let Some(span) = self.fits(trimmed) {
            if self.other {
                return (self.info.clone(), Piece::Other);
            }
            let text = &trimmed[span.start..span.end];
            if !span.escaped {
                // Checked as UTF-8 by `fits`.
                out.push_str(std::str::from_utf8(text).unwrap_or_default());
                return (self.info.clone(), Piece::Text);
            }
            // Escapes: the string read whole, quotes and all, as the full reading reads it.
            if let Ok(Str(t)) = crate::from_json::<Str<'_>>(&trimmed[span.start - 1..span.end + 1]) {
                out.push_str(&t);
                return (self.info.clone(), Piece::Text);
            }
        }
        match scan::quick(trimmed) {
            Some(q) => {
                self.keep(trimmed, &q);
                match quick_text(q, trimmed, out) {
                    Some(read) => read,
                    None => crate::text::full_text(data, out),
                }
            }
            None => crate::text::full_text(data, out),
        }
    }

    /// Keep a chunk read the quick way if it has text.
    fn keep(&mut self, trimmed: &[u8], q: &Quick) {
        let Some(text) = q.text.filter(Span::filled) else { return };
        self.chunk.clear();
        self.chunk.extend_from_slice(trimmed);
        self.holes.clear();
        self.holes.extend(q.numbers.iter().map(|(s, e)| Hole::Number(s, e)));
        self.holes.push(Hole::Text(text.start, text.end));
        self.holes.sort_unstable_by_key(|h| h.range().0);
        self.info = q.info.clone();
        self.other = q.other;
    }

    /// Whether `t` is the kept chunk with other text and numbers in its
    /// open places: where its text is.
    fn fits(&mut self, t: &[u8]) -> Option<Span> {
        if self.chunk.is_empty() {
            return None;
        }
        let (mut i, mut j, mut text) = (0, 0, None);
        for &hole in &self.holes {
            let (start, end) = hole.range();
            let same = &self.chunk[j..start];
            if t.get(i..i + same.len())? != same {
                return None;
            }
            i += same.len();
            match hole {
                Hole::Number(..) => i = scan::number_from(t, i)?,
                Hole::Text(..) => {
                    let span = scan::string_from(t, i).filter(Span::filled)?;
                    std::str::from_utf8(&t[span.start..span.end]).ok()?;
                    i = span.end;
                    text = Some(span);
                }
            }
            j = end;
        }
        if t.get(i..)? != &self.chunk[j..] {
            return None;
        }
        #[cfg(test)]
        {
            self.hits += 1;
        }
        text
    }
}

#[cfg(test)]
mod tests;
