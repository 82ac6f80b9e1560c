//! Report of `loadtest/bench/calibrate.sh`: the simulator against
//! published vLLM behaviour, end to end, no gateway. Client-side TTFT and
//! ITL against the simulator's own histograms in the same runs; the batch
//! interference shape (P99/P50 TTFT by concurrency, with and without 5 %
//! long prompts), over HTTP and from the engine alone on paused time; and
//! the capacity knee under open-loop load.
//!
//! ```text
//! bench report calibration DIR SECS RATES CSECS CONCURRENCIES
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use super::out::{n, signed, write, Measured};
use super::records::{done, load, pct_floor as pct, pct_pairs};
use crate::loadgen::{Record, RunResult};

/// The client statistics leave out the first seconds of each load.
const SKIP_S: f64 = 5.0;

/// The published reference, by concurrency: TTFT P50 and P99 (ms) and
/// their ratio as published.
fn published(c: u64) -> Option<(u32, u32, &'static str)> {
    Some(match c {
        8 => (45, 90, "2.0"),
        16 => (52, 160, "3.1"),
        32 => (68, 280, "4.1"),
        64 => (95, 480, "5.1"),
        _ => return None,
    })
}

fn recs(r: &RunResult) -> impl Iterator<Item = &Record> {
    r.records.iter().filter(|x| x.start_s >= SKIP_S)
}

fn ttfts(r: &RunResult, prompt: Option<u32>) -> Vec<f64> {
    recs(r).filter(|x| prompt.is_none_or(|p| x.prompt_tokens == p)).filter_map(|x| x.ttft_ms).collect()
}

/// The mean gap between tokens the client saw, over every class, in ms.
fn itl_mean(r: &RunResult) -> f64 {
    let pairs = r.itl_us.values().flatten();
    let (sum, count) = pairs.fold((0.0, 0u64), |(s, c), &(v, k)| (s + v as f64 * k as f64, c + k));
    if count > 0 {
        sum / count as f64 / 1000.0
    } else {
        f64::NAN
    }
}

/// A histogram's sum and count in a scrape the simulator answered.
fn sim_hist(path: &Path, name: &str) -> Result<(f64, f64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (mut sum, mut count) = (f64::NAN, f64::NAN);
    let last = |l: &str| l.split_whitespace().last().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    for l in text.lines() {
        if l.starts_with(&format!("{name}_sum")) {
            sum = last(l);
        } else if l.starts_with(&format!("{name}_count")) {
            count = last(l);
        }
    }
    Ok((sum, count))
}

/// The engine alone's table (`examples/interference`): by concurrency,
/// requests and TTFT P50 and P99 in ms.
fn engine_rows(path: &Path) -> Result<BTreeMap<u64, (u64, f64, f64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rows = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.trim().trim_matches('|').split('|').map(str::trim).collect();
        if f.len() < 4 || f[0].is_empty() || !f[0].bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
        rows.insert(f[0].parse().unwrap_or(0), (f[1].parse().unwrap_or(0), num(f[2]), num(f[3])));
    }
    Ok(rows)
}

fn cell(t: &[f64]) -> String {
    let (p50, p99) = (pct(t, 0.5), pct(t, 0.99));
    format!("{} / {} ({}, n={})", n(p50, 0), n(p99, 0), n(p99 / p50, 2), t.len())
}

/// `bench report calibration DIR SECS RATES CSECS CONCURRENCIES`.
pub(super) fn calibration(dir: &Path, secs: f64, rates: &str, csecs: &str, concs: &str) -> Result<(), String> {
    let concs: Vec<u64> =
        concs.split_whitespace().map(|c| c.parse().map_err(|_| format!("concurrency {c:?}"))).collect::<Result<_, _>>()?;
    let mut m = Measured::default();
    let mut l: Vec<String> = vec![
        format!("Closed-loop runs {csecs} s, open-loop runs {} s, the first 5 s left out of client statistics.", n(secs, 0)),
        String::new(),
    ];
    agreement(dir, &concs, &mut l, &mut m)?;
    interference(dir, &concs, &mut l, &mut m)?;
    knee(dir, secs, rates, &mut l)?;
    l.extend(
        ["", "Charts of the highest offered load: `r*-ttft-cdf.svg`, `r*-ttft-p99.svg`, `r*-throughput.svg` (run 1's).", ""]
            .map(String::from),
    );
    write(&dir.join("report.md"), &l.join("\n"))?;
    m.write(dir)
}

fn run(dir: &Path, name: &str) -> Result<RunResult, String> {
    load(&dir.join(format!("{name}.json")))
}

/// Part 1: the client's means against the simulator's own, in the same runs.
fn agreement(dir: &Path, concs: &[u64], l: &mut Vec<String>, m: &mut Measured) -> Result<(), String> {
    l.extend(AGREE_HEAD.iter().map(|s| s.to_string()));
    let (mut worst_t, mut worst_i) = (0.0f64, 0.0f64);
    for &c in concs {
        let r = run(dir, &format!("c{c}"))?;
        let t: Vec<f64> = r.records.iter().filter_map(|x| x.ttft_ms).collect();
        let t_client = t.iter().fold(0.0, |a, b| a + b) / t.len().max(1) as f64; // from +0: none reads 0, not -0
        let metrics = dir.join(format!("c{c}.metrics"));
        let (s, count) = sim_hist(&metrics, "vllm:time_to_first_token_seconds")?;
        let (s2, n2) = sim_hist(&metrics, "vllm:inter_token_latency_seconds")?;
        let (t_eng, i_eng, i_client) = (s / count * 1000.0, s2 / n2 * 1000.0, itl_mean(&r));
        worst_t = worst_t.max((t_client - t_eng).abs());
        worst_i = worst_i.max((i_client - i_eng).abs());
        l.push(format!(
            "| {c} | {} | {} | {} | {} | {} | {} | {} / {} |",
            n(t_client, 2),
            n(t_eng, 2),
            signed(t_client - t_eng, 2),
            n(i_client, 2),
            n(i_eng, 2),
            signed(i_client - i_eng, 2),
            r.records.len(),
            count as i64
        ));
    }
    m.stated("agree_ttft_ms", worst_t, format!("{} ms at worst", n(worst_t, 2)));
    m.stated("agree_itl_ms", worst_i, format!("{} ms at worst", n(worst_i, 3)));
    Ok(())
}

type EngineRows = BTreeMap<u64, (u64, f64, f64)>;

fn engine(rows: &EngineRows, c: u64) -> (u64, f64, f64) {
    rows.get(&c).copied().unwrap_or((0, f64::NAN, f64::NAN))
}

/// The engine's P99/P50 TTFT at a concurrency.
fn ratio(rows: &EngineRows, c: u64) -> f64 {
    let e = engine(rows, c);
    e.2 / e.1
}

/// Part 2, batch interference: P99/P50 TTFT by concurrency, over HTTP
/// and from the engine alone, without and with long prompts.
fn interference(dir: &Path, concs: &[u64], l: &mut Vec<String>, m: &mut Measured) -> Result<(), String> {
    l.extend(INTERFERENCE_HEAD.iter().map(|s| s.to_string()));
    let (e512, emix) = (engine_rows(&dir.join("engine-512.md"))?, engine_rows(&dir.join("engine-mix.md"))?);
    for &c in concs {
        let (p50, p99, r) = published(c).ok_or_else(|| format!("no published figures at concurrency {c}"))?;
        let (a, b) = (ttfts(&run(dir, &format!("c{c}"))?, None), ttfts(&run(dir, &format!("m{c}"))?, Some(512)));
        let (ea, eb) = (engine(&e512, c), engine(&emix, c));
        let eng = |e: (u64, f64, f64)| format!("{} / {} ({}, n={})", n(e.1, 0), n(e.2, 0), n(e.2 / e.1, 2), e.0);
        l.push(format!("| {c} | {p50} / {p99} ({r}) | {} | {} | {} | {} |", cell(&a), eng(ea), cell(&b), eng(eb)));
    }
    let mix_ratio = |name: &str, c: u64| -> Result<[f64; 2], String> {
        let t = ttfts(&run(dir, name)?, Some(512));
        Ok([pct(&t, 0.99) / pct(&t, 0.5), ratio(&emix, c)])
    };
    let (lo8, hi64) = (mix_ratio("m8", 8)?, mix_ratio("m64", 64)?);
    let rising = concs.windows(2).all(|w| ratio(&emix, w[0]) < ratio(&emix, w[1]));
    let ratios = concs.iter().map(|&c| n(ratio(&emix, c), 2)).collect::<Vec<_>>().join(", ");
    let listed = concs.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    m.flag("mix_ratio_rises", rising, format!("engine P99/P50 at {listed}: {ratios}"));
    let (first, last) = (concs.first().copied().unwrap_or(0), concs.last().copied().unwrap_or(0));
    let (low, high) = (ratio(&emix, first), ratio(&emix, last));
    m.stated("mix_ratio_low", low, format!("{} at {first} (published 2.0)", n(low, 2)));
    m.stated("mix_ratio_high", high, format!("{} at {last} (published 5.1)", n(high, 2)));
    let span = |v: [f64; 2]| format!("{}-{}", n(v[0].min(v[1]), 1), n(v[0].max(v[1]), 1));
    l.push(String::new());
    l.push(format!(
        "With the published mechanism the P99/P50 ratio goes from {} at 8 concurrent requests to {} at 64 (published: 2.0 to 5.1); \
         on the engine it rises at every step ({}): the shape of the default SLO table. The P99 is near a 400 ms target at 32 and \
         past it at 64, where the published table puts the edge. With identical 512-token prompts the ratio rises only from {} to {} \
         (engine): a collision between equal short prefills costs one more prefill, not a long one.",
        span(lo8),
        span(hi64),
        if rising { "yes" } else { "NO" },
        n(ratio(&e512, 8), 2),
        n(ratio(&e512, 64), 2)
    ));
    Ok(())
}

/// Part 3: the capacity knee under open-loop load.
fn knee(dir: &Path, secs: f64, rates: &str, l: &mut Vec<String>) -> Result<(), String> {
    l.extend(KNEE_HEAD.iter().map(|s| s.to_string()));
    l.push(format!(
        "Requests sent between 5 s and {} s; rates are per second of that window (every request runs to completion after it).",
        n(secs, 0)
    ));
    l.extend(KNEE_TABLE.iter().map(|s| s.to_string()));
    for rate in rates.split_whitespace() {
        let r = run(dir, &format!("r{rate}"))?;
        let rs: Vec<&Record> = recs(&r).filter(|x| x.start_s < secs).collect();
        let span = secs - SKIP_S;
        let ok: Vec<&&Record> = rs.iter().filter(|x| done(x)).collect();
        let good_ttft: Vec<&&&Record> = ok.iter().filter(|x| x.ttft_ms.is_some_and(|t| t <= 300.0)).collect();
        let good = good_ttft.iter().filter(|x| x.itl_over <= x.gaps / 100).count();
        let t: Vec<f64> = ok.iter().filter_map(|x| x.ttft_ms).collect();
        let pairs: Vec<(u64, u64)> = r.itl_us.values().flatten().copied().collect();
        let i99 = pct_pairs(&pairs, 0.99) / 1000.0;
        let late = rs.iter().filter(|x| x.outcome == "timeout").count();
        let per_s = |k: usize| n(k as f64 / span, 2);
        l.push(format!(
            "| {rate} | {} | {} | {} | {} | {} | {} | {late} |",
            per_s(ok.len()),
            per_s(good_ttft.len()),
            per_s(good),
            n(pct(&t, 0.5), 0),
            n(pct(&t, 0.99), 0),
            n(i99, 1)
        ));
    }
    Ok(())
}

const AGREE_HEAD: [&str; 6] = [
    "## 1. Client-side measurements agree with the simulator's own",
    "",
    "Same runs, whole-run means: loadgen (client, includes loopback HTTP and SSE parsing) vs the simulator's `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds` (engine side).",
    "",
    "| concurrency | TTFT mean client ms | TTFT mean engine ms | diff ms | ITL mean client ms | ITL mean engine ms | diff ms | requests client / engine |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|",
];

const INTERFERENCE_HEAD: [&str; 12] = [
    "",
    "The engine counts a request when its first token is produced; a request still waiting at the end of the run is in neither column. Differences are the client's loopback and parsing time (fractions of a millisecond) plus requests in flight at the cut-off.",
    "",
    "## 2. Batch interference (the default SLO table)",
    "",
    "The published reference (70B FP8 on an H100, 512-token prompts) has P99/P50 TTFT rising from 2.0 at 8 concurrent requests to 5.1 at 64, and says where the tail comes from: \"a long-prompt request hitting the queue at the same time as multiple concurrent short requests\", which \"monopolizes prefill capacity for 200-400 ms\". Two workloads, each measured twice: closed loop through loadgen over HTTP, and the engine alone on paused time (`examples/interference.rs`, 20 simulated minutes per level, so the P99 rests on thousands of requests instead of a few hundred).",
    "",
    "- **512 only**: every prompt 512 tokens. The tail comes only from 512-token prefills arriving together; it grows with concurrency, but stays near 2x.",
    "- **512 + 5 % long**: 5 % of requests carry a 4096-token prompt (320 ms of prefill on this profile, 200-400 ms as published for such prompts); the table is the TTFT of the 512-token requests only. This is the published mechanism and its magnitude.",
    "",
    "| concurrent requests | published P50 / P99 ms (ratio) | 512 only, loadgen: P50 / P99 ms (ratio) | 512 only, engine | 512 + 5 % long, loadgen: 512-token requests | 512 + 5 % long, engine |",
    "|---:|---|---|---|---|---|",
];

const KNEE_HEAD: [&str; 6] = [
    "",
    "P50 is one prefill plus the wait for the step in progress (ours is higher than the published figures at low concurrency: a decode step here is 22-25 ms, which a newly arrived request waits out). A loadgen P99 rests on the slowest 1 % of a few hundred to two thousand requests, so it moves by a step time (25-45 ms) from run to run; the engine columns are the stable numbers.",
    "",
    "",
    "## 3. Capacity knee (open loop, Poisson)",
    "",
];

const KNEE_TABLE: [&str; 3] = [
    "",
    "| offered req/s | completed req/s | goodput req/s, TTFT <= 300 ms | goodput req/s, TTFT <= 300 ms and ITL <= 50 ms | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | timeouts |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|",
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_engine_alone_table_is_read_by_concurrency() {
        let dir = tempfile::tempdir().expect("a folder");
        let p = dir.path().join("engine.md");
        std::fs::write(
            &p,
            "| concurrency | n | p50 | p99 |\n|---:|---:|---:|---:|\n| 8 | 1200 | 45.5 | 91.0 |\n| 64 | 900 | 95 | 480.25 |\n",
        )
        .expect("write");
        let rows = super::engine_rows(&p).expect("read");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[&8], (1200, 45.5, 91.0));
        assert_eq!(rows[&64], (900, 95.0, 480.25));
    }
}
