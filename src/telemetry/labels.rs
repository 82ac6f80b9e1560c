//! The label sets of slogate's series, as typed structs. Label values are
//! bounded: `model` is one of the models a pool serves (or `unknown`),
//! `class` one of the configured classes, so client input cannot create series.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};

use crate::config::Tier;
use crate::telemetry::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum TierLabel {
    interactive,
    batch,
}

impl From<Tier> for TierLabel {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Interactive => TierLabel::interactive,
            Tier::Batch => TierLabel::batch,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) model: String,
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
    /// The kind of work (`chat`, `embeddings`, `transcription`, ...): a closed set.
    pub(crate) endpoint: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) model: String,
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
    pub(crate) endpoint: &'static str,
    pub(crate) outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClassTierLabels {
    pub(crate) class: String,
    pub(crate) tier: TierLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ModelClassLabels {
    pub(crate) model: String,
    pub(crate) class: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SloLabels {
    pub(crate) slo: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SloWindowLabels {
    pub(crate) slo: String,
    pub(crate) window: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClassLabels {
    pub(crate) class: String,
}

/// A completed answer's finish reason, as a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum FinishReason {
    stop,
    length,
    tool_calls,
    content_filter,
    other,
}

impl FinishReason {
    /// The reason an engine wrote (OpenAI's names; the Responses API's
    /// `max_output_tokens` is `length`).
    pub(crate) fn of(reason: &str) -> FinishReason {
        match reason {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::stop,
            "length" | "max_tokens" | "max_output_tokens" => FinishReason::length,
            "tool_calls" | "function_call" | "tool_use" => FinishReason::tool_calls,
            "content_filter" => FinishReason::content_filter,
            _ => FinishReason::other,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct FinishLabels {
    pub(crate) class: String,
    pub(crate) reason: FinishReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BreachKind {
    ttft,
    itl,
    incomplete,
    timeout,
    error,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct BreachLabels {
    pub(crate) class: String,
    pub(crate) kind: BreachKind,
}

/// What judged a completed request for the latency SLI: a token stream's
/// first token and gaps (`ttft`), a binary stream's first byte
/// (`first_byte`: speech), or the whole answer's time (`e2e`: non-streaming
/// work, as fast as a stream at the class's targets would have been).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue, serde::Serialize)]
#[allow(non_camel_case_types)]
pub(crate) enum Signal {
    ttft,
    first_byte,
    e2e,
}

impl Signal {
    pub(crate) const ALL: [Signal; 3] = [Signal::ttft, Signal::first_byte, Signal::e2e];

    /// The signal for an answer at `endpoint`, streamed or not.
    pub(crate) fn of(endpoint: crate::config::Endpoint, streaming: bool) -> Signal {
        match (endpoint, streaming) {
            (crate::config::Endpoint::Speech, _) => Signal::first_byte,
            (_, true) => Signal::ttft,
            (_, false) => Signal::e2e,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct JudgedLabels {
    pub(crate) class: String,
    pub(crate) signal: Signal,
    /// `true` or `false`: within the class's latency targets.
    pub(crate) within: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct FleetPeerLabels {
    pub(crate) state: String,
}

/// A tenant: its API key's name (`anonymous` without keys); bounded by the config.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TenantLabels {
    pub(crate) tenant: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TenantOutcomeLabels {
    pub(crate) tenant: String,
    pub(crate) outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TenantKindLabels {
    pub(crate) tenant: String,
    /// `prompt` or `completion` for tokens; `requests`, `tokens` or `concurrent` for limits.
    pub(crate) kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ReplicaLabels {
    pub(crate) pool: String,
    pub(crate) replica: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) pool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct PoolTierLabels {
    pub(crate) pool: String,
    pub(crate) tier: TierLabel,
}

/// A stream that broke on `replica` of `pool`, and how it broke.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ResumeLabels {
    pub(crate) pool: String,
    pub(crate) replica: String,
    /// `reset`, `eof`, `error_event`, `stall`.
    pub(crate) reason: &'static str,
}

/// A broken stream that was not continued, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct UnresumedLabels {
    pub(crate) pool: String,
    /// How it broke: as [`ResumeLabels::reason`].
    pub(crate) reason: &'static str,
    /// `not_exact` (the request or the answer cannot be continued
    /// exactly), `finished` (its finish came, only `[DONE]` did not),
    /// `attempts` (it was continued `max_attempts` times),
    /// `no_replica` (no other healthy replica had a slot), `failed` (the
    /// continuation was refused or failed before its first byte).
    pub(crate) why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TierOnlyLabels {
    pub(crate) tier: TierLabel,
}

/// A key's quota series: `window` day or month, `kind` tokens or requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QuotaLabels {
    pub(crate) tenant: String,
    pub(crate) window: &'static str,
    pub(crate) kind: &'static str,
}
