//! A request's prompt as a run draws it, and its tokens as estimated.

/// One request's prompt: its text when a dataset gave one, else only a
/// length (the text is then made up to that length).
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: Option<std::sync::Arc<str>>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Tokens in `text`, at four characters a token (at least one).
pub fn estimate_tokens(text: &str) -> u32 {
    (text.chars().count() as u32).div_ceil(4).max(1)
}
