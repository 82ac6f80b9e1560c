//! What a replica's handlers share: its config, tokenizer, engine,
//! metrics, its stop signal, the next id, and its stored responses.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::watch;

use super::config::SimConfig;
use super::engine::Engine;
use super::metrics::SimMetrics;

pub(crate) struct Ctx {
    pub(crate) cfg: Arc<SimConfig>,
    /// The model's tokenizer, when the replica counts tokens as vLLM does.
    pub(super) tokens: super::kv_events::Tokens,
    pub(crate) engine: Engine,
    pub(super) metrics: Arc<SimMetrics>,
    pub(super) exit: watch::Sender<bool>,
    pub(crate) next_id: AtomicU64,
    /// The Responses API's stored responses, in this replica's memory.
    pub(crate) responses: super::stored::Store,
}
