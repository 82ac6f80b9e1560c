//! The overhead report's later parts (`bench report overhead`): busy
//! polling and HAProxy in slogate's place where they ran, and streaming
//! throughput, separate and side by side.

use super::out::n;
use super::overhead_parts::{busy, mean, met, min, per_round, row, verdict, Mixed, Run, ROUNDS};
use super::overhead_text as text;
use super::records::{done, load};

/// The interleaved loads through a second slogate with
/// `server.busy_poll: true`, where they ran.
pub(super) fn busy_poll(run: &Run, mix: &Mixed, out: &mut Vec<String>) -> Result<(), String> {
    if !run.dir.join("lat-busy-1.json").exists() {
        return Ok(());
    }
    let (mut bf, mut bv) = (Vec::new(), Vec::new());
    for rnd in 1..=ROUNDS {
        bf.push(run.versus(&format!("lat-busy-{rnd}"))?);
        bv.push(run.versus(&format!("lat-busyv-{rnd}"))?);
    }
    let cpu = |pre: &str| n(mean((1..=ROUNDS).map(|rnd| run.gw_cpu(&format!("{pre}-{rnd}")))), 1);
    let secs = load(&run.dir.join("lat-busy-1.json"))?.elapsed_s;
    out.extend(["### With `server.busy_poll: true`".to_string(), String::new()]);
    out.push(format!(
        "{}{} s: 64 tokens {} s by default, {} s polling; 32-96 tokens {} s by default, {} s polling.",
        text::BUSY_ABOUT,
        n(secs, 0),
        cpu("lat-mix-ab-200"),
        cpu("lat-busy"),
        cpu("lat-mixv-ab"),
        cpu("lat-busyv")
    ));
    out.extend([String::new(), text::ADDED_TABLE.to_string()]);
    let fixed = &mix.by[1].1;
    out.push(row("slogate vs direct, 64 tokens (default, from above)", fixed, &busy(fixed)));
    out.push(row("slogate `busy_poll` vs direct, 64 tokens", &bf, &busy(&bf)));
    out.push(row("slogate vs direct, 32-96 tokens (default, from above)", &mix.v, &busy(&mix.v)));
    out.push(row("slogate `busy_poll` vs direct, 32-96 tokens", &bv, &busy(&bv)));
    out.push(String::new());
    out.push(format!(
        "Each round, slogate `busy_poll` minus direct, TTFT p99 / ITL p99 in ms (steal CPU 0 / CPU 1): 64 tokens: {}. 32-96 tokens: {}.",
        per_round(&bf),
        per_round(&bv)
    ));
    out.push(String::new());
    out.push(format!(
        "Targets at 200 streams with `server.busy_poll: true`, interleaved: {}. {}.",
        verdict("64 output tokens (lockstep)", &bf),
        verdict("32-96 output tokens", &bv)
    ));
    out.push(String::new());
    Ok(())
}

/// HAProxy in slogate's place (`mode tcp`, `mode http`), where it ran.
pub(super) fn haproxy(run: &Run, mix: &Mixed, out: &mut Vec<String>) -> Result<(), String> {
    let mut hap = Vec::new();
    for mode in ["tcp", "http"] {
        if !run.dir.join(format!("lat-hap-{mode}-1.json")).exists() {
            continue;
        }
        let (mut fixed, mut varied) = (Vec::new(), Vec::new());
        for rnd in 1..=ROUNDS {
            fixed.push(run.versus(&format!("lat-hap-{mode}-{rnd}"))?);
            varied.push(run.versus(&format!("lat-hapv-{mode}-{rnd}"))?);
        }
        hap.push((mode, fixed, varied));
    }
    if hap.is_empty() {
        return Ok(());
    }
    let version = std::fs::read_to_string(run.dir.join("haproxy.version")).map_or("HAProxy".to_string(), |v| v.trim().to_string());
    out.extend(["### The same hop through HAProxy".to_string(), String::new()]);
    out.push(format!("For scale: {version}{}", text::HAP_ABOUT));
    out.extend([String::new(), text::ADDED_TABLE.to_string()]);
    out.push(row("slogate vs direct, 64 tokens (from above)", &mix.by[1].1, &busy(&mix.by[1].1)));
    out.push(row("slogate vs direct, 32-96 tokens (from above)", &mix.v, &busy(&mix.v)));
    for (mode, fixed, varied) in &hap {
        out.push(row(&format!("HAProxy `mode {mode}` vs direct, 64 tokens"), fixed, &busy(fixed)));
        out.push(row(&format!("HAProxy `mode {mode}` vs direct, 32-96 tokens"), varied, &busy(varied)));
    }
    let rounds = hap
        .iter()
        .map(|(mode, fixed, varied)| format!("`mode {mode}`, 64 tokens: {}; 32-96 tokens: {}.", per_round(fixed), per_round(varied)));
    out.push(String::new());
    out.push(format!(
        "Each round, HAProxy minus direct, TTFT p99 / ITL p99 in ms (steal CPU 0 / CPU 1): {}",
        rounds.collect::<Vec<_>>().join(" ")
    ));
    out.push(String::new());
    Ok(())
}

/// A whole load's completed requests a second, failures, slogate's CPU per
/// request, length in seconds, and requests.
type Whole = (f64, usize, f64, f64, usize);

/// Requests completed per second by one group of a side-by-side load (the
/// first 5 s left out), and its failures.
fn class_rps(run: &Run, name: &str, cls: &str) -> Result<(f64, usize), String> {
    let r = load(&run.dir.join(format!("{name}.json")))?;
    let recs: Vec<_> = r.records.iter().filter(|x| x.start_s >= 5.0 && x.class == cls).collect();
    let ok = recs.iter().filter(|x| done(x)).count();
    Ok((ok as f64 / (r.elapsed_s - 5.0), recs.len() - ok))
}

/// What the side-by-side throughput loads measured: slogate's rate over
/// the direct group's at 32 and 256 streams a round, and the A/A control's.
pub(super) struct SideBySide {
    pub ratios: [Vec<f64>; 2],
    pub aa: f64,
}

/// Streaming throughput, separate loads and side by side.
pub(super) fn throughput(
    run: &Run,
    placement: &str,
    out: &mut Vec<String>,
    stats: impl Fn(&str) -> Result<Whole, String>,
) -> Result<SideBySide, String> {
    out.extend(["## Streaming throughput".to_string(), String::new()]);
    out.push(format!("{}{}", text::TPUT_ABOUT, if placement == "pinned" { text::TPUT_PINNED } else { "." }));
    out.extend([String::new(), text::TPUT_TABLE.to_string()]);
    let ratios = separate(run, out, stats)?;
    out.push(String::new());
    for (c, v) in [32, 256].iter().zip(&ratios) {
        let worst = min(v.iter().copied());
        out.push(format!(
            "Throughput at {c} streams, separate runs, slogate / direct: mean {}, worst round {}; >= 0.9 in every round: {}.",
            n(mean(v.iter().copied()), 3),
            n(worst, 3),
            if worst >= 0.9 { "yes" } else { "no" }
        ));
    }
    side_by_side(run, out, &ratios)
}

/// The separate loads, direct then through slogate: slogate's rate over
/// direct's at 32 and 256 streams, a round each.
fn separate(run: &Run, out: &mut Vec<String>, stats: impl Fn(&str) -> Result<Whole, String>) -> Result<[Vec<f64>; 2], String> {
    let mut ratios = [Vec::new(), Vec::new()];
    for rnd in 1..=ROUNDS {
        for (i, c) in [32, 256].into_iter().enumerate() {
            let (dn, gn) = (format!("tput-direct-{c}-{rnd}"), format!("tput-gateway-{c}-{rnd}"));
            let ((d_rps, d_bad, _, d_secs, d_all), (g_rps, g_bad, g_cpu, g_secs, g_all)) = (stats(&dn)?, stats(&gn)?);
            let ratio = g_rps / d_rps;
            ratios[i].push(ratio);
            let (cd, cg) = (run.cores(&dn), run.cores(&gn));
            // CPU 0's busy time per request served (pinned: the simulator
            // and the load generator's).
            let c0d = cd.0 / 100.0 * d_secs * 1e6 / d_all.max(1) as f64;
            let c0g = cg.0 / 100.0 * g_secs * 1e6 / g_all.max(1) as f64;
            out.push(format!(
                "| {rnd} | {c} | {} | {} | {} | {d_bad}/{g_bad} | {} us | {} % / {} % | {} % / {} % | {} / {} us |",
                n(d_rps, 0),
                n(g_rps, 0),
                n(ratio, 3),
                n(g_cpu, 0),
                n(cd.0, 0),
                n(cd.1, 0),
                n(cg.0, 0),
                n(cg.1, 0),
                n(c0d, 0),
                n(c0g, 0)
            ));
        }
    }
    Ok(ratios)
}

/// Both groups in one load, and the A/A control.
fn side_by_side(run: &Run, out: &mut Vec<String>, ratios: &[Vec<f64>; 2]) -> Result<SideBySide, String> {
    out.extend([String::new(), "### Side by side in one run".to_string(), String::new(), text::PAIR_ABOUT.to_string(), String::new()]);
    out.push(text::PAIR_TABLE.to_string());
    let (mut pratios, mut aaratios) = ([Vec::new(), Vec::new()], Vec::new());
    for rnd in 1..=ROUNDS {
        let aa = format!("tput-aa-{rnd}");
        aaratios.push(class_rps(run, &aa, "chat")?.0 / class_rps(run, &aa, "direct")?.0);
        for (i, c) in [32, 256].into_iter().enumerate() {
            let name = format!("tput-pair-{c}-{rnd}");
            let ((g, gbad), (d, dbad)) = (class_rps(run, &name, "chat")?, class_rps(run, &name, "direct")?);
            pratios[i].push(g / d);
            let (c0, c1) = run.cores(&name);
            let aa_cell = if c == 256 { aaratios.last().map_or(String::new(), |a| n(*a, 3)) } else { String::new() };
            out.push(format!(
                "| {rnd} | {c} | {} | {} | {} | {dbad}/{gbad} | {} % / {} % | {aa_cell} |",
                n(d, 0),
                n(g, 0),
                n(g / d, 3),
                n(c0, 0),
                n(c1, 0)
            ));
        }
    }
    let aa = aaratios.first().copied().unwrap_or(f64::NAN);
    out.push(String::new());
    out.push(format!("A/A control (the group in slogate's place in this run's order, over the other): {}.", n(aa, 3)));
    out.push(String::new());
    for (i, c) in [32, 256].into_iter().enumerate() {
        let (pw, sw) = (min(pratios[i].iter().copied()), min(ratios[i].iter().copied()));
        out.push(format!(
            "Throughput at {c} streams per path, side by side (the project's method for performance: one run, as a ratio), slogate / direct: mean {}, worst round {}; target >= 0.9x in every round: {}. Separate runs: mean {}, worst round {} ({} on that reading).",
            n(mean(pratios[i].iter().copied()), 3),
            n(pw, 3),
            met(pw >= 0.9),
            n(mean(ratios[i].iter().copied()), 3),
            n(sw, 3),
            met(sw >= 0.9)
        ));
    }
    Ok(SideBySide { ratios: pratios, aa })
}
