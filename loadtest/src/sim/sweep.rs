//! The engine alone under a closed loop, on whatever clock the runtime has:
//! on paused tokio time, ten simulated minutes take seconds, which gives the
//! batch-interference table enough requests for a stable P99.
//!
//! `concurrency` clients each submit a request, read its tokens to the end
//! and submit the next at once (as `benchmark_serving --max-concurrency`).
//! A share of requests can carry a long prompt (the "long-prompt
//! request hitting the queue"); the TTFT of the others is what is measured.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::config::{FaultConfig, SimConfig};
use super::engine::{Engine, Event, Faults, SeqRequest};
use super::metrics::SimMetrics;
use crate::loadgen::scenario::LenDist;

/// One closed-loop run.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    pub concurrency: usize,
    /// Prompt of the measured requests.
    pub prompt_tokens: u32,
    pub output_tokens: LenDist,
    /// Share of requests sent with `long_prompt_tokens` instead (not measured).
    pub long_share: f64,
    pub long_prompt_tokens: u32,
    /// Run, but left out of the statistics.
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
}

/// TTFT of the measured requests sent after the warm-up, in microseconds.
pub struct Ttft {
    pub micros: Histogram<u64>,
}

impl Ttft {
    pub fn ms_at(&self, q: f64) -> f64 {
        self.micros.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Drive one engine with `spec` and return the measured TTFTs.
pub async fn closed_loop(cfg: SimConfig, spec: &ClosedLoop) -> Result<Ttft, String> {
    let metrics = Arc::new(SimMetrics::new(&cfg.model, cfg.kv_blocks, cfg.block_size));
    let (engine, task) = Engine::start(Arc::new(cfg), metrics, Arc::new(Faults::new(FaultConfig::default())));
    let start = Instant::now();
    let (from, until) = (start + spec.warmup, start + spec.warmup + spec.duration);
    let hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())?;
    let hist = Arc::new(Mutex::new(hist));
    let mut clients = Vec::with_capacity(spec.concurrency);
    for i in 0..spec.concurrency {
        let (engine, hist, spec) = (engine.clone(), hist.clone(), spec.clone());
        let mut output = spec.output_tokens.sampler()?;
        clients.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(spec.seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
            while Instant::now() < until {
                let long = spec.long_share > 0.0 && rng.random_bool(spec.long_share.min(1.0));
                let prompt = if long { spec.long_prompt_tokens } else { spec.prompt_tokens };
                let max_tokens = output.sample(&mut rng);
                let sent = Instant::now();
                let req = SeqRequest::new(prompt, max_tokens);
                let mut rx = engine.submit(req).map_err(|e| format!("engine refused a request: {e:?}"))?;
                let mut first = true;
                while let Some(ev) = rx.recv().await {
                    let Event::Token { finish, .. } = ev else { break };
                    if first && !long && sent >= from && sent < until {
                        let us = (Instant::now() - sent).as_micros() as u64;
                        hist.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(us);
                    }
                    first = false;
                    if finish.is_some() {
                        break;
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for c in clients {
        c.await.map_err(|e| e.to_string())??;
    }
    task.abort();
    let micros = hist.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Ttft { micros })
}
