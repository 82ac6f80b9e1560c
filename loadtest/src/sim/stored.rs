//! A replica's stored responses (the Responses API's `store`), in its memory.

use std::collections::HashMap;
use std::sync::Mutex;

/// One stored response: its conversation's tokens so far (for the next
/// turn's prompt), its text and status.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) conversation_tokens: u32,
    pub(super) input_tokens: u32,
    pub(super) output_tokens: u32,
    pub(super) text: String,
    pub(super) status: &'static str,
    pub(super) created: u64,
    pub(super) model: String,
}

/// This replica's stored responses.
#[derive(Debug, Default)]
pub(crate) struct Store(pub(super) Mutex<HashMap<String, Stored>>);

impl Store {
    pub(super) fn get(&self, id: &str) -> Option<Stored> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub(super) fn update(&self, id: &str, f: impl FnOnce(&mut Stored)) {
        if let Some(s) = self.0.lock().unwrap_or_else(|p| p.into_inner()).get_mut(id) {
            f(s);
        }
    }
}
