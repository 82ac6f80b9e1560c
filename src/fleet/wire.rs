//! What instances of a fleet tell each other (`GET /fleet.json`).

use serde::{Deserialize, Serialize};

/// What an instance tells its peers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct State {
    pub(crate) id: String,
    pub(crate) pools: Vec<PoolState>,
    /// The last number it gave a routing decision (see [`SentPrompt`]): a
    /// reader that read past it sees a restarted instance.
    #[serde(default)]
    pub(crate) sent_seq: u64,
    /// Its peers as it sees them (for people; peers do not read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peers: Vec<PeerView>,
    /// A reader that asked to wait (`?wait_ms=`) is answered before its
    /// wait ended, for news it acts on at once (an older instance never
    /// waits and never says so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) woken: bool,
    /// The news told so far: a reader passes it back (`?news=`) and is
    /// answered at once where more came since.
    #[serde(default)]
    pub(crate) news: u64,
}

/// One pool of an instance's state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PoolState {
    pub(crate) name: String,
    /// Interactive requests it reserves for (its recent peak and more).
    pub(crate) interactive: usize,
    /// Interactive requests it has holding or waiting now.
    #[serde(default)]
    pub(crate) interactive_now: usize,
    /// Batch requests holding or waiting for a slot.
    pub(crate) batch: usize,
    /// Batch requests holding a slot.
    #[serde(default)]
    pub(crate) batch_held: usize,
    /// Requests waiting in its queues.
    pub(crate) waiting: usize,
    /// Interactive requests among them.
    #[serde(default)]
    pub(crate) interactive_waiting: usize,
    pub(crate) replicas: Vec<ReplicaState>,
    /// Bytes per block of its prefix index (`prefix.block`): decisions of
    /// another block size name other blocks and are not read.
    #[serde(default)]
    pub(crate) block: u64,
    /// Where its prompts went (prefix-aware pools), after the number the
    /// reader asked from (`?since=`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) sent: Vec<SentPrompt>,
    /// Which replica holds the stored responses it learned of, after the
    /// number the reader asked from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) owned: Vec<OwnedResponse>,
}

/// A stored response (the Responses API's) made on the replica at
/// `replica` in the pool's list, for `tenant`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct OwnedResponse {
    pub(crate) seq: u64,
    pub(crate) replica: usize,
    pub(crate) id: String,
    pub(crate) tenant: String,
}

/// One routing decision of a prefix-aware pool: a prompt of these blocks
/// (and session hint) went to the replica at `replica` in the pool's list.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SentPrompt {
    pub(crate) seq: u64,
    pub(crate) replica: usize,
    pub(crate) blocks: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<u64>,
}

/// One replica, as an instance sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ReplicaState {
    pub(crate) url: String,
    pub(crate) healthy: bool,
    /// Requests the instance has on it.
    pub(crate) inflight: usize,
    /// The replica's limit as the instance learned it (or the fixed one).
    pub(crate) limit: usize,
    /// The slots the instance may hold (its part of the limit).
    pub(crate) slots: usize,
}

/// A peer, for the status (`/fleet.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PeerView {
    pub(crate) address: String,
    pub(crate) status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_heard_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}
