//! Reports of `loadtest/bench/tenants.sh` (fair sharing, weights, a
//! batch flood beside chat, per-key token limits), one run each (those
//! counted in tokens are in `tenants_tokens.rs`):
//!
//! ```text
//! bench report tenants fair DIR C
//! bench report tenants flood DIR C
//! bench report tenants weights DIR C
//! bench report tenants tpm DIR LIMIT
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::out::{chart, n, percent, write, Measured};
use super::records::{load, measured, misses, pct, row_where, window, ClassRow};
use crate::loadgen::{Record, RunResult};

pub(super) const FLEET: &str = "two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each), \
`--max-num-batched-tokens 512`, `--scheduling-policy priority`, chunks stamped with when they left the replica \
(`--stamp-events`); 512-token prompts, 64-256 output tokens (uniform). slogate: learned limits (`auto`), \
`upstream_priority: true`, class `chat` (interactive, TTFT 300 ms, ITL 50 ms), everything else slogate's defaults.";

/// A refusal: a 429, whatever its outcome was named.
fn refused(x: &Record) -> bool {
    x.outcome == "rejected" || x.status == 429
}

/// One tenant's (loadgen stream's) requests in the measured window, and
/// its refusals by error code.
#[derive(Clone)]
pub(super) struct TenantRow {
    pub row: ClassRow,
    pub codes: BTreeMap<String, usize>,
}

pub(super) fn tenant_row(recs: &[&Record], name: &str, span: f64) -> TenantRow {
    let mut codes = BTreeMap::new();
    for x in recs.iter().filter(|x| x.stream == name && refused(x)) {
        *codes.entry(x.error_code.clone().unwrap_or_else(|| "?".into())).or_insert(0) += 1;
    }
    TenantRow { row: row_where(recs, |x| x.stream == name, refused, span), codes }
}

impl TenantRow {
    fn code(&self, c: &str) -> usize {
        self.codes.get(c).copied().unwrap_or(0)
    }

    /// Its refusals as the tables show them: `code count, ...`, or 0.
    fn by_code(&self) -> String {
        let s = self.codes.iter().map(|(c, k)| format!("{c} {k}")).collect::<Vec<_>>().join(", ");
        if s.is_empty() {
            "0".into()
        } else {
            s
        }
    }

    /// A row of the tables: `| LEAD | requests | ... | goodput |`.
    fn line(&self, lead: &str) -> String {
        format!(
            "| {lead} | {} | {} | {} | {} | {} / {} | {} % | {} |\n",
            self.row.requests,
            self.row.done,
            self.by_code(),
            self.row.failed,
            n(self.row.p50, 0),
            n(self.row.p99, 0),
            percent(self.row.within, 1),
            n(self.row.goodput, 2)
        )
    }
}

/// Each tenant's TTFT P99 per 5 s of send time, one series per run and
/// tenant; a bucket where one of them finished nothing is left out.
fn ttft_chart(dir: &Path, runs: &[(&str, &RunResult)], names: &[&str], stem: &str, title: &str) -> Result<(), String> {
    let mut header = Vec::new();
    let mut series: Vec<BTreeMap<u64, Vec<f64>>> = Vec::new();
    for (lab, r) in runs {
        for name in names {
            let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            for x in r.records.iter().filter(|x| x.stream == *name) {
                if let Some(t) = x.ttft_ms {
                    by.entry((x.start_s / 5.0).floor() as u64).or_default().push(t);
                }
            }
            header.push(format!("{lab}: {name} TTFT P99 ms"));
            series.push(by);
        }
    }
    let end = series.iter().filter_map(|s| s.keys().next_back().copied()).max().unwrap_or(0);
    let mut csv = format!("time (s),{}\n", header.join(","));
    for b in 0..=end {
        let vals: Option<Vec<String>> = series.iter().map(|s| s.get(&b).filter(|v| !v.is_empty()).map(|v| n(pct(v, 0.99), 0))).collect();
        if let Some(vals) = vals {
            let _ = writeln!(csv, "{},{}", b as f64 * 5.0 + 2.5, vals.join(","));
        }
    }
    let path = dir.join(format!("{stem}.csv"));
    write(&path, &csv)?;
    chart(&path, dir, stem, title, "ms", &[("chat TTFT target 300 ms", 300.0)])
}

/// Three tenants in one class, A sending most: first come first served
/// (`fifo`), fair, and B and C alone.
pub(super) fn fair(dir: &Path, c: f64) -> Result<(), String> {
    let mut runs = Vec::new();
    for lab in ["fifo", "fair", "alone"] {
        let p = dir.join(format!("{lab}.json"));
        if p.exists() {
            runs.push((lab, load(&p)?));
        }
    }
    let mut rows: BTreeMap<&str, Vec<(&str, TenantRow)>> = BTreeMap::new();
    for (lab, r) in &runs {
        let (w, d) = window(r);
        let recs = measured(r);
        let names = if *lab == "alone" { &["B", "C"][..] } else { &["A", "B", "C"][..] };
        rows.insert(lab, names.iter().map(|t| (*t, tenant_row(&recs, t, d - w))).collect());
    }
    let fair = rows.get("fair").ok_or("no fair run")?;
    let get = |t: &str| fair.iter().find(|(n, _)| *n == t).map(|(_, r)| r.clone()).ok_or(format!("no tenant {t}"));
    let mut m = Measured::default();
    for t in ["B", "C"] {
        let x = get(t)?;
        m.stated(&format!("{t}_within_pct"), 100.0 * x.row.within, format!("{} %", percent(x.row.within, 2)));
        m.stated(&format!("{t}_ttft_p99_ms"), x.row.p99, format!("{} ms", n(x.row.p99, 0)));
        let bo = x.code("breaker_open");
        m.stated(&format!("{t}_breaker_open"), bo as f64, format!("{bo} breaker_open"));
    }
    let a = get("A")?;
    let (own, every) = (a.code("tenant_over_share"), a.row.rejected);
    m.flag("A_refusals_all_over_share", own > 0 && own == every, format!("{own} of {every}"));
    let good = |rs: &[(&str, TenantRow)]| rs.iter().map(|(_, x)| x.row.goodput).fold(0.0, |a, b| a + b);
    let g = good(fair);
    m.stated("goodput_pct_of_c", 100.0 * g / c, format!("{} req/s = {} % of C", n(g, 2), n(100.0 * g / c, 0)));
    m.write(dir)?;
    let shown: Vec<(&str, &RunResult)> = runs.iter().filter(|(l, _)| *l != "alone").map(|(l, r)| (*l, r)).collect();
    ttft_chart(dir, &shown, &["A", "B", "C"], "ttft", "Each tenant's TTFT P99 per 5 s: first come first served vs fair")?;
    let mut f = format!("**Fleet:** {FLEET}\n\n**Capacity C = {} req/s.**\n", n(c, 2));
    if let Some(alone) = rows.get("alone") {
        let (b, cc) = (&alone[0].1, &alone[1].1);
        let _ = writeln!(
            f,
            "\nReference, A absent (`alone`): B {} % and C {} % within SLO, TTFT P99 {} / {} ms: what this fleet and machine give them at best.",
            percent(b.row.within, 1),
            percent(cc.row.within, 1),
            n(b.row.p99, 0),
            n(cc.row.p99, 0)
        );
    }
    f += "\n## Side by side\n\n| run | tenant | requests | completed | 429 (by code) | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (lab, _) in &runs {
        let rs = &rows[lab];
        for (t, x) in rs {
            f += &x.line(&format!("{lab} | {t}"));
        }
        if *lab != "alone" {
            let g = good(rs);
            let _ = writeln!(f, "| {lab} | **all** | | | | | | | **{}** ({} % of C) |", n(g, 2), n(100.0 * g / c, 0));
        }
    }
    let fifo = runs.iter().any(|(l, _)| *l == "fifo");
    let _ = writeln!(f, "\nChart: `ttft.svg`{}.", if fifo { " (run 1: first come first served against fair)" } else { "" });
    write(&dir.join("report.md"), &f)
}

/// Chat beside a batch flood, each its own key.
pub(super) fn flood(dir: &Path, c: f64) -> Result<(), String> {
    let r = load(&dir.join("flood.json"))?;
    let (w, d) = window(&r);
    let recs = measured(&r);
    let (web, bulk) = (tenant_row(&recs, "web", d - w), tenant_row(&recs, "bulk", d - w));
    let bo = web.code("breaker_open");
    let mut m = Measured::default();
    m.stated("web_breaker_open", bo as f64, format!("{bo} breaker_open"));
    m.stated("web_within_pct", 100.0 * web.row.within, format!("{} %", percent(web.row.within, 2)));
    m.stated("web_ttft_p99_ms", web.row.p99, format!("{} ms", n(web.row.p99, 0)));
    m.write(dir)?;
    let mut f = format!("**Fleet:** {FLEET}\n\n**Capacity C = {} req/s.**\n\n", n(c, 2));
    f += "| tenant | class | requests | completed | 429 (by code) | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    f += &web.line("web | chat");
    f += &bulk.line("bulk | batch");
    let web_recs: Vec<&Record> = recs.iter().copied().filter(|x| x.stream == "web").collect();
    let _ = writeln!(f, "\n`web`'s {}", misses(&web_recs, "chat"));
    write(&dir.join("report.md"), &f)
}
