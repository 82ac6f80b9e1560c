//! Reports of `loadtest/bench/limits.sh` (learned limits, the
//! work-conserving reservation), one run each (the fleet's and the cold
//! start's are in `fleet.rs`):
//!
//! ```text
//! bench report limits overload DIR C
//! bench report limits change DIR C HALF C2 shift|slow
//! bench report limits batch DIR C QUIET
//! bench report limits fleet DIR C KILL_AT
//! bench report limits coldstart DIR
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::out::{chart, counter, n, percent, write, Measured, Table};
use super::records::{between, class_row, done, load, misses, pct, window, ClassRow};
use crate::loadgen::Record;

/// Chat's and batch's rows of a part.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub chat: ClassRow,
    pub batch: ClassRow,
}

impl Rows {
    pub fn of(recs: &[&Record], span: f64) -> Self {
        Self { chat: class_row(recs, "chat", span), batch: class_row(recs, "batch", span) }
    }
    /// Goodput of both classes, req/s.
    pub fn good(&self) -> f64 {
        self.chat.goodput + self.batch.goodput
    }
    /// Completions of both classes, req/s.
    pub fn done(&self) -> f64 {
        self.chat.throughput + self.batch.throughput
    }
}

/// The side-by-side table (its first column headed `first`): each part's classes, and its goodput as a share
/// of the capacity it is judged against (`C`, or `C2` after a change).
pub(super) fn table(f: &mut String, first: &str, parts: &[(&str, Rows, f64, &str)]) {
    let _ = writeln!(f, "| {first} | class | requests | completed | 429 | failed | TTFT p50 / p99 ms | within SLO | goodput req/s |");
    f.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (name, rows, c, cname) in parts {
        for (cls, x) in [("chat", &rows.chat), ("batch", &rows.batch)] {
            let _ = writeln!(
                f,
                "| {name} | {cls} | {} | {} | {} | {} | {} / {} | {} % | {} |",
                x.requests,
                x.done,
                x.rejected,
                x.failed,
                n(x.p50, 0),
                n(x.p99, 0),
                percent(x.within, 1),
                n(x.goodput, 2)
            );
        }
        let g = rows.good();
        let _ = writeln!(f, "| {name} | **all** | | | | | | | **{}** ({} % of {cname}) |", n(g, 2), n(100.0 * g / c, 0));
    }
}

/// The sum of the replicas' limits and the gateway's chat TTFT P99 over
/// time, one series each per part; the parts' timelines.
pub(super) fn limit_chart(dir: &Path, labels: &[&str], stem: &str, title: &str) -> Result<Vec<Table>, String> {
    let series = labels.iter().map(|l| Table::read(&dir.join(format!("{l}-timeline.csv")))).collect::<Result<Vec<_>, _>>()?;
    let rows = series.iter().map(|s| s.rows.len()).min().unwrap_or(0);
    let mut csv = String::from("time (s),");
    csv += &labels.iter().map(|l| format!("{l}: slots (sum of replica limits)")).collect::<Vec<_>>().join(",");
    csv += ",";
    csv += &labels.iter().map(|l| format!("{l}: chat TTFT P99 ms")).collect::<Vec<_>>().join(",");
    csv += "\n";
    for i in 0..rows {
        let col = |c: &str| series.iter().map(|s| n(s.at(i, c), 0)).collect::<Vec<_>>().join(",");
        let _ = writeln!(csv, "{},{},{}", n(series[0].at(i, "t"), 2), col("replica_limits"), col("ttft_p99_ms"));
    }
    let path = dir.join(format!("{stem}.csv"));
    write(&path, &csv)?;
    chart(&path, dir, stem, title, "slots / ms", &[("chat TTFT target 300 ms", 300.0)])?;
    Ok(series)
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::NAN, f64::NAN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

pub(super) fn overload(dir: &Path, c: f64) -> Result<(), String> {
    let mut labs = vec!["auto", "fixed", "none"];
    if dir.join("no-preempt.json").exists() {
        labs.push("no-preempt");
    }
    let (mut rows, mut why) = (Vec::new(), String::new());
    for lab in &labs {
        let r = load(&dir.join(format!("{lab}.json")))?;
        let (w, d) = window(&r);
        let recs = between(&r, w, d);
        rows.push(Rows::of(&recs, d - w));
        if *lab == "auto" {
            why = misses(&recs, "chat");
        }
    }
    let series = limit_chart(dir, &labs, "limits", "slots per gateway, and chat TTFT P99 as the gateway sees it")?;
    let a = rows[0];
    let learned: Vec<f64> =
        (0..series[0].rows.len()).filter(|&i| series[0].at(i, "t") >= 5.0).map(|i| series[0].at(i, "replica_limits")).collect();
    let prom = dir.join("auto.prom");
    let (preempted, redone) = (counter(&prom, "slogate_preemptions_total"), counter(&prom, "slogate_preemption_redone_tokens_total"));
    let mut m = Measured::default();
    m.stated("auto_chat_p99_ms", a.chat.p99, format!("{} ms", n(a.chat.p99, 0)));
    m.stated("auto_chat_within_pct", 100.0 * a.chat.within, format!("{} %", percent(a.chat.within, 2)));
    m.stated("auto_goodput_pct_of_c", 100.0 * a.good() / c, format!("{} req/s = {} % of C", n(a.good(), 2), n(100.0 * a.good() / c, 0)));
    let failed = a.chat.failed + a.batch.failed;
    m.stated("auto_failed", failed as f64, format!("{failed} failed"));
    if let Some(p) = rows.get(3) {
        let share = 100.0 * a.batch.done as f64 / p.batch.done.max(1) as f64;
        m.stated(
            "batch_pct_of_no_preempt",
            share,
            format!(
                "{} batch completed against {} without = {} %; {} preemptions, {} tokens prefilled again",
                a.batch.done,
                p.batch.done,
                n(share, 0),
                n(preempted, 0),
                n(redone, 0)
            ),
        );
        m.stated(
            "no_preempt_chat_within_pct",
            100.0 * p.chat.within,
            format!("{} %, P99 {} ms", percent(p.chat.within, 2), n(p.chat.p99, 0)),
        );
    }
    m.write(dir)?;
    let (lo, hi) = min_max(&learned);
    let mut f = format!(
        "Capacity C = {} req/s. Learned slots (sum over the replicas) from 5 s on: min {}, median {}, max {}.\n\n",
        n(c, 2),
        n(lo, 0),
        n(pct(&learned, 0.5), 0),
        n(hi, 0)
    );
    let parts: Vec<_> = labs.iter().zip(&rows).map(|(l, r)| (*l, *r, c, "C")).collect();
    table(&mut f, "part", &parts);
    let _ = writeln!(
        f,
        "\n`auto` (the defaults, preemption on): {} batch streams preempted, {} tokens prefilled again by their continuations. `auto`'s {why}",
        n(preempted, 0),
        n(redone, 0)
    );
    f += "\nChart: `limits.svg` (each gateway's slots and its rolling chat TTFT P99).\n";
    write(&dir.join("report.md"), &f)
}

/// A run whose capacity changes at `half` seconds (`what`: shift or slow).
pub(super) fn change(dir: &Path, c: f64, half: f64, c2: f64, what: &str) -> Result<(), String> {
    let r = load(&dir.join("auto.json"))?;
    let (_, dur) = window(&r);
    let before = Rows::of(&between(&r, 5.0, half), half - 5.0);
    let after_recs = between(&r, half + 10.0, dur);
    let after = Rows::of(&after_recs, dur - half - 10.0);
    let change = match what {
        "shift" => "prompts double",
        "slow" => "one replica slows 2x",
        other => return Err(format!("no capacity change {other:?} (shift or slow)")),
    };
    let series = limit_chart(dir, &["auto"], "limits", &format!("{change} at {} s: learned slots and chat TTFT P99", n(half, 0)))?;
    let s = &series[0];
    let lim = |a: f64, b: f64| -> Vec<f64> {
        (0..s.rows.len()).filter(|&i| (a..b).contains(&s.at(i, "t"))).map(|i| s.at(i, "replica_limits")).collect()
    };
    let (pre, post) = (lim(half - 20.0, half), lim(half + 10.0, dur));
    // The first moment after the change within a tenth of the level it settles at.
    let level = pct(&post, 0.5);
    let follow = (0..s.rows.len())
        .find(|&i| s.at(i, "t") >= half && (s.at(i, "replica_limits") - level).abs() <= 0.1 * level)
        .map(|i| s.at(i, "t") - half);
    let g = after.good();
    let mut m = Measured::default();
    m.maybe("follow_s", follow, follow.map_or("never".into(), |t| format!("{} s to the new level", n(t, 1))));
    m.stated("after_chat_within_pct", 100.0 * after.chat.within, format!("{} %", percent(after.chat.within, 2)));
    m.stated("after_goodput_pct_of_c2", 100.0 * g / c2, format!("{} req/s = {} % of C2", n(g, 2), n(100.0 * g / c2, 0)));
    m.write(dir)?;
    let mut f = format!(
        "C = {} req/s before the change, C2 = {} req/s after it. Learned slots (sum over both replicas): {} (median of the 20 s before the change), {} (median after). \"After\" is from {} s on.\n\n",
        n(c, 2),
        n(c2, 2),
        n(pct(&pre, 0.5), 0),
        n(level, 0),
        n(half + 10.0, 0)
    );
    table(&mut f, "part", &[("before", before, c, "C"), ("after", after, c2, "C2")]);
    let _ = writeln!(f, "\nAfter the change, {}", misses(&after_recs, "chat"));
    let reference = dir.join("chat-alone.json");
    if reference.exists() {
        let rr = load(&reference)?;
        let (w, e) = window(&rr);
        let x = class_row(&between(&rr, w, e), "chat", e - w);
        let _ = writeln!(
            f,
            "\n**Reference: the same chat (0.4 C, 1024-token prompts) with no batch at all**, through `auto` on fresh replicas: {} requests, TTFT p50 / p99 {} / {} ms, {} % within SLO: what chat gets on this fleet after the change with nothing beside it.",
            x.done,
            n(x.p50, 0),
            n(x.p99, 0),
            percent(x.within, 2)
        );
    }
    f += "\nChart: `limits.svg`.\n";
    write(&dir.join("report.md"), &f)
}

/// Batch alone until `quiet` seconds, then chat beside it.
pub(super) fn batch(dir: &Path, c: f64, quiet: f64) -> Result<(), String> {
    let r = load(&dir.join("auto.json"))?;
    let (_, dur) = window(&r);
    let alone =
        r.records.iter().filter(|x| x.class == "batch" && done(x) && (10.0..quiet).contains(&(x.start_s + x.e2e_ms / 1000.0))).count();
    let rate = alone as f64 / (quiet - 10.0);
    let chat = class_row(&between(&r, quiet, dur), "chat", dur - quiet);
    limit_chart(dir, &["auto"], "limits", &format!("batch alone, chat from {} s: slots and chat TTFT P99", n(quiet, 0)))?;
    let mut m = Measured::default();
    m.stated("batch_alone_pct_of_c", 100.0 * rate / c, format!("{} req/s = {} % of C", n(rate, 2), n(100.0 * rate / c, 0)));
    m.stated("chat_p99_ms", chat.p99, format!("{} ms", n(chat.p99, 0)));
    m.write(dir)?;
    let mut f = format!(
        "C = {} req/s.\n\n| batch alone req/s | % of C | chat requests | chat TTFT p50 / p99 ms | chat within SLO |\n|---:|---:|---:|---:|---:|\n",
        n(c, 2)
    );
    let _ = writeln!(
        f,
        "| {} | {} % | {} | {} / {} | {} % |",
        n(rate, 2),
        n(100.0 * rate / c, 0),
        chat.requests,
        n(chat.p50, 0),
        n(chat.p99, 0),
        percent(chat.within, 1)
    );
    f += "\nChart: `limits.svg` (the sum of the replicas' learned limits, and chat's TTFT P99).\n";
    write(&dir.join("report.md"), &f)
}
