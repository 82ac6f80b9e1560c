//! The tenant reports counted in tokens: weights (service shared 3 to 1)
//! and a key's tokens-per-minute limit driven by the OpenAI SDK.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::out::{chart, n, write, Measured};
use super::records::{done, load, measured, window};
use super::tenants::tenant_row;

/// Two tenants of weights 3 and 1, both saturating: the tokens each was
/// served by the requests that completed in the measured window.
pub(super) fn weights(dir: &Path, c: f64) -> Result<(), String> {
    let r = load(&dir.join("weights.json"))?;
    let (w, end) = window(&r);
    // (completed at, tenant, prompt and output tokens)
    let mut served: Vec<(f64, &str, u64)> = r
        .records
        .iter()
        .filter(|x| done(x) && (x.stream == "heavy" || x.stream == "light"))
        .map(|x| (x.start_s + x.e2e_ms / 1000.0, x.stream.as_str(), u64::from(x.prompt_tokens) + u64::from(x.tokens)))
        .filter(|(at, _, _)| (w..end).contains(at))
        .collect();
    served.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
    let tokens = |who: &str| served.iter().filter(|s| s.1 == who).map(|s| s.2).sum::<u64>();
    let (heavy, light) = (tokens("heavy"), tokens("light"));
    let ratio = if light > 0 { heavy as f64 / light as f64 } else { f64::INFINITY };
    let mut m = Measured::default();
    m.stated("heavy_over_light", ratio, format!("{} : 1", n(ratio, 2)));
    m.write(dir)?;
    let mut csv = String::from("time (s),heavy (weight 3): tokens served,light (weight 1): tokens served,light x 3\n");
    let (mut h, mut l) = (0u64, 0u64);
    for (t, who, k) in &served {
        *(if *who == "heavy" { &mut h } else { &mut l }) += k;
        let _ = writeln!(csv, "{},{h},{l},{}", n(*t, 2), 3 * l);
    }
    let path = dir.join("served.csv");
    write(&path, &csv)?;
    chart(&path, dir, "served", "Tokens served, weights 3 and 1, both saturating", "tokens", &[])?;
    let recs = measured(&r);
    let mut f = format!(
        "**Fleet:** {}\n\n**Capacity C = {} req/s.** Service counted for the requests that completed between {} s and {} s.\n\n",
        super::tenants::FLEET,
        n(c, 2),
        n(w, 0),
        n(end, 0)
    );
    f += "| tenant | weight | tokens served | requests | completed | 429 | TTFT p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for (who, weight, served) in [("heavy", 3, heavy), ("light", 1, light)] {
        let x = tenant_row(&recs, who, end - w);
        let _ = writeln!(
            f,
            "| {who} | {weight} | {served} | {} | {} | {} | {} / {} |",
            x.row.requests,
            x.row.done,
            x.row.rejected,
            n(x.row.p50, 0),
            n(x.row.p99, 0)
        );
    }
    f += "\nChart: `served.svg`.\n";
    write(&dir.join("report.md"), &f)
}

fn field<'a>(v: &'a Value, k: &str) -> Result<&'a Value, String> {
    v.get(k).ok_or_else(|| format!("tpm.json: no {k:?}"))
}

fn float(v: &Value, k: &str) -> Result<f64, String> {
    field(v, k)?.as_f64().ok_or_else(|| format!("tpm.json: {k:?} is not a number"))
}

fn list<'a>(v: &'a Value, k: &str) -> Result<&'a Vec<Value>, String> {
    field(v, k)?.as_array().ok_or_else(|| format!("tpm.json: {k:?} is not a list"))
}

/// A key's tokens per minute as the OpenAI SDK's clients drove it
/// (`tpm.json`, written by `tpm_sdk.py`), against its `limit`.
pub(super) fn tpm(dir: &Path, limit: f64) -> Result<(), String> {
    let path = dir.join("tpm.json");
    let r: Value = super::out::read_json(&path)?;
    let elapsed = float(&r, "elapsed_s")?;
    let used = float(&r, "gateway_tokens")?;
    let per_min = used / (elapsed / 60.0);
    let answers: Vec<(f64, u64)> =
        list(&r, "answers")?.iter().map(|a| Ok((float(a, "t")?, float(a, "tokens")? as u64))).collect::<Result<_, String>>()?;
    let refusals = list(&r, "refusals")?;
    let all_headers = refusals.iter().all(|x| x.get("headers").and_then(Value::as_bool).unwrap_or(false));
    let per_minute: Vec<u64> = (0..float(&r, "minutes")? as u64)
        .map(|m| answers.iter().filter(|(t, _)| (m as f64 * 60.0..(m + 1) as f64 * 60.0).contains(t)).map(|a| a.1).sum())
        .collect();
    let other = field(&r, "other")?;
    let errors = list(&r, "errors")?;
    let mut m = Measured::default();
    m.stated(
        "tokens_per_min_over_limit",
        per_min / limit,
        format!("{} tokens/min for a limit of {} ({} %)", n(per_min, 0), n(limit, 0), n(100.0 * per_min / limit, 1)),
    );
    let every = if all_headers { "all" } else { "not all" };
    m.flag(
        "refusals_with_headers",
        all_headers && !refusals.is_empty(),
        format!("{} RateLimitError, {every} with the headers", refusals.len()),
    );
    let shown = per_minute.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    m.flag("answers_every_minute", per_minute.iter().all(|&t| t > 0), format!("{shown} tokens answered per minute"));
    let (ok, refused, error) = (float(other, "ok")?, float(other, "refused")?, float(other, "error")?);
    m.flag(
        "nothing_else_refused",
        errors.is_empty() && refused == 0.0 && error == 0.0,
        format!("{} other errors for the limited key; key without limits: {} answered, {} refused", errors.len(), n(ok, 0), n(refused, 0)),
    );
    m.write(dir)?;
    let mut sorted = answers.clone();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut csv = String::from("time (s),tokens answered over the last 60 s,limit\n");
    for (t, _) in &sorted {
        let last: u64 = sorted.iter().filter(|(u, _)| t - 60.0 < *u && u <= t).map(|a| a.1).sum();
        let _ = writeln!(csv, "{},{last},{}", n(*t, 1), n(limit, 0));
    }
    let csv_path = dir.join("tokens.csv");
    write(&csv_path, &csv)?;
    chart(&csv_path, dir, "tokens", "A key's tokens over any 60 s, driven by the OpenAI SDK", "tokens", &[])?;
    let report = format!("{} requests answered, {} tokens in {} s.\n\nChart: `tokens.svg`.\n", answers.len(), n(used, 0), n(elapsed, 0));
    write(&dir.join("report.md"), &report)
}
