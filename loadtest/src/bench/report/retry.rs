//! Report of `loadtest/bench/retry.sh`: Retry-After as retrying clients
//! see it, a constant one (slogate at an older commit) beside the measured
//! one (this commit), and a chart of the retries arriving.
//!
//! ```text
//! bench report retry DIR OLD_REV
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::out::{chart, n, percent, py_str, read_json, write, Measured};
use super::records::pct;

/// The width in which a wave of retries is counted, in seconds.
const BIN: f64 = 0.1;

/// One variant's run, as the retrying clients saw it.
struct Summary {
    requests: usize,
    served: usize,
    errors: usize,
    first_refused: usize,
    retries: usize,
    retries_served: usize,
    peak: usize,
    mean: f64,
    told: [f64; 2],
    told_distinct: usize,
    codes: BTreeMap<String, usize>,
    waited_429: [f64; 2],
    /// Retries sent in each 100 ms.
    bins: BTreeMap<u64, usize>,
    /// The last attempt's send time, in seconds.
    last: f64,
}

impl Summary {
    fn share(&self) -> f64 {
        if self.retries > 0 {
            self.retries_served as f64 / self.retries as f64
        } else {
            f64::NAN
        }
    }
}

fn summary(r: &Value) -> Summary {
    let list = |k: &str| r[k].as_array().map(Vec::as_slice).unwrap_or_default().to_vec();
    let att: Vec<Value> = list("attempts").into_iter().filter(|a| a["sent"].is_number()).collect();
    let num = |a: &Value, k: &str| a[k].as_f64().unwrap_or(f64::NAN);
    let tries = |a: &Value| a["try"].as_u64().unwrap_or(0);
    let status = |a: &Value| a["status"].as_u64();
    let retries: Vec<&Value> = att.iter().filter(|a| tries(a) > 0).collect();
    let reqs = list("requests");
    let outcome = |x: &Value| x["outcome"].as_str().unwrap_or("").to_string();
    let mut bins = BTreeMap::new();
    for a in &retries {
        *bins.entry((num(a, "sent") / BIN) as u64).or_insert(0) += 1;
    }
    let sent: Vec<f64> = att.iter().map(|a| num(a, "sent")).collect();
    let (first, last) = (sent.iter().copied().fold(f64::INFINITY, f64::min), sent.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    let span = if sent.is_empty() { 0.0 } else { last - first };
    let refused: Vec<&Value> = att.iter().filter(|a| status(a) == Some(429)).collect();
    let told: Vec<f64> = refused.iter().filter_map(|a| a["told"].as_f64()).collect();
    let mut distinct: Vec<String> = told.iter().map(|t| format!("{t:.3}")).collect();
    distinct.sort();
    distinct.dedup();
    let mut codes = BTreeMap::new();
    for a in &refused {
        *codes.entry(py_str(&a["code"])).or_insert(0) += 1;
    }
    let waited: Vec<f64> = refused.iter().filter_map(|a| a["took"].as_f64()).collect();
    Summary {
        requests: reqs.len(),
        served: reqs.iter().filter(|x| outcome(x) == "served").count(),
        errors: reqs.iter().filter(|x| !matches!(outcome(x).as_str(), "served" | "refused")).count(),
        first_refused: att.iter().filter(|a| tries(a) == 0 && status(a) == Some(429)).count(),
        retries: retries.len(),
        retries_served: retries.iter().filter(|a| status(a) == Some(200)).count(),
        peak: bins.values().copied().max().unwrap_or(0),
        mean: retries.len() as f64 / (span / BIN).max(1.0),
        told: [pct(&told, 0.5), pct(&told, 0.99)],
        told_distinct: distinct.len(),
        codes,
        waited_429: [pct(&waited, 0.5), pct(&waited, 0.99)],
        bins,
        last: if sent.is_empty() { 0.0 } else { last },
    }
}

/// `bench report retry DIR OLD_REV`.
pub(super) fn retry(dir: &Path, old_rev: &str) -> Result<(), String> {
    let labels = [("constant", format!("constant (slogate at {old_rev})")), ("measured", "measured (this commit)".to_string())];
    let mut s = Vec::new();
    for (lab, _) in &labels {
        s.push(summary(&read_json(&dir.join(format!("{lab}.json")))?));
    }
    let (c, m) = (&s[0], &s[1]);
    let mut out = Measured::default();
    let gain = 100.0 * (m.share() - c.share());
    let said = format!("{} % of {} retries vs {} % of {}", percent(m.share(), 1), m.retries, percent(c.share(), 1), c.retries);
    out.stated("retries_served_gain_pct", gain, said);
    let times = |x: &Summary| n(x.peak as f64 / x.mean.max(1e-9), 1);
    let said = format!("peak {} ({}x the mean) vs {} ({}x)", m.peak, times(m), c.peak, times(c));
    out.stated("peak_retries_less", c.peak as f64 - m.peak as f64, said);
    let said = format!("{} of {} vs {} of {}", m.served, m.requests, c.served, c.requests);
    out.stated("served_vs_constant", m.served as f64 / c.served.max(1) as f64, said);
    out.write(dir)?;
    // Retries sent per 100 ms, both variants.
    let csv = dir.join("retries.csv");
    let end = s.iter().map(|x| x.last).fold(0.0, f64::max) as u64 + 1;
    let mut f =
        format!("time (s),{}\n", labels.iter().map(|(_, name)| format!("{name}: retries sent per 100 ms")).collect::<Vec<_>>().join(","));
    for t in 0..end * 10 {
        let counts: Vec<String> = s.iter().map(|x| x.bins.get(&t).copied().unwrap_or(0).to_string()).collect();
        let _ = writeln!(f, "{},{}", n(t as f64 / 10.0, 1), counts.join(","));
    }
    write(&csv, &f)?;
    let title = "Retries arriving per 100 ms: a constant Retry-After brings a refused crowd back in waves";
    chart(&csv, dir, "retries", title, "retries", &[])?;
    let mut f = String::from(
        "| | requests | served in the end | errors | first tries refused | retries | retries served | \
         Retry-After told p50 / p99 s (distinct values) | refusals by code | wait for a 429 p50 / p99 s | busiest 100 ms (mean) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
    );
    for ((_, name), x) in labels.iter().zip(&s) {
        let codes = x.codes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            f,
            "| {name} | {} | {} | {} | {} | {} | {} ({} %) | {} / {} ({}) | {codes} | {} / {} | {} ({}) |",
            x.requests,
            x.served,
            x.errors,
            x.first_refused,
            x.retries,
            x.retries_served,
            percent(x.share(), 1),
            n(x.told[0], 2),
            n(x.told[1], 2),
            x.told_distinct,
            n(x.waited_429[0], 2),
            n(x.waited_429[1], 2),
            x.peak,
            n(x.mean, 1)
        );
    }
    f.push_str("\nChart: `retries.svg`.\n");
    write(&dir.join("report.md"), &f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn retries_are_counted_in_waves_of_100_ms() {
        let run = serde_json::json!({
            "attempts": [
                { "sent": 0.01, "try": 0, "status": 429, "told": 1.0, "code": "queue_full", "took": 0.002 },
                { "sent": 1.02, "try": 1, "status": 200, "told": null, "code": null },
                { "sent": 1.05, "try": 1, "status": 429, "told": 1.5, "code": null, "took": 0.01 },
                { "sent": 2.55, "try": 2, "status": 200, "told": null, "code": null },
                { "sent": null, "try": 3, "status": null }
            ],
            "requests": [{ "outcome": "served" }, { "outcome": "refused" }, { "outcome": "timeout" }]
        });
        let s = super::summary(&run);
        assert_eq!((s.requests, s.served, s.errors), (3, 1, 1));
        assert_eq!((s.first_refused, s.retries, s.retries_served), (1, 3, 2));
        assert_eq!(s.peak, 2, "two retries in the 100 ms from 1.0 s");
        assert_eq!(s.told_distinct, 2);
        assert_eq!(s.codes.get("None"), Some(&1));
        assert_eq!(s.codes.get("queue_full"), Some(&1));
        assert!((s.share() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.last, 2.55);
    }
}
