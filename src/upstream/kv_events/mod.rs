//! Exact prefix routing's source: each replica's KV events (vLLM's
//! `--kv-events-config`), so the router knows which prompt blocks a
//! replica's cache really holds instead of estimating it from what was
//! sent there. The rules are docs/design/prefix-routing.md's "Exact mode".
//!
//! One task per replica follows its event stream ([`subscribe`]) and keeps
//! the replica's [`Feed`]: the blocks held, keyed by token ids
//! ([`held`]), and whether the stream is alive. The request path only
//! reads a feed (a short lock to look up a prompt's keys) and never waits
//! on the stream.

pub(crate) mod held;
pub(crate) mod subscribe;
pub(crate) mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use held::Held;
use prompt::PromptTokens;
use subscribe::Endpoints;
use wire::Batch;

use crate::config::{KvEventsConfig, ReplicaConfig};
use crate::telemetry::kv_feeds::{FeedSample, FeedSource, Source};

/// What exact mode needs of a pool, read before anything of it is built:
/// the model's tokenizer, and where each replica publishes.
pub(crate) struct Setup {
    pub(crate) tokens: Arc<PromptTokens>,
    pub(crate) at: Vec<Endpoints>,
    pub(crate) bound: usize,
}

impl Setup {
    /// Load the tokenizer and template `config` names; each replica
    /// publishes where it says, else on its URL's host (`bases`) at the
    /// pool's port.
    pub(crate) fn load(config: &KvEventsConfig, replicas: &[ReplicaConfig], bases: &[http::Uri]) -> Result<Setup, String> {
        let tokens = Arc::new(PromptTokens::load(&config.tokenizer, config.chat_template.as_deref())?);
        let at = replicas
            .iter()
            .zip(bases)
            .map(|(r, b)| {
                let host = b.host().unwrap_or("127.0.0.1");
                let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
                Endpoints {
                    events: r.kv_events.clone().unwrap_or_else(|| format!("tcp://{host}:{}", config.port)),
                    replay: r.kv_events_replay.clone().or_else(|| config.replay_port.map(|p| format!("tcp://{host}:{p}"))),
                    topic: config.topic.clone(),
                }
            })
            .collect();
        Ok(Setup { tokens, at, bound: config.max_blocks_per_replica as usize })
    }
}

/// A pool's exact mode: its tokenizer and each replica's feed (in the
/// order of the pool's replicas).
pub(crate) struct Exact {
    pub(crate) tokens: Arc<PromptTokens>,
    pub(crate) feeds: Vec<Arc<Feed>>,
    pub(crate) at: Vec<Endpoints>,
}

impl Exact {
    /// The pool's feeds: a replica kept across a reload (same URL, `kept`
    /// finds its old place) with the same endpoints keeps its feed and
    /// what it indexed.
    pub(crate) fn new(setup: Setup, previous: Option<&Exact>, kept: impl Fn(usize) -> Option<usize>) -> Exact {
        let feeds = setup
            .at
            .iter()
            .enumerate()
            .map(|(i, at)| {
                let old = previous.zip(kept(i)).and_then(|(p, j)| p.at.get(j).filter(|a| *a == at).and(p.feeds.get(j)));
                old.cloned().unwrap_or_else(|| Arc::new(Feed::new(setup.bound)))
            })
            .collect();
        Exact { tokens: setup.tokens, feeds, at: setup.at }
    }

    /// Tokens per block, from the first feed that has stored one (the
    /// replicas of a pool serve one model); 0 while none has.
    pub(crate) fn block_size(&self) -> usize {
        self.feeds.iter().map(|f| f.block_size.load(Ordering::Relaxed) as usize).find(|&b| b > 0).unwrap_or(0)
    }

    /// Each feed with its replica's label (in the pool's order), for `/metrics`.
    pub(crate) fn sources<'a>(&self, labels: impl IntoIterator<Item = &'a str>) -> Vec<Source> {
        labels.into_iter().zip(&self.feeds).map(|(l, f)| (l.to_string(), f.clone() as Arc<dyn FeedSource>)).collect()
    }

    /// Spawn one follower per replica, until `stop` changes.
    pub(crate) fn spawn(&self, stop: &tokio::sync::watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
        self.feeds.iter().zip(&self.at).map(|(feed, at)| tokio::spawn(subscribe::follow(at.clone(), feed.clone(), stop.clone()))).collect()
    }
}

/// A prompt routed to a replica should show in its events within this:
/// vLLM publishes a prompt's blocks when their prefill is done. A feed
/// whose replica took prompts this long ago and has published nothing
/// since has stopped, and the replica is routed by estimate until its
/// events come again.
pub(crate) const QUIET_LIMIT: Duration = Duration::from_secs(15);

/// One replica's KV events, as far as they have come.
#[derive(Debug)]
pub(crate) struct Feed {
    held: Mutex<Held>,
    /// Milliseconds since `epoch` of the first prompt routed here after the
    /// last batch arrived (0: none since; 1 is added so that 0 is free).
    waiting_since: AtomicU64,
    epoch: tokio::time::Instant,
    /// The next sequence number expected (0: none seen yet).
    pub(crate) next_seq: AtomicU64,
    /// Tokens per block, as the last batch left the index (read without its lock).
    block_size: AtomicU64,
    pub(crate) counts: Counts,
}

/// What a feed has seen, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) batches: AtomicU64,
    pub(crate) events: AtomicU64,
    /// Batches that could not be decoded.
    pub(crate) malformed: AtomicU64,
    /// Batches missed (sequence numbers skipped) and not replayed.
    pub(crate) lost: AtomicU64,
    /// Batches recovered from the replica's replay socket.
    pub(crate) replayed: AtomicU64,
}

impl Feed {
    /// A feed of at most `bound` blocks (see [`Held::new`]).
    pub(crate) fn new(bound: usize) -> Feed {
        Feed {
            held: Mutex::new(Held::new(bound)),
            waiting_since: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            next_seq: AtomicU64::new(0),
            block_size: AtomicU64::new(0),
            counts: Counts::default(),
        }
    }

    pub(crate) fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// A batch arrived: apply it.
    pub(crate) fn apply(&self, batch: &Batch) {
        {
            let mut held = self.held();
            for e in &batch.events {
                held.apply(e);
            }
            self.block_size.store(held.block_size() as u64, Ordering::Relaxed);
        }
        self.waiting_since.store(0, Ordering::Relaxed);
        self.counts.batches.fetch_add(1, Ordering::Relaxed);
        self.counts.events.fetch_add(batch.events.len() as u64, Ordering::Relaxed);
    }

    /// A prompt with at least one full block was routed here: its blocks
    /// should show in an event soon.
    pub(crate) fn routed(&self) {
        let _ = self.waiting_since.compare_exchange(0, self.now_ms(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Does the feed tell what the replica holds? False once prompts routed
    /// here [`QUIET_LIMIT`] ago have shown in no event, and before any
    /// event came.
    pub(crate) fn alive(&self) -> bool {
        if self.counts.batches.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let since = self.waiting_since.load(Ordering::Relaxed);
        since == 0 || self.now_ms().saturating_sub(since) < QUIET_LIMIT.as_millis() as u64
    }
}

impl FeedSource for Feed {
    fn sample(&self) -> FeedSample {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (blocks, skipped) = {
            let held = self.held();
            (held.len() as u64, held.skipped)
        };
        FeedSample {
            alive: self.alive(),
            blocks,
            batches: n(&self.counts.batches),
            events: n(&self.counts.events),
            lost: n(&self.counts.lost),
            replayed: n(&self.counts.replayed),
            malformed: n(&self.counts.malformed),
            unchained: skipped.unchained,
            beyond_tokens: skipped.beyond_tokens,
            index_restarts: skipped.restarts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{KvEvent, Place};
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_feed_is_alive_from_its_first_batch_until_routed_prompts_go_unanswered() {
        let feed = Feed::new(100);
        assert!(!feed.alive(), "nothing heard yet");
        let stored = KvEvent::Stored {
            hashes: vec![1],
            parent: None,
            tokens: vec![1, 2],
            block_size: 2,
            keyed_beyond_tokens: false,
            place: Place::default(),
        };
        feed.apply(&Batch { ts: 1.0, events: vec![stored], unknown: 0, rank: None });
        assert!(feed.alive());
        assert_eq!(feed.held().run(&held::token_keys(&[1, 2], 2, 4)), 1);
        // A prompt routed now is not yet overdue.
        feed.routed();
        assert!(feed.alive());
        // Overdue: nothing came within QUIET_LIMIT of it.
        tokio::time::advance(QUIET_LIMIT - Duration::from_millis(1)).await;
        assert!(feed.alive(), "not yet");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!feed.alive(), "prompts went unanswered");
        // The next batch revives it.
        feed.apply(&Batch::default());
        assert!(feed.alive());
    }
}
