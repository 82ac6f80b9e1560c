//! What the importer says it could not carry (the report), and what every
//! imported key is given (all of slogate's classes).

use serde_json::{json, Value};

/// A field not carried over, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// Where it was: `model_list[2].litellm_params.rpm`, `keys[k-small].aliases`.
    pub field: String,
    pub reason: String,
}

/// The report, in the order things were read.
#[derive(Debug, Default)]
pub struct Report {
    pub skipped: Vec<Skipped>,
    /// What was carried only approximately, or needs the operator (an
    /// environment variable to set), with why.
    pub notes: Vec<Skipped>,
}

impl Report {
    pub(super) fn skip(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.skipped.push(Skipped { field: field.into(), reason: reason.into() });
    }

    pub(super) fn note(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.notes.push(Skipped { field: field.into(), reason: reason.into() });
    }

    pub(super) fn markdown(&self, keys: usize, left_out: usize) -> String {
        let mut s = String::from("# What `slogate import litellm` could not carry\n\n");
        s.push_str(&format!("Keys imported: {keys}; keys left out: {left_out} (listed below).\n\n"));
        let table = |s: &mut String, title: &str, rows: &[Skipped]| {
            s.push_str(&format!("## {title}\n\n"));
            if rows.is_empty() {
                s.push_str("None.\n\n");
                return;
            }
            s.push_str("| field | why |\n|---|---|\n");
            for r in rows {
                s.push_str(&format!("| `{}` | {} |\n", r.field, r.reason.replace('|', "\\|")));
            }
            s.push('\n');
        };
        table(&mut s, "Not carried", &self.skipped);
        table(&mut s, "Carried approximately, or needing you", &self.notes);
        s
    }
}

/// The classes every imported key may use: all of slogate's default ones
/// (LiteLLM has none), chat first (what a request naming none gets).
pub(super) fn all_classes() -> Value {
    json!(crate::config::default_classes().keys().collect::<Vec<_>>())
}
