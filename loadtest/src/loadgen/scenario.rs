//! A load scenario: where to send, for how long, and which streams of
//! traffic (class, key, endpoint, arrivals, prompt and output lengths).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Exp, LogNormal};
use serde::{Deserialize, Serialize};

pub use super::datasets::Dataset;
pub use super::prompt::{estimate_tokens, Prompt};

fn dur<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(serde::de::Error::custom)
}

fn ser_dur<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Base URL; only loopback hosts are accepted. Several URLs separated by
    /// commas are used in turn, request by request (client-side round robin,
    /// as a plain Kubernetes Service would spread load without a gateway).
    pub target: String,
    #[serde(deserialize_with = "dur", serialize_with = "ser_dur")]
    pub duration: Duration,
    /// Stop after this many requests in total.
    #[serde(default = "default_max")]
    pub max_requests: u64,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Requests sent in the first `warmup` are run but left out of summaries
    /// (connection set-up storms, cold pools).
    #[serde(default, deserialize_with = "dur", serialize_with = "ser_dur")]
    pub warmup: Duration,
    /// Give up on a request after this long.
    #[serde(default = "default_timeout", deserialize_with = "dur", serialize_with = "ser_dur")]
    pub request_timeout: Duration,
    /// Class targets for SLO attainment; defaults to the default SLO table.
    #[serde(default = "default_targets")]
    pub classes: BTreeMap<String, Targets>,
    /// Which event of a stream is its first token (see [`TtftDefinition`]).
    #[serde(default)]
    pub ttft: TtftDefinition,
    pub streams: Vec<StreamSpec>,
}

/// When a stream's first token came: the clock TTFT stops and ITL starts.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum TtftDefinition {
    /// The first event carrying generated text (or a tool call): what a user
    /// sees; vLLM's empty role chunk does not count. ITL: gaps between
    /// content events.
    #[default]
    FirstContent,
    /// The first event with a non-empty `choices` list, the role chunk
    /// included, as `vllm bench serve` counts it. ITL: gaps between all
    /// events with choices.
    FirstChoices,
}

impl TtftDefinition {
    pub fn as_str(self) -> &'static str {
        match self {
            TtftDefinition::FirstContent => "first_content",
            TtftDefinition::FirstChoices => "first_choices",
        }
    }
}

fn default_max() -> u64 {
    1_000_000
}
fn default_seed() -> u64 {
    1
}
fn default_timeout() -> Duration {
    Duration::from_secs(300)
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    pub ttft_ms: f64,
    pub itl_ms: f64,
}

pub fn default_targets() -> BTreeMap<String, Targets> {
    [
        ("chat", 300.0, 50.0),
        ("voice", 150.0, 30.0),
        ("code-inline", 100.0, 25.0),
        ("code-panel", 300.0, 50.0),
        ("rag", 400.0, 80.0),
        ("batch", 3000.0, 200.0),
    ]
    .into_iter()
    .map(|(n, t, i)| (n.to_string(), Targets { ttft_ms: t, itl_ms: i }))
    .collect()
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Chat,
    Completions,
    /// `/v1/embeddings`: the prompt as `input`, a whole answer (never streamed).
    Embeddings,
    /// `/v1/audio/transcriptions`: a multipart form of an `upload_bytes`
    /// `file` part, then `model` (the last field, so a gateway reads the
    /// whole form to route it); a whole answer (never streamed).
    Transcriptions,
}

impl Endpoint {
    /// Its answer is one JSON body, whatever `stream` says.
    pub fn whole_answer(self) -> bool {
        matches!(self, Endpoint::Embeddings | Endpoint::Transcriptions)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    pub name: String,
    /// Sent as `x-slo-class` (omitted when null).
    #[serde(default)]
    pub class: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    pub model: String,
    #[serde(default = "default_endpoint")]
    pub endpoint: Endpoint,
    #[serde(default = "default_true")]
    pub stream: bool,
    pub arrival: Arrival,
    /// Prompt and output lengths, unless a `dataset` gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<LenDist>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<LenDist>,
    /// Prompts from one of `vllm bench serve`'s datasets instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<Dataset>,
    /// Chat: spread the prompt over a conversation of this many messages (a
    /// system prompt, then alternating user/assistant turns ending with the
    /// user), as a multi-turn chat history looks. 1 = one user message.
    #[serde(default = "default_turns")]
    pub turns: u32,
    /// Speak HTTP/2 (cleartext, prior knowledge): every request of the
    /// stream to a target is a stream on one connection, as a client that
    /// multiplexes does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http2: bool,
    /// This stream's own target(s), instead of the scenario's: one run can
    /// then send part of its traffic straight to a replica and part through
    /// a gateway, so both see the same engine steps at the same moments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `transcriptions`: the size of the form's `file` part, in bytes
    /// (OpenAI takes up to 25 MB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_bytes: Option<u64>,
}

/// Draws a stream's requests: lengths from distributions, or a dataset.
/// A clone shares a dataset's place (each prompt is taken once, in turn,
/// by all of a stream's clients).
#[derive(Clone)]
pub enum PromptSampler {
    Lengths { prompt: Sampler, output: Sampler },
    Texts { prompts: std::sync::Arc<Vec<Prompt>>, next: std::sync::Arc<std::sync::atomic::AtomicUsize> },
}

impl PromptSampler {
    /// Prompts taken in turn by all of a stream's clients.
    pub fn texts(prompts: Vec<Prompt>) -> PromptSampler {
        PromptSampler::Texts { prompts: std::sync::Arc::new(prompts), next: Default::default() }
    }

    pub fn sample(&mut self, rng: &mut StdRng) -> Prompt {
        match self {
            PromptSampler::Lengths { prompt, output } => {
                Prompt { text: None, prompt_tokens: prompt.sample(rng), output_tokens: output.sample(rng) }
            }
            PromptSampler::Texts { prompts, next } => {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prompts[i % prompts.len()].clone()
            }
        }
    }
}

/// A ShareGPT file's prompts, shuffled by `seed`.
pub fn sharegpt(path: &std::path::Path, output_len: Option<u32>, seed: u64) -> Result<Vec<Prompt>, String> {
    #[derive(Deserialize)]
    struct Conversation {
        #[serde(default)]
        conversations: Vec<Turn>,
    }
    #[derive(Deserialize)]
    struct Turn {
        value: String,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let all: Vec<Conversation> =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a ShareGPT JSON array of conversations: {e}", path.display()))?;
    let mut out: Vec<Prompt> = all
        .into_iter()
        .filter(|c| c.conversations.len() >= 2)
        .map(|c| Prompt {
            prompt_tokens: estimate_tokens(&c.conversations[0].value),
            output_tokens: output_len.unwrap_or_else(|| estimate_tokens(&c.conversations[1].value)),
            text: Some(c.conversations[0].value.as_str().into()),
        })
        .collect();
    if out.is_empty() {
        return Err(format!("{}: no conversation with at least two turns", path.display()));
    }
    use rand::seq::SliceRandom;
    out.shuffle(&mut <StdRng as rand::SeedableRng>::seed_from_u64(seed));
    Ok(out)
}

impl StreamSpec {
    /// What draws this stream's requests (a dataset file is read here).
    pub fn sampler(&self, seed: u64) -> Result<PromptSampler, String> {
        let ctx = |e: String| format!("stream {}: {e}", self.name);
        match (self.endpoint, self.upload_bytes, &self.dataset) {
            // A form carries a file, not a prompt: one token each way, as counted.
            (Endpoint::Transcriptions, Some(_), None) if self.prompt_tokens.is_none() && self.output_tokens.is_none() => {
                let one = || LenDist::Fixed { value: 1 }.sampler();
                return Ok(PromptSampler::Lengths { prompt: one()?, output: one()? });
            }
            (Endpoint::Transcriptions, _, _) => {
                return Err(ctx("transcriptions: upload_bytes gives the form's file; no prompt_tokens, output_tokens or dataset".into()))
            }
            (_, Some(_), _) => return Err(ctx("upload_bytes is for endpoint: transcriptions".into())),
            _ => {}
        }
        match (&self.dataset, &self.prompt_tokens, &self.output_tokens) {
            (Some(Dataset::Sharegpt { path, output_len }), None, None) => {
                let prompts = sharegpt(path, *output_len, seed).map_err(ctx)?;
                Ok(PromptSampler::Texts { prompts: std::sync::Arc::new(prompts), next: Default::default() })
            }
            (Some(Dataset::Random { input_len, output_len, range_ratio }), None, None) => {
                if !(0.0..1.0).contains(range_ratio) {
                    return Err(ctx(format!("random: range_ratio {range_ratio} must be in [0, 1)")));
                }
                let range = |len: u32| {
                    let (lo, hi) = (len as f64 * (1.0 - range_ratio), len as f64 * (1.0 + range_ratio));
                    LenDist::Uniform { min: (lo.floor() as u32).max(1), max: (hi.floor() as u32).max(1) }
                };
                Ok(PromptSampler::Lengths { prompt: range(*input_len).sampler()?, output: range(*output_len).sampler()? })
            }
            (Some(Dataset::SharedPrefix { groups, prompts_per_group, system_prompt_len, question_len, output_len }), None, None) => {
                let shape = super::datasets::SharedPrefix {
                    tag: &self.name,
                    groups: *groups,
                    prompts_per_group: *prompts_per_group,
                    system_len: *system_prompt_len,
                    question_len: *question_len,
                    output_len: *output_len,
                };
                Ok(PromptSampler::texts(shape.prompts(seed).map_err(ctx)?))
            }
            (Some(Dataset::Conversations { conversations, turns, system_prompt_len, turn_len, output_len, shared_system }), None, None) => {
                let shape = super::datasets::Conversations {
                    tag: &self.name,
                    conversations: *conversations,
                    turns: *turns,
                    system_len: *system_prompt_len,
                    turn_len: *turn_len,
                    output_len: *output_len,
                    shared_system: *shared_system,
                };
                Ok(PromptSampler::texts(shape.prompts().map_err(ctx)?))
            }
            (None, Some(p), Some(o)) => Ok(PromptSampler::Lengths { prompt: p.sampler()?, output: o.sampler()? }),
            (Some(_), _, _) => Err(ctx("a dataset gives the lengths: leave out prompt_tokens and output_tokens".into())),
            (None, _, _) => Err(ctx("prompt_tokens and output_tokens are required (or a dataset)".into())),
        }
    }
}

fn default_turns() -> u32 {
    1
}

fn default_endpoint() -> Endpoint {
    Endpoint::Chat
}
fn default_true() -> bool {
    true
}

/// How requests of a stream arrive.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Arrival {
    /// Poisson arrivals at `rate` per second (open loop).
    Poisson { rate: f64 },
    /// Evenly spaced arrivals at `rate` per second (open loop).
    Constant { rate: f64 },
    /// Batches arrive as a Poisson process at `rate`; each holds `size` requests (M^X).
    Batch { rate: f64, size: LenDist },
    /// Poisson arrivals whose rate moves linearly to each stage's `rate` over its duration (ramp, spike, soak).
    Stages { stages: Vec<Stage> },
    /// `concurrency` clients, each sending its next request when the last ends
    /// (closed loop). With `ramp`, client i of N starts i/N of it after the
    /// run's start (N clients arriving over the ramp, as users do), not all
    /// at the same instant.
    Closed {
        concurrency: usize,
        #[serde(default, deserialize_with = "dur", serialize_with = "ser_dur", skip_serializing_if = "Duration::is_zero")]
        ramp: Duration,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    #[serde(deserialize_with = "dur", serialize_with = "ser_dur")]
    pub duration: Duration,
    pub rate: f64,
}

/// A token-count distribution.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum LenDist {
    Fixed {
        value: u32,
    },
    Uniform {
        min: u32,
        max: u32,
    },
    Lognormal {
        median: f64,
        sigma: f64,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Values replayed in order (cycling) from a JSONL file's `field`.
    Trace {
        path: PathBuf,
        field: String,
    },
    /// A mixture: each draw picks a part with probability proportional to its
    /// weight, then draws from it (e.g. mostly short prompts, a few long ones).
    Mix {
        parts: Vec<MixPart>,
    },
}

/// One part of a [`LenDist::Mix`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixPart {
    pub weight: f64,
    pub len: LenDist,
}

impl LenDist {
    pub fn sampler(&self) -> Result<Sampler, String> {
        Ok(match self {
            LenDist::Fixed { value } => Sampler::Fixed((*value).max(1)),
            LenDist::Uniform { min, max } if min <= max => Sampler::Uniform(*min, *max),
            LenDist::Uniform { .. } => return Err("uniform: min must not exceed max".into()),
            LenDist::Lognormal { median, sigma, max } => {
                let d = LogNormal::new(median.max(1.0).ln(), *sigma).map_err(|e| format!("lognormal: {e}"))?;
                Sampler::Lognormal(d, max.unwrap_or(u32::MAX))
            }
            LenDist::Trace { path, field } => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let vals: Vec<u32> = text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v.get(field)?.as_u64()).map(|n| n as u32))
                    .collect::<Option<_>>()
                    .ok_or_else(|| format!("{}: every line needs a numeric `{field}`", path.display()))?;
                if vals.is_empty() {
                    return Err(format!("{}: empty trace", path.display()));
                }
                Sampler::Trace(vals, 0)
            }
            LenDist::Mix { parts } => {
                if parts.is_empty() {
                    return Err("mix: needs at least one part".into());
                }
                if let Some(bad) = parts.iter().find(|p| !(p.weight.is_finite() && p.weight >= 0.0)) {
                    return Err(format!("mix: weight {} must be a finite number >= 0", bad.weight));
                }
                let total: f64 = parts.iter().map(|p| p.weight).sum();
                if total <= 0.0 {
                    return Err("mix: the weights must not all be 0".into());
                }
                let mut acc = 0.0;
                let mut out = Vec::with_capacity(parts.len());
                for p in parts {
                    acc += p.weight / total;
                    out.push((acc, p.len.sampler()?));
                }
                Sampler::Mix(out)
            }
        })
    }
}

#[derive(Clone)]
pub enum Sampler {
    Fixed(u32),
    Uniform(u32, u32),
    Lognormal(LogNormal<f64>, u32),
    Trace(Vec<u32>, usize),
    /// Parts with their cumulative probability (the last is 1).
    Mix(Vec<(f64, Sampler)>),
}

impl Sampler {
    pub fn sample(&mut self, rng: &mut StdRng) -> u32 {
        match self {
            Sampler::Fixed(n) => *n,
            Sampler::Uniform(a, b) => rng.random_range(*a..=*b).max(1),
            Sampler::Lognormal(d, max) => (d.sample(rng).round() as u32).clamp(1, *max),
            Sampler::Trace(v, i) => {
                let x = v[*i % v.len()];
                *i += 1;
                x.max(1)
            }
            Sampler::Mix(parts) => {
                let u: f64 = rng.random();
                let last = parts.len() - 1;
                let idx = parts.iter().position(|(cum, _)| u < *cum).unwrap_or(last);
                parts[idx].1.sample(rng)
            }
        }
    }
}

fn split_targets(list: &str) -> Vec<String> {
    list.split(',').map(|t| t.trim().trim_end_matches('/').to_string()).filter(|t| !t.is_empty()).collect()
}

impl Arrival {
    /// Arrival offsets from the start, within `duration` (open-loop kinds only).
    pub fn schedule(&self, duration: Duration, limit: u64, rng: &mut StdRng) -> Result<Vec<Duration>, String> {
        let end = duration.as_secs_f64();
        let mut out = Vec::new();
        let exp = |rate: f64| Exp::new(rate).map_err(|e| format!("rate {rate}: {e}"));
        match self {
            Arrival::Closed { .. } => {}
            Arrival::Poisson { rate } | Arrival::Batch { rate, .. } if *rate <= 0.0 => return Err("rate must be above 0".into()),
            Arrival::Poisson { rate } => {
                let d = exp(*rate)?;
                let mut t = d.sample(rng);
                while t < end && (out.len() as u64) < limit {
                    out.push(Duration::from_secs_f64(t));
                    t += d.sample(rng);
                }
            }
            Arrival::Constant { rate } => {
                if *rate <= 0.0 {
                    return Err("rate must be above 0".into());
                }
                // i / rate, not a running sum: no drift past `end`.
                let n = ((end * rate).ceil() as u64).min(limit);
                out.extend((0..n).map(|i| i as f64 / rate).filter(|t| *t < end).map(Duration::from_secs_f64));
            }
            Arrival::Batch { rate, size } => {
                let d = exp(*rate)?;
                let mut s = size.sampler()?;
                let mut t = d.sample(rng);
                while t < end && (out.len() as u64) < limit {
                    for _ in 0..s.sample(rng) {
                        out.push(Duration::from_secs_f64(t));
                    }
                    t += d.sample(rng);
                }
                out.truncate(limit as usize);
            }
            Arrival::Stages { stages } => {
                let max_rate = stages.iter().map(|s| s.rate).fold(0.0, f64::max);
                if max_rate <= 0.0 {
                    return Err("stages need a rate above 0".into());
                }
                // Thinning: candidates at the peak rate, kept with probability rate(t)/peak.
                let d = exp(max_rate)?;
                let rate_at = |t: f64| {
                    let (mut start, mut prev) = (0.0, 0.0);
                    for s in stages {
                        let len = s.duration.as_secs_f64();
                        if t < start + len {
                            return prev + (s.rate - prev) * (t - start) / len.max(1e-9);
                        }
                        start += len;
                        prev = s.rate;
                    }
                    prev
                };
                let stage_end: f64 = stages.iter().map(|s| s.duration.as_secs_f64()).sum();
                let mut t = d.sample(rng);
                while t < end.min(stage_end) && (out.len() as u64) < limit {
                    if rng.random::<f64>() * max_rate < rate_at(t) {
                        out.push(Duration::from_secs_f64(t));
                    }
                    t += d.sample(rng);
                }
            }
        }
        Ok(out)
    }
}

impl Scenario {
    pub fn load(path: &std::path::Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let s: Scenario = serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        s.check()?;
        Ok(s)
    }

    /// The target base URLs, without trailing slashes.
    pub fn targets(&self) -> Vec<String> {
        split_targets(&self.target)
    }

    /// The base URLs `stream` sends to, in turn: its own, or the scenario's.
    pub fn targets_of(&self, stream: &StreamSpec) -> Vec<String> {
        stream.target.as_deref().map_or_else(|| self.targets(), split_targets)
    }

    /// Refuse anything but loopback targets and empty scenarios.
    pub fn check(&self) -> Result<(), String> {
        if self.targets().is_empty() {
            return Err("target: at least one URL is required".into());
        }
        let own = self.streams.iter().filter_map(|s| s.target.as_deref().map(|t| (s, split_targets(t))));
        for (s, t) in own {
            if t.is_empty() {
                return Err(format!("stream {}: target: at least one URL is required", s.name));
            }
        }
        for t in self.targets().into_iter().chain(self.streams.iter().flat_map(|s| self.targets_of(s))) {
            let uri: http::Uri = t.parse().map_err(|e| format!("target {t}: {e}"))?;
            let host = uri.host().unwrap_or("");
            let loopback = host == "localhost"
                || host.trim_matches(|c| c == '[' || c == ']').parse::<std::net::IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false);
            if !loopback {
                return Err(format!("target {t}: loadgen only sends to loopback addresses (127.0.0.0/8, ::1, localhost)"));
            }
        }
        if self.streams.is_empty() {
            return Err("streams: at least one stream is required".into());
        }
        if self.duration.is_zero() {
            return Err("duration must be above 0".into());
        }
        Ok(())
    }
}
