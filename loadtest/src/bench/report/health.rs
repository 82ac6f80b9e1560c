//! Report of `loadtest/bench/health.sh`: per gateway, what the streams
//! got and what slogate thought of a replica whose `/health` turned slow.
//!
//! ```text
//! bench report health DIR
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::out::{write, Measured};
use super::records::load;

/// `bench report health DIR`.
pub(super) fn health(dir: &Path) -> Result<(), String> {
    let mut rows = String::new();
    let mut m = Measured::default();
    let (mut all_ok, mut kept) = (Vec::new(), Vec::new());
    for (name, label) in [("defaults", "defaults (panic_threshold 0.5)"), ("panic_off", "`panic_threshold: 0`")] {
        let recs = load(&dir.join(format!("{name}.json")))?.records;
        let mut out: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &recs {
            *out.entry(r.outcome.as_str()).or_insert(0) += 1;
        }
        let s503 = recs.iter().filter(|r| r.status == 503).count();
        let ok = out.get("ok").unwrap_or(&0) + out.get("length").unwrap_or(&0);
        let other: Vec<String> = out.iter().filter(|(k, _)| !matches!(**k, "ok" | "length")).map(|(k, v)| format!("{k} {v}")).collect();
        let other = if other.is_empty() { "none".to_string() } else { other.join(", ") };
        let slo: Value = super::out::read_json(&dir.join(format!("{name}.slo.json")))?;
        let pool = &slo["pools"][0];
        let replica = &pool["replicas"][0];
        let healthy = replica["healthy"].as_bool().unwrap_or(false);
        let reason = replica["reason"].as_str().filter(|r| !r.is_empty());
        let verdict = format!("{}{}", if healthy { "passing" } else { "failing" }, reason.map_or(String::new(), |r| format!(": {r}")));
        let takeouts = std::fs::read_to_string(dir.join(format!("{name}.takeouts"))).unwrap_or_default().trim().to_string();
        let takeouts = if takeouts.is_empty() { "0".to_string() } else { takeouts };
        let panic = pool["panic"].as_bool().unwrap_or(false);
        let _ = writeln!(
            rows,
            "| {label} | {} | {ok} | **{s503}** | {other} | {verdict} | {} | {takeouts} |",
            recs.len(),
            if panic { "yes" } else { "no" }
        );
        m.plain(&format!("{name}_503"), s503 as f64);
        all_ok.push((!recs.is_empty() && ok == recs.len(), format!("{name} {ok} of {}", recs.len())));
        kept.push((healthy && takeouts == "0", format!("{name}: {verdict}, {takeouts} take-outs")));
    }
    let said = |v: &[(bool, String)], sep: &str| v.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(sep);
    m.flag("all_ok", all_ok.iter().all(|a| a.0), said(&all_ok, ", "));
    m.flag("kept_in", kept.iter().all(|a| a.0), said(&kept, "; "));
    m.write(dir)?;
    let f = format!(
        "| gateway | requests | ok | 503 | other outcomes | replica's verdict 10 s after `/health` turned slow | pool in panic | take-outs logged |\n|---|---:|---:|---:|---|---|---|---:|\n{rows}"
    );
    write(&dir.join("report.md"), &f)
}
