//! Report of `loadtest/bench/litellm_migration.sh`: the same OpenAI SDK
//! code against LiteLLM and against slogate on the keys imported from it,
//! the models each listed and the answers each gave.
//!
//! ```text
//! bench report migration DIR CHECK_OK LITELLM_VERSION SDK_VERSION
//! ```

use std::path::Path;

use serde_json::Value;

use super::out::{py_repr, py_str, write, Measured};

/// `bench report migration DIR CHECK_OK LITELLM_VERSION SDK_VERSION`.
pub(super) fn migration(dir: &Path, check_ok: bool, litellm: &str, sdk: &str) -> Result<(), String> {
    let path = dir.join("answers.json");
    let got: serde_json::Map<String, Value> = super::out::read_json(&path)?;
    let names: Vec<&String> = got.keys().collect();
    let first = names.first().map(|n| &got[n.as_str()]).ok_or_else(|| format!("{}: no base URL", path.display()))?;
    let models = |e: &Value| e["models"].clone();
    let same_models = got.values().all(|e| models(e) == models(first)) && !first["models"].is_null();
    let mut labels: Vec<&String> = got.values().filter_map(|e| e["answers"].as_object()).flat_map(|a| a.keys()).collect();
    labels.sort();
    labels.dedup();
    let same_answers =
        labels.iter().all(|l| got.values().all(|e| e["answers"].get(l.as_str()) == first["answers"].get(l.as_str()))) && labels.len() == 8;
    let failures = |e: &Value| e["failed"].as_array().map(|f| f.iter().map(py_str).collect::<Vec<_>>()).unwrap_or_default();
    let all_failed: Vec<String> = got.values().flat_map(failures).collect();
    let mut m = Measured::default();
    m.plain_flag("check_ok", check_ok);
    let listed = names.iter().map(|n| format!("{n}: {}", py_list(&got[n.as_str()]["models"]))).collect::<Vec<_>>().join("; ");
    m.flag("same_models", same_models, listed);
    m.flag("same_answers", same_answers, format!("{} answers compared across {} base URLs", labels.len(), names.len()));
    let failed = all_failed.len();
    let said = if failed > 0 { format!(": {}", all_failed.join("; ")) } else { String::new() };
    m.stated("failed", failed as f64, format!("{failed} failed{said}"));
    m.write(dir)?;
    let mut out = vec![
        format!("LiteLLM {litellm}, OpenAI SDK {sdk}."),
        String::new(),
        "| base URL | models | answers | failed | unknown model |".into(),
        "|---|---|---:|---:|---|".into(),
    ];
    for (name, e) in &got {
        let listed = e["models"].as_array().map(|a| a.iter().map(py_str).collect::<Vec<_>>().join(", ")).unwrap_or_default();
        let answers = e["answers"].as_object().map_or(0, serde_json::Map::len);
        out.push(format!("| {name} | {listed} | {answers} | {} | {} |", failures(e).len(), py_str(&e["unknown_model"])));
    }
    out.extend(
        ["", "Each answer (the first base URL's; the others' are compared with it):", "", "| request | text | finish |", "|---|---|---|"]
            .map(String::from),
    );
    for l in &labels {
        let a = &first["answers"][l.as_str()];
        out.push(format!("| {l} | {} | {} |", py_repr(&a["text"]), py_str(&a["finish"])));
    }
    if let Ok(imported) = std::fs::read_to_string(dir.join("import-report.md")) {
        out.extend(["", "What the importer reported (its report.md):", ""].map(String::from));
        out.extend(imported.lines().map(|l| if l.is_empty() { ">".to_string() } else { format!("> {l}") }));
    }
    write(&dir.join("report.md"), &(out.join("\n") + "\n"))
}

/// A list of names as Python prints one (`['a', 'b']`), or `None`.
fn py_list(v: &Value) -> String {
    match v.as_array() {
        Some(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        None => py_str(v),
    }
}
