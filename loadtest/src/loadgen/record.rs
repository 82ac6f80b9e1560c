//! What a run records: each request as the client saw it, the gaps
//! between tokens (per class, per target), and the run's result; and what
//! the requests in flight share while they record.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::scenario::{Scenario, Targets};

/// One request as the client saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub stream: String,
    pub class: String,
    /// Seconds from the start of the run to sending.
    pub start_s: f64,
    pub status: u16,
    /// ok, length, rejected (429), http_NNN, stream_error, cut, timeout, connect_error, client_overload.
    pub outcome: String,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub tokens: u32,
    pub prompt_tokens: u32,
    pub gaps: u32,
    /// Gaps longer than the class ITL target.
    pub itl_over: u32,
    pub itl_max_ms: Option<f64>,
    pub retry_after: Option<u64>,
    pub queue_ms: Option<f64>,
    pub context_reduced: Option<String>,
    /// With a stamping simulator (`vllm-sim --stamp-events`): the engine's
    /// share of this request's TTFT, from the request's arrival at the
    /// replica to its first content chunk leaving it. `ttft_ms` minus this is
    /// the path's share (network, gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_ttft_ms: Option<f64>,
    /// With a stamping simulator: the inbound part of the path's share, from
    /// the request leaving the client to its arrival at the replica (both on
    /// the wall clock, which processes on one machine share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_in_ms: Option<f64>,
    /// With a stamping simulator: the gaps longer than the class ITL
    /// target as the replica sent them (its own steps), where `itl_over`
    /// counts them as the client read them; the difference is the path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_itl_over: Option<u32>,
    /// For a stream with several targets: which one (0-based, in the order
    /// listed) this request went to. Requests take the targets in turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<usize>,
    /// A refusal's OpenAI error `code` (`breaker_open`, `tenant_over_share`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// A refusal's `retry-after-ms`, where it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Through slogate: the replica that answered (`x-slogate-replica`), so
    /// a run's late requests can be told apart by where they went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

impl Record {
    pub fn completed(&self) -> bool {
        self.outcome == "ok" || self.outcome == "length"
    }
    /// Completed with TTFT and (at least 99% of) ITL gaps within the class targets.
    pub fn within_slo(&self, t: Option<&Targets>) -> bool {
        let Some(t) = t else { return self.completed() };
        self.completed() && self.ttft_ms.is_none_or(|v| v <= t.ttft_ms) && self.itl_over <= self.gaps / 100
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub scenario: Scenario,
    pub label: String,
    pub elapsed_s: f64,
    pub records: Vec<Record>,
    /// All inter-token gaps per class, in microseconds, as (value, count) pairs.
    pub itl_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// With a stamping simulator: the same gaps as the replica sent them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_itl_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// With a stamping simulator: how much longer each gap reached the client
    /// than it left the replica (0 when shorter): the path's share of ITL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub itl_path_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// For streams with several targets: the same three sets of gaps keyed
    /// by target index ("0", "1", ... in the order listed), classes together.
    #[serde(default, skip_serializing_if = "TargetGaps::is_empty")]
    pub itl_by_target: TargetGaps,
    /// Every request's own gaps, in the order of `records` (only when asked
    /// for: see [`Options::details`]); not part of the JSON result.
    #[serde(skip)]
    pub details: Vec<Detail>,
}

/// One request's inter-token gaps, in seconds, and its output length.
#[derive(Debug, Clone, Default)]
pub struct Detail {
    pub itl_s: Vec<f64>,
    /// The replica's `usage.completion_tokens` when it sent usage, else the
    /// events counted.
    pub output_tokens: u32,
}

/// How a run measures and what it keeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub progress: bool,
    /// Keep each request's gaps ([`RunResult::details`]), for a per-request
    /// export; memory grows with every token of the run.
    pub details: bool,
}

/// Gaps per target index, as (value, count) pairs in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetGaps {
    pub client_us: BTreeMap<String, Vec<(u64, u64)>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_us: BTreeMap<String, Vec<(u64, u64)>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub path_us: BTreeMap<String, Vec<(u64, u64)>>,
}

impl TargetGaps {
    pub fn is_empty(&self) -> bool {
        self.client_us.is_empty()
    }
}

impl RunResult {
    pub fn itl_histogram(&self, class: &str) -> Histogram<u64> {
        let mut h = new_hist();
        for (v, c) in self.itl_us.get(class).into_iter().flatten() {
            let _ = h.record_n(*v, *c);
        }
        h
    }
}

pub fn new_hist() -> Histogram<u64> {
    // 1 us .. 1 h at 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Gaps of one request, in microseconds: as the client saw them, and (with a
/// stamping simulator) as the replica sent them and what the path added.
#[derive(Default)]
pub(super) struct Gaps {
    pub(super) client: Vec<u64>,
    pub(super) engine: Vec<u64>,
    pub(super) path: Vec<u64>,
}

#[derive(Default)]
pub(super) struct GapHistograms {
    pub(super) client: BTreeMap<String, Histogram<u64>>,
    pub(super) engine: BTreeMap<String, Histogram<u64>>,
    pub(super) path: BTreeMap<String, Histogram<u64>>,
}

impl GapHistograms {
    pub(super) fn record(&mut self, key: &str, gaps: &Gaps) {
        for (m, v) in [(&mut self.client, &gaps.client), (&mut self.engine, &gaps.engine), (&mut self.path, &gaps.path)] {
            if v.is_empty() {
                continue;
            }
            let h = m.entry(key.to_string()).or_insert_with(new_hist);
            for g in v {
                let _ = h.record((*g).max(1));
            }
        }
    }
}

/// Gaps keyed by class, and by target index for streams with several.
#[derive(Default)]
pub(super) struct AllGaps {
    pub(super) by_class: GapHistograms,
    pub(super) by_target: GapHistograms,
}

pub(super) fn pairs(m: &BTreeMap<String, Histogram<u64>>) -> BTreeMap<String, Vec<(u64, u64)>> {
    m.iter().map(|(k, h)| (k.clone(), h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect())).collect()
}

/// What the requests of a run share while they record.
pub(super) struct Shared {
    pub(super) records: Mutex<Vec<Record>>,
    /// With [`Options::details`]: each record's details, pushed with it.
    pub(super) details: Option<Mutex<Vec<Detail>>>,
    pub(super) itl: Mutex<AllGaps>,
    pub(super) ttft_recent: Mutex<Histogram<u64>>,
    pub(super) sent: AtomicU64,
    pub(super) done: AtomicU64,
    pub(super) errors: AtomicU64,
}
