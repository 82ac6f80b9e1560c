//! A pool's configuration: its replicas, how slots are counted and picked,
//! health checks, timeouts, TLS towards replicas, the engine it runs, and
//! the paths it opens beyond the inference endpoints.

use serde::{Deserialize, Deserializer, Serialize};

use super::auth::ExtraPath;
use super::units::{Dur, Size};

/// The OpenAI-compatible engine behind a pool. Streams are measured the
/// same way for all (the first content event, whatever came before it;
/// tokens from usage, or counted when none is sent); what differs is the
/// queue each one's `/metrics` reports, which `least_loaded` and learned
/// limits read.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Read whichever of the engines' metrics a replica's `/metrics` has.
    Auto,
    /// `vllm:num_requests_waiting` / `vllm:num_requests_running`.
    Vllm,
    /// `sglang:num_queue_reqs` / `sglang:num_running_reqs`.
    Sglang,
    /// llama.cpp's server (`--metrics`): `llamacpp:requests_deferred` /
    /// `llamacpp:requests_processing`.
    Llamacpp,
    /// Text Generation Inference: `tgi_queue_size` / `tgi_batch_current_size`.
    Tgi,
    /// Ollama: no metrics endpoint, nothing scraped (learned limits then
    /// learn from latency alone).
    Ollama,
}

/// How a pool picks a replica for a request (see docs/design/prefix-routing.md).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Each replica in turn.
    RoundRobin,
    /// The fewest prefills ahead, then the fewest in flight.
    LeastLoaded,
    /// Where the prompt's prefix was sent before (its KV cache likely holds
    /// it), weighed against the prefill work queued there and its load.
    PrefixAware,
}

/// How `prefix_aware` indexes prompts.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixConfig {
    /// Prompt bytes per indexed block (about four bytes a token: `256B` is
    /// some 64 tokens, four of vLLM's default blocks).
    pub block: Size,
    /// Blocks named per request at most: the prompt's first `block x
    /// max_blocks` bytes are routed on (the rest still counts as work).
    pub max_blocks: u32,
    /// Names (blocks and session hints) the pool's index keeps; the least
    /// recently used go first.
    pub index_blocks: u32,
    /// What a request in flight on a replica weighs, in blocks of prefill,
    /// against the blocks its cache holds: higher spreads a hot prefix sooner.
    pub load_weight: f64,
    /// Exact mode: what each replica's cache holds, from its KV events
    /// (vLLM's `--kv-events-config`), in place of the estimate where the
    /// events come. `None`: estimated only.
    pub kv_events: Option<KvEventsConfig>,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig { block: Size(256), max_blocks: 512, index_blocks: 65_536, load_weight: 1.0, kv_events: None }
    }
}

/// `pools[].prefix.kv_events`: where the replicas publish their KV events,
/// and the model's tokenizer, to name a prompt's blocks by its tokens.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// The port each replica publishes on, on its URL's host (vLLM's
    /// `endpoint`, `tcp://*:5557` by default).
    #[serde(default = "KvEventsConfig::default_port")]
    pub port: u16,
    /// The port of each replica's replay socket (vLLM's `replay_endpoint`),
    /// to ask for batches missed; none: missed batches are counted lost.
    #[serde(default)]
    pub replay_port: Option<u16>,
    /// The topic the replicas publish on (vLLM's `topic`, empty by default).
    #[serde(default)]
    pub topic: String,
    /// The model's `tokenizer.json`, a local file.
    pub tokenizer: std::path::PathBuf,
    /// The chat template (a Jinja file); by default `tokenizer_config.json`'s
    /// `chat_template`, beside the tokenizer.
    #[serde(default)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Blocks indexed per replica at most; a replica holds no more than its
    /// KV cache has, so past this its index starts again.
    #[serde(default = "KvEventsConfig::default_max_blocks")]
    pub max_blocks_per_replica: u32,
}

impl KvEventsConfig {
    fn default_port() -> u16 {
        5557
    }

    fn default_max_blocks() -> u32 {
        1 << 20
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    pub name: String,
    pub models: Vec<String>,
    /// The name the replicas serve the pool's models under (vLLM's
    /// `--served-model-name`), when it is not the name clients use: a JSON
    /// request's `model` is rewritten to it (LiteLLM's `model_name` against
    /// its `litellm_params.model`).
    pub served_model: Option<String>,
    /// Each a URL, or `{ url, name }`.
    pub replicas: Vec<ReplicaConfig>,
    /// Replicas found in DNS besides (a headless Service), found again every while.
    pub replicas_dns: Option<ReplicasDns>,
    /// Slots per replica: learned (`auto`) or fixed.
    pub max_inflight_per_replica: InflightLimit,
    /// Start and bounds of a learned limit.
    pub learned_limit: LearnedLimitConfig,
    pub balance: Balance,
    /// The prefix index of `balance: prefix_aware`.
    pub prefix: PrefixConfig,
    pub health: HealthConfig,
    /// How often each replica's `/metrics` is read (its waiting queue, for
    /// `least_loaded` and learned limits); also the learned limits' period.
    pub scrape_metrics: Dur,
    /// Which engine serves the pool: where its `/metrics` reports its queue
    /// (or that it has none to read). `auto` reads whichever it finds.
    pub engine: Engine,
    pub timeouts: TimeoutsConfig,
    /// Pass the tier to vLLM's `priority` field (replicas run `--scheduling-policy priority`).
    pub upstream_priority: bool,
    /// How `https://` replicas are verified and how slogate shows itself to
    /// them (mTLS). Without it, `https://` replicas are verified against the
    /// system's roots.
    pub tls: Option<UpstreamTlsConfig>,
    /// The environment variable holding the key the replicas were started
    /// with (`vllm serve --api-key`): sent as `Authorization: Bearer` on
    /// every request, health check and scrape, replacing the caller's.
    pub api_key_env: Option<String>,
    /// The longest one SSE event from a replica may be; past it the stream
    /// ends with an error event (`stream_error`).
    pub max_event_bytes: Size,
    /// Paths beyond the inference endpoints that this pool's replicas take
    /// from the named keys only (an engine's management endpoints, such as
    /// vLLM's `/v1/load_lora_adapter`). None by default: slogate forwards
    /// nothing else.
    pub extra_paths: Vec<ExtraPath>,
    /// Continuing a broken stream on another replica.
    pub resume: ResumeConfig,
    /// Preempt batch streams for interactive requests that would miss their
    /// TTFT target waiting: the stream's replica request ends (the engine
    /// frees the slot), and it goes on later where it stopped, spliced
    /// (docs/design/preemption.md). `auto`: on, with or without
    /// `upstream_priority` (an engine that orders its own queue by priority
    /// still does not free a slot for an interactive request: rule 12 there).
    pub preempt: Preempt,
}

impl PoolConfig {
    /// Does this pool preempt batch streams (`preempt`, with `auto` read)?
    pub fn preempts(&self) -> bool {
        match self.preempt {
            Preempt::Auto | Preempt::On => true,
            Preempt::Off => false,
        }
    }
}

/// `pools[].preempt`: `auto` (on: no engine we know frees a slot for an
/// interactive request by itself), `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preempt {
    #[default]
    Auto,
    On,
    Off,
}

impl<'de> Deserialize<'de> for Preempt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            B(bool),
            S(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::B(true)) => Ok(Preempt::On),
            Ok(Raw::B(false)) => Ok(Preempt::Off),
            Ok(Raw::S(s)) if s.trim() == "auto" => Ok(Preempt::Auto),
            _ => Err(serde::de::Error::custom("must be `auto`, `true` or `false`")),
        }
    }
}

impl Serialize for Preempt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Preempt::Auto => s.serialize_str("auto"),
            Preempt::On => s.serialize_bool(true),
            Preempt::Off => s.serialize_bool(false),
        }
    }
}

/// `pools[].replicas_dns`: a name whose A/AAAA records are replicas (a
/// Kubernetes headless Service), on the port `name` gives, resolved again
/// every `every`: an address that appears is probed and taken in, one
/// that goes is drained (docs/configuration.md, replicas in DNS).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicasDns {
    /// `host:port`.
    pub name: String,
    #[serde(default = "ReplicasDns::default_every")]
    pub every: Dur,
    /// Ask this DNS server (`ip:port`) instead of the system's resolver.
    #[serde(default)]
    pub nameserver: Option<std::net::SocketAddr>,
}

impl ReplicasDns {
    fn default_every() -> Dur {
        Dur::secs(5)
    }
}

/// `pools[].resume`: a chat or completions stream that breaks after the
/// client got some of it (the replica reset, ended early, sent an error
/// event or stalled past the idle timeout) is continued on another replica
/// of the pool, spliced into the client's stream.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResumeConfig {
    /// Continuations one stream may get; 0 turns resuming off.
    pub max_attempts: u32,
}

impl Default for ResumeConfig {
    fn default() -> Self {
        ResumeConfig { max_attempts: 1 }
    }
}

/// `max_inflight_per_replica`: `auto` (learned per replica from its own
/// waiting queue; see `upstream::limit`) or a fixed number of slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflightLimit {
    Auto,
    Fixed(u32),
}

impl<'de> Deserialize<'de> for InflightLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::N(n)) => Ok(InflightLimit::Fixed(n)),
            Ok(Raw::S(s)) if s.trim() == "auto" => Ok(InflightLimit::Auto),
            _ => Err(serde::de::Error::custom("must be `auto` or a whole number of slots")),
        }
    }
}

impl Serialize for InflightLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            InflightLimit::Auto => s.serialize_str("auto"),
            InflightLimit::Fixed(n) => s.serialize_u32(*n),
        }
    }
}

/// Where a learned limit starts and the bounds it stays in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LearnedLimitConfig {
    pub initial: u32,
    pub min: u32,
    pub max: u32,
}

impl Default for LearnedLimitConfig {
    fn default() -> Self {
        LearnedLimitConfig { initial: 16, min: 1, max: 1024 }
    }
}

/// One replica: written as its URL, or as `{ url, name }`.
///
/// The name is what clients see in `x-slogate-replica` and in 502/504
/// bodies, and what metrics and traces label it with. A replica without a
/// name shows as `<pool>-<position>` to clients (its URL stays internal)
/// and by its URL in metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaConfig {
    pub url: String,
    pub name: Option<String>,
    /// Where this replica publishes its KV events (`tcp://host:port`), in
    /// place of the pool's `prefix.kv_events.port` on its URL's host.
    pub kv_events: Option<String>,
    /// Its replay socket, in place of the pool's `replay_port`.
    pub kv_events_replay: Option<String>,
}

impl From<&str> for ReplicaConfig {
    fn from(url: &str) -> Self {
        ReplicaConfig { url: url.to_string(), ..ReplicaConfig::default() }
    }
}

impl From<String> for ReplicaConfig {
    fn from(url: String) -> Self {
        ReplicaConfig { url, ..ReplicaConfig::default() }
    }
}

impl<'de> Deserialize<'de> for ReplicaConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            url: String,
            name: Option<String>,
            kv_events: Option<String>,
            kv_events_replay: Option<String>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ReplicaConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a URL, or { url, name, kv_events, kv_events_replay }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ReplicaConfig, E> {
                Ok(v.into())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ReplicaConfig, A::Error> {
                let n = Named::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ReplicaConfig { url: n.url, name: n.name, kv_events: n.kv_events, kv_events_replay: n.kv_events_replay })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Written as it is read: the URL alone when nothing else is set.
impl Serialize for ReplicaConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.name.is_none() && self.kv_events.is_none() && self.kv_events_replay.is_none() {
            return s.serialize_str(&self.url);
        }
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("url", &self.url)?;
        for (k, v) in [("name", &self.name), ("kv_events", &self.kv_events), ("kv_events_replay", &self.kv_events_replay)] {
            if let Some(v) = v {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

/// TLS towards a pool's `https://` replicas.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// PEM file of CA certificates trusted in addition to the system's roots.
    pub ca: Option<std::path::PathBuf>,
    /// PEM certificate chain slogate presents (mTLS); needs `key`.
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// The name the replicas' certificates are checked against, when not
    /// the URL's host (a URL that names an IP, a certificate for a service name).
    pub server_name: Option<String>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            name: "default".into(),
            models: vec!["auto".into()],
            served_model: None,
            replicas: vec!["http://127.0.0.1:8000".into(), "http://127.0.0.1:8001".into()],
            replicas_dns: None,
            max_inflight_per_replica: InflightLimit::Auto,
            learned_limit: LearnedLimitConfig::default(),
            balance: Balance::PrefixAware,
            prefix: PrefixConfig::default(),
            health: HealthConfig::default(),
            scrape_metrics: Dur::millis(250),
            engine: Engine::Auto,
            timeouts: TimeoutsConfig::default(),
            upstream_priority: false,
            tls: None,
            api_key_env: None,
            max_event_bytes: Size(1 << 20),
            extra_paths: Vec::new(),
            resume: ResumeConfig::default(),
            preempt: Preempt::Auto,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub path: String,
    pub interval: Dur,
    pub timeout: Dur,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
    /// When fewer than this share of the pool's replicas pass their checks,
    /// all of them are routed to (0 = never).
    pub panic_threshold: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            path: "/health".into(),
            interval: Dur::secs(2),
            timeout: Dur::secs(1),
            unhealthy_after: 2,
            healthy_after: 2,
            panic_threshold: 0.5,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    pub connect: Dur,
    pub first_token: Dur,
    pub idle: Dur,
    pub total: Dur,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig { connect: Dur::secs(2), first_token: Dur::secs(60), idle: Dur::secs(60), total: Dur::secs(30 * 60) }
    }
}
