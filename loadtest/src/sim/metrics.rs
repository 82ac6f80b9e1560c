//! The simulator's `/metrics`, with vLLM's metric names and bucket boundaries.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
const ITL_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];

/// `vllm:cache_config_info`'s labels (vLLM writes every field of its cache
/// config; these are the ones a router reads).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CacheConfig {
    block_size: String,
    enable_prefix_caching: String,
    num_gpu_blocks: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Reason {
    finished_reason: String,
}

pub struct SimMetrics {
    registry: Registry,
    pub running: Gauge,
    pub waiting: Gauge,
    pub kv_usage: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub preemptions: Counter,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    success: Family<Reason, Counter>,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub prefix_cache_queries: Counter,
    pub prefix_cache_hits: Counter,
}

impl SimMetrics {
    /// `kv_blocks` blocks of `block_size` tokens: its cache, as vLLM's info series states it.
    pub fn new(model: &str, kv_blocks: u32, block_size: u32) -> SimMetrics {
        let mut registry =
            Registry::with_labels([(std::borrow::Cow::Borrowed("model_name"), std::borrow::Cow::Owned(model.to_string()))].into_iter());
        let m = SimMetrics {
            registry: Registry::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            preemptions: Counter::default(),
            ttft: Histogram::new(TTFT_BUCKETS.iter().copied()),
            itl: Histogram::new(ITL_BUCKETS.iter().copied()),
            e2e: Histogram::new(E2E_BUCKETS.iter().copied()),
            success: Family::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            prefix_cache_queries: Counter::default(),
            prefix_cache_hits: Counter::default(),
        };
        registry.register("vllm:num_requests_running", "Number of requests in model execution batches", m.running.clone());
        registry.register("vllm:num_requests_waiting", "Number of requests waiting to be processed", m.waiting.clone());
        registry.register("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent usage", m.kv_usage.clone());
        registry.register("vllm:num_preemptions", "Cumulative number of preemptions from the engine", m.preemptions.clone());
        registry.register("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds", m.ttft.clone());
        registry.register("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds", m.itl.clone());
        registry.register("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds", m.e2e.clone());
        registry.register("vllm:request_success", "Count of successfully processed requests", m.success.clone());
        registry.register("vllm:prompt_tokens", "Number of prefill tokens processed", m.prompt_tokens.clone());
        registry.register("vllm:generation_tokens", "Number of generation tokens processed", m.generation_tokens.clone());
        registry.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens",
            m.prefix_cache_queries.clone(),
        );
        registry.register("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens", m.prefix_cache_hits.clone());
        let cache = Family::<CacheConfig, Gauge>::default();
        cache
            .get_or_create(&CacheConfig {
                block_size: block_size.to_string(),
                enable_prefix_caching: "True".into(),
                num_gpu_blocks: kv_blocks.to_string(),
            })
            .set(1);
        registry.register("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", cache);
        SimMetrics { registry, ..m }
    }

    pub fn finished(&self, reason: Finish, e2e: f64, prompt: u32, generated: u32) {
        self.e2e.observe(e2e);
        self.success.get_or_create(&Reason { finished_reason: reason.as_str().into() }).inc();
        self.prompt_tokens.inc_by(prompt as u64);
        self.generation_tokens.inc_by(generated as u64);
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// Why a sequence ended: its stop, or its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}
