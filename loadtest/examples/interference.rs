//! A demo, not a test: it prints the batch-interference table from the
//! engine alone, on paused time (P50/P99 TTFT of 512-token requests under a
//! closed loop at 8, 16, 32 and 64 concurrent requests, 70B FP8 profile, 600
//! simulated seconds each) and asserts nothing. `loadtest/run calibration` puts
//! it beside published figures; the shape it shows (the tail grows with
//! concurrency when long prompts are mixed in) is asserted by the engine
//! test `long_prompts_make_the_ttft_tail_grow_with_concurrency`.
//!
//! cargo run --release -p slogate-loadtest --example interference -- [LONG_SHARE [LONG_PROMPT [SECONDS]]]
//!
//! LONG_SHARE of the requests (default 0) carry a LONG_PROMPT-token prompt
//! (default 4096); only the 512-token requests are measured. Prints a
//! Markdown table.

use std::time::Duration;

use loadtest::loadgen::scenario::LenDist;
use loadtest::sim::sweep::{closed_loop, ClosedLoop};
use loadtest::sim::Profile;

fn main() -> Result<(), String> {
    let arg = |i: usize, default: f64| -> Result<f64, String> {
        std::env::args().nth(i).map_or(Ok(default), |s| s.parse().map_err(|e| format!("argument {i} ({s}): {e}")))
    };
    let (long_share, long_prompt, secs) = (arg(1, 0.0)?, arg(2, 4096.0)? as u32, arg(3, 600.0)?);
    println!("| concurrent requests | measured requests | P50 TTFT ms | P99 TTFT ms | P99/P50 |");
    println!("|---:|---:|---:|---:|---:|");
    for c in [8usize, 16, 32, 64] {
        let spec = ClosedLoop {
            concurrency: c,
            prompt_tokens: 512,
            output_tokens: LenDist::Uniform { min: 64, max: 256 },
            long_share,
            long_prompt_tokens: long_prompt,
            warmup: Duration::from_secs(30),
            duration: Duration::from_secs_f64(secs),
            seed: 7,
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().map_err(|e| e.to_string())?;
        let t = rt.block_on(closed_loop(Profile::Llama70bFp8H100.config(), &spec))?;
        let (p50, p99) = (t.ms_at(0.5), t.ms_at(0.99));
        println!("| {c} | {} | {p50:.1} | {p99:.1} | {:.2} |", t.micros.len(), p99 / p50);
    }
    Ok(())
}
