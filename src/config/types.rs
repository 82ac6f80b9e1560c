//! Serde shapes of `slogate.yaml`, with the defaults of `slogate.reference.yaml`.
//!
//! Every struct denies unknown fields and fills what a file leaves out from
//! its `Default`, so a section given in part keeps the defaults of the rest.

use std::net::SocketAddr;

use indexmap::IndexMap;

use super::auth::{AuthConfig, Endpoint, LimitsConfig};
use super::pool::PoolConfig;
use super::units::{Dur, Size};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub pools: Vec<PoolConfig>,
    pub classes: IndexMap<String, ClassConfig>,
    pub default_class: String,
    /// The class of a request that names none, by endpoint kind (before
    /// `default_class`). Unset: [`default_endpoint_classes`], where those
    /// classes exist.
    pub endpoint_classes: Option<IndexMap<Endpoint, String>>,
    pub tiers: TiersConfig,
    pub slo: SloConfig,
    pub breaker: BreakerConfig,
    pub context_reduction: ContextReductionConfig,
    pub auth: AuthConfig,
    pub telemetry: TelemetryConfig,
    pub fleet: FleetConfig,
    pub limits: LimitsConfig,
    /// Serve as Envoy's endpoint picker (`epp.listen`), beside or instead
    /// of the proxy listener.
    pub epp: Option<EppConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            pools: vec![PoolConfig::default()],
            classes: default_classes(),
            default_class: "chat".into(),
            endpoint_classes: None,
            tiers: TiersConfig::default(),
            slo: SloConfig::default(),
            breaker: BreakerConfig::default(),
            context_reduction: ContextReductionConfig::default(),
            auth: AuthConfig::default(),
            telemetry: TelemetryConfig::default(),
            fleet: FleetConfig::default(),
            limits: LimitsConfig::default(),
            epp: None,
        }
    }
}

/// The classes kinds of work go to when a request names none and the
/// config says nothing: retrieval to `rag`, audio to `voice`, so chat's
/// SLIs hold chat (each applies only where that class is configured).
pub fn default_endpoint_classes() -> IndexMap<Endpoint, String> {
    [(Endpoint::Embeddings, "rag"), (Endpoint::Rerank, "rag"), (Endpoint::Transcription, "voice"), (Endpoint::Speech, "voice")]
        .into_iter()
        .map(|(e, c)| (e, c.to_string()))
        .collect()
}

impl Config {
    /// Each endpoint kind's class when a request names none: the configured
    /// map, or the defaults that name a configured class.
    pub fn endpoint_class(&self, endpoint: Endpoint) -> Option<String> {
        match &self.endpoint_classes {
            Some(map) => map.get(&endpoint).cloned(),
            None => default_endpoint_classes().get(&endpoint).filter(|c| self.classes.contains_key(*c)).cloned(),
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
    /// The largest multipart form (an audio upload: OpenAI takes files of up
    /// to 25 MB); larger ones get 413.
    pub max_upload_body: Size,
    /// Request bodies all requests may hold in memory at once (JSON bodies,
    /// forms read whole); past it, 503 with Retry-After. One connection's
    /// requests may hold `max_upload_body` + `max_request_body`.
    pub max_buffered_body_bytes: Size,
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
            max_upload_body: Size(32 << 20),
            max_buffered_body_bytes: Size(512 << 20),
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

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
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

impl TiersConfig {
    /// The settings of `tier`.
    pub fn of(&self, tier: Tier) -> &TierConfig {
        match tier {
            Tier::Interactive => &self.interactive,
            Tier::Batch => &self.batch,
        }
    }
}

impl Default for TiersConfig {
    fn default() -> Self {
        TiersConfig {
            interactive: TierConfig {
                queue_capacity: 256,
                queue_timeout: Dur::secs(2),
                // At most half: the reservation follows interactive demand
                // (its 30 s peak and a quarter, plus a headroom), so the
                // share only bounds it. The admission benchmarks, chat at
                // 0.4-0.5 of capacity beside batch, hold chat's SLO with
                // half; a quarter caps the reservation below that demand.
                reserved_share: 0.5,
                queue_max_bytes: Size(256 << 20),
                // On: measured at 1.5x and 3x overload, off gives 13 % and 4 %
                // of capacity as goodput (every queued request waits out the
                // queue timeout and is late), on 94 % and 92 %.
                shed_late: true,
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

/// slogate as the endpoint picker of an Envoy-based gateway (the Gateway
/// API Inference Extension): Envoy's `ext_proc` gRPC service on `listen`
/// (docs/endpoint-picker.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EppConfig {
    /// Where `envoy.service.ext_proc.v3.ExternalProcessor` and gRPC health
    /// are served (h2c, or TLS with `tls`).
    pub listen: SocketAddr,
    /// Serve the proxy listener (`server.listen`) too.
    #[serde(default = "EppConfig::proxy_default")]
    pub proxy: bool,
    /// Serve `ext_proc` over TLS (ALPN h2) with this certificate and key
    /// (PEM) instead of h2c.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

impl EppConfig {
    fn proxy_default() -> bool {
        true
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
