//! The admission reports read beside the gateway's log: the breaker
//! opening and closing around a slowed replica, and context reduction
//! holding TTFT under a prefill-bound load.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::admission::timeline_chart;
use super::out::{n, write, Measured, Table};
use super::records::{load, pct};

/// (unix seconds, fields) of the gateway's JSON log lines.
fn log_events(path: &Path) -> Result<Vec<(f64, Value)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|j| {
            let at = humantime::parse_rfc3339_weak(j.get("timestamp")?.as_str()?).ok()?;
            let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
            Some((secs, j.get("fields").cloned().unwrap_or(Value::Null)))
        })
        .collect())
}

/// The breaker's and context reduction's moves for class `chat`, in words.
fn transitions(events: &[(f64, Value)]) -> Vec<(f64, String)> {
    let s = |f: &Value, k: &str| f.get(k).and_then(Value::as_str).map(str::to_string);
    events
        .iter()
        .filter(|(_, f)| s(f, "class").as_deref() == Some("chat"))
        .filter_map(|(ts, f)| {
            let msg = s(f, "message").unwrap_or_default();
            let to = s(f, "to").filter(|t| !t.is_empty());
            let e = if msg.starts_with("TTFT P99 above the breaker") {
                "armed".to_string()
            } else if msg.starts_with("TTFT P99 back under") {
                "disarmed".to_string()
            } else if let (true, Some(to)) = (msg.contains("breaker"), to) {
                to
            } else if msg.starts_with("context reduction") {
                let on = matches!(f.get("active"), Some(Value::Bool(true))) || s(f, "active").as_deref() == Some("true");
                format!("reduction {}", if on { "on" } else { "off" })
            } else {
                return None;
            };
            Some((*ts, e))
        })
        .collect()
}

fn first(tl: &Table, from: f64, pred: impl Fn(usize) -> bool) -> Option<f64> {
    (0..tl.rows.len()).find(|&i| tl.at(i, "t") >= from && pred(i)).map(|i| tl.at(i, "t"))
}

/// The replica slows 8x and recovers (`faults.log`): how fast the breaker
/// opened and closed, and what its refusals told the callers.
pub(super) fn breaker(dir: &Path) -> Result<(), String> {
    let r = load(&dir.join("breaker.json"))?;
    let tl = Table::read(&dir.join("timeline.csv"))?;
    let faults_text = std::fs::read_to_string(dir.join("faults.log")).map_err(|e| format!("faults.log: {e}"))?;
    let faults: Vec<f64> =
        faults_text.lines().filter(|l| l.starts_with("fault ")).filter_map(|l| l.split_whitespace().nth(1)?.parse().ok()).collect();
    let (&slow_start, &slow_end) = faults.first().zip(faults.get(1)).ok_or("faults.log: two faults expected")?;
    let ev = transitions(&log_events(&dir.join("gateway.log"))?);
    let armed = ev.iter().find(|(_, e)| e == "armed").map(|e| e.0);
    let opened = armed.and_then(|a| ev.iter().find(|(t, e)| e == "open" && *t >= a).map(|e| e.0));
    let exceed_t = first(&tl, slow_start, |i| tl.at(i, "ttft_p99_ms") > 600.0);
    let open_t = first(&tl, slow_start, |i| tl.at(i, "breaker_state") == 2.0);
    let was_open = (0..tl.rows.len()).any(|i| (slow_start..=slow_end).contains(&tl.at(i, "t")) && tl.at(i, "breaker_state") != 0.0);
    let closed_t = if was_open { first(&tl, slow_end, |i| tl.at(i, "breaker_state") == 0.0) } else { None };
    let rej: Vec<_> = r.records.iter().filter(|x| x.outcome == "rejected").collect();
    let open_delay = armed.zip(opened).map(|(a, o)| o - a);
    let close_delay = closed_t.map(|t| t - slow_end);
    // The open breaker's refusals: 429 breaker_open, Retry-After the time
    // until it half-opens (with jitter), within 1-30 s.
    let brk: Vec<_> = rej.iter().filter(|x| x.error_code.as_deref() == Some("breaker_open")).collect();
    let mut brk_ra: Vec<u64> = brk.iter().filter_map(|x| x.retry_after).collect();
    brk_ra.sort_unstable();
    let brk_ok = !brk_ra.is_empty() && brk_ra.len() == brk.len() && brk_ra[0] >= 1 && brk_ra[brk_ra.len() - 1] <= 30;
    let round2 = |v: f64| (v * 100.0).round() / 100.0;
    let mut m = Measured::default();
    m.maybe(
        "open_delay_s",
        open_delay.map(round2),
        open_delay.map_or("never opened".into(), |d| format!("{} s (gateway log: P99 above 600 ms -> open)", n(d, 2))),
    );
    let ra_text = match (brk_ra.first(), brk_ra.last()) {
        (Some(lo), Some(hi)) => format!("{} responses, Retry-After {lo}-{hi} s", brk.len()),
        _ => format!("{} responses, none with Retry-After", brk.len()),
    };
    m.flag("breaker_refusals_retry_after_in_1_30_s", brk_ok, ra_text);
    m.maybe(
        "close_delay_s",
        close_delay.map(round2),
        close_delay.map_or("did not close".into(), |d| format!("{} s (+-0.25 s sampling)", n(d, 2))),
    );
    m.write(dir)?;
    let title = format!("breaker: slowdown x8 from {} s to {} s", n(slow_start, 0), n(slow_end, 0));
    timeline_chart(&dir.join("timeline.csv"), dir, "breaker-timeline", &title)?;
    let t0 = opened.zip(open_t).map(|(o, t)| o - t);
    let mut rows = vec![(slow_start, "replica slowed down 8x".to_string()), (slow_end, "replica back to normal".to_string())];
    rows.extend(exceed_t.map(|t| (t, "gateway's chat TTFT P99 first sampled above 600 ms (2x target)".to_string())));
    if let Some(t0) = t0 {
        rows.extend(ev.iter().map(|(ts, e)| (ts - t0, format!("breaker log: {e}"))));
    }
    let earliest = |v: &[&&crate::loadgen::Record]| v.iter().map(|x| x.start_s).fold(f64::INFINITY, f64::min);
    if !brk.is_empty() {
        rows.push((earliest(&brk), "first 429 breaker_open at a client (sent at)".into()));
    }
    if !rej.is_empty() {
        rows.push((rej.iter().map(|x| x.start_s).fold(f64::INFINITY, f64::min), "first 429 of any kind at a client (sent at)".into()));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut f = format!("The replica slowed down 8x at {} s and recovered at {} s.\n", n(slow_start, 1), n(slow_end, 1));
    f += "\n## Timeline\n\n| time s | event |\n|---|---|\n";
    for (t, e) in &rows {
        let _ = writeln!(f, "| {} | {e} |", n(*t, 2));
    }
    let shown = by_code(&rej);
    let _ = write!(
        f,
        "\n429s by code, then by Retry-After in seconds: {{{}}} (with the replica 8x slower its 64 slots fill, and \
queued requests that can no longer make the TTFT target are refused before the breaker opens; the open \
breaker's Retry-After is the time until it half-opens, with jitter).\n\n",
        shown
    );
    f += "Charts: `breaker-timeline.svg` (the gateway's rolling chat TTFT P99 with the breaker state), \
`breaker-ttft-p99.svg`, `breaker-throughput.svg` (completed and 429 per second, client side).\n";
    write(&dir.join("report.md"), &f)
}

/// 429s by code, then by Retry-After in seconds, in the order first met,
/// written as the reports always have: `{'code': {ra: count, ...}, ...}`
/// inside the braces.
fn by_code(rej: &[&crate::loadgen::Record]) -> String {
    type Counts = Vec<(Option<u64>, usize)>;
    let mut codes: Vec<(String, Counts)> = Vec::new();
    for x in rej {
        let code = x.error_code.clone().unwrap_or_else(|| "none".into());
        let i = codes.iter().position(|(c, _)| *c == code).unwrap_or_else(|| {
            codes.push((code, Vec::new()));
            codes.len() - 1
        });
        let ras = &mut codes[i].1;
        match ras.iter_mut().find(|(ra, _)| *ra == x.retry_after) {
            Some((_, k)) => *k += 1,
            None => ras.push((x.retry_after, 1)),
        }
    }
    codes
        .iter()
        .map(|(c, ras)| {
            let inner = ras.iter().map(|(ra, k)| format!("{}: {k}", ra.map_or("None".into(), |v| v.to_string()))).collect::<Vec<_>>();
            format!("'{c}': {{{}}}", inner.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One mode of the reduction run.
struct Mode {
    on_t: Option<f64>,
    opened: bool,
    /// Client TTFT p99 per 10 s of send time.
    wins: BTreeMap<u64, f64>,
    reduced: usize,
    rejected: usize,
    requests: usize,
    all_p99: f64,
    gw_max: f64,
    events: Vec<(f64, String)>,
}

fn mode(dir: &Path, m: &str) -> Result<(Mode, Table), String> {
    let r = load(&dir.join(format!("{m}.json")))?;
    let events = transitions(&log_events(&dir.join(format!("gateway-{m}.log")))?);
    let tl = Table::read(&dir.join(format!("timeline-{m}.csv")))?;
    let recs: Vec<_> = r.records.iter().filter(|x| x.class == "chat").collect();
    let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for x in &recs {
        if let Some(t) = x.ttft_ms {
            by.entry((x.start_s / 10.0).floor() as u64).or_default().push(t);
        }
    }
    let state = tl.column("breaker_state");
    let mode = Mode {
        on_t: (0..tl.rows.len()).find(|&i| tl.at(i, "reduction_active") == 1.0).map(|i| tl.at(i, "t")),
        opened: state.contains(&2.0) || events.iter().any(|(_, e)| e == "open"),
        wins: by.iter().map(|(k, v)| (*k, pct(v, 0.99))).collect(),
        reduced: recs.iter().filter(|x| x.context_reduced.as_deref().is_some_and(|c| !c.is_empty())).count(),
        rejected: recs.iter().filter(|x| x.outcome == "rejected").count(),
        requests: recs.len(),
        all_p99: pct(&recs.iter().filter_map(|x| x.ttft_ms).collect::<Vec<_>>(), 0.99),
        gw_max: tl.column("ttft_p99_ms").into_iter().fold(f64::NAN, f64::max),
        events,
    };
    let title = format!("{m} context reduction: chat TTFT P99 (gateway view)");
    timeline_chart(&dir.join(format!("timeline-{m}.csv")), dir, &format!("chart-timeline-{m}"), &title)?;
    Ok((mode, tl))
}

/// The same prefill-bound load without and with context reduction.
pub(super) fn reduction(dir: &Path) -> Result<(), String> {
    let (without, _) = mode(dir, "without")?;
    let (with, tl) = mode(dir, "with")?;
    let active_throughout = |k: u64| {
        let rows: Vec<usize> = (0..tl.rows.len()).filter(|&i| ((k * 10) as f64..(k * 10 + 10) as f64).contains(&tl.at(i, "t"))).collect();
        !rows.is_empty() && rows.iter().all(|&i| tl.at(i, "reduction_active") == 1.0)
    };
    // Windows sent while reduction had been on for 10 s or more (the queue left from before has drained).
    let after: Vec<f64> =
        with.wins.iter().filter(|(k, _)| active_throughout(**k) && (**k == 0 || active_throughout(**k - 1))).map(|(_, v)| *v).collect();
    let before: Vec<f64> =
        with.wins.iter().filter(|(k, _)| with.on_t.is_some_and(|on| (**k * 10 + 10) as f64 <= on)).map(|(_, v)| *v).collect();
    let on_share = tl.column("reduction_active").iter().filter(|&&a| a == 1.0).count() as f64 / tl.rows.len().max(1) as f64;
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let mut m = Measured::default();
    let said = |o: bool| if o { "opened" } else { "never opened" };
    m.flag("without_opened", without.opened, said(without.opened));
    m.flag("with_opened", with.opened, said(with.opened));
    let text = if after.is_empty() || before.is_empty() {
        "no data".to_string()
    } else {
        format!(
            "before: p99 {} ms; with reduction on: p99 at most {} ms over {} windows",
            n(max(&before), 0),
            n(max(&after), 0),
            after.len()
        )
    };
    m.stated("reduced_ttft_p99_max_ms", max(&after), text);
    m.write(dir)?;
    write(&dir.join("report.md"), &reduction_text(&[("without", &without), ("with", &with)], on_share))
}

fn reduction_text(modes: &[(&str, &Mode); 2], on_share: f64) -> String {
    let mut f = String::from(
        "## Before / after\n\n| run | requests | reduced | 429 | chat TTFT p99 whole run ms | gateway's rolling P99 max ms | reduction on at s | breaker opened |\n|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (name, s) in modes {
        let _ = writeln!(
            f,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            s.requests,
            s.reduced,
            s.rejected,
            n(s.all_p99, 0),
            n(s.gw_max, 0),
            s.on_t.map_or("-".into(), |t| n(t, 1)),
            if s.opened { "yes" } else { "no" }
        );
    }
    let keys: Vec<u64> = modes[1].1.wins.keys().copied().collect();
    let heads = keys.iter().map(|k| format!("{}-{}", k * 10, k * 10 + 10)).collect::<Vec<_>>().join(" | ");
    let _ = writeln!(
        f,
        "\nClient-side chat TTFT p99 per 10 s of send time (ms):\n\n| window s | {heads} |\n|---|{}",
        "---:|".repeat(keys.len())
    );
    for (name, s) in modes {
        let vals = keys.iter().map(|k| n(s.wins.get(k).copied().unwrap_or(f64::NAN), 0)).collect::<Vec<_>>().join(" | ");
        let _ = writeln!(f, "| {name} | {vals} |");
    }
    let _ = writeln!(
        f,
        "\nReduction was on for {} % of the run with it. Windows that are not all reduced (the first seconds, and when it turns off after 30 s under target and the load, still too big unreduced, sends it straight back on) show the overload again until the backlog drains.",
        n(100.0 * on_share, 0)
    );
    f += "\nTransitions (gateway log, seconds after the first event):\n\n";
    for (name, s) in modes {
        if let Some(&(t0, _)) = s.events.first() {
            let moves = s.events.iter().map(|(t, e)| format!("{} s {e}", n(t - t0, 1))).collect::<Vec<_>>().join("; ");
            let _ = writeln!(f, "- {name}: {moves}");
        }
    }
    f += "\nCharts: `chart-timeline-without.svg`, `chart-timeline-with.svg` (the gateway's rolling chat TTFT P99, breaker and reduction state), `*-reduction-ttft-p99.svg`, `*-reduction-throughput.svg`.\n";
    f
}
