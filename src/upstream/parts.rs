//! A replica's parts, each a concern of its own: its slots, its health,
//! what it reports, how it is reached, what the learned limit reads, and
//! what routing reads. `Replica` (`replica.rs`) is composed of them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use arc_swap::ArcSwap;
use http::HeaderValue;

use super::share::Share;
use super::{conn, limit, tls};
use crate::sync::AtomicF64;

/// Its slots: how many there are, this instance's part of them, and who holds them (interactive, batch, prefilling).
pub(crate) struct Seats {
    /// Requests holding a slot here. Invariant: only changed through `ReplicaSlot`.
    pub(super) inflight: AtomicUsize,
    /// Of those, the ones without a first token yet, by tier (interactive,
    /// batch): the prefills a request sent here now would wait behind.
    /// Only changed through `ReplicaSlot`.
    pub(super) prefilling: [AtomicUsize; 2],
    /// Of those, the prompt bytes prefix-aware routing expected the cache
    /// not to hold, by tier: the prefill work a request sent here now would
    /// wait behind. Only changed through `ReplicaSlot`.
    pub(super) prefill_bytes: [AtomicU64; 2],
    /// Batch requests holding a slot here. Only changed through `ReplicaSlot`.
    pub(super) batch_held: AtomicUsize,
    /// Seats of the limit batch leaves to interactive requests here (the
    /// learned limit's answer to their first tokens coming late under load).
    pub(super) batch_cut: AtomicUsize,
    /// Slots; set when a config goes live (a reload resizes it in place:
    /// slots above a lowered limit drain, and no new one is taken until the
    /// count is under it).
    pub(super) max_inflight: AtomicUsize,
    /// This instance's part of the slots when other instances share the
    /// replica (`fleet`); `usize::MAX` when it is alone.
    pub(super) allowance: AtomicUsize,
    /// Requests other instances of the fleet hold here (or are assumed to,
    /// for peers not heard lately), as the fleet last published it.
    pub(super) others_inflight: AtomicUsize,
}

/// Whether it is routed to, and why.
pub(crate) struct Health {
    /// Routed to: it passes its checks, or its pool is in panic.
    pub(super) healthy: AtomicBool,
    /// Whether it passes, and why it was last taken out or brought back.
    pub(crate) verdict: super::verdict::Verdict,
    /// Why the last health check failed (none after one passed).
    pub(super) health_error: ArcSwap<Option<String>>,
}

/// What its own `/metrics` and `/v1/models` said when last read.
pub(crate) struct Readings {
    /// What the replica runs and queues, as last scraped (all its clients);
    /// `u64::MAX` when the last scrape failed or none was made.
    pub(super) scraped_total: AtomicU64,
    /// Requests waiting inside vLLM, as last scraped from its `/metrics`
    /// (includes other clients' requests); 0 when not scraped.
    pub(crate) scraped_waiting: AtomicU64,
    /// Tokens its KV cache holds, as its `/metrics` says; 0 when unknown.
    pub(super) cache_tokens: AtomicU64,
    /// Models this replica's `/v1/models` listed (raw model objects).
    pub(crate) models: ArcSwap<Vec<serde_json::Value>>,
}

/// How it is reached: idle connections, TLS, its key.
pub(crate) struct Connection {
    /// Keep-alive connections not serving a request now.
    pub(crate) idle: conn::IdleConns,
    /// TLS for an `https://` replica.
    pub(super) tls: Option<tls::ReplicaTls>,
    /// `Authorization: Bearer <pools[].api_key_env>`, marked sensitive.
    pub(super) api_key: Option<http::HeaderValue>,
}

/// What the learned limit reads of it since it last looked, and the controller itself.
pub(crate) struct LimitSignals {
    /// The learned limit (`max_inflight_per_replica: auto`), kept across reloads.
    pub(super) controller: std::sync::Mutex<limit::Controller>,
    /// The most requests held here since the controller last looked.
    pub(super) inflight_peak: AtomicUsize,
    /// The replica answered 429 or 503 since the controller last looked.
    pub(super) refused: AtomicBool,
    /// Interactive requests' dispatch-to-first-token time over their class
    /// target since the controller last looked: sum (in thousandths) and count.
    pub(super) first_token_share: AtomicU64,
    pub(super) first_token_n: AtomicU64,
    /// The largest share since the controller last looked (thousandths).
    pub(super) first_token_max: AtomicU64,
    /// The 90th percentile of that share, tracked (see [`Replica::first_token_p90`]).
    pub(super) first_token_p90: AtomicF64,
    /// Requests sent here since the start, and the count and time (ms
    /// after `born`) the controller last looked at it.
    pub(super) dispatched: AtomicU64,
    pub(super) dispatched_seen: AtomicU64,
    pub(super) controlled_at_ms: AtomicU64,
    /// The limit last logged (a move by a quarter or more is logged).
    pub(super) logged_limit: AtomicUsize,
}

/// What routing reads of how it serves: its prefix cache's hits, the gaps between its tokens, when it last delivered.
pub(crate) struct RoutingStats {
    /// Prefix-aware routing's estimate: prompt bytes sent here, and of them
    /// those it expected the replica's cache to hold.
    pub(super) expected_hits: Share,
    /// What the engine reported of the requests served here: prompt tokens,
    /// and of them those its prefix cache held.
    pub(super) reported_hits: Share,
    /// The mean gap between tokens of the streams that ended here lately,
    /// in microseconds (f64 bits, 0 before any; see [`Replica::record_itl`]).
    pub(super) itl_mean_us: AtomicF64,
    /// When a stream last ended here, in milliseconds after `born`.
    pub(super) itl_at_ms: AtomicU64,
    /// When this replica last delivered tokens (a first token, or a report
    /// of gaps), in milliseconds after `born`; 0: never.
    pub(super) delivered_at_ms: AtomicU64,
}

/// Where requests go: its scheme and authority, and the `Host` they carry.
pub(crate) struct Address {
    /// Scheme + authority, used to build request URIs.
    pub(crate) base: http::Uri,
    /// `Host` as requests to this replica carry it (`base`'s authority),
    /// made once.
    pub(crate) host: Option<HeaderValue>,
}
