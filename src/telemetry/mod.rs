//! Telemetry: what a finished request becomes (an [`Outcome`] and its
//! measurements), the Prometheus metrics it feeds, and logging set-up.
//!
//! The request path only calls cheap, non-blocking recorders here; nothing in
//! this room waits on a scrape.

pub(crate) mod access_log;
pub(crate) mod accounting;
pub(crate) mod budget;
pub(crate) mod histogram;
pub(crate) mod history;
pub(crate) mod kv_feeds;
pub(crate) mod labels;
pub(crate) mod metrics;
pub mod otel;
pub(crate) mod outcome;
pub(crate) mod series;
pub(crate) mod window;

pub use metrics::Metrics;
pub use outcome::{Outcome, SliClass};

/// Set up the global tracing subscriber (stderr, text or JSON).
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests, demo) keeps the first subscriber.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
