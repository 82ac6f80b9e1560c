//! Serde shapes of `slogate.yaml`, with the defaults of `slogate.reference.yaml`.
//!
//! Every struct denies unknown fields and fills what a file leaves out from
//! its `Default`, so a section given in part keeps the defaults of the rest.

use std::net::SocketAddr;

use indexmap::IndexMap;

use super::auth::{AuthConfig, ExtraPath, LimitsConfig};
use super::units::{Dur, Size};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub pools: Vec<PoolConfig>,
    pub classes: IndexMap<String, ClassConfig>,
    pub default_class: String,
    pub tiers: TiersConfig,
    pub slo: SloConfig,
    pub breaker: BreakerConfig,
    pub context_reduction: ContextReductionConfig,
    pub auth: AuthConfig,
    pub telemetry: TelemetryConfig,
    pub fleet: FleetConfig,
    pub limits: LimitsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            pools: vec![PoolConfig::default()],
            classes: default_classes(),
            default_class: "chat".into(),
            tiers: TiersConfig::default(),
            slo: SloConfig::default(),
            breaker: BreakerConfig::default(),
            context_reduction: ContextReductionConfig::default(),
            auth: AuthConfig::default(),
            telemetry: TelemetryConfig::default(),
            fleet: FleetConfig::default(),
            limits: LimitsConfig::default(),
        }
    }
}

/// The default SLO table: P99 targets per class.
pub fn default_classes() -> IndexMap<String, ClassConfig> {
    let c = |tier, ttft, itl| ClassConfig { tier, ttft: Dur::millis(ttft), itl: Dur::millis(itl) };
    [
        ("chat", c(Tier::Interactive, 300, 50)),
        ("voice", c(Tier::Interactive, 150, 30)),
        ("code-inline", c(Tier::Interactive, 100, 25)),
        ("code-panel", c(Tier::Interactive, 300, 50)),
        ("rag", c(Tier::Interactive, 400, 80)),
        ("batch", c(Tier::Batch, 3000, 200)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls: Option<TlsConfig>,
    pub max_request_body: Size,
    pub shutdown_grace: Dur,
    /// Poll for I/O without sleeping while requests are in flight (see
    /// `server::busy`): lower latency on VMs, a core's worth of CPU.
    pub busy_poll: bool,
    /// Ask Linux for the shortest scheduler time slice on the gateway's
    /// threads (see `server::sched`): a woken thread takes a shared core
    /// sooner. Read at start.
    pub short_sched_slice: bool,
    /// A client that takes no bytes for this long while a response has data
    /// waiting is dropped: its replica request is cancelled, its slot given
    /// back (nginx's `send_timeout`).
    pub send_timeout: Dur,
    /// From accept (or the end of the previous response on a keep-alive
    /// connection) to a complete request head, HTTP/2 preface included.
    pub header_read_timeout: Dur,
    /// The whole request body must arrive within this, else 408.
    pub body_read_timeout: Dur,
    /// Open connections per listener; more wait to be accepted.
    pub max_connections: u32,
    /// The kernel's accept queue of each listener: connections that arrived
    /// and wait for slogate to accept them (it accepts as fast as they
    /// come, below `max_connections`). Linux caps it at
    /// `net.core.somaxconn` (4096 on current kernels).
    pub listen_backlog: u32,
    /// Streams one HTTP/2 client connection may have open at once (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS); a client multiplexing more waits
    /// for one to end.
    pub http2_max_streams: u32,
    /// The environment variable holding a token the admin listener requires
    /// (`Authorization: Bearer <token>`) on everything but `/healthz` and
    /// `/readyz`. None: the admin listener is open (keep it on loopback).
    pub admin_token_env: Option<String>,
    /// A streaming request still waiting for its response this long (in the
    /// queue, usually) gets 200 headers and an SSE comment line every
    /// interval until its first event, so a load balancer that cuts idle
    /// connections does not lose it; a refusal then ends the stream with an
    /// error event instead of a 429. None: off.
    pub queued_keepalive: Option<Dur>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            tls: None,
            max_request_body: Size(4 << 20),
            shutdown_grace: Dur::secs(30),
            busy_poll: false,
            short_sched_slice: false,
            send_timeout: Dur::secs(30),
            header_read_timeout: Dur::secs(10),
            body_read_timeout: Dur::secs(30),
            max_connections: 10_000,
            listen_backlog: 4096,
            http2_max_streams: 1024,
            admin_token_env: None,
            queued_keepalive: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

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

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    RoundRobin,
    LeastLoaded,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    pub name: String,
    pub models: Vec<String>,
    /// Each a URL, or `{ url, name }`.
    pub replicas: Vec<ReplicaConfig>,
    /// Slots per replica: learned (`auto`) or fixed.
    pub max_inflight_per_replica: InflightLimit,
    /// Start and bounds of a learned limit.
    pub learned_limit: LearnedLimitConfig,
    pub balance: Balance,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    pub url: String,
    pub name: Option<String>,
}

impl From<&str> for ReplicaConfig {
    fn from(url: &str) -> Self {
        ReplicaConfig { url: url.to_string(), name: None }
    }
}

impl From<String> for ReplicaConfig {
    fn from(url: String) -> Self {
        ReplicaConfig { url, name: None }
    }
}

impl<'de> Deserialize<'de> for ReplicaConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            url: String,
            name: Option<String>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ReplicaConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a URL, or { url, name }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ReplicaConfig, E> {
                Ok(v.into())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ReplicaConfig, A::Error> {
                let n = Named::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ReplicaConfig { url: n.url, name: n.name })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Written as it is read: the URL alone when there is no name.
impl Serialize for ReplicaConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match &self.name {
            None => s.serialize_str(&self.url),
            Some(name) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("url", &self.url)?;
                m.serialize_entry("name", name)?;
                m.end()
            }
        }
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
            replicas: vec!["http://127.0.0.1:8000".into(), "http://127.0.0.1:8001".into()],
            max_inflight_per_replica: InflightLimit::Auto,
            learned_limit: LearnedLimitConfig::default(),
            balance: Balance::LeastLoaded,
            health: HealthConfig::default(),
            scrape_metrics: Dur::millis(250),
            engine: Engine::Auto,
            timeouts: TimeoutsConfig::default(),
            upstream_priority: false,
            tls: None,
            api_key_env: None,
            max_event_bytes: Size(1 << 20),
            extra_paths: Vec::new(),
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
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig { path: "/health".into(), interval: Dur::secs(2), timeout: Dur::secs(1), unhealthy_after: 2, healthy_after: 2 }
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

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Interactive,
    Batch,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Interactive => "interactive",
            Tier::Batch => "batch",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    pub tier: Tier,
    pub ttft: Dur,
    pub itl: Dur,
}

/// The two tiers' queues. A tier given in part keeps its own defaults for
/// the fields it leaves out (batch's are not interactive's).
#[derive(Debug, Clone, Serialize)]
pub struct TiersConfig {
    pub interactive: TierConfig,
    pub batch: TierConfig,
}

impl Default for TiersConfig {
    fn default() -> Self {
        TiersConfig {
            interactive: TierConfig {
                queue_capacity: 256,
                queue_timeout: Dur::secs(2),
                reserved_share: 0.25,
                queue_max_bytes: Size(256 << 20),
                shed_late: false,
            },
            batch: TierConfig {
                queue_capacity: 10_000,
                queue_timeout: Dur::secs(120),
                reserved_share: 0.0,
                queue_max_bytes: Size(1 << 30),
                shed_late: false,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TierConfig {
    pub queue_capacity: u32,
    pub queue_timeout: Dur,
    pub reserved_share: f64,
    /// Request bodies waiting in the queue may hold this many bytes in all;
    /// a request that would wait past it gets 429.
    pub queue_max_bytes: Size,
    /// Interactive only: a queued request is refused (429) as soon as it can
    /// no longer make its class's TTFT target (its wait plus the replicas'
    /// recent time to first token from dispatch), instead of at `queue_timeout`.
    pub shed_late: bool,
}

impl<'de> Deserialize<'de> for TiersConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Partial {
            queue_capacity: Option<u32>,
            queue_timeout: Option<Dur>,
            reserved_share: Option<f64>,
            queue_max_bytes: Option<Size>,
            shed_late: Option<bool>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Tiers {
            interactive: Option<Partial>,
            batch: Option<Partial>,
        }
        fn fill(p: Option<Partial>, d: TierConfig) -> TierConfig {
            let Some(p) = p else { return d };
            TierConfig {
                queue_capacity: p.queue_capacity.unwrap_or(d.queue_capacity),
                queue_timeout: p.queue_timeout.unwrap_or(d.queue_timeout),
                reserved_share: p.reserved_share.unwrap_or(d.reserved_share),
                queue_max_bytes: p.queue_max_bytes.unwrap_or(d.queue_max_bytes),
                shed_late: p.shed_late.unwrap_or(d.shed_late),
            }
        }
        let t = Tiers::deserialize(d)?;
        let def = TiersConfig::default();
        Ok(TiersConfig { interactive: fill(t.interactive, def.interactive), batch: fill(t.batch, def.batch) })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    pub latency_objective: f64,
    pub availability_objective: f64,
    pub window: Dur,
    pub burn_alerts: Vec<BurnAlert>,
    /// One point of the status page's history per class this often; it
    /// keeps 360 (an hour at the default 10 s).
    pub history_step: Dur,
    /// Where the runbook is published (`https://...`): the generated
    /// alerts' `runbook_url` is this plus the alert's section
    /// (`#latency-budget-burn`). Without it they name the section of
    /// docs/runbook.md in a `runbook` annotation (a path is no link).
    pub runbook_url: Option<String>,
}

impl Default for SloConfig {
    fn default() -> Self {
        let a = |long, short, factor, severity| BurnAlert { long: Dur::secs(long), short: Dur::secs(short), factor, severity };
        SloConfig {
            latency_objective: 0.99,
            availability_objective: 0.999,
            window: Dur::secs(28 * 86_400),
            burn_alerts: vec![
                a(3_600, 300, 14.4, Severity::Page),
                a(6 * 3_600, 1_800, 6.0, Severity::Page),
                a(3 * 86_400, 6 * 3_600, 1.0, Severity::Ticket),
            ],
            history_step: Dur::secs(10),
            runbook_url: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Page,
    Ticket,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BurnAlert {
    pub long: Dur,
    pub short: Dur,
    pub factor: f64,
    pub severity: Severity,
}

/// The TTFT breaker of each class: open when the P99 over the last `window`
/// stays above `trip_ratio` x the class's target for `trip_after`.
///
/// The window decides what "sustained" means. A slow burst of length `b`
/// keeps the rolling P99 above the threshold for about `b + window` (its
/// samples stay in the window that long after it ends), so the breaker opens
/// only when `b + window >= trip_after`. With the defaults (10 s window, 30 s
/// hold), slowness must last about 20 s: a one-second burst never opens it,
/// thirty seconds of slowness opens it within `trip_after` plus one window.
/// A window as long as `trip_after` would open it after any burst, 30 s after
/// the replicas had recovered.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    pub trip_ratio: f64,
    pub trip_after: Dur,
    pub window: Dur,
    pub min_samples: u32,
    pub retry_after: Dur,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { trip_ratio: 2.0, trip_after: Dur::secs(30), window: Dur::secs(10), min_samples: 20, retry_after: Dur::secs(5) }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextReductionConfig {
    pub trigger_ratio: f64,
    pub trigger_after: Dur,
    pub max_tokens_cap: u32,
    pub max_documents: u32,
    pub max_prompt_tokens: u32,
}

impl Default for ContextReductionConfig {
    fn default() -> Self {
        ContextReductionConfig {
            trigger_ratio: 2.0,
            trigger_after: Dur::secs(10),
            max_tokens_cap: 256,
            max_documents: 3,
            max_prompt_tokens: 2048,
        }
    }
}

/// Several slogate instances in front of the same replicas (`fleet`): each
/// reads the others' in-flight requests, learned limits and demand from
/// their admin listeners every `period` and takes its share of each
/// replica's slots. With neither `peers` nor `peers_dns`, the instance is alone.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// The other instances' admin listeners, `http://host:port` (the
    /// instance's own address may be listed too: it recognises itself).
    pub peers: Vec<String>,
    /// `host:port`: a name whose A/AAAA records are the instances (a
    /// Kubernetes headless Service), the port their admin listener's.
    pub peers_dns: Option<String>,
    /// How often each peer is read and the shares recomputed.
    pub period: Dur,
    /// A peer unheard for this long is lost: it keeps the slots it last
    /// held, at least an equal share, until `takeover_after`.
    pub peer_timeout: Dur,
    /// A peer unheard for this long gives up its share; what it still has
    /// on the replicas (their own request counts) stays counted.
    pub takeover_after: Dur,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            peers: Vec::new(),
            peers_dns: None,
            period: Dur::millis(100),
            peer_timeout: Dur::secs(1),
            takeover_after: Dur::secs(3),
        }
    }
}

impl FleetConfig {
    /// Are other instances configured?
    pub fn enabled(&self) -> bool {
        !self.peers.is_empty() || self.peers_dns.is_some()
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub otlp_endpoint: Option<String>,
    pub log_format: LogFormat,
    /// One line per finished request (`null`: none).
    pub access_log: Option<AccessLogConfig>,
}

/// `telemetry.access_log`: where each finished request's line goes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// `stderr`, `stdout`, or a file path (appended to; reopened on SIGHUP
    /// and reload, so logrotate can move it).
    pub to: String,
    #[serde(default)]
    pub format: AccessLogFormat,
    /// Lines waiting to be written at most; past it lines are dropped and
    /// counted (`slogate_access_log_dropped_total`), never waited for.
    #[serde(default = "access_log_buffer")]
    pub buffer: u32,
}

fn access_log_buffer() -> u32 {
    65536
}

/// How access log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
}
