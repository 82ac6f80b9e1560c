//! Reports of the fleet and the cold start of `loadtest/bench/limits.sh`:
//! three gateways over the same replicas, against one; and a fresh
//! gateway's first seconds.

use std::fmt::Write as _;
use std::path::Path;

use super::limits::{table, Rows};
use super::out::{chart, n, percent, signed, write, Measured, Table};
use super::records::{done, load, pct, window};
use crate::loadgen::Record;

/// The fleet's parts, in the order the report shows them.
const VARIANTS: [&str; 6] = ["alone", "fixed", "even", "one", "skewed", "kill"];

/// The records of a part's gateways `only` (one loadgen each, started together).
fn gateways(dir: &Path, part: &str, only: &[usize]) -> Result<Vec<Record>, String> {
    let mut recs = Vec::new();
    for i in only {
        let path = dir.join(format!("{part}-{i}.json"));
        if path.exists() {
            recs.extend(load(&path)?.records);
        }
    }
    Ok(recs)
}

fn rows_between(recs: &[Record], a: f64, b: f64) -> Rows {
    let part: Vec<&Record> = recs.iter().filter(|x| a <= x.start_s && x.start_s < b).collect();
    Rows::of(&part, b - a)
}

/// Each gateway's slots over the kill part (its part of the replicas),
/// and the fleet's limit as gateway 1 sees it.
fn kill_chart(dir: &Path, kill_at: f64) -> Result<(), String> {
    let series = (0..3).map(|i| Table::read(&dir.join(format!("kill-{i}-timeline.csv")))).collect::<Result<Vec<_>, _>>()?;
    let mut csv = String::from("time (s),gateway 1 slots,gateway 2 slots,gateway 3 slots (killed),replica limits (gateway 1's view)\n");
    for row in 0..series[0].rows.len() {
        let t = series[0].at(row, "t");
        let vals: Vec<String> = series
            .iter()
            .map(|s| {
                let near = (0..s.rows.len()).min_by(|&a, &b| (s.at(a, "t") - t).abs().total_cmp(&(s.at(b, "t") - t).abs()));
                // A gateway not answering (killed) holds nothing.
                let v = near.filter(|&i| (s.at(i, "t") - t).abs() < 0.5).map(|i| s.at(i, "replica_slots"));
                n(v.filter(|v| !v.is_nan()).unwrap_or(0.0), 0)
            })
            .collect();
        let _ = writeln!(csv, "{},{},{}", n(t, 2), vals.join(","), n(series[0].at(row, "replica_limits"), 0));
    }
    let path = dir.join("kill-slots.csv");
    write(&path, &csv)?;
    chart(&path, dir, "kill-slots", &format!("each gateway's part of the replicas; gateway 3 killed at {} s", n(kill_at, 0)), "slots", &[])
}

/// Every part of the fleet's run, gateway 3 killed at `kill_at` seconds
/// in the last.
pub(super) fn fleet(dir: &Path, c: f64, kill_at: f64) -> Result<(), String> {
    let parts: Vec<&str> = VARIANTS.into_iter().filter(|v| dir.join(format!("{v}-0.json")).exists()).collect();
    let first = parts.first().ok_or_else(|| format!("{}: no part of the fleet's run", dir.display()))?;
    let (_, dur) = window(&load(&dir.join(format!("{first}-0.json")))?);
    let mut rows = Vec::new();
    for v in &parts {
        rows.push((*v, rows_between(&gateways(dir, v, &[0, 1, 2])?, 5.0, dur)));
    }
    let row = |name: &str| rows.iter().find(|(v, _)| *v == name).map(|(_, r)| *r);
    let mut m = Measured::default();
    for v in ["even", "skewed"] {
        let Some(x) = row(v) else { continue };
        let pct_c = |r: f64| format!("{} req/s = {} % of C", n(r, 2), n(100.0 * r / c, 0));
        m.stated(&format!("{v}_done_pct_of_c"), 100.0 * x.done() / c, pct_c(x.done()));
        m.stated(&format!("{v}_chat_p99_ms"), x.chat.p99, format!("{} ms", n(x.chat.p99, 0)));
        m.stated(&format!("{v}_chat_within_pct"), 100.0 * x.chat.within, format!("{} %", percent(x.chat.within, 2)));
        m.stated(&format!("{v}_goodput_pct_of_c"), 100.0 * x.good() / c, pct_c(x.good()));
    }
    if let (Some(e), Some(o)) = (row("even"), row("one")) {
        let (e, o) = (e.chat, o.chat);
        m.stated(
            "even_within_minus_one_pct",
            100.0 * (e.within - o.within),
            format!("{} % (one gateway: {} %)", percent(e.within, 2), percent(o.within, 2)),
        );
        m.stated("even_p99_minus_one_ms", e.p99 - o.p99, format!("{} ms (one gateway: {} ms)", n(e.p99, 0), n(o.p99, 0)));
    }
    let mut after = None;
    if row("kill").is_some() {
        let a = rows_between(&gateways(dir, "kill", &[0, 1])?, kill_at + 5.0, dur);
        m.stated("kill_after_chat_p99_ms", a.chat.p99, format!("{} ms", n(a.chat.p99, 0)));
        m.stated("kill_after_chat_within_pct", 100.0 * a.chat.within, format!("{} %", percent(a.chat.within, 2)));
        kill_chart(dir, kill_at)?;
        after = Some(a);
    }
    m.write(dir)?;
    let mut f = format!("Capacity C = {} req/s.\n\n", n(c, 2));
    let mut shown: Vec<_> = rows.iter().map(|(v, r)| (*v, *r, c, "C")).collect();
    shown.extend(after.map(|a| ("kill, after", a, c, "C")));
    table(&mut f, "part", &shown);
    if after.is_some() {
        f += "\nChart: `kill-slots.svg` (each gateway's `slogate_replica_slots`, summed over the replicas, and the replicas' limit).\n";
    }
    write(&dir.join("report.md"), &f)
}

/// One limit's first seconds.
struct Cold {
    first_p99: f64,
    early_p99: f64,
    all_p99: f64,
    queue_max: f64,
    requests: usize,
    failed: usize,
    /// What the failures were (a refusal's code, else the outcome), most first.
    why: Vec<(String, usize)>,
}

fn cold(recs: &[Record]) -> Cold {
    let ttft = |before: f64| -> Vec<f64> { recs.iter().filter(|x| x.start_s < before).filter_map(|x| x.ttft_ms).collect() };
    let failed: Vec<&Record> = recs.iter().filter(|x| !done(x)).collect();
    let mut why: Vec<(String, usize)> = Vec::new();
    for x in &failed {
        let k = x.error_code.clone().unwrap_or_else(|| x.outcome.clone());
        match why.iter_mut().find(|(w, _)| *w == k) {
            Some((_, c)) => *c += 1,
            None => why.push((k, 1)),
        }
    }
    why.sort_by_key(|w| std::cmp::Reverse(w.1));
    Cold {
        first_p99: pct(&ttft(1.0), 0.99),
        early_p99: pct(&ttft(2.0), 0.99),
        all_p99: pct(&ttft(f64::INFINITY), 0.99),
        queue_max: recs.iter().filter(|x| x.start_s < 2.0).map(|x| x.queue_ms.unwrap_or(0.0)).fold(0.0, f64::max),
        requests: recs.len(),
        failed: failed.len(),
        why,
    }
}

/// A fresh gateway's first seconds: TTFT of the first round of streams
/// and of the whole part, the learned limit against a fixed one.
pub(super) fn coldstart(dir: &Path) -> Result<(), String> {
    let auto = cold(&load(&dir.join("auto.json"))?.records);
    let fixed = cold(&load(&dir.join("fixed.json"))?.records);
    let d = auto.early_p99 - fixed.early_p99;
    let mut m = Measured::default();
    m.stated("early_p99_over_fixed_ms", d, format!("{} ms ({} vs {})", signed(d, 1), n(auto.early_p99, 0), n(fixed.early_p99, 0)));
    m.stated("early_queue_max_ms", auto.queue_max, format!("longest wait {} ms", n(auto.queue_max, 0)));
    m.write(dir)?;
    let mut f = String::from(
        "| limit | requests | failed | TTFT p99 ms, first 1 s | first 2 s | whole part | longest queue wait in the first 2 s ms |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (v, r) in [("auto", &auto), ("fixed", &fixed)] {
        let why = r.why.iter().map(|(k, c)| format!("{c} {k}")).collect::<Vec<_>>().join(", ");
        let failed = if why.is_empty() { "0".to_string() } else { format!("{} ({why})", r.failed) };
        let _ = writeln!(
            f,
            "| {v} | {} | {failed} | {} | {} | {} | {} |",
            r.requests,
            n(r.first_p99, 0),
            n(r.early_p99, 0),
            n(r.all_p99, 0),
            n(r.queue_max, 0)
        );
    }
    write(&dir.join("report.md"), &f)
}
