//! The quick reading of a complete answer and of its usage: one pass over
//! the bytes for the shape vLLM, SGLang and OpenAI's APIs write, as
//! [`crate::answer`] reads it with serde, or `None`, and the caller reads
//! it the full way: a key written with an escape, a member given twice (or
//! a field under both its names), a value of another type than the one
//! read, a count that is not a plain whole number, an answer without usage
//! (its text is counted then), or JSON that is not valid.
//!
//! Every non-streaming answer is read: through serde, its usage alone took
//! about 1,000 instructions and a completion's whole answer about 1,500.

use super::{once, Cursor};
use crate::{Answer, Usage};

/// A usage object (`{"prompt_tokens":12,"total_tokens":12,...}`).
pub(crate) fn quick_usage(data: &[u8]) -> Option<Usage> {
    std::str::from_utf8(data).ok()?;
    let mut c = Cursor { b: data, i: 0 };
    let usage = c.usage()?;
    c.ws();
    (c.i == data.len()).then_some(usage)
}

/// A complete answer that reports its usage.
pub(crate) fn quick_answer(data: &[u8]) -> Option<Answer> {
    std::str::from_utf8(data).ok()?;
    let mut c = Cursor { b: data, i: 0 };
    let mut answer = Answer::default();
    let (mut seen_usage, mut seen_choices, mut seen_status) = (false, false, false);
    c.members(|c, key| {
        match key? {
            // `null`: no usage, and the text is counted the full way.
            b"usage" => {
                once(&mut seen_usage)?;
                answer.usage = Some(c.usage()?);
            }
            b"choices" => {
                once(&mut seen_choices)?;
                c.elements(|c| choice(c, &mut answer))?;
            }
            b"status" => {
                once(&mut seen_status)?;
                answer.status = c.plain_or_null()?.map(|s| String::from_utf8_lossy(s).into_owned());
            }
            _ => c.skip(0)?,
        }
        Some(())
    })?;
    c.ws();
    (c.i == data.len() && answer.usage.is_some()).then_some(answer)
}

/// One of an answer's `choices`: its finish reason; its `message` (an
/// object or `null`) and `text` checked and skipped.
fn choice(c: &mut Cursor<'_>, answer: &mut Answer) -> Option<()> {
    let (mut seen_finish, mut seen_message, mut seen_text) = (false, false, false);
    let mut finish = None;
    c.members(|c, key| {
        match key? {
            b"finish_reason" => {
                once(&mut seen_finish)?;
                finish = c.plain_or_null()?;
            }
            b"message" => {
                once(&mut seen_message)?;
                if !c.null()? {
                    let mut seen_content = false;
                    c.members(|c, key| {
                        if key? == b"content" {
                            once(&mut seen_content)?;
                        }
                        c.skip(2)
                    })?;
                }
            }
            b"text" => {
                once(&mut seen_text)?;
                c.skip(1)?;
            }
            _ => c.skip(1)?,
        }
        Some(())
    })?;
    if let Some(finish) = finish {
        answer.length |= finish == b"length";
        if answer.finish_reason.is_none() {
            answer.finish_reason = Some(String::from_utf8_lossy(finish).into_owned());
        }
    }
    Some(())
}

impl Cursor<'_> {
    /// A usage object, as [`Usage`]'s derived reading reads it.
    pub(super) fn usage(&mut self) -> Option<Usage> {
        let mut usage = Usage::default();
        let (mut seen_prompt, mut seen_completion, mut seen_details) = (false, false, false);
        self.members(|c, key| {
            match key? {
                b"prompt_tokens" | b"input_tokens" => {
                    once(&mut seen_prompt)?;
                    usage.prompt_tokens = c.count()?;
                }
                b"completion_tokens" | b"output_tokens" => {
                    once(&mut seen_completion)?;
                    usage.completion_tokens = c.count()?;
                }
                b"prompt_tokens_details" | b"input_tokens_details" => {
                    once(&mut seen_details)?;
                    if !c.null()? {
                        // `cached_tokens` given twice: the last counts, as in the full reading.
                        c.members(|c, key| match key? {
                            b"cached_tokens" => c.count().map(|n| usage.cached_tokens = n),
                            _ => c.skip(2),
                        })?;
                    }
                }
                _ => c.skip(1)?,
            }
            Some(())
        })?;
        Some(usage)
    }
}

#[cfg(test)]
mod tests;
