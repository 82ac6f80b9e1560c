//! Report of `loadtest/bench/soak.sh`: what slogate held before, at its
//! peak under the load and after it, and what the traffic met.
//!
//! ```text
//! bench report soak DIR
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, write, Measured, Table};
use super::records::load;

/// `count` pairs in words, by key: `a 1, b 2`, or `none`.
fn words(counts: &BTreeMap<String, i64>) -> String {
    let s = counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

/// slogate's own counts at the end, by one label: `(series prefix, label)`.
fn counted(metrics: &str, prefix: &str, key: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let want = format!("{key}=\"");
    for line in metrics.lines().filter(|l| l.starts_with(prefix)) {
        let Some((_, rest)) = line.split_once(&want) else { continue };
        let label = rest.split('"').next().unwrap_or_default().to_string();
        let v = line.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()).unwrap_or(0.0);
        *out.entry(label).or_insert(0) += v as i64;
    }
    out
}

/// `bench report soak DIR`.
pub(super) fn soak(dir: &Path) -> Result<(), String> {
    let t = Table::read(&dir.join("samples.csv"))?;
    let phase = |p: &str| (0..t.rows.len()).filter(|&i| t.text(i, "phase") == p).collect::<Vec<_>>();
    let before = *phase("before").first().ok_or("samples.csv: no sample before the load")?;
    let under = phase("load");
    let last = *phase("after").last().ok_or("samples.csv: no sample after the load")?;
    let peak = |k: &str| under.iter().map(|&i| t.at(i, k)).fold(f64::NEG_INFINITY, f64::max);
    let mut outcomes = BTreeMap::new();
    for r in load(&dir.join("soak.json"))?.records {
        *outcomes.entry(r.outcome).or_insert(0) += 1;
    }
    let clients = std::fs::read_to_string(dir.join("clients.txt")).map_err(|e| format!("clients.txt: {e}"))?;
    let end = std::fs::read_to_string(dir.join("end.metrics")).map_err(|e| format!("end.metrics: {e}"))?;
    let resumes = counted(&end, "slogate_stream_resumes_total{", "reason");
    let unresumed = counted(&end, "slogate_stream_unresumed_total{", "why");
    let gw_outcomes = counted(&end, "slogate_requests_total{", "outcome");
    let early = &under[..(under.len() / 6).max(1).min(under.len())];
    let rss_early = early.iter().map(|&i| t.at(i, "rss_kb")).fold(f64::NEG_INFINITY, f64::max) / 1024.0;
    let mut m = Measured::default();
    let mut f = String::from(
        "![what slogate holds over time](soak.svg)\n\n| | before | peak under load | after | back to its level before |\n|---|---:|---:|---:|---|\n",
    );
    for (k, name) in [
        ("inflight", "slots in flight"),
        ("queued", "queued requests"),
        ("connections", "client connections"),
        ("fds", "open file descriptors"),
    ] {
        let ok = t.at(last, k) <= t.at(before, k);
        let (b, p, a) = (t.text(before, k), n(peak(k), 0), t.text(last, k));
        m.flag(&format!("{k}_back"), ok, format!("{b} before, {p} at the peak, {a} after"));
        let _ = writeln!(f, "| {name} | {b} | {p} | {a} | {} |", if ok { "yes" } else { "NO" });
    }
    let (rss_b, rss_l, rss_a) = (t.at(before, "rss_kb") / 1024.0, peak("rss_kb") / 1024.0, t.at(last, "rss_kb") / 1024.0);
    let ratio = rss_a / rss_early;
    m.stated(
        "rss_after_vs_early",
        ratio,
        format!("{} MB after, {} MB in the first sixth ({}x)", n(rss_a, 1), n(rss_early, 1), n(ratio, 2)),
    );
    let _ = writeln!(
        f,
        "| RSS MB | {} | {} | {} | {}x the first sixth of the run's ({} MB) |",
        n(rss_b, 1),
        n(rss_l, 1),
        n(rss_a, 1),
        n(ratio, 2),
        n(rss_early, 1)
    );
    let _ = writeln!(f, "\nloadgen's requests by outcome: {}.", words(&outcomes));
    let _ = writeln!(f, "slogate's count of all requests (the misbehaving clients' too) by outcome: {}.", words(&gw_outcomes));
    let _ = writeln!(
        f,
        "Streams continued on the other replica after they broke, by how: {}; broken and not continued, by why: {}.",
        words(&resumes),
        words(&unresumed)
    );
    let _ = writeln!(f, "Misbehaving clients: {}.", clients.trim());
    write(&dir.join("report.md"), &f)?;
    m.write(dir)
}
