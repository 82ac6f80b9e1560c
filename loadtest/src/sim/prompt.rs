//! The prompt as the simulator reads it: its text for the prefix cache,
//! its blocks' hashes, its tokens counted at four characters each, and the
//! words the simulated model answers with.

use serde_json::Value;

/// The prompt as the engine reads it, for its prefix cache: each message's
/// role and text in order (a separator after each), or the prompt's text.
fn rendered(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(a) => a.iter().for_each(|x| rendered(x, out)),
        Value::Object(o) => {
            if let Some(Value::String(role)) = o.get("role") {
                out.extend_from_slice(role.as_bytes());
                out.push(b'\n');
            }
            if let Some(c) = o.get("content").or_else(|| o.get("text")) {
                rendered(c, out);
            }
            out.push(0);
        }
        _ => {}
    }
}

/// The chained hashes of the prompt's full blocks of `block_size` tokens
/// (the simulator's tokens are four characters).
pub(super) fn prompt_blocks(v: &Value, prompt_tokens: u32, block_size: u32) -> Vec<u64> {
    let mut text = Vec::new();
    rendered(v, &mut text);
    crate::sim::cache::block_hashes(&text, block_size as usize * 4, (prompt_tokens / block_size.max(1)) as usize)
}

/// Prompt tokens as the simulator counts them: one token per 4 characters of text.
pub fn estimate_tokens(v: &Value) -> u32 {
    fn chars(v: &Value) -> usize {
        match v {
            Value::String(s) => s.chars().count(),
            Value::Array(a) => a.iter().map(chars).sum(),
            Value::Object(o) => o.get("content").or_else(|| o.get("text")).map(chars).unwrap_or(0),
            _ => 0,
        }
    }
    (chars(v) as u32).div_ceil(4).max(1)
}

pub(crate) const WORDS: &[&str] = &[
    " the",
    " model",
    " streams",
    " tokens",
    " while",
    " the",
    " gateway",
    " measures",
    " every",
    " gap",
    " and",
    " keeps",
    " its",
    " promise",
    ",",
    " then",
];
