//! What prefix-aware routing costs per decision and per indexed prompt, on
//! this machine. A measurement, not a test: it prints a Markdown table and
//! asserts nothing; `loadtest/bench/prefix.sh` puts it in its report.
//!
//! cargo run --release --example prefix_cost -- [PREFIXES [BLOCKS [REPLICAS]]]
//!
//! Defaults: 10,000 prompts of 10 blocks (2,560 bytes each) indexed over 4
//! replicas, then 100,000 decisions for prompts drawn from them.

use std::time::Duration;

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn main() -> Result<(), String> {
    let arg = |i: usize, default: usize| -> Result<usize, String> {
        std::env::args().nth(i).map_or(Ok(default), |s| s.parse().map_err(|e| format!("argument {i} ({s}): {e}")))
    };
    let (prefixes, blocks, replicas) = (arg(1, 10_000)?, arg(2, 10)?, arg(3, 4)?);
    let samples = 100_000;
    let before = rss_kb();
    let mut times = slogate::benching::prefix_decisions(replicas, prefixes, blocks, samples);
    let after = rss_kb();
    if times.is_empty() {
        return Err("no decision was made".into());
    }
    times.sort();
    let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    // Hashing a prompt of this size, for comparison (the request path does it once).
    let text = vec![b'x'; blocks * 256];
    let t = tokio::time::Instant::now();
    for _ in 0..10_000 {
        std::hint::black_box(slogate::benching::prompt_blocks(std::hint::black_box(&text), 256, blocks));
    }
    let hash = t.elapsed() / 10_000;
    println!("| indexed prompts | blocks each | names | replicas | decision p50 µs | p99 µs | max µs | hashing a prompt µs | memory (RSS) per name |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let names = prefixes * blocks;
    println!(
        "| {prefixes} | {blocks} | {names} | {replicas} | {:.1} | {:.1} | {:.1} | {:.1} | {} B |",
        us(q(0.5)),
        us(q(0.99)),
        us(q(1.0)),
        us(hash),
        (after.saturating_sub(before) * 1024) / names.max(1) as u64
    );
    Ok(())
}
