//! The requests waiting for a pool's slots: one fair queue per tier, and
//! the counters read without the lock (how many wait, their body bytes).
//! A waiter leaves the queue by being handed a lease, refused, or dropped
//! with its request ([`WaitGuard`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::fair::{FairQueue, Queued, Share};
use super::lease::{Claim, Lease, Refusal};
use super::rates::Rates;
use crate::config::Tier;
use crate::sync::Beacon;
use crate::telemetry::metrics::{Metrics, TierLabel, TierOnlyLabels};

/// A request waiting for a slot.
pub(crate) struct Waiter {
    pub(super) id: u64,
    /// Its request body's size, counted against `queue_max_bytes` while it waits.
    pub(super) bytes: u64,
    pub(super) enqueued: Instant,
    pub(super) deadline: Instant,
    pub(super) claim: Claim,
    /// Its prompt, for prefix-aware routing.
    pub(super) key: Option<std::sync::Arc<crate::upstream::prefix::RouteKey>>,
    pub(super) tx: oneshot::Sender<Result<Lease, Refusal>>,
}

impl Queued for Waiter {
    fn id(&self) -> u64 {
        self.id
    }
    fn share(&self) -> Share {
        self.claim.share
    }
    fn cost(&self) -> f64 {
        self.claim.tokens as f64
    }
    fn first(&self) -> bool {
        self.claim.resumed
    }
}

/// What the queue lock guards.
#[derive(Default)]
pub(crate) struct Queues {
    pub(super) interactive: FairQueue<Waiter>,
    pub(super) batch: FairQueue<Waiter>,
    pub(super) next_id: u64,
    pub(super) last_batch_grant: Option<Instant>,
    /// The samples behind the demand peak and the batch rate.
    pub(super) rates: Rates,
}

impl Queues {
    pub(super) fn of(&mut self, tier: Tier) -> &mut FairQueue<Waiter> {
        match tier {
            Tier::Interactive => &mut self.interactive,
            Tier::Batch => &mut self.batch,
        }
    }
}

/// One tier's counters.
struct Counters {
    waiting: AtomicUsize,
    /// Request body bytes waiting. Changed under the queue lock.
    bytes: AtomicU64,
    depth: Gauge,
}

/// A pool's waiting requests.
pub(crate) struct Waiting {
    queues: Mutex<Queues>,
    tiers: [Counters; 2],
    /// What a fleet's other instances hear at once rather than at their
    /// next read (docs/design/fleet.md, rule 15): interactive requests
    /// start waiting here or none waits any more, and, while theirs wait,
    /// a slot is given back here.
    pub(super) news: Beacon,
    /// The others have interactive requests waiting, as last heard.
    others_wait: AtomicBool,
}

impl Waiting {
    pub(crate) fn new(metrics: &Metrics) -> Waiting {
        let counters = |tier| Counters {
            waiting: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            depth: metrics.queue_depth.get_or_create(&TierOnlyLabels { tier }).clone(),
        };
        Waiting {
            queues: Mutex::new(Queues::default()),
            tiers: [counters(TierLabel::interactive), counters(TierLabel::batch)],
            news: Beacon::default(),
            others_wait: AtomicBool::new(false),
        }
    }

    /// Whether the fleet's other instances have interactive requests waiting.
    pub(super) fn set_others_wait(&self, wait: bool) {
        self.others_wait.store(wait, Ordering::Relaxed);
    }

    /// A slot was given back here: news for the others while theirs wait.
    pub(super) fn slot_freed(&self) {
        if self.others_wait.load(Ordering::Relaxed) {
            self.news.tell();
        }
    }

    /// The queues, locked (`None` if a panic poisoned the lock).
    pub(super) fn lock(&self) -> Option<MutexGuard<'_, Queues>> {
        self.queues.lock().ok()
    }

    fn of(&self, tier: Tier) -> &Counters {
        &self.tiers[tier as usize]
    }

    /// A request with a body of `bytes` starts waiting in `tier`.
    pub(super) fn inc(&self, tier: Tier, bytes: u64) {
        let c = self.of(tier);
        c.bytes.fetch_add(bytes, Ordering::SeqCst);
        let was = c.waiting.fetch_add(1, Ordering::SeqCst);
        c.depth.inc();
        if tier == Tier::Interactive && was == 0 {
            self.news.tell();
        }
    }

    /// A request with a body of `bytes` stops waiting in `tier`.
    pub(super) fn dec(&self, tier: Tier, bytes: u64) {
        let c = self.of(tier);
        let was = c.waiting.fetch_sub(1, Ordering::SeqCst);
        c.bytes.fetch_sub(bytes, Ordering::SeqCst);
        c.depth.dec();
        if tier == Tier::Interactive && was == 1 {
            self.news.tell();
        }
    }

    /// Requests waiting in `tier`'s queue.
    pub(crate) fn depth(&self, tier: Tier) -> usize {
        self.of(tier).waiting.load(Ordering::SeqCst)
    }

    /// Request body bytes waiting in `tier`'s queue.
    pub(crate) fn bytes(&self, tier: Tier) -> u64 {
        self.of(tier).bytes.load(Ordering::SeqCst)
    }

    /// Requests waiting in both tiers.
    pub(crate) fn total(&self) -> usize {
        self.depth(Tier::Interactive) + self.depth(Tier::Batch)
    }

    /// Those a new request of `tier` waits behind: interactive ones, and
    /// for batch the batch ones too.
    pub(super) fn ahead_of(&self, tier: Tier) -> usize {
        match tier {
            Tier::Interactive => self.depth(Tier::Interactive),
            Tier::Batch => self.total(),
        }
    }

    /// Remove waiter `id` of `tenant` if it is still queued.
    pub(super) fn remove(&self, tier: Tier, tenant: u32, id: u64) {
        let removed = {
            let Some(mut q) = self.lock() else { return };
            q.of(tier).remove(tenant, id)
        };
        if let Some(w) = removed {
            self.dec(tier, w.bytes);
        }
    }
}

/// Removes a waiter from its queue when its request goes away.
pub(super) struct WaitGuard<'a> {
    pub(super) waiting: &'a Waiting,
    pub(super) tier: Tier,
    pub(super) tenant: u32,
    pub(super) id: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.waiting.remove(self.tier, self.tenant, self.id);
    }
}
