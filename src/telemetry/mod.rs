//! Telemetry: what a finished request becomes (an [`Outcome`] and its
//! measurements), the Prometheus metrics it feeds, and logging set-up.
//!
//! The request path only calls cheap, non-blocking recorders here; nothing in
//! this room waits on a scrape.

pub mod budget;
pub mod histogram;
pub mod metrics;
pub mod otel;
pub mod window;

pub use metrics::Metrics;

use prometheus_client::encoding::EncodeLabelValue;

/// How one request ended. Exactly one per request, recorded once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Finished normally (`finish_reason: stop` or a non-streaming 2xx).
    ok,
    /// Finished because it hit `max_tokens`.
    length,
    /// The client hung up first.
    cancelled,
    /// A 4xx caused by the request.
    client_error,
    /// 429: breaker open, queue full or shed.
    rejected,
    /// 503: no healthy replica.
    unavailable,
    /// A first-token, idle or total timeout.
    timeout,
    /// 5xx from the replica, or connect failure.
    upstream_error,
    /// Error event, `finish_reason: error`, or the stream cut before `[DONE]`.
    stream_error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::ok => "ok",
            Outcome::length => "length",
            Outcome::cancelled => "cancelled",
            Outcome::client_error => "client_error",
            Outcome::rejected => "rejected",
            Outcome::unavailable => "unavailable",
            Outcome::timeout => "timeout",
            Outcome::upstream_error => "upstream_error",
            Outcome::stream_error => "stream_error",
        }
    }
}

/// Set up the global tracing subscriber (stderr, text or JSON).
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests, demo) keeps the first subscriber.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
