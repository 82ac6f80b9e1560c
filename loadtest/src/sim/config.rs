//! Simulator parameters and the two built-in profiles.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything that shapes one simulated vLLM replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Served model name.
    pub model: String,
    pub max_model_len: u32,
    /// Fixed cost of one engine step (scheduling, sampling, kernel launches), in ms.
    pub step_base_ms: f64,
    /// Decode cost per running sequence per step (β grows with batch), in ms.
    pub decode_per_seq_ms: f64,
    /// Prefill cost per prompt token (α), in ms.
    pub prefill_per_token_ms: f64,
    /// vLLM `--max-num-seqs`: the running batch cap.
    pub max_num_seqs: usize,
    /// vLLM `--max-num-batched-tokens`: tokens per step (decodes + prefill chunks).
    pub max_num_batched_tokens: u32,
    /// KV cache capacity in blocks of `block_size` tokens.
    pub kv_blocks: u32,
    pub block_size: u32,
    /// Bound on the waiting queue (503 past it); `None` = unbounded, as vLLM.
    pub max_waiting: Option<usize>,
    /// Order the waiting queue by the request's `priority` (lower first), as
    /// vLLM `--scheduling-policy priority`.
    pub priority_scheduling: bool,
    /// Output length when the request gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// Without `ignore_eos`, a request stops (`stop`) after a natural length
    /// drawn uniformly from this share of its `max_tokens`: `[lo, hi]`.
    pub natural_stop: Option<(f64, f64)>,
    /// Length of the fixed embedding vectors.
    pub embedding_dim: usize,
    /// Benchmarks only: every streamed chunk carries `sim_rx_ns` (when the
    /// request arrived) and `sim_t_ns` (when the chunk was handed to the
    /// connection), Unix-epoch nanoseconds, so a client on the same machine
    /// can tell the path's share of TTFT and ITL from the engine's.
    pub stamp_events: bool,
    /// Benchmarks only: steps end on a grid of `step_base_ms` (shared by the
    /// replicas of one process), this share of a step into it, `[0, 1)`.
    /// Replicas with different phases step at different instants, as the
    /// replicas of a fleet do, so a gateway in front of many of them sees
    /// tokens spread over time rather than all at once.
    pub step_phase: Option<f64>,
    pub faults: FaultConfig,
    /// The model's `tokenizer.json` (its chat template beside it): prompts
    /// are counted and their blocks named by the token ids vLLM would
    /// compute. Without it a token is four characters of the prompt.
    pub tokenizer: Option<std::path::PathBuf>,
    /// Publish KV events as vLLM's `--kv-events-config` does, on this port
    /// of the replica's address (needs `tokenizer`: the events carry token ids).
    pub kv_events_port: Option<u16>,
    /// The replay socket's port (vLLM's `replay_endpoint`).
    pub kv_events_replay_port: Option<u16>,
}

/// Faults, switchable at start and at run time (`POST /admin/faults`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Share of requests answered with an HTTP error (half 500, half 503).
    pub error_rate: f64,
    /// Share of streams that end in a `data: {"error": ...}` event midway.
    pub stream_error_rate: f64,
    /// Share of streams cut (connection closed) midway.
    pub cut_rate: f64,
    /// Stop producing tokens for this many seconds (from when it is set).
    pub stall_secs: f64,
    /// Multiply every step time by this (1.0 = normal; 0 is treated as 1).
    pub slowdown: f64,
    /// `/health` answers 503.
    pub health_fail: bool,
    /// `/health` answers only after this many seconds (a health endpoint
    /// slow under load); 0 = at once.
    pub health_delay_secs: f64,
    /// Stop the replica (the process exits; in-process, the server stops).
    pub exit: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Profile::Llama8bH100.config()
    }
}

/// Built-in hardware/model profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// An 8B model on one H100: ~6 ms steps, ~15 ms prefill for 512 tokens.
    Llama8bH100,
    /// A 70B FP8 model on one H100: ~40 ms prefill for 512
    /// tokens, ~25 ms decode steps, KV for ~64k tokens.
    Llama70bFp8H100,
}

impl Profile {
    pub fn config(self) -> SimConfig {
        match self {
            Profile::Llama8bH100 => SimConfig {
                model: "sim-llama-8b".into(),
                max_model_len: 8192,
                step_base_ms: 6.0,
                decode_per_seq_ms: 0.05,
                prefill_per_token_ms: 0.03,
                max_num_seqs: 256,
                max_num_batched_tokens: 2048,
                kv_blocks: 29_000,
                block_size: 16,
                max_waiting: None,
                priority_scheduling: false,
                default_max_tokens: 256,
                natural_stop: None,
                embedding_dim: 16,
                stamp_events: false,
                step_phase: None,
                faults: FaultConfig::default(),
                tokenizer: None,
                kv_events_port: None,
                kv_events_replay_port: None,
            },
            Profile::Llama70bFp8H100 => SimConfig {
                model: "sim-llama-70b-fp8".into(),
                step_base_ms: 22.0,
                decode_per_seq_ms: 0.3,
                prefill_per_token_ms: 0.078,
                max_num_seqs: 64,
                kv_blocks: 4096,
                ..Profile::Llama8bH100.config()
            },
        }
    }
}

impl SimConfig {
    /// The modelled time of one step: the larger of its memory-bound part
    /// (weights and KV read once per step: `step_base + decode_per_seq x
    /// decodes`) and its compute-bound part (`prefill_per_token x` every token
    /// processed, prefill chunks and one per decode). A lone decode batch is
    /// memory-bound; a step carrying big prefill chunks is compute-bound, so
    /// decodes ride along with a prefill for free and colliding prefills add up.
    pub fn step_time(&self, decodes: usize, prefill_tokens: u32, slowdown: f64) -> Duration {
        let memory = self.step_base_ms + self.decode_per_seq_ms * decodes as f64;
        let compute = self.prefill_per_token_ms * (prefill_tokens as f64 + decodes as f64);
        let ms = memory.max(compute);
        let factor = if slowdown > 0.0 { slowdown } else { 1.0 };
        Duration::from_secs_f64((ms * factor).max(0.0) / 1000.0)
    }
}
