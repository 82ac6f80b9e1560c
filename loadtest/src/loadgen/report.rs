//! Summaries and reports: per class percentiles, SLO attainment, goodput,
//! shed and error rates; Markdown for people, JSON for tools; side by side.

use std::collections::BTreeMap;
use std::fmt::Write;

use hdrhistogram::Histogram;

use super::run::{new_hist, RunResult};

pub use super::summary::ClassSummary;

fn q(h: &Histogram<u64>, quantile: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// Summaries keyed by class, plus `all`.
pub fn summarize(r: &RunResult) -> BTreeMap<String, ClassSummary> {
    let mut classes: Vec<String> = r.records.iter().map(|x| x.class.clone()).collect();
    classes.sort();
    classes.dedup();
    let warm = r.scenario.warmup.as_secs_f64();
    let secs = (r.elapsed_s - warm).max(1e-9);
    let mut out = BTreeMap::new();
    for class in classes.iter().map(String::as_str).chain(std::iter::once("all")) {
        let recs: Vec<_> = r.records.iter().filter(|x| x.start_s >= warm && (class == "all" || x.class == class)).collect();
        let (mut ttft, mut e2e) = (new_hist(), new_hist());
        let mut itl = new_hist();
        if class == "all" {
            for c in &classes {
                let _ = itl.add(r.itl_histogram(c));
            }
        } else {
            itl = r.itl_histogram(class);
        }
        let target = r.scenario.classes.get(class);
        let mut s = ClassSummary {
            requests: recs.len() as u64,
            ttft_target_ms: target.map(|t| t.ttft_ms),
            itl_target_ms: target.map(|t| t.itl_ms),
            ..Default::default()
        };
        let mut good = 0u64;
        let mut tokens = 0u64;
        for x in &recs {
            if let Some(t) = x.ttft_ms {
                let _ = ttft.record((t * 1000.0).max(1.0) as u64);
            }
            if x.completed() {
                s.completed += 1;
                let _ = e2e.record((x.e2e_ms * 1000.0).max(1.0) as u64);
            } else if x.outcome == "rejected" {
                s.rejected += 1;
            } else {
                s.errors += 1;
            }
            tokens += x.tokens as u64;
            if x.within_slo(r.scenario.classes.get(&x.class)) {
                good += 1;
            }
        }
        s.ttft_p50_ms = q(&ttft, 0.5);
        s.ttft_p90_ms = q(&ttft, 0.9);
        s.ttft_p99_ms = q(&ttft, 0.99);
        s.itl_p50_ms = q(&itl, 0.5);
        s.itl_p90_ms = q(&itl, 0.9);
        s.itl_p99_ms = q(&itl, 0.99);
        s.e2e_p50_ms = q(&e2e, 0.5);
        s.e2e_p99_ms = q(&e2e, 0.99);
        s.slo_attainment = if recs.is_empty() { 0.0 } else { good as f64 / recs.len() as f64 };
        s.goodput_rps = good as f64 / secs;
        s.throughput_rps = s.completed as f64 / secs;
        s.tokens_per_s = tokens as f64 / secs;
        out.insert(class.to_string(), s);
    }
    out
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into())
}

/// A Markdown report of one run.
pub fn markdown(r: &RunResult) -> String {
    let sums = summarize(r);
    let mut m = String::new();
    let _ = writeln!(m, "## {}\n", r.label);
    let _ = writeln!(
        m,
        "target `{}`, {:.1} s, {} requests ({} in the first {:?} of warm-up left out)\n",
        r.scenario.target,
        r.elapsed_s,
        r.records.len(),
        r.records.iter().filter(|x| x.start_s < r.scenario.warmup.as_secs_f64()).count(),
        r.scenario.warmup
    );
    let _ = writeln!(
        m,
        "| class | requests | done | 429 | errors | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | target TTFT / ITL ms | within SLO | goodput req/s | tokens/s |"
    );
    let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (c, s) in &sums {
        let _ = writeln!(
            m,
            "| {c} | {} | {} | {} | {} | {:.1} / {:.1} / {:.1} | {:.2} / {:.2} / {:.2} | {} / {} | {:.2}% | {:.2} | {:.0} |",
            s.requests,
            s.completed,
            s.rejected,
            s.errors,
            s.ttft_p50_ms,
            s.ttft_p90_ms,
            s.ttft_p99_ms,
            s.itl_p50_ms,
            s.itl_p90_ms,
            s.itl_p99_ms,
            opt(s.ttft_target_ms),
            opt(s.itl_target_ms),
            s.slo_attainment * 100.0,
            s.goodput_rps,
            s.tokens_per_s
        );
    }
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    for x in &r.records {
        *outcomes.entry(&x.outcome).or_default() += 1;
    }
    let _ = writeln!(m, "\noutcomes: {}", outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "));
    m
}

/// A result to compare: its label and summaries per class (a vllm bench
/// summary has only `all`, and no SLO figures).
pub struct Compared {
    pub label: String,
    pub classes: BTreeMap<String, ClassSummary>,
    /// Has SLO attainment and goodput (a loadgen run).
    pub slo: bool,
}

impl Compared {
    pub fn run(r: &RunResult) -> Compared {
        Compared { label: r.label.clone(), classes: summarize(r), slo: true }
    }

    pub fn vllm(label: String, v: &serde_json::Value) -> Compared {
        Compared { label, classes: [("all".to_string(), super::vllm::as_class_summary(v))].into(), slo: false }
    }
}

/// Two runs side by side, per class: A, B and B/A.
pub fn compare(a: &RunResult, b: &RunResult) -> String {
    compare_summaries(&Compared::run(a), &Compared::run(b))
}

/// Two results side by side, per class both have: A, B and B/A. Figures
/// one side lacks (SLO attainment of a vllm bench summary) are left out.
pub fn compare_summaries(a: &Compared, b: &Compared) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "## {} (A) vs {} (B)\n", a.label, b.label);
    let _ = writeln!(m, "| class | metric | A | B | B/A |");
    let _ = writeln!(m, "|---|---|---:|---:|---:|");
    let slo = a.slo && b.slo;
    for (c, x) in &a.classes {
        let Some(y) = b.classes.get(c) else { continue };
        let rows: [(&str, f64, f64, bool); 9] = [
            ("TTFT p50 ms", x.ttft_p50_ms, y.ttft_p50_ms, true),
            ("TTFT p99 ms", x.ttft_p99_ms, y.ttft_p99_ms, true),
            ("ITL p50 ms", x.itl_p50_ms, y.itl_p50_ms, true),
            ("ITL p99 ms", x.itl_p99_ms, y.itl_p99_ms, true),
            ("within SLO %", x.slo_attainment * 100.0, y.slo_attainment * 100.0, slo),
            ("goodput req/s", x.goodput_rps, y.goodput_rps, slo),
            ("completed req/s", x.throughput_rps, y.throughput_rps, true),
            ("429s", x.rejected as f64, y.rejected as f64, slo),
            ("errors", x.errors as f64, y.errors as f64, true),
        ];
        for (name, va, vb, _) in rows.into_iter().filter(|r| r.3) {
            let ratio = if va.abs() > 1e-12 { format!("{:.3}", vb / va) } else { "-".into() };
            let _ = writeln!(m, "| {c} | {name} | {va:.2} | {vb:.2} | {ratio} |");
        }
    }
    m
}
