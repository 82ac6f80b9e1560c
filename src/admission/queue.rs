//! The two-tier priority queue in front of a pool's replica slots.
//!
//! A request needs a slot ([`Lease`]); with none free it waits in its tier's
//! queue. A freed slot (a lease dropped at the end of a stream) goes to the
//! interactive queue first. The interactive reservation is work-conserving:
//! it follows interactive demand (at most `tiers.interactive.reserved_share`
//! of the slots, at least a headroom), so batch alone may use nearly all of
//! them, and past the share batch takes no seat interactive requests hold or
//! wait for (enforced by [`PoolAdmission::try_lease`]); a starvation guard still hands batch one slot per
//! [`STARVATION_GUARD_INTERVAL`] while interactive is not at risk. Queues are
//! bounded (429 when full), timed (429 at `queue_timeout`), new batch work is
//! shed while interactive requests wait, and queued batch requests that
//! cannot be served before their deadline at the measured service rate are
//! rejected early. A request whose client hangs up while queued leaves the
//! queue at once (its wait future is dropped, its entry removed).
//!
//! Wake-ups cannot be lost: a waiter registers itself (counter, SeqCst) and
//! only then retries for a slot; a release frees the slot (SeqCst) and only
//! then checks the counter. One of the two always sees the other.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::fair::{FairQueue, Queued, Share};
use crate::config::{Tier, TiersConfig};
use crate::telemetry::metrics::{Metrics, TierLabel, TierOnlyLabels};
use crate::upstream::{PickError, Pool, Replica, ReplicaSlot, Room};

/// Batch gets at least one slot this often while interactive waits but is
/// not at risk.
pub(crate) const STARVATION_GUARD_INTERVAL: Duration = Duration::from_secs(1);

/// How far back the service rate used for early rejection looks.
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// How far back the interactive demand the reservation follows looks.
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(30);
/// Slots kept free for interactive requests even after a quiet spell, as a
/// share of the pool's slots (at least one).
const HEADROOM_SHARE: f64 = 0.05;
/// Seats above a pool's slots that interactive requests of tenants under
/// their fair part may take instead of waiting, as a share of the slots (at
/// least one). Each is given back at the next slot freed (not handed on).
const FAIR_HEADROOM: f64 = 0.1;
/// Slots a tenant at or over its fair part leaves free while other tenants
/// are active, as a share of the pool's slots (at least one).
const FAIR_RESERVE: f64 = 0.1;
/// The reservation covers the interactive demand's recent peak and this much more.
pub(crate) const DEMAND_MARGIN: f64 = 1.25;

/// The headroom of `cap` slots ([`HEADROOM_SHARE`], at least one).
fn headroom(cap: usize) -> usize {
    ((cap as f64 * HEADROOM_SHARE).ceil() as usize).max(1)
}

/// A request's hold on one replica slot, counted against its tier's share.
/// It travels inside the response body and is released exactly once, by
/// `Drop`, when the stream ends or the client goes away (never when the
/// response headers arrive); the freed slot goes to the next waiter.
pub(crate) struct Lease {
    slot: ReplicaSlot,
    tier: Tier,
    admission: Arc<PoolAdmission>,
    /// Whose service it is, and the tokens charged to it when it was granted.
    share: Share,
    charged: u64,
    /// Its tenant's service is accounted for (see [`Claim::fair`]).
    fair: bool,
    /// The tokens it used, once the replica said (settled against `charged` at the end).
    used: Option<u64>,
    /// Its tenant held less than its fair part of the tier when it was granted.
    under_share: bool,
}

impl Lease {
    pub(crate) fn replica(&self) -> &Arc<Replica> {
        self.slot.replica()
    }

    /// The request's first token arrived: the replica no longer counts it
    /// among the prefills a new request would wait behind.
    pub(crate) fn first_token(&mut self) {
        self.slot.prefilled();
    }

    /// Granted for `claim`: whose service it is and what it was charged;
    /// `under_share`: its tenant held less than its fair part of the tier.
    fn claimed(&mut self, claim: Claim, under_share: bool) {
        (self.share, self.charged, self.fair, self.under_share) = (claim.share, claim.tokens, claim.fair, under_share);
    }

    /// Its `priority` for vLLM's scheduler, which serves lower values first:
    /// interactive before batch, and among interactive requests a tenant
    /// under its fair part before the others (its prefill does not wait
    /// behind a heavy tenant's in the replica).
    pub(crate) fn upstream_priority(&self, tier: crate::config::Tier) -> i64 {
        match tier {
            crate::config::Tier::Interactive if self.under_share => -1,
            crate::config::Tier::Interactive => 0,
            crate::config::Tier::Batch => 1,
        }
    }

    /// The replica said the request used `tokens` (prompt plus completion):
    /// its tenant's service is settled to that when the lease goes.
    pub(crate) fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }

    #[cfg(test)]
    pub(crate) fn tier(&self) -> Tier {
        self.tier
    }
}

impl crate::upstream::Attempts for Lease {
    fn replica(&self) -> &Arc<Replica> {
        self.slot.replica()
    }

    /// Move to a slot on another healthy replica, keeping the tier's count;
    /// the slot left behind goes to the next waiter.
    fn move_to_another(&mut self) -> bool {
        let pool = self.admission.pool.load();
        let room = match self.tier {
            Tier::Interactive => Room::Over(0),
            Tier::Batch => self.admission.batch_room(&pool),
        };
        match pool.pick(Some(self.slot.replica()), room, self.tier) {
            Ok(other) => {
                self.slot = other;
                self.admission.dispatch();
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The slot first, so the waiter handed it below can take it.
        self.slot.release();
        if self.fair {
            if let Ok(mut q) = self.admission.inner.lock() {
                let q = q.of(self.tier);
                if let Some(used) = self.used.filter(|u| *u != self.charged) {
                    q.settle(self.share, used as f64 - self.charged as f64);
                }
                q.ended(self.share);
            }
        }
        match self.tier {
            Tier::Batch => self.admission.batch_inflight.fetch_sub(1, Ordering::SeqCst),
            Tier::Interactive => self.admission.interactive_inflight.fetch_sub(1, Ordering::SeqCst),
        };
        self.admission.released(self.tier);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("replica", &self.slot.replica().url).field("tier", &self.tier).finish()
    }
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No replica of the pool is healthy (503).
    NoHealthy,
    /// The tier's queue is at `queue_capacity` (429).
    QueueFull { retry_after: u64 },
    /// Waiting, the request's body would take the tier's queue past
    /// `queue_max_bytes` (429).
    QueueBytesFull { retry_after: u64 },
    /// A batch request arrived while interactive requests wait (429).
    Shed { retry_after: u64 },
    /// Waited `queue_timeout` (429).
    Timeout { retry_after: u64 },
    /// Batch: cannot be served before its deadline at the current rate (429).
    Hopeless { retry_after: u64 },
    /// Interactive with `shed_late`: can no longer make its class's TTFT
    /// target (its wait plus the replicas' recent dispatch-to-first-token
    /// time, `expected`), so it does not wait for a slot it could not use (429).
    Late { retry_after: u64, expected: Duration },
}

/// A slot, and how long the request waited for it.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) lease: Lease,
    pub(crate) waited: Duration,
}

struct Waiter {
    id: u64,
    /// Its request body's size, counted against `queue_max_bytes` while it waits.
    bytes: u64,
    enqueued: Instant,
    deadline: Instant,
    claim: Claim,
    tx: oneshot::Sender<Result<Lease, Refusal>>,
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
}

/// Who a request is for (its tenant's share of the tier) and the tokens it
/// is charged when it gets a slot (its estimate; settled at its end).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Claim {
    pub(crate) share: Share,
    pub(crate) tokens: u64,
    /// Several tenants share the tier (keys are configured): account for
    /// service. With one tenant the order is first come, first served
    /// whatever the counters say, and a grant takes no lock.
    pub(crate) fair: bool,
    /// Its class's TTFT target (interactive classes; see `shed_late`).
    pub(crate) ttft: Option<Duration>,
}

impl Claim {
    /// A request of `tenant` in the class of `control`, its prompt
    /// estimated at `tokens`; `fair` when keys are configured.
    pub(crate) fn of(tenant: &super::Tenant, control: &super::ClassControl, tokens: u64, fair: bool) -> Claim {
        let ttft = (control.tier == crate::config::Tier::Interactive).then(|| control.ttft_target());
        Claim { share: tenant.share(), tokens, fair, ttft }
    }
}

#[derive(Default)]
struct Queues {
    interactive: FairQueue<Waiter>,
    batch: FairQueue<Waiter>,
    next_id: u64,
    last_batch_grant: Option<Instant>,
    /// (instant, batch releases so far) samples for the service rate.
    samples: VecDeque<(Instant, u64)>,
    /// (instant, interactive demand's peak over the tick before) samples.
    demand: VecDeque<(Instant, usize)>,
}

impl Queues {
    fn of(&mut self, tier: Tier) -> &mut FairQueue<Waiter> {
        match tier {
            Tier::Interactive => &mut self.interactive,
            Tier::Batch => &mut self.batch,
        }
    }
}

/// An instance's demand on a pool's slots, in requests (see [`PoolAdmission::demand`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    pub(crate) interactive: usize,
    /// Interactive requests holding or waiting for a slot now.
    pub(crate) interactive_now: usize,
    pub(crate) batch: usize,
    pub(crate) waiting: usize,
}

/// Admission to one pool's replicas: its queues, its tier shares and the
/// pool it hands slots from. One per pool name, kept across reloads (so are
/// the waiters and the batch count); a reload's swap installs the new pool
/// and limits with [`PoolAdmission::install`].
pub(crate) struct PoolAdmission {
    /// The upstream pool slots come from (the current snapshot's).
    pool: ArcSwap<Pool>,
    inner: Mutex<Queues>,
    waiting_interactive: AtomicUsize,
    waiting_batch: AtomicUsize,
    /// Request body bytes waiting, per tier. Changed under the queue lock.
    bytes_interactive: AtomicU64,
    bytes_batch: AtomicU64,
    /// The tiers' limits; replaced on reload.
    tiers: ArcSwap<TiersConfig>,
    /// Slots held by batch requests. Invariant: only changed by
    /// [`PoolAdmission::try_lease`] and [`Lease`]'s drop.
    batch_inflight: AtomicUsize,
    /// Slots held by interactive requests (same invariant).
    interactive_inflight: AtomicUsize,
    /// Interactive requests holding or waiting for a slot: the most since the last tick.
    interactive_high: AtomicUsize,
    /// Interactive demand's peak over [`DEMAND_WINDOW`], published each tick:
    /// what the reservation follows.
    interactive_demand: AtomicUsize,
    depth_interactive: Gauge,
    depth_batch: Gauge,
    /// Batch leases released so far (for the batch service rate).
    released_batch: AtomicU64,
    /// Batch slots per second, as f64 bits; 0 = not known yet.
    batch_rate: AtomicU64,
    /// Published by the publisher: some interactive class is over its TTFT target.
    interactive_at_risk: AtomicBool,
    /// The part of its own interactive peak this instance reserves for, as
    /// f64 bits: 1 alone; in a fleet, the fleet's peak over the sum of the
    /// instances' peaks (peaks of separate instances rarely coincide).
    reservation_scale: AtomicU64,
    /// In a fleet: the replicas' slots for all instances (0 alone), and the
    /// interactive requests the other instances hold or queue, as the fleet
    /// last heard.
    fleet_slots: AtomicUsize,
    others_interactive: AtomicUsize,
}

impl PoolAdmission {
    /// Admission for a new pool (not live until its snapshot is swapped in).
    pub(crate) fn new(pool: Arc<Pool>, tiers: TiersConfig, metrics: &Metrics) -> Self {
        let depth = |tier| metrics.queue_depth.get_or_create(&TierOnlyLabels { tier }).clone();
        PoolAdmission {
            pool: ArcSwap::new(pool),
            inner: Mutex::new(Queues::default()),
            waiting_interactive: AtomicUsize::new(0),
            waiting_batch: AtomicUsize::new(0),
            bytes_interactive: AtomicU64::new(0),
            bytes_batch: AtomicU64::new(0),
            tiers: ArcSwap::from_pointee(tiers),
            batch_inflight: AtomicUsize::new(0),
            interactive_inflight: AtomicUsize::new(0),
            interactive_high: AtomicUsize::new(0),
            interactive_demand: AtomicUsize::new(0),
            depth_interactive: depth(TierLabel::interactive),
            depth_batch: depth(TierLabel::batch),
            released_batch: AtomicU64::new(0),
            batch_rate: AtomicU64::new(0),
            interactive_at_risk: AtomicBool::new(false),
            reservation_scale: AtomicU64::new(1f64.to_bits()),
            fleet_slots: AtomicUsize::new(0),
            others_interactive: AtomicUsize::new(0),
        }
    }

    /// The swap step of a reload (cannot fail): hand slots out from `pool`
    /// with `tiers`' limits from now on; waiting requests keep their place.
    pub(crate) fn install(&self, pool: Arc<Pool>, tiers: TiersConfig) {
        self.pool.store(pool);
        self.tiers.store(Arc::new(tiers));
    }

    /// The pool slots come from now.
    pub(crate) fn pool(&self) -> Arc<Pool> {
        self.pool.load_full()
    }

    /// Slots held by batch requests.
    #[cfg(test)]
    pub(crate) fn batch_inflight(&self) -> usize {
        self.batch_inflight.load(Ordering::SeqCst)
    }

    /// The most slots batch may hold: all but those reserved for
    /// interactive requests (at least one while any is free to share).
    ///
    /// The reservation is work-conserving: it follows interactive demand
    /// (its peak over [`DEMAND_WINDOW`], plus a quarter) up to
    /// `tiers.interactive.reserved_share` of the slots, and never goes below
    /// a headroom of [`HEADROOM_SHARE`] of them (at least one) while the
    /// share is not zero. With no interactive traffic batch may use all but
    /// the headroom; when interactive comes back, the headroom serves it at
    /// once, freed slots go to it first, and the reservation grows with its
    /// demand at the next tick. While an interactive class's TTFT P99 is
    /// over its target, the whole share is reserved.
    pub(crate) fn batch_limit(&self) -> usize {
        let cap = self.pool.load().capacity();
        self.batch_limit_of(cap, self.reserved(cap))
    }

    /// The batch limit on `cap` slots with `reserved` of them reserved.
    fn batch_limit_of(&self, cap: usize, reserved: usize) -> usize {
        if reserved == 0 {
            return cap;
        }
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share < 1.0 {
            (cap - reserved).max(1)
        } else {
            cap - reserved
        }
    }

    /// Interactive requests holding or waiting for a slot now, plus the
    /// headroom (0 with no reserved share). Batch admission leaves these
    /// too, even past the reservation's share (see
    /// [`PoolAdmission::try_lease_over`]).
    fn reserved_now(&self, cap: usize) -> usize {
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share == 0.0 || cap == 0 {
            return 0;
        }
        let now = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting_interactive.load(Ordering::Relaxed);
        (now + headroom(cap)).min(cap)
    }

    /// What a batch request leaves to interactive ones where it picks a replica.
    fn batch_room(&self, pool: &Pool) -> Room {
        let cap = pool.capacity();
        Room::Leave(self.reserved(cap).max(self.reserved_now(cap)))
    }

    /// The slots of `cap` reserved for interactive requests now (see
    /// [`PoolAdmission::batch_limit`]).
    fn reserved(&self, cap: usize) -> usize {
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share == 0.0 || cap == 0 {
            return 0;
        }
        let most = cap - (cap as f64 * (1.0 - share)).floor() as usize;
        let demand = self.interactive_demand.load(Ordering::Relaxed) as f64 * self.reservation_scale();
        // An interactive class over its TTFT target takes the whole share back.
        if self.interactive_at_risk.load(Ordering::Relaxed) {
            most
        } else {
            ((demand * DEMAND_MARGIN).ceil() as usize + headroom(cap)).min(most)
        }
    }

    /// The fleet's word: the replicas have `slots` for all instances, and the
    /// others hold or queue `interactive` interactive requests (`slots` 0: alone).
    pub(crate) fn set_fleet_interactive(&self, slots: usize, interactive: usize) {
        self.fleet_slots.store(slots, Ordering::Relaxed);
        self.others_interactive.store(interactive, Ordering::Relaxed);
    }

    /// The fleet's word on how much of its interactive peak this instance reserves for (0 to 1).
    pub(crate) fn set_reservation_scale(&self, scale: f64) {
        self.reservation_scale.store(scale.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    fn reservation_scale(&self) -> f64 {
        f64::from_bits(self.reservation_scale.load(Ordering::Relaxed))
    }

    /// This instance's demand on the pool, for the fleet's split of the
    /// replicas' slots: interactive (what its reservation follows: the recent
    /// peak and a quarter more, or what holds and waits now if that is more),
    /// batch (holding and waiting now), and how many of both wait.
    pub(crate) fn demand(&self) -> Demand {
        let waiting_i = self.waiting_interactive.load(Ordering::Relaxed);
        let waiting_b = self.waiting_batch.load(Ordering::Relaxed);
        let now = self.interactive_inflight.load(Ordering::Relaxed) + waiting_i;
        let peak = (self.interactive_demand.load(Ordering::Relaxed) as f64 * DEMAND_MARGIN).ceil() as usize;
        Demand {
            interactive: now.max(peak),
            interactive_now: now,
            batch: self.batch_inflight.load(Ordering::Relaxed) + waiting_b,
            waiting: waiting_i + waiting_b,
        }
    }

    /// How far above the slot count an interactive request may go now.
    ///
    /// Batch requests held above the batch limit (it shrank: interactive
    /// demand grew, or this instance's part of the fleet went to another)
    /// hold slots that are interactive's now: an interactive request may go
    /// that far above the slot count instead of waiting for them to end.
    /// With `upstream_priority` the replicas order their own queues by tier,
    /// so the whole reserved share is interactive's whatever batch holds:
    /// while interactive requests hold fewer than the share, one more goes
    /// to a replica at once, and a replica already full runs it next, ahead
    /// of every batch request it holds (from any instance of a fleet). In a
    /// fleet the share is the fleet's: of all the replicas' slots, less what
    /// the other instances' interactive requests hold or wait for.
    fn interactive_over(&self, pool: &Pool) -> usize {
        let excess = self.batch_inflight.load(Ordering::SeqCst).saturating_sub(self.batch_limit());
        if !pool.config.upstream_priority {
            return excess;
        }
        let cap = pool.capacity();
        let fleet = self.fleet_slots.load(Ordering::Relaxed);
        let (slots, others) = if fleet > 0 { (fleet, self.others_interactive.load(Ordering::Relaxed)) } else { (cap, 0) };
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        let most = slots - (slots as f64 * (1.0 - share)).floor() as usize;
        let room = most.saturating_sub(self.interactive_inflight.load(Ordering::SeqCst) + others);
        if room == 0 {
            // The share is taken: within the slots (and what batch holds above its limit) only.
            // Counting what is already above the slots here would let every
            // cut of one replica's limit raise what the others may hold, a
            // ratchet: in-flight climbing while the limits fall.
            return excess;
        }
        // Above the slots already (the room is counted from the slots).
        let above = pool.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.inflight()).sum::<usize>().saturating_sub(cap);
        excess.max(room + above)
    }

    /// Interactive requests holding or waiting for a slot now; raises the tick's high mark.
    fn note_interactive(&self) {
        let now = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting_interactive.load(Ordering::Relaxed);
        self.interactive_high.fetch_max(now, Ordering::Relaxed);
    }

    /// Take a slot for a request of `tier` now, if one is free: a healthy
    /// replica with a free slot and, for batch, room under the batch limit.
    /// Does not queue.
    pub(crate) fn try_lease(self: &Arc<Self>, tier: Tier) -> Result<Lease, PickError> {
        self.try_lease_over(tier, 0)
    }

    /// [`PoolAdmission::try_lease`], an interactive request allowed `extra`
    /// more above the slots.
    fn try_lease_over(self: &Arc<Self>, tier: Tier, extra: usize) -> Result<Lease, PickError> {
        let pool = self.pool.load();
        let room = match tier {
            Tier::Interactive => Room::Over(self.interactive_over(&pool) + extra),
            Tier::Batch => {
                // Batch stays within its limit, and never takes a seat of
                // what interactive requests hold or wait for now plus the
                // headroom, even past the reservation's share: a burst of
                // interactive requests beyond the share would otherwise see
                // every seat it frees, or that no interactive request waits
                // for at that instant, taken by batch, and the next
                // interactive arrival wait for a stream to end. The room
                // interactive requests may take above the slots counts from
                // the batch limit alone, so this cannot feed itself (more
                // interactive above the slots, less for batch, more room).
                let cap = pool.capacity();
                let (reserved, now) = (self.reserved(cap), self.reserved_now(cap));
                let limit = self.batch_limit_of(cap, reserved).min(if now == 0 { cap } else { cap.saturating_sub(now).max(1) });
                let taken = self.batch_inflight.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1)).is_ok();
                if !taken {
                    return Err(if pool.healthy_count() == 0 { PickError::NoHealthy } else { PickError::Saturated });
                }
                Room::Leave(reserved.max(now))
            }
        };
        match pool.pick(None, room, tier) {
            Ok(slot) => {
                if tier == Tier::Interactive {
                    self.interactive_inflight.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Lease {
                    slot,
                    tier,
                    admission: self.clone(),
                    share: Share::default(),
                    charged: 0,
                    fair: false,
                    used: None,
                    under_share: false,
                })
            }
            Err(e) => {
                if tier == Tier::Batch {
                    self.batch_inflight.fetch_sub(1, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    fn counter(&self, tier: Tier) -> (&AtomicUsize, &Gauge, &AtomicU64) {
        match tier {
            Tier::Interactive => (&self.waiting_interactive, &self.depth_interactive, &self.bytes_interactive),
            Tier::Batch => (&self.waiting_batch, &self.depth_batch, &self.bytes_batch),
        }
    }

    /// A request with a body of `bytes` starts waiting in `tier`.
    fn inc(&self, tier: Tier, bytes: u64) {
        let (c, g, b) = self.counter(tier);
        b.fetch_add(bytes, Ordering::SeqCst);
        c.fetch_add(1, Ordering::SeqCst);
        g.inc();
    }

    /// A request with a body of `bytes` stops waiting in `tier`.
    fn dec(&self, tier: Tier, bytes: u64) {
        let (c, g, b) = self.counter(tier);
        c.fetch_sub(1, Ordering::SeqCst);
        b.fetch_sub(bytes, Ordering::SeqCst);
        g.dec();
    }

    /// Request body bytes waiting in `tier`'s queue.
    pub(crate) fn waiting_bytes(&self, tier: Tier) -> u64 {
        self.counter(tier).2.load(Ordering::SeqCst)
    }

    fn max_bytes(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Interactive => self.tiers.load().interactive.queue_max_bytes.0,
            Tier::Batch => self.tiers.load().batch.queue_max_bytes.0,
        }
    }

    /// Requests waiting in `tier`'s queue.
    pub(crate) fn depth(&self, tier: Tier) -> usize {
        self.counter(tier).0.load(Ordering::SeqCst)
    }

    /// How long a request of `tier` may wait for a slot.
    pub(crate) fn timeout(&self, tier: Tier) -> Duration {
        match tier {
            Tier::Interactive => self.tiers.load().interactive.queue_timeout.get(),
            Tier::Batch => self.tiers.load().batch.queue_timeout.get(),
        }
    }

    fn capacity(&self, tier: Tier) -> usize {
        match tier {
            Tier::Interactive => self.tiers.load().interactive.queue_capacity as usize,
            Tier::Batch => self.tiers.load().batch.queue_capacity as usize,
        }
    }

    fn batch_rate(&self) -> Option<f64> {
        let r = f64::from_bits(self.batch_rate.load(Ordering::Relaxed));
        (r > 0.0).then_some(r)
    }

    /// Whole seconds a client should wait before retrying in `tier`.
    fn retry_after(&self, tier: Tier, position: usize) -> u64 {
        match (tier, self.batch_rate()) {
            (Tier::Batch, Some(rate)) => ((position as f64 + 1.0) / rate).ceil().clamp(1.0, 60.0) as u64,
            _ => 1,
        }
    }

    pub(crate) fn set_interactive_at_risk(&self, at_risk: bool) {
        self.interactive_at_risk.store(at_risk, Ordering::Relaxed);
    }

    /// A lease of `tier` was just released (its slot already freed).
    fn released(self: &Arc<Self>, tier: Tier) {
        if tier == Tier::Batch {
            self.released_batch.fetch_add(1, Ordering::Relaxed);
        }
        if self.waiting_interactive.load(Ordering::SeqCst) + self.waiting_batch.load(Ordering::SeqCst) > 0 {
            self.dispatch();
        }
    }

    /// Get a slot for a request of `tier` whose body is `bytes` long,
    /// waiting in the queue if needed. Dropping the future (the client went
    /// away) leaves the queue at once.
    pub(crate) async fn admit(self: &Arc<Self>, tier: Tier, bytes: u64, claim: Claim) -> Result<Granted, Refusal> {
        let start = Instant::now();
        let ahead = |q: &Self| match tier {
            Tier::Interactive => q.waiting_interactive.load(Ordering::SeqCst),
            Tier::Batch => q.waiting_interactive.load(Ordering::SeqCst) + q.waiting_batch.load(Ordering::SeqCst),
        };
        // Several tenants in the interactive tier: the decision needs their
        // shares (under the lock below).
        let shared = claim.fair && tier == Tier::Interactive;
        if ahead(self) == 0 && !shared {
            match self.try_lease(tier) {
                Ok(lease) => {
                    if tier == Tier::Interactive {
                        self.note_interactive();
                    }
                    return Ok(Granted { lease: self.charge(tier, lease, claim), waited: Duration::ZERO });
                }
                Err(PickError::NoHealthy) => return Err(Refusal::NoHealthy),
                Err(PickError::Saturated) => {}
            }
        }
        let timeout_at = start + self.timeout(tier);
        // With shed_late, an interactive request waits only while its
        // class's TTFT target can still be met: the target less the time the
        // replicas take to a first token now (their recent 90th percentile).
        let late = match (tier, claim.ttft) {
            (Tier::Interactive, Some(target)) if self.tiers.load().interactive.shed_late => {
                let expected = target.mul_f64(self.pool.load().first_token_p90().min(1.0));
                Some((start + target.saturating_sub(expected), expected))
            }
            _ => None,
        };
        let deadline = late.map_or(timeout_at, |(at, _)| at.min(timeout_at));
        let (id, rx) = {
            let Ok(mut q) = self.inner.lock() else { return Err(Refusal::NoHealthy) };
            let len = q.of(tier).len();
            if tier == Tier::Batch && !q.interactive.is_empty() {
                return Err(Refusal::Shed { retry_after: self.retry_after(tier, len) });
            }
            if len >= self.capacity(tier) {
                return Err(Refusal::QueueFull { retry_after: self.retry_after(tier, len) });
            }
            if self.waiting_bytes(tier).saturating_add(bytes) > self.max_bytes(tier) {
                return Err(Refusal::QueueBytesFull { retry_after: self.retry_after(tier, len) });
            }
            if tier == Tier::Batch {
                if let Some(rate) = self.batch_rate() {
                    if Duration::from_secs_f64((len as f64 + 1.0) / rate) > self.timeout(tier) {
                        return Err(Refusal::Hopeless { retry_after: self.retry_after(tier, len) });
                    }
                }
            }
            if claim.fair && tier == Tier::Interactive {
                // A tenant under its fair part of the slots does not wait
                // behind one over it: it takes a seat above the slots (a
                // few, see [`FAIR_HEADROOM`]), and the next slot freed is
                // not handed on, so the tenant over its part gives the seat
                // back by waiting, not this one.
                let pool = self.pool.load();
                if q.interactive.under_share(claim.share, pool.capacity()) {
                    let headroom = ((pool.capacity() as f64 * FAIR_HEADROOM).ceil() as usize).max(1);
                    if let Ok(mut lease) = self.try_lease_over(tier, headroom) {
                        self.note_interactive();
                        q.interactive.charge(claim.share, claim.tokens as f64);
                        lease.claimed(claim, true);
                        return Ok(Granted { lease, waited: start.elapsed() });
                    }
                }
            }
            if let Some((at, expected)) = late {
                if at <= Instant::now() {
                    return Err(Refusal::Late { retry_after: 1, expected });
                }
            }
            let first = ahead(self) == 0 && self.leaves_room(&q, tier, claim);
            self.inc(tier, bytes);
            if first {
                // Registered first, then retry: a concurrent release either
                // sees us waiting or we see its freed slot.
                match self.try_lease(tier) {
                    Ok(mut lease) => {
                        self.dec(tier, bytes);
                        if tier == Tier::Interactive {
                            self.note_interactive();
                        }
                        let under = self.under(&q, tier, claim);
                        if claim.fair {
                            q.of(tier).charge(claim.share, claim.tokens as f64);
                        }
                        lease.claimed(claim, under);
                        return Ok(Granted { lease, waited: start.elapsed() });
                    }
                    Err(PickError::NoHealthy) => {
                        self.dec(tier, bytes);
                        return Err(Refusal::NoHealthy);
                    }
                    Err(PickError::Saturated) => {}
                }
            }
            let (tx, rx) = oneshot::channel();
            q.next_id += 1;
            let id = q.next_id;
            q.of(tier).push(Waiter { id, bytes, enqueued: start, deadline, claim, tx });
            if tier == Tier::Interactive {
                self.note_interactive();
            }
            (id, rx)
        };
        let guard = WaitGuard { queue: self, tier, tenant: claim.share.tenant, id };
        let result = tokio::time::timeout_at(deadline, rx).await;
        drop(guard);
        match result {
            Ok(Ok(Ok(lease))) => Ok(Granted { lease, waited: start.elapsed() }),
            Ok(Ok(Err(refusal))) => Err(refusal),
            // The queue went away (its pool was replaced); nothing will come.
            Ok(Err(_)) => Err(Refusal::NoHealthy),
            Err(_) => match late {
                Some((at, expected)) if at <= timeout_at => Err(Refusal::Late { retry_after: 1, expected }),
                _ => Err(Refusal::Timeout { retry_after: self.retry_after(tier, self.depth(tier)) }),
            },
        }
    }

    /// Charge a lease granted at once (nobody waiting) to its tenant.
    fn charge(&self, tier: Tier, mut lease: Lease, claim: Claim) -> Lease {
        if !claim.fair {
            return lease;
        }
        if let Ok(mut q) = self.inner.lock() {
            let under = self.under(&q, tier, claim);
            q.of(tier).charge(claim.share, claim.tokens as f64);
            lease.claimed(claim, under);
        }
        lease
    }

    /// May `claim` take a slot now? Yes, except for an interactive request of
    /// a tenant holding its fair part or more while other tenants are
    /// active: it leaves the last [`FAIR_RESERVE`] of the slots free, so
    /// another tenant's request starts at once on a real seat instead of
    /// waiting for one of its streams to end (a replica full to its
    /// `max_num_seqs` queues a request sent above it, whatever its priority).
    fn leaves_room(&self, q: &Queues, tier: Tier, claim: Claim) -> bool {
        if !(claim.fair && tier == Tier::Interactive && q.interactive.others_active(claim.share)) {
            return true;
        }
        if q.interactive.under_share(claim.share, self.pool.load().capacity()) {
            return true;
        }
        let cap = self.pool.load().capacity();
        let reserve = ((cap as f64 * FAIR_RESERVE).ceil() as usize).max(1);
        let held = self.interactive_inflight.load(Ordering::SeqCst) + self.batch_inflight.load(Ordering::SeqCst);
        held + reserve < cap
    }

    /// Is `claim`'s tenant under its fair part of the interactive slots
    /// (several tenants share the tier, this request not counted yet)?
    fn under(&self, q: &Queues, tier: Tier, claim: Claim) -> bool {
        claim.fair && tier == Tier::Interactive && q.interactive.under_share(claim.share, self.pool.load().capacity())
    }

    /// Remove waiter `id` of `tenant` if it is still queued.
    fn remove(&self, tier: Tier, tenant: u32, id: u64) {
        let removed = {
            let Ok(mut q) = self.inner.lock() else { return };
            q.of(tier).remove(tenant, id)
        };
        if let Some(w) = removed {
            self.dec(tier, w.bytes);
        }
    }

    /// Hand free slots to waiters: interactive first, batch within its share,
    /// batch first once per guard interval when interactive is not at risk.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        // Leases nobody took are dropped after the lock is released (dropping
        // one re-enters `released`).
        let mut spare: Vec<Lease> = Vec::new();
        {
            let Ok(mut q) = self.inner.lock() else { return };
            let now = Instant::now();
            loop {
                let has_i = !q.interactive.is_empty();
                let has_b = !q.batch.is_empty();
                // Batch has waited a guard interval, and got nothing for as long.
                let guard_due = !self.interactive_at_risk.load(Ordering::Relaxed)
                    && q.batch.oldest().is_some_and(|w| now.saturating_duration_since(w.enqueued) >= STARVATION_GUARD_INTERVAL)
                    && q.last_batch_grant.is_none_or(|t| now.saturating_duration_since(t) >= STARVATION_GUARD_INTERVAL);
                let order: &[Tier] = match (has_i, has_b) {
                    (false, false) => break,
                    (true, false) => &[Tier::Interactive],
                    (false, true) => &[Tier::Batch],
                    (true, true) if guard_due => &[Tier::Batch, Tier::Interactive],
                    (true, true) => &[Tier::Interactive, Tier::Batch],
                };
                let mut served = false;
                for &tier in order {
                    // Interactive: the first tenant in the fair order that may take a
                    // slot now (one at its share leaves the reserve to the others).
                    let tenant = match tier {
                        Tier::Interactive => match q.interactive.first_tenant_where(|w| self.leaves_room(&q, tier, w.claim)) {
                            Some(t) => Some(t),
                            None => continue,
                        },
                        Tier::Batch => None,
                    };
                    let Ok(mut lease) = self.try_lease(tier) else { continue };
                    loop {
                        let next = match tenant {
                            Some(t) => q.interactive.pop_tenant(t),
                            None => q.of(tier).pop(),
                        };
                        let Some(w) = next else {
                            spare.push(lease);
                            break;
                        };
                        self.dec(tier, w.bytes);
                        if tier == Tier::Interactive {
                            self.note_interactive();
                        }
                        let under = self.under(&q, tier, w.claim);
                        lease.claimed(w.claim, under);
                        match w.tx.send(Ok(lease)) {
                            Ok(()) => {
                                served = true;
                                if w.claim.fair {
                                    q.of(tier).charge(w.claim.share, w.claim.tokens as f64);
                                }
                                if tier == Tier::Batch {
                                    q.last_batch_grant = Some(now);
                                }
                                break;
                            }
                            // Its client went away in the meantime: next one.
                            Err(Ok(mut l)) => {
                                l.claimed(Claim::default(), false);
                                lease = l;
                            }
                            Err(Err(_)) => break,
                        }
                    }
                    if served {
                        break;
                    }
                }
                if !served {
                    break;
                }
            }
        }
        drop(spare);
    }

    /// Periodic work (the publisher): measure the batch service rate, reject
    /// queued batch requests that cannot make their deadline, hand out slots
    /// that appeared without a release (a replica came back).
    pub(crate) fn tick(self: &Arc<Self>, now: Instant) {
        let mut hopeless = Vec::new();
        if let Ok(mut q) = self.inner.lock() {
            // The interactive demand the reservation follows: the peak of the
            // ticks within the window (the high mark restarts from what is there now).
            let current = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting_interactive.load(Ordering::Relaxed);
            let high = self.interactive_high.swap(current, Ordering::Relaxed).max(current);
            q.demand.push_back((now, high));
            while q.demand.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > DEMAND_WINDOW) {
                q.demand.pop_front();
            }
            let peak = q.demand.iter().map(|(_, d)| *d).max().unwrap_or(0);
            self.interactive_demand.store(peak, Ordering::Relaxed);
            // For the learned limits: is there demand beyond the slots?
            self.pool.load().set_waiting(q.interactive.len() + q.batch.len());
            let released = self.released_batch.load(Ordering::Relaxed);
            q.samples.push_back((now, released));
            while q.samples.len() > 2 && q.samples.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > RATE_WINDOW) {
                q.samples.pop_front();
            }
            if let (Some(&(t0, c0)), Some(&(t1, c1))) = (q.samples.front(), q.samples.back()) {
                let dt = t1.saturating_duration_since(t0).as_secs_f64();
                // Only claim a rate once it rests on a full window of samples.
                if dt >= RATE_WINDOW.as_secs_f64() * 0.8 {
                    let rate = (c1 - c0) as f64 / dt;
                    self.batch_rate.store(rate.to_bits(), Ordering::Relaxed);
                }
            }
            if let Some(rate) = self.batch_rate() {
                // Served in about their order of arrival (tenants take turns,
                // but the n-th oldest is served about n-th).
                let mut waiting: Vec<(u64, u32, Instant)> = q.batch.iter().map(|w| (w.id, w.claim.share.tenant, w.deadline)).collect();
                waiting.sort_unstable_by_key(|w| w.0);
                let late: Vec<(u64, u32)> = waiting
                    .into_iter()
                    .enumerate()
                    .filter(|(pos, (_, _, deadline))| now + Duration::from_secs_f64((*pos as f64 + 1.0) / rate) > *deadline)
                    .map(|(_, (id, t, _))| (id, t))
                    .collect();
                for (id, t) in late {
                    if let Some(w) = q.batch.remove(t, id) {
                        hopeless.push(w);
                    }
                }
            }
        }
        for w in hopeless {
            self.dec(Tier::Batch, w.bytes);
            let retry_after = self.retry_after(Tier::Batch, self.depth(Tier::Batch));
            let _ = w.tx.send(Err(Refusal::Hopeless { retry_after }));
        }
        self.dispatch();
    }
}

/// Removes a waiter from its queue when its request goes away.
struct WaitGuard<'a> {
    queue: &'a PoolAdmission,
    tier: Tier,
    tenant: u32,
    id: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.queue.remove(self.tier, self.tenant, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;
    use crate::config::{Config, PoolConfig, TierConfig};

    fn tiers(reserved: f64, i_cap: u32, b_cap: u32) -> TiersConfig {
        TiersConfig {
            interactive: TierConfig {
                queue_capacity: i_cap,
                queue_timeout: Dur::secs(2),
                reserved_share: reserved,
                queue_max_bytes: crate::config::Size(1 << 30),
                shed_late: false,
            },
            batch: TierConfig {
                queue_capacity: b_cap,
                queue_timeout: Dur::secs(10),
                reserved_share: 0.0,
                queue_max_bytes: crate::config::Size(1 << 30),
                shed_late: false,
            },
        }
    }

    /// A pool of one healthy replica with `slots` slots (nothing listens: the
    /// queue never connects).
    fn pool(slots: u32, tiers: TiersConfig) -> Arc<PoolAdmission> {
        pool_with(slots, tiers, false)
    }

    fn pool_with(slots: u32, tiers: TiersConfig, upstream_priority: bool) -> Arc<PoolAdmission> {
        replicas_with(1, slots, tiers, upstream_priority)
    }

    /// A pool of `n` healthy replicas with `slots` slots each (nothing listens).
    fn replicas_with(n: u16, slots: u32, tiers: TiersConfig, upstream_priority: bool) -> Arc<PoolAdmission> {
        let cfg = PoolConfig {
            replicas: (0..n).map(|i| format!("http://127.0.0.1:{}", 9 + i).into()).collect(),
            max_inflight_per_replica: crate::config::InflightLimit::Fixed(slots),
            upstream_priority,
            ..PoolConfig::default()
        };
        let metrics = Metrics::new(&Config::default());
        let access = crate::upstream::Access::new(&cfg).expect("access");
        let pool = Arc::new(Pool::new(cfg, access, &metrics, None));
        for r in &pool.replicas {
            r.set_healthy(true);
        }
        Arc::new(PoolAdmission::new(pool, tiers, &metrics))
    }

    async fn take(pool: &Arc<PoolAdmission>, tier: Tier) -> Lease {
        pool.admit(tier, 0, Claim::default()).await.expect("a free slot").lease
    }

    /// Start a queued admission; the task runs until it is queued.
    async fn queued(pool: &Arc<PoolAdmission>, tier: Tier) -> tokio::task::JoinHandle<Result<Granted, Refusal>> {
        let p = pool.clone();
        let before = pool.depth(tier);
        let h = tokio::spawn(async move { p.admit(tier, 0, Claim::default()).await });
        while pool.depth(tier) == before && !h.is_finished() {
            tokio::task::yield_now().await;
        }
        h
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slot_goes_to_interactive_before_earlier_batch_and_fifo_within_a_tier() {
        let pool = pool(2, tiers(0.0, 10, 10));
        let a = take(&pool, Tier::Batch).await;
        let b = take(&pool, Tier::Interactive).await;
        let batch = queued(&pool, Tier::Batch).await;
        let i1 = queued(&pool, Tier::Interactive).await;
        let i2 = queued(&pool, Tier::Interactive).await;
        assert_eq!((pool.depth(Tier::Interactive), pool.depth(Tier::Batch)), (2, 1));
        drop(a);
        settle().await;
        assert!(i1.is_finished() && !i2.is_finished() && !batch.is_finished());
        drop(b);
        settle().await;
        assert!(i2.is_finished() && !batch.is_finished());
        let l1 = i1.await.expect("task").expect("admitted");
        assert_eq!(l1.lease.tier(), Tier::Interactive);
        drop(l1);
        settle().await;
        let got = batch.await.expect("task").expect("batch admitted after interactive");
        assert_eq!(got.lease.tier(), Tier::Batch);
        assert_eq!(pool.depth(Tier::Batch), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_never_holds_the_reserved_share() {
        // 4 slots, at most half reserved: with interactive demand seen in
        // the window, batch may hold 2.
        let pool = pool(4, tiers(0.5, 10, 10));
        let seen = take(&pool, Tier::Interactive).await;
        pool.tick(Instant::now());
        drop(seen);
        assert_eq!(pool.batch_limit(), 2);
        let _b1 = take(&pool, Tier::Batch).await;
        let _b2 = take(&pool, Tier::Batch).await;
        let b3 = queued(&pool, Tier::Batch).await;
        assert_eq!(pool.depth(Tier::Batch), 1);
        // Interactive still gets the two reserved slots at once.
        let _i1 = take(&pool, Tier::Interactive).await;
        let i2 = take(&pool, Tier::Interactive).await;
        drop(i2);
        settle().await;
        // A freed slot inside the reserved share does not go to batch.
        assert!(!b3.is_finished());
        assert_eq!(pool.batch_inflight(), 2);
        let r = b3.await.expect("task");
        assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn batch_takes_no_seat_interactive_holds_or_needs_now_even_past_the_share() {
        // 20 slots, at most a quarter (5) reserved, a headroom of 1.
        let pool = pool(20, tiers(0.25, 100, 100));
        // A burst of 8 interactive requests, past the share.
        let mut chat = Vec::new();
        for _ in 0..8 {
            chat.push(take(&pool, Tier::Interactive).await);
        }
        pool.tick(Instant::now());
        assert_eq!(pool.batch_limit(), 15, "the reservation stops at the share");
        // Batch fills what the 8 and the headroom leave: 11, not 12 (the 8
        // held leave 12 free, one of them the headroom) or 15.
        let mut batch = Vec::new();
        while let Ok(b) = pool.try_lease(Tier::Batch) {
            batch.push(b);
        }
        assert_eq!(batch.len(), 11);
        // The next interactive request takes the headroom at once.
        chat.push(pool.try_lease(Tier::Interactive).expect("the headroom"));
        // A seat an interactive stream frees is the headroom again while 8 hold.
        drop(chat.pop());
        assert_eq!(chat.len(), 8);
        assert!(pool.try_lease(Tier::Batch).is_err(), "8 interactive, 11 batch: the free seat is the headroom");
        // The burst over (4 left), batch may take seats again, up to the batch limit.
        chat.truncate(4);
        let mut more = 0;
        while let Ok(b) = pool.try_lease(Tier::Batch) {
            batch.push(b);
            more += 1;
        }
        assert_eq!(more, 4, "batch back to 15, its limit");
    }

    /// With no interactive traffic batch may use all but the headroom; when
    /// interactive comes, the headroom serves it at once, a freed slot goes
    /// to it first, and the reservation grows with its demand; after a
    /// window of quiet it is back to the headroom.
    #[tokio::test(start_paused = true)]
    async fn the_reservation_follows_interactive_demand() {
        let pool = pool(20, tiers(0.25, 100, 100));
        assert_eq!(pool.batch_limit(), 19, "20 slots, a headroom of 1, no interactive demand");
        let mut batch = Vec::new();
        for _ in 0..19 {
            batch.push(take(&pool, Tier::Batch).await);
        }
        assert!(pool.try_lease(Tier::Batch).is_err(), "the headroom is not batch's");
        let i1 = take(&pool, Tier::Interactive).await;
        let i2 = queued(&pool, Tier::Interactive).await;
        drop(batch.pop());
        let i2 = i2.await.expect("task").expect("the freed slot goes to interactive").lease;
        // Demand 2: the next tick reserves ceil(2 x 1.25) + 1 = 4 (of at most 5).
        pool.tick(Instant::now());
        assert_eq!(pool.batch_limit(), 16);
        drop(batch.pop());
        assert_eq!(pool.batch_inflight(), 17);
        assert!(pool.try_lease(Tier::Batch).is_err(), "batch takes no slot above its new limit");
        // 19 of 20 slots held, batch one above its limit: that one is
        // interactive's, so interactive may go one above the slot count.
        let i3 = take(&pool, Tier::Interactive).await;
        let i4 = pool.try_lease(Tier::Interactive).expect("one above the slots: the slot batch holds over its limit");
        assert!(pool.try_lease(Tier::Interactive).is_err(), "no further");
        drop((i3, i4));
        drop((i1, i2));
        for _ in 0..(DEMAND_WINDOW.as_millis() / 250 + 2) {
            tokio::time::advance(Duration::from_millis(250)).await;
            pool.tick(Instant::now());
        }
        assert_eq!(pool.batch_limit(), 19, "quiet for the window: back to the headroom");
        pool.set_interactive_at_risk(true);
        assert_eq!(pool.batch_limit(), 15, "an interactive class over its target: the whole share");
        pool.set_interactive_at_risk(false);
        // A share of 0 reserves nothing, not even the headroom.
        assert_eq!(self::pool(20, tiers(0.0, 10, 10)).batch_limit(), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn with_upstream_priority_the_reserved_share_is_interactives_whatever_batch_holds() {
        for priority in [false, true] {
            let pool = pool_with(20, tiers(0.25, 100, 100), priority);
            let mut held = Vec::new();
            for _ in 0..19 {
                held.push(take(&pool, Tier::Batch).await);
            }
            held.push(take(&pool, Tier::Interactive).await);
            // The share is 5 slots of 20; batch holds 19 (its limit).
            let mut more = 0;
            while let Ok(l) = pool.try_lease(Tier::Interactive) {
                held.push(l);
                more += 1;
            }
            assert_eq!(more, if priority { 4 } else { 0 }, "priority {priority}: interactive up to its share of 5, above the slots");
            if priority {
                // In a fleet of 100 slots the share is 25: the others' 10
                // interactive requests and these 5 leave room for 10 more.
                pool.set_fleet_interactive(100, 10);
                let mut fleet_more = 0;
                while let Ok(l) = pool.try_lease(Tier::Interactive) {
                    held.push(l);
                    fleet_more += 1;
                }
                assert_eq!(fleet_more, 10, "the fleet's share, less what the others hold");
                pool.set_fleet_interactive(100, 40);
                assert!(pool.try_lease(Tier::Interactive).is_err(), "the others hold more than the share: none");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn interactive_beyond_its_share_stays_within_the_slots_when_one_replicas_limit_falls() {
        let adm = replicas_with(2, 8, tiers(0.25, 10, 10), true);
        let pool = adm.pool();
        // Interactive only, every slot held: far past its reserved quarter.
        let mut held = Vec::new();
        for _ in 0..16 {
            held.push(adm.try_lease(Tier::Interactive).expect("a slot"));
        }
        assert!(adm.try_lease(Tier::Interactive).is_err(), "full");
        // One replica's limit falls to 2 (as a learned limit is cut), then the other's.
        for r in &pool.replicas {
            r.set_limit(2);
            assert!(adm.try_lease(Tier::Interactive).is_err(), "no replica takes more while the limits fall");
        }
        assert_eq!(pool.replicas.iter().map(|r| r.inflight()).sum::<usize>(), 16);
        // As streams end, the replicas come down to their new limits.
        held.truncate(4);
        assert!(adm.try_lease(Tier::Interactive).is_err(), "4 held on 2 x 2 slots");
        held.truncate(3);
        assert!(adm.try_lease(Tier::Interactive).is_ok(), "a slot free again");
    }

    #[tokio::test(start_paused = true)]
    async fn starvation_guard_moves_batch_unless_interactive_is_at_risk() {
        for at_risk in [false, true] {
            let pool = pool(1, tiers(0.0, 100, 10));
            pool.set_interactive_at_risk(at_risk);
            let mut held = Some(take(&pool, Tier::Interactive).await);
            let mut batch = Some(queued(&pool, Tier::Batch).await);
            // Interactive keeps arriving; every 200 ms the slot is freed.
            let mut served_batch_at = None;
            for step in 1..=9u32 {
                let next = queued(&pool, Tier::Interactive).await;
                tokio::time::advance(Duration::from_millis(200)).await;
                drop(held.take());
                settle().await;
                if let Some(b) = batch.take_if(|b| b.is_finished()) {
                    // The batch request got the slot; the interactive one still waits.
                    served_batch_at = Some(step * 200);
                    assert!(!next.is_finished());
                    held = Some(b.await.expect("task").expect("batch admitted").lease);
                    next.abort();
                    break;
                }
                held = Some(next.await.expect("task").expect("interactive admitted").lease);
            }
            if at_risk {
                assert_eq!(served_batch_at, None, "batch must not pass interactive at risk");
            } else {
                // Batch waited at least the guard interval, then got the next freed slot.
                assert_eq!(served_batch_at, Some(1000));
            }
            drop(held);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_shed_and_timeout_are_refusals() {
        let pool = pool(1, tiers(0.0, 1, 10));
        let held = take(&pool, Tier::Interactive).await;
        let waiting = queued(&pool, Tier::Interactive).await;
        // Interactive queue holds 1: the next is refused at once.
        assert!(matches!(pool.admit(Tier::Interactive, 0, Claim::default()).await, Err(Refusal::QueueFull { retry_after: 1 })));
        // Batch arriving while interactive waits is shed, not queued.
        assert!(matches!(pool.admit(Tier::Batch, 0, Claim::default()).await, Err(Refusal::Shed { .. })));
        assert_eq!(pool.depth(Tier::Batch), 0);
        // The waiting one times out after queue_timeout (2 s) and leaves the queue.
        let t0 = Instant::now();
        let r = waiting.await.expect("task");
        assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        assert_eq!(pool.depth(Tier::Interactive), 0);
        drop(held);
    }

    /// Bodies waiting in a tier count against its `queue_max_bytes`: one
    /// that would take the queue past it is refused, whatever the count, and
    /// bytes come back whichever way a waiter leaves (served, hung up, timed out).
    #[tokio::test(start_paused = true)]
    async fn waiting_bodies_count_against_the_queue_byte_budget() {
        let mut t = tiers(0.0, 100, 100);
        t.interactive.queue_max_bytes = crate::config::Size(10 << 20);
        let pool = pool(1, t);
        let held = take(&pool, Tier::Interactive).await;
        let spawn = |bytes: u64| {
            let p = pool.clone();
            tokio::spawn(async move { p.admit(Tier::Interactive, bytes, Claim::default()).await })
        };
        let first = spawn(4 << 20);
        settle().await;
        let second = spawn(4 << 20);
        settle().await;
        assert_eq!(pool.waiting_bytes(Tier::Interactive), 8 << 20);
        // 8 MiB waiting + 4 MiB > 10 MiB: refused though the queue has room for 98 more.
        assert!(matches!(pool.admit(Tier::Interactive, 4 << 20, Claim::default()).await, Err(Refusal::QueueBytesFull { retry_after: 1 })));
        // A small one still fits.
        let small = spawn(1 << 20);
        settle().await;
        assert_eq!(pool.waiting_bytes(Tier::Interactive), 9 << 20);
        // The first is served: its bytes leave the budget.
        drop(held);
        let lease = first.await.expect("task").expect("served").lease;
        assert_eq!(pool.waiting_bytes(Tier::Interactive), 5 << 20);
        // The second hangs up: its bytes leave too.
        second.abort();
        settle().await;
        assert_eq!(pool.waiting_bytes(Tier::Interactive), 1 << 20);
        // The small one times out.
        assert!(matches!(small.await.expect("task"), Err(Refusal::Timeout { .. })));
        assert_eq!(pool.waiting_bytes(Tier::Interactive), 0);
        assert_eq!(pool.depth(Tier::Interactive), 0);
        drop(lease);
        // With a free slot nothing waits: a body larger than the budget is served.
        assert!(pool.admit(Tier::Interactive, 64 << 20, Claim::default()).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn hanging_up_while_queued_leaves_the_queue_at_once() {
        let pool = pool(1, tiers(0.0, 10, 10));
        let held = take(&pool, Tier::Interactive).await;
        let gone = queued(&pool, Tier::Interactive).await;
        let stays = queued(&pool, Tier::Interactive).await;
        assert_eq!(pool.depth(Tier::Interactive), 2);
        gone.abort();
        settle().await;
        assert_eq!(pool.depth(Tier::Interactive), 1);
        drop(held);
        settle().await;
        // The slot went to the one still waiting, not into the void.
        assert!(stays.await.expect("task").is_ok());
        assert_eq!(pool.pool().replicas[0].inflight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_that_cannot_make_its_deadline_is_refused_early() {
        // One slot; batch timeout 10 s; batch served at 1 per second.
        let pool = pool(1, tiers(0.0, 10, 100));
        for _ in 0..6 {
            let l = take(&pool, Tier::Batch).await;
            tokio::time::advance(Duration::from_secs(1)).await;
            drop(l);
            pool.tick(Instant::now());
        }
        let held = take(&pool, Tier::Batch).await;
        // About 10 fit before the deadline; the rest are refused when they arrive.
        let mut waiting = Vec::new();
        let mut refused_at = None;
        for i in 0..20 {
            let h = queued(&pool, Tier::Batch).await;
            settle().await;
            if h.is_finished() {
                assert!(matches!(h.await.expect("task"), Err(Refusal::Hopeless { .. })));
                refused_at = Some(i);
                break;
            }
            waiting.push(h);
        }
        let refused_at = refused_at.expect("refused early");
        assert!((8..=10).contains(&refused_at), "refused at position {refused_at}");
        // When the rate drops, queued ones that can no longer make it go early too.
        for _ in 0..8 {
            tokio::time::advance(Duration::from_secs(1)).await;
            pool.tick(Instant::now());
        }
        settle().await;
        let early = waiting.iter().filter(|h| h.is_finished()).count();
        assert!(early > 0, "no queued batch request was refused before its deadline");
        drop(held);
    }

    fn claim(tenant: u32) -> Claim {
        Claim { share: Share { tenant, weight: 1.0 }, tokens: 100, fair: true, ttft: None }
    }

    async fn queued_as(pool: &Arc<PoolAdmission>, claim: Claim) -> tokio::task::JoinHandle<Result<Granted, Refusal>> {
        let p = pool.clone();
        let before = pool.depth(Tier::Interactive);
        let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim).await });
        while pool.depth(Tier::Interactive) == before && !h.is_finished() {
            tokio::task::yield_now().await;
        }
        h
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_under_its_share_takes_a_seat_above_the_slots_and_the_heavy_one_gives_it_back() {
        // 10 slots, all held by tenant 1, which has one more waiting.
        let plain = pool(1, tiers(0.0, 10, 10));
        let pool = pool(10, tiers(0.0, 10, 10));
        let mut heavy = Vec::new();
        for _ in 0..10 {
            heavy.push(pool.admit(Tier::Interactive, 0, claim(1)).await.expect("a free slot").lease);
        }
        let waiting = queued_as(&pool, claim(1)).await;
        // Tenant 2 holds nothing: its part is 5 of 10. It does not queue.
        let light = pool.admit(Tier::Interactive, 0, claim(2)).await.expect("a seat above the slots");
        assert_eq!(light.waited, Duration::ZERO);
        assert_eq!(pool.depth(Tier::Interactive), 1, "only tenant 1's request waits");
        // The headroom is a tenth of the slots: one seat. A second light request waits.
        let light2 = queued_as(&pool, claim(2)).await;
        assert_eq!(pool.depth(Tier::Interactive), 2);
        // One of tenant 1's ends: the pool is back at its slots, nothing is handed on.
        drop(heavy.pop());
        settle().await;
        assert!(!waiting.is_finished() && !light2.is_finished(), "the freed slot paid back the seat above");
        // The next one freed goes to tenant 2: tenant 1, at its share, leaves
        // the last seat (the reserve) to the other tenant.
        drop(heavy.pop());
        settle().await;
        assert!(light2.is_finished(), "tenant 2 served");
        assert!(!waiting.is_finished(), "tenant 1 leaves the reserve");
        // Without keys (no fair accounting) nobody goes above the slots.
        let _held = take(&plain, Tier::Interactive).await;
        let p = plain.clone();
        let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, Claim { fair: false, ..claim(2) }).await });
        settle().await;
        assert!(!h.is_finished(), "first come, first served: it waits");
        drop((light, heavy, waiting, light2, h));
    }

    #[tokio::test(start_paused = true)]
    async fn with_shed_late_an_interactive_request_waits_only_while_it_can_make_its_target() {
        let mut t = tiers(0.0, 10, 10);
        t.interactive.shed_late = true;
        let pool = pool(1, t);
        let target = Duration::from_millis(300);
        // The replica takes half the target to a first token, 90 % of the time.
        let replica = pool.pool().replicas[0].clone();
        for _ in 0..500 {
            replica.record_first_token(Duration::from_millis(150), target);
        }
        assert!((pool.pool().first_token_p90() - 0.5).abs() < 0.03, "{}", pool.pool().first_token_p90());
        let held = take(&pool, Tier::Interactive).await;
        let claim = Claim { ttft: Some(target), ..Claim::default() };
        let start = Instant::now();
        let p = pool.clone();
        let r = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim).await }).await.expect("task");
        assert!(matches!(r, Err(Refusal::Late { .. })), "{r:?}");
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(140) && waited <= Duration::from_millis(160),
            "refused at its slack, not the 2 s timeout: {waited:?}"
        );
        // Replicas over the target already: a request that would have to wait is refused at once.
        for _ in 0..500 {
            replica.record_first_token(Duration::from_millis(400), target);
        }
        let start = Instant::now();
        let r = pool.admit(Tier::Interactive, 0, claim).await;
        assert!(matches!(r, Err(Refusal::Late { .. })), "{r:?}");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // A free slot is taken whatever the estimate: nothing to wait for.
        drop(held);
        assert!(pool.admit(Tier::Interactive, 0, claim).await.is_ok());
        // A request without a target (batch, or a class the proxy did not mark) is untouched.
        let held2 = take(&pool, Tier::Interactive).await;
        let p = pool.clone();
        let start = Instant::now();
        let r = tokio::spawn(async move { p.admit(Tier::Interactive, 0, Claim::default()).await }).await.expect("task");
        assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        drop(held2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_at_its_share_leaves_the_last_seats_to_the_others_while_they_are_active() {
        // 20 slots: the reserve is two.
        let pool = pool(20, tiers(0.0, 10, 10));
        let light = pool.admit(Tier::Interactive, 0, claim(2)).await.expect("a free slot").lease;
        let mut heavy = Vec::new();
        for _ in 0..17 {
            heavy.push(pool.admit(Tier::Interactive, 0, claim(1)).await.expect("a free slot").lease);
        }
        // 18 held, two free: they are the reserve, not the heavy tenant's.
        let waiting = queued_as(&pool, claim(1)).await;
        assert_eq!(pool.depth(Tier::Interactive), 1);
        let second = pool.admit(Tier::Interactive, 0, claim(2)).await.expect("a reserved seat");
        assert_eq!(second.waited, Duration::ZERO);
        let third = pool.admit(Tier::Interactive, 0, claim(2)).await.expect("the other reserved seat");
        assert_eq!(third.waited, Duration::ZERO);
        assert_eq!(pool.depth(Tier::Interactive), 1, "the heavy tenant still waits");
        // The light tenant goes away: the heavy one may take every slot again.
        drop((light, second, third));
        settle().await;
        assert!(waiting.is_finished(), "alone, the heavy tenant is served");
        assert!(pool.admit(Tier::Interactive, 0, claim(1)).await.is_ok(), "and takes the last one too");
        drop(heavy);
    }
}
