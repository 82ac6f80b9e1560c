//! Report of `loadtest/bench/epp.sh`: six paths taken in turn by one load
//! (direct; one Envoy's round robin, the floor picker, slogate as the
//! picker and the floor picker again; slogate's proxy). Per path: the
//! share of TTFT and ITL the path adds (from the simulator's stamps) and
//! the CPU per request of its processes (the shared Envoy's per request
//! over its four paths, plus the path's picker); and slogate's decision
//! time.
//!
//! ```text
//! bench report epp DIR HZ
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::out::{g, n, signed, write, Measured};
use super::paths::{ints, Side};
use super::prom::{bucket_of, buckets, quantile, samples};
use super::records::{done, load, measured, pct_floor, pct_pairs};
use crate::loadgen::{Record, RunResult};

const PATHS: [&str; 6] = [
    "direct",
    "Envoy, round robin",
    "Envoy + floor picker",
    "Envoy + slogate as the picker",
    "slogate's proxy",
    "control: Envoy + floor picker again",
];
/// The paths through the shared Envoy.
const ENVOY_PATHS: [usize; 4] = [1, 2, 3, 5];

fn on(run: &RunResult, idx: usize) -> impl Iterator<Item = &Record> {
    run.records.iter().filter(move |r| r.target == Some(idx))
}

fn side(run: &RunResult, idx: usize, cpu_us: f64) -> Side {
    let n = on(run, idx).filter(|r| done(r)).count();
    // The TTFT shares over the measured window: the warmup's first wave
    // (every stream at once) left out.
    let path: Vec<f64> = measured(run)
        .into_iter()
        .filter(|r| r.target == Some(idx) && done(r))
        .filter_map(|r| Some(r.ttft_ms? - r.engine_ttft_ms?))
        .collect();
    let gaps = run.itl_by_target.path_us.get(&idx.to_string()).map_or(&[][..], Vec::as_slice);
    Side {
        n,
        errors: on(run, idx).count() - n,
        ttft50: pct_floor(&path, 0.5),
        ttft99: pct_floor(&path, 0.99),
        itl99: pct_pairs(gaps, 0.99) / 1000.0,
        cpu_us,
    }
}

/// `bench report epp DIR HZ`.
pub(super) fn epp(dir: &Path, hz: f64) -> Result<(), String> {
    let run = load(&dir.join("paths.json"))?;
    let ticks = ints(&dir.join("paths.cpu"))?;
    // Ticks over the load: the shared Envoy, the floor picker, slogate as
    // the picker, slogate's proxy.
    let tick = |i: usize| (ticks.get(4 + i).copied().unwrap_or(0) - ticks.get(i).copied().unwrap_or(0)) as f64;
    let done_on = |idx: usize| on(&run, idx).filter(|r| done(r)).count();
    let us = |t: f64, n: usize| if n > 0 { t * 1e6 / hz / n as f64 } else { f64::NAN };
    let envoy_us = us(tick(0), ENVOY_PATHS.iter().map(|&i| done_on(i)).sum());
    let floor_us = us(tick(1), done_on(2) + done_on(5));
    let cpu = [f64::NAN, envoy_us, envoy_us + floor_us, envoy_us + us(tick(2), done_on(3)), us(tick(3), done_on(4)), envoy_us + floor_us];
    let rows: Vec<Side> = (0..PATHS.len()).map(|i| side(&run, i, cpu[i])).collect();
    let (floor, epp, floor2) = (&rows[2], &rows[3], &rows[5]);
    let control = (floor2.ttft50 - floor.ttft50, floor2.ttft99 - floor.ttft99);
    let (before, after) = (samples(&dir.join("before.prom"))?, samples(&dir.join("after.prom"))?);
    let bs = buckets(&before, &after, "slogate_epp_decision_seconds_bucket", |_| true);
    let decided = bs.last().map_or(0.0, |b| b.1);
    let (d50, d99) = if decided > 0.0 { (quantile(0.5, &bs) * 1000.0, quantile(0.99, &bs) * 1000.0) } else { (f64::NAN, f64::NAN) };
    let over = |a: f64, b: f64, c: f64| format!("{} ms ({} vs {}; control {})", signed(a - b, 3), n(a, 3), n(b, 3), signed(c, 3));
    let over50 = over(epp.ttft50, floor.ttft50, control.0);
    let over99 = over(epp.ttft99, floor.ttft99, control.1);
    let mut m = Measured::default();
    m.stated("epp_over_floor_ttft50_ms", epp.ttft50 - floor.ttft50, over50.clone());
    m.stated("epp_over_floor_ttft99_ms", epp.ttft99 - floor.ttft99, over99.clone());
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    m.stated("errors", errors as f64, format!("{errors} of {}", rows.iter().map(|r| r.n + r.errors).sum::<usize>()));
    // The picker serves only its path: its TTFT histogram over the run
    // against the client's own TTFT of the same requests.
    let tb = buckets(&before, &after, "slogate_time_to_first_token_seconds_bucket", |_| true);
    let client: Vec<f64> = on(&run, 3).filter(|r| done(r)).filter_map(|r| r.ttft_ms).map(|t| t / 1000.0).collect();
    if !tb.is_empty() && !client.is_empty() {
        let (theirs, ours) = (pct_floor(&client, 0.5), quantile(0.5, &tb));
        let (lo, hi) = bucket_of(theirs, &tb);
        let said = format!(
            "the client's {} ms, slogate's {} ms (bucket {}-{} ms)",
            n(theirs * 1000.0, 2),
            n(ours * 1000.0, 2),
            g(lo * 1000.0),
            g(hi * 1000.0)
        );
        m.flag("epp_ttft_p50_same_bucket", (lo, hi) == bucket_of(ours, &tb), said);
    }
    m.write(dir)?;
    let envoy = std::fs::read_to_string(dir.join("envoy.version")).map_err(|e| format!("envoy.version: {e}"))?;
    let mut f = format!(
        "Envoy {}, one process with two workers for its four paths. One load, the paths taken in turn; the TTFT shares are over \
         the requests sent after the warmup, the other columns over all.\n\n\
         | path | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | CPU us/request (its processes) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        envoy.trim()
    );
    for (name, r) in PATHS.iter().zip(&rows) {
        let c = if r.cpu_us.is_nan() { String::new() } else { n(r.cpu_us, 0) };
        let _ = writeln!(f, "| {name} | {} | {} | {} | {} | {} | {c} |", r.n, r.errors, n(r.ttft50, 3), n(r.ttft99, 3), n(r.itl99, 3));
    }
    let _ = writeln!(
        f,
        "\nCPU per request: the Envoy paths' is Envoy's own, {} us (over its four paths' requests), plus their picker's (the floor picker's over its two paths').",
        n(envoy_us, 0)
    );
    let _ = writeln!(
        f,
        "\nslogate's decision time (`slogate_epp_decision_seconds`, {} decisions): p50 {} ms, p99 {} ms.",
        n(decided, 0),
        n(d50, 3),
        n(d99, 3)
    );
    let rr = &rows[1];
    let _ = writeln!(
        f,
        "\nThe floor picker over Envoy's round robin: TTFT p50 {} ms, p99 {} ms.",
        signed(floor.ttft50 - rr.ttft50, 3),
        signed(floor.ttft99 - rr.ttft99, 3)
    );
    let _ = writeln!(
        f,
        "slogate as the picker over the floor: TTFT p50 **{over50}**, p99 **{over99}** (control: the floor path twice, its second over its first)."
    );
    write(&dir.join("report.md"), &f)
}
