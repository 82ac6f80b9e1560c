//! One class's figures over a run, as the report and vLLM's own benchmark
//! format both carry them.

use serde::{Deserialize, Serialize};

/// A class's requests and outcomes, its latency percentiles, what it
/// attained of its targets, and its rates.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClassSummary {
    pub requests: u64,
    pub completed: u64,
    pub rejected: u64,
    pub errors: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p90_ms: f64,
    pub itl_p99_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p99_ms: f64,
    /// Share of requests (all outcomes) completed within the class targets.
    pub slo_attainment: f64,
    /// Requests per second completed within targets.
    pub goodput_rps: f64,
    pub throughput_rps: f64,
    pub tokens_per_s: f64,
    pub ttft_target_ms: Option<f64>,
    pub itl_target_ms: Option<f64>,
}
