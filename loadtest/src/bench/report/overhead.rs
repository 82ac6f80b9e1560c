//! Report of `loadtest/bench/overhead.sh`: the gateway's overhead against
//! the direct path (separate loads, side by side, interleaved, with A/A
//! controls, and the same hop through HAProxy), throughput, memory. A run
//! is one round of every load; its files are named as round 1.
//!
//! ```text
//! bench report overhead DIR IDLE_KB OPEN_KB OPEN_STREAMS HZ PLACEMENT
//! ```

use std::path::Path;

use super::out::{n, signed, write, Measured};
use super::overhead_parts::{
    all_gaps, busy, by_class, by_target, diff, file_num, max, mean, met, min, per_round, row, verdict, Diff, Mixed, OnePath, Run, ROUNDS,
};
use super::overhead_text as text;
use super::records::{done, load, pct_floor as pct};
use crate::loadgen::Record;

/// One whole load (the first 3 s left out): TTFT, ITL, throughput and the
/// path's share, where the simulator stamped its chunks.
struct Stats {
    ttft50: f64,
    ttft99: f64,
    itl50: f64,
    itl99: f64,
    rps: f64,
    n: usize,
    bad: usize,
    secs: f64,
    all: usize,
    path50: f64,
    path99: f64,
    eitl99: f64,
    gap99: f64,
    shift99: f64,
    cpu_us: f64,
}

fn stats(dir: &Path, name: &str, hz: f64) -> Result<Stats, String> {
    let r = load(&dir.join(format!("{name}.json")))?;
    let warm = 3.0;
    let recs: Vec<&Record> = r.records.iter().filter(|x| x.start_s >= warm).collect();
    let ok: Vec<&&Record> = recs.iter().filter(|x| done(x)).collect();
    let t: Vec<f64> = ok.iter().filter_map(|x| x.ttft_ms).collect();
    let path: Vec<f64> = ok.iter().filter_map(|x| Some(x.ttft_ms? - x.engine_ttft_ms?)).collect();
    let itl99 = all_gaps(&r.itl_us, 0.99);
    let (eitl99, gap99) = (all_gaps(&r.engine_itl_us, 0.99), all_gaps(&r.itl_path_us, 0.99));
    let stamped = !path.is_empty();
    let nan_unless = |v: f64| if stamped { v } else { f64::NAN };
    Ok(Stats {
        ttft50: pct(&t, 0.5),
        ttft99: pct(&t, 0.99),
        itl50: all_gaps(&r.itl_us, 0.5),
        itl99,
        rps: ok.len() as f64 / (r.elapsed_s - warm),
        n: recs.len(),
        bad: recs.len() - ok.len(),
        secs: r.elapsed_s,
        all: r.records.len(),
        path50: pct(&path, 0.5),
        path99: pct(&path, 0.99),
        eitl99: nan_unless(eitl99),
        gap99: nan_unless(gap99),
        // How far the path moves the ITL p99: the client's p99 less the
        // replica's p99 of the same gaps.
        shift99: nan_unless(itl99 - eitl99),
        cpu_us: file_num(dir, &format!("{name}.cpu")) / hz * 1e6 / r.records.len().max(1) as f64,
    })
}

/// Separate loads, direct then through slogate.
fn separate(run: &Run, out: &mut Vec<String>) -> Result<(), String> {
    out.extend(text::SEPARATE_HEAD.map(String::from));
    let mut added = Vec::new();
    for rnd in 1..=ROUNDS {
        let (d, g) = (stats(run.dir, &format!("lat-direct-{rnd}"), run.hz)?, stats(run.dir, &format!("lat-gateway-{rnd}"), run.hz)?);
        for (name, s) in [("direct", &d), ("slogate", &g)] {
            out.push(format!(
                "| {rnd} | {name} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {} |",
                s.n,
                s.bad,
                n(s.ttft50, 3),
                n(s.ttft99, 3),
                n(s.path50, 3),
                n(s.path99, 3),
                n(s.itl50, 3),
                n(s.itl99, 3),
                n(s.eitl99, 3),
                n(s.gap99, 3)
            ));
        }
        added.push([g.path50 - d.path50, g.path99 - d.path99, g.shift99 - d.shift99, g.ttft99 - d.ttft99, g.itl99 - d.itl99]);
    }
    let m = |i: usize| signed(mean(added.iter().map(|a| a[i])), 3);
    out.push(String::new());
    out.push(format!(
        "Separate loads, slogate minus direct: path's share of TTFT p50 {} ms, p99 {} ms; ITL p99 shift {} ms. Raw: TTFT p99 {} ms, ITL p99 {} ms. {}",
        m(0),
        m(1),
        m(2),
        m(3),
        m(4),
        text::SEPARATE_AFTER
    ));
    out.push(String::new());
    Ok(())
}

/// Side by side in one run: N through slogate beside N direct.
fn side_by_side(run: &Run, placement: &str, out: &mut Vec<String>) -> Result<(), String> {
    out.extend(text::SIDE_HEAD.map(String::from));
    let mut pairs_by: Vec<(u32, Vec<Diff>)> = Vec::new();
    for c in [32, 100, 200] {
        let mut pair = Vec::new();
        for rnd in 1..=ROUNDS {
            let name = format!("lat-pair-{c}-{rnd}");
            let r = run.load(&name)?;
            let (d, g) = (by_class(&r, "direct"), by_class(&r, "chat"));
            if c == 200 {
                for (label, s) in [("direct", &d), ("slogate", &g)] {
                    out.push(one_path_row(rnd, label, s));
                }
            }
            let (cpu0, cpu1) = run.cores(&name);
            pair.push(Diff { cpu0, cpu1, ..diff(&g, &d) });
        }
        pairs_by.push((c, pair));
    }
    out.extend(text::SIDE_ADDED_HEAD.map(String::from));
    let m = |xs: &[Diff], f: fn(&Diff) -> f64| mean(xs.iter().map(f));
    for (c, pair) in &pairs_by {
        out.push(format!(
            "| {c} | {} | {} | {} | {} | {} % / {} % |",
            signed(m(pair, |d| d.path50), 3),
            signed(m(pair, |d| d.path99), 3),
            signed(m(pair, |d| d.shift99), 3),
            signed(m(pair, |d| d.gap99), 3),
            n(m(pair, |d| d.cpu0), 0),
            n(m(pair, |d| d.cpu1), 0)
        ));
    }
    let mut aa = Vec::new();
    for rnd in 1..=ROUNDS {
        let r = run.load(&format!("lat-aa-{rnd}"))?;
        aa.push(diff(&by_class(&r, "chat"), &by_class(&r, "direct")));
    }
    out.push(format!(
        "| control: 200 direct beside 200 direct (A/A) | {} | {} | {} | {} | |",
        signed(m(&aa, |d| d.path50), 3),
        signed(m(&aa, |d| d.path99), 3),
        signed(m(&aa, |d| d.shift99), 3),
        signed(m(&aa, |d| d.gap99), 3)
    ));
    let pair = &pairs_by[2].1;
    let (mean99, mean_shift) = (m(pair, |d| d.path99), m(pair, |d| d.shift99));
    let cores = if placement == "pinned" { text::SIDE_CORES_PINNED } else { text::SIDE_CORES_SHARED };
    out.push(String::new());
    out.push(format!("{}{cores}", text::SIDE_AFTER));
    out.push(String::new());
    out.push(format!(
        "Targets at 200 streams, side by side (a single run carries the order's bias, see the control row): added TTFT p99 <= 0.5 ms: {} ({} ms); added ITL p99 <= 0.1 ms: {} ({} ms).",
        met(mean99 <= 0.5),
        signed(mean99, 3),
        met((mean_shift * 1000.0).round_ties_even() <= 100.0),
        signed(mean_shift, 3)
    ));
    out.push(String::new());
    Ok(())
}

fn one_path_row(rnd: usize, label: &str, s: &OnePath) -> String {
    format!(
        "| {rnd} | {label} | {} | {} | {} | {} / {} | {} | {} | {} |",
        s.n,
        s.bad,
        n(s.ttft99, 3),
        n(s.path50, 3),
        n(s.path99, 3),
        n(s.itl99, 3),
        n(s.eitl99, 3),
        n(s.gap99, 3)
    )
}

fn interleaved(run: &Run, out: &mut Vec<String>) -> Result<Mixed, String> {
    out.extend(text::MIX_HEAD.map(String::from));
    let mut mix = Mixed { by: vec![(32, Vec::new()), (200, Vec::new())], aa: Vec::new(), v: Vec::new(), vaa: Vec::new() };
    for rnd in 1..=ROUNDS {
        for (c, xs) in &mut mix.by {
            let name = format!("lat-mix-ab-{c}-{rnd}");
            if *c == 200 {
                let r = run.load(&name)?;
                for (label, t) in [("slogate", 0), ("direct", 1)] {
                    out.push(one_path_row(rnd, label, &by_target(&r, t)));
                }
            }
            xs.push(run.versus(&name)?);
        }
        mix.aa.push(run.aa(&format!("lat-mix-aa-{rnd}"))?);
        mix.v.push(run.versus(&format!("lat-mixv-ab-{rnd}"))?);
        mix.vaa.push(run.aa(&format!("lat-mixv-aa-{rnd}"))?);
    }
    out.extend(text::MIX_ADDED_HEAD.map(String::from));
    for (c, xs) in &mix.by {
        out.push(row(&format!("slogate vs direct, {c} each"), xs, &busy(xs)));
    }
    out.push(row("control at 200: direct vs direct (A/A)", &mix.aa, ""));
    out.push(row("slogate vs direct, 200 each, 32-96 output tokens", &mix.v, &busy(&mix.v)));
    out.push(row("control at 200, 32-96 output tokens (A/A)", &mix.vaa, ""));
    out.push(String::new());
    out.push(format!("{}64 tokens: {}. 32-96 tokens: {}.", text::MIX_ROUNDS, per_round(&mix.by[1].1), per_round(&mix.v)));
    out.push(String::new());
    out.push(text::MIX_HOP.into());
    let (mut wf, mut wv) = (Vec::new(), Vec::new());
    for rnd in 1..=ROUNDS {
        wf.push(run.waves(&format!("lat-mix-ab-200-{rnd}"))?);
        wv.push(run.waves(&format!("lat-mixv-ab-{rnd}"))?);
    }
    let share = |w: &[(f64, u64)]| format!("{}-{}", n(min(w.iter().map(|a| a.0)), 0), n(max(w.iter().map(|a| a.0)), 0));
    let most = |w: &[(f64, u64)]| w.iter().map(|a| a.1).max().unwrap_or(0);
    out.push(String::new());
    out.push(format!(
        "Fixed lengths put the closed loop in lockstep: every stream is 64 tokens long, so streams end together and their callers' next requests arrive together. Of the requests through slogate, {} % began in the busiest 5 % of engine steps, up to {} in one 20-ms step; with lengths drawn from 32-96 tokens (the same mean), {} %, at most {} in one step. {}",
        share(&wf),
        most(&wf),
        share(&wv),
        most(&wv),
        text::MIX_WAVES
    ));
    out.push(String::new());
    out.push(format!(
        "{}{}. {}.",
        text::MIX_TARGETS,
        verdict("64 output tokens (lockstep)", &mix.by[1].1),
        verdict("32-96 output tokens", &mix.v)
    ));
    out.push(String::new());
    Ok(mix)
}

/// `bench report overhead DIR IDLE_KB OPEN_KB OPEN_STREAMS HZ PLACEMENT`.
pub(super) fn overhead(dir: &Path, idle_kb: f64, open_kb: f64, open_streams: &str, hz: f64, placement: &str) -> Result<(), String> {
    let run = Run { dir, hz };
    let mut out = Vec::new();
    separate(&run, &mut out)?;
    side_by_side(&run, placement, &mut out)?;
    let mix = interleaved(&run, &mut out)?;
    super::overhead_more::busy_poll(&run, &mix, &mut out)?;
    super::overhead_more::haproxy(&run, &mix, &mut out)?;
    let side = super::overhead_more::throughput(&run, placement, &mut out, |name| {
        stats(dir, name, hz).map(|s| (s.rps, s.bad, s.cpu_us, s.secs, s.all))
    })?;
    let mb = |kb: f64| n(kb / 1024.0, 1);
    out.extend([String::new(), "## Memory".into(), String::new()]);
    out.push(format!(
        "slogate RSS idle: {} MB. With {open_streams} open streams: {} MB (target <= 64 MB: {}).",
        mb(idle_kb),
        mb(open_kb),
        met(open_kb <= 64.0 * 1024.0)
    ));
    out.push(String::new());
    let mut m = Measured::default();
    let mean_of = |xs: &[Diff], f: fn(&Diff) -> f64| mean(xs.iter().map(f));
    let round3 = |v: f64| format!("{v:.3}").parse().unwrap_or(f64::NAN);
    for (key, xs, aa_xs) in [("mix200", &mix.by[1].1, &mix.aa), ("mixv", &mix.v, &mix.vaa)] {
        for (what, f) in [("ttft", (|d: &Diff| d.path99) as fn(&Diff) -> f64), ("itl", |d: &Diff| d.shift99)] {
            let (v, c) = (mean_of(xs, f), mean_of(aa_xs, f));
            m.stated(&format!("{key}_added_{what}_p99_ms"), round3(v), format!("{} ms (A/A control {})", signed(v, 3), signed(c, 3)));
        }
    }
    let (p32, p256) = (side.ratios[0].first().copied().unwrap_or(f64::NAN), side.ratios[1].first().copied().unwrap_or(f64::NAN));
    m.stated("tput_side_by_side_32", p32, n(p32, 3));
    m.stated("tput_side_by_side_256", p256, format!("{} (A/A {})", n(p256, 3), n(side.aa, 3)));
    m.stated("rss_open_mb", open_kb / 1024.0, format!("{} MB with {open_streams} open streams", mb(open_kb)));
    m.write(dir)?;
    write(&dir.join("report.md"), &(out.join("\n") + "\n"))
}
